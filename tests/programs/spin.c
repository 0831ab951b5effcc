/* Never ends on its own (for --max-instructions). */
static volatile unsigned state = 1;

__attribute__((noinline)) static unsigned step(unsigned x) { return x * 1103515245u + 12345u; }

int main(void) {
    for (;;) state = step(state);
}
