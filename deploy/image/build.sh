#!/usr/bin/env bash
# `make image`: the container image, built without a container engine.
#   1. the release binaries (address-controller, range-driver, metallb-driver, cilium-driver), with paths remapped so
#      that the bytes do not depend on where the repository or ~/.cargo live;
#   2. the Debian packages of the run-time root, pinned in deploy/image/packages.lock;
#   3. deploy/image/assemble.py: the OCI archive, its SBOM and its digest, in dist/.
# SOURCE_DATE_EPOCH defaults to the commit's time: one commit, one digest.
#
#   deploy/image/build.sh [--out DIR]      build (default DIR: dist/)
#   deploy/image/build.sh --update-packages pin the newest packages apt knows of
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
lock="$root/deploy/image/packages.lock"
debs="${XDG_CACHE_HOME:-$HOME/.cache}/address-controller/debs"
out="$root/dist"
say() { printf '[image] %s\n' "$*" >&2; }

download() { # name version -> path of the cached .deb
  local name=$1 version=$2 file
  mkdir -p "$debs"
  file="$debs/${name}_${version//:/%3a}.deb"
  if [ ! -s "$file" ]; then
    local tmp
    tmp="$(mktemp -d "$debs/.dl.XXXXXX")"
    # apt-get download names files <name>_<version>_<arch>.deb; a stale package list may
    # not know the pinned version yet: refresh it once.
    if ! (cd "$tmp" && apt-get download -q "$name=$version" >/dev/null 2>&1); then
      say "apt does not know $name=$version; apt-get update"
      apt-get update -q >/dev/null
      (cd "$tmp" && apt-get download -q "$name=$version" >/dev/null 2>&1) || {
        rm -rf "$tmp"; say "cannot download $name=$version (see $lock)"; exit 1; }
    fi
    mv "$tmp"/*.deb "$file"
    rm -rf "$tmp"
  fi
  echo "$file"
}

if [ "${1:-}" = "--update-packages" ]; then
  tmp="$(mktemp)"
  sed -n '/^#/p' "$lock" > "$tmp"
  mapfile -t pkgs < <(grep -v '^#' "$lock" | awk '{print $1}')
  for pkg in "${pkgs[@]}"; do
    pkg_version="$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')"
    file="$(download "$pkg" "$pkg_version")"
    echo "$pkg $pkg_version $(sha256sum "$file" | cut -d' ' -f1)" >> "$tmp"
  done
  mv "$tmp" "$lock"
  say "wrote $lock"; cat "$lock" >&2
  exit 0
fi
if [ "${1:-}" = "--out" ]; then out="$2"; shift 2; fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
app_version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' chart/address-controller/Chart.yaml)"
[ "$version" = "$app_version" ] || { say "Cargo version $version != chart appVersion $app_version"; exit 1; }
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then revision="$revision-dirty"; fi
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"

say "release binaries (target/image)"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
# A clean environment: build scripts track variables (ring: CARGO_MANIFEST_DIR, which a
# calling `cargo test` sets; cc: SOURCE_DATE_EPOCH, which moves with every commit), and any
# difference would rebuild everything instead of reusing target/image.
env -i HOME="$HOME" PATH="$PATH" \
  ${CARGO_HOME:+CARGO_HOME="$CARGO_HOME"} ${RUSTUP_HOME:+RUSTUP_HOME="$RUSTUP_HOME"} \
  RUSTFLAGS="--remap-path-prefix=$root=/src --remap-path-prefix=$cargo_home=/cargo" \
  cargo build -q --release --locked --target-dir "$root/target/image" \
  --bin address-controller --bin range-driver --bin metallb-driver --bin cilium-driver

say "Debian packages (deploy/image/packages.lock)"
deb_args=()
while read -r pkg pkg_version sum; do
  file="$(download "$pkg" "$pkg_version")"
  got="$(sha256sum "$file" | cut -d' ' -f1)"
  if [ "$got" != "$sum" ]; then
    say "$file: sha256 $got, packages.lock pins $sum"; exit 1
  fi
  deb_args+=(--deb "$file")
done < <(grep -v '^#' "$lock")

bin="$root/target/image/release"
SOURCE_DATE_EPOCH="$epoch" python3 "$root/deploy/image/assemble.py" \
  --out "$out" \
  --name address-controller \
  --repository ghcr.io/cozystack/address-controller \
  --version "$version" \
  --revision "$revision" \
  --source "$(sed -n 's/^repository = "\(.*\)"/\1/p' Cargo.toml | head -1)" \
  --licenses "$(sed -n 's/^license = "\(.*\)"/\1/p' Cargo.toml | head -1)" \
  --workspace "$root" \
  --binary "$bin/address-controller:usr/local/bin/address-controller" \
  --binary "$bin/range-driver:usr/local/bin/range-driver" \
  --binary "$bin/metallb-driver:usr/local/bin/metallb-driver" \
  --binary "$bin/cilium-driver:usr/local/bin/cilium-driver" \
  --entrypoint /usr/local/bin/address-controller \
  --cmd=run --cmd=--log-format=json \
  "${deb_args[@]}"
