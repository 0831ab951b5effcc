/* Works for argv[1] ms in doomed(), then dies of SIGSEGV. */
#include <signal.h>
#include <stdlib.h>
#include <time.h>

static volatile double sink;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

__attribute__((noinline)) void doomed(double ms) {
    double end = now_ms() + ms;
    while (now_ms() < end) sink += 1;
    raise(SIGSEGV);
}

int main(int argc, char **argv) {
    doomed(argc > 1 ? atof(argv[1]) : 100);
    return 0;
}
