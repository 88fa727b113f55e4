#!/usr/bin/env bash
# shellcheck disable=SC2154 # api, metrics, probe, driver_probe: from $dir/demo-ports, sourced below
# `make demo` / `make demo-down`: the quickstart on the local control plane.
#
# Builds what is needed, starts etcd + kube-apiserver + kube-controller-manager on
# 127.0.0.1, installs the Helm chart, runs the address-controller (as the chart's
# ServiceAccount, with the chart's certificate, behind the chart's APIService) and the range
# driver (as its ServiceAccount) as local processes, creates a class with a small range and a few tenants' claims,
# prints the ledger and leaves everything running. Safe to re-run while it is up.
# METALLB=1: the real MetalLB controller runs too, and the class is the MetalLB driver's —
# MetalLB writes the Services' EXTERNAL-IP and holds every address in its own books.
# NODE=1 (root): the cluster gets a real node (kubelet, containerd, kube-proxy; cluster.sh
# --node) and the chart's own pods run there, from the image `make image` builds — nothing
# runs in their place; the demo ends on the wire: a client host curls each Service's
# EXTERNAL-IP and a tenant's pod answers (with METALLB=1 through MetalLB's speaker). Everything is inside the network namespace address-controller-node; use
# `deploy/local/cluster.sh exec DIR kubectl ...` to look around.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=build-times.sh
. "$here/build-times.sh"
# shellcheck source=versions.sh
. "$here/versions.sh"
# shellcheck source=ports.sh
. "$here/ports.sh"
node="${NODE:-}"
if [ -n "$node" ]; then dir="${DEMO_DIR:-$AC_CACHE/clusters/demo-node}"; else dir="${DEMO_DIR:-$AC_CACHE/clusters/demo}"; fi
target="${CARGO_TARGET_DIR:-$root/target}"
metallb="${METALLB:-}"
if [ -n "$node" ]; then
  # The cluster answers inside its network namespace only: so do this script's clients.
  kubectl() { nsenter "--net=/run/netns/address-controller-node" -- kubectl "$@"; }
fi
if [ -n "$metallb" ]; then driver="metallb-driver"; else driver="range-driver"; fi

n=0
step() { n=$((n+1)); printf '\n[demo %d] %s\n' "$n" "$*"; }
fail() { printf '\n[demo] FAILED at step %d (%s). Logs: %s\n' "$n" "$1" "${2:-$dir/logs}" >&2; exit 1; }

# run NAME CMD...: start a long-running process of the demo unless it already runs.
run() {
  local name="$1"; shift
  local pidfile="$dir/pids/demo-$name"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "  $name already running (pid $(cat "$pidfile"))"; return
  fi
  setsid "$@" >"$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
  echo "  $name started (pid $!, log $dir/logs/$name.log)"
}

# sa_kubeconfig SERVICEACCOUNT FILE: a kubeconfig with a one-year TokenRequest token of the
# chart's ServiceAccount (no admin credentials).
sa_kubeconfig() {
  local token server
  token="$(kubectl create token "$1" -n address-controller-system --duration 8760h)" || fail "TokenRequest for $1"
  server="$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')"
  rm -f "$2"
  # shellcheck disable=SC2030 # the kubeconfig being written is this subshell's alone
  ( export KUBECONFIG="$2"
    kubectl config set-cluster local --server="$server" --certificate-authority="$dir/pki/ca.crt" --embed-certs
    kubectl config set-credentials "$1" --token="$token"
    kubectl config set-context local --cluster=local --user="$1"
    kubectl config use-context local ) >/dev/null || fail "write the kubeconfig of $1"
}

wait_ready() { # NAME PORT
  for _ in $(seq 1 120); do
    curl -fs "http://127.0.0.1:$2/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$(cat "$dir/pids/demo-$1")" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

up() {
  local t0; t0=$(date +%s)
  # Only what this demo runs: etcd, kube-apiserver and the controller-manager, helm; MetalLB
  # with METALLB=1; kubelet, kube-scheduler, kube-proxy (and MetalLB's speaker) with NODE=1.
  # Prometheus is the tests' alone.
  local -a parts=(etcd helm kube)
  if [ -n "$metallb" ]; then parts+=(metallb); fi
  if [ -n "$node" ]; then parts+=(node wire); fi
  step "build the control-plane binaries ${parts[*]} (cached by version; cold ~$COLD_DEMO_BINARIES_MIN min on 2 cores, more with NODE=1 or METALLB=1)"
  "$here/build-binaries.sh" "${parts[@]}" || fail "build-binaries" "the output above"
  if [ -n "$node" ]; then
    [ "$(id -u)" = 0 ] || fail "NODE=1 needs root (network and mount namespaces, containerd)"
    step "build the container image (make image: release binaries; cold ~$COLD_IMAGE_MIN min)"
    "$root/deploy/image/build.sh" --out "$root/dist" || fail "make image" "the output above"
    step "start the control plane and a real node (kubelet, containerd) in the network namespace address-controller-node"
    kubeconfig="$("$here/cluster.sh" up "$dir" --node)" || fail "cluster up --node"
  else
    step "build address-controller and range-driver (cargo build --bins)"
    (cd "$root" && cargo build --bins --quiet) || fail "cargo build" "the output above"
    step "start etcd, kube-apiserver and kube-controller-manager on 127.0.0.1"
    kubeconfig="$("$here/cluster.sh" up "$dir")" || fail "cluster up"
  fi
  # shellcheck disable=SC2031 # the script's own kubeconfig, not the subshell's above
  export KUBECONFIG="$kubeconfig"
  if [ -n "$metallb" ]; then
    step "start the MetalLB controller ($METALLB_VERSION, built from Go modules)"
    "$here/cluster.sh" metallb "$dir" || fail "MetalLB" "$dir/logs/metallb-controller.log"
  fi

  # Ports of this demo's processes: free ones, picked once per demo directory (a re-run
  # keeps them, so the APIService keeps pointing at the right place; another demo gets
  # its own instead of talking to this one's servers).
  if [ ! -f "$dir/demo-ports" ]; then
    free_ports 4 | paste -d= <(printf '%s\n' api metrics probe driver_probe) - > "$dir/demo-ports"
  fi
  # shellcheck disable=SC1091
  . "$dir/demo-ports"

  if [ -n "$node" ]; then node_install; else local_install; fi

  step "create a class with a small range, two tenants and their claims"
  apply_demo
  # One address Released under Retain: a claim that came and went (only once).
  if ! kubectl get ipaddresses.local.sdn.cozystack.io -o jsonpath='{range .items[*]}{.spec.claimRef.name}{"\n"}{end}' | grep -qx legacy; then
    kubectl apply -f - >/dev/null <<'YAML' || fail "create tenant-b/legacy"
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClaim
metadata: {name: legacy, namespace: tenant-b}
spec: {}
YAML
    kubectl wait -n tenant-b ipaddressclaim/legacy --for=jsonpath='{.status.phase}'=Bound --timeout=60s >/dev/null \
      || fail "tenant-b/legacy Bound" "$dir/logs/address-controller.log"
    kubectl delete -n tenant-b ipaddressclaim/legacy --wait=true >/dev/null || fail "delete tenant-b/legacy"
  fi
  for c in tenant-a/web tenant-a/mail tenant-b/db tenant-b/shop; do
    kubectl wait -n "${c%/*}" "ipaddressclaim/${c#*/}" --for=jsonpath='{.status.phase}'=Bound --timeout=60s >/dev/null \
      || fail "claim $c Bound" "$dir/logs/"
  done

  for s in tenant-a/web tenant-b/shop; do
    kubectl wait -n "${s%/*}" "service/${s#*/}" --for=jsonpath='{.status.loadBalancer.ingress[0].ip}' --timeout=60s >/dev/null \
      || fail "Service $s has its EXTERNAL-IP" "$dir/logs/"
  done

  step "the tenants' Services: each shows its claim's address as EXTERNAL-IP"
  echo "\$ kubectl get svc -n tenant-a web; kubectl get svc -n tenant-b shop"
  kubectl get svc -n tenant-a web; kubectl get svc -n tenant-b shop | tail -n +2
  before="$(kubectl get svc -n tenant-a web -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
  echo; echo "\$ kubectl delete svc -n tenant-a web && kubectl apply -f demo.yaml   # the address belongs to the claim"
  kubectl delete svc -n tenant-a web --wait=true >/dev/null || fail "delete Service tenant-a/web"
  apply_demo
  kubectl wait -n tenant-a service/web --for=jsonpath='{.status.loadBalancer.ingress[0].ip}' --timeout=60s >/dev/null \
    || fail "the recreated Service tenant-a/web has its EXTERNAL-IP" "$dir/logs/"
  after="$(kubectl get svc -n tenant-a web -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
  kubectl get svc -n tenant-a web
  [ "$before" = "$after" ] || fail "the recreated Service got $after, not $before"
  echo "the same address came back: $after"

  step "a tenant at its quota: tenant-b may hold 3 addresses of class public"
  echo "\$ kubectl apply -f - <<< '{kind: IPAddressClaim, metadata: {name: extra, namespace: tenant-b}, ...}'   # db, shop and the Released legacy count 3"
  kubectl apply -f - >/dev/null <<'YAML' || fail "create tenant-b/extra"
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClaim
metadata: {name: extra, namespace: tenant-b}
spec: {}
YAML
  kubectl wait -n tenant-b ipaddressclaim/extra --for=jsonpath='{.status.conditions[?(@.type=="Bound")].reason}'=QuotaExceeded --timeout=60s >/dev/null \
    || fail "tenant-b/extra waits with QuotaExceeded" "$dir/logs/"
  echo "\$ kubectl get ipaddressclaims -n tenant-b extra -o wide"
  kubectl get ipaddressclaims -n tenant-b extra -o wide
  echo; echo "\$ kubectl get namespaceaddresses -n tenant-b -o wide   # QUOTA: used/hard, claims waiting"
  kubectl get namespaceaddresses -n tenant-b -o wide

  step "the ledger"
  echo "\$ kubectl get ipaddressclaims -A"; kubectl get ipaddressclaims -A
  echo; echo "\$ kubectl get ipaddresses.local.sdn.cozystack.io"; kubectl get ipaddresses.local.sdn.cozystack.io
  echo; echo "\$ kubectl get ipaddressclasses"; kubectl get ipaddressclasses
  echo; echo "\$ kubectl get namespaceaddresses -A"; kubectl get namespaceaddresses -A
  echo; echo "\$ kubectl get poolavailabilities"; kubectl get poolavailabilities
  if [ -n "$node" ]; then wire; vm; fi
  if [ -n "$node" ]; then
    cat <<MSG

The quickstart is up on a real node ($(( $(date +%s) - t0 ))s). Its cluster answers inside the
network namespace address-controller-node only; explore from there:

  alias k='$here/cluster.sh exec $dir kubectl'
  k get pods -n address-controller-system -o wide        # the chart's pods, run by the kubelet
  k get lease -n address-controller-system               # which replica leads
  k delete pod -n address-controller-system <the leader> # the other replica takes over at once
  k describe svc -n tenant-a web                          # Associated (the driver's event)
  k get namespaceaddresses -A -o wide                     # through the aggregator, from the pods
  k logs -n address-controller-system deploy/address-controller
  $here/cluster.sh client $dir curl -s http://192.0.2.1/   # the client host: tenant-a's pods answer

Logs of the control plane and the node: $dir/logs/    Stop everything with: make demo-down NODE=1
MSG
    return
  fi
  cat <<MSG

The quickstart is up ($(( $(date +%s) - t0 ))s). Explore:

  export KUBECONFIG=$kubeconfig
  kubectl describe ipaddressclaim -n tenant-a mail        # conditions and events
  kubectl get svc -n tenant-b shop -o yaml                # the auto-claim annotation, the ingress
  kubectl describe svc -n tenant-a web                    # Associated (the range driver's event)
  kubectl get namespaceaddresses -A -o wide               # holdings, through the aggregator
  kubectl get --raw /apis/view.local.sdn.cozystack.io/v1alpha1/namespaces/tenant-b/namespaceaddresses/tenant-b/addresses
  curl -sk -H "Authorization: Bearer \$(kubectl create token demo-scraper -n address-controller-system)" \\
    https://127.0.0.1:$metrics/metrics | grep ^address_controller_ip   # HTTPS, authorized
  kubectl delete ipaddressclaim -n tenant-a web           # Retain: the address becomes Released

Logs: $dir/logs/    Stop everything with: make demo-down
MSG
}

# The chart installed, its binaries run as local processes in place of its pods.
local_install() {
  step "install the chart (helm upgrade --install; its API Service points at localhost)"
  # No kubelet runs here, so the chart's pods cannot start: the binary runs below as a local
  # process in their place — as the chart's ServiceAccount, with the chart's certificate.
  # A registration made by an older demo (not by Helm) is replaced.
  if [ "$(kubectl get apiservice v1alpha1.view.local.sdn.cozystack.io --ignore-not-found \
          -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')" = "" ]; then
    kubectl delete apiservice v1alpha1.view.local.sdn.cozystack.io --ignore-not-found >/dev/null
    kubectl delete service -n address-controller-system address-controller-api --ignore-not-found >/dev/null
  fi
  (cd "$root" && make -s install-crds >/dev/null) || fail "install-crds"
  "$HELM_BIN/helm" upgrade --install address-controller "$root/chart/address-controller" \
    --namespace address-controller-system --create-namespace \
    --set apiService.service.externalName=localhost --set apiService.service.port="$api" \
    --set replicaCount=1 --set rangeDriver.enabled="$([ -z "$metallb" ] && echo true || echo false)" \
    --set metallbDriver.enabled="$([ -n "$metallb" ] && echo true || echo false)" \
    >"$dir/logs/helm.log" 2>&1 || fail "helm upgrade --install" "$dir/logs/helm.log"
  # The chart's admission policies are in place now: wait until a create of each kind is
  # admitted (a reused cluster dir's kube-apiserver may just have started).
  "$here/wait-admitted.sh" || fail "kube-apiserver admits creates of each kind" "$dir/logs/kube-apiserver.log"
  local sa="$dir/address-controller-sa" ns=address-controller-system
  mkdir -p "$sa"
  for key in tls.crt tls.key; do
    kubectl get secret -n "$ns" address-controller-api-tls -o go-template="{{index .data \"$key\" | base64decode}}" \
      > "$sa/$key" || fail "read the chart's certificate"
  done
  sa_kubeconfig address-controller "$sa/kubeconfig"
  sa_kubeconfig "address-controller-$driver" "$sa/$driver.kubeconfig"

  step "run the address-controller and the $driver (as the chart's ServiceAccounts)"
  run address-controller "$target/debug/address-controller" run --kubeconfig "$sa/kubeconfig" \
    --leader-elect-resource-namespace "$ns" --identity demo --probe-address "127.0.0.1:$probe" \
    --apiserver-address "127.0.0.1:$api" --metrics-address "127.0.0.1:$metrics" \
    --tls-cert-file "$sa/tls.crt" --tls-private-key-file "$sa/tls.key"
  local driver_args=()
  [ -n "$metallb" ] && driver_args=(--metallb-namespace metallb-system --hold-namespace "$ns")
  run "$driver" "$target/debug/$driver" --kubeconfig "$sa/$driver.kubeconfig" \
    --leader-elect-resource-namespace "$ns" --leader-elect-resource-name "address-controller-$driver" --identity demo \
    --probe-address "127.0.0.1:$driver_probe" "${driver_args[@]}"
  wait_ready address-controller "$probe" || fail "address-controller ready" "$dir/logs/address-controller.log"
  wait_ready "$driver" "$driver_probe" || fail "$driver ready" "$dir/logs/$driver.log"
  kubectl wait apiservice/v1alpha1.view.local.sdn.cozystack.io --for=condition=Available --timeout=60s >/dev/null \
    || fail "APIService Available" "$dir/logs/address-controller.log"

  # A ServiceAccount allowed to read /metrics (the chart's metrics-reader role).
  kubectl apply -f - >/dev/null <<YAML || fail "the metrics scraper's RBAC"
apiVersion: v1
kind: ServiceAccount
metadata: {name: demo-scraper, namespace: $ns}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: address-controller-demo-scraper}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: address-controller-metrics-reader}
subjects: [{kind: ServiceAccount, name: demo-scraper, namespace: $ns}]
YAML

}

# The chart installed as on any cluster: its pods run on the node, from the imported image.
node_install() {
  local ns=address-controller-system archive
  local -a archives=("$root"/dist/address-controller-*.oci.tar)
  archive="${archives[0]}"
  step "import the image into the node's containerd ($(basename "$archive"), named by its index)"
  "$here/cluster.sh" import "$dir" "$archive" >/dev/null || fail "image import"
  step "install the chart (helm upgrade --install, the chart's defaults + the $driver)"
  (cd "$root" && nsenter --net=/run/netns/address-controller-node -- make -s install-crds >/dev/null) || fail "install-crds"
  nsenter --net=/run/netns/address-controller-node -- "$HELM_BIN/helm" upgrade --install address-controller "$root/chart/address-controller" \
    --namespace "$ns" --create-namespace \
    --set rangeDriver.enabled="$([ -z "$metallb" ] && echo true || echo false)" \
    --set metallbDriver.enabled="$([ -n "$metallb" ] && echo true || echo false)" \
    >"$dir/logs/helm.log" 2>&1 || fail "helm upgrade --install" "$dir/logs/helm.log"
  nsenter --net=/run/netns/address-controller-node -- "$here/wait-admitted.sh" \
    || fail "kube-apiserver admits creates of each kind" "$dir/logs/kube-apiserver.log"
  kubectl rollout status -n "$ns" deployment/address-controller --timeout=180s || fail "rollout" "$dir/logs/kubelet.log"
  kubectl rollout status -n "$ns" "deployment/address-controller-$driver" --timeout=180s || fail "rollout of the $driver" "$dir/logs/kubelet.log"
  kubectl wait apiservice/v1alpha1.view.local.sdn.cozystack.io --for=condition=Available --timeout=60s >/dev/null \
    || fail "APIService Available" "$dir/logs/"
  echo "\$ kubectl get pods -n $ns -o wide"
  kubectl get pods -n "$ns" -o wide
}

# NODE=1: the last step of the journey. Each tenant's Service gets pods that answer HTTP with
# their name (the node's hello image), and a client host on the provider's network — the
# network namespace address-controller-client, one L2 segment away from the node — curls
# each EXTERNAL-IP: through MetalLB's speaker (METALLB=1: it answers ARP for the address)
# or a route to the node (the range driver: its ranges are routed to the nodes), then
# kube-proxy on the node, to a pod.
wire() {
  local how=via-node s ip port
  if [ -n "$metallb" ]; then how=on-link; fi
  step "the wire: a client host curls each Service's EXTERNAL-IP and reaches the tenant's pods"
  for s in tenant-a/web tenant-b/shop; do
    kubectl apply -f - >/dev/null <<YAML || fail "the workload of $s"
apiVersion: apps/v1
kind: Deployment
metadata: {name: ${s#*/}, namespace: ${s%/*}}
spec:
  replicas: 2
  selector: {matchLabels: {app: ${s#*/}}}
  template:
    metadata: {labels: {app: ${s#*/}}}
    spec:
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65535, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: hello
        image: localhost/address-controller/hello:1
        imagePullPolicy: Never
        ports: [{containerPort: 8080, name: http}]
        readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
YAML
  done
  for s in tenant-a/web tenant-b/shop; do
    kubectl rollout status -n "${s%/*}" "deployment/${s#*/}" --timeout=120s >/dev/null || fail "the pods of $s" "$dir/logs/kubelet.log"
  done
  if [ -n "$metallb" ]; then
    echo "# the class's addresses are on the client's segment: it asks for them by ARP, MetalLB's speaker answers"
  else
    echo "# the range driver's addresses are routed to the node, as an upstream router would"
  fi
  echo "\$ ip route replace 192.0.2.0/28 $([ "$how" = on-link ] && echo "dev acw-client" || echo "via 10.255.1.1")   # on the client host"
  "$here/cluster.sh" route "$dir" 192.0.2.0/28 "$how" || fail "the client's route"
  for s in tenant-a/web tenant-b/shop; do
    ip="$(kubectl get svc -n "${s%/*}" "${s#*/}" -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
    port="$(kubectl get svc -n "${s%/*}" "${s#*/}" -o jsonpath='{.spec.ports[0].port}')"
    client_curl "$ip" "$port" || fail "curl http://$ip:$port/ from the client host" "$dir/logs/"
  done
  if [ -n "$metallb" ]; then
    echo "\$ ip neigh show dev acw-client   # the addresses' MAC: the node's side of the segment"
    "$here/cluster.sh" client "$dir" ip neigh show dev acw-client
  fi
  ip="$(kubectl get svc -n tenant-a web -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
  echo; echo "\$ kubectl delete svc -n tenant-a web && kubectl apply -f demo.yaml   # the same address answers again"
  kubectl delete svc -n tenant-a web --wait=true >/dev/null || fail "delete Service tenant-a/web"
  apply_demo
  client_curl "$ip" 80 || fail "the recreated Service answers at $ip" "$dir/logs/"
}

# NODE=1: a virtual machine's whole address, both ways, through the platform's own data plane
# (cozy-proxy, built from its upstream source beside this repository; skipped, and said so,
# without it). A claim, a pod standing in for the VM (it listens on ports nobody lists), and
# the Service the platform renders for a VM with a public address: cozy-proxy's label,
# wholeIP, the placeholder port 65535, externalTrafficPolicy Local. The client host reaches
# a port the Service never listed; the VM's own outbound connection reaches the client host
# from the claimed address.
vm() {
  if ! "$here/cluster.sh" cozy-proxy "$dir" >/dev/null 2>&1; then
    step "a VM's whole address: skipped — no cozy-proxy source at $COZY_PROXY_SRC"
    return 0
  fi
  step "a VM's whole address through cozy-proxy: every port in, its traffic out from the address"
  kubectl apply -f - >/dev/null <<YAML || fail "the VM's claim, pod and Service"
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClaim
metadata: {name: vm, namespace: tenant-a}
spec: {className: public}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: vm, namespace: tenant-a}
spec:
  replicas: 1
  selector: {matchLabels: {app: vm}}
  template:
    metadata: {labels: {app: vm}}
    spec:
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65535, seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: hello
        image: localhost/address-controller/hello:1
        imagePullPolicy: Never
        command: [/hello]
        args: ["8080", "2222", "u:5353"]
        ports: [{containerPort: 8080, name: http}]
        # asked inside the pod: cozy-proxy sends everything the pod sends from the address,
        # its answers to a probe from the node too (docs/operations.md)
        readinessProbe: {exec: {command: [/hello, probe, "8080"]}, periodSeconds: 1}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
---
apiVersion: v1
kind: Service
metadata:
  name: vm
  namespace: tenant-a
  labels: {service.kubernetes.io/service-proxy-name: cozy-proxy}
  annotations: {local.sdn.cozystack.io/ip-address-claim: vm, networking.cozystack.io/wholeIP: "true"}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  allocateLoadBalancerNodePorts: false
  selector: {app: vm}
  ports: [{name: placeholder, port: 65535, protocol: TCP}]
YAML
  kubectl rollout status -n tenant-a deployment/vm --timeout=120s >/dev/null || fail "the VM's pod" "$dir/logs/kubelet.log"
  kubectl wait -n tenant-a service/vm --for=jsonpath='{.status.loadBalancer.ingress[0].ip}' --timeout=60s >/dev/null \
    || fail "the VM's Service has its address" "$dir/logs/"
  ip="$(kubectl get svc -n tenant-a vm -o jsonpath='{.status.loadBalancer.ingress[0].ip}')"
  echo "\$ kubectl get svc -n tenant-a vm; kubectl get ipa -o wide | grep vm"
  kubectl get svc -n tenant-a vm
  kubectl get ipaddresses.local.sdn.cozystack.io -o wide | grep -E "NAME|tenant-a +vm " || true
  echo "# port 2222 is listed nowhere: cozy-proxy forwards the whole address to the VM's pod"
  client_curl "$ip" 2222 || fail "curl http://$ip:2222/ (an unlisted port) from the client host" "$dir/logs/cozy-proxy.log"
  echo "# the VM connects out to the client host (a listener there on :9000): which address does the client see?"
  "$here/cluster.sh" client "$dir" "$dir/node/hello" 9000 >/dev/null 2>&1 &
  local listener=$! out
  for _ in $(seq 1 50); do "$here/cluster.sh" client "$dir" curl -s --max-time 1 http://10.255.1.2:9000/ >/dev/null 2>&1 && break; sleep 0.1; done
  echo "\$ curl http://$ip:8080/dial/10.255.1.2/9000   # on the client host: the VM dials back"
  out="$("$here/cluster.sh" client "$dir" curl -s --max-time 5 "http://$ip:8080/dial/10.255.1.2/9000")"
  kill "$listener" 2>/dev/null; pkill -f "$dir/node/hello 9000" 2>/dev/null || true
  echo "$out"
  [ "${out##* }" = "$ip" ] || fail "the VM's outbound connection was seen from ${out##* }, not $ip" "$dir/logs/cozy-proxy.log"
  echo "the VM's outbound traffic left from its claimed address: $ip"
}

# client_curl IP PORT: curl from the client host until a pod answers (bounded: 60 s).
client_curl() {
  local out
  echo "\$ curl http://$1:$2/   # on the client host"
  for _ in $(seq 1 120); do
    if out="$("$here/cluster.sh" client "$dir" curl -s --max-time 2 "http://$1:$2/")"; then echo "$out"; return 0; fi
    sleep 0.5
  done
  return 1
}

# The demo's objects: demo.yaml, whose class is the range driver's — or, with METALLB=1, the
# same class as a MetalLB pool.
apply_demo() {
  if [ -z "$metallb" ]; then
    kubectl apply -f "$here/demo.yaml" >/dev/null || fail "kubectl apply demo.yaml"
    return
  fi
  kubectl apply -f - >/dev/null <<'YAML' || fail "the MetalLB class"
apiVersion: local.sdn.cozystack.io/v1alpha1
kind: IPAddressClass
metadata:
  name: public
  annotations:
    ipaddressclass.local.sdn.cozystack.io/is-default-class: "true"
    ipaddressclass.local.sdn.cozystack.io/is-auto-claim-class: "true"
spec:
  provisioner: metallb.drivers.local.sdn.cozystack.io
  reclaimPolicy: Retain
  releaseDelay: 24h
  parameters:
    addresses: ["192.0.2.0/28", "2001:db8:100::/124"]
YAML
  # demo.yaml without its first document (the range driver's class).
  awk 'f; /^---$/ && !f {f=1}' "$here/demo.yaml" | kubectl apply -f - >/dev/null || fail "kubectl apply demo.yaml"
}

down() {
  for name in address-controller range-driver metallb-driver; do
    f="$dir/pids/demo-$name"
    [ -f "$f" ] || continue
    kill -TERM -- "-$(cat "$f")" 2>/dev/null || kill -TERM "$(cat "$f")" 2>/dev/null || true
    rm -f "$f"
  done
  "$here/cluster.sh" down "$dir"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) echo "usage: demo.sh up|down" >&2; exit 2 ;;
esac
