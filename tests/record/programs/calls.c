/* A call tree for sampling tests: main -> run_for -> compute -> {hot_leaf, warm_leaf}.
 * Runs for argv[1] milliseconds (default 300) of CPU work, then exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile double sink;

__attribute__((noinline)) double hot_leaf(int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)i * 0.5 + sink;
    return s;
}

__attribute__((noinline)) double warm_leaf(int n) { return hot_leaf(n / 8) + 1; }

__attribute__((noinline)) double compute(int n) { return hot_leaf(n) + warm_leaf(n); }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) void run_for(double ms) {
    double end = now_ms() + ms;
    while (now_ms() < end) sink = compute(20000);
}

int main(int argc, char **argv) {
    run_for(argc > 1 ? atof(argv[1]) : 300);
    return 0;
}
