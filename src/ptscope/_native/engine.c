/* The trace-segment engine in C, streaming: columns of branch records in, finished slices
 * out as soon as they are known, rule for rule the twin of src/ptscope/reconstruct/engine.py.
 *
 * engine.py is the reference: its module docstring explains the model (frames, contexts,
 * landing, stitching, roots, slots) and every handler here carries the name of the Python
 * method it ports. The reference keeps the whole history and computes times in a final
 * pass; this engine gives the same slices but keeps only what can still change:
 *
 * - the open frames of every context (a frame lives in a per-thread arena and its arena
 *   entry is reused once its slice is written);
 * - the current run of equal timestamps (the slot window): a slot's time is known once a
 *   slot with another timestamp arrives, so the run can be spread (engine.py: "Time");
 *   what waits for a slot's time (a frame's start or end, a context's start or suspension,
 *   an instant, a counter) is a *waiter*, served when the slot resolves;
 * - frames that start where their context starts (the inferred roots and the first frame,
 *   the *spine*): they share one start time, and Perfetto nests slices of equal start in
 *   file order, so a spine is written outermost first once its context ends; likewise a
 *   frame that starts at the same time as its caller is written after its caller.
 *
 * Stitching changes only parents, which the output does not carry (Perfetto nests slices
 * by time), so this engine keeps no parent links; depth, where a caller wants it, is
 * computed from the times (the binding's nest_depths()).
 *
 * Names are plain ints here: location ids index the location columns its caller registers
 * (function name id, entry address, symbol offset, ip); the caller (for Python:
 * reconstruct/_cengine.c and fast_engine.py) turns them back into strings.
 *
 * This file holds the rules, the threads and the entry points; the other parts of the
 * engine are files of their own (engine_internal.h lists them): the slot window and the
 * output (engine_window.c), anchors (engine_anchors.c), the lookahead of ambiguous
 * landings (engine_lookahead.c), code-line sets (line_set.c). There is no Python in any
 * of them (engine.h is the interface): the Python extension and, in the design of decoding
 * inside perf, the dlfilter link the same files.
 *
 * Errors: bad input is refused before anything changes (unknown location ids, times whose
 * slot value does not fit in 64 bits); running out of memory, or a counter overflowing,
 * longjmps back to the entry point that was called, which returns a PTSCOPE_ENGINE_* code
 * with `message` set; the engine then refuses further work (its state is half-updated)
 * but can be freed.
 */
#include "engine_internal.h"

#include <stdarg.h>
#include <stdio.h>

/* model._classify, as kind | state << 4 (a test compares all 32768 values). */
static uint8_t classify(uint32_t flags)
{
	if (flags & BF_INLINE)
		return K_INLINE; /* not a branch: no state, no other flag counts */
	bool begin = flags & BF_TRACE_BEGIN, end = flags & BF_TRACE_END;
	if (begin && end)
		return K_NONE; /* `tr strt tr end`: nothing executed */
	int state = begin ? S_START : end ? S_END : S_NONE;
	uint32_t f = flags & ~(uint32_t)(BF_TRACE_BEGIN | BF_TRACE_END | BF_IN_TX |
					 BF_INTR_DISABLE | BF_INTR_TOGGLE);
	int kind;
	if (f & BF_TX_ABORT)
		kind = K_TX_ABORT;
	else if (f & BF_VMENTRY)
		kind = K_VMENTRY;
	else if (f & BF_VMEXIT)
		kind = K_VMEXIT;
	else if (f & BF_SYSCALLRET)
		kind = f & BF_CALL ? K_SYSCALL : K_SYSRET;
	else if (f & BF_INTERRUPT)
		kind = f & BF_RETURN ? K_IRET : f & BF_ASYNC ? K_HWINT : K_SWINT;
	else if (f & BF_ASYNC)
		kind = K_ASYNC;
	else if (f & BF_CALL)
		kind = K_CALL;
	else if (f & BF_RETURN)
		kind = K_RETURN;
	else if (f & BF_CONDITIONAL)
		kind = K_CJUMP;
	else if (f & BF_BRANCH)
		kind = K_JUMP;
	else
		kind = K_NONE;
	return (uint8_t)(kind | state << 4);
}

uint8_t ptscope_kind_state[FLAG_TABLE_SIZE];

void ptscope_engine_setup(void)
{
	for (uint32_t f = 0; f < FLAG_TABLE_SIZE; f++)
		ptscope_kind_state[f] = classify(f);
}

/* ------------------------------------------------------------------ failures */

static _Noreturn void fail(Engine *e)
{
	longjmp(e->jb, 1);
}

/* Set the engine's failure (`error`, and `message` from the format); returns `error`. An
 * entry point returns it as it is (bad input, refused before anything changed); the rules
 * fail() after it. */
static __attribute__((format(printf, 3, 4))) int refuse(Engine *e, int error,
							const char *format, ...)
{
	va_list args;
	va_start(args, format);
	vsnprintf(e->message, sizeof(e->message), format, args);
	va_end(args);
	e->error = error;
	return error;
}

_Noreturn void fail_nomem(Engine *e)
{
	refuse(e, PTSCOPE_ENGINE_NOMEM, "out of memory");
	fail(e);
}

_Noreturn void fail_internal(Engine *e, const char *what)
{
	refuse(e, PTSCOPE_ENGINE_INTERNAL, "engine: internal inconsistency (%s)", what);
	fail(e);
}

void *grow(Engine *e, void *p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return p;
	size_t nc = *cap ? *cap : need > 8 ? need : 8; /* from empty: what it needs at once */
	while (nc < need) {
		if (nc > SIZE_MAX / 2 / elem)
			fail_nomem(e);
		/* x1.5, and x2 once big: each growth copies (a drained output column grows
		 * to its last batch's size at once: Vec.hint, set by _cengine.c's vec_block) */
		nc += nc >= 4096 ? nc : nc / 2 + 8;
	}
	void *np = realloc(p, nc * elem);
	if (!np)
		fail_nomem(e);
	*cap = nc;
	return np;
}

/* ------------------------------------------------------------------- threads */

static uint64_t key_hash(int64_t pid, int64_t tid)
{
	uint64_t h = (uint64_t)pid * 0x9E3779B97F4A7C15u ^ (uint64_t)tid * 0xC2B2AE3D27D4EB4Fu;
	return h ^ (h >> 29);
}

static Thread *find_thread(Engine *e, int64_t pid, int64_t tid)
{
	if (!e->mapcap)
		return NULL;
	size_t mask = e->mapcap - 1;
	for (size_t i = key_hash(pid, tid) & mask;; i = (i + 1) & mask) {
		Slot *s = &e->map[i];
		if (!s->index)
			return NULL;
		if (s->pid == pid && s->tid == tid)
			return e->threads[s->index - 1];
	}
}

static void map_insert(Slot *map, size_t cap, int64_t pid, int64_t tid, size_t index)
{
	size_t mask = cap - 1;
	size_t i = key_hash(pid, tid) & mask;
	while (map[i].index)
		i = (i + 1) & mask;
	map[i] = (Slot){pid, tid, index};
}

/* ------------------------------------------------------- i-cache footprint */

/* A slice's icache_lines are the distinct code lines its thread executed between its start
 * and end slots (engine.py computes exactly that from the events' lines). Streaming, the
 * lines of an event go to the innermost open frame (the current context's top frame, or
 * the context's base when it has none); a frame that ends gives its lines to the frame
 * that encloses it in time (the one below it in its context, or the context's base), and
 * its count is taken then. Contexts hand theirs on as they end (stitch_lines). */

/* Where lines run in frame ix go: its innermost inlined body open, or itself. */
static inline LineSet *frame_lines(Thread *th, int64_t ix)
{
	Frame *f = frame(th, ix);
	return f->inl_top >= 0 ? &frame(th, f->inl_top)->lines : &f->lines;
}

static inline LineSet *line_sink(Thread *th)
{
	Ctx *c = cur(th);
	return c->nframes ? frame_lines(th, c->frames[c->nframes - 1].ix) : &c->base;
}

/* The inlined frames open in frame ix end: each counts its lines and gives them to the
 * frame it is inlined in (closing them is close_frame's). */
static void lines_inlined(Engine *e, Thread *th, int64_t ix)
{
	for (int64_t k = frame(th, ix)->inl_top; k >= 0;) {
		Frame *g = frame(th, k);
		g->icache = g->lines.n;
		ls_merge(e, &frame(th, g->parent)->lines, &g->lines);
		k = g->parent == ix ? -1 : g->parent;
	}
}

static void add_lines(Engine *e, Thread *th, const uint64_t *lines, size_t n)
{
	if (!n)
		return;
	LineSet *s = line_sink(th);
	for (size_t k = 0; k < n; k++)
		ls_insert(e, s, lines[k] + 1);
	if (th->first_line_slot < 0)
		th->first_line_slot = th->nslots;
}

/* Frames [from, nframes) of c end: top down, each counts its lines and gives them to the
 * frame below, the lowest to `into` (NULL: frame from-1, or c's base when from is 0). */
static void lines_down(Engine *e, Thread *th, Ctx *c, size_t from, LineSet *into)
{
	if (!e->lines_on)
		return;
	for (size_t k = c->nframes; k-- > from;) {
		lines_inlined(e, th, c->frames[k].ix);
		Frame *f = frame(th, c->frames[k].ix);
		f->icache = f->lines.n;
		LineSet *below = k > from || !into
				     ? (k ? frame_lines(th, c->frames[k - 1].ix) : &c->base)
				     : into;
		ls_merge(e, below, &f->lines);
	}
}

/* Contexts above ci end (ci = -1: all of them) and their frames with them, at the slots
 * land_on and end_every_frame use: a context's frames end where it does, an older
 * context's where the detached context above it began. Lines flow into the frames that
 * end later (a nested context's into the context below); those after a detached start go
 * to `landed` only (the frame a landing resumes, which spans them), or nowhere. */
static void stitch_lines(Engine *e, Thread *th, ptrdiff_t ci, LineSet *landed)
{
	if (!e->lines_on)
		return;
	LineSet late = {0};
	for (ptrdiff_t j = (ptrdiff_t)th->nctx - 1; j > ci; j--) {
		Ctx *c = th->ctxs[j];
		lines_down(e, th, c, 0, NULL);
		ls_merge(e, &c->base, &c->before);
		if (c->interrupting) {
			/* A handler: into the frame it interrupted (below the [syscall] frame that
			 * ended where the handler began). */
			Ctx *b = th->ctxs[j - 1];
			ls_merge(e, frame_lines(th, b->frames[b->nframes - 2].ix), &c->base);
		} else if (c->detached || j == 0) {
			ls_merge(e, &late, &c->base);
		} else {
			Ctx *b = th->ctxs[j - 1];
			ls_merge(e, b->nframes ? frame_lines(th, b->frames[b->nframes - 1].ix)
					       : &b->base,
				 &c->base);
		}
	}
	if (landed)
		ls_merge(e, landed, &late);
	free(late.v);
}

/* engine.py: _close_above */
void close_above(Engine *e, Thread *th, Ctx *c, size_t index, int64_t slot, int64_t flags)
{
	lines_down(e, th, c, index + 1, NULL);
	for (size_t k = index + 1; k < c->nframes; k++)
		close_frame(e, th, c->frames[k].ix, slot, flags);
	c->nframes = index + 1;
}

/* --------------------------------------------------------------- new threads */

/* engine.py: _Thread.__init__ */
static Thread *new_thread(Engine *e, int64_t pid, int64_t tid, int64_t time)
{
	if ((e->nthreads + 1) * 2 > e->mapcap) {
		size_t cap = e->mapcap ? e->mapcap * 2 : 64;
		Slot *map = calloc(cap, sizeof(Slot));
		if (!map)
			fail_nomem(e);
		for (size_t i = 0; i < e->nthreads; i++)
			map_insert(map, cap, e->threads[i]->pid, e->threads[i]->tid, i + 1);
		free(e->map);
		e->map = map;
		e->mapcap = cap;
	}
	e->threads = grow(e, e->threads, &e->capthreads, e->nthreads + 1, sizeof(Thread *));
	Thread *th = calloc(1, sizeof(Thread));
	if (!th)
		fail_nomem(e);
	e->threads[e->nthreads++] = th;
	map_insert(e->map, e->mapcap, pid, tid, e->nthreads);
	th->pid = pid;
	th->tid = tid;
	th->last_time = time;
	th->first_update_slot = -1;
	th->first_line_slot = -1;
	if (e->nthreads == 1 || time < e->first_time)
		e->first_time = time;
	/* The first slot starts the thread's first segment; the first context starts there. */
	take_slot(e, th, time, START_SLOT);
	push_ctx(e, th, true, 0);
	return th;
}

/* engine.py: TraceSegmentEngine._thread */
static Thread *thread_of(Engine *e, int64_t pid, int64_t tid, int64_t time)
{
	Thread *th = e->last;
	if (th && th->pid == pid && th->tid == tid)
		return th;
	th = find_thread(e, pid, tid);
	if (!th)
		th = new_thread(e, pid, tid, time);
	e->last = th;
	return th;
}

/* engine.py: _count */
static void count(Engine *e, Thread *th, uint64_t insns, uint64_t cycles)
{
	int64_t ci, cc;
	if (insns > (uint64_t)INT64_MAX || cycles > (uint64_t)INT64_MAX ||
	    __builtin_add_overflow(th->cum_insn, (int64_t)insns, &ci) ||
	    __builtin_add_overflow(th->cum_cyc, (int64_t)cycles, &cc)) {
		refuse(e, PTSCOPE_ENGINE_OVERFLOW, "instruction or cycle counts do not fit in 64 bits");
		fail(e);
	}
	th->cum_insn = ci;
	th->cum_cyc = cc;
	/* They hold from the next slot on. */
	if (th->first_update_slot < 0)
		th->first_update_slot = th->nslots;
}

/* engine.py: _unexpected (the message is formatted in Python) */
static void unexpected(Engine *e, Thread *th, int what, int32_t fn, int32_t fn2)
{
	e->unexpected++;
	if (e->nexamples < e->max_examples)
		e->examples[e->nexamples++] = (Example){what, th->tid, th->last_time, fn, fn2};
}

/* ------------------------------------------------------------- stack surgery */

static void break_segment(Engine *e, Thread *th, int64_t slot);

/* engine.py: _first_frame (a context begun by a segment break starts its segment here) */
static void first_frame(Engine *e, Thread *th, Ctx *c, int32_t loc, int64_t flags, int64_t t)
{
	if (c->after_break)
		break_segment(e, th, take_slot(e, th, t, START_SLOT));
	int32_t fn = e->loc_fn[loc];
	int64_t ix = new_frame(e, th, c, -1, fn, c->start_slot, e->loc_entry[loc], flags, 0);
	ls_merge(e, &frame(th, ix)->lines, &c->base); /* it began where the context did */
	push_handle(e, c, fn, ix);
}

/* engine.py: _break */
static void break_segment(Engine *e, Thread *th, int64_t slot)
{
	Ctx *c = cur(th);
	if (!c->nframes && c->detached) {
		ls_merge(e, &c->before, &c->base);
		retire_spine(e, th, c);
		c->start_slot = slot;
		c->start_known = false;
		c->after_break = false;
		return;
	}
	c->suspend_slot = slot;
	c->suspend_known = false;
	push_ctx(e, th, true, slot);
	e->segments_started++;
}

/* engine.py: _push_detached */
static Ctx *push_detached(Engine *e, Thread *th, int64_t t)
{
	break_segment(e, th, take_slot(e, th, t, START_SLOT));
	return cur(th);
}

/* engine.py: _add_root */
static void add_root(Engine *e, Thread *th, Ctx *c, int32_t loc, int64_t t)
{
	int64_t slot = take_slot(e, th, t, 0);
	int32_t fn = e->loc_fn[loc];
	int64_t root =
	    new_frame(e, th, c, -1, fn, c->start_slot, e->loc_entry[loc], FL_INFERRED, 0);
	LineSet *held = &frame(th, root)->lines;
	ls_merge(e, held, &c->base);
	lines_down(e, th, c, 0, held);
	for (size_t k = 0; k < c->nframes; k++)
		close_frame(e, th, c->frames[k].ix, slot, 0);
	c->nframes = 0;
	push_handle(e, c, fn, root);
	e->roots_inferred++;
}

/* The call-site ranges whose exceptions land at location `loc` (engine.py: the
 * landing_pads lookup), asked once per location through the caller's function. */
static void landing_ranges(Engine *e, int32_t loc, const int64_t **ranges, size_t *n)
{
	*ranges = NULL;
	*n = 0;
	if (!e->landing_pads)
		return;
	for (size_t k = 0; k < e->pad_index.n; k += 3) {
		if (e->pad_index.v[k] == loc) {
			*ranges = e->pad_ranges.v + e->pad_index.v[k + 1];
			*n = (size_t)e->pad_index.v[k + 2];
			return;
		}
	}
	int64_t first = (int64_t)e->pad_ranges.n;
	const int64_t *pairs = NULL;
	size_t count = e->landing_pads(e->landing_ctx, loc, &pairs);
	for (size_t i = 0; pairs && i < 2 * count; i++)
		vec_push(e, &e->pad_ranges, pairs[i]);
	if (!pairs)
		count = 0;
	vec_push(e, &e->pad_index, loc);
	vec_push(e, &e->pad_index, first);
	vec_push(e, &e->pad_index, (int64_t)count);
	*ranges = e->pad_ranges.v + first;
	*n = count;
}

/* A setjmp returned to `ip` in frame `ix` (engine.py: _Thread.resume). */
static void set_resume_point(Engine *e, Thread *th, int64_t ix, uint64_t ip)
{
	Vec *r = &th->resume;
	if (r->n >= 4 * 64 && r->n == r->cap) {
		/* forget the points of frames that are gone */
		size_t kept = 0;
		for (size_t k = 0; k < r->n; k += 4) {
			Frame *f = frame(th, r->v[k]);
			if (f->live && f->gen == (uint32_t)r->v[k + 1]) {
				memmove(&r->v[kept], &r->v[k], 4 * sizeof(int64_t));
				kept += 4;
			}
		}
		r->n = kept;
	}
	vec_push(e, r, ix);
	vec_push(e, r, frame(th, ix)->gen);
	vec_push(e, r, (int64_t)ip);
	vec_push(e, r, 0);
	frame(th, ix)->flags |= FL_ARMED;
}

/* The newest resume entry of frame ix (its last four values), or NULL. */
int64_t *resume_entry(Thread *th, int64_t ix)
{
	uint32_t gen = frame(th, ix)->gen;
	for (size_t k = th->resume.n; k >= 4; k -= 4) {
		if (th->resume.v[k - 4] == ix && (uint32_t)th->resume.v[k - 3] == gen)
			return &th->resume.v[k - 4];
	}
	return NULL;
}

bool resumes_at(Thread *th, int64_t ix, uint64_t ip)
{
	const int64_t *r = resume_entry(th, ix);
	return r && (uint64_t)r[2] == ip;
}

/* engine.py: _inside_guard (frame j of c is inside the first call it made after its setjmp
 * returned) */
bool inside_guard(Thread *th, Ctx *c, size_t j)
{
	if (j + 1 >= c->nframes)
		return false;
	const int64_t *r = resume_entry(th, c->frames[j].ix);
	return r && r[3] && r[3] == frame(th, c->frames[j + 1].ix)->callsite;
}

/* engine.py: _resumed_frame (top may be -1) */
ptrdiff_t resumed_frame(Engine *e, Thread *th, Ctx *c, ptrdiff_t top, int32_t fn,
			int32_t dst)
{
	ptrdiff_t first = -1, i;
	for (i = top; i >= 0; i--) {
		if (c->frames[i].fn == fn) {
			if (first >= 0)
				break;
			first = i;
		}
	}
	if (i < 0)
		return first;
	uint64_t ip = e->loc_ip[dst];
	const int64_t *ranges = NULL;
	size_t nranges = 0;
	bool asked = false;
	for (i = first; i >= 0; i--) {
		if (c->frames[i].fn != fn)
			continue;
		if (resumes_at(th, c->frames[i].ix, ip))
			return i;
		if (e->landing_pads && (size_t)i + 1 < c->nframes) {
			if (!asked) {
				landing_ranges(e, dst, &ranges, &nranges);
				asked = true;
			}
			uint64_t site = (uint64_t)frame(th, c->frames[i + 1].ix)->callsite;
			for (size_t k = 0; k < nranges; k++)
				if ((uint64_t)ranges[2 * k] <= site && site < (uint64_t)ranges[2 * k + 1])
					return i;
		}
	}
	return first;
}

/* engine.py: _stopped_in */
static bool stopped_in(Thread *th, Ctx *c, size_t i)
{
	size_t n = c->nframes;
	return i + 1 == n || (i + 2 == n && (frame(th, c->frames[n - 1].ix)->flags & FL_SYNTHETIC));
}

/* engine.py: _end_frames (lines are the caller's business) */
static void end_frames(Engine *e, Thread *th, Ctx *c, size_t index, int64_t end, int64_t flags,
		       bool interrupted)
{
	size_t top = c->nframes;
	if (interrupted && top-- > index)
		close_frame(e, th, c->frames[top].ix, c->suspend_slot, FL_OPEN_AT_END);
	for (size_t k = index; k < top; k++)
		close_frame(e, th, c->frames[k].ix, end, flags);
}

/* engine.py: _land_on */
void land_on(Engine *e, Thread *th, size_t ci, size_t fi, int64_t t)
{
	Ctx *target = th->ctxs[ci];
	int64_t end = take_slot(e, th, t, 0);
	stitch_lines(e, th, (ptrdiff_t)ci, frame_lines(th, target->frames[fi].ix));
	bool interrupted = false; /* the context above interrupts the one being closed */
	for (size_t j = th->nctx - 1; j > ci; j--) {
		Ctx *c = th->ctxs[j];
		end_frames(e, th, c, 0, end, 0, interrupted);
		c->nframes = 0;
		interrupted = false;
		if (c->detached) {
			e->stitched++;
			if (c->interrupting)
				interrupted = true; /* siglongjmp: the interrupted frame ends now */
			else
				end = th->ctxs[j - 1]->suspend_slot;
		}
	}
	lines_down(e, th, target, fi + 1, NULL);
	end_frames(e, th, target, fi + 1, end, interrupted ? 0 : FL_OPEN_AT_END, interrupted);
	target->nframes = fi + 1;
	pop_ctxs(e, th, ci + 1);
	target->suspend_slot = -1;
	target->suspend_known = false;
}

/* engine.py: _land (at: the location landed at, -1 for none) */
static bool land(Engine *e, Thread *th, int32_t fn, int64_t t, bool entry, int32_t at)
{
	for (size_t ci = th->nctx - 1; ci-- > 0;) {
		if (th->ctxs[ci + 1]->switched_in)
			break; /* older contexts are other stacks */
		Ctx *target = th->ctxs[ci];
		size_t fi;
		if (at >= 0) {
			ptrdiff_t k = resumed_frame(e, th, target, (ptrdiff_t)target->nframes - 1, fn, at);
			if (k < 0)
				continue;
			fi = (size_t)k;
		} else {
			fi = target->nframes;
			while (fi > 0 && target->frames[fi - 1].fn != fn)
				fi--;
			if (!fi)
				continue;
			fi--;
		}
		if (entry && !stopped_in(th, target, fi))
			continue;
		if (at >= 0 && look_ahead(e, th, ci, fi, at, t))
			return true;
		land_on(e, th, ci, fi, t);
		return true;
	}
	return false;
}

/* engine.py: _sync_source */
static Ctx *sync_source(Engine *e, Thread *th, int32_t src, int64_t t)
{
	Ctx *c = cur(th);
	int32_t fn = e->loc_fn[src];
	size_t n = c->nframes;
	if (n && c->frames[n - 1].fn == fn)
		return c;
	/* A stub's jump to PLT0 that the decoders dropped (engine.py: _sync_source). */
	if (n && (fn_flags(e, fn) & FN_PLT0) && (fn_flags(e, c->frames[n - 1].fn) & FN_PLT_STUB))
		return c;
	for (size_t i = n >= 2 ? n - 1 : 0; i-- > 0;) {
		if (c->frames[i].fn == fn) {
			/* Frames above returned without us seeing it (lost data). */
			unexpected(e, th, 0, fn, c->frames[n - 1].fn);
			close_above(e, th, c, i, take_slot(e, th, t, 0), FL_OPEN_AT_END);
			return c;
		}
	}
	if (land(e, th, fn, t, false, -1))
		return cur(th);
	if (n) {
		unexpected(e, th, 1, fn, -1);
		c = push_detached(e, th, t);
	}
	first_frame(e, th, c, src, FL_INFERRED, t);
	return c;
}

/* ------------------------------------------------------------------ handlers */

/* engine.py: _stack_switch */
static void stack_switch(Engine *e, Thread *th, int32_t dst, int64_t t)
{
	uint64_t ip = e->loc_ip[dst];
	size_t found = SIZE_MAX;
	for (size_t ci = th->nctx - 1; ci-- > 0;) {
		Ctx *c = th->ctxs[ci];
		if (!c->nframes || !switches_stack(e, c->frames[c->nframes - 1].fn))
			continue;
		uint64_t site = (uint64_t)frame(th, c->frames[c->nframes - 1].ix)->callsite;
		if (site && ip > site && ip - site <= MAX_INSN) {
			if (found != SIZE_MAX) {
				found = SIZE_MAX; /* two stacks wait there: unknown which resumes */
				break;
			}
			found = ci;
		}
	}
	if (found != SIZE_MAX) {
		Ctx *target = th->ctxs[found];
		land_on(e, th, found, target->nframes - 1, t);
		lines_down(e, th, target, target->nframes - 1, NULL);
		close_frame(e, th, target->frames[target->nframes - 1].ix, take_slot(e, th, t, 0), 0);
		target->nframes--;
		return;
	}
	Ctx *c = push_detached(e, th, t);
	c->switched_in = true;
	first_frame(e, th, c, dst, e->loc_off[dst] == 0 ? 0 : FL_INFERRED, t);
}

/* engine.py: _return_slow */
static void return_slow(Engine *e, Thread *th, int32_t src, int32_t dst, int64_t t)
{
	if (switches_stack(e, e->loc_fn[src])) {
		stack_switch(e, th, dst, t);
		return;
	}
	Ctx *c = cur(th);
	int32_t fn = e->loc_fn[dst];
	if ((fn_flags(e, e->loc_fn[src]) & FN_SETJMP) && c->nframes >= 2 &&
	    c->frames[c->nframes - 2].fn == fn) {
		lines_down(e, th, c, c->nframes - 1, NULL);
		close_frame(e, th, c->frames[--c->nframes].ix, take_slot(e, th, t, 0), 0);
		set_resume_point(e, th, c->frames[c->nframes - 1].ix, e->loc_ip[dst]);
		return;
	}
	if (!c->nframes) {
		c = sync_source(e, th, src, t);
		size_t n = c->nframes;
		if (n >= 2 && c->frames[n - 2].fn == fn) {
			lines_down(e, th, c, n - 1, NULL);
			close_frame(e, th, c->frames[n - 1].ix, take_slot(e, th, t, 0), 0);
			c->nframes--;
			return;
		}
	}
	size_t n = c->nframes;
	/* Right after the call: past the caller; elsewhere: an exception's way out (engine.py) */
	ptrdiff_t below = after_call(th, c->frames[n - 1].ix, e->loc_ip[dst]) ? 3 : 2;
	ptrdiff_t i = resumed_frame(e, th, c, (ptrdiff_t)n - below, fn, dst);
	if (i >= 0) {
		if (look_ahead(e, th, th->nctx - 1, (size_t)i, dst, t))
			return;
		/* A return past several frames (exception unwinding, longjmp via ret). */
		close_above(e, th, c, (size_t)i, take_slot(e, th, t, 0), 0);
		return;
	}
	Handle top = c->frames[n - 1];
	uint64_t callsite = (uint64_t)frame(th, top.ix)->callsite;
	uint64_t ip = e->loc_ip[dst];
	if (callsite && ip > callsite && ip - callsite <= MAX_INSN && n > 1) {
		/* An assembly label right after the call: the caller carries on under it. */
		lines_down(e, th, c, n - 1, NULL);
		close_frame(e, th, top.ix, take_slot(e, th, t, 0), 0);
		c->nframes--;
		c->frames[n - 2].fn = fn;
		return;
	}
	if (land(e, th, fn, t, false, dst))
		return;
	if (n == 1) {
		add_root(e, th, c, dst, t);
		return;
	}
	unexpected(e, th, 2, fn, -1);
	c = push_detached(e, th, t);
	first_frame(e, th, c, dst, FL_INFERRED, t);
}

/* engine.py: _end_every_frame (then no context is left) */
static void end_every_frame(Engine *e, Thread *th, int64_t end)
{
	stitch_lines(e, th, -1, NULL);
	bool interrupted = false;
	for (size_t j = th->nctx; j-- > 0;) {
		Ctx *c = th->ctxs[j];
		end_frames(e, th, c, 0, end, FL_OPEN_AT_END, interrupted);
		c->nframes = 0;
		interrupted = j > 0 && c->detached && c->interrupting;
		if (j > 0 && c->detached && !c->interrupting)
			end = th->ctxs[j - 1]->suspend_slot;
	}
	pop_ctxs(e, th, 0);
}

/* engine.py: _goroutine_switch */
static void goroutine_switch(Engine *e, Thread *th, int32_t src, int32_t dst, int64_t t)
{
	int32_t fn = e->loc_fn[dst];
	Ctx *c = sync_source(e, th, src, t);
	if (e->loc_off[dst] > 0) {
		for (size_t i = c->nframes - 1; i-- > 0;) {
			if (c->frames[i].fn != fn)
				continue;
			if (fn_flags(e, c->frames[i + 1].fn) & FN_PARKS)
				break; /* where every parked goroutine waits: which one is unknown */
			close_above(e, th, c, i, take_slot(e, th, t, 0), 0);
			return;
		}
	}
	/* Another goroutine, or a new one: every frame of the thread ends here. */
	int64_t slot = take_slot(e, th, t, START_SLOT);
	end_every_frame(e, th, slot);
	c = push_ctx(e, th, true, slot);
	e->segments_started++;
	first_frame(e, th, c, dst, e->loc_off[dst] == 0 ? 0 : FL_INFERRED, t);
}

/* engine.py: _jump */
static void jump(Engine *e, Thread *th, int32_t src, int32_t dst, int64_t t)
{
	int32_t fn = e->loc_fn[dst];
	if ((fn_flags(e, e->loc_fn[src]) & FN_GOGO) && !(fn_flags(e, fn) & FN_GOGO)) {
		goroutine_switch(e, th, src, dst, t);
		return;
	}
	Ctx *c = cur(th);
	/* Only a known symbol has boundaries (engine.py: the same comment). */
	if (e->loc_off[dst] > 0) {
		ptrdiff_t i = resumed_frame(e, th, c, (ptrdiff_t)c->nframes - 2, fn, dst);
		if (i >= 0) {
			if (look_ahead(e, th, th->nctx - 1, (size_t)i, dst, t))
				return;
			/* Into the middle of a caller: longjmp, landing pad, OCaml raise. */
			close_above(e, th, c, (size_t)i, take_slot(e, th, t, 0), 0);
			return;
		}
		if (land(e, th, fn, t, false, dst))
			return;
	}
	c = sync_source(e, th, src, t);
	if (c->frames[c->nframes - 1].fn == fn)
		return;
	/* A tail call, or a jump into an unrelated function: the leaf is replaced. The new
	 * frame's first instruction follows the jump (an asynchronous branch has no anchor). */
	th->anchor_next = true;
	int64_t slot = take_slot(e, th, t, CALL_SLOT);
	lines_down(e, th, c, c->nframes - 1, NULL);
	int64_t old = c->frames[--c->nframes].ix;
	close_frame(e, th, old, slot, 0);
	/* The new function returns where the old one would have: same call site. */
	int64_t below = c->nframes ? c->frames[c->nframes - 1].ix : -1;
	int64_t ix =
	    new_frame(e, th, c, below, fn, slot, e->loc_entry[dst], 0, frame(th, old)->callsite);
	push_handle(e, c, fn, ix);
}

/* engine.py: _enter_nested */
static void enter_nested(Engine *e, Thread *th, int32_t src, int32_t dst, int64_t t)
{
	Ctx *c = sync_source(e, th, src, t);
	int64_t interrupted = c->frames[c->nframes - 1].ix;
	int64_t slot = take_slot(e, th, t, CALL_SLOT);
	Ctx *nested = push_ctx(e, th, false, slot);
	int32_t fn = e->loc_fn[dst];
	int64_t ix = new_frame(e, th, nested, interrupted, fn, slot, e->loc_entry[dst], 0, 0);
	push_handle(e, nested, fn, ix);
}

/* engine.py: _long_return */
static void long_return(Engine *e, Thread *th, int32_t dst, int64_t t)
{
	int32_t fn = e->loc_fn[dst];
	Ctx *c = cur(th);
	size_t n = c->nframes;
	for (size_t i = n >= 2 ? n - 1 : 0; i-- > 0;) {
		if (c->frames[i].fn == fn) {
			close_above(e, th, c, i, take_slot(e, th, t, 0), 0);
			return;
		}
	}
	if (land(e, th, fn, t, false, -1))
		return;
	if (!n) {
		first_frame(e, th, c, dst, FL_INFERRED, t);
		return;
	}
	add_root(e, th, c, dst, t);
}

/* engine.py: _trace_end */
static void trace_end(Engine *e, Thread *th, int kind, int32_t src, int64_t t)
{
	Ctx *c = sync_source(e, th, src, t);
	if (kind == K_RETURN && c->nframes >= 2) {
		lines_down(e, th, c, c->nframes - 1, NULL);
		close_frame(e, th, c->frames[c->nframes - 1].ix, take_slot(e, th, t, 0), 0);
		c->nframes--;
	} else if ((kind == K_SYSRET || kind == K_IRET) && th->nctx > 1 && !c->detached) {
		int64_t slot = take_slot(e, th, t, 0);
		stitch_lines(e, th, (ptrdiff_t)th->nctx - 2, NULL);
		for (size_t k = 0; k < c->nframes; k++)
			close_frame(e, th, c->frames[k].ix, slot, 0);
		c->nframes = 0;
		pop_ctxs(e, th, th->nctx - 1);
		c = cur(th);
		if (!c->nframes)
			return;
	}
	int32_t name = kind == K_SYSCALL ? NAME_SYSCALL : NAME_UNTRACED;
	int64_t flags = FL_SYNTHETIC | (kind == K_CALL ? FL_AFTER_CALL : 0);
	if (kind == K_SYSCALL || kind == K_HWINT || kind == K_SWINT || kind == K_ASYNC)
		flags |= FL_KERNEL_ENTRY;
	int64_t slot = take_slot(e, th, t, CALL_SLOT);
	int64_t ix = new_frame(e, th, c, c->frames[c->nframes - 1].ix, name, slot, 0, flags, 0);
	push_handle(e, c, name, ix);
}

/* engine.py: _trace_start */
static void trace_start(Engine *e, Thread *th, int32_t dst, int64_t t)
{
	int32_t fn = e->loc_fn[dst];
	bool entry = e->loc_off[dst] == 0; /* only the frame it stopped in resumes there */
	Ctx *c = cur(th);
	size_t n = c->nframes;
	if (!n) {
		if (!land(e, th, fn, t, entry, -1))
			first_frame(e, th, c, dst, FL_INFERRED, t);
		return;
	}
	Handle *top = &c->frames[n - 1];
	if (top->fn == fn)
		return;
	for (size_t i = n - 1; i-- > 0;) {
		if (c->frames[i].fn == fn) {
			if (entry && !stopped_in(th, c, i))
				break;
			close_above(e, th, c, i, take_slot(e, th, t, 0), 0);
			return;
		}
	}
	Frame *f = frame(th, top->ix);
	if (f->flags & FL_AFTER_CALL) {
		/* `tr end  call` then resume in a new function: that is the callee. */
		top->fn = fn;
		f->flags = (int64_t)fn << NAME_SHIFT;
		f->addr = e->loc_entry[dst];
		return;
	}
	if (land(e, th, fn, t, entry, -1))
		return;
	/* Right after a kernel entry: a signal handler, on top of the frame below (engine.py) */
	bool interrupts = (frame(th, c->frames[n - 1].ix)->flags & FL_KERNEL_ENTRY) && n >= 2;
	c = push_detached(e, th, t);
	c->interrupting = interrupts;
	first_frame(e, th, c, dst, entry ? 0 : FL_INFERRED, t);
}

/* ------------------------------------------------------------ inlined frames */

static inline int32_t node_of(Engine *e, int32_t loc)
{
	return e->loc_node ? e->loc_node[loc] : 0;
}

/* Frame ix, the top of context c, now runs in inlined body `node` (0: the function
 * itself): the inlined frames it leaves end and those it enters begin (their address:
 * `addr`, where control entered them), at one slot at t (a call slot when one begins: it
 * lasts at least 1 ns before anything else starts). */
static void inline_to(Engine *e, Thread *th, Ctx *c, int64_t ix, int32_t node, int64_t t,
		      int64_t addr)
{
	int64_t top = frame(th, ix)->inl_top;
	int32_t have = top >= 0 ? frame(th, top)->node : 0;
	int32_t a = have, b = node;
	while (e->node_depth[a] > e->node_depth[b])
		a = e->node_parent[a];
	while (e->node_depth[b] > e->node_depth[a])
		b = e->node_parent[b];
	while (a != b) {
		a = e->node_parent[a];
		b = e->node_parent[b];
	}
	int64_t slot = take_slot(e, th, t, node != a ? CALL_SLOT : 0);
	while (top >= 0 && frame(th, top)->node != a) {
		int64_t k = top;
		Frame *g = frame(th, k);
		int64_t up = g->parent;
		if (e->lines_on) {
			g->icache = g->lines.n;
			ls_merge(e, &frame(th, up)->lines, &g->lines);
		}
		top = up == ix ? -1 : up;
		frame(th, ix)->inl_top = top;
		close_frame(e, th, k, slot, 0);
	}
	int32_t path[MAX_INLINE_DEPTH];
	size_t n = 0;
	for (int32_t x = node; x != a; x = e->node_parent[x])
		path[n++] = x;
	while (n--) {
		int64_t k = new_frame(e, th, c, top >= 0 ? top : ix, e->node_name[path[n]], slot,
				      addr, FL_INLINED, 0);
		frame(th, k)->node = path[n];
		top = k;
		frame(th, ix)->inl_top = k;
	}
}

/* Control is at location loc: if the top frame runs its function, the inlined bodies
 * open in it become loc's. */
static inline void inline_at(Engine *e, Thread *th, int32_t loc, int64_t t)
{
	Ctx *c = cur(th);
	if (!c->nframes)
		return;
	Handle h = c->frames[c->nframes - 1];
	if (h.fn != e->loc_fn[loc])
		return;
	int64_t top = frame(th, h.ix)->inl_top;
	int32_t node = node_of(e, loc);
	if (node != (top >= 0 ? frame(th, top)->node : 0))
		inline_to(e, th, c, h.ix, node, t, (int64_t)e->loc_ip[loc]);
}

/* engine.py: _apply */
static void apply(Engine *e, Thread *th, int kind, int state, int32_t src, int32_t dst,
		  int64_t t)
{
	if (state == S_END) {
		trace_end(e, th, kind, src, t);
		return;
	}
	if (state == S_START) {
		trace_start(e, th, dst, t);
		return;
	}
	if (state != S_NONE) {
		e->ignored++;
		return;
	}
	switch (kind) {
	case K_CALL: {
		int32_t fn = e->loc_fn[dst];
		int32_t sfn = e->loc_fn[src];
		uint64_t sip = e->loc_ip[src], dip = e->loc_ip[dst];
		if (fn == sfn && dip > sip && dip - sip <= MAX_INSN)
			return; /* `call next; pop` inside one function (engine.py) */
		Ctx *c = cur(th);
		if (!c->nframes || c->frames[c->nframes - 1].fn != sfn)
			c = sync_source(e, th, src, t);
		th->anchor_next = true; /* the callee's first instruction follows this call */
		int64_t slot = take_slot(e, th, t, CALL_SLOT);
		int64_t ix = new_frame(e, th, c, c->frames[c->nframes - 1].ix, fn, slot,
				       e->loc_entry[dst], 0, (int64_t)sip);
		push_handle(e, c, fn, ix);
		return;
	}
	case K_RETURN: {
		Ctx *c = cur(th);
		size_t n = c->nframes;
		if (n >= 2 && c->frames[n - 2].fn == e->loc_fn[dst] &&
		    !(fn_flags(e, e->loc_fn[src]) & FN_SPECIAL_RETURN) &&
		    after_call(th, c->frames[n - 1].ix, e->loc_ip[dst])) {
			lines_down(e, th, c, n - 1, NULL);
			close_frame(e, th, c->frames[n - 1].ix, take_slot(e, th, t, 0), 0);
			c->nframes--;
		} else {
			return_slow(e, th, src, dst, t);
		}
		return;
	}
	case K_JUMP:
	case K_CJUMP:
		if (e->loc_fn[dst] != e->loc_fn[src])
			jump(e, th, src, dst, t);
		else if (!cur(th)->nframes)
			sync_source(e, th, src, t);
		return;
	case K_SYSCALL:
	case K_HWINT:
	case K_SWINT:
		enter_nested(e, th, src, dst, t);
		return;
	case K_SYSRET:
	case K_IRET:
		long_return(e, th, dst, t);
		return;
	case K_ASYNC:
	case K_TX_ABORT:
		if (e->loc_fn[dst] != e->loc_fn[src])
			jump(e, th, src, dst, t);
		return;
	case K_INLINE:
		return; /* apply_at's */
	default:
		e->ignored++;
	}
}

/* apply(), and the inlined bodies it leaves and enters: the branch's source runs in its
 * inlined bodies (without instruction detail, that is where the decoders first see them),
 * and its target in its own. */
static inline void apply_at(Engine *e, Thread *th, int kind, int state, int32_t src,
			    int32_t dst, int64_t t)
{
	if (!e->loc_node) {
		apply(e, th, kind, state, src, dst, t);
		return;
	}
	if (state == S_NONE)
		inline_at(e, th, src, t);
	apply(e, th, kind, state, src, dst, t);
	if (state != S_END)
		inline_at(e, th, dst, t);
}

/* ------------------------------------------ anchors (engine_anchors.c) at a branch */

/* Before a branch is applied: what its slot's anchor would be. */
static inline void note_branch(Engine *e, Thread *th, int kind, int32_t src, int32_t dst,
			       int64_t time)
{
	th->ev_time = time;
	if (kind == K_CALL ||
	    ((kind == K_JUMP || kind == K_CJUMP) && e->loc_fn[src] != e->loc_fn[dst])) {
		th->ev_ip = e->loc_ip[src];
		th->ev_occurrence = occurrence_of(e, &th->seen, th->ev_ip, time);
	} else {
		th->ev_occurrence = 0;
	}
}

/* engine.py: _gap_and_count (the instructions up to the dropped jump
 * (gap_insns of the event's insns, when known) count before the gap slot, the rest after) */
static inline void gap_and_count(Engine *e, Thread *th, int64_t gap_time, uint64_t gap_insns,
				 int64_t t, uint64_t insns, uint64_t cycles)
{
	if (gap_time && e->axis == AXIS_TIME && (th->last_raw >> 2) < gap_time && gap_time < t) {
		if (gap_insns && gap_insns <= insns) {
			count(e, th, gap_insns, 0);
			insns -= gap_insns;
		}
		take_slot(e, th, gap_time, 0);
	}
	if (insns || cycles)
		count(e, th, insns, cycles);
}

/* engine.py: TraceSegmentEngine._branch_body (in-transaction events and what follows
 * them; held events as they are run) */
void branch_body(Engine *e, Thread *th, int kind, int state, bool in_tx, int32_t src,
		 int32_t dst, int64_t time, uint64_t insns, uint64_t cycles,
		 int64_t gap_time, uint64_t gap_insns, const uint64_t *lines,
		 size_t nlines)
{
	int64_t t = time < th->last_time ? th->last_time : time;
	th->last_time = t;
	gap_and_count(e, th, gap_time, gap_insns, t, insns, cycles);
	add_lines(e, th, lines, nlines);
	note_branch(e, th, kind, src, dst, time);
	if (in_tx) {
		if (th->ntx == th->captx)
			th->txq = grow(e, th->txq, &th->captx, th->ntx + 1, sizeof(TxEvent));
		th->txq[th->ntx++] =
		    (TxEvent){kind, state, src, dst, time, th->ev_ip, th->ev_occurrence};
		return;
	}
	if (th->ntx) {
		size_t queued = th->ntx;
		th->ntx = 0;
		if (kind != K_TX_ABORT) {
			uint64_t ip = th->ev_ip;
			uint32_t occurrence = th->ev_occurrence;
			/* apply() never queues, so the buffer stays as it is while we walk it. */
			for (size_t k = 0; k < queued; k++) {
				TxEvent q = th->txq[k];
				/* engine.py: never before what the thread logged since, nor after now. */
				int64_t logged = th->last_raw >> 2;
				int64_t tq = q.time > logged ? q.time : logged;
				th->ev_ip = q.ip;
				th->ev_time = q.time;
				th->ev_occurrence = q.occurrence;
				apply_at(e, th, q.kind, q.state, q.src, q.dst, tq <= t ? tq : t);
			}
			th->ev_ip = ip;
			th->ev_time = time;
			th->ev_occurrence = occurrence;
		}
	}
	apply_at(e, th, kind, state, src, dst, t);
}

/* engine.py: TraceSegmentEngine._break_body (a segment break on one thread) */
void break_body(Engine *e, Thread *th)
{
	Ctx *c = cur(th);
	if (!c->nframes && c->detached)
		return; /* no open frame: nothing to stitch to */
	int64_t slot = take_slot(e, th, th->last_time, 0);
	break_segment(e, th, slot);
	cur(th)->after_break = true;
}

/* engine.py: TraceSegmentEngine._power_body (a counter sample, its name and value) */
void counter_body(Engine *e, Thread *th, int64_t time, int64_t name, int64_t value)
{
	int64_t t = time > th->last_time ? time : th->last_time;
	th->last_time = t;
	int64_t slot = take_slot(e, th, t, 0);
	wait_for(e, th, slot, W_COUNTER, name, value, 0);
}

/* engine.py: TraceSegmentEngine._branch */
static void branch_slow(Engine *e, Thread *th, int kind, int state, bool in_tx, int32_t src,
			int32_t dst, int64_t time, uint64_t insns, uint64_t cycles,
			int64_t gap_time, uint64_t gap_insns, const uint64_t *lines,
			size_t nlines)
{
	e->events++;
	e->branches++;
	if (th->look.on)
		hold(e, th, kind, state, in_tx, src, dst, time, insns, cycles, gap_time, gap_insns,
		     lines, nlines);
	else
		branch_body(e, th, kind, state, in_tx, src, dst, time, insns, cycles, gap_time,
			    gap_insns, lines, nlines);
}

/* engine.py: TraceSegmentEngine._close_all, then every slot resolves and every slice is
 * written. */
static void close_all(Engine *e, Thread *th)
{
	settle_all(e, th);
	end_every_frame(e, th, take_slot(e, th, th->last_time, 0));
	resolve(e, th, 0);
	flush_groups(e, th, true);
	th->closed = true;
}

/* ------------------------------------------------------------ entry points */

int ptscope_engine_usable(Engine *e, bool open)
{
	if (e->broken)
		return refuse(e, PTSCOPE_ENGINE_BROKEN, "the engine failed earlier and cannot continue");
	if (open && e->closed)
		return refuse(e, PTSCOPE_ENGINE_FINISHED, "the engine is finished");
	return PTSCOPE_ENGINE_OK;
}

/* Each entry point that changes the engine: refused once it is broken (GUARD) or, if it
 * takes input, finished (OPEN). */
#define GUARD(e)                                                                          \
	do {                                                                              \
		int refused = ptscope_engine_usable((e), false);                          \
		if (refused)                                                              \
			return refused;                                                   \
	} while (0)

#define OPEN(e)                                                                           \
	do {                                                                              \
		int refused = ptscope_engine_usable((e), true);                           \
		if (refused)                                                              \
			return refused;                                                   \
	} while (0)

/* Where a failure deep in the rules lands (fail() longjmps here): the engine is broken. */
#define CATCH(e)                                                                          \
	do {                                                                              \
		if (setjmp((e)->jb)) {                                                    \
			(e)->broken = true;                                               \
			return (e)->error;                                                \
		}                                                                         \
	} while (0)

int ptscope_engine_init(Engine *e, size_t max_examples, bool keep_slots, int axis, bool spread)
{
	if (axis < AXIS_TIME || axis > AXIS_CYCLES)
		return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "axis: 0 time, 1 instructions, 2 cycles");
	if (e->threads || e->nloc)
		return refuse(e, PTSCOPE_ENGINE_INTERNAL, "the engine is already initialised");
	free(e->examples);
	e->examples = calloc(max_examples + 1, sizeof(Example));
	if (!e->examples)
		return refuse(e, PTSCOPE_ENGINE_NOMEM, "out of memory");
	e->max_examples = max_examples;
	e->keep_slots = keep_slots;
	e->axis = axis;
	e->spread = spread;
	return PTSCOPE_ENGINE_OK;
}

static void free_thread(Thread *th)
{
	for (size_t i = 0; i < th->nfr; i++)
		free(th->fr[i].lines.v);
	free(th->fr);
	free(th->free_ix.v);
	free(th->win);
	free(th->seen.v);
	free(th->win_out);
	free(th->waiters);
	for (size_t g = 0; g < th->ngroups; g++)
		free(th->groups[g].ix);
	free(th->groups);
	free(th->resume.v);
	for (size_t i = 0; i < th->pool; i++) {
		free(th->ctxs[i]->frames);
		free(th->ctxs[i]->spine.v);
		free(th->ctxs[i]->base.v);
		free(th->ctxs[i]->before.v);
		free(th->ctxs[i]);
	}
	free(th->ctxs);
	free(th->txq);
	free(th->look.cand);
	for (size_t i = 0; i < th->look.nhyp; i++)
		free(th->look.hyp[i].above);
	free(th->look.hyp);
	free(th->look.next);
	free(th->look.ev);
	free(th->look.lines);
	free(th);
}

void ptscope_engine_free(Engine *e)
{
	for (size_t i = 0; i < e->nthreads; i++)
		free_thread(e->threads[i]);
	free(e->threads);
	free(e->map);
	free(e->loc_fn);
	free(e->loc_entry);
	free(e->loc_off);
	free(e->loc_ip);
	free(e->loc_node);
	free(e->node_parent);
	free(e->node_name);
	free(e->node_depth);
	free(e->fn_flags);
	free(e->pad_index.v);
	free(e->pad_ranges.v);
	free(e->examples);
	for (int i = 0; i < NOUT; i++)
		free(e->out[i].v);
	for (int i = 0; i < NINST; i++)
		free(e->inst[i].v);
	for (int i = 0; i < NCTR; i++)
		free(e->ctr[i].v);
}

int ptscope_engine_add_locations(Engine *e, ptscope_column fn, ptscope_column entry,
				 ptscope_column offset, ptscope_column ip, size_t n)
{
	GUARD(e);
	for (size_t i = 0; i < n; i++)
		if (PTSCOPE_AT(fn, int32_t, i) < 0)
			return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "negative function id");
	if (n > (size_t)INT32_MAX - e->nloc)
		return refuse(e, PTSCOPE_ENGINE_OVERFLOW, "too many locations");
	size_t need = e->nloc + n;
	if (need > e->caploc) {
		size_t cap = e->caploc ? e->caploc : 256;
		while (cap < need)
			cap *= 2;
		int32_t *f = realloc(e->loc_fn, cap * sizeof(int32_t));
		if (f)
			e->loc_fn = f;
		int64_t *en = realloc(e->loc_entry, cap * sizeof(int64_t));
		if (en)
			e->loc_entry = en;
		int64_t *off = realloc(e->loc_off, cap * sizeof(int64_t));
		if (off)
			e->loc_off = off;
		uint64_t *p = realloc(e->loc_ip, cap * sizeof(uint64_t));
		if (p)
			e->loc_ip = p;
		int32_t *nd = e->loc_node;
		if (nd) {
			nd = realloc(e->loc_node, cap * sizeof(int32_t));
			if (nd)
				e->loc_node = nd;
		}
		if (!f || !en || !off || !p || (e->loc_node && !nd))
			return refuse(e, PTSCOPE_ENGINE_NOMEM, "out of memory");
		e->caploc = cap;
	}
	for (size_t i = 0; i < n; i++) {
		size_t k = e->nloc + i;
		e->loc_fn[k] = PTSCOPE_AT(fn, int32_t, i);
		e->loc_entry[k] = PTSCOPE_AT(entry, int64_t, i);
		e->loc_off[k] = PTSCOPE_AT(offset, int64_t, i);
		e->loc_ip[k] = PTSCOPE_AT(ip, uint64_t, i);
		if (e->loc_node)
			e->loc_node[k] = 0;
	}
	e->nloc = need;
	return PTSCOPE_ENGINE_OK;
}

int ptscope_engine_add_inline_nodes(Engine *e, const int32_t *parent, const int32_t *name,
				    size_t n)
{
	GUARD(e);
	size_t first = e->nnodes ? e->nnodes : 1;
	if (n > (size_t)INT32_MAX - first)
		return refuse(e, PTSCOPE_ENGINE_OVERFLOW, "too many inlined bodies");
	for (size_t i = 0; i < n; i++) {
		if (parent[i] < 0 || (size_t)parent[i] >= first + i || name[i] < 0)
			return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "bad inlined body");
		if (parent[i] && (size_t)parent[i] < first &&
		    e->node_depth[parent[i]] >= MAX_INLINE_DEPTH)
			return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "inlined bodies nested too deep");
	}
	size_t need = first + n;
	if (need > e->capnodes) {
		size_t cap = e->capnodes ? e->capnodes : 256;
		while (cap < need)
			cap *= 2;
		int32_t *pa = realloc(e->node_parent, cap * sizeof(int32_t));
		if (pa)
			e->node_parent = pa;
		int32_t *na = realloc(e->node_name, cap * sizeof(int32_t));
		if (na)
			e->node_name = na;
		uint8_t *de = realloc(e->node_depth, cap);
		if (de)
			e->node_depth = de;
		if (!pa || !na || !de)
			return refuse(e, PTSCOPE_ENGINE_NOMEM, "out of memory");
		e->capnodes = cap;
	}
	e->node_parent[0] = e->node_name[0] = 0;
	e->node_depth[0] = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t depth = (uint8_t)(e->node_depth[parent[i]] + 1);
		if (depth > MAX_INLINE_DEPTH) {
			e->nnodes = first + i;
			return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "inlined bodies nested too deep");
		}
		e->node_parent[first + i] = parent[i];
		e->node_name[first + i] = name[i];
		e->node_depth[first + i] = depth;
	}
	e->nnodes = need;
	return PTSCOPE_ENGINE_OK;
}

int ptscope_engine_set_location_nodes(Engine *e, size_t first, const int32_t *node, size_t n)
{
	GUARD(e);
	if (first > e->nloc || n > e->nloc - first)
		return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "no such location");
	for (size_t i = 0; i < n; i++)
		if (node[i] < 0 || (size_t)node[i] >= (e->nnodes ? e->nnodes : 1))
			return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "no such inlined body");
	if (!e->loc_node) {
		e->loc_node = calloc(e->caploc ? e->caploc : 1, sizeof(int32_t));
		if (!e->loc_node)
			return refuse(e, PTSCOPE_ENGINE_NOMEM, "out of memory");
	}
	memcpy(e->loc_node + first, node, n * sizeof(int32_t));
	return PTSCOPE_ENGINE_OK;
}

int ptscope_engine_mark_function(Engine *e, int fn, int flags)
{
	GUARD(e);
	if (fn < 0 || flags < 0 || flags > FN_ALL)
		return refuse(e, PTSCOPE_ENGINE_BAD_INPUT, "bad function id or flags");
	if ((size_t)fn >= e->nfn_flags) {
		size_t cap = (size_t)fn + 64;
		uint8_t *v = realloc(e->fn_flags, cap);
		if (!v)
			return refuse(e, PTSCOPE_ENGINE_NOMEM, "out of memory");
		memset(v + e->nfn_flags, 0, cap - e->nfn_flags);
		e->fn_flags = v;
		e->nfn_flags = cap;
	}
	e->fn_flags[fn] = (uint8_t)flags;
	return PTSCOPE_ENGINE_OK;
}

void ptscope_engine_set_landing_pads(Engine *e, ptscope_landing_pads_fn fn, void *ctx)
{
	e->landing_pads = fn;
	e->landing_ctx = ctx;
	e->pad_index.n = e->pad_ranges.n = 0;
}

/* Whether every row's locations are in the table and its time in range, in one pass
 * without a branch per row where the columns are contiguous (the usual batch): the
 * checking loop in ptscope_engine_feed, which names the first bad row, then has nothing
 * to do (it was a tenth of feed's own instructions). */
static bool rows_in_range(const ptscope_column *cols, size_t n, size_t nloc)
{
	if (cols[C_SRC].stride != 4 || cols[C_DST].stride != 4 || cols[C_TIME].stride != 8)
		return false;
	const int32_t *src = (const int32_t *)cols[C_SRC].p;
	const int32_t *dst = (const int32_t *)cols[C_DST].p;
	const int64_t *time = (const int64_t *)cols[C_TIME].p;
	/* a negative id is 2^31 or more as unsigned: never below the limit */
	uint32_t limit = nloc > (size_t)INT32_MAX ? (uint32_t)INT32_MAX + 1 : (uint32_t)nloc;
	/* -TIME_LIMIT < t < TIME_LIMIT, shifted to 0 <= t + TIME_LIMIT - 1 < 2 * TIME_LIMIT - 1
	 * in unsigned arithmetic (which wraps by definition) */
	const uint64_t shift = (uint64_t)TIME_LIMIT - 1, span = 2 * (uint64_t)TIME_LIMIT - 1;
	bool bad = false;
	for (size_t i = 0; i < n; i++)
		bad |= ((uint32_t)src[i] >= limit) | ((uint32_t)dst[i] >= limit) |
		       ((uint64_t)time[i] + shift >= span);
	return !bad;
}

int ptscope_engine_feed(Engine *e, const ptscope_column *cols, size_t n,
			const ptscope_column *line_offsets, const uint64_t *all_lines,
			const ptscope_column *gap_insns_col)
{
	OPEN(e);
	bool has_lines = line_offsets != NULL;
	if (has_lines)
		e->lines_on = true;
	/* Refuse bad rows before changing anything. */
	int64_t nloc = (int64_t)e->nloc;
	for (size_t i = rows_in_range(cols, n, e->nloc) ? n : 0; i < n; i++) {
		int32_t src = PTSCOPE_AT(cols[C_SRC], int32_t, i);
		int32_t dst = PTSCOPE_AT(cols[C_DST], int32_t, i);
		int64_t time = PTSCOPE_AT(cols[C_TIME], int64_t, i);
		if (src < 0 || src >= nloc || dst < 0 || dst >= nloc)
			return refuse(e, PTSCOPE_ENGINE_BAD_INPUT,
				      "branch %zu names location %d, not in the table (%lld locations)",
				      i, src < 0 || src >= nloc ? src : dst, (long long)nloc);
		if (time >= TIME_LIMIT || time <= -TIME_LIMIT)
			return refuse(e, PTSCOPE_ENGINE_OVERFLOW,
				      "branch %zu has an out-of-range time %lld", i, (long long)time);
	}
	CATCH(e);
	Thread *th = NULL;
	int64_t cur_pid = 0, cur_tid = 0;
	/* Local copies: every store into the engine's state might alias `cols`, so each
	 * descriptor would be loaded again for every row (1 % of the engine's instructions). */
	const ptscope_column c_pid = cols[C_PID], c_tid = cols[C_TID], c_time = cols[C_TIME],
			     c_flags = cols[C_FLAGS], c_src = cols[C_SRC], c_dst = cols[C_DST],
			     c_insn = cols[C_INSN], c_cyc = cols[C_CYC], c_gap = cols[C_GAP];
	for (size_t i = 0; i < n; i++) {
		int32_t pid = PTSCOPE_AT(c_pid, int32_t, i);
		int32_t tid = PTSCOPE_AT(c_tid, int32_t, i);
		int64_t time = PTSCOPE_AT(c_time, int64_t, i);
		uint32_t flags = PTSCOPE_AT(c_flags, uint32_t, i);
		int32_t src = PTSCOPE_AT(c_src, int32_t, i);
		int32_t dst = PTSCOPE_AT(c_dst, int32_t, i);
		uint64_t insns = PTSCOPE_AT(c_insn, uint64_t, i);
		uint64_t cycles = PTSCOPE_AT(c_cyc, uint64_t, i);
		uint32_t gap_delta = PTSCOPE_AT(c_gap, uint32_t, i);
		uint64_t gap_insns = gap_insns_col ? PTSCOPE_AT(*gap_insns_col, uint16_t, i) : 0;
		int64_t gap_time = gap_delta ? time - (int64_t)gap_delta : 0;
		uint8_t ks = ptscope_classify(flags);
		int kind = ks & 15, state = ks >> 4;
		if (!th || tid != cur_tid || pid != cur_pid) {
			cur_pid = pid;
			cur_tid = tid;
			/* A first branch's gap time is when the thread's history starts
			 * (engine.py: _branch). */
			th = thread_of(e, pid, tid, gap_time ? gap_time : time);
		}
		if ((flags & IN_TX_FLAG) || th->ntx || th->look.on) {
			size_t l0 = has_lines ? (size_t)PTSCOPE_AT(*line_offsets, int32_t, i) : 0;
			size_t l1 = has_lines ? (size_t)PTSCOPE_AT(*line_offsets, int32_t, i + 1) : 0;
			branch_slow(e, th, kind, state, flags & IN_TX_FLAG, src, dst, time, insns,
				    cycles, gap_time, gap_insns, all_lines + l0, l1 - l0);
			continue;
		}
		e->events++;
		e->branches++;
		int64_t t = time;
		if (t < th->last_time)
			t = th->last_time;
		else
			th->last_time = t;
		gap_and_count(e, th, gap_time, gap_insns, t, insns, cycles);
		if (has_lines) {
			int32_t l0 = PTSCOPE_AT(*line_offsets, int32_t, i);
			int32_t l1 = PTSCOPE_AT(*line_offsets, int32_t, i + 1);
			add_lines(e, th, all_lines + l0, (size_t)(l1 - l0));
		}
		note_branch(e, th, kind, src, dst, time);
		apply_at(e, th, kind, state, src, dst, t);
	}
	return PTSCOPE_ENGINE_OK;
}

static int check_time(Engine *e, int64_t time)
{
	if (time >= TIME_LIMIT || time <= -TIME_LIMIT)
		return refuse(e, PTSCOPE_ENGINE_OVERFLOW, "out-of-range time %lld", (long long)time);
	return PTSCOPE_ENGINE_OK;
}

/* engine.py: TraceSegmentEngine.decode_error. */
int ptscope_engine_decode_error(Engine *e, int64_t pid, int64_t tid, bool has_time,
				int64_t time, int64_t message, bool *attributed)
{
	OPEN(e);
	*attributed = false;
	if (has_time && check_time(e, time))
		return e->error;
	CATCH(e);
	e->events++;
	e->decode_errors++;
	Thread *th;
	if (tid >= 0) {
		if (pid < 0) {
			pid = tid;
			for (size_t i = 0; i < e->nthreads; i++) {
				if (e->threads[i]->tid == tid) {
					pid = e->threads[i]->pid;
					break;
				}
			}
		}
		th = thread_of(e, pid, tid, has_time ? time : 0);
	} else {
		/* perf could not say which thread: the one decoded last is the best guess. */
		th = e->last;
	}
	if (!th)
		return PTSCOPE_ENGINE_OK;
	settle_all(e, th);
	int64_t t = has_time ? time : th->last_time;
	if (t < th->last_time)
		t = th->last_time;
	th->last_time = t;
	/* engine.py: whether a pending transaction committed is unknowable now: drop it. */
	th->ntx = 0;
	int64_t slot = take_slot(e, th, t, START_SLOT);
	wait_for(e, th, slot, W_INSTANT, message, 0, 0);
	break_segment(e, th, slot);
	*attributed = true;
	return PTSCOPE_ENGINE_OK;
}

/* engine.py: TraceSegmentEngine._power (a counter sample) */
int ptscope_engine_counter(Engine *e, int64_t pid, int64_t tid, int64_t time, int64_t name,
			   int64_t value)
{
	OPEN(e);
	if (check_time(e, time))
		return e->error;
	CATCH(e);
	e->events++;
	Thread *th = thread_of(e, pid, tid, time);
	if (th->look.on) /* engine.py: held with the branches (it says nothing of the stack) */
		hold(e, th, K_HELD_COUNTER, S_NONE, false, 0, 0, time, (uint64_t)name,
		     (uint64_t)value, 0, 0, NULL, 0);
	else
		counter_body(e, th, time, name, value);
	return PTSCOPE_ENGINE_OK;
}

/* engine.py: TraceSegmentEngine.end_segment */
int ptscope_engine_end_segment(Engine *e)
{
	OPEN(e);
	CATCH(e);
	for (size_t i = 0; i < e->nthreads; i++) {
		Thread *th = e->threads[i];
		if (th->look.on) /* engine.py: held with the branches (the break takes no time) */
			hold(e, th, K_HELD_BREAK, S_NONE, false, 0, 0, th->last_time, 0, 0, 0, 0,
			     NULL, 0);
		else
			break_body(e, th);
	}
	return PTSCOPE_ENGINE_OK;
}

/* The end of the input: close every thread's open frames (engine.py: _close_all), resolve
 * every slot and write everything still held. */
int ptscope_engine_close_all(Engine *e)
{
	OPEN(e);
	CATCH(e);
	for (size_t i = 0; i < e->nthreads; i++)
		close_all(e, e->threads[i]);
	e->closed = true;
	return PTSCOPE_ENGINE_OK;
}

Thread *ptscope_engine_find_thread(Engine *e, int64_t pid, int64_t tid)
{
	return find_thread(e, pid, tid);
}
