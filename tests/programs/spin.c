/* Never ends on its own (for --max-instructions and Ctrl-C). With an argument, prints it
 * first: a test waits for that line to know the program runs. */
#include <stdio.h>

static volatile unsigned state = 1;

__attribute__((noinline)) static unsigned step(unsigned x) { return x * 1103515245u + 12345u; }

int main(int argc, char **argv) {
    if (argc > 1) {
        puts(argv[1]);
        fflush(stdout);
    }
    for (;;) state = step(state);
}
