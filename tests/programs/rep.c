/* rep string instructions: QEMU logs every iteration, PT counts the instruction once. */
#include <stdio.h>
#include <string.h>

static char src[4096], dst[4096];

__attribute__((noinline)) static void copy(char *d, const char *s, unsigned long n) {
    __asm__ volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}
__attribute__((noinline)) static void fill(char *d, int c, unsigned long n) {
    __asm__ volatile("rep stosb" : "+D"(d), "+c"(n) : "a"(c) : "memory");
}
__attribute__((noinline)) static void fill_quads(void *d, unsigned long n) {
    __asm__ volatile("rep stosq" : "+D"(d), "+c"(n) : "a"(0L) : "memory");
}

int main(void) {
    fill(src, 7, 1001);
    copy(dst, src, 777);
    copy(dst, src, 0);
    fill_quads(dst + 8, 13);
    memset(src, 3, 333);
    memcpy(dst, src, 515);
    printf("rep %d %d\n", dst[0], dst[776]);
    return 0;
}
