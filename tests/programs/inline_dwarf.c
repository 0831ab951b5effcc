/* Inlined code of many shapes for the DWARF inline reader's tests
   (tests/decode/test_inline_info.py): static inline and always_inline functions, nested
   inlines (three deep, across a header), one function inlined at several call sites and in
   several functions, inlined code in lexical blocks, and out-of-line copies. */
#include <stdio.h>
#include <stdlib.h>
#include "inline_dwarf.h"

static inline int square(int x) { return x * x; }

static inline __attribute__((always_inline)) int sum_squares(int a, int b) {
    return square(a) + square(b);
}

static inline __attribute__((always_inline)) int deep(int a, int b, int c) {
    int t = sum_squares(a, b);
    if (t & 1) {
        int u = square(c) + (int)mix2((unsigned)a, (unsigned)t);
        t += u;
    }
    return t + sum_squares(c, a);
}

static int table[64];

static inline void bump(int i, int v) { table[i & 63] += v; }

__attribute__((noinline)) int walk(int n) {
    int acc = 0;
    for (int i = 0; i < n; i++) {
        acc += deep(i, n, acc);
        {
            int local = square(i) ^ acc;
            bump(i, local);
        }
        bump(acc, i);
    }
    return acc;
}

__attribute__((noinline)) unsigned hash_all(int n) {
    unsigned h = 0;
    for (int i = 0; i < n; i++)
        h = mix2(h, (unsigned)table[i & 63]) + mix((unsigned)i);
    return h;
}

__attribute__((noinline)) int other(int x) { return square(x + 1) - sum_squares(x, 3); }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    int w = walk(n);
    printf("%d %u %d %d\n", w, hash_all(n), other(n), deep(n, w, argc));
    return 0;
}
