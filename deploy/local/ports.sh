# shellcheck shell=bash
# Sourced by the local scripts (cluster.sh, demo.sh).
# free_ports N: N distinct free loopback ports, one per line. The sockets stay bound until all
# N are chosen: ports picked one at a time (each socket closed before the next bind) can come
# back equal — etcd and kube-apiserver were once given the same port. They are taken below
# the kernel's ephemeral range (net.ipv4.ip_local_port_range): a port of that range can become
# the source port of any outgoing connection before the component binds it (the test
# harness's free_port, tests/src/lib.rs, chooses the same way).
free_ports() {
  python3 -c '
import os, random, socket, sys
n = int(sys.argv[1])
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
socks = []
candidates = list(range(10000, low)) if low > 11000 else []
random.shuffle(candidates)
for port in candidates:
    if len(socks) == n:
        break
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        socks.append(s)
    except OSError:
        s.close()
while len(socks) < n:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}
