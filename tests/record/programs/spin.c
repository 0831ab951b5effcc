/* A long-running process to attach to: prints "ready PID" then works in busy_loop (calling
 * tick every ~1 ms) until killed, or for argv[1] seconds. Optional argv[2]: threads. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile double sink;

__attribute__((noinline)) void tick(void) { sink += 1; }

__attribute__((noinline)) double spin_leaf(void) {
    double s = 0;
    for (int i = 0; i < 100000; i++) s += i * 0.25;
    return s;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double limit;

__attribute__((noinline)) void *busy_loop(void *arg) {
    (void)arg;
    double end = now_s() + limit;
    while (now_s() < end) {
        sink += spin_leaf();
        tick();
    }
    return NULL;
}

int main(int argc, char **argv) {
    limit = argc > 1 ? atof(argv[1]) : 60;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    pthread_t t[16];
    for (int i = 0; i < threads && i < 16; i++) pthread_create(&t[i], NULL, busy_loop, NULL);
    busy_loop(NULL);
    for (int i = 0; i < threads && i < 16; i++) pthread_join(t[i], NULL);
    return 0;
}
