/* A DSO's symbols as perf looks them up, flattened into intervals: see pt_symtree.c. */
#ifndef PTSCOPE_PT_SYMTREE_H
#define PTSCOPE_PT_SYMTREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a symbol's pass goes: perf fixes the ends and drops duplicates after each pass of
 * ELF symbols (.symtab, then .dynsym), never after its PLT entries or a JIT map. */
enum { PT_SYM_PASS_SYMTAB, PT_SYM_PASS_DYNSYM, PT_SYM_PASS_PLAIN };

/* One symbol, in perf's order of insertion (passes one after the other). */
struct pt_sym_in {
	uint64_t start, end; /* end == start: size zero */
	uint32_t name_len;   /* of its (demangled) name: perf prefers longer names */
	uint8_t binding;     /* STB_LOCAL 0, STB_GLOBAL 1, STB_WEAK 2 */
	uint8_t underscores; /* its name's leading '_' (fewer is preferred) */
	uint8_t sys_prefix;  /* its name starts with "SyS" or "compat_SyS" */
	uint8_t pass;	     /* PT_SYM_PASS_* */
};

/* The answer for every address: in [start[i], end[i]) perf finds symbol sym[i] (an index
 * into the input); elsewhere none. sym_end: each input symbol's end once perf fixed it. */
struct pt_symtree_out {
	uint64_t *start, *end;
	uint32_t *sym;
	size_t n;
	uint64_t *sym_end;
};

int pt_symtree_flatten(const struct pt_sym_in *in, size_t n, struct pt_symtree_out *out);
void pt_symtree_free(struct pt_symtree_out *out);

#endif
