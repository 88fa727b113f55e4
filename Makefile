# The two commands of a fresh machine:
#   make demo   the quickstart: control plane, the chart, controller and range driver, tenants' claims and Services
#   make test   run every test: lints, unit tests, integration tests on a real control plane
SHELL := /bin/bash
.DEFAULT_GOAL := help

CLUSTER_DIR ?=
CARGO ?= cargo

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: demo
demo: ## Quickstart: control plane + the chart + controller + range driver, tenants' claims and Services with their EXTERNAL-IP (METALLB=1: real MetalLB; NODE=1, root: a real kubelet node)
	@deploy/local/demo.sh up

.PHONY: demo-down
demo-down: ## Stop the quickstart (NODE=1 for the node quickstart)
	@deploy/local/demo.sh down

.PHONY: test
test: ## Run all tests (fmt, clippy, unit, integration on a real local control plane; as root also the node tier)
	@deploy/local/test.sh

.PHONY: manifests
manifests: ## Regenerate the CRDs, the ClusterRoles (controller, range, MetalLB and Cilium drivers) and the views' OpenAPI documents from the code, and vendor the chart into packaging/
	$(CARGO) run -q -p address-controller -- manifests --crds-dir chart/address-controller/crds --role chart/address-controller/files/controller-role.yaml --openapi-dir openapi
	mkdir -p chart/address-controller/files
	$(CARGO) run -q -p address-controller-range-driver -- --print-cluster-role > chart/address-controller/files/range-driver-role.yaml
	@echo "wrote chart/address-controller/files/range-driver-role.yaml"
	$(CARGO) run -q -p address-controller-metallb-driver -- --print-cluster-role > chart/address-controller/files/metallb-driver-role.yaml
	@echo "wrote chart/address-controller/files/metallb-driver-role.yaml"
	$(CARGO) run -q -p address-controller-cilium-driver -- --print-cluster-role > chart/address-controller/files/cilium-driver-role.yaml
	@echo "wrote chart/address-controller/files/cilium-driver-role.yaml"
	@packaging/vendor.sh

.PHONY: packages
packages: ## Vendor chart/ into the platform's wrapper packages (packaging/cozystack/*/charts/); DIGEST=dist/address-controller-<version>.digest also pins their image to that build
	@packaging/vendor.sh $(if $(DIGEST),--digest $(DIGEST))

.PHONY: build-binaries
build-binaries: ## Build kube-apiserver, kube-controller-manager, etcd and helm (cached by version)
	@deploy/local/build-binaries.sh

.PHONY: cluster-up
cluster-up: ## Start (or reuse) the development control plane
	@deploy/local/cluster.sh up $(CLUSTER_DIR)

.PHONY: cluster-down
cluster-down: ## Stop the development control plane
	@deploy/local/cluster.sh down $(CLUSTER_DIR)

.PHONY: install-crds
install-crds: ## Apply the current CRDs to the cluster in $KUBECONFIG (and wait until kube-apiserver admits a create of each kind)
	kubectl apply --server-side --field-manager=address-controller-install -f chart/address-controller/crds/
	kubectl wait --for=condition=Established --timeout=60s -f chart/address-controller/crds/
	@# Established is not yet served, and served is not yet admitted: a create right after it
	@# can answer 503 "Resource kind ... not found". Wait (60 s at most) until a server-side
	@# dry-run create of each kind is admitted.
	@deploy/local/wait-admitted.sh

.PHONY: helm-package
helm-package: ## helm lint the chart and package it into dist/ (helm is built and cached like the control plane)
	@deploy/local/build-binaries.sh helm
	@. deploy/local/versions.sh && "$$HELM_BIN/helm" lint --strict chart/address-controller && "$$HELM_BIN/helm" package chart/address-controller --destination dist/

.PHONY: image
image: ## The container image without a container engine: release binaries + Debian libc/libgcc/CA certificates -> dist/address-controller-<version>.oci.tar, its SBOM (.spdx.json) and digest; reproducible per commit
	@deploy/image/build.sh

.PHONY: lint
lint: ## cargo fmt --check, clippy with warnings as errors, shellcheck and ruff over the scripts (deploy/local/lint.sh), no product function over 100 lines and no test over 150 (fn-length), no broken intra-doc link (cargo doc)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	@deploy/local/lint.sh
	$(CARGO) run -q -p address-controller-tests --bin fn-length
	RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links" $(CARGO) doc -q --no-deps --workspace

.PHONY: chaos
chaos: ## The chaos suite on a fresh local control plane: churn, leader kills, kube-apiserver/etcd restarts, then the invariants (CHAOS_DURATION, default 10m; CHAOS_DRIVER=metallb with the real MetalLB, CHAOS_DRIVER=cilium with the real cilium-operator)
	@deploy/local/build-binaries.sh
	$(CARGO) build --bins --quiet
	$(CARGO) run --quiet -p address-controller-tests --bin chaos -- --duration $(or $(CHAOS_DURATION),10m) --driver $(or $(CHAOS_DRIVER),range)

.PHONY: chaos-wire
chaos-wire: ## The wire under day-two churn on two nodes (root): addresses probed from the client host while leaders die, kube-apiserver, the speakers and kube-proxies restart, the chart upgrades, pods roll and each node is drained — a table of failed probes per event (AC_WIRE_CHURN_ROUNDS, default 5)
	@deploy/local/build-binaries.sh
	$(CARGO) build --bins --quiet
	AC_WIRE_CHURN_ROUNDS=$(or $(AC_WIRE_CHURN_ROUNDS),5) $(CARGO) test -q -p address-controller-tests --test nodes -- --exact the_wire_under_day_two_churn --nocapture

.PHONY: invariants
invariants: ## Check the ledger's invariants on the cluster in $KUBECONFIG (prints the table)
	$(CARGO) run --quiet -p address-controller-tests --bin invariant-check -- --settle 30s

.PHONY: bench-scale
bench-scale: ## The cost of a bind as the pool grows: a fresh control plane per size, release build (BENCH_SCALE_ARGS="--sizes 1000,5000,10000,20000 --driver-sizes 1000,10000"; the big cluster, ~30 min: "--sizes 100000 --driver-sizes '' --no-write-floor")
	@deploy/local/build-binaries.sh
	$(CARGO) build --release --bins --quiet
	ADDRESS_CONTROLLER_PROFILE=release $(CARGO) run --release --quiet -p address-controller-tests --bin bench-scale -- $(BENCH_SCALE_ARGS)

.PHONY: bench-history
bench-history: ## What the history costs per address before and after its records (#57): bytes in etcd and per watch event, RSS per cached object, the million-address estimate (BENCH_HISTORY_ARGS="100000")
	$(CARGO) run --release --quiet -p address-controller-tests --bin bench-history -- $(BENCH_HISTORY_ARGS)

.PHONY: bench-latency
bench-latency: ## What a tenant waits for under churn: open-loop arrivals at stepped rates over a base of bound objects, two replicas of the core and the range driver, each path next to a plain client's floor, the tails' profile; release build (BENCH_LATENCY_ARGS="--base 10000 --rates 5,10,20,50,100 --step 20 [--takeover 5]")
	@deploy/local/build-binaries.sh
	$(CARGO) build --release --bins --quiet
	ADDRESS_CONTROLLER_PROFILE=release $(CARGO) run --release --quiet -p address-controller-tests --bin bench-latency -- $(BENCH_LATENCY_ARGS)

.PHONY: bench-watch
bench-watch: ## Informer-like watchers of the views under steady claim changes: relists, latency, CPU per watcher
	cargo build --bins --quiet
	cargo bench -p address-controller-tests --bench watch

.PHONY: bench
bench: ## Benchmarks that print figures (list latency through the aggregator, bind throughput)
	cargo build --bins --quiet
	cargo bench -p address-controller-tests --bench list_latency
