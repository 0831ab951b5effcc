/* A loop of argv[1] rounds (default 3,000,000) that calls nothing: its trace is all
 * jumps inside main, which the dlfilter drops, so perf decodes it for a while without
 * writing a record (the watchdog must tell that from a perf that is stuck). Exits with 0
 * (ptscope run exits with the program's status). */
#include <stdlib.h>

static volatile unsigned sink;

int main(int argc, char **argv) {
    long rounds = argc > 1 ? strtol(argv[1], NULL, 10) : 3000000;
    unsigned x = 1;
    for (long i = 0; i < rounds; i++) {
        x = x * 1103515245u + 12345u;
        if (x & 0x10000) sink = x;
    }
    return sink == 42u; /* 0, but the compiler cannot know: the loop stays */
}
