# shellcheck shell=bash
# Pinned versions of the local control plane. Sourced by the scripts in this directory.
# shellcheck disable=SC2034 # sourced: its variables are the sourcing script's
# Changing a version here changes the cache key, so the next run rebuilds that binary.
KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
HELM_VERSION=v3.22.0
# Prometheus v3.16.0 (its Go module is tagged v0.316.0): prometheus and promtool, for the
# scrape, alert-rule and dashboard tests.
PROMETHEUS_VERSION=v0.316.0
# The MetalLB controller (the IPAM half of MetalLB), for the MetalLB driver's tests. v0.16.2
# needs frr-k8s v0.0.27, whose zip the module proxy refuses; v0.16.1 builds as is.
METALLB_VERSION=v0.16.1
# helm-unittest, the helm plugin the platform runs per package (`helm unittest .`): the
# wrapper packages' suites (packaging/).
HELM_UNITTEST_VERSION=v1.1.2
# The cilium-operator (LB-IPAM; the Cilium driver's tests, issue #65), built inside the
# downloaded module github.com/cilium/cilium. v1.20.x does not build here: the module proxy
# refuses the zips of sigs.k8s.io/mcs-api/controllers v0.5.2 and of the gobgp/v4
# pseudo-version it requires (403); v1.19.5 builds as is and has LB-IPAM's v1.20 surface
# (lbipam.cilium.io/ips, sharing-key, sharing-cross-namespace, IPAMRequestSatisfied).
CILIUM_VERSION=v1.19.5

# Built binaries live outside the repository, keyed by version, so CI runs and later
# sessions on the same machine reuse them. Override with ADDRESS_CONTROLLER_CACHE.
AC_CACHE="${ADDRESS_CONTROLLER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/address-controller}"
KUBE_BIN="$AC_CACHE/bin/kubernetes-$KUBE_VERSION"
ETCD_BIN="$AC_CACHE/bin/etcd-$ETCD_VERSION"
HELM_BIN="$AC_CACHE/bin/helm-$HELM_VERSION"
PROMETHEUS_BIN="$AC_CACHE/bin/prometheus-$PROMETHEUS_VERSION"
# A helm plugins directory (HELM_PLUGINS) holding helm-unittest as the plugin `unittest`.
HELM_PLUGINS_DIR="$AC_CACHE/bin/helm-plugins-unittest-$HELM_UNITTEST_VERSION"
METALLB_BIN="$AC_CACHE/bin/metallb-$METALLB_VERSION"
CILIUM_BIN="$AC_CACHE/bin/cilium-operator-$CILIUM_VERSION"
# kubelet and kube-scheduler of the same Kubernetes version: the node tier (deploy/local/node.sh).
NODE_BIN="$AC_CACHE/bin/kubernetes-node-$KUBE_VERSION"
# kube-proxy of the same Kubernetes version: the node tier's Services (iptables mode).
KUBE_PROXY_BIN="$AC_CACHE/bin/kube-proxy-$KUBE_VERSION"
# MetalLB's speaker of the same MetalLB version: the node tier's L2 announcements.
METALLB_SPEAKER_BIN="$AC_CACHE/bin/metallb-speaker-$METALLB_VERSION"
# grafana-operator's CRD schemas as validators (npm, tools/grafana-schema): the chart's
# GrafanaDashboard is checked against them. Keyed by a hash of that directory's files.
grafana_schema_dir() {
  local h
  h="$(cd "$(dirname "${BASH_SOURCE[0]}")/tools/grafana-schema" && cat package.json package-lock.json validate.mjs | sha256sum | cut -c1-12)"
  echo "$AC_CACHE/bin/grafana-schema-$h"
}
# cozy-proxy's upstream source (not in this repository; see build-binaries.sh) and its
# cache directory, keyed by a hash of that source.
COZY_PROXY_SRC="${COZY_PROXY_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/shared/third_party/cozy-proxy}"
cozy_proxy_bin() {
  local h
  h="$(cd "$COZY_PROXY_SRC" 2>/dev/null && find . -name '*.go' -o -name go.mod -o -name go.sum | LC_ALL=C sort | xargs cat 2>/dev/null | sha256sum | cut -c1-12)"
  echo "$AC_CACHE/bin/cozy-proxy-$h"
}
