#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, etcd and helm from Go modules (through the
# Go module proxy) into a version-keyed cache outside the repository. A binary that is already
# cached at the pinned version is not rebuilt. Prints where the binaries are.
#
# Usage: deploy/local/build-binaries.sh [--print-env] [etcd|helm|unittest|grafana|kube|prometheus|metallb|node|wire|cozy|cilium ...]
#        (default: all but cilium, which is built when asked for)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=build-times.sh
. "$here/build-times.sh"
# shellcheck source=versions.sh
. "$here/versions.sh"

log() { printf '[build-binaries] %s\n' "$*" >&2; }

# A stamp file written after a successful build makes the cache check cheap and robust
# against half-written outputs of an interrupted build.
cached() { [ -f "$1/.complete" ]; }

# go_build_kube OUT WHAT PACKAGE...: Kubernetes commands from the module set in tools/kube,
# with the version stamped as a release build stamps it (so /version, `kubectl version`
# and helm's kubeVersion checks see $KUBE_VERSION). Cached in OUT.
go_build_kube() {
  local out="$1" what="$2" minor; shift 2
  if cached "$out"; then log "$what $KUBE_VERSION: cached in $out"; return; fi
  minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local ldflags="-s -w \
 -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  log "$what $KUBE_VERSION: building $*"
  mkdir -p "$out.tmp"
  (cd "$here/tools/kube" && CGO_ENABLED=0 go build -mod=readonly -trimpath -tags=notest,selinux \
     -ldflags "$ldflags" -o "$out.tmp/" "$@")
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

# kube-apiserver and kube-controller-manager (cold: see build-times.sh).
build_kube() {
  go_build_kube "$KUBE_BIN" kubernetes k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
}

# kubelet and kube-scheduler for the node tier (cold, after build_kube: see build-times.sh;
# they share most packages).
build_node() {
  go_build_kube "$NODE_BIN" kubelet/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler
}

# pinned_module_dir TOOL MODULE: the directory of MODULE as tools/TOOL's go.mod pins it,
# downloaded first (`go list -m` alone answers an empty directory for a module not yet in
# the module cache, as on a fresh machine).
pinned_module_dir() {
  local dir
  dir="$(cd "$here/tools/$1" && go mod download "$2" && go list -mod=readonly -m -f '{{.Dir}}' "$2")"
  [ -n "$dir" ] && [ -f "$dir/go.mod" ] || { log "$2 (tools/$1): not downloaded"; exit 1; }
  printf '%s\n' "$dir"
}

# The directory of the MetalLB module tools/metallb pins (its CRDs and manifests).
metallb_module_dir() { pinned_module_dir metallb go.universe.tf/metallb; }

# kube-proxy (iptables mode) and MetalLB's speaker for the node tier's wire: separate cache
# directories, so a node cache built before them stays valid and only these two are added.
build_wire() {
  go_build_kube "$KUBE_PROXY_BIN" kube-proxy k8s.io/kubernetes/cmd/kube-proxy
  local out="$METALLB_SPEAKER_BIN"
  if cached "$out"; then log "metallb speaker $METALLB_VERSION: cached in $out"; return; fi
  log "metallb speaker $METALLB_VERSION: building"
  mkdir -p "$out.tmp"
  (cd "$here/tools/metallb" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
     -o "$out.tmp/metallb-speaker" go.universe.tf/metallb/speaker)
  # The interfaces MetalLB's manifests keep out of L2 announcements (its excludel2 ConfigMap).
  local dir
  dir="$(metallb_module_dir)"
  grep -o 'announcedInterfacesToExclude: .*' "$dir/config/native/exclude-l2-config.yaml" > "$out.tmp/excludel2.yaml"
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

build_etcd() {
  local out="$ETCD_BIN"
  if cached "$out"; then log "etcd $ETCD_VERSION: cached in $out"; return; fi
  log "etcd $ETCD_VERSION: building"
  mkdir -p "$out.tmp"
  (cd "$here/tools/etcd" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
     -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3)
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

build_helm() {
  local out="$HELM_BIN"
  if cached "$out"; then log "helm $HELM_VERSION: cached in $out"; return; fi
  log "helm $HELM_VERSION: building"
  mkdir -p "$out.tmp"
  # helm reads the kube version it assumes for `helm template` from chartutil; the real
  # cluster version comes from /version, which the kube ldflags above make real.
  (cd "$here/tools/helm" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
     -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
     -o "$out.tmp/helm" helm.sh/helm/v3/cmd/helm)
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

# helm-unittest as a helm plugin: the binary built from its Go module, beside the module's own
# plugin.yaml (which names it untt-<os>-<arch>), in a plugins directory of its own — tests run
# `helm unittest` with HELM_PLUGINS pointing there, as the platform runs it per package.
build_unittest() {
  local out="$HELM_PLUGINS_DIR"
  if cached "$out"; then log "helm-unittest $HELM_UNITTEST_VERSION: cached in $out"; return; fi
  log "helm-unittest $HELM_UNITTEST_VERSION: building"
  local dir os arch
  dir="$(pinned_module_dir helm-unittest github.com/helm-unittest/helm-unittest)"
  os="$(go env GOOS)"; arch="$(go env GOARCH)"
  [ "$os" = darwin ] && os=macos
  mkdir -p "$out.tmp/unittest"
  # Inside the module: its go.mod replaces a dependency (yaml-jsonpath) with its own fork.
  (cd "$dir" && CGO_ENABLED=0 go build -mod=readonly -trimpath \
     -ldflags "-s -w -X github.com/helm-unittest/helm-unittest/internal/build.version=${HELM_UNITTEST_VERSION#v}" \
     -o "$out.tmp/unittest/untt-$os-$arch" ./cmd/helm-unittest)
  # The plugin's manifest as the module ships it, without its install hooks (they download
  # a release; the binary is already here).
  sed '/^platformHooks:/,$d' "$dir/plugin.yaml" > "$out.tmp/unittest/plugin.yaml"
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

# grafana-operator's GrafanaDashboard schema, compiled to a validator (npm's
# @kubernetes-models/grafana-operator, pinned by tools/grafana-schema/package-lock.json):
# grafana-operator's Go module is not served by the module proxy, so its CRD comes this way.
# Without node and npm it is not built, and the test that needs it reports itself skipped.
build_grafana() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    log "grafana-schema: no node/npm; not built (the GrafanaDashboard schema test is skipped)"
    return
  fi
  local out
  out="$(grafana_schema_dir)"
  if cached "$out"; then log "grafana-schema: cached in $out"; return; fi
  log "grafana-schema: npm ci"
  mkdir -p "$out.tmp"
  cp "$here/tools/grafana-schema/"{package.json,package-lock.json,validate.mjs} "$out.tmp/"
  (cd "$out.tmp" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

build_prometheus() {
  local out="$PROMETHEUS_BIN"
  if cached "$out"; then log "prometheus $PROMETHEUS_VERSION: cached in $out"; return; fi
  log "prometheus $PROMETHEUS_VERSION: building prometheus and promtool (cold: ~$COLD_PROMETHEUS_MIN min on 2 cores)"
  mkdir -p "$out.tmp"
  # Without the builtinassets tag the web UI is left out: the tests use the HTTP API only.
  (cd "$here/tools/prometheus" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
     -o "$out.tmp/" github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

build_metallb() {
  local out="$METALLB_BIN"
  if cached "$out"; then log "metallb $METALLB_VERSION: cached in $out"; return; fi
  log "metallb $METALLB_VERSION: building the MetalLB controller (cold: ~$COLD_METALLB_MIN min on 2 cores)"
  mkdir -p "$out.tmp"
  (cd "$here/tools/metallb" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
     -o "$out.tmp/metallb-controller" go.universe.tf/metallb/controller)
  # Its CRDs (config/crd/bases of the same module; not the bgppeers conversion patch, whose
  # webhook does not exist here).
  local dir
  dir="$(metallb_module_dir)"
  mkdir -p "$out.tmp/crds" && cp "$dir"/config/crd/bases/*.yaml "$out.tmp/crds/"
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

# The cilium-operator (its generic build: LB-IPAM without a cloud's IPAM), built inside the
# downloaded module github.com/cilium/cilium as its own Makefile builds it (the module's
# `replace` directives hold only there, so not with `go install`). Cached by version.
build_cilium() {
  local out="$CILIUM_BIN" dir
  if cached "$out"; then log "cilium-operator $CILIUM_VERSION: cached in $out"; return; fi
  log "cilium-operator $CILIUM_VERSION: building (cold: ~$COLD_CILIUM_MIN min on 2 cores)"
  dir="$(cd "$here" && go mod download -json "github.com/cilium/cilium@$CILIUM_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -n "$dir" ] && [ -f "$dir/go.mod" ] || { log "github.com/cilium/cilium@$CILIUM_VERSION: not downloaded"; exit 1; }
  mkdir -p "$out.tmp"
  (cd "$dir" && CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags "-s -w" \
     -tags ipam_provider_operator -o "$out.tmp/cilium-operator" ./operator)
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

# cozy-proxy, the platform's own data plane for whole-address Services (the node tier's
# cozy-proxy tests): no registry serves it, so it is built from its upstream source beside
# this repository ($COZY_PROXY_SRC, default ../shared/third_party/cozy-proxy; never copied
# in), cached by a hash of that source. Without the source it is not built, and the tests
# that need it report themselves skipped.
build_cozy() {
  if [ ! -f "$COZY_PROXY_SRC/go.mod" ]; then
    log "cozy-proxy: no source at $COZY_PROXY_SRC; not built (its node tests are skipped)"
    return
  fi
  local out
  out="$(cozy_proxy_bin)"
  if cached "$out"; then log "cozy-proxy: cached in $out"; return; fi
  log "cozy-proxy: building from $COZY_PROXY_SRC"
  mkdir -p "$out.tmp"
  (cd "$COZY_PROXY_SRC" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" \
     -o "$out.tmp/cozy-proxy" .)
  rm -rf "$out" && mv "$out.tmp" "$out" && touch "$out/.complete"
}

command -v go >/dev/null || { log "go is required (https://go.dev); none on PATH"; exit 1; }
start=$(date +%s)
print_env=
components=()
for arg in "$@"; do
  case "$arg" in
    --print-env) print_env=1 ;;
    etcd|helm|unittest|grafana|kube|prometheus|metallb|node|wire|cozy|cilium) components+=("$arg") ;;
    *) log "unknown argument: $arg (expected --print-env, etcd, helm, unittest, grafana, kube, prometheus, metallb, node, wire, cozy or cilium)"; exit 2 ;;
  esac
done
# Small ones first so a failure in the module graph shows up quickly.
[ ${#components[@]} -gt 0 ] || components=(etcd helm unittest grafana metallb prometheus kube node wire cozy cilium)
for c in "${components[@]}"; do "build_$c"; done
log "done in $(( $(date +%s) - start ))s"
if [ -n "$print_env" ]; then
  printf 'KUBE_BIN=%s\nETCD_BIN=%s\nHELM_BIN=%s\nHELM_PLUGINS_DIR=%s\nPROMETHEUS_BIN=%s\nMETALLB_BIN=%s\nMETALLB_SPEAKER_BIN=%s\n' \
    "$KUBE_BIN" "$ETCD_BIN" "$HELM_BIN" "$HELM_PLUGINS_DIR" "$PROMETHEUS_BIN" "$METALLB_BIN" "$METALLB_SPEAKER_BIN"
fi
