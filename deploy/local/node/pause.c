/* The pod sandbox's process for the local node (deploy/local/node.sh): holds the pod's
 * namespaces open, reaps the zombies of a shared PID namespace, exits on SIGINT/SIGTERM.
 * Built static (gcc -static), so its image is this one file. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction a = {0};
  a.sa_handler = stop;
  sigaction(SIGINT, &a, 0);
  sigaction(SIGTERM, &a, 0);
  a.sa_handler = reap;
  a.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &a, 0);
  for (;;) pause();
}
