/* Loops, recursion, calls through function pointers, a switch jump table, libc calls. */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static int sq(int x) { return x * x; }
__attribute__((noinline)) static int cube(int x) { return x * x * x; }
__attribute__((noinline)) static int twice(int x) { return 2 * x; }

static int (*const table[])(int) = {sq, cube, twice};

__attribute__((noinline)) static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__attribute__((noinline)) static int dispatch(int op, int x) {
    switch (op) { /* dense cases: compiled to a jump table */
    case 0: return x + 1;
    case 1: return x - 3;
    case 2: return x * 7;
    case 3: return x ^ 0x55;
    case 4: return x / 3;
    case 5: return x % 11;
    case 6: return -x;
    default: return 0;
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 10;
    long total = 0;
    for (int i = 0; i < n; i++) {
        total += table[i % 3](i);
        total += dispatch(i % 8, i);
    }
    total += fib(n);
    printf("basics %d %ld\n", n, total);
    return 0;
}
