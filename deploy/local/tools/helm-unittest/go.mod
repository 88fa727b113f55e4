// Pins helm-unittest's module for build-binaries.sh, which builds it inside the downloaded
// module (with the module's own go.mod and its replace directive), as its releases are built.
module github.com/cozystack/address-controller/deploy/local/tools/helm-unittest

go 1.26.0

require github.com/helm-unittest/helm-unittest v1.1.2
