#!/usr/bin/env bash
# `make packages`: the platform's wrapper packages (packaging/cozystack/*) vendor this
# repository's chart verbatim under their charts/ — one source of truth, chart/address-controller;
# a test fails when a vendored copy differs from it. With an image built (`make image`), the
# wrappers' image pin is set to it: the tag is the chart's appVersion, the digest the one
# `make image` wrote to dist/address-controller-<version>.digest.
#
#   packaging/vendor.sh                        vendor the chart into every wrapper
#   packaging/vendor.sh --digest FILE|sha256:… also pin the wrappers' image to that digest
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
chart="$root/chart/address-controller"
say() { printf '[packages] %s\n' "$*" >&2; }

digest=""
if [ "${1:-}" = "--digest" ]; then
  digest="$2"
  [ -f "$digest" ] && digest="$(tr -d '[:space:]' < "$digest")"
  [[ "$digest" =~ ^sha256:[0-9a-f]{64}$ ]] || { say "not a digest: $digest"; exit 2; }
fi
version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$chart/Chart.yaml")"

for pkg in "$root"/packaging/cozystack/*/; do
  [ -f "$pkg/Chart.yaml" ] || continue
  rm -rf "$pkg/charts/address-controller"
  mkdir -p "$pkg/charts"
  cp -R "$chart" "$pkg/charts/address-controller"
  say "vendored chart/address-controller into ${pkg#"$root"/}charts/"
  if [ -n "$digest" ]; then
    # The pin's two lines under `image:`; the rest of values.yaml is left as it is.
    sed -i -E "s|^(    tag: ).*|\\1\"$version\"|; s|^(    digest: ).*|\\1\"$digest\"|" "$pkg/values.yaml"
    say "pinned ${pkg#"$root"/}values.yaml to $version@$digest"
  fi
done
