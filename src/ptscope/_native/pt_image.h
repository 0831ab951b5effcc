/* Address spaces for the own decoder: the files code runs from, each process's maps of
 * them over time, and the code bytes and symbols at an address (see pt_image.c).
 *
 * The maps follow perf's rules (docs/architecture.md, "The own decoder: images"): a new
 * mapping removes what it overlaps (keeping the parts outside it), threads of a process
 * share its maps, fork copies them, exec clears nothing. A file is what perf calls a DSO:
 * its shown name (the mmap's file name, `[vdso]`, `/tmp/perf-PID.map`), where its bytes
 * are read from (chosen in Python as perf chooses: build-id cache, --symfs, the path) and
 * its symbols, handed over by Python the first time an address in it is resolved.
 */
#ifndef PTSCOPE_PT_IMAGE_H
#define PTSCOPE_PT_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "inline_runs.h"
#include "pt_block.h"

#define PT_NO_FILE UINT32_MAX

/* A DSO's symbols as perf's lookup answers them: disjoint intervals in the DSO's
 * address space (file offsets, or addresses for identity-mapped files), sorted; an
 * interval [start, end) answers symbol `name`, which spans [sym_start, sym_end) (a
 * symbol of size zero answers only at its start, where sym_end == sym_start). */
struct pt_symbols {
	uint64_t *start, *end, *sym_start, *sym_end;
	uint32_t *name; /* string ids (Python's) */
	uint32_t *fn;	/* function-key ids: equal <=> one function for the engine */
	size_t n;
	/* Inlined code: sorted disjoint runs [inl_start, inl_end) of file addresses (as the
	 * symbols'), each in its innermost inlined body inl_node (a decode-wide node id). */
	uint64_t *inl_start, *inl_end;
	int32_t *inl_node;
	size_t ninl;
};

struct pt_file {
	const uint8_t *data; /* its bytes (mapped), NULL: perf cannot read them */
	size_t size;
	uint32_t dso;	     /* string id of its name as perf shows it */
	uint32_t unknown_fn; /* function-key id of its code without a symbol: "[unknown] (DSO)" */
	bool identity;	     /* addresses are not file offsets (perf maps: map_ip is identity) */
	bool symbols_loaded; /* asked for once */
	uint8_t failures;    /* reads that failed: perf reports the first two, then none */
	struct pt_symbols syms;
};

struct pt_map {
	uint64_t start, end, pgoff;
	uint32_t file;
};

/* One process's address space: its maps (sorted, never overlapping) and the blocks
 * decoded from them (valid while the space's epoch is theirs). */
struct pt_space {
	struct pt_map *maps;
	size_t n, cap;
	size_t hint; /* the map found last */
	uint32_t epoch;
	struct pt_blocks blocks;
};

/* Asks for a file's symbols (the binding calls Python, which calls
 * pt_image_set_symbols); 0 on success. */
typedef int (*pt_symbols_fn)(void *ctx, uint32_t file);

struct pt_image {
	struct pt_file *files;
	size_t nfiles, capfiles;
	struct pt_space **spaces;
	size_t nspaces, capspaces;
	pt_symbols_fn load_symbols;
	void *load_ctx;
	uint32_t unknown_fn; /* function-key id of an address in no map: "[unknown]" */
	bool inlined;	     /* some file has inline runs (else no block is split for them) */
};

int pt_image_init(struct pt_image *im);
void pt_image_free(struct pt_image *im);

/* A file: index, or -1 when out of memory. data may be NULL (unreadable). */
long pt_image_add_file(struct pt_image *im, const uint8_t *data, size_t size, uint32_t dso,
		       uint32_t unknown_fn, bool identity);
/* Its symbols: arrays of n (copied). */
int pt_image_set_symbols(struct pt_image *im, uint32_t file, const uint64_t *start,
			 const uint64_t *end, const uint64_t *sym_start, const uint64_t *sym_end,
			 const uint32_t *name, const uint32_t *fn, size_t n);

/* A new, empty space (index), or -1. */
long pt_image_new_space(struct pt_image *im);
/* A copy of a space's maps (fork), or -1. */
long pt_image_clone_space(struct pt_image *im, size_t from);
/* Map [start, start + len) of file at pgoff into a space, as perf does. 0 or -ENOMEM. */
int pt_image_map(struct pt_image *im, size_t space, uint64_t start, uint64_t len,
		 uint64_t pgoff, uint32_t file);

/* The map holding addr in a space, or NULL. */
static inline const struct pt_map *pt_space_find(struct pt_space *s, uint64_t addr)
{
	if (s->hint < s->n) {
		const struct pt_map *m = &s->maps[s->hint];
		if (addr >= m->start && addr < m->end)
			return m;
	}
	size_t lo = 0, hi = s->n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (s->maps[mid].end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < s->n && s->maps[lo].start <= addr) {
		s->hint = lo;
		return &s->maps[lo];
	}
	return NULL;
}

/* A map's address translated into its file's address space (perf's map_ip). */
static inline uint64_t pt_map_ip(const struct pt_image *im, const struct pt_map *m, uint64_t addr)
{
	return im->files[m->file].identity ? addr : addr - m->start + m->pgoff;
}

/* What addr resolves to in a space, as perf's resolve_ip answers it. */
struct pt_resolved {
	uint32_t dso;	  /* 0: no map */
	uint32_t name;	  /* 0: no symbol */
	uint32_t fn;	  /* function-key id */
	int64_t offset;	  /* from the symbol's start as the dlfilter gives it, -1: no symbol */
	int32_t node;	  /* the innermost inlined body there, 0: none */
};
int pt_image_resolve(struct pt_image *im, size_t space, uint64_t addr, struct pt_resolved *out);
/* A file's inlined code (after its symbols: they replace it); copied. */
int pt_image_set_inline(struct pt_image *im, uint32_t file, const uint64_t *start,
			const uint64_t *end, const int32_t *node, size_t n);

/* The inlined body at file address a (0: none), and the first run boundary after a. */
static inline int32_t pt_symbols_node(const struct pt_symbols *sy, uint64_t a, uint64_t *next)
{
	struct inline_runs r = { sy->inl_start, sy->inl_end, sy->inl_node, sy->ninl };
	return inline_runs_node(&r, a, next);
}

#endif
