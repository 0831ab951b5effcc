/* Trigger tests: prints the address of trigger_target, then calls it once on the main
 * thread and once on a second thread created after start-up (argv[1] ms later), then
 * lingers argv[2] ms before exiting. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static volatile int counter;

__attribute__((noinline)) void trigger_target(int x) { counter += x; }

static void *second(void *arg) {
    (void)arg;
    trigger_target(2);
    return NULL;
}

int main(int argc, char **argv) {
    int delay_ms = argc > 1 ? atoi(argv[1]) : 50;
    printf("trigger_target %p\n", (void *)&trigger_target);
    fflush(stdout);
    usleep(delay_ms * 1000);
    trigger_target(1);
    pthread_t t;
    pthread_create(&t, NULL, second, NULL);
    pthread_join(t, NULL);
    usleep((argc > 2 ? atoi(argv[2]) : 0) * 1000);
    return counter == 3 ? 0 : 1;
}
