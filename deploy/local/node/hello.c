/* The workload of the node tier's wire (deploy/local/node.sh): answers every HTTP request
 * with the pod's name — its hostname, which the kubelet sets to the pod's name — so a client
 * can tell which pod it reached. It listens on every port its arguments name: `N` is TCP
 * (HTTP), `u:N` is UDP (each datagram answered with the name); no argument: TCP 8080. IPv4
 * and IPv6 where the pod has them.
 *
 * Two paths say more than the name, for the tests of a whole address (cozy-proxy):
 *   GET /whoami            -> "<name> <the peer's address>": who the connection came from;
 *   GET /dial/<ip>/<port>  -> connects from this pod to <ip>:<port>, asks it GET /whoami and
 *                             answers with what it said: the address this pod's outbound
 *                             traffic was seen from.
 * `hello probe PORT` is its readiness check, run inside the pod (an exec probe): it asks
 * 127.0.0.1:PORT and exits 0 when that answered. A whole-address pod cannot be probed from
 * the node: cozy-proxy rewrites the source of every packet the pod sends, its answers to the
 * kubelet's probes included, so an HTTP probe from the node never sees its answer.
 * One connection at a time; a request head is read for at most 2 s and 8 KiB, then the
 * answer is sent whatever came. Built static (gcc -static), so its image is this one file. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_PORTS 32

static void stop(int sig) { (void)sig; _exit(0); }

/* A socket of TYPE bound to PORT on every address (dual-stack when the pod has IPv6). */
static int bound(int type, int port) {
  int one = 1, zero = 0;
  int fd = socket(AF_INET6, type, 0);
  if (fd >= 0) {
    struct sockaddr_in6 a6 = {0};
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons((unsigned short)port);
    a6.sin6_addr = in6addr_any;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0 &&
        (type != SOCK_STREAM || listen(fd, 64) == 0))
      return fd;
    close(fd);
  }
  /* No IPv6 in this pod: IPv4 only. */
  fd = socket(AF_INET, type, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a4 = {0};
  a4.sin_family = AF_INET;
  a4.sin_port = htons((unsigned short)port);
  a4.sin_addr.s_addr = htonl(INADDR_ANY);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0 ||
      (type == SOCK_STREAM && listen(fd, 64) != 0))
    return -1;
  return fd;
}

/* The printable address of PEER (an IPv4-mapped IPv6 address as plain IPv4). */
static void peer_text(const struct sockaddr_storage *peer, char *out, size_t n) {
  out[0] = 0;
  if (peer->ss_family == AF_INET) {
    inet_ntop(AF_INET, &((const struct sockaddr_in *)peer)->sin_addr, out, (socklen_t)n);
  } else if (peer->ss_family == AF_INET6) {
    const struct in6_addr *a = &((const struct sockaddr_in6 *)peer)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a))
      inet_ntop(AF_INET, &a->s6_addr[12], out, (socklen_t)n);
    else
      inet_ntop(AF_INET6, a, out, (socklen_t)n);
  }
}

static void write_all(int c, const char *buf, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t n = write(c, buf + off, len - off);
    if (n <= 0) return;
    off += (size_t)n;
  }
}

/* Reads a request head (at most 2 s and 8 KiB) into REQ. */
static void read_head(int c, char *req, size_t size) {
  size_t got = 0;
  req[0] = 0;
  while (got < size - 1) {
    ssize_t n = read(c, req + got, size - 1 - got);
    if (n <= 0) break;
    got += (size_t)n;
    req[got] = 0;
    if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n")) break;
  }
}

/* GET /whoami of IP:PORT from this pod; the body it answered, in OUT. */
static void dial(const char *ip, int port, char *out, size_t n) {
  snprintf(out, n, "dial %s:%d failed", ip, port);
  struct sockaddr_storage to = {0};
  socklen_t len;
  int family;
  if (inet_pton(AF_INET, ip, &((struct sockaddr_in *)&to)->sin_addr) == 1) {
    ((struct sockaddr_in *)&to)->sin_family = AF_INET;
    ((struct sockaddr_in *)&to)->sin_port = htons((unsigned short)port);
    family = AF_INET;
    len = sizeof(struct sockaddr_in);
  } else if (inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&to)->sin6_addr) == 1) {
    ((struct sockaddr_in6 *)&to)->sin6_family = AF_INET6;
    ((struct sockaddr_in6 *)&to)->sin6_port = htons((unsigned short)port);
    family = AF_INET6;
    len = sizeof(struct sockaddr_in6);
  } else {
    return;
  }
  int s = socket(family, SOCK_STREAM, 0);
  if (s < 0) return;
  struct timeval tv = {3, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(s, (struct sockaddr *)&to, len) != 0) {
    close(s);
    return;
  }
  const char *ask = "GET /whoami HTTP/1.0\r\n\r\n";
  write_all(s, ask, strlen(ask));
  char resp[1024];
  size_t got = 0;
  for (;;) {
    ssize_t r = read(s, resp + got, sizeof resp - 1 - got);
    if (r <= 0) break;
    got += (size_t)r;
    if (got >= sizeof resp - 1) break;
  }
  resp[got] = 0;
  close(s);
  const char *body = strstr(resp, "\r\n\r\n");
  snprintf(out, n, "%s", body ? body + 4 : resp);
  size_t l = strlen(out);
  while (l > 0 && (out[l - 1] == '\n' || out[l - 1] == '\r')) out[--l] = 0;
}

static void serve(int c, const char *name, const struct sockaddr_storage *peer) {
  struct timeval tv = {2, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char req[8192];
  read_head(c, req, sizeof req);
  char body[1200];
  char ip[64], from[INET6_ADDRSTRLEN];
  int port;
  if (strncmp(req, "GET /whoami", 11) == 0) {
    peer_text(peer, from, sizeof from);
    snprintf(body, sizeof body, "%s %s", name, from);
  } else if (sscanf(req, "GET /dial/%63[^/]/%d", ip, &port) == 2) {
    dial(ip, port, body, sizeof body);
  } else {
    snprintf(body, sizeof body, "%s", name);
  }
  char out[1536];
  int len = snprintf(out, sizeof out,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s\n",
                     strlen(body) + 1, body);
  if (len > 0 && (size_t)len < sizeof out) write_all(c, out, (size_t)len);
  close(c);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "probe") == 0) {
    char got[1200], failed[64];
    int port = atoi(argv[2]);
    dial("127.0.0.1", port, got, sizeof got);
    snprintf(failed, sizeof failed, "dial 127.0.0.1:%d failed", port);
    return strcmp(got, failed) == 0 ? 1 : 0;
  }
  struct sigaction a = {0};
  a.sa_handler = stop;
  sigaction(SIGINT, &a, 0);
  sigaction(SIGTERM, &a, 0);
  signal(SIGPIPE, SIG_IGN);
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) strcpy(name, "unknown");
  struct pollfd fds[MAX_PORTS];
  int udp[MAX_PORTS];
  int n = 0;
  for (int i = 1; i < argc && n < MAX_PORTS; i++) {
    int is_udp = strncmp(argv[i], "u:", 2) == 0;
    int port = atoi(argv[i] + (is_udp ? 2 : 0));
    if (port <= 0 || port > 65535) continue;
    int fd = bound(is_udp ? SOCK_DGRAM : SOCK_STREAM, port);
    if (fd < 0) {
      perror(argv[i]);
      return 1;
    }
    fds[n].fd = fd;
    fds[n].events = POLLIN;
    udp[n] = is_udp;
    printf("hello: %s answering on %s:%d\n", name, is_udp ? "udp" : "tcp", port);
    n++;
  }
  if (n == 0) {
    int fd = bound(SOCK_STREAM, 8080);
    if (fd < 0) {
      perror("listen");
      return 1;
    }
    fds[0].fd = fd;
    fds[0].events = POLLIN;
    udp[0] = 0;
    n = 1;
    printf("hello: %s answering on tcp:8080\n", name);
  }
  fflush(stdout);
  for (;;) {
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno != EINTR) usleep(10000);
      continue;
    }
    for (int i = 0; i < n; i++) {
      if (!(fds[i].revents & POLLIN)) continue;
      struct sockaddr_storage peer;
      socklen_t plen = sizeof peer;
      if (udp[i]) {
        char buf[512];
        ssize_t got = recvfrom(fds[i].fd, buf, sizeof buf, 0, (struct sockaddr *)&peer, &plen);
        if (got >= 0) sendto(fds[i].fd, name, strlen(name), 0, (struct sockaddr *)&peer, plen);
      } else {
        int c = accept(fds[i].fd, (struct sockaddr *)&peer, &plen);
        if (c >= 0) serve(c, name, &peer);
      }
    }
  }
}
