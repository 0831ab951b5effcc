/* A set of 64-byte code lines (address >> 6, stored as line + 1): what a frame executed,
 * for its i-cache footprint. Up to LINE_SET_SMALL lines it is a plain array (most frames
 * run a few lines: no hashing, and emptying it costs nothing); beyond, an open-addressing
 * table (0 empty, at most half full).
 *
 * No engine in it: a set that cannot grow says so (false), and its caller decides what
 * running out of memory means (the engine's wrappers in engine_internal.h fail). */
#ifndef PTSCOPE_LINE_SET_H
#define PTSCOPE_LINE_SET_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
	uint64_t *v;
	uint32_t n, cap;
	bool hashed;
} LineSet;

#define LINE_SET_SMALL 8

/* The multiplicative hash of the line tables (the engine's other address tables use it
 * too). */
static inline uint32_t line_hash(uint64_t key)
{
	key *= 0x9E3779B97F4A7C15u;
	return (uint32_t)(key >> 32);
}

static inline void line_table_put(uint64_t *v, uint32_t cap, uint64_t key, uint32_t *n)
{
	uint32_t mask = cap - 1;
	for (uint32_t i = line_hash(key) & mask;; i = (i + 1) & mask) {
		if (v[i] == key)
			return;
		if (!v[i]) {
			v[i] = key;
			++*n;
			return;
		}
	}
}

/* A bigger table (or the first one, from the small array) holding what s holds; false:
 * out of memory (s unchanged). */
bool line_set_rehash(LineSet *s);

/* false: out of memory (key not added). */
static inline bool line_set_insert(LineSet *s, uint64_t key)
{
	if (!s->hashed) {
		for (uint32_t i = 0; i < s->n; i++)
			if (s->v[i] == key)
				return true;
		if (s->n < LINE_SET_SMALL) {
			if (!s->v) {
				s->v = malloc(LINE_SET_SMALL * sizeof(uint64_t));
				if (!s->v)
					return false;
				s->cap = LINE_SET_SMALL;
			}
			s->v[s->n++] = key;
			return true;
		}
		if (!line_set_rehash(s))
			return false;
	} else if ((s->n + 1) * 2 > s->cap && !line_set_rehash(s)) {
		return false;
	}
	line_table_put(s->v, s->cap, key, &s->n);
	return true;
}

/* Empty it: a small array just forgets; a table is given back (it was a big frame's). */
static inline void line_set_clear(LineSet *s)
{
	if (s->hashed) {
		free(s->v);
		s->v = NULL;
		s->cap = 0;
		s->hashed = false;
	}
	s->n = 0;
}

/* into |= from; from becomes empty. false: out of memory (into holds part of from). */
bool line_set_merge(LineSet *into, LineSet *from);

#endif /* PTSCOPE_LINE_SET_H */
