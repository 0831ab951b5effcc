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

/* Split `size` bytes of code (`code` holds `avail` >= size bytes) into instructions:
 * *before = how many start before offset `size`, *end_len = the length of the one at
 * `size` (0 if none decodes there). -1 if the instructions do not end exactly at `size`.
 * (How both the dlfilter and the own decoder's feed count a block they did not walk.) */
__attribute__((visibility("default"))) int ptscope_x86_split(const uint8_t *code, size_t avail,
							     size_t size, uint32_t *before,
							     uint8_t *end_len);

#endif /* PTSCOPE_X86_LENGTH_H */
