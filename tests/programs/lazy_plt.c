/* Two calls of strlen through the PLT: the first one, with lazy binding (-Wl,-z,lazy),
 * goes through PLT0 and the dynamic linker's resolver; the second one jumps straight to
 * strlen. printf's first call resolves too. Built with -fno-builtin so strlen stays a call. */
#include <stdio.h>
#include <string.h>

__attribute__((noinline)) static size_t measure(const char *text) { return strlen(text); }

int main(int argc, char **argv) {
    size_t total = measure(argv[0]);
    total += measure("lazy");
    printf("lazy_plt %d %zu\n", argc, total);
    return 0;
}
