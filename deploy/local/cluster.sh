#!/usr/bin/env bash
# A real, minimal Kubernetes control plane on 127.0.0.1: etcd + kube-apiserver (RBAC,
# service-account tokens, aggregation layer) + kube-controller-manager (garbage collector,
# namespace controller). No kubelet, no kube-proxy (unless --node): nothing dials a ClusterIP.
#
#   cluster.sh up   [DIR] [--watch-pid PID] [--node | --nodes 2]
#                                             start (or reuse, if already up) a cluster in DIR;
#                                             --node (root only): with a real node — kubelet,
#                                             kube-scheduler, containerd, kube-proxy, pods — all of
#                                             it inside a network namespace of its own, and a client
#                                             host on a veth segment to it (deploy/local/node.sh);
#                                             --nodes 2: a second node beside it, on the same segment
#   cluster.sh down [DIR]                     stop it and remove DIR
#   cluster.sh status [DIR]                   exit 0 when it answers /readyz
#   cluster.sh restart DIR COMPONENT          kill a component (see below) and start it again
#                                             (same flags, same data), wait until ready
#   cluster.sh pause|resume DIR COMPONENT     SIGSTOP / SIGCONT a component (a hung server)
#   cluster.sh import DIR ARCHIVE             (--node) an OCI image archive into the node's containerd
#   cluster.sh exec DIR CMD...                CMD with the cluster's KUBECONFIG, inside its network
#                                             namespace with --node (e.g. exec DIR kubectl get pods -A)
#   cluster.sh metallb DIR                    run the real MetalLB controller (v$METALLB_VERSION, the IPAM
#                                             half of MetalLB) against the cluster: its CRDs, namespace
#                                             metallb-system and the Pod object it reads; stopped by `down`.
#                                             With --node, also MetalLB's speaker on the node (L2 mode)
#   cluster.sh cilium DIR                     run the real cilium-operator (v$CILIUM_VERSION, LB-IPAM; built on
#                                             first use, build-binaries.sh cilium) against the cluster: it
#                                             installs Cilium's CRDs itself; stopped by `down`. No agent
#                                             (L2 announcements and BGP are the agent's, not run here)
#   cluster.sh cozy-proxy DIR                 (--node) run cozy-proxy — the platform's data plane for
#                                             whole-address Services, built from its upstream source
#                                             (build-binaries.sh cozy) — on every node, as its DaemonSet
#                                             runs it (host network); stopped by `down`. Exits 3 when
#                                             its source is not there (the tests say skipped)
#   cluster.sh client DIR CMD...              (--node) CMD on the client host, the far end of the wire
#                                             (e.g. client DIR curl http://192.0.2.1/)
#   cluster.sh route DIR CIDR on-link|via-node|none
#                                             (--node) how the client host reaches CIDR: on the segment
#                                             (MetalLB L2 answers ARP/NDP) or via the node (routed)
#
# A component restarted by `restart` (etcd, kube-apiserver, and with --node kube-proxy,
# metallb-speaker, metallb-controller, cozy-proxy; with --nodes 2 also the second node's
# kube-proxy-2, metallb-speaker-2 and cozy-proxy-2) runs the same command again and is waited for.
#
# SERVICE_CIDR (IPv4, default 10.0.0.0/24) sizes the Services' ClusterIP range (the latency
# bench keeps hundreds of LoadBalancer Services alive at once); AC_ETCD_QUOTA_BYTES
# (default etcd's 2 GiB) its database quota (bench-scale's 100,000 run raises it).
#
# DIR defaults to $AC_CACHE/clusters/dev (see versions.sh). Every cluster picks free ports
# and keeps all its state in DIR, so several can run side by side. DIR/env holds
# KUBECONFIG and the ports; logs are in DIR/logs/. With --watch-pid, the cluster stops
# itself when that process exits (used by the test harness).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.sh
. "$here/versions.sh"
# shellcheck source=ports.sh
. "$here/ports.sh"
# shellcheck source=node.sh
. "$here/node.sh"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

cmd="${1:-}"; shift || true
# NODES: how many nodes (--nodes; DIR/env once the cluster is up), never the caller's.
dir=""; watch_pid=""; component=""; node=""; rest=(); NODES=""
while [ $# -gt 0 ]; do
  case "$1" in
    --watch-pid) watch_pid="$2"; shift 2 ;;
    --node) node=1; shift ;;
    --nodes) node=1; NODES="$2"; shift 2
      case "$NODES" in 1|2) ;; *) die "--nodes 1 or 2, not '$NODES'" ;; esac ;;
    *) if [ -z "$dir" ]; then dir="$1"; shift; elif [ "$cmd" = exec ] || [ "$cmd" = client ] || [ "$cmd" = route ]; then rest=("$@"); break;
       elif [ -z "$component" ] && [ "${1#-}" = "$1" ]; then component="$1"; shift; else die "unknown argument $1"; fi ;;
  esac
done
dir="${dir:-$AC_CACHE/clusters/dev}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
node_use 1

# netns CMD...: CMD where the cluster's processes are (its network namespace with --node).
netns() {
  if [ -n "$node" ]; then in_netns "$@"; else "$@"; fi
}

# Loads DIR/env (and whether the cluster there has a node).
load_env() {
  [ -f "$dir/env" ] || return 1
  # shellcheck disable=SC1091
  . "$dir/env"
  if [ -n "${NODE:-}" ]; then node=1; fi
}

readyz() {
  load_env || return 1
  netns curl -fsS --max-time 3 --cacert "$dir/pki/ca.crt" --cert "$dir/pki/admin.crt" --key "$dir/pki/admin.key" \
    "https://127.0.0.1:$KUBE_APISERVER_PORT/readyz" >/dev/null 2>&1
}

# --- certificates -------------------------------------------------------------------------
# cert NAME CA SUBJECT EXT: an EC P-256 key and a certificate signed by CA (self-signed
# when CA is "self"), with the given X.509 v3 extensions.
cert() {
  local name="$1" ca="$2" subj="$3" ext="$4" pki="$dir/pki"
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null
  printf '%s\n' "$ext" > "$pki/$name.ext"
  if [ "$ca" = self ]; then
    openssl req -x509 -new -key "$pki/$name.key" -subj "$subj" -days 3650 \
      -extensions v3 -config <(printf '[req]\ndistinguished_name=dn\n[dn]\n[v3]\n%s\n' "$ext") \
      -out "$pki/$name.crt" 2>/dev/null
  else
    openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
    openssl x509 -req -in "$pki/$name.csr" -CA "$pki/$ca.crt" -CAkey "$pki/$ca.key" -CAcreateserial \
      -days 3650 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  fi
}

make_pki() {
  local pki="$dir/pki"
  mkdir -p "$pki"
  local ca_ext='basicConstraints=critical,CA:TRUE
keyUsage=critical,keyCertSign,cRLSign,digitalSignature'
  local client_ext='basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
  # The cluster CA signs the API server's serving cert and ordinary client certs.
  cert ca self "/CN=address-controller-local-ca" "$ca_ext"
  # With a node, pods reach it at the `kubernetes` Service's ClusterIP, the kubelet at NODE_IP.
  local node_sans=""
  if [ -n "$node" ]; then node_sans=",IP:10.0.0.1,IP:$NODE_IP"; fi
  cert apiserver ca "/CN=kube-apiserver" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc$node_sans"
  cert admin ca "/O=system:masters/CN=admin" "$client_ext"
  # The front proxy has its own CA: an ordinary client cert must never pass as the proxy.
  cert front-proxy-ca self "/CN=address-controller-local-front-proxy-ca" "$ca_ext"
  cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" "$client_ext"
  # The aggregated API server's own CA and serving certificate: the APIService's caBundle
  # and the name kube-apiserver verifies (<service>.<namespace>.svc).
  cert aggr-ca self "/CN=address-controller-local-aggregated-ca" "$ca_ext"
  cert aggr aggr-ca "/CN=address-controller-api" 'basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:address-controller-api.address-controller-system.svc,DNS:localhost,IP:127.0.0.1'
  # Service-account token signing key.
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2>/dev/null
  openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  if [ -n "$node" ]; then node_pki; fi
}

write_kubeconfig() {
  cat > "$dir/admin.kubeconfig" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$1
    certificate-authority: $dir/pki/ca.crt
users:
- name: admin
  user:
    client-certificate: $dir/pki/admin.crt
    client-key: $dir/pki/admin.key
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
KCFG
}

# start NAME CMD...: run CMD in its own session (so `down` can kill the whole group),
# logging to DIR/logs/NAME.log and recording the pid.
start() {
  local name="$1"; shift
  # The command is kept so that `restart` runs exactly the same one again.
  mkdir -p "$dir/cmds"
  printf '%q ' "$@" > "$dir/cmds/$name"
  setsid "$@" >>"$dir/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$dir/pids/$name"
}

# stop_one NAME: TERM the component's process group, then KILL.
stop_one() {
  local f="$dir/pids/$1" pid
  [ -f "$f" ] || return 0
  pid="$(cat "$f")"
  kill -CONT -- "-$pid" 2>/dev/null || true
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$f"
}

# restart COMPONENT: stop it and start it again with the recorded command.
restart() {
  local name="$1"
  case "$name" in
    etcd|kube-apiserver) ;;
    kube-proxy|kube-proxy-2|metallb-speaker|metallb-speaker-2|metallb-controller|cilium-operator|cozy-proxy|cozy-proxy-2)
      [ -f "$dir/pids/$name" ] || die "$name does not run in $dir"; restart_with_health "$name"; return ;;
    *) die "restart: etcd, kube-apiserver, kube-proxy[-2], metallb-speaker[-2], metallb-controller, cilium-operator or cozy-proxy[-2], not '$name'" ;;
  esac
  [ -f "$dir/cmds/$name" ] || die "no recorded command for $name in $dir"
  # shellcheck disable=SC1091
  . "$dir/env"
  stop_one "$name"
  local -a argv
  eval "argv=($(cat "$dir/cmds/$name"))"
  start "$name" "${argv[@]}"
  local deadline=$(( $(date +%s) + 120 ))
  until readyz; do
    kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null || die "$name exited after restart; log: $dir/logs/$name.log"
    [ "$(date +%s)" -lt "$deadline" ] || die "not ready 120s after restarting $name"
    sleep 0.2
  done
  log "restarted $name (pid $(cat "$dir/pids/$name"))"
}

# restart_with_health NAME: a component with a recorded health URL, stopped (TERM, as a
# kubelet stops a container) and started again with the same command, until healthy.
restart_with_health() {
  local name="$1"
  load_env
  stop_one "$name"
  local -a argv
  eval "argv=($(cat "$dir/cmds/$name"))"
  start "$name" "${argv[@]}"
  wait_health "$name" 60
  log "restarted $name (pid $(cat "$dir/pids/$name"))"
}

signal_component() {
  local sig="$1" name="$2" f="$dir/pids/$2"
  [ -f "$f" ] || die "$name is not running in $dir"
  kill "-$sig" -- "-$(cat "$f")"
}

stop_all() {
  [ -d "$dir/pids" ] || return 0
  # Reverse start order: controller-manager, apiserver, etcd; watcher last.
  local name
  node_down
  for name in cozy-proxy-2 cozy-proxy cilium-operator metallb-speaker metallb-controller kube-controller-manager kube-apiserver etcd watcher; do
    stop_one "$name"
  done
}

# up: start the control plane in $dir (and its node with --node), or say it runs already.
# The steps below share up's locals (bash's dynamic scope): the ports, kube-apiserver's
# mode flags, and the namespace prefix its processes run under.
up() {
  local want_node="$node" want_nodes="${NODES:-1}"
  if readyz; then
    already_up "$want_node" "$want_nodes"
    return 0
  fi
  stop_all
  NODES="$want_nodes"
  prepare_dir
  local etcd_port peer_port kas_port kcm_port
  { read -r etcd_port; read -r peer_port; read -r kas_port; read -r kcm_port; } < <(free_ports 4)
  local -a kas_mode ns=()
  apiserver_mode
  write_env
  write_kubeconfig "$kas_port"
  write_audit_policy
  start_etcd
  start_kube_apiserver
  local deadline=$(( $(date +%s) + 120 ))
  wait_for_apiserver
  start_controller_manager
  wait_for_control_plane
  if [ -n "$node" ]; then node_start || { stop_all; node_netns_down; die "the node did not start"; }; fi
  announce
}

# already_up WANT_NODE WANT_NODES: the cluster in $dir answers; it must be the one asked for.
already_up() {
  if [ -n "$1" ] && [ -z "${NODE:-}" ]; then die "$dir runs a cluster without a node; cluster.sh down $dir first"; fi
  if [ -n "$1" ] && [ "$2" != "$(node_count)" ]; then die "$dir runs a cluster with $(node_count) node(s), not $2; cluster.sh down $dir first"; fi
  log "already up; kubeconfig: $dir/admin.kubeconfig"
  echo "$dir/admin.kubeconfig"
}

# prepare_dir: the binaries the control plane runs, a clean $dir, the node's preflight, PKI.
prepare_dir() {
  # What the control plane runs (the node's binaries are built by node_preflight; MetalLB's
  # by `cluster.sh metallb`; helm, Prometheus by whoever uses them).
  "$here/build-binaries.sh" etcd kube
  rm -rf "$dir/etcd" "$dir/pki" "$dir/logs" "$dir/pids" "$dir/cmds" "$dir/env" "$dir/node"
  mkdir -p "$dir/logs" "$dir/pids" "$dir/kas" "$dir/kcm"
  if [ -n "$node" ]; then node_preflight; fi
  log "certificates"
  make_pki
}

# apiserver_mode: kube-apiserver's flags of the two modes (up's kas_mode, ns, kas_port).
apiserver_mode() {
  # kube-apiserver flags of the two modes. With a node: on every address of the namespace
  # at :443 (pods dial the `kubernetes` Service's ClusterIP:443, which is on its loopback),
  # the Node authorizer and NodeRestriction for the kubelet, ServiceAccount admission for
  # real pods, real credentials towards the kubelet, and aggregated APIs reached at their
  # Service's endpoints (there is no kube-proxy).
  if [ -n "$node" ]; then
    each_node node_netns_up
    if [ "$(node_count)" -gt 1 ]; then node_routes; fi
    ns=(nsenter --net="/run/netns/$NODE_NETNS" --)
    kas_port=443
    # shellcheck disable=SC2054 # commas inside one flag's value (Node,RBAC)
    kas_mode=(--bind-address=0.0.0.0 --advertise-address="$NODE_IP"
      --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction
      --kubelet-client-certificate="$dir/pki/apiserver-kubelet-client.crt"
      --kubelet-client-key="$dir/pki/apiserver-kubelet-client.key"
      --kubelet-certificate-authority="$dir/pki/ca.crt"
      --kubelet-preferred-address-types=InternalIP
      --enable-aggregator-routing=true)
  else
    kas_mode=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1
      --authorization-mode=RBAC --disable-admission-plugins=ServiceAccount)
  fi
}

# write_env: $dir/env, what clients of the cluster (tests, make targets) read.
write_env() {
  cat > "$dir/env" <<ENV
KUBECONFIG=$dir/admin.kubeconfig
KUBE_APISERVER_PORT=$kas_port
KUBE_APISERVER_URL=https://127.0.0.1:$kas_port
ETCD_PORT=$etcd_port
KUBE_CONTROLLER_MANAGER_PORT=$kcm_port
CLUSTER_DIR=$dir
KUBE_BIN=$KUBE_BIN
HELM=$HELM_BIN/helm
HELM_PLUGINS_DIR=$HELM_PLUGINS_DIR
GRAFANA_SCHEMA=$(grafana_schema_dir)
PROMETHEUS_BIN=$PROMETHEUS_BIN
METALLB_BIN=$METALLB_BIN
CILIUM_BIN=$CILIUM_BIN
NODE=$node
NODES=${node:+$(node_count)}
NODE_NETNS=${node:+$NODE_NETNS}
NODE_IP=${node:+$NODE_IP}
CLIENT_NETNS=${node:+$CLIENT_NETNS}
WIRE_NODE_IF=${node:+$WIRE_NODE_IF}
WIRE_NODE_IP=${node:+$WIRE_NODE_IP}
WIRE_NODE_IP6=${node:+$WIRE_NODE_IP6}
WIRE_CLIENT_IP=${node:+$WIRE_CLIENT_IP}
WIRE_CLIENT_IP6=${node:+$WIRE_CLIENT_IP6}
METALLB_SPEAKER_BIN=$METALLB_SPEAKER_BIN
ENV
}

# write_audit_policy: audit every write to this project's resources (metadata only).
write_audit_policy() {
  # Audit every write to this project's resources (metadata only): tests count the
  # requests a controller makes from it, per (impersonated) user.
  cat > "$dir/audit-policy.yaml" <<POLICY
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: local.sdn.cozystack.io
# Who deleted a Service (the benches and tests ask when one vanishes).
- level: Metadata
  verbs: [delete, deletecollection]
  resources:
  - group: ""
    resources: [services]
- level: None
POLICY
}

start_etcd() {
  log "etcd $ETCD_VERSION on 127.0.0.1:$etcd_port"
  start etcd "${ns[@]}" "$ETCD_BIN/etcd" --name=local --data-dir="$dir/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="local=http://127.0.0.1:$peer_port" --listen-metrics-urls="" \
    --unsafe-no-fsync --log-level=warn --quota-backend-bytes="${AC_ETCD_QUOTA_BYTES:-2147483648}"
}

start_kube_apiserver() {
  log "kube-apiserver $KUBE_VERSION on 127.0.0.1:$kas_port"
  start kube-apiserver "${ns[@]}" "$KUBE_BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$etcd_port" \
    --secure-port="$kas_port" "${kas_mode[@]}" --endpoint-reconciler-type=none \
    --cert-dir="$dir/kas" \
    --tls-cert-file="$dir/pki/apiserver.crt" --tls-private-key-file="$dir/pki/apiserver.key" \
    --client-ca-file="$dir/pki/ca.crt" \
    --service-cluster-ip-range="${SERVICE_CIDR:-10.0.0.0/24}",fd00:10:96::/112 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$dir/pki/sa.pub" --service-account-signing-key-file="$dir/pki/sa.key" \
    --allow-privileged=true --profiling=false \
    --audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/logs/audit.log" \
    --audit-log-maxsize=500 --audit-log-maxbackup=1 --audit-log-mode=blocking \
    --requestheader-client-ca-file="$dir/pki/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-uid-headers=X-Remote-Uid \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$dir/pki/front-proxy-client.crt" \
    --proxy-client-key-file="$dir/pki/front-proxy-client.key"
}

# wait_for_apiserver: until /readyz answers (up's deadline); a component that exits ends it.
wait_for_apiserver() {
  until readyz; do
    for name in etcd kube-apiserver; do
      kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null || { tail -20 "$dir/logs/$name.log" >&2; stop_all; die "$name exited; log: $dir/logs/$name.log"; }
    done
    [ "$(date +%s)" -lt "$deadline" ] || { stop_all; die "kube-apiserver not ready after 120s; log: $dir/logs/kube-apiserver.log"; }
    sleep 0.5
  done
}

start_controller_manager() {
  # With a node, also what pods need: Deployments and ReplicaSets, the node's lifecycle
  # (its not-ready taint), EndpointSlices (the aggregator routes by them) and their mirrors of
  # a selector-less Service's Endpoints (as every cluster runs it), PodDisruptionBudgets,
  # ServiceAccounts and the kube-root-ca.crt ConfigMap every pod's token volume mounts.
  # The token controller fills kubernetes.io/service-account-token Secrets (the chart's
  # Prometheus scraper token), signed with the key kube-apiserver verifies.
  local controllers=garbage-collector-controller,namespace-controller,clusterrole-aggregation-controller,validatingadmissionpolicy-status-controller,serviceaccount-token-controller
  local -a kcm_mode=(--service-account-private-key-file="$dir/pki/sa.key")
  if [ -n "$node" ]; then
    controllers+=,deployment-controller,replicaset-controller,node-lifecycle-controller,taint-eviction-controller
    controllers+=,endpointslice-controller,endpointslice-mirroring-controller,endpoints-controller
    controllers+=,disruption-controller,serviceaccount-controller
    controllers+=,root-ca-certificate-publisher-controller,pod-garbage-collector-controller
    kcm_mode+=(--root-ca-file="$dir/pki/ca.crt")
  fi
  log "kube-controller-manager on 127.0.0.1:$kcm_port"
  start kube-controller-manager "${ns[@]}" "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig="$dir/admin.kubeconfig" "${kcm_mode[@]}" \
    --authentication-kubeconfig="$dir/admin.kubeconfig" --authorization-kubeconfig="$dir/admin.kubeconfig" \
    --controllers="$controllers" \
    --leader-elect=false --use-service-account-credentials=false \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" --cert-dir="$dir/kcm"
}

wait_for_control_plane() {
  # Ready means: /readyz answers, the default namespace exists (as upstream's test server
  # waits for), and the controller-manager is healthy.
  until KUBECONFIG="$dir/admin.kubeconfig" netns kubectl get namespace default >/dev/null 2>&1 \
        && netns curl -ksf --max-time 3 "https://127.0.0.1:$kcm_port/healthz" >/dev/null 2>&1; do
    kill -0 "$(cat "$dir/pids/kube-controller-manager")" 2>/dev/null || { tail -20 "$dir/logs/kube-controller-manager.log" >&2; stop_all; die "kube-controller-manager exited"; }
    [ "$(date +%s)" -lt "$deadline" ] || { stop_all; die "control plane not ready after 120s; logs: $dir/logs/"; }
    sleep 0.5
  done
}

# announce: the owner's watcher (--watch-pid), and where the cluster is.
announce() {
  if [ -n "$watch_pid" ]; then
    # Stop the cluster when its owner goes away, so an aborted test run leaves nothing.
    start watcher bash -c "while kill -0 $watch_pid 2>/dev/null; do sleep 1; done; exec '$here/cluster.sh' down '$dir'"
  fi
  log "ready: kube-apiserver $KUBE_VERSION at https://127.0.0.1:$kas_port"
  if [ -n "$node" ]; then
    log "it listens inside the network namespace $NODE_NETNS: run clients there, e.g."
    log "  deploy/local/cluster.sh exec $dir kubectl get pods -A"
  else
    log "kubeconfig: $dir/admin.kubeconfig   (export KUBECONFIG=$dir/admin.kubeconfig)"
  fi
  echo "$dir/admin.kubeconfig"
}

# The MetalLB controller, out of cluster (no kubelet here: its Pod object only exists to be
# read; its two ports bind every interface, as MetalLB's flags allow no other).
metallb() {
  load_env || die "no cluster in $dir; run: cluster.sh up $dir"
  [ -f "$METALLB_BIN/.complete" ] || "$here/build-binaries.sh" metallb
  export KUBECONFIG="$dir/admin.kubeconfig"
  if [ -f "$dir/pids/metallb-controller" ] && kill -0 "$(cat "$dir/pids/metallb-controller")" 2>/dev/null; then
    log "metallb-controller already running"
  else
    metallb_controller
  fi
  if [ -n "$node" ]; then metallb_speaker; fi
}

# The cilium-operator, out of cluster, with LB-IPAM on (its default) and nothing a node
# would need: identities in CRDs (no kvstore), the pods' IPAM left to Kubernetes (the
# operator's default cluster-pool mode exits without a pod CIDR), IPv6 off as the control plane is IPv4, its
# API (health) and metrics on loopback ports of their own. It creates Cilium's CRDs when it
# becomes leader; ready once the pool CRD is Established.
cilium() {
  load_env || die "no cluster in $dir; run: cluster.sh up $dir"
  [ -f "$CILIUM_BIN/.complete" ] || "$here/build-binaries.sh" cilium
  export KUBECONFIG="$dir/admin.kubeconfig"
  if [ -f "$dir/pids/cilium-operator" ] && kill -0 "$(cat "$dir/pids/cilium-operator")" 2>/dev/null; then
    log "cilium-operator already running"; return
  fi
  local -a ns=()
  if [ -n "$node" ]; then ns=(nsenter --net="/run/netns/$NODE_NETNS" --); fi
  local api metrics
  { read -r api; read -r metrics; } < <(free_ports 2)
  start cilium-operator "${ns[@]}" "$CILIUM_BIN/cilium-operator" \
    --k8s-kubeconfig-path="$dir/admin.kubeconfig" --cluster-name=local \
    --identity-allocation-mode=crd --ipam=kubernetes --enable-ipv6=false --enable-gops=false \
    --operator-api-serve-addr="127.0.0.1:$api" --operator-prometheus-serve-addr="127.0.0.1:$metrics"
  echo "http://127.0.0.1:$api/healthz" > "$dir/pids/cilium-operator.health"
  wait_health cilium-operator 60
  local crd=crd/ciliumloadbalancerippools.cilium.io
  { netns kubectl wait --for=create --timeout=60s "$crd" &&
    netns kubectl wait --for=condition=Established --timeout=30s "$crd"; } >/dev/null \
    || die "cilium-operator: no Established CiliumLoadBalancerIPPool CRD (see $dir/logs/cilium-operator.log)"
  log "cilium-operator $CILIUM_VERSION ready (LB-IPAM)"
}

# metallb_pod_object COMPONENT [NAME]: the Pod object a MetalLB process reads at start (it
# owns that process's status objects), named NAME (default COMPONENT). Never scheduled (a
# node selector nothing matches): with --node, a kubelet would pull its image.
metallb_pod_object() {
  netns kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: ${2:-$1}, namespace: metallb-system, labels: {app: metallb, component: $1}}
spec: {nodeSelector: {address-controller.local/metallb-runs-out-of-cluster: "true"},
       containers: [{name: $1, image: "quay.io/metallb/$1:$METALLB_VERSION"}]}
YAML
}

metallb_controller() {
  local -a ns=()
  if [ -n "$node" ]; then ns=(nsenter --net="/run/netns/$NODE_NETNS" --); fi
  netns kubectl apply --server-side -f "$METALLB_BIN/crds/" >/dev/null
  netns kubectl wait --for=condition=Established --timeout=60s -f "$METALLB_BIN/crds/" >/dev/null
  netns kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Namespace
metadata: {name: metallb-system}
YAML
  metallb_pod_object controller
  local health metrics_port
  { read -r health; read -r metrics_port; } < <(free_ports 2)
  start metallb-controller "${ns[@]}" "$METALLB_BIN/metallb-controller" --kubeconfig="$dir/admin.kubeconfig" \
    --namespace=metallb-system --pod-name=controller --webhook-mode=disabled \
    --port="$metrics_port" --health-probe-port="$health" --log-level=warn
  echo "http://127.0.0.1:$health/readyz" > "$dir/pids/metallb-controller.health"
  wait_health metallb-controller 30
  log "metallb-controller $METALLB_VERSION ready"
}

# MetalLB's speaker on each node, as MetalLB's DaemonSet runs it: in the node's network
# namespace (its host network), as the node (--node-name), L2 mode (no BGP peers are ever
# configured). It reads its own Pod at start (the owner of its ServiceL2Status objects): the
# object exists, never scheduled, as the controller's.
# - One node: memberlist disabled, and MetalLB's own rule for a disabled memberlist ("the
#   speaker pods must run on all nodes") holds.
# - Two nodes: memberlist on, as MetalLB's manifests run it — bound to the pod's IP (a
#   hostNetwork pod's IP is its node's: the placeholder Pod's status carries it, which is
#   where the speakers find each other, listing Pods app=metallb,component=speaker), with a
#   secret key, so that a speaker that stops is noticed by the other within seconds.
# The interfaces MetalLB's manifests exclude from L2 announcements (its excludel2 ConfigMap,
# taken from the same module: cni*, veth*, lo, ...) are excluded here too: a private mount
# namespace shows that file at the path the speaker reads.
metallb_speaker() {
  [ -f "$METALLB_SPEAKER_BIN/.complete" ] || "$here/build-binaries.sh" wire
  mkdir -p "$dir/metallb/memberlist-key"
  cp "$METALLB_SPEAKER_BIN/excludel2.yaml" "$dir/metallb/excludel2.yaml"
  if [ ! -s "$dir/metallb/memberlist-key/secretkey" ]; then
    head -c 32 /dev/urandom | base64 > "$dir/metallb/memberlist-key/secretkey"
  fi
  each_node metallb_speaker_one
}

metallb_speaker_one() {
  local name="metallb-speaker$N_SFX" pod="speaker$N_SFX"
  if [ -f "$dir/pids/$name" ] && kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null; then
    log "$name already running"; return
  fi
  metallb_pod_object speaker "$pod"
  local -a ml=()
  if [ "$(node_count)" -gt 1 ]; then
    netns kubectl patch pod -n metallb-system "$pod" --subresource=status --type=merge \
      -p "{\"status\":{\"hostIP\":\"$N_IP\",\"podIP\":\"$N_IP\",\"podIPs\":[{\"ip\":\"$N_IP\"}]}}" >/dev/null
    # shellcheck disable=SC2054 # commas inside one flag's value (a label selector)
    ml=(--ml-bindaddr="$N_IP" --ml-labels=app=metallb,component=speaker
        --ml-secret-key-path="$dir/metallb/memberlist-key")
  fi
  local health metrics_port kubeconfig="$dir/admin.kubeconfig"
  if [ "$N_INDEX" != 1 ]; then kubeconfig="$N_DIR/admin.kubeconfig"; fi
  { read -r health; read -r metrics_port; } < <(free_ports 2)
  # shellcheck disable=SC2016 # the inner script's "$1" is its own argument, not expanded here
  start "$name" nsenter --net="/run/netns/$N_NETNS" -- unshare --mount --propagation slave -- \
    bash -c 'mkdir -p /etc/metallb && mount --bind "$1" /etc/metallb && shift && exec "$@"' _ "$dir/metallb" \
    "$METALLB_SPEAKER_BIN/metallb-speaker" --kubeconfig="$kubeconfig" \
    --namespace=metallb-system --pod-name="$pod" --node-name="$N_NAME" "${ml[@]}" \
    --port="$metrics_port" --health-probe-port="$health" --log-level=info
  health_url "$name" "http://127.0.0.1:$health/readyz"
  wait_health "$name" 30
  log "$name $METALLB_VERSION ready on node $N_NAME (L2; announces on $WIRE_NODE_IF${ml:+; memberlist at $N_IP})"
}

# cozy-proxy on every node, as its DaemonSet runs it: in the node's network namespace (its
# host network, where it writes the nftables table `ip cozy_proxy`), watching every Service
# and keeping those labelled service.kubernetes.io/service-proxy-name=cozy-proxy — its only
# selector. Health on loopback, metrics off. It watches Services and Endpoints cluster-wide
# and writes nothing to the API, like the speaker it runs on the cluster's admin credentials.
# On the second node it is cozy-proxy-2.
cozy_proxy() {
  load_env || die "no cluster in $dir; run: cluster.sh up $dir"
  [ -n "$node" ] || die "$dir has no node (cluster.sh up DIR --node)"
  [ -f "$COZY_PROXY_SRC/go.mod" ] || { log "no cozy-proxy source at $COZY_PROXY_SRC"; exit 3; }
  local bin
  bin="$(cozy_proxy_bin)"
  [ -f "$bin/.complete" ] || "$here/build-binaries.sh" cozy
  each_node cozy_proxy_one "$bin"
}

cozy_proxy_one() {
  local bin="$1" name="cozy-proxy$N_SFX" health kubeconfig="$dir/admin.kubeconfig"
  if [ -f "$dir/pids/$name" ] && kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null; then
    log "$name already running"; return
  fi
  if [ "$N_INDEX" != 1 ]; then kubeconfig="$N_DIR/admin.kubeconfig"; fi
  health="$(free_ports 1)"
  start "$name" nsenter --net="/run/netns/$N_NETNS" -- "$bin/cozy-proxy" \
    --kubeconfig="$kubeconfig" --health-probe-bind-address="127.0.0.1:$health" \
    --metrics-bind-address=0 --zap-devel=false
  health_url "$name" "http://127.0.0.1:$health/healthz"
  wait_health "$name" 30
  log "$name ready on node $N_NAME (table ip cozy_proxy)"
}

case "$cmd" in
  up) up ;;
  cozy-proxy) cozy_proxy ;;
  import) load_env || die "no cluster in $dir"; [ -n "$node" ] || die "$dir has no node (cluster.sh up DIR --node)"
    node_import "$component" ;;
  exec) load_env || die "no cluster in $dir"; [ ${#rest[@]} -gt 0 ] || die "exec DIR CMD..."
    KUBECONFIG="$dir/admin.kubeconfig" netns "${rest[@]}" ;;
  metallb) metallb ;;
  cilium) cilium ;;
  client) load_env || die "no cluster in $dir"; [ -n "$node" ] || die "$dir has no node (cluster.sh up DIR --node)"
    [ ${#rest[@]} -gt 0 ] || die "client DIR CMD..."; in_client "${rest[@]}" ;;
  route) load_env || die "no cluster in $dir"; [ -n "$node" ] || die "$dir has no node (cluster.sh up DIR --node)"
    [ ${#rest[@]} -eq 2 ] || die "route DIR CIDR on-link|via-node|none"; wire_route "${rest[0]}" "${rest[1]}" ;;
  down)
    # Do not kill ourselves when the watcher runs `down`.
    if [ -f "$dir/pids/watcher" ] && [ "$(cat "$dir/pids/watcher")" = "$$" ]; then rm -f "$dir/pids/watcher"; fi
    load_env || true
    stop_all; node_netns_down; rm -rf "$dir"; log "stopped $dir" ;;
  status) if readyz; then log "up: $dir/admin.kubeconfig"; else log "down"; exit 1; fi ;;
  restart) restart "$component" ;;
  pause) signal_component STOP "$component"; log "paused $component" ;;
  resume) signal_component CONT "$component"; log "resumed $component" ;;
  *) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
