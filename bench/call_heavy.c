/* Call-heavy workload: top calls mid once per round, mid calls a tiny leaf 40-43 times;
 * leaf writes a volatile global, so nothing is hoisted: ~42.5 calls per round, few jumps
 * inside functions (the decoders drop those, which hides what calls cost).
 * argv[1]: rounds (default 60,000). Used by bench/emulated.py and bench/decode.py. */
#include <stdlib.h>
static volatile long sink;
__attribute__((noinline)) static void leaf(long i) { sink = i; }
__attribute__((noinline)) static void mid(long r) {
    long n = 40 + (r & 3);
    for (long i = 0; i < n; i++) leaf(i);
}
__attribute__((noinline)) static void top(long rounds) {
    for (long r = 0; r < rounds; r++) mid(r);
}
int main(int argc, char **argv) {
    top(argc > 1 ? atol(argv[1]) : 60000);
    return 0;
}
