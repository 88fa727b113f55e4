/* The workload of the node tier's wire (deploy/local/node.sh): answers every HTTP request
 * on PORT (argv[1], default 8080; IPv4 and IPv6) with the pod's name — its hostname, which
 * the kubelet sets to the pod's name — so a client can tell which pod it reached.
 * One connection at a time; a request head is read for at most 2 s and 8 KiB, then the
 * answer is sent whatever came. Built static (gcc -static), so its image is this one file. */
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static int listen_on(int port) {
  int one = 1, zero = 0;
  int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd >= 0) {
    struct sockaddr_in6 a6 = {0};
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons((unsigned short)port);
    a6.sin6_addr = in6addr_any;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (struct sockaddr *)&a6, sizeof a6) == 0 && listen(fd, 64) == 0) return fd;
    close(fd);
  }
  /* No IPv6 in this pod: IPv4 only. */
  fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in a4 = {0};
  a4.sin_family = AF_INET;
  a4.sin_port = htons((unsigned short)port);
  a4.sin_addr.s_addr = htonl(INADDR_ANY);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&a4, sizeof a4) != 0 || listen(fd, 64) != 0) return -1;
  return fd;
}

static void serve(int c, const char *name) {
  struct timeval tv = {2, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  char req[8192];
  size_t got = 0;
  while (got < sizeof req - 1) {
    ssize_t n = read(c, req + got, sizeof req - 1 - got);
    if (n <= 0) break;
    got += (size_t)n;
    req[got] = 0;
    if (strstr(req, "\r\n\r\n") || strstr(req, "\n\n")) break;
  }
  char out[512];
  int len = snprintf(out, sizeof out,
                     "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n%s\n",
                     strlen(name) + 1, name);
  if (len > 0 && (size_t)len < sizeof out) {
    ssize_t off = 0;
    while (off < len) {
      ssize_t n = write(c, out + off, (size_t)(len - off));
      if (n <= 0) break;
      off += n;
    }
  }
  close(c);
}

int main(int argc, char **argv) {
  struct sigaction a = {0};
  a.sa_handler = stop;
  sigaction(SIGINT, &a, 0);
  sigaction(SIGTERM, &a, 0);
  signal(SIGPIPE, SIG_IGN);
  int port = argc > 1 ? atoi(argv[1]) : 8080;
  if (port <= 0 || port > 65535) port = 8080;
  char name[256] = {0};
  if (gethostname(name, sizeof name - 1) != 0) strcpy(name, "unknown");
  int fd = listen_on(port);
  if (fd < 0) {
    perror("listen");
    return 1;
  }
  printf("hello: %s answering on :%d\n", name, port);
  fflush(stdout);
  for (;;) {
    int c = accept(fd, 0, 0);
    if (c < 0) {
      if (errno != EINTR) usleep(10000);
      continue;
    }
    serve(c, name);
  }
}
