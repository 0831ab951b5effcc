/* Never ends on its own (for --max-instructions). */
__attribute__((noinline)) static unsigned step(unsigned x) { return x * 1103515245u + 12345u; }

int main(void) {
    unsigned x = 1;
    for (;;) x = step(x);
}
