/* The engine's output side: contexts and frames as they open and close, the slot window
 * that gives their boundaries times, and the slices written once both ends are known.
 *
 * A frame boundary takes a *slot* (take_slot); the window holds the current run of equal
 * timestamps, whose times are known only once a slot with another timestamp arrives
 * (resolve spreads the run, runs the catch-up clock, and serves what waited: a frame's
 * start or end, an instant, a counter). A frame is written when both its times are known,
 * after its caller when they start at the same time, and a context's spine (the frames
 * that start where it starts) outermost first once the context ends: Perfetto nests
 * slices of equal start in file order. engine.c's module comment has the whole model.
 */
#include "engine_internal.h"

/* ---------------------------------------------------------- contexts and frames */

static void emit_slice(Engine *e, Thread *th, Frame *f, int64_t ix);

Ctx *push_ctx(Engine *e, Thread *th, bool detached, int64_t start_slot)
{
	if (th->nctx == th->pool) {
		th->ctxs = grow(e, th->ctxs, &th->capctx, th->pool + 1, sizeof(Ctx *));
		Ctx *c = calloc(1, sizeof(Ctx));
		if (!c)
			fail_nomem(e);
		th->ctxs[th->pool++] = c;
	}
	Ctx *c = th->ctxs[th->nctx++];
	c->nframes = 0;
	c->spine.n = 0;
	c->detached = detached;
	c->start_slot = start_slot;
	c->start_known = false;
	c->suspend_slot = -1;
	c->suspend_known = false;
	c->switched_in = false;
	c->after_break = false;
	c->interrupting = false;
	line_set_clear(&c->base);
	line_set_clear(&c->before);
	return c;
}

/* Contexts [keep, nctx) end: their spines are written once known. */
void pop_ctxs(Engine *e, Thread *th, size_t keep)
{
	for (size_t j = th->nctx; j-- > keep;)
		retire_spine(e, th, th->ctxs[j]);
	th->nctx = keep;
}

/* ------------------------------------------------------------------- the slots */

static inline void free_frame(Engine *e, Thread *th, int64_t ix)
{
	Frame *f = frame(th, ix);
	f->live = false;
	f->gen++;
	vec_push(e, &th->free_ix, ix);
	e->live_frames--;
}

/* Write a finished frame, then the frames that waited for it. */
static void write_frame(Engine *e, Thread *th, int64_t ix)
{
	while (ix >= 0) {
		Frame *f = frame(th, ix);
		emit_slice(e, th, f, ix);
		int64_t follower = f->first_follower;
		free_frame(e, th, ix);
		/* followers of followers come right after theirs: walk the list depth first */
		while (follower >= 0) {
			Frame *g = frame(th, follower);
			int64_t next = g->next_follower;
			write_frame(e, th, follower);
			follower = next;
		}
		ix = -1;
	}
}

/* Both ends known: write it now, after its caller if they start at the same time (a
 * viewer nests equal starts in file order), or (spine) with its context's group. */
static inline void known_now(Engine *e, Thread *th, int64_t ix)
{
	Frame *f = frame(th, ix);
	if (f->known != (KNOWN_START | KNOWN_END) || f->spine)
		return;
	if (f->parent >= 0) {
		Frame *p = frame(th, f->parent);
		if (p->live && p->gen == f->parent_gen && (p->known & KNOWN_START) &&
		    p->start.time == f->start.time) {
			f->next_follower = -1;
			if (p->last_follower >= 0)
				frame(th, p->last_follower)->next_follower = ix;
			else
				p->first_follower = ix;
			p->last_follower = ix;
			return;
		}
	}
	write_frame(e, th, ix);
}

void wait_for(Engine *e, Thread *th, int64_t slot, int32_t kind, int64_t a,
	      int64_t b, int64_t c)
{
	if (th->nwait == th->capwait)
		th->waiters = grow(e, th->waiters, &th->capwait, th->nwait + 1, sizeof(Waiter));
	uint32_t gen = (kind == W_START || kind == W_END) ? frame(th, a)->gen : 0;
	th->waiters[th->nwait++] = (Waiter){slot, kind, gen, a, b, c};
}

/* The value of a resolved slot that something still refers to: only a live context's
 * start or suspension can be (frames copy theirs when their slot resolves). */
static SlotValue known_slot(Engine *e, Thread *th, int64_t slot)
{
	for (size_t j = th->nctx; j-- > 0;) {
		Ctx *c = th->ctxs[j];
		if (c->start_slot == slot && c->start_known)
			return c->start;
		if (c->suspend_slot == slot && c->suspend_known)
			return c->suspend;
	}
	fail_internal(e, "a resolved slot that no context holds");
}

/* A slot of the window at time t (its share of the run's span): the catch-up clock, then
 * its value. */
static inline void settle_slot(Engine *e, Thread *th, SlotValue *out, const WinSlot *w,
			       int64_t t)
{
	int64_t x = t - th->lasting;
	if (!th->clock_started || x > th->top) {
		th->top = x;
		th->clock_started = true;
	}
	*out = (SlotValue){th->top + th->lasting, w->insn, w->cyc, w->real, w->anchor, w->occurrence};
	if (e->axis == AXIS_CYCLES)
		out->cyc = out->time; /* the cycles a slice says are its length */
	th->lasting += (w->raw & (CALL_SLOT | START_SLOT)) != 0;
}

/* engine._slot_times for the window: spread its run over `span` ns (calls take equal
 * shares; on the count axes, in proportion to the instructions run since its first slot, up
 * to the thread's count now, which the next slot takes, where it ran some), run the catch-up
 * clock (every call and segment start lasts at least 1 ns, so that nesting by time is never
 * ambiguous; time never goes backwards), then serve what waited for these slots. */
void resolve(Engine *e, Thread *th, int64_t span)
{
	size_t n = th->nwin;
	if (!n)
		return;
	const WinSlot *win = th->win;
	if (n > th->capout)
		th->win_out = grow(e, th->win_out, &th->capout, n, sizeof(SlotValue));
	SlotValue *out = th->win_out;
	int64_t value = win[0].raw >> 2;
	if (n == 1) {
		/* The usual run, one slot: its share of the span is none. */
		settle_slot(e, th, out, win, value);
	} else {
		int64_t calls = 0;
		for (size_t k = 0; k < n; k++)
			calls += win[k].raw & CALL_SLOT;
		/* the instructions from the run's first slot to the next slot */
		int64_t ran = th->cum_insn - win[0].insn;
		bool by_insns = (e->axis != AXIS_TIME || e->spread) && ran > 0;
		int64_t div = by_insns ? ran : calls > 0 ? calls : 1, before = 0;
		for (size_t k = 0; k < n; k++) {
			/* numpy's floor division (span >= 0 here, so plain division); in 64
			 * bits when the product fits (a 128-bit division calls libgcc) */
			int64_t share =
			    (uint64_t)span <= UINT32_MAX && (uint64_t)before <= UINT32_MAX
				? (int64_t)((uint64_t)span * (uint64_t)before / (uint64_t)div)
				: (int64_t)(((__int128)span * before) / div);
			int64_t next_insn = k + 1 < n ? win[k + 1].insn : th->cum_insn;
			before = by_insns ? next_insn - win[0].insn
					  : before + (win[k].raw & CALL_SLOT);
			settle_slot(e, th, &out[k], &win[k], value + share);
		}
	}
	int64_t lo = th->done, hi = th->nslots;
	for (size_t j = 0; j < th->nctx; j++) {
		Ctx *c = th->ctxs[j];
		if (!c->start_known && c->start_slot >= lo && c->start_slot < hi) {
			c->start = out[c->start_slot - lo];
			c->start_known = true;
		}
		if (c->suspend_slot >= lo && !c->suspend_known && c->suspend_slot < hi) {
			c->suspend = out[c->suspend_slot - lo];
			c->suspend_known = true;
		}
	}
	th->done = hi;
	th->nwin = 0;
	/* Every waiter waits for a slot of the window: all are served. Serving may not add
	 * waiters (a frame is written, or freed, nothing more). */
	size_t nw = th->nwait;
	th->nwait = 0;
	for (size_t k = 0; k < nw; k++) {
		Waiter w = th->waiters[k];
		SlotValue v = out[w.slot - lo];
		switch (w.kind) {
		case W_START:
		case W_END: {
			Frame *f = frame(th, w.a);
			if (!f->live || f->gen != w.gen)
				fail_internal(e, "a waiter outlived its frame");
			if (w.kind == W_START) {
				f->start = v;
				f->known |= KNOWN_START;
			} else {
				f->end = v;
				f->known |= KNOWN_END;
			}
			known_now(e, th, w.a);
			break;
		}
		case W_INSTANT:
			vec_push(e, &e->inst[I_PID], th->pid);
			vec_push(e, &e->inst[I_TID], th->tid);
			vec_push(e, &e->inst[I_TIME], v.time);
			vec_push(e, &e->inst[I_MSG], w.a);
			break;
		case W_COUNTER:
			vec_push(e, &e->ctr[N_PID], th->pid);
			vec_push(e, &e->ctr[N_TID], th->tid);
			vec_push(e, &e->ctr[N_TIME], v.time);
			vec_push(e, &e->ctr[N_NAME], w.a);
			vec_push(e, &e->ctr[N_VALUE], w.b);
			break;
		}
	}
	if (th->ngroups)
		flush_groups(e, th, false);
}

/* engine.py: _slot (a frame boundary at time t). The window holds one run of equal
 * timestamps: a slot with another timestamp ends the run, which can then be spread. */
int64_t take_slot(Engine *e, Thread *th, int64_t t, int flags)
{
	int64_t real = t;
	/* The anchor, if armed, holds only where the slot's perf time is the branch's own
	 * (a time raised to keep the thread's times in order would not find it). */
	int64_t anchor = 0, occurrence = 0;
	if (th->anchor_next) {
		th->anchor_next = false;
		if (th->ev_occurrence && th->ev_time == real) {
			anchor = (int64_t)th->ev_ip;
			occurrence = th->ev_occurrence;
		}
	}
	if (e->axis == AXIS_INSTRUCTIONS)
		t = th->cum_insn;
	else if (e->axis == AXIS_CYCLES)
		t = th->cum_cyc;
	if (th->nwin) {
		int64_t value = th->last_raw >> 2;
		if (t != value)
			resolve(e, th, t - value);
		else if (th->nwin >= MAX_RUN)
			resolve(e, th, 0);
	}
	int64_t raw = t * 4 + flags;
	if (th->nwin == th->capwin)
		th->win = grow(e, th->win, &th->capwin, th->nwin + 1, sizeof(WinSlot));
	th->win[th->nwin++] = (WinSlot){raw, th->cum_insn, th->cum_cyc, real, anchor, occurrence};
	th->last_raw = raw;
	return th->nslots++;
}

static void set_start(Engine *e, Thread *th, int64_t ix, int64_t slot)
{
	Frame *f = frame(th, ix);
	f->start_slot = slot;
	if (slot >= th->done) {
		wait_for(e, th, slot, W_START, ix, 0, 0);
	} else {
		f->start = known_slot(e, th, slot);
		f->known |= KNOWN_START;
	}
}

int64_t new_frame(Engine *e, Thread *th, Ctx *c, int64_t parent, int32_t name,
		  int64_t start, int64_t addr, int64_t flags, int64_t callsite)
{
	int64_t ix;
	if (th->free_ix.n) {
		ix = th->free_ix.v[--th->free_ix.n];
	} else {
		if (th->nfr == th->capfr)
			th->fr = grow(e, th->fr, &th->capfr, th->nfr + 1, sizeof(Frame));
		ix = (int64_t)th->nfr++;
		th->fr[ix].gen = 0;
		th->fr[ix].lines = (LineSet){0};
	}
	Frame *f = &th->fr[ix];
	f->end_slot = -1;
	f->addr = addr;
	f->flags = ((int64_t)name << NAME_SHIFT) | flags;
	f->callsite = callsite;
	f->seq = th->seq++;
	f->parent = parent;
	f->parent_gen = parent >= 0 ? th->fr[parent].gen : 0;
	f->first_follower = f->last_follower = f->next_follower = -1;
	f->known = 0;
	f->icache = -1;
	f->node = 0;
	f->inl_top = -1;
	line_set_clear(&f->lines);
	f->live = true;
	f->spine = start == c->start_slot;
	if (callsite && parent >= 0 && (th->fr[parent].flags & FL_ARMED)) {
		/* the first call after a setjmp returned: the call it protects */
		th->fr[parent].flags &= ~(int64_t)FL_ARMED;
		int64_t *r = resume_entry(th, parent);
		if (r)
			r[3] = callsite;
	}
	if (f->spine)
		vec_push(e, &c->spine, ix);
	if (++e->live_frames > e->peak_frames)
		e->peak_frames = e->live_frames;
	set_start(e, th, ix, start);
	return ix;
}

/* engine.py: _close */
void close_frame(Engine *e, Thread *th, int64_t ix, int64_t slot, int64_t flags)
{
	/* The inlined bodies open in it end with it, innermost first (their lines went to it
	 * first: lines_down). */
	while (frame(th, ix)->inl_top >= 0) {
		int64_t k = frame(th, ix)->inl_top;
		int64_t up = frame(th, k)->parent;
		frame(th, ix)->inl_top = up == ix ? -1 : up;
		close_frame(e, th, k, slot, flags & FL_OPEN_AT_END);
	}
	Frame *f = frame(th, ix);
	f->end_slot = slot;
	f->flags |= flags;
	if (slot >= th->done) {
		wait_for(e, th, slot, W_END, ix, 0, 0);
	} else {
		f->end = known_slot(e, th, slot);
		f->known |= KNOWN_END;
		known_now(e, th, ix);
	}
}

/* -------------------------------------------------------------------- writing */

/* Room for one more slice in every output column. They are pushed together (but the
 * slots, kept only with keep_slots), drained together and grow alike, so one length and
 * one capacity stand for all of them: one check per slice instead of one per column. */
static void grow_out(Engine *e)
{
	for (int k = 0; k < NOUT; k++)
		if (e->keep_slots || (k != O_SSLOT && k != O_ESLOT))
			vec_grow(e, &e->out[k]);
}

#define OUT(k, x) (o[k].v[n] = (x), o[k].n = n + 1)

static void emit_slice(Engine *e, Thread *th, Frame *f, int64_t ix)
{
	(void)ix;
	Vec *o = e->out;
	size_t n = o[O_PID].n;
	if (n == o[O_PID].cap)
		grow_out(e);
	bool counted = th->first_update_slot >= 0 && f->end_slot >= th->first_update_slot;
	bool lined = th->first_line_slot >= 0 && f->end_slot >= th->first_line_slot;
	OUT(O_PID, th->pid);
	OUT(O_TID, th->tid);
	OUT(O_START, f->start.time);
	OUT(O_END, f->end.time);
	OUT(O_NAME, f->flags >> NAME_SHIFT);
	OUT(O_ADDR, f->addr);
	OUT(O_INSN, counted ? f->end.insn - f->start.insn : -1);
	OUT(O_CYC, counted ? f->end.cyc - f->start.cyc : -1);
	OUT(O_FLAGS, f->flags & 0xFF);
	if (e->keep_slots) {
		OUT(O_SSLOT, f->start_slot);
		OUT(O_ESLOT, f->end_slot);
	}
	OUT(O_RSTART, f->start.real);
	OUT(O_REND, f->end.real);
	OUT(O_LINES, lined ? f->icache : -1);
	OUT(O_ANCHOR, f->start.anchor);
	OUT(O_OCCURRENCE, f->start.occurrence);
	line_set_clear(&f->lines);
	e->slices_out++;
}

#undef OUT

/* A context ends (or starts over): its spine, outermost first, once all of it is known. */
void retire_spine(Engine *e, Thread *th, Ctx *c)
{
	if (!c->spine.n)
		return;
	if (th->ngroups == th->capgroups)
		th->groups = grow(e, th->groups, &th->capgroups, th->ngroups + 1, sizeof(Group));
	int64_t *ix = malloc(c->spine.n * sizeof(int64_t));
	if (!ix)
		fail_nomem(e);
	memcpy(ix, c->spine.v, c->spine.n * sizeof(int64_t));
	th->groups[th->ngroups++] = (Group){ix, c->spine.n};
	c->spine.n = 0;
	flush_groups(e, th, false);
}

/* Outermost first: the one that ends last, or was found last (a root found by returning
 * into it holds everything found before). */
static int spine_cmp(const void *pa, const void *pb, void *arg)
{
	Thread *th = arg;
	const Frame *a = frame(th, *(const int64_t *)pa), *b = frame(th, *(const int64_t *)pb);
	if (a->end.time != b->end.time)
		return a->end.time > b->end.time ? -1 : 1;
	return a->seq > b->seq ? -1 : a->seq < b->seq;
}

static void sort_spine(Thread *th, int64_t *ix, size_t n)
{
	/* insertion sort: spines are short, and mostly in order already */
	for (size_t i = 1; i < n; i++) {
		int64_t x = ix[i];
		size_t j = i;
		while (j > 0 && spine_cmp(&ix[j - 1], &x, th) > 0) {
			ix[j] = ix[j - 1];
			j--;
		}
		ix[j] = x;
	}
}

void flush_groups(Engine *e, Thread *th, bool force)
{
	size_t kept = 0;
	for (size_t g = 0; g < th->ngroups; g++) {
		Group grp = th->groups[g];
		bool ready = true;
		for (size_t k = 0; k < grp.n && ready; k++)
			ready = frame(th, grp.ix[k])->known == (KNOWN_START | KNOWN_END);
		if (!ready && !force) {
			th->groups[kept++] = grp;
			continue;
		}
		sort_spine(th, grp.ix, grp.n);
		for (size_t k = 0; k < grp.n; k++) {
			Frame *f = frame(th, grp.ix[k]);
			if (f->known == (KNOWN_START | KNOWN_END)) {
				write_frame(e, th, grp.ix[k]);
			} else {
				/* (only when forced at the end: cannot happen once all resolved) */
				free_frame(e, th, grp.ix[k]);
			}
		}
		free(grp.ix);
	}
	th->ngroups = kept;
}
