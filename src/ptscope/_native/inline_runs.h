/* A binary's inlined code as runs: sorted, disjoint [start, end) file addresses (as perf's
 * symbols are), each in its innermost inlined body (a decode-wide node id, 0: none).
 * Python builds them from DWARF (decode/inline_runs.py); the own decoder (pt_image.h)
 * holds them per file, the dlfilter per DSO (filter_inline.c). One lookup for both, so
 * that both decoders split a block at the same addresses. */
#ifndef PTSCOPE_INLINE_RUNS_H
#define PTSCOPE_INLINE_RUNS_H

#include <stddef.h>
#include <stdint.h>

struct inline_runs {
	const uint64_t *start, *end;
	const int32_t *node;
	size_t n;
};

/* The inlined body at file address a (0: none), and in *next the first run boundary after
 * a (where a run starts or ends; UINT64_MAX: none). */
static inline int32_t inline_runs_node(const struct inline_runs *r, uint64_t a, uint64_t *next)
{
	size_t lo = 0, hi = r->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (r->end[mid] <= a)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < r->n && r->start[lo] <= a) {
		*next = r->end[lo];
		return r->node[lo];
	}
	*next = lo < r->n ? r->start[lo] : UINT64_MAX;
	return 0;
}

#endif /* PTSCOPE_INLINE_RUNS_H */
