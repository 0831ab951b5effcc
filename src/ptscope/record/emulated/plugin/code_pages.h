/* Code that runs from memory no file backs (JIT compilers, trampolines built at run time).

   perf decodes Intel PT by reading each instruction from the file an MMAP2 record names, so
   such code must be in a file: each page of it that runs is written into the recording's
   jitted-code.bin and mapped there by an MMAP2 record. When code on a page changes, the
   new version gets a page of its own (with what was known of the old one) and a new MMAP2
   record from then on. One table per process; a forked child starts with a copy. */
#ifndef PTSCOPE_CODE_PAGES_H
#define PTSCOPE_CODE_PAGES_H

#include <stddef.h>
#include <stdint.h>

struct code_page;

struct code_pages {
	struct code_page **buckets;
	size_t nbuckets, count;
};

/* Called when a page (version) needs an MMAP2 record: page address, file offset. */
typedef void (*code_page_mapped)(uint64_t page, uint64_t file_offset, void *ctx);

/* The bytes `code[0..n)` at `addr` ran: put them in the file (path), mapping each page
   the first time and again when code already there changed. */
void code_pages_add(struct code_pages *cp, const char *path, uint64_t addr, const uint8_t *code,
		    size_t n, code_page_mapped mapped, void *ctx);

#endif
