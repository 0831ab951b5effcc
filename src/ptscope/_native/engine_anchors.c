/* Anchors: which execution of a call instruction started a frame.
 *
 * A slice's drill command (`ptscope insns --after IP:K --count N`) lists exactly its call:
 * perf's instruction listing gives each executed instruction once, in order, and a call or
 * jump instruction's sample has the perf time of that branch's sample. So the call (or
 * tail-call jump) that started a frame is found in the listing as the K-th instruction at
 * its address among those at the branch's perf time, and the frame's instructions are the
 * N that follow. Per thread the engine counts, within one perf time, the branches from
 * each address that can start a frame: calls, and jumps into another function. Not an
 * asynchronous branch (its source is where it interrupted, which runs later), a return
 * (it starts no frame), nor a jump inside one function: the dlfilter drops those, and
 * the same instruction may jump elsewhere another time (a PLT slot's jump goes to the
 * slot's lazy-binding code once, then to the function; a conditional tail call falls
 * through), so `ptscope insns` counts the same way: the calls at that address, and the
 * instructions there followed by one in another function. The call and tail-call handlers
 * arm the slot they take with the count of the branch being applied.
 */
#include "engine_internal.h"

static void occurrences_grow(Engine *e, Occurrences *o)
{
	uint32_t cap = o->cap ? o->cap * 2 : 16;
	Occurrence *v = calloc(cap, sizeof(Occurrence));
	if (!v)
		fail_nomem(e);
	for (uint32_t k = 0; k < o->cap; k++) {
		Occurrence x = o->v[k];
		if (x.stamp != o->gen)
			continue;
		uint32_t h = line_hash(x.ip) & (cap - 1);
		while (v[h].stamp == o->gen)
			h = (h + 1) & (cap - 1);
		v[h] = x;
	}
	free(o->v);
	o->v = v;
	o->cap = cap;
}

/* Which branch from `ip` at perf time `time` of this thread this one is (1-based). */
uint32_t occurrence_of(Engine *e, Occurrences *o, uint64_t ip, int64_t time)
{
	if (time != o->time || !o->gen) {
		o->time = time;
		o->n = 0;
		if (++o->gen == 0) { /* the stamps wrapped: forget them all */
			if (o->v)
				memset(o->v, 0, o->cap * sizeof(Occurrence));
			o->gen = 1;
		}
	}
	if (2 * (o->n + 1) > o->cap)
		occurrences_grow(e, o);
	uint32_t mask = o->cap - 1, h = line_hash(ip) & mask;
	for (; o->v[h].stamp == o->gen; h = (h + 1) & mask)
		if (o->v[h].ip == ip)
			return ++o->v[h].count;
	o->v[h] = (Occurrence){ip, 1, o->gen};
	o->n++;
	return 1;
}
