/* A tiny JIT: machine code written into an anonymous executable mapping at run time,
 * named in /tmp/perf-PID.map as JIT compilers do, called many times; then ordinary
 * functions run again (what comes after JIT code must be traced as well). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* int jitted_sum(int n) { int s = 0; for (; n; n--) s += n; return s; } */
static const unsigned char code[] = {
    0x31, 0xc0,       /* xor %eax,%eax */
    0x85, 0xff,       /* test %edi,%edi */
    0x74, 0x06,       /* je ret */
    0x01, 0xf8,       /* loop: add %edi,%eax */
    0xff, 0xcf,       /* dec %edi */
    0x75, 0xfa,       /* jne loop */
    0xc3,             /* ret: ret */
};

__attribute__((noinline)) static long after_jit(long x) { return x * 3 + 1; }

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    memcpy(page + 64, code, sizeof code);
    if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return 1;
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (!map) return 1;
    fprintf(map, "%lx %zx jitted_sum\n", (unsigned long)(page + 64), sizeof code);
    fclose(map);
    int (*jitted)(int) = (int (*)(int))(page + 64);
    long total = 0;
    for (int i = 0; i < n; i++) total += jitted(i % 7);
    for (int i = 0; i < n; i++) total += after_jit(i);
    printf("jit %ld\n", total);
    return 0;
}
