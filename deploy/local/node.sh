# shellcheck shell=bash
# shellcheck disable=SC2154 # dir and here are cluster.sh's, which sources this file
# The node of `cluster.sh up DIR --node`: sourced by cluster.sh, not run by itself.
#
# A real node beside the local control plane: containerd (Debian's, with a config of its
# own), kubelet and kube-scheduler (v$KUBE_VERSION, built from Go modules like the rest), a
# CNI bridge. The whole cluster — etcd, kube-apiserver, controller-manager, scheduler,
# kubelet, containerd, the pods — runs inside the network namespace $NODE_NETNS, whose
# loopback also carries the node's address ($NODE_IP) and the `kubernetes` Service's
# ClusterIP (10.0.0.1, where pods find kube-apiserver, listening on :443 there).
# kube-proxy (v$KUBE_VERSION, iptables mode) steers Services to pods inside that namespace.
#
# The wire: a second network namespace, $CLIENT_NETNS, is the client host — a tenant's
# customer on the provider's network. A veth pair joins it to the node on one L2 segment
# ($WIRE_NODE_IP on the node's $WIRE_NODE_IF, $WIRE_CLIENT_IP on the client's
# $WIRE_CLIENT_IF; $WIRE_NODE_IP6 / $WIRE_CLIENT_IP6 for IPv6). How the client reaches a
# class's addresses is the class's matter: on the segment (an on-link route, answered by
# MetalLB's speaker over ARP/NDP) or routed via the node (`cluster.sh route DIR CIDR
# via-node`, as an upstream router would for the range driver). Nothing outside these two
# namespaces is dialled.
#
# A second node (`--nodes 2`): the same recipe in a network namespace of its own,
# $NODE_NETNS-2 (node $NODE_NAME-2 at 10.255.0.2, pods 10.244.1.0/24), its own containerd,
# kubelet, kube-proxy, mount namespace and cgroup; the control plane stays on the first.
# The client's end of the wire is then a bridge ($WIRE_CLIENT_IF, the segment's switch)
# with one veth per node, and the nodes route to each other's address and pods over it.
# Functions that act on one node act on the node chosen by `node_use I` (the N_* names).
#
# Root only. One cluster with nodes per machine at a time (flock on $NODE_LOCK). containerd and the
# kubelet share a private mount namespace (held by the process node-holder) in which
#   - the host paths they use whatever their flags say (/var/lib/kubelet, /var/log/pods,
#     /var/log/containers, /var/lib/cni, /run/containerd, /run/netns) are DIR/node/host/...
#     bind mounts: the host's own directories are never written (missing mount points are
#     created and removed again by `down`);
#   - the host-wide sysctls the kubelet would set (vm.overcommit_memory, kernel.panic,
#     kernel.panic_on_oops, ...) are read-only files holding the values it checks for
#     (protectKernelDefaults), so the machine's own settings are never changed.
# Pods run under the cgroup $NODE_CGROUP of every hierarchy, created here and removed by
# `down` (after killing whatever still runs in it).
# Machine-specific settings (see ../shared/research/kubelet-node.md): cgroup v1 host
# (failCgroupV1: false, cgroupfs), no CAP_SYS_RESOURCE (restrict_oom_score_adj), the
# kubelet's refusal of a loopback node IP (NODE_IP is a /32 on the namespace's lo).

NODE_NETNS=address-controller-node
NODE_NAME=address-controller-node
NODE_IP=10.255.0.1
NODE_IP6=fd00:255::1
NODE_POD_CIDR=10.244.0.0/24
NODE_POD_CIDR6=fd00:10:244::/64
NODE_CGROUP=address-controller-node
NODE_LOCK=/run/address-controller-node.lock
NODE_PAUSE_IMAGE=localhost/address-controller/pause:1
# The wire's workload: answers HTTP with its pod's name (node/hello.c).
NODE_HELLO_IMAGE=localhost/address-controller/hello:1
# conntrack: kube-proxy clears stale UDP flows with it.
NODE_PACKAGES=(containerd runc containernetworking-plugins conntrack)
CLIENT_NETNS=address-controller-client
WIRE_NODE_IF=acw-node
WIRE_CLIENT_IF=acw-client
WIRE_NODE_IP=10.255.1.1
WIRE_CLIENT_IP=10.255.1.2
WIRE_NODE_IP6=fd00:255:1::1
WIRE_CLIENT_IP6=fd00:255:1::2
# The second node's addresses; both nodes' pod ranges are inside the cluster's.
NODE2_IP=10.255.0.2
NODE2_IP6=fd00:255::2
NODE2_POD_CIDR=10.244.1.0/24
NODE2_POD_CIDR6=fd00:10:244:1::/64
WIRE_NODE2_IP=10.255.1.3
WIRE_NODE2_IP6=fd00:255:1::3
CLUSTER_POD_CIDR=10.244.0.0/16
CLUSTER_POD_CIDR6=fd00:10:244::/48
NODE_CNI_BIN=/usr/lib/cni
# Host paths containerd, the kubelet and CNI use regardless of their flags.
NODE_HOST_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/containerd /run/netns)
# What the kubelet checks with protectKernelDefaults.
NODE_SYSCTLS=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)

# node_use I: node I (1 or 2) is the one the node functions act on — its name, network
# namespace, addresses, pod ranges, cgroup, directory (N_DIR), the suffix of its components'
# names in DIR/pids (N_SFX: kubelet, kubelet-2, ...) and its end of the wire.
node_use() {
  N_INDEX="$1"
  case "$1" in
    1) N_NAME=$NODE_NAME N_NETNS=$NODE_NETNS N_IP=$NODE_IP N_IP6=$NODE_IP6
       N_POD_CIDR=$NODE_POD_CIDR N_POD_CIDR6=$NODE_POD_CIDR6 N_CGROUP=$NODE_CGROUP
       N_DIR="$dir/node" N_SFX="" N_WIRE_IP=$WIRE_NODE_IP N_WIRE_IP6=$WIRE_NODE_IP6 ;;
    2) N_NAME=$NODE_NAME-2 N_NETNS=$NODE_NETNS-2 N_IP=$NODE2_IP N_IP6=$NODE2_IP6
       N_POD_CIDR=$NODE2_POD_CIDR N_POD_CIDR6=$NODE2_POD_CIDR6 N_CGROUP=$NODE_CGROUP-2
       N_DIR="$dir/node-2" N_SFX=-2 N_WIRE_IP=$WIRE_NODE2_IP N_WIRE_IP6=$WIRE_NODE2_IP6 ;;
    *) die "node_use 1|2, not '$1'" ;;
  esac
}
# node_count: how many nodes the cluster in DIR has (NODES in DIR/env; 1 before it exists).
node_count() { echo "${NODES:-1}"; }
# The most nodes a cluster here has: what a cleanup of a cluster it cannot count covers.
NODES_MAX=2

# each_node CMD...: CMD once per node of the cluster, first to last, that node chosen
# (node_use); node 1 chosen again after. Stops at the first CMD that fails, failing. CMD runs
# as a plain statement, never left of `||`: that would turn `set -e` off inside it.
each_node() {
  local i rc
  for i in $(seq 1 "$(node_count)"); do
    node_use "$i"
    "$@"
    rc=$?
    if [ "$rc" -ne 0 ]; then node_use 1; return "$rc"; fi
  done
  node_use 1
}

# each_node_last_first CMD...: CMD for every node a cluster here may have, last first (a
# second node goes before the first, which holds the control plane); node 1 chosen after.
each_node_last_first() {
  local i
  for i in $(seq "$NODES_MAX" -1 1); do
    node_use "$i"
    "$@"
  done
  node_use 1
}

# netns_remove NAME: kills what runs in the network namespace NAME and deletes it; no
# namespace of that name is no error.
netns_remove() {
  [ -e "/run/netns/$1" ] || return 0
  ip netns pids "$1" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
  ip netns delete "$1"
}

# in_netns CMD...: CMD in the cluster's network namespace.
in_netns() { nsenter --net="/run/netns/$NODE_NETNS" -- "$@"; }
# in_client CMD...: CMD on the client host (the wire's other end).
in_client() { nsenter --net="/run/netns/$CLIENT_NETNS" -- "$@"; }
# in_this_node CMD...: CMD in the network namespace of the chosen node (node_use).
in_this_node() { nsenter --net="/run/netns/$N_NETNS" -- "$@"; }

node_cgroup_dirs() { # every hierarchy's directory of the chosen node's cgroup
  local h
  for h in /sys/fs/cgroup/*/; do
    if [ -e "$h/cgroup.procs" ]; then echo "${h%/}/$N_CGROUP"; fi
  done
}

# Kills what still runs under the chosen node's cgroup and removes its directories,
# deepest first.
node_cgroups_remove() {
  local d pid
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local left=0
    for d in $(node_cgroup_dirs); do
      [ -d "$d" ] || continue
      while read -r pid; do
        if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; left=1; fi
      done < <(find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null)
    done
    if [ "$left" = 0 ]; then break; fi
    sleep 0.2
  done
  for d in $(node_cgroup_dirs); do
    if [ -d "$d" ]; then find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
    if [ -d "$d" ]; then log "warning: could not remove cgroup $d"; fi
  done
  return 0
}

node_cgroups_create() {
  local d parent
  for d in $(node_cgroup_dirs); do
    mkdir -p "$d"
    # A new cpuset starts empty: give it its parent's CPUs and memory nodes.
    if [ -e "$d/cpuset.cpus" ]; then
      parent="$(dirname "$d")"
      cat "$parent/cpuset.cpus" > "$d/cpuset.cpus"
      cat "$parent/cpuset.mems" > "$d/cpuset.mems"
    fi
  done
}

node_preflight() {
  [ "$(id -u)" = 0 ] || die "--node needs root (network and mount namespaces, cgroups, containerd)"
  local missing=() p
  for p in "${NODE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing the Debian packages ${missing[*]} (apt-get)"
    # Installing must not start anything: there is no init system here, but be sure.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
      die "apt-get install ${missing[*]} failed"
  fi
  command -v gcc >/dev/null || die "gcc is needed to build the pod-sandbox (pause) binary"
  if [ ! -f "$NODE_BIN/.complete" ] || [ ! -f "$KUBE_PROXY_BIN/.complete" ]; then "$here/build-binaries.sh" node wire; fi
  # One node per machine: the lock is held by every process of the node (fd 9 is
  # inherited), so it frees itself when the last one is gone. A node whose test process
  # has just exited is still being stopped by its watcher: wait for it a minute.
  exec 9>>"$NODE_LOCK"
  if ! flock -w 60 9; then
    die "another local node is running ($(cat "$NODE_LOCK" 2>/dev/null)); stop it first: deploy/local/cluster.sh down DIR"
  fi
  echo "$dir" > "$NODE_LOCK"
  # Leftovers of nodes that were killed without `down`: their namespaces and cgroups.
  each_node_last_first node_stale_remove
  netns_remove "$CLIENT_NETNS" || die "cannot delete the stale network namespace $CLIENT_NETNS"
}

# The chosen node's namespace and cgroups, left by a node killed without `down`.
node_stale_remove() {
  [ -e "/run/netns/$N_NETNS" ] || return 0
  log "removing a stale network namespace $N_NETNS (a previous node not stopped)"
  node_cgroups_remove
  netns_remove "$N_NETNS" || die "cannot delete the stale network namespace $N_NETNS"
}

# node_netns_up: the chosen node's network namespace: its addresses on loopback (the
# first also carries the `kubernetes` Service's ClusterIP), forwarding, its end of the wire.
node_netns_up() {
  if [ ! -d /run/netns ]; then touch "$dir/created-run-netns"; fi
  ip netns add "$N_NETNS"
  in_this_node ip link set lo up
  in_this_node ip addr add "$N_IP/32" dev lo
  in_this_node ip addr add "$N_IP6/128" dev lo nodad
  if [ "$N_INDEX" = 1 ]; then in_this_node ip addr add 10.0.0.1/32 dev lo; fi
  # The node forwards what arrives on the wire to its pods (kube-proxy's DNAT), per namespace.
  in_this_node sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
  if [ "$N_INDEX" = 1 ]; then wire_up; fi
  wire_join
}

# The client host and the segment's switch: a bridge on the client's side (named
# $WIRE_CLIENT_IF, holding the client's addresses) that every node's veth joins. Multicast
# snooping off: a switch without an MLD querier must not learn NDP's groups away.
wire_up() {
  ip netns add "$CLIENT_NETNS"
  in_client ip link set lo up
  in_client ip link add "$WIRE_CLIENT_IF" type bridge mcast_snooping 0
  in_client ip addr add "$WIRE_CLIENT_IP/24" dev "$WIRE_CLIENT_IF"
  in_client ip addr add "$WIRE_CLIENT_IP6/64" dev "$WIRE_CLIENT_IF" nodad
  in_client ip link set "$WIRE_CLIENT_IF" up
}

# wire_join: the chosen node's veth pair, its end ($WIRE_NODE_IF) in the node's namespace,
# the other a port of the client's bridge.
wire_join() {
  local port="acw-port$N_INDEX"
  ip link add "$port" netns "$CLIENT_NETNS" type veth peer name "$WIRE_NODE_IF" netns "$N_NETNS"
  in_this_node ip addr add "$N_WIRE_IP/24" dev "$WIRE_NODE_IF"
  in_this_node ip addr add "$N_WIRE_IP6/64" dev "$WIRE_NODE_IF" nodad
  in_this_node ip link set "$WIRE_NODE_IF" up
  in_client ip link set "$port" master "$WIRE_CLIENT_IF"
  in_client ip link set "$port" up
}

# node_routes: each node reaches the other's address and pods over the wire, the second
# also the Services' ClusterIP ranges (a route for the first lookup of a host-network
# connection; kube-proxy's DNAT sends it on to the endpoint).
node_routes() {
  node_use 1
  in_this_node ip route replace "$NODE2_IP/32" via "$WIRE_NODE2_IP" dev "$WIRE_NODE_IF"
  in_this_node ip route replace "$NODE2_POD_CIDR" via "$WIRE_NODE2_IP" dev "$WIRE_NODE_IF"
  in_this_node ip -6 route replace "$NODE2_IP6/128" via "$WIRE_NODE2_IP6" dev "$WIRE_NODE_IF"
  in_this_node ip -6 route replace "$NODE2_POD_CIDR6" via "$WIRE_NODE2_IP6" dev "$WIRE_NODE_IF"
  node_use 2
  in_this_node ip route replace "$NODE_IP/32" via "$WIRE_NODE_IP" dev "$WIRE_NODE_IF"
  in_this_node ip route replace "$NODE_POD_CIDR" via "$WIRE_NODE_IP" dev "$WIRE_NODE_IF"
  in_this_node ip route replace "${SERVICE_CIDR:-10.0.0.0/24}" via "$WIRE_NODE_IP" dev "$WIRE_NODE_IF"
  in_this_node ip -6 route replace "$NODE_IP6/128" via "$WIRE_NODE_IP6" dev "$WIRE_NODE_IF"
  in_this_node ip -6 route replace "$NODE_POD_CIDR6" via "$WIRE_NODE_IP6" dev "$WIRE_NODE_IF"
  in_this_node ip -6 route replace fd00:10:96::/112 via "$WIRE_NODE_IP6" dev "$WIRE_NODE_IF"
  node_use 1
}

# wire_route CIDR on-link|via-node: how the client host reaches CIDR — on the segment
# (it asks for each address by ARP/NDP: MetalLB's L2 mode) or through the node as its
# router (the range driver's addresses, routed to the nodes upstream). Replaces a route
# for the same CIDR.
wire_route() {
  local cidr="$1" how="$2" via
  case "$cidr" in *:*) via="$WIRE_NODE_IP6" ;; *) via="$WIRE_NODE_IP" ;; esac
  case "$how" in
    on-link) in_client ip route replace "$cidr" dev "$WIRE_CLIENT_IF" ;;
    via-node) in_client ip route replace "$cidr" via "$via" dev "$WIRE_CLIENT_IF" ;;
    none) in_client ip route del "$cidr" 2>/dev/null || true ;;
    *) die "route DIR CIDR on-link|via-node|none, not '$how'" ;;
  esac
}

# Certificates of the node, from the cluster CA: the kubelet's client identity
# (system:node:NAME in system:nodes, for the Node authorizer), its serving certificate
# (kube-apiserver verifies it), and kube-apiserver's client certificate for the kubelet.
node_pki() {
  local client_ext='basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth'
  each_node node_kubelet_certs "$client_ext"
  cert apiserver-kubelet-client ca "/CN=kube-apiserver-kubelet-client" "$client_ext"
  # kube-proxy's identity: the user the built-in binding system:node-proxier names.
  cert kube-proxy ca "/CN=system:kube-proxy" "$client_ext"
}

# node_kubelet_certs CLIENT_EXT: the chosen node's kubelet certificates — its client identity
# (system:node:NAME in system:nodes, for the Node authorizer) and its serving certificate.
node_kubelet_certs() {
  cert "kubelet-client$N_SFX" ca "/O=system:nodes/CN=system:node:$N_NAME" "$1"
  cert "kubelet$N_SFX" ca "/CN=$N_NAME" "basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:$N_IP,IP:$N_IP6,DNS:$N_NAME"
}

node_images() {
  local nd="$dir/node"
  mkdir -p "$nd"
  gcc -static -Os -s -o "$nd/pause" "$here/node/pause.c"
  python3 "$here/node/oci-archive.py" "$nd/pause" /pause "$NODE_PAUSE_IMAGE" "$nd/pause.oci.tar"
  gcc -static -Os -s -o "$nd/hello" "$here/node/hello.c"
  python3 "$here/node/oci-archive.py" "$nd/hello" /hello "$NODE_HELLO_IMAGE" "$nd/hello.oci.tar"
}

# The chosen node's configuration files, in N_DIR.
node_write_configs() {
  local nd="$N_DIR"
  mkdir -p "$nd/containerd" "$nd/cni/net.d" "$nd/cni/ipam" "$nd/kubelet" "$nd/volume-plugins" "$nd/sysctl"
  cat > "$nd/containerd.toml" <<TOML
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$nd/containerd/containerd.sock"
[ttrpc]
  address = "$nd/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$NODE_PAUSE_IMAGE"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  # root here lacks CAP_SYS_RESOURCE: never lower a process's oom_score_adj.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$NODE_CNI_BIN"
    conf_dir = "$nd/cni/net.d"
TOML
  cat > "$nd/cni/net.d/10-bridge.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "address-controller-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$nd/cni/ipam",
              "ranges": [[{"subnet": "$N_POD_CIDR"}], [{"subnet": "$N_POD_CIDR6"}]],
              "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]}},
    {"type": "loopback"}
  ]
}
JSON
  # Pods resolve nothing: there is no cluster DNS and nothing outside the namespace.
  printf 'options ndots:1\n' > "$nd/resolv.conf"
  cat > "$nd/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine kind: cgroup v1 hierarchies, no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$N_CGROUP
containerRuntimeEndpoint: unix://$nd/containerd/containerd.sock
address: $N_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $dir/pki/kubelet$N_SFX.crt
tlsPrivateKeyFile: $dir/pki/kubelet$N_SFX.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization:
  mode: Webhook
# Check the host-wide sysctls, never write them (they are bind-mounted files here).
protectKernelDefaults: true
failSwapOn: false
podLogsDir: /var/log/pods
resolvConf: $nd/resolv.conf
# A developer's or CI's disk is not the node's to evict for: "0%" turns a signal off (the
# kubelet ignores it), so a nearly full disk never taints the node disk-pressure (NoSchedule)
# with the release's pods Pending (a CI run's node tier failed so, and the same symptom comes
# back here at a threshold above the free space). Memory keeps a floor.
evictionHard: {memory.available: "50Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%", imagefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
nodeStatusUpdateFrequency: 5s
# Secret volumes follow their Secret within ~10 s (the default, 1 m, makes a rotation test slow).
syncFrequency: 10s
serializeImagePulls: false
YAML
  node_kubeconfig "$nd/kubelet.kubeconfig" "kubelet-client$N_SFX"
  node_kubeconfig "$nd/kube-proxy.kubeconfig" kube-proxy
  # The admin's, for what runs on this node on the admin's credentials (MetalLB's speaker):
  # kube-apiserver's loopback is the first node's only.
  node_kubeconfig "$nd/admin.kubeconfig" admin
  # iptables mode: kube-proxy's default on Linux and what the platform runs; the iptables
  # binaries are on every Debian machine (nftables mode would need the nft tool and a
  # newer kernel feature set than some hosts give). The conntrack limits and timeouts are
  # left as they are (0): nf_conntrack_max is host-wide and never the test's to change.
  cat > "$nd/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $nd/kube-proxy.kubeconfig}
mode: iptables
hostnameOverride: $N_NAME
clusterCIDR: $CLUSTER_POD_CIDR,$CLUSTER_POD_CIDR6
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
YAML
  local kv
  for kv in "${NODE_SYSCTLS[@]}"; do
    printf '%s\n' "${kv#*=}" > "$nd/sysctl/$(echo "${kv%%=*}" | tr / .)"
  done
}

# node_kubeconfig FILE CERT: a kubeconfig for kube-apiserver at NODE_IP with the client
# certificate DIR/pki/CERT.
node_kubeconfig() {
  cat > "$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {server: "https://$NODE_IP:443", certificate-authority: $dir/pki/ca.crt}
users:
- name: $2
  user: {client-certificate: $dir/pki/$2.crt, client-key: $dir/pki/$2.key}
contexts:
- name: local
  context: {cluster: local, user: $2}
current-context: local
KCFG
}

# kube-proxy in the chosen node's network namespace (its host network), as a DaemonSet's
# hostNetwork pod runs it; ready when its healthz answers.
node_kube_proxy() {
  log "kube-proxy $KUBE_VERSION (iptables mode) on $N_NAME"
  start "kube-proxy$N_SFX" nsenter --net="/run/netns/$N_NETNS" -- "$KUBE_PROXY_BIN/kube-proxy" \
    --config="$N_DIR/kube-proxy.yaml" --v=1
  health_url "kube-proxy$N_SFX" "http://127.0.0.1:10256/healthz"
  wait_health "kube-proxy$N_SFX" 60
}

# health_url NAME URL: where the component's health answers — inside the chosen node's
# network namespace (the cluster's, for node 1).
health_url() {
  echo "$2" > "$dir/pids/$1.health"
  echo "$N_NETNS" > "$dir/pids/$1.netns"
}

# wait_health NAME SECONDS: until the component's health URL (DIR/pids/NAME.health, inside
# the cluster's namespace or the one DIR/pids/NAME.netns names) answers 2xx; fails when the
# process exits first.
wait_health() {
  local name="$1" url deadline=$(( $(date +%s) + $2 ))
  local -a in=(netns)
  url="$(cat "$dir/pids/$name.health")"
  if [ -f "$dir/pids/$name.netns" ]; then in=(nsenter --net="/run/netns/$(cat "$dir/pids/$name.netns")" --); fi
  until "${in[@]}" curl -fs --max-time 2 "$url" >/dev/null 2>&1; do
    kill -0 "$(cat "$dir/pids/$name")" 2>/dev/null || { tail -20 "$dir/logs/$name.log" >&2; die "$name exited; log: $dir/logs/$name.log"; }
    [ "$(date +%s)" -lt "$deadline" ] || die "$name not healthy after $2s; log: $dir/logs/$name.log"
    sleep 0.2
  done
}

# node_start: the nodes, the first with the scheduler and the grants of the control plane.
node_start() {
  node_images
  # kube-apiserver's calls to the kubelet (logs, exec, port-forward) as kubeadm grants them.
  KUBECONFIG="$dir/admin.kubeconfig" in_netns kubectl create clusterrolebinding kube-apiserver-kubelet-client \
    --clusterrole=system:kubelet-api-admin --user=kube-apiserver-kubelet-client >/dev/null
  log "kube-scheduler $KUBE_VERSION"
  start kube-scheduler nsenter --net="/run/netns/$NODE_NETNS" -- "$NODE_BIN/kube-scheduler" \
    --kubeconfig="$dir/admin.kubeconfig" \
    --authentication-kubeconfig="$dir/admin.kubeconfig" --authorization-kubeconfig="$dir/admin.kubeconfig" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10259
  if [ "$(node_count)" -gt 1 ]; then node_kubernetes_endpoint; fi
  each_node node_start_one
}

# The `kubernetes` Service's endpoint, kube-apiserver at the first node's address. Its own
# reconciler is off (--endpoint-reconciler-type=none: without a node it would publish a
# loopback address). The first node has the ClusterIP on its loopback; the second reaches
# it through its kube-proxy, which needs this EndpointSlice.
node_kubernetes_endpoint() {
  KUBECONFIG="$dir/admin.kubeconfig" in_netns kubectl apply -f - >/dev/null <<YAML
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes}
addressType: IPv4
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
ports: [{name: https, port: 443, protocol: TCP}]
YAML
}

# node_start_one: the chosen node — containerd, the kubelet until the node is Ready and
# untainted, kube-proxy.
node_start_one() {
  local nd="$N_DIR" p
  mkdir -p "$nd"
  node_write_configs
  # Mount points of the host paths: created if missing, recorded, removed by `down`.
  : > "$nd/created-host-paths"
  for p in "${NODE_HOST_PATHS[@]}"; do
    mkdir -p "$nd/host$p"
    if [ ! -d "$p" ]; then
      local top="$p"
      while [ ! -d "$(dirname "$top")" ]; do top="$(dirname "$top")"; done
      mkdir -p "$p"
      echo "$top" >> "$nd/created-host-paths"
    fi
  done
  node_cgroups_create
  # The holder: keeps the private mount namespace of containerd and the kubelet.
  local setup="set -e"
  for p in "${NODE_HOST_PATHS[@]}"; do setup+="; mount --bind '$nd/host$p' '$p'"; done
  local kv
  for kv in "${NODE_SYSCTLS[@]}"; do
    local f="/proc/sys/${kv%%=*}"
    if [ "$(cat "$f")" = "${kv#*=}" ]; then continue; fi
    setup+="; mount --bind -o ro '$nd/sysctl/$(echo "${kv%%=*}" | tr / .)' '$f'"
  done
  setup+="; touch '$nd/holder-ready'; exec sleep infinity"
  rm -f "$nd/holder-ready"
  start "node-holder$N_SFX" nsenter --net="/run/netns/$N_NETNS" -- unshare --mount --propagation slave -- bash -c "$setup"
  for _ in $(seq 1 50); do if [ -f "$nd/holder-ready" ]; then break; fi; sleep 0.1; done
  [ -f "$nd/holder-ready" ] || die "the mount namespace of $N_NAME did not come up; log: $dir/logs/node-holder$N_SFX.log"
  local holder
  holder="$(cat "$dir/pids/node-holder$N_SFX")"

  log "containerd $(containerd --version | awk '{print $3}') on $N_NAME (own config, state in $nd/containerd)"
  start "containerd$N_SFX" nsenter --target "$holder" --net --mount -- containerd --config "$nd/containerd.toml"
  local sock="$nd/containerd/containerd.sock"
  for _ in $(seq 1 100); do if ctr --address "$sock" version >/dev/null 2>&1; then break; fi; sleep 0.1; done
  ctr --address "$sock" version >/dev/null 2>&1 || die "containerd did not start; log: $dir/logs/containerd$N_SFX.log"
  ctr --address "$sock" -n k8s.io images import "$dir/node/pause.oci.tar" >/dev/null
  ctr --address "$sock" -n k8s.io images import "$dir/node/hello.oci.tar" >/dev/null

  log "kubelet $KUBE_VERSION: node $N_NAME at $N_IP"
  start "kubelet$N_SFX" nsenter --target "$holder" --net --mount -- "$NODE_BIN/kubelet" \
    --config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
    --root-dir=/var/lib/kubelet --cert-dir="$nd/kubelet-pki" \
    --hostname-override="$N_NAME" --node-ip="$N_IP,$N_IP6" \
    --volume-plugin-dir="$nd/volume-plugins" --v=1
  local deadline=$(( $(date +%s) + 120 ))
  until [ "$(KUBECONFIG="$dir/admin.kubeconfig" in_netns kubectl get node "$N_NAME" \
             -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; do
    for p in "containerd$N_SFX" "kubelet$N_SFX" kube-scheduler; do
      kill -0 "$(cat "$dir/pids/$p")" 2>/dev/null || { tail -20 "$dir/logs/$p.log" >&2; die "$p exited; log: $dir/logs/$p.log"; }
    done
    [ "$(date +%s)" -lt "$deadline" ] || die "node $N_NAME not Ready after 120s; logs: $dir/logs/kubelet$N_SFX.log"
    sleep 0.5
  done
  # Taints the node-lifecycle controller removes once it sees the node Ready.
  until [ -z "$(KUBECONFIG="$dir/admin.kubeconfig" in_netns kubectl get node "$N_NAME" -o jsonpath='{.spec.taints}' 2>/dev/null)" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "node $N_NAME keeps its taints; log: $dir/logs/kube-controller-manager.log"
    sleep 0.5
  done
  log "node $N_NAME Ready"
  node_kube_proxy
}

# node_import ARCHIVE: an OCI archive into every node's containerd (namespace k8s.io), under
# the name its index gives (io.containerd.image.name).
node_import() {
  [ -f "$1" ] || die "no image archive $1"
  each_node node_import_one "$1"
}

node_import_one() { ctr --address "$N_DIR/containerd/containerd.sock" -n k8s.io images import "$1"; }

# Stops the nodes and removes everything they made outside DIR.
node_down() {
  [ -d "$dir/node" ] || [ -f "$dir/pids/node-holder" ] || return 0
  each_node_last_first node_down_one
  stop_one kube-scheduler
}

node_down_one() {
  local nd="$N_DIR" p
  stop_one "cozy-proxy$N_SFX"
  stop_one "metallb-speaker$N_SFX"
  stop_one "kube-proxy$N_SFX"
  stop_one "kubelet$N_SFX"
  # The pods' processes, then the shims containerd started for them, then containerd.
  node_cgroups_remove
  pkill -KILL -f -- "containerd-shim-runc-v2 .*-address $nd/containerd/containerd.sock" 2>/dev/null || true
  stop_one "containerd$N_SFX"
  stop_one "node-holder$N_SFX"
  node_cgroups_remove
  if [ -f "$nd/created-host-paths" ]; then
    # Only empty directories: nothing of the node was ever written to the host's side.
    while read -r p; do
      if [ -n "$p" ] && [ -d "$p" ]; then find "$p" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
      if [ -n "$p" ] && [ -e "$p" ]; then log "warning: $p is not empty; left in place"; fi
    done < "$nd/created-host-paths"
    rm -f "$nd/created-host-paths"
  fi
}

node_netns_remove() { netns_remove "$N_NETNS" 2>/dev/null || true; }

# After the control plane stopped: the namespace itself, and the lock.
node_netns_down() {
  [ -e "/run/netns/$NODE_NETNS" ] || return 0
  [ "$(cat "$NODE_LOCK" 2>/dev/null)" = "$dir" ] || return 0
  each_node_last_first node_netns_remove
  netns_remove "$CLIENT_NETNS" 2>/dev/null || true
  # `ip netns add` made /run/netns (a mount point of its own) if there was none.
  if [ -f "$dir/created-run-netns" ] && [ -z "$(ls -A /run/netns 2>/dev/null)" ]; then
    umount /run/netns 2>/dev/null || true
    rmdir /run/netns 2>/dev/null || true
  fi
  rm -f "$NODE_LOCK"
}
