/* Dies of SIGSEGV (a store through a NULL pointer the compiler cannot see) a few calls deep. */
#include <stdio.h>

__attribute__((noinline)) static void poke(volatile int *p, int v) { *p = v; }
__attribute__((noinline)) static void level2(volatile int *p) { poke(p, 2); }
__attribute__((noinline)) static void level1(volatile int *p) { level2(p); }

int main(int argc, char **argv) {
    (void)argv;
    int x = 0;
    level1(&x);
    printf("crash %d\n", x);
    fflush(stdout);
    level1(argc > 100 ? &x : (volatile int *)0);
    return 0;
}
