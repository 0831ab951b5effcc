/* Prints CLOCK_REALTIME (ns) as its first action: when it started running. Then calls
 * trigger_target argv[1] times (default 0) and prints the ns per call. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile int counter;

__attribute__((noinline)) void trigger_target(void) { counter++; }

static long long now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    long long started = now_ns(CLOCK_REALTIME);
    long n = argc > 1 ? atol(argv[1]) : 0;
    long long t0 = now_ns(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) trigger_target();
    long long t1 = now_ns(CLOCK_MONOTONIC);
    printf("started %lld\n", started);
    if (n) printf("ns_per_call %.1f\n", (double)(t1 - t0) / n);
    return 0;
}
