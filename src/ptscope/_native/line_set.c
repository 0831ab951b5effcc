/* Code-line sets (line_set.h): the parts that are not inline. */
#include "line_set.h"

bool line_set_rehash(LineSet *s)
{
	uint32_t cap = s->hashed ? s->cap * 2 : 4 * LINE_SET_SMALL;
	if (cap < s->cap)
		return false;
	uint64_t *v = calloc(cap, sizeof(uint64_t));
	if (!v)
		return false;
	uint32_t n = 0;
	if (s->hashed) {
		for (uint32_t i = 0; i < s->cap; i++)
			if (s->v[i])
				line_table_put(v, cap, s->v[i], &n);
	} else {
		for (uint32_t i = 0; i < s->n; i++)
			line_table_put(v, cap, s->v[i], &n);
	}
	free(s->v);
	s->v = v;
	s->cap = cap;
	s->n = n;
	s->hashed = true;
	return true;
}

bool line_set_merge(LineSet *into, LineSet *from)
{
	if (!from->n)
		return true;
	if (into->n == 0) { /* (an empty set is never a table: clearing gives tables back) */
		LineSet t = *into;
		*into = *from;
		*from = t;
		line_set_clear(from);
		return true;
	}
	if (from->hashed) {
		for (uint32_t i = 0; i < from->cap; i++)
			if (from->v[i] && !line_set_insert(into, from->v[i]))
				return false;
	} else {
		for (uint32_t i = 0; i < from->n; i++)
			if (!line_set_insert(into, from->v[i]))
				return false;
	}
	line_set_clear(from);
	return true;
}
