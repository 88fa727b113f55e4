#!/usr/bin/env bash
# Prints the paths of the third-party CRDs that the chart tests install to prove the chart's
# optional objects are accepted by a real API server: ServiceMonitor and PrometheusRule
# (prometheus-operator), Certificate and Issuer (cert-manager). The files come from the
# projects' Go modules through the Go module proxy, pinned by tools/crds/go.mod and go.sum;
# the Go module cache keeps them for later runs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/tools/crds"
cm=github.com/cert-manager/cert-manager
po=github.com/prometheus-operator/prometheus-operator
go mod download "$cm" "$po"
cm_dir=$(go list -m -f '{{.Dir}}' "$cm")
po_dir=$(go list -m -f '{{.Dir}}' "$po")
for f in "$po_dir/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml" \
         "$po_dir/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" \
         "$cm_dir/deploy/crds/cert-manager.io_certificates.yaml" \
         "$cm_dir/deploy/crds/cert-manager.io_issuers.yaml"; do
  [ -f "$f" ] || { echo "third-party-crds: $f is missing" >&2; exit 1; }
  echo "$f"
done
