/* Calls a function, then replaces itself with argv[1] (QEMU user mode runs it natively). */
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) int before_exec(int x) { return x * 2 + 1; }

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    printf("%d\n", before_exec(argc));
    fflush(stdout);
    execv(argv[1], argv + 1);
    return 1;
}
