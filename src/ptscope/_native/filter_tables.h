/* The dlfilter's tables: hashing, interned strings, the location and block caches, id
 * maps and id lists. Plain data structures (no perf API in them), each an open-addressing
 * table (linear probing, a power of two slots, at most half full) or a small array; their
 * lookups are inline, for the per-sample path.
 */
#ifndef PTSCOPE_FILTER_TABLES_H
#define PTSCOPE_FILTER_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "inline_runs.h"
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ hashing */

static inline uint64_t mix64(uint64_t x)
{
	/* splitmix64 finaliser: cheap and good enough for addresses and ids. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

/* -------------------------------------------------------- string interning */

struct str_slot {
	uint64_t hash;
	char *text; /* owned copy; NULL = empty slot */
	uint32_t len;
	uint32_t id;
};

struct str_table {
	struct str_slot *slots;
	size_t cap; /* power of two */
	size_t count;
};

/* Id of `s` (1, 2, ...); *is_new tells whether it was just added. 0 on out-of-memory. */
uint32_t str_intern(struct str_table *t, const char *s, size_t len, int *is_new);

void str_table_free(struct str_table *t);

/* ------------------------------------------------------------ location cache */

/* One resolved address. The key is (address, pid, generation, side): the ip and addr of a
 * sample are resolved by different perf functions (by the sample's cpumode vs. with a
 * fallback), so each side is cached separately to stay identical to perf's text output. */
struct loc_slot {
	uint64_t addr;
	uint64_t meta;       /* pid | generation << 32 | side << 63 */
	uint32_t id;         /* 0 = empty slot */
	uint32_t fn;         /* function-key id: equal <=> same function for the engine */
	const char *sym_ptr; /* perf's pointers at resolve time, to notice a changed mapping */
	const char *dso_ptr;
	/* A branch source's memo (side 0): the target of the last branch from here and the
	 * block that ended here last, so that a branch taken again (a loop, a call site in
	 * one) costs no lookup. Both are copies of entries that never change. */
	uint64_t next_addr; /* 0: none yet */
	uint32_t next_id, next_fn;
	uint64_t block_start; /* 0: none yet */
	uint32_t block_before;
	uint8_t block_end_len;
	/* Inlined code (--dlarg inline=): the innermost inlined body at addr, its DSO's runs
	 * (NULL: none known) and addr as perf maps it into the DSO (al->addr, if has_map). */
	uint8_t has_map;
	int32_t node, next_node;
	const struct inline_runs *inl;
	uint64_t map_addr;
};

struct loc_table {
	struct loc_slot *slots;
	size_t cap;
	size_t count;
};

static inline uint64_t loc_meta(int32_t pid, uint32_t gen, int side)
{
	return (uint32_t)pid | ((uint64_t)(gen & 0x7fffffff) << 32) | ((uint64_t)(side & 1) << 63);
}

static inline uint64_t loc_hash(uint64_t addr, uint64_t meta)
{
	return mix64(addr ^ mix64(meta));
}

int loc_table_grow(struct loc_table *t);

/* The slot for the key: either the matching entry or the empty slot where it goes. */
static inline struct loc_slot *loc_find(struct loc_table *t, uint64_t addr, uint64_t meta)
{
	size_t j = loc_hash(addr, meta) & (t->cap - 1);
	for (;;) {
		struct loc_slot *s = &t->slots[j];
		if (!s->id || (s->addr == addr && s->meta == meta))
			return s;
		j = (j + 1) & (t->cap - 1);
	}
}

/* --------------------------------------------------------------- id maps */

/* u64 key -> dense index; used for threads (pid:tid) and processes (pid). */
struct id_map {
	uint64_t *keys;
	uint32_t *vals; /* index + 1; 0 = empty */
	size_t cap;
	size_t count;
};

/* Index for key; a new key gets index `count` (the caller extends its arrays). -1: OOM. */
long id_map_get(struct id_map *m, uint64_t key, int *is_new);

void id_map_free(struct id_map *m);

/* ------------------------------------------------------------- block cache */

/* One basic block: the instructions from `start` up to `end` (the source of the branch
 * that ended it). `before` counts those before `end`; `end_len` is the length of the one
 * at `end` (0: not decodable). BLOCK_UNKNOWN: the block could not be decoded (its code is
 * unreadable, or splitting it does not land on `end`); it is remembered so as not to
 * read it again. */
struct block_slot {
	uint64_t start;
	uint64_t end;
	uint64_t meta; /* as loc_meta(pid, generation, 0) */
	uint32_t before;
	uint8_t end_len;
	uint8_t used;
};

#define BLOCK_UNKNOWN UINT32_MAX
/* Longest block decoded: a straight run of code without a taken branch this long is
 * not a block that ran (a stale start after a gap perf did not report). */
#define BLOCK_MAX_BYTES (1u << 20)

struct block_table {
	struct block_slot *slots;
	size_t cap;
	size_t count;
};

static inline uint64_t block_hash(uint64_t start, uint64_t end, uint64_t meta)
{
	return mix64(start ^ mix64(end ^ mix64(meta)));
}

int block_table_grow(struct block_table *t);

/* The slot for the key: the matching entry or the empty slot where it goes. */
static inline struct block_slot *block_find(struct block_table *t, uint64_t start, uint64_t end,
					    uint64_t meta)
{
	size_t j = block_hash(start, end, meta) & (t->cap - 1);
	for (;;) {
		struct block_slot *s = &t->slots[j];
		if (!s->used || (s->start == start && s->end == end && s->meta == meta))
			return s;
		j = (j + 1) & (t->cap - 1);
	}
}

/* ------------------------------------------------------------------ id lists */

/* A small set of process or thread ids (a filter argument). */
struct id_list {
	int32_t *ids;
	size_t count;
};

/* "1,2,3" into `list`; 0, or -EINVAL for anything but a comma-separated list of ids. */
int id_list_parse(const char *text, struct id_list *list);

/* An empty list selects everything. */
int id_list_selects(const struct id_list *list, int32_t id);

#endif /* PTSCOPE_FILTER_TABLES_H */
