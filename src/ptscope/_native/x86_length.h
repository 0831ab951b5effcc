/* Lengths of x86-64 instructions (64-bit mode): see x86_length.c. */
#ifndef PTSCOPE_X86_LENGTH_H
#define PTSCOPE_X86_LENGTH_H

#include <stddef.h>
#include <stdint.h>

#define PTSCOPE_X86_MAX_LENGTH 15 /* the architectural limit */

/* The length (1..15) of the instruction at `code`, of which `avail` bytes are readable;
 * 0 if the bytes are no valid 64-bit-mode instruction (or one longer than 15 bytes);
 * -1 if `avail` (< 15) ends before the instruction does. */
__attribute__((visibility("default"))) int ptscope_x86_length(const uint8_t *code, size_t avail);

#endif /* PTSCOPE_X86_LENGTH_H */
