/* Tail calls (compiled with -O2): is_even/is_odd jump to each other instead of calling. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) int is_odd(unsigned n);
__attribute__((noinline)) int is_even(unsigned n) { return n == 0 ? 1 : is_odd(n - 1); }
__attribute__((noinline)) int is_odd(unsigned n) { return n == 0 ? 0 : is_even(n - 1); }

__attribute__((noinline)) int leaf(int x) { return x * 3 + 1; }
/* A tail call to a function that returns straight to our caller. */
__attribute__((noinline)) int forward(int x) { return leaf(x + 1); }

int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 25;
    int s = 0;
    for (unsigned i = 0; i < n; i++) s += is_even(i) + forward((int)i);
    printf("tailcall %u %d\n", n, s);
    return 0;
}
