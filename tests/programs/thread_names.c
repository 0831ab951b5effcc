/* Threads with names: main renames itself with prctl(PR_SET_NAME), one thread names itself
 * with pthread_setname_np (prctl inside), and main names the other through
 * pthread_setname_np (a write to /proc/self/task/TID/comm). Each thread writes its id and
 * the name it ends with to argv[1]: the ground truth. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile long tids[3];
static pthread_barrier_t named;

__attribute__((noinline)) static long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i ^ (s >> 2);
    return s;
}

static void *self_named(void *arg) {
    (void)arg;
    tids[1] = syscall(SYS_gettid);
    pthread_setname_np(pthread_self(), "self-named");
    pthread_barrier_wait(&named);
    return (void *)work(300);
}

static void *named_by_main(void *arg) {
    (void)arg;
    tids[2] = syscall(SYS_gettid);
    pthread_barrier_wait(&named);
    return (void *)work(400);
}

int main(int argc, char **argv) {
    pthread_barrier_init(&named, NULL, 3);
    prctl(PR_SET_NAME, "the-boss");
    tids[0] = syscall(SYS_gettid);
    pthread_t a, b;
    pthread_create(&a, NULL, self_named, NULL);
    pthread_create(&b, NULL, named_by_main, NULL);
    while (!tids[2]) sched_yield();
    pthread_setname_np(b, "named-by-main");
    pthread_barrier_wait(&named);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    FILE *out = argc > 1 ? fopen(argv[1], "w") : stdout;
    const char *names[] = {"the-boss", "self-named", "named-by-main"};
    for (int i = 0; i < 3; i++) fprintf(out, "%ld %s\n", tids[i], names[i]);
    if (out != stdout) fclose(out);
    return 0;
}
