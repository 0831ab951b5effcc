/* Threads started while others run and make system calls; every thread writes its real id
 * (gettid) to the file argv[2]: the ground truth for the thread ids of a recording.
 * argv[1]: how many threads besides main (default 4). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_THREADS 16

static long tids[MAX_THREADS];

__attribute__((noinline)) static long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) s += i ^ (s >> 3);
    return s;
}

__attribute__((noinline)) static void *worker(void *arg) {
    long index = (long)arg;
    tids[index] = syscall(SYS_gettid);
    sched_yield();
    return (void *)work(200 + 50 * index);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_t threads[MAX_THREADS];
    for (long i = 0; i < n; i++) pthread_create(&threads[i], NULL, worker, (void *)i);
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    FILE *out = argc > 2 ? fopen(argv[2], "w") : stdout;
    if (!out) return 1;
    fprintf(out, "%d\n", (int)getpid());
    for (int i = 0; i < n; i++) fprintf(out, "%ld\n", tids[i]);
    fclose(out);
    return 0;
}
