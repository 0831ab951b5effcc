/* Preloaded into qemu-x86_64 by ptscope's emulated backend: one log stream per process.

   QEMU user mode emulates a guest fork() with a host fork(), and both processes keep writing
   their trace log to the same file descriptor, so their lines interleave with nothing to tell
   them apart. After a fork, this library's pthread_atfork child handler connects to the Unix
   socket named by PTSCOPE_QEMU_FORKS, announces "PTSCOPE-FORK <pid> <ppid>\n" and makes that
   connection the child's log (dup2 over the descriptor of the log FIFO named by
   PTSCOPE_QEMU_LOG). If the socket cannot be reached, the child's log goes to /dev/null: the
   parent's stream stays exact either way.

   The constructor removes its variables and restores the guest's own LD_PRELOAD (saved in
   PTSCOPE_GUEST_LD_PRELOAD) before QEMU copies its environment to the guest. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static dev_t log_dev;
static ino_t log_ino;
static int active;
static struct sockaddr_un forks_addr;

static void redirect_log(int to) {
    /* The log FIFO is open once in QEMU; any descriptor on it is the log. */
    for (int fd = 0; fd < 4096; fd++) {
        struct stat st;
        if (fd != to && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && st.st_dev == log_dev &&
            st.st_ino == log_ino)
            dup2(to, fd);
    }
}

static void in_child(void) {
    if (!active)
        return;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s >= 0 && connect(s, (struct sockaddr *)&forks_addr, sizeof forks_addr) == 0) {
        char hello[64];
        int n = snprintf(hello, sizeof hello, "PTSCOPE-FORK %d %d\n", (int)getpid(),
                         (int)getppid());
        if (write(s, hello, (size_t)n) == n) {
            redirect_log(s);
            close(s);
            return;
        }
    }
    if (s >= 0)
        close(s);
    int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) {
        redirect_log(null);
        close(null);
    }
}

__attribute__((constructor)) static void ptscope_fork_shim_init(void) {
    const char *log = getenv("PTSCOPE_QEMU_LOG");
    const char *forks = getenv("PTSCOPE_QEMU_FORKS");
    const char *guest_preload = getenv("PTSCOPE_GUEST_LD_PRELOAD");
    struct stat st;
    if (log && forks && strlen(forks) < sizeof forks_addr.sun_path && stat(log, &st) == 0) {
        log_dev = st.st_dev;
        log_ino = st.st_ino;
        forks_addr.sun_family = AF_UNIX;
        strcpy(forks_addr.sun_path, forks);
        active = 1;
        pthread_atfork(NULL, NULL, in_child);
    }
    if (guest_preload)
        setenv("LD_PRELOAD", guest_preload, 1);
    else
        unsetenv("LD_PRELOAD");
    unsetenv("PTSCOPE_GUEST_LD_PRELOAD");
    unsetenv("PTSCOPE_QEMU_LOG");
    unsetenv("PTSCOPE_QEMU_FORKS");
}
