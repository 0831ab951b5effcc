/* What the engine's files share; not an interface (engine.h is one).
 *
 * The engine is one job cut into files that each hold one part of it:
 *   engine.c            the rules (one handler per engine.py method), threads, failures,
 *                       and the entry points of engine.h;
 *   engine_window.c     contexts, frames and the slot window: when a frame's times are
 *                       known, and its slice written (in the order a viewer needs);
 *   engine_anchors.c    which execution of a call instruction started a frame (a slice's
 *                       drill command);
 *   engine_lookahead.c  a landing in one of several activations armed at the same resume
 *                       point, and the events held until they tell which;
 *   line_set.c          the code-line sets of i-cache footprints (no engine in it).
 * They are linked into one shared object with link-time optimisation (setup.py), so the
 * calls between them cost what calls within one file did.
 */
#ifndef PTSCOPE_ENGINE_INTERNAL_H
#define PTSCOPE_ENGINE_INTERNAL_H

#include "engine.h"

/* Shared between the engine's files, never seen outside the shared object. */
#define INTERNAL __attribute__((visibility("hidden")))

/* engine.c: failures (they longjmp to the entry point that was called), growth, and the
 * rules that the other files call back into. */
INTERNAL void branch_body(Engine *e, Thread *th, int kind, int state, bool in_tx, int32_t src,
			  int32_t dst, int64_t time, uint64_t insns, uint64_t cycles,
			  int64_t gap_time, uint64_t gap_insns, const uint64_t *lines,
			  size_t nlines);
INTERNAL void break_body(Engine *e, Thread *th);
INTERNAL void close_above(Engine *e, Thread *th, Ctx *c, size_t index, int64_t slot, int64_t flags);
INTERNAL void counter_body(Engine *e, Thread *th, int64_t time, int64_t name, int64_t value);
INTERNAL _Noreturn void fail_internal(Engine *e, const char *what);
INTERNAL _Noreturn void fail_nomem(Engine *e);
INTERNAL void *grow(Engine *e, void *p, size_t *cap, size_t need, size_t elem);
INTERNAL bool inside_guard(Thread *th, Ctx *c, size_t j);
INTERNAL void land_on(Engine *e, Thread *th, size_t ci, size_t fi, int64_t t);
INTERNAL int64_t *resume_entry(Thread *th, int64_t ix);
INTERNAL ptrdiff_t resumed_frame(Engine *e, Thread *th, Ctx *c, ptrdiff_t top, int32_t fn,
				 int32_t dst);
INTERNAL bool resumes_at(Thread *th, int64_t ix, uint64_t ip);

/* engine_window.c: contexts, frames and the slot window; slices written in order. */
INTERNAL void close_frame(Engine *e, Thread *th, int64_t ix, int64_t slot, int64_t flags);
INTERNAL void flush_groups(Engine *e, Thread *th, bool force);
INTERNAL int64_t new_frame(Engine *e, Thread *th, Ctx *c, int64_t parent, int32_t name,
			   int64_t start, int64_t addr, int64_t flags, int64_t callsite);
INTERNAL void pop_ctxs(Engine *e, Thread *th, size_t keep);
INTERNAL Ctx *push_ctx(Engine *e, Thread *th, bool detached, int64_t start_slot);
INTERNAL void resolve(Engine *e, Thread *th, int64_t span);
INTERNAL void retire_spine(Engine *e, Thread *th, Ctx *c);
INTERNAL int64_t take_slot(Engine *e, Thread *th, int64_t t, int flags);
INTERNAL void wait_for(Engine *e, Thread *th, int64_t slot, int32_t kind, int64_t a,
		       int64_t b, int64_t c);

/* engine_anchors.c: which execution of a call instruction started a frame. */
INTERNAL uint32_t occurrence_of(Engine *e, Occurrences *o, uint64_t ip, int64_t time);

/* engine_lookahead.c: ambiguous landings held until the events tell. */
INTERNAL void hold(Engine *e, Thread *th, int kind, int state, bool in_tx, int32_t src,
		   int32_t dst, int64_t time, uint64_t insns, uint64_t cycles, int64_t gap_time,
		   uint64_t gap_insns, const uint64_t *lines, size_t nlines);
INTERNAL bool look_ahead(Engine *e, Thread *th, size_t ci, size_t fi, int32_t dst, int64_t t);
INTERNAL void settle_all(Engine *e, Thread *th);

/* ------------------------------------------------------ small and everywhere */

/* Room for one more (from empty: for `hint` at once). */
static inline void vec_grow(Engine *e, Vec *a)
{
	a->v = grow(e, a->v, &a->cap, a->n + 1 > a->hint ? a->n + 1 : a->hint, sizeof(int64_t));
}

static inline void vec_push(Engine *e, Vec *a, int64_t x)
{
	if (a->n == a->cap)
		vec_grow(e, a);
	a->v[a->n++] = x;
}

static inline Ctx *cur(Thread *th)
{
	return th->ctxs[th->nctx - 1];
}

static inline Frame *frame(Thread *th, int64_t ix)
{
	return &th->fr[ix];
}

static inline void push_handle(Engine *e, Ctx *c, int32_t fn, int64_t ix)
{
	if (c->nframes == c->capframes)
		c->frames = grow(e, c->frames, &c->capframes, c->nframes + 1, sizeof(Handle));
	c->frames[c->nframes++] = (Handle){ix, fn};
}

static inline int fn_flags(Engine *e, int32_t fn)
{
	return (size_t)fn < e->nfn_flags ? e->fn_flags[fn] : 0;
}

static inline bool switches_stack(Engine *e, int32_t fn)
{
	return fn_flags(e, fn) & FN_SWITCHES;
}

/* engine.py: _after_call */
static inline bool after_call(Thread *th, int64_t ix, uint64_t ip)
{
	uint64_t site = (uint64_t)frame(th, ix)->callsite;
	return !site || (ip > site && ip - site <= MAX_INSN);
}

/* Line sets with the engine's failure: out of memory breaks the engine. */
static inline void ls_insert(Engine *e, LineSet *s, uint64_t key)
{
	if (!line_set_insert(s, key))
		fail_nomem(e);
}

static inline void ls_merge(Engine *e, LineSet *into, LineSet *from)
{
	if (!line_set_merge(into, from))
		fail_nomem(e);
}

#endif /* PTSCOPE_ENGINE_INTERNAL_H */
