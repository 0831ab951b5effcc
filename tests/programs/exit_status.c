/* Writes one line to stdout, works for about MS milliseconds, then ends as told:
 * exit_status STATUS MS exits with STATUS; exit_status -SIGNAL MS raises SIGNAL.
 * never_called is what its name says (a trigger that cannot hit). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

__attribute__((noinline)) static void work(void) {
    for (int i = 0; i < 1000; i++) sink += (unsigned long)i;
}

__attribute__((noinline, used)) void never_called(void) { sink = 0; }

static long elapsed_ms(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

int main(int argc, char **argv) {
    int how = argc > 1 ? atoi(argv[1]) : 0;
    long ms = argc > 2 ? atol(argv[2]) : 0;
    struct timespec t0;
    printf("the program's own line\n");
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do
        work();
    while (elapsed_ms(&t0) < ms);
    if (how < 0) {
        signal(-how, SIG_DFL);
        raise(-how);
    }
    return how;
}
