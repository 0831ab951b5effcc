/* setjmp/longjmp out of several frames. */
#include <setjmp.h>
#include <stdio.h>

static jmp_buf env;

__attribute__((noinline)) static void deep(int n) {
    if (n == 0) longjmp(env, 42);
    deep(n - 1);
}
__attribute__((noinline)) static int work(int n) { deep(n); return -1; }
__attribute__((noinline)) static int after(int x) { return x + 1; }

int main(void) {
    int got = 0;
    for (int round = 0; round < 3; round++) {
        int v = setjmp(env);
        if (v == 0) work(4 + round);
        else got += after(v);
    }
    printf("longjmp %d\n", got);
    return 0;
}
