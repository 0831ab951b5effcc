/* Benchmark workload: about 1,000 instructions per iteration (argv[1] iterations). */
#include <stdio.h>
#include <stdlib.h>

__attribute__((noinline)) static int leaf(int x) { return x * 3 + 1; }
__attribute__((noinline)) static int mid(int x) {
    int s = 0;
    for (int i = 0; i < 8; i++) s += leaf(x + i);
    return s;
}
__attribute__((noinline)) static int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000;
    long s = 0;
    for (long i = 0; i < n; i++) {
        for (int j = 0; j < 8; j++) s += mid((int)i + j);
        s += fib(5);
    }
    printf("bench %ld %ld\n", n, s);
    return 0;
}
