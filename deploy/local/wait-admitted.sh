#!/usr/bin/env bash
# Waits (60 s at most) until kube-apiserver admits a server-side dry-run create of each of
# this project's kinds — not merely serves a list: a CRD that is Established may still be
# refused for a moment by admission (Kubernetes answers 503 "Resource kind ... not found"
# while a MutatingAdmissionPolicy for the kind has no schema yet, docs/troubleshooting.md).
# Uses kubectl and $KUBECONFIG. Nothing is created.
set -euo pipefail
objects() {
  cat <<'YAML'
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClass
metadata: {name: admission-probe}
spec: {provisioner: admission.probe.invalid}
---
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddress
metadata: {name: admission-probe}
spec: {address: 192.0.2.254, className: admission-probe, source: {fromClass: {}}}
---
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClaim
metadata: {name: admission-probe, namespace: default}
spec: {className: admission-probe}
---
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressQuota
metadata: {name: admission-probe, namespace: default}
spec: {limits: []}
YAML
}
deadline=$(( $(date +%s) + ${WAIT_ADMITTED_SECONDS:-60} ))
until out="$(objects | kubectl create --dry-run=server -f - -o name 2>&1)"; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    printf 'kube-apiserver does not admit a dry-run create of every kind:\n%s\n' "$out" >&2
    exit 1
  fi
  sleep 0.5
done
