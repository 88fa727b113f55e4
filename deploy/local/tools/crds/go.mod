// Third-party CRDs the chart tests install to prove the chart's optional objects
// (ServiceMonitor, PrometheusRule, cert-manager Certificate/Issuer) are accepted by a real
// API server. Only the YAML files under the modules are used; nothing is built.
module github.com/cozystack/address-controller/deploy/local/tools/crds

go 1.26.0

require (
	github.com/cert-manager/cert-manager v1.21.2
	github.com/prometheus-operator/prometheus-operator v0.85.0
)
