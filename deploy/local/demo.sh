#!/usr/bin/env bash
# `make demo` / `make demo-down`: the quickstart on the local control plane.
# Today it brings up the control plane with the CRDs installed; the controller, the
# aggregated API server and the range driver join it as they land.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"
dir="${DEMO_DIR:-$AC_CACHE/clusters/demo}"

n=0
step() { n=$((n+1)); printf '\n[demo %d] %s\n' "$n" "$*"; }
fail() { printf '\n[demo] FAILED at step %d (%s). Logs: %s\n' "$n" "$1" "${2:-$dir/logs}" >&2; exit 1; }

case "${1:-up}" in
  up)
    t0=$(date +%s)
    step "build the control-plane binaries (cached by version; cold ~25 min on 2 cores)"
    "$here/build-binaries.sh" || fail "build-binaries" "the output above"
    step "start etcd, kube-apiserver and kube-controller-manager on 127.0.0.1"
    kubeconfig="$("$here/cluster.sh" up "$dir")" || fail "cluster up"
    export KUBECONFIG="$kubeconfig"
    step "install the CRDs"
    (cd "$root" && make -s install-crds) || fail "install-crds"
    step "show what the cluster serves"
    kubectl api-resources --api-group=local.sdn.cozystack.io
    cat <<MSG

The local control plane is up ($(( $(date +%s) - t0 ))s).

  export KUBECONFIG=$kubeconfig
  kubectl get ipaddressclasses,ipaddresses.local.sdn.cozystack.io
  kubectl get ipaddressclaims -A
  kubectl explain ipaddressclaim.spec

Logs: $dir/logs/    Stop it with: make demo-down
MSG
    ;;
  down)
    "$here/cluster.sh" down "$dir"
    ;;
  *) echo "usage: demo.sh up|down" >&2; exit 2 ;;
esac
