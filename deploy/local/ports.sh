# Sourced by the local scripts (cluster.sh, demo.sh).
# free_ports N: N distinct free loopback ports, one per line. The sockets stay bound until all
# N are chosen: ports picked one at a time (each socket closed before the next bind) can come
# back equal — etcd and kube-apiserver were once given the same port.
free_ports() {
  python3 -c '
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print("\n".join(str(s.getsockname()[1]) for s in socks))
' "$1"
}
