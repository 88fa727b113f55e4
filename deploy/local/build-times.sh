# shellcheck shell=bash
# shellcheck disable=SC2034 # sourced: its variables are the sourcing script's
# Cold build times measured on the 2-core / 24 GiB build machine, in minutes: the one place
# the scripts' messages and the README's table take them from (tests/tests/docs.rs checks
# the README against this file). Re-measure and change them here.
COLD_GO_BINARIES_MIN=14    # make build-binaries, nothing cached (all Go binaries below)
COLD_KUBE_MIN=10           # kube-apiserver and kube-controller-manager, part of the above
COLD_DEMO_BINARIES_MIN=11  # make demo's share (etcd, helm, kube: all but Prometheus and MetalLB; derived from the above)
COLD_PROMETHEUS_MIN=4      # prometheus and promtool, part of the above
COLD_METALLB_MIN=2         # the MetalLB controller, part of the above
COLD_CILIUM_MIN=4          # the cilium-operator (generic), not part of the above: built on demand (measured 228 s with its module downloads)
COLD_NODE_MIN=4.5          # kubelet and kube-scheduler (the node tier), after the above
COLD_WIRE_MIN=1            # kube-proxy and MetalLB's speaker (the node tier's wire), after the above (10 s each warm; estimated)
COLD_IMAGE_MIN=6           # make image: the release build of the binaries
