/* Signal handlers: one delivered on return from a system call (raise), one asynchronous
   (a timer firing in the middle of a computation). */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile int hits;
static volatile sig_atomic_t ticks;

__attribute__((noinline)) static int helper(int x) { return x + 1; }
__attribute__((noinline)) static void on_usr1(int sig) { hits = helper(hits) + sig * 0; }
__attribute__((noinline)) static void on_alarm(int sig) { (void)sig; ticks = ticks + 1; }

__attribute__((noinline, noipa)) static long spin(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += helper((int)i) & 3;
    return s;
}

int main(void) {
    signal(SIGUSR1, on_usr1);
    raise(SIGUSR1);
    raise(SIGUSR1);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 2000}, {0, 2000}};
    setitimer(ITIMER_REAL, &it, NULL);
    long s = 0;
    while (ticks < 3) s += spin(2000);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("signals %d %d %ld\n", hits, (int)ticks, s > 0);
    return 0;
}
