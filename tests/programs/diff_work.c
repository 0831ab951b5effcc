/* Two variants of one deterministic program, for `ptscope diff`: -DEXTRA_LOOP adds a loop
 * to work() only, -DEXTRA_CALLS adds a function called once a round. */
#include <stdlib.h>

volatile long sink; /* a side effect: no call may be folded or hoisted out of the loop */

__attribute__((noinline)) long leaf(long x) {
    sink = x;
    return x * 3 + 1;
}

__attribute__((noinline)) long work(int n) {
    long s = 0;
    for (int i = 0; i < n; i++)
        s += leaf(i);
#ifdef EXTRA_LOOP
    for (volatile int k = 0; k < 200; k++)
        s ^= k;
#endif
    return s;
}

__attribute__((noinline)) long fib(int n) {
    sink = n;
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}

#ifdef EXTRA_CALLS
__attribute__((noinline)) long extra(int i) {
    sink = i;
    return i * 7 + (i >> 2);
}
#endif

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    long s = 0;
    for (int r = 0; r < rounds; r++) {
        s += work(50);
        s += fib(10);
#ifdef EXTRA_CALLS
        s += extra(r);
#endif
    }
    return (int)(s & 1);
}
