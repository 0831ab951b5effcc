/* Inline helpers in a header of their own: their inlined calls of each other have
   call sites in this file (tests/decode/test_inline_info.py). */
#ifndef INLINE_DWARF_H
#define INLINE_DWARF_H

static inline unsigned mix(unsigned x) {
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    return x ^ (x >> 15);
}

static inline __attribute__((always_inline)) unsigned mix2(unsigned a, unsigned b) {
    return mix(a) + mix(b ^ 0x9e3779b9u);
}

#endif
