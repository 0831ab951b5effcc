/* Never ends on its own (for --max-instructions and Ctrl-C). With an argument, prints it
 * after the first step: a test waits for that line to know the program runs, and that
 * `step` has been called (a signal right after the line finds it in the trace). With a
 * second argument it sleeps a millisecond every thousand steps, so a recording of a
 * second stays small. */
#include <stdio.h>
#include <time.h>

static volatile unsigned state = 1;

__attribute__((noinline)) static unsigned step(unsigned x) { return x * 1103515245u + 12345u; }

int main(int argc, char **argv) {
    state = step(state);
    if (argc > 1) {
        puts(argv[1]);
        fflush(stdout);
    }
    struct timespec pause = {0, 1000000};
    for (unsigned n = 0;; n++) {
        state = step(state);
        if (argc > 2 && n % 1000 == 0) nanosleep(&pause, NULL);
    }
}
