/* The trace-segment engine's ingestion in C: columns of branch records in, per-thread frame
 * histories out, rule for rule the twin of src/ptscope/reconstruct/engine.py.
 *
 * engine.py is the reference: its module docstring explains the model (frames, contexts,
 * landing, stitching, roots, slots) and every handler here carries the name of the Python
 * method it ports. Names are plain ints here: location ids index the location columns that
 * Python registers (function name id, entry address, symbol offset, ip), and a frame's name
 * id is kept in the upper bits of its flags field so that a frame stays 48 bytes. Python
 * (fast_engine.py) turns the ids back into strings and runs the shared final pass
 * (engine.build_thread_timeline) over the arrays this module hands over at the end.
 *
 * Errors: bad input is refused before anything changes (unknown location ids, times whose
 * slot value does not fit in 64 bits); running out of memory, or a counter overflowing,
 * raises a Python exception through a longjmp back to the method that was called, after
 * which the engine refuses further work (its state is half-updated) but can be freed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

/* A frame's fields (engine.py: _PARENT ... _CALLSITE), six int64 per frame. */
enum { F_PARENT, F_START, F_END, F_ADDR, F_FLAGS, F_CALLSITE, NFIELDS };

/* SliceFlags, and the engine's private flag (engine.py: _AFTER_CALL). */
#define FL_INFERRED 1
#define FL_OPEN_AT_END 2
#define FL_SYNTHETIC 4
#define FL_AFTER_CALL (1 << 8)
/* The frame's name id lives above the flags in the F_FLAGS field. */
#define NAME_SHIFT 16

#define CALL_SLOT 1
#define START_SLOT 2
#define MAX_INSN 15u

/* model.BranchKind and model.TraceState. */
enum {
	K_NONE,
	K_CALL,
	K_RETURN,
	K_JUMP,
	K_CJUMP,
	K_SYSCALL,
	K_SYSRET,
	K_HWINT,
	K_IRET,
	K_SWINT,
	K_ASYNC,
	K_TX_ABORT,
	K_VMENTRY,
	K_VMEXIT,
};
enum { S_NONE, S_START, S_END };

/* model.BranchFlags (perf's PERF_DLFILTER_FLAG_*). */
enum {
	BF_BRANCH = 1 << 0,
	BF_CALL = 1 << 1,
	BF_RETURN = 1 << 2,
	BF_CONDITIONAL = 1 << 3,
	BF_SYSCALLRET = 1 << 4,
	BF_ASYNC = 1 << 5,
	BF_INTERRUPT = 1 << 6,
	BF_TX_ABORT = 1 << 7,
	BF_TRACE_BEGIN = 1 << 8,
	BF_TRACE_END = 1 << 9,
	BF_IN_TX = 1 << 10,
	BF_VMENTRY = 1 << 11,
	BF_VMEXIT = 1 << 12,
	BF_INTR_DISABLE = 1 << 13,
	BF_INTR_TOGGLE = 1 << 14,
};
#define IN_TX_FLAG BF_IN_TX
#define FLAG_TABLE_SIZE 32768 /* classify_flags depends on bits 0..14 only */

/* Name ids the Python side reserves for the synthetic frames. */
#define NAME_UNTRACED 0
#define NAME_SYSCALL 1

/* Times are stored as time*4 + flags: beyond this they do not fit in an int64. */
#define TIME_LIMIT (INT64_C(1) << 61)

typedef struct {
	int64_t *v;
	size_t n, cap;
} Vec;

/* An open frame on a context's stack: the function events are matched against, and the
 * frame's index (engine.py: Handle). */
typedef struct {
	int64_t ix;
	int32_t fn;
} Handle;

typedef struct {
	Handle *frames;
	size_t nframes, capframes;
	int64_t *top; /* frames whose parent is this context's base (engine.py: toplevel) */
	size_t ntop, captop;
	int64_t parent;
	int64_t start_slot;
	int64_t suspend_slot;
	bool detached;
	bool switched_in; /* began with a stack switch: older contexts are other stacks */
} Ctx;

/* A branch held until its transaction commits. */
typedef struct {
	int32_t kind, state, src, dst;
	int64_t time;
} TxEvent;

typedef struct {
	int64_t pid, tid;
	Vec fd, log;
	Vec upd_slot, upd_insn, upd_cyc;
	Vec instants; /* (slot, message id) pairs */
	Vec counters; /* (slot, name id, value) triples */
	int64_t cum_insn, cum_cyc, last_time;
	Ctx **ctxs;  /* [0, nctx) live; [nctx, pool) allocated, kept for reuse */
	size_t nctx, pool, capctx;
	TxEvent *txq;
	size_t ntx, captx;
	size_t final_slots; /* the log's length when it was handed over */
	Vec resume; /* (frame index, address) pairs: where a setjmp last returned into it */
	bool taken;
} Thread;

typedef struct {
	int what; /* 0: branch from fn while in fn2; 1: branch from fn, 2: return to fn */
	int64_t tid, time;
	int32_t fn, fn2;
} Example;

typedef struct {
	int64_t pid, tid;
	size_t index; /* thread index + 1; 0 = empty */
} Slot;

/* model._classify, as kind | state << 4 (a test compares all 32768 values). */
static uint8_t classify(uint32_t flags)
{
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

static uint8_t kind_state[FLAG_TABLE_SIZE]; /* classify() of every value, filled at import */

typedef struct {
	PyObject_HEAD
	int32_t *loc_fn;
	int64_t *loc_entry, *loc_off;
	uint64_t *loc_ip;
	size_t nloc, caploc;
	uint8_t *fn_flags; /* by function id: FN_SWITCHES, FN_SETJMP */
	size_t nfn_flags;
	PyObject *landing_pads; /* location id -> [(start, end)] call sites landing there */
	Vec pad_index;		/* (location, first range, count) triples, asked so far */
	Vec pad_ranges;		/* (start, end) pairs */
	Thread **threads;
	size_t nthreads, capthreads;
	Slot *map;
	size_t mapcap; /* power of two */
	Thread *last;
	int64_t events, branches, decode_errors, segments_started, stitched, roots_inferred,
		unexpected, ignored;
	Example *examples;
	Py_ssize_t nexamples, max_examples;
	int32_t *out_of; /* engine name id -> output name id (final pass), -1 = none yet */
	size_t nout_of;
	int32_t nout;
	bool broken, closed;
	jmp_buf jb;
} Engine;

/* ------------------------------------------------------------------ failures */

static _Noreturn void fail(Engine *e)
{
	longjmp(e->jb, 1);
}

static _Noreturn void fail_nomem(Engine *e)
{
	PyErr_NoMemory();
	fail(e);
}

static void *grow(Engine *e, void *p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return p;
	size_t nc = *cap ? *cap : 8;
	while (nc < need) {
		if (nc > SIZE_MAX / 2 / elem)
			fail_nomem(e);
		nc += nc / 2 + 8; /* x1.5: bounded slack on big frame arrays */
	}
	void *np = realloc(p, nc * elem);
	if (!np)
		fail_nomem(e);
	*cap = nc;
	return np;
}

static inline void vec_push(Engine *e, Vec *a, int64_t x)
{
	if (a->n == a->cap)
		a->v = grow(e, a->v, &a->cap, a->n + 1, sizeof(int64_t));
	a->v[a->n++] = x;
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

static Ctx *push_ctx(Engine *e, Thread *th, int64_t parent, bool detached, int64_t start_slot)
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
	c->ntop = 0;
	c->parent = parent;
	c->detached = detached;
	c->start_slot = start_slot;
	c->suspend_slot = -1;
	c->switched_in = false;
	return c;
}

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
	/* The first slot starts the thread's first segment; the first context starts there. */
	vec_push(e, &th->log, time * 4 + START_SLOT);
	push_ctx(e, th, -1, true, 0);
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

/* -------------------------------------------------------------- small helpers */

static inline Ctx *cur(Thread *th)
{
	return th->ctxs[th->nctx - 1];
}

static inline int64_t *frame(Thread *th, int64_t ix)
{
	return th->fd.v + ix * NFIELDS;
}

static inline int64_t new_frame(Engine *e, Thread *th, int32_t name, int64_t parent,
				int64_t start, int64_t addr, int64_t flags, int64_t callsite)
{
	Vec *fd = &th->fd;
	if (fd->n + NFIELDS > fd->cap)
		fd->v = grow(e, fd->v, &fd->cap, fd->n + NFIELDS, sizeof(int64_t));
	int64_t *f = fd->v + fd->n;
	f[F_PARENT] = parent;
	f[F_START] = start;
	f[F_END] = -1;
	f[F_ADDR] = addr;
	f[F_FLAGS] = ((int64_t)name << NAME_SHIFT) | flags;
	f[F_CALLSITE] = callsite;
	fd->n += NFIELDS;
	return (int64_t)(fd->n / NFIELDS) - 1;
}

static inline void push_handle(Engine *e, Ctx *c, int32_t fn, int64_t ix)
{
	if (c->nframes == c->capframes)
		c->frames = grow(e, c->frames, &c->capframes, c->nframes + 1, sizeof(Handle));
	c->frames[c->nframes++] = (Handle){ix, fn};
}

static inline void push_top(Engine *e, Ctx *c, int64_t ix)
{
	if (c->ntop == c->captop)
		c->top = grow(e, c->top, &c->captop, c->ntop + 1, sizeof(int64_t));
	c->top[c->ntop++] = ix;
}

/* engine.py: _slot */
static inline int64_t take_slot(Engine *e, Thread *th, int64_t t, int flags)
{
	int64_t slot = (int64_t)th->log.n;
	vec_push(e, &th->log, t * 4 + flags);
	return slot;
}

/* engine.py: _close */
static inline void close_frame(Thread *th, int64_t ix, int64_t slot, int64_t flags)
{
	int64_t *f = frame(th, ix);
	f[F_END] = slot;
	f[F_FLAGS] |= flags;
}

/* engine.py: _close_above */
static void close_above(Thread *th, Ctx *c, size_t index, int64_t slot, int64_t flags)
{
	for (size_t k = index + 1; k < c->nframes; k++)
		close_frame(th, c->frames[k].ix, slot, flags);
	c->nframes = index + 1;
}

/* engine.py: _count */
static void count(Engine *e, Thread *th, uint64_t insns, uint64_t cycles)
{
	int64_t ci, cc;
	if (insns > (uint64_t)INT64_MAX || cycles > (uint64_t)INT64_MAX ||
	    __builtin_add_overflow(th->cum_insn, (int64_t)insns, &ci) ||
	    __builtin_add_overflow(th->cum_cyc, (int64_t)cycles, &cc)) {
		PyErr_SetString(PyExc_OverflowError,
				"instruction or cycle counts do not fit in 64 bits");
		fail(e);
	}
	th->cum_insn = ci;
	th->cum_cyc = cc;
	int64_t slot = (int64_t)th->log.n;
	size_t n = th->upd_slot.n;
	if (n && th->upd_slot.v[n - 1] == slot) {
		th->upd_insn.v[n - 1] = ci;
		th->upd_cyc.v[n - 1] = cc;
	} else {
		vec_push(e, &th->upd_slot, slot);
		vec_push(e, &th->upd_insn, ci);
		vec_push(e, &th->upd_cyc, cc);
	}
}

/* engine.py: _unexpected (the message is formatted in Python) */
static void unexpected(Engine *e, Thread *th, int what, int32_t fn, int32_t fn2)
{
	e->unexpected++;
	if (e->nexamples < e->max_examples)
		e->examples[e->nexamples++] = (Example){what, th->tid, th->last_time, fn, fn2};
}

/* ------------------------------------------------------------- stack surgery */

/* engine.py: _first_frame */
static void first_frame(Engine *e, Thread *th, Ctx *c, int32_t loc, int64_t flags)
{
	int32_t fn = e->loc_fn[loc];
	int64_t ix = new_frame(e, th, fn, c->parent, c->start_slot, e->loc_entry[loc], flags, 0);
	push_handle(e, c, fn, ix);
	push_top(e, c, ix);
}

/* engine.py: _break */
static void break_segment(Engine *e, Thread *th, int64_t slot)
{
	Ctx *c = cur(th);
	if (!c->nframes && c->detached) {
		c->start_slot = slot;
		return;
	}
	c->suspend_slot = slot;
	push_ctx(e, th, -1, true, slot);
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
		new_frame(e, th, fn, c->parent, c->start_slot, e->loc_entry[loc], FL_INFERRED, 0);
	for (size_t k = 0; k < c->ntop; k++)
		frame(th, c->top[k])[F_PARENT] = root;
	c->ntop = 0;
	push_top(e, c, root);
	for (size_t k = 0; k < c->nframes; k++)
		close_frame(th, c->frames[k].ix, slot, 0);
	c->nframes = 0;
	push_handle(e, c, fn, root);
	e->roots_inferred++;
}

/* Functions whose return is special (engine.py: SPECIAL_RETURNS). */
#define FN_SWITCHES 1 /* engine.py: STACK_SWITCHERS */
#define FN_SETJMP 2   /* engine.py: SETJMPS */

static inline int fn_flags(Engine *e, int32_t fn)
{
	return (size_t)fn < e->nfn_flags ? e->fn_flags[fn] : 0;
}

static inline bool switches_stack(Engine *e, int32_t fn)
{
	return fn_flags(e, fn) & FN_SWITCHES;
}

/* The call-site ranges whose exceptions land at location `loc` (engine.py: the
 * landing_pads lookup), asked once per location through the Python callback. */
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
	int64_t first = (int64_t)e->pad_ranges.n, count = 0;
	PyObject *res = PyObject_CallFunction(e->landing_pads, "i", loc);
	PyObject *seq = res ? PySequence_Fast(res, "landing pads: not a sequence") : NULL;
	if (seq) {
		for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
			long long a, b;
			if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "LL", &a, &b))
				break;
			vec_push(e, &e->pad_ranges, a);
			vec_push(e, &e->pad_ranges, b);
			count++;
		}
	}
	Py_XDECREF(seq);
	Py_XDECREF(res);
	PyErr_Clear(); /* a lookup that fails knows no landing pad: the nearest frame wins */
	vec_push(e, &e->pad_index, loc);
	vec_push(e, &e->pad_index, first);
	vec_push(e, &e->pad_index, count);
	*ranges = e->pad_ranges.v + first;
	*n = (size_t)count;
}

static bool resumes_at(Thread *th, int64_t ix, uint64_t ip)
{
	/* The newest entry of a frame is its resume point. */
	for (size_t k = th->resume.n; k >= 2; k -= 2) {
		if (th->resume.v[k - 2] == ix)
			return (uint64_t)th->resume.v[k - 1] == ip;
	}
	return false;
}

/* engine.py: _resumed_frame (top may be -1) */
static ptrdiff_t resumed_frame(Engine *e, Thread *th, Ctx *c, ptrdiff_t top, int32_t fn,
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
			uint64_t site = (uint64_t)frame(th, c->frames[i + 1].ix)[F_CALLSITE];
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
	return i + 1 == n ||
	       (i + 2 == n && (frame(th, c->frames[n - 1].ix)[F_FLAGS] & FL_SYNTHETIC));
}

/* engine.py: _land_on */
static void land_on(Engine *e, Thread *th, size_t ci, size_t fi, int64_t t)
{
	Ctx *target = th->ctxs[ci];
	int64_t landed = target->frames[fi].ix;
	int64_t end = take_slot(e, th, t, 0);
	for (size_t j = th->nctx - 1; j > ci; j--) {
		Ctx *c = th->ctxs[j];
		for (size_t k = 0; k < c->nframes; k++)
			close_frame(th, c->frames[k].ix, end, 0);
		if (c->detached) {
			for (size_t k = 0; k < c->ntop; k++)
				frame(th, c->top[k])[F_PARENT] = landed;
			e->stitched++;
			end = th->ctxs[j - 1]->suspend_slot;
		}
	}
	close_above(th, target, fi, end, FL_OPEN_AT_END);
	th->nctx = ci + 1;
	target->suspend_slot = -1;
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
	for (size_t i = n >= 2 ? n - 1 : 0; i-- > 0;) {
		if (c->frames[i].fn == fn) {
			/* Frames above returned without us seeing it (lost data). */
			unexpected(e, th, 0, fn, c->frames[n - 1].fn);
			close_above(th, c, i, take_slot(e, th, t, 0), FL_OPEN_AT_END);
			return c;
		}
	}
	if (land(e, th, fn, t, false, -1))
		return cur(th);
	if (n) {
		unexpected(e, th, 1, fn, -1);
		c = push_detached(e, th, t);
	}
	first_frame(e, th, c, src, FL_INFERRED);
	return c;
}

/* ------------------------------------------------------------------ handlers */

/* engine.py: _return_slow */
/* engine.py: _stack_switch */
static void stack_switch(Engine *e, Thread *th, int32_t dst, int64_t t)
{
	uint64_t ip = e->loc_ip[dst];
	size_t found = SIZE_MAX;
	for (size_t ci = th->nctx - 1; ci-- > 0;) {
		Ctx *c = th->ctxs[ci];
		if (!c->nframes || !switches_stack(e, c->frames[c->nframes - 1].fn))
			continue;
		uint64_t site = (uint64_t)frame(th, c->frames[c->nframes - 1].ix)[F_CALLSITE];
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
		close_frame(th, target->frames[target->nframes - 1].ix, take_slot(e, th, t, 0), 0);
		target->nframes--;
		return;
	}
	Ctx *c = push_detached(e, th, t);
	c->switched_in = true;
	first_frame(e, th, c, dst, e->loc_off[dst] == 0 ? 0 : FL_INFERRED);
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
		close_frame(th, c->frames[--c->nframes].ix, take_slot(e, th, t, 0), 0);
		vec_push(e, &th->resume, c->frames[c->nframes - 1].ix);
		vec_push(e, &th->resume, (int64_t)e->loc_ip[dst]);
		return;
	}
	if (!c->nframes) {
		c = sync_source(e, th, src, t);
		size_t n = c->nframes;
		if (n >= 2 && c->frames[n - 2].fn == fn) {
			close_frame(th, c->frames[n - 1].ix, take_slot(e, th, t, 0), 0);
			c->nframes--;
			return;
		}
	}
	size_t n = c->nframes;
	ptrdiff_t i = resumed_frame(e, th, c, (ptrdiff_t)n - 3, fn, dst);
	if (i >= 0) {
		/* A return past several frames (exception unwinding, longjmp via ret). */
		close_above(th, c, (size_t)i, take_slot(e, th, t, 0), 0);
		return;
	}
	Handle top = c->frames[n - 1];
	uint64_t callsite = (uint64_t)frame(th, top.ix)[F_CALLSITE];
	uint64_t ip = e->loc_ip[dst];
	if (callsite && ip > callsite && ip - callsite <= MAX_INSN && n > 1) {
		/* An assembly label right after the call: the caller carries on under it. */
		close_frame(th, top.ix, take_slot(e, th, t, 0), 0);
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
	first_frame(e, th, c, dst, FL_INFERRED);
}

/* engine.py: _jump */
static void jump(Engine *e, Thread *th, int32_t src, int32_t dst, int64_t t)
{
	int32_t fn = e->loc_fn[dst];
	Ctx *c = cur(th);
	/* Only a known symbol has boundaries (engine.py: the same comment). */
	if (e->loc_off[dst] > 0) {
		ptrdiff_t i = resumed_frame(e, th, c, (ptrdiff_t)c->nframes - 2, fn, dst);
		if (i >= 0) {
			/* Into the middle of a caller: longjmp, landing pad, OCaml raise. */
			close_above(th, c, (size_t)i, take_slot(e, th, t, 0), 0);
			return;
		}
		if (land(e, th, fn, t, false, dst))
			return;
	}
	c = sync_source(e, th, src, t);
	if (c->frames[c->nframes - 1].fn == fn)
		return;
	/* A tail call, or a jump into an unrelated function: the leaf is replaced. */
	int64_t slot = take_slot(e, th, t, CALL_SLOT);
	int64_t old = c->frames[--c->nframes].ix;
	close_frame(th, old, slot, 0);
	int64_t parent = frame(th, old)[F_PARENT];
	/* The new function returns where the old one would have: same call site. */
	int64_t ix =
	    new_frame(e, th, fn, parent, slot, e->loc_entry[dst], 0, frame(th, old)[F_CALLSITE]);
	push_handle(e, c, fn, ix);
	if (c->nframes == 1)
		push_top(e, c, ix);
}

/* engine.py: _enter_nested */
static void enter_nested(Engine *e, Thread *th, int32_t src, int32_t dst, int64_t t)
{
	Ctx *c = sync_source(e, th, src, t);
	int64_t slot = take_slot(e, th, t, CALL_SLOT);
	int64_t parent = c->frames[c->nframes - 1].ix;
	Ctx *nested = push_ctx(e, th, parent, false, slot);
	int32_t fn = e->loc_fn[dst];
	int64_t ix = new_frame(e, th, fn, parent, slot, e->loc_entry[dst], 0, 0);
	push_handle(e, nested, fn, ix);
	push_top(e, nested, ix);
}

/* engine.py: _long_return */
static void long_return(Engine *e, Thread *th, int32_t dst, int64_t t)
{
	int32_t fn = e->loc_fn[dst];
	Ctx *c = cur(th);
	size_t n = c->nframes;
	for (size_t i = n >= 2 ? n - 1 : 0; i-- > 0;) {
		if (c->frames[i].fn == fn) {
			close_above(th, c, i, take_slot(e, th, t, 0), 0);
			return;
		}
	}
	if (land(e, th, fn, t, false, -1))
		return;
	if (!n) {
		first_frame(e, th, c, dst, FL_INFERRED);
		return;
	}
	add_root(e, th, c, dst, t);
}

/* engine.py: _trace_end */
static void trace_end(Engine *e, Thread *th, int kind, int32_t src, int64_t t)
{
	Ctx *c = sync_source(e, th, src, t);
	if (kind == K_RETURN && c->nframes >= 2) {
		close_frame(th, c->frames[c->nframes - 1].ix, take_slot(e, th, t, 0), 0);
		c->nframes--;
	} else if ((kind == K_SYSRET || kind == K_IRET) && th->nctx > 1 && !c->detached) {
		int64_t slot = take_slot(e, th, t, 0);
		for (size_t k = 0; k < c->nframes; k++)
			close_frame(th, c->frames[k].ix, slot, 0);
		th->nctx--;
		c = cur(th);
		if (!c->nframes)
			return;
	}
	int32_t name = kind == K_SYSCALL ? NAME_SYSCALL : NAME_UNTRACED;
	int64_t flags = FL_SYNTHETIC | (kind == K_CALL ? FL_AFTER_CALL : 0);
	int64_t slot = take_slot(e, th, t, CALL_SLOT);
	int64_t ix = new_frame(e, th, name, c->frames[c->nframes - 1].ix, slot, 0, flags, 0);
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
			first_frame(e, th, c, dst, FL_INFERRED);
		return;
	}
	Handle *top = &c->frames[n - 1];
	if (top->fn == fn)
		return;
	for (size_t i = n - 1; i-- > 0;) {
		if (c->frames[i].fn == fn) {
			if (entry && !stopped_in(th, c, i))
				break;
			close_above(th, c, i, take_slot(e, th, t, 0), 0);
			return;
		}
	}
	int64_t *f = frame(th, top->ix);
	if (f[F_FLAGS] & FL_AFTER_CALL) {
		/* `tr end  call` then resume in a new function: that is the callee. */
		top->fn = fn;
		f[F_FLAGS] = (int64_t)fn << NAME_SHIFT;
		f[F_ADDR] = e->loc_entry[dst];
		return;
	}
	if (land(e, th, fn, t, entry, -1))
		return;
	c = push_detached(e, th, t);
	first_frame(e, th, c, dst, entry ? 0 : FL_INFERRED);
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
		int64_t slot = take_slot(e, th, t, CALL_SLOT);
		int64_t ix = new_frame(e, th, fn, c->frames[c->nframes - 1].ix, slot,
				       e->loc_entry[dst], 0, (int64_t)e->loc_ip[src]);
		push_handle(e, c, fn, ix);
		return;
	}
	case K_RETURN: {
		Ctx *c = cur(th);
		size_t n = c->nframes;
		if (n >= 2 && c->frames[n - 2].fn == e->loc_fn[dst] &&
		    !fn_flags(e, e->loc_fn[src])) {
			close_frame(th, c->frames[n - 1].ix, take_slot(e, th, t, 0), 0);
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
	default:
		e->ignored++;
	}
}

/* engine.py: _gap_slot */
static inline void gap_slot(Engine *e, Thread *th, int64_t gap_time, int64_t t)
{
	if ((th->log.v[th->log.n - 1] >> 2) < gap_time && gap_time < t)
		vec_push(e, &th->log, gap_time * 4);
}

/* engine.py: TraceSegmentEngine._branch (in-transaction events and what follows them) */
static void branch_slow(Engine *e, Thread *th, int kind, int state, bool in_tx, int32_t src,
			int32_t dst, int64_t time, uint64_t insns, uint64_t cycles,
			int64_t gap_time)
{
	e->events++;
	e->branches++;
	int64_t t = time < th->last_time ? th->last_time : time;
	th->last_time = t;
	if (gap_time)
		gap_slot(e, th, gap_time, t);
	if (insns || cycles)
		count(e, th, insns, cycles);
	if (in_tx) {
		if (th->ntx == th->captx)
			th->txq = grow(e, th->txq, &th->captx, th->ntx + 1, sizeof(TxEvent));
		th->txq[th->ntx++] = (TxEvent){kind, state, src, dst, time};
		return;
	}
	if (th->ntx) {
		size_t queued = th->ntx;
		th->ntx = 0;
		if (kind != K_TX_ABORT) {
			/* apply() never queues, so the buffer stays as it is while we walk it. */
			for (size_t k = 0; k < queued; k++) {
				TxEvent q = th->txq[k];
				/* engine.py: never before what the thread logged since, nor after now. */
				int64_t logged = th->log.v[th->log.n - 1] >> 2;
				int64_t tq = q.time > logged ? q.time : logged;
				apply(e, th, q.kind, q.state, q.src, q.dst, tq <= t ? tq : t);
			}
		}
	}
	apply(e, th, kind, state, src, dst, t);
}

/* engine.py: TraceSegmentEngine._close_all */
static void close_all(Engine *e, Thread *th)
{
	int64_t end = take_slot(e, th, th->last_time, 0);
	for (size_t j = th->nctx; j-- > 0;) {
		Ctx *c = th->ctxs[j];
		for (size_t k = 0; k < c->nframes; k++)
			close_frame(th, c->frames[k].ix, end, FL_OPEN_AT_END);
		c->nframes = 0;
		if (j > 0 && c->detached)
			end = th->ctxs[j - 1]->suspend_slot;
	}
}

/* -------------------------------------------------------- buffers handed out */

/* A block of memory handed to Python (numpy reads it through the buffer protocol). */
typedef struct {
	PyObject_HEAD
	void *data;
	Py_ssize_t nbytes;
} Block;

static int64_t empty_block_storage;

static void block_dealloc(Block *self)
{
	free(self->data);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int block_getbuffer(Block *self, Py_buffer *view, int flags)
{
	void *data = self->data ? self->data : &empty_block_storage;
	return PyBuffer_FillInfo(view, (PyObject *)self, data, self->nbytes, 0, flags);
}

static PyBufferProcs block_as_buffer = {
	.bf_getbuffer = (getbufferproc)block_getbuffer,
};

static PyTypeObject BlockType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptscope.reconstruct._cengine.Block",
	.tp_basicsize = sizeof(Block),
	.tp_dealloc = (destructor)block_dealloc,
	.tp_as_buffer = &block_as_buffer,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "Memory handed over by the engine (read it with numpy.frombuffer).",
};

/* Wrap `data` (malloc'd, now owned by the block; freed here if wrapping fails). */
static PyObject *block_new(void *data, size_t nbytes)
{
	Block *b = PyObject_New(Block, &BlockType);
	if (!b) {
		free(data);
		return NULL;
	}
	b->data = data;
	b->nbytes = (Py_ssize_t)nbytes;
	return (PyObject *)b;
}

static PyObject *vec_block(Vec *a)
{
	if (a->n && a->n < a->cap) {
		/* Give back the growth slack (up to a third of a big array). */
		int64_t *v = realloc(a->v, a->n * sizeof(int64_t));
		if (v)
			a->v = v;
	}
	PyObject *b = block_new(a->v, a->n * sizeof(int64_t));
	a->v = NULL;
	a->n = a->cap = 0;
	return b;
}

/* ------------------------------------------------------------ Python methods */

#define GUARD(e)                                                                          \
	do {                                                                              \
		if ((e)->broken) {                                                        \
			PyErr_SetString(PyExc_RuntimeError,                               \
					"the engine failed earlier and cannot continue");         \
			return NULL;                                                      \
		}                                                                         \
	} while (0)

static int engine_init(Engine *e, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"max_examples", NULL};
	Py_ssize_t max_examples = 5;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "|n", kwlist, &max_examples))
		return -1;
	if (e->threads || e->nloc) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is already initialised");
		return -1;
	}
	if (max_examples < 0)
		max_examples = 0;
	free(e->examples);
	e->examples = calloc((size_t)max_examples + 1, sizeof(Example));
	if (!e->examples) {
		PyErr_NoMemory();
		return -1;
	}
	e->max_examples = max_examples;
	return 0;
}

static void free_thread(Thread *th)
{
	free(th->fd.v);
	free(th->log.v);
	free(th->upd_slot.v);
	free(th->upd_insn.v);
	free(th->upd_cyc.v);
	free(th->instants.v);
	free(th->counters.v);
	free(th->resume.v);
	for (size_t i = 0; i < th->pool; i++) {
		free(th->ctxs[i]->frames);
		free(th->ctxs[i]->top);
		free(th->ctxs[i]);
	}
	free(th->ctxs);
	free(th->txq);
	free(th);
}

static void engine_dealloc(Engine *e)
{
	for (size_t i = 0; i < e->nthreads; i++)
		free_thread(e->threads[i]);
	free(e->threads);
	free(e->map);
	free(e->loc_fn);
	free(e->loc_entry);
	free(e->loc_off);
	free(e->loc_ip);
	free(e->fn_flags);
	Py_XDECREF(e->landing_pads);
	free(e->pad_index.v);
	free(e->pad_ranges.v);
	free(e->examples);
	free(e->out_of);
	Py_TYPE(e)->tp_free((PyObject *)e);
}

/* A 1-D buffer of `n` items of `size` bytes (any stride). */
typedef struct {
	Py_buffer view;
	const char *p;
	Py_ssize_t stride;
	bool held;
} Column;

static int column_get(Column *c, PyObject *obj, Py_ssize_t size, const char *name)
{
	if (PyObject_GetBuffer(obj, &c->view, PyBUF_STRIDED_RO) < 0)
		return -1;
	c->held = true;
	if (c->view.ndim != 1 || c->view.itemsize != size) {
		PyErr_Format(PyExc_ValueError, "%s must be a 1-D buffer of %zd-byte items", name,
			     size);
		return -1;
	}
	c->p = c->view.buf;
	c->stride = c->view.strides ? c->view.strides[0] : size;
	return 0;
}

static void columns_release(Column *cols, int n)
{
	for (int i = 0; i < n; i++)
		if (cols[i].held)
			PyBuffer_Release(&cols[i].view);
}

#define AT(col, type, i) (*(const type *)((col).p + (i) * (col).stride))

static PyObject *engine_add_locations(Engine *e, PyObject *args)
{
	PyObject *objs[4];
	if (!PyArg_ParseTuple(args, "OOOO", &objs[0], &objs[1], &objs[2], &objs[3]))
		return NULL;
	GUARD(e);
	static const char *names[] = {"function", "entry", "offset", "ip"};
	static const Py_ssize_t sizes[] = {4, 8, 8, 8};
	Column cols[4] = {0};
	for (int i = 0; i < 4; i++) {
		if (column_get(&cols[i], objs[i], sizes[i], names[i]) < 0) {
			columns_release(cols, 4);
			return NULL;
		}
	}
	Py_ssize_t n = cols[0].view.shape[0];
	for (int i = 1; i < 4; i++) {
		if (cols[i].view.shape[0] != n) {
			columns_release(cols, 4);
			PyErr_SetString(PyExc_ValueError, "location columns differ in length");
			return NULL;
		}
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		if (AT(cols[0], int32_t, i) < 0) {
			columns_release(cols, 4);
			PyErr_SetString(PyExc_ValueError, "negative function id");
			return NULL;
		}
	}
	if ((size_t)n > (size_t)INT32_MAX - e->nloc) {
		columns_release(cols, 4);
		PyErr_SetString(PyExc_OverflowError, "too many locations");
		return NULL;
	}
	size_t need = e->nloc + (size_t)n;
	if (need > e->caploc) {
		size_t cap = e->caploc ? e->caploc : 256;
		while (cap < need)
			cap *= 2;
		int32_t *fn = realloc(e->loc_fn, cap * sizeof(int32_t));
		if (fn)
			e->loc_fn = fn;
		int64_t *entry = realloc(e->loc_entry, cap * sizeof(int64_t));
		if (entry)
			e->loc_entry = entry;
		int64_t *off = realloc(e->loc_off, cap * sizeof(int64_t));
		if (off)
			e->loc_off = off;
		uint64_t *ip = realloc(e->loc_ip, cap * sizeof(uint64_t));
		if (ip)
			e->loc_ip = ip;
		if (!fn || !entry || !off || !ip) {
			columns_release(cols, 4);
			return PyErr_NoMemory();
		}
		e->caploc = cap;
	}
	for (Py_ssize_t i = 0; i < n; i++) {
		size_t k = e->nloc + (size_t)i;
		e->loc_fn[k] = AT(cols[0], int32_t, i);
		e->loc_entry[k] = AT(cols[1], int64_t, i);
		e->loc_off[k] = AT(cols[2], int64_t, i);
		e->loc_ip[k] = AT(cols[3], uint64_t, i);
	}
	e->nloc = need;
	columns_release(cols, 4);
	return PyLong_FromSize_t(e->nloc);
}

static PyObject *engine_mark_function(Engine *e, PyObject *args)
{
	int fn, flags;
	if (!PyArg_ParseTuple(args, "ii", &fn, &flags))
		return NULL;
	GUARD(e);
	if (fn < 0 || flags < 0 || flags > (FN_SWITCHES | FN_SETJMP)) {
		PyErr_SetString(PyExc_ValueError, "bad function id or flags");
		return NULL;
	}
	if ((size_t)fn >= e->nfn_flags) {
		size_t cap = (size_t)fn + 64;
		uint8_t *v = realloc(e->fn_flags, cap);
		if (!v)
			return PyErr_NoMemory();
		memset(v + e->nfn_flags, 0, cap - e->nfn_flags);
		e->fn_flags = v;
		e->nfn_flags = cap;
	}
	e->fn_flags[fn] = (uint8_t)flags;
	Py_RETURN_NONE;
}

static PyObject *engine_set_landing_pads(Engine *e, PyObject *args)
{
	PyObject *cb;
	if (!PyArg_ParseTuple(args, "O", &cb))
		return NULL;
	GUARD(e);
	if (cb != Py_None && !PyCallable_Check(cb)) {
		PyErr_SetString(PyExc_TypeError, "landing pads: a callable or None");
		return NULL;
	}
	Py_XDECREF(e->landing_pads);
	e->landing_pads = cb == Py_None ? NULL : Py_NewRef(cb);
	e->pad_index.n = e->pad_ranges.n = 0;
	Py_RETURN_NONE;
}

enum { C_PID, C_TID, C_TIME, C_FLAGS, C_SRC, C_DST, C_INSN, C_CYC, C_GAP, NCOLS };

static PyObject *engine_feed_batch(Engine *e, PyObject *args)
{
	PyObject *objs[NCOLS];
	if (!PyArg_ParseTuple(args, "OOOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3],
			      &objs[4], &objs[5], &objs[6], &objs[7], &objs[8]))
		return NULL;
	GUARD(e);
	if (e->closed) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is finished");
		return NULL;
	}
	static const char *names[] = {"pid", "tid",	   "time",	  "flags",    "src",
				      "dst", "insn_count", "cycle_count", "gap_delta"};
	static const Py_ssize_t sizes[] = {4, 4, 8, 4, 4, 4, 8, 8, 4};
	Column cols[NCOLS] = {0};
	for (int i = 0; i < NCOLS; i++) {
		if (column_get(&cols[i], objs[i], sizes[i], names[i]) < 0) {
			columns_release(cols, NCOLS);
			return NULL;
		}
	}
	Py_ssize_t n = cols[0].view.shape[0];
	for (int i = 1; i < NCOLS; i++) {
		if (cols[i].view.shape[0] != n) {
			columns_release(cols, NCOLS);
			PyErr_SetString(PyExc_ValueError, "batch columns differ in length");
			return NULL;
		}
	}
	/* Refuse bad rows before changing anything. */
	int64_t nloc = (int64_t)e->nloc;
	for (Py_ssize_t i = 0; i < n; i++) {
		int32_t src = AT(cols[C_SRC], int32_t, i), dst = AT(cols[C_DST], int32_t, i);
		int64_t time = AT(cols[C_TIME], int64_t, i);
		if (src < 0 || src >= nloc || dst < 0 || dst >= nloc) {
			columns_release(cols, NCOLS);
			PyErr_Format(PyExc_ValueError,
				     "branch %zd names location %d, not in the table (%lld locations)",
				     i, src < 0 || src >= nloc ? src : dst, (long long)nloc);
			return NULL;
		}
		if (time >= TIME_LIMIT || time <= -TIME_LIMIT) {
			columns_release(cols, NCOLS);
			PyErr_Format(PyExc_OverflowError, "branch %zd has an out-of-range time %lld",
				     i, (long long)time);
			return NULL;
		}
	}
	if (setjmp(e->jb)) {
		e->broken = true;
		columns_release(cols, NCOLS);
		return NULL;
	}
	Thread *th = NULL;
	int64_t cur_pid = 0, cur_tid = 0;
	for (Py_ssize_t i = 0; i < n; i++) {
		int32_t pid = AT(cols[C_PID], int32_t, i), tid = AT(cols[C_TID], int32_t, i);
		int64_t time = AT(cols[C_TIME], int64_t, i);
		uint32_t flags = AT(cols[C_FLAGS], uint32_t, i);
		int32_t src = AT(cols[C_SRC], int32_t, i), dst = AT(cols[C_DST], int32_t, i);
		uint64_t insns = AT(cols[C_INSN], uint64_t, i);
		uint64_t cycles = AT(cols[C_CYC], uint64_t, i);
		uint32_t gap_delta = AT(cols[C_GAP], uint32_t, i);
		int64_t gap_time = gap_delta ? time - (int64_t)gap_delta : 0;
		uint8_t ks = kind_state[flags & (FLAG_TABLE_SIZE - 1)];
		int kind = ks & 15, state = ks >> 4;
		if (!th || tid != cur_tid || pid != cur_pid) {
			cur_pid = pid;
			cur_tid = tid;
			/* A first branch's gap time is when the thread's history starts
			 * (engine.py: _branch). */
			th = thread_of(e, pid, tid, gap_time ? gap_time : time);
		}
		if ((flags & IN_TX_FLAG) || th->ntx) {
			branch_slow(e, th, kind, state, flags & IN_TX_FLAG, src, dst, time, insns,
				    cycles, gap_time);
			continue;
		}
		e->events++;
		e->branches++;
		int64_t t = time;
		if (t < th->last_time)
			t = th->last_time;
		else
			th->last_time = t;
		if (gap_time)
			gap_slot(e, th, gap_time, t);
		if (insns || cycles)
			count(e, th, insns, cycles);
		apply(e, th, kind, state, src, dst, t);
	}
	columns_release(cols, NCOLS);
	Py_RETURN_NONE;
}

static int check_time(long long time)
{
	if (time >= TIME_LIMIT || time <= -TIME_LIMIT) {
		PyErr_Format(PyExc_OverflowError, "out-of-range time %lld", time);
		return -1;
	}
	return 0;
}

/* engine.py: TraceSegmentEngine.decode_error. pid/tid < 0: unknown. Returns whether the
 * error was attributed to a thread (if not, Python keeps it as an orphan). */
static PyObject *engine_decode_error(Engine *e, PyObject *args)
{
	long long pid, tid, time;
	int has_time;
	Py_ssize_t message;
	if (!PyArg_ParseTuple(args, "LLpLn", &pid, &tid, &has_time, &time, &message))
		return NULL;
	GUARD(e);
	if (e->closed) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is finished");
		return NULL;
	}
	if (has_time && check_time(time) < 0)
		return NULL;
	if (setjmp(e->jb)) {
		e->broken = true;
		return NULL;
	}
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
		Py_RETURN_FALSE;
	int64_t t = has_time ? time : th->last_time;
	if (t < th->last_time)
		t = th->last_time;
	th->last_time = t;
	/* engine.py: whether a pending transaction committed is unknowable now: drop it. */
	th->ntx = 0;
	int64_t slot = take_slot(e, th, t, START_SLOT);
	vec_push(e, &th->instants, slot);
	vec_push(e, &th->instants, message);
	break_segment(e, th, slot);
	Py_RETURN_TRUE;
}

/* engine.py: TraceSegmentEngine._power (a counter sample) */
static PyObject *engine_counter(Engine *e, PyObject *args)
{
	long long pid, tid, time, value;
	Py_ssize_t name;
	if (!PyArg_ParseTuple(args, "LLLnL", &pid, &tid, &time, &name, &value))
		return NULL;
	GUARD(e);
	if (e->closed) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is finished");
		return NULL;
	}
	if (check_time(time) < 0)
		return NULL;
	if (setjmp(e->jb)) {
		e->broken = true;
		return NULL;
	}
	e->events++;
	Thread *th = thread_of(e, pid, tid, time);
	int64_t t = time > th->last_time ? time : th->last_time;
	th->last_time = t;
	vec_push(e, &th->counters, (int64_t)th->log.n);
	vec_push(e, &th->counters, name);
	vec_push(e, &th->counters, value);
	vec_push(e, &th->log, t * 4);
	Py_RETURN_NONE;
}

/* engine.py: TraceSegmentEngine.end_segment */
static PyObject *engine_end_segment(Engine *e, PyObject *Py_UNUSED(ignored))
{
	GUARD(e);
	if (e->closed) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is finished");
		return NULL;
	}
	if (setjmp(e->jb)) {
		e->broken = true;
		return NULL;
	}
	for (size_t i = 0; i < e->nthreads; i++) {
		Thread *th = e->threads[i];
		int64_t slot = take_slot(e, th, th->last_time, 0);
		break_segment(e, th, slot);
	}
	Py_RETURN_NONE;
}

static PyObject *engine_slot_count(Engine *e, PyObject *args)
{
	long long pid, tid;
	if (!PyArg_ParseTuple(args, "LL", &pid, &tid))
		return NULL;
	Thread *th = find_thread(e, pid, tid);
	return PyLong_FromSize_t(!th ? 0 : th->taken ? th->final_slots : th->log.n);
}

static PyObject *engine_stats(Engine *e, PyObject *Py_UNUSED(ignored))
{
	return Py_BuildValue("(LLLLLLLL)", (long long)e->events, (long long)e->branches,
			     (long long)e->decode_errors, (long long)e->segments_started,
			     (long long)e->stitched, (long long)e->roots_inferred,
			     (long long)e->unexpected, (long long)e->ignored);
}

static PyObject *engine_examples(Engine *e, PyObject *Py_UNUSED(ignored))
{
	PyObject *list = PyList_New(e->nexamples);
	if (!list)
		return NULL;
	for (Py_ssize_t i = 0; i < e->nexamples; i++) {
		Example *x = &e->examples[i];
		PyObject *item = Py_BuildValue("(iLLii)", x->what, (long long)x->tid,
					       (long long)x->time, x->fn, x->fn2);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, i, item);
	}
	return list;
}

static PyObject *engine_thread_keys(Engine *e, PyObject *Py_UNUSED(ignored))
{
	PyObject *list = PyList_New((Py_ssize_t)e->nthreads);
	if (!list)
		return NULL;
	for (size_t i = 0; i < e->nthreads; i++) {
		PyObject *item = Py_BuildValue("(LL)", (long long)e->threads[i]->pid,
					       (long long)e->threads[i]->tid);
		if (!item) {
			Py_DECREF(list);
			return NULL;
		}
		PyList_SET_ITEM(list, (Py_ssize_t)i, item);
	}
	return list;
}

/* finish(), first half: close every thread's open frames (engine.py: _close_all). */
static PyObject *engine_close_all(Engine *e, PyObject *Py_UNUSED(ignored))
{
	GUARD(e);
	if (e->closed) {
		PyErr_SetString(PyExc_RuntimeError, "the engine is finished");
		return NULL;
	}
	if (setjmp(e->jb)) {
		e->broken = true;
		return NULL;
	}
	for (size_t i = 0; i < e->nthreads; i++)
		close_all(e, e->threads[i]);
	e->closed = true;
	Py_RETURN_NONE;
}

/* Depth of every frame (number of ancestors), in one pass with an explicit stack. */
static int32_t *frame_depths(const int64_t *fd, size_t n)
{
	int32_t *depth = malloc((n ? n : 1) * sizeof(int32_t));
	int64_t *stack = malloc((n ? n : 1) * sizeof(int64_t));
	if (!depth || !stack) {
		free(depth);
		free(stack);
		PyErr_NoMemory();
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		depth[i] = -1;
	for (size_t i = 0; i < n; i++) {
		if (depth[i] >= 0)
			continue;
		size_t sp = 0;
		int64_t j = (int64_t)i;
		while (j >= 0) {
			if (sp == n || j >= (int64_t)n) {
				free(depth);
				free(stack);
				PyErr_SetString(PyExc_RuntimeError, "frame parents are inconsistent");
				return NULL;
			}
			if (depth[j] >= 0)
				break;
			stack[sp++] = j;
			j = fd[j * NFIELDS + F_PARENT];
		}
		int32_t d = j < 0 ? -1 : depth[j];
		while (sp)
			depth[stack[--sp]] = ++d;
	}
	free(stack);
	return depth;
}

/* finish(), second half, one thread at a time (in the order the caller wants the names):
 * hands over the thread's arrays and gives its frames output name ids, numbered in order
 * of first appearance. Returns (fd, log, update_slots, insn_counts, cycle_counts,
 * instants, counters, name_ids, depths, new_names), the first nine as Blocks (int64 but
 * name_ids and depths: int32), new_names the engine name ids that got output ids here. */
static PyObject *engine_take_thread(Engine *e, PyObject *args)
{
	Py_ssize_t index;
	if (!PyArg_ParseTuple(args, "n", &index))
		return NULL;
	GUARD(e);
	if (!e->closed) {
		PyErr_SetString(PyExc_RuntimeError, "close_all() first");
		return NULL;
	}
	if (index < 0 || (size_t)index >= e->nthreads) {
		PyErr_SetString(PyExc_IndexError, "no such thread");
		return NULL;
	}
	Thread *th = e->threads[index];
	if (th->taken) {
		PyErr_SetString(PyExc_RuntimeError, "thread already taken");
		return NULL;
	}
	size_t n = th->fd.n / NFIELDS;
	const int64_t *fd = th->fd.v;
	int32_t *ids = malloc((n ? n : 1) * sizeof(int32_t));
	if (!ids)
		return PyErr_NoMemory();
	PyObject *fresh = PyList_New(0);
	if (!fresh) {
		free(ids);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t name = fd[i * NFIELDS + F_FLAGS] >> NAME_SHIFT;
		if ((size_t)name >= e->nout_of) {
			size_t cap = e->nout_of ? e->nout_of : 64;
			while (cap <= (size_t)name)
				cap *= 2;
			int32_t *out = realloc(e->out_of, cap * sizeof(int32_t));
			if (!out) {
				free(ids);
				Py_DECREF(fresh);
				return PyErr_NoMemory();
			}
			for (size_t k = e->nout_of; k < cap; k++)
				out[k] = -1;
			e->out_of = out;
			e->nout_of = cap;
		}
		if (e->out_of[name] < 0) {
			PyObject *v = PyLong_FromLongLong(name);
			if (!v || PyList_Append(fresh, v) < 0) {
				Py_XDECREF(v);
				free(ids);
				Py_DECREF(fresh);
				return NULL;
			}
			Py_DECREF(v);
			e->out_of[name] = e->nout++;
		}
		ids[i] = e->out_of[name];
	}
	int32_t *depths = frame_depths(fd, n);
	if (!depths) {
		free(ids);
		Py_DECREF(fresh);
		return NULL;
	}
	th->final_slots = th->log.n;
	PyObject *items[10] = {
		block_new(ids, n * sizeof(int32_t)), block_new(depths, n * sizeof(int32_t)),
		vec_block(&th->fd), vec_block(&th->log), vec_block(&th->upd_slot),
		vec_block(&th->upd_insn), vec_block(&th->upd_cyc), vec_block(&th->instants),
		vec_block(&th->counters), fresh,
	};
	th->taken = true;
	PyObject *result = NULL;
	bool ok = true;
	for (int i = 0; i < 10; i++)
		ok = ok && items[i];
	if (ok)
		result = Py_BuildValue("(OOOOOOOOOO)", items[2], items[3], items[4], items[5],
				       items[6], items[7], items[8], items[0], items[1], items[9]);
	for (int i = 0; i < 10; i++)
		Py_XDECREF(items[i]);
	return result;
}

/* ------------------------------------------------------------ the final pass */

/* The twin of engine.build_thread_timeline, for speed: the numpy version allocates a dozen
 * temporaries the size of the trace, and first touching those pages costs more than the
 * arithmetic. Arithmetic wraps around as numpy's int64 does. */

static inline int64_t wadd(int64_t a, int64_t b)
{
	return (int64_t)((uint64_t)a + (uint64_t)b);
}

static inline int64_t wsub(int64_t a, int64_t b)
{
	return (int64_t)((uint64_t)a - (uint64_t)b);
}

static inline int64_t wmul(int64_t a, int64_t b)
{
	return (int64_t)((uint64_t)a * (uint64_t)b);
}

/* numpy's // for a positive divisor (rounds towards minus infinity). */
static inline int64_t floordiv(int64_t a, int64_t b)
{
	int64_t q = a / b;
	return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* engine._slot_times: slots to nanoseconds (see "Time" in engine.py). `member` is n bytes
 * of scratch. */
static void slot_times(const int64_t *raw, int64_t *t, uint8_t *member, size_t n)
{
	for (size_t i = 0; i < n; i++)
		t[i] = raw[i] >> 2;
	for (size_t i = 0; i < n; i++)
		member[i] = (i > 0 && t[i] == t[i - 1]) || (i + 1 < n && t[i] == t[i + 1]);
	/* A run, as numpy sees it, is a maximal sequence of member slots (non-members skipped)
	 * with one value; it is spread over the interval up to the slot after its last one. */
	size_t i = 0;
	while (i < n) {
		if (!member[i]) {
			i++;
			continue;
		}
		int64_t value = t[i];
		size_t last = i, j = i;
		int64_t calls = 0;
		for (; j < n; j++) {
			if (!member[j])
				continue;
			if (t[j] != value)
				break;
			calls += raw[j] & CALL_SLOT;
			last = j;
		}
		int64_t span = wsub(last + 1 < n ? t[last + 1] : value, value);
		int64_t div = calls > 0 ? calls : 1, before = 0;
		for (size_t k = i; k <= last; k++) {
			if (!member[k])
				continue;
			t[k] = wadd(value, floordiv(wmul(span, before), div));
			before += raw[k] & CALL_SLOT;
		}
		i = j;
	}
	/* Every call (and segment start) lasts at least 1 ns; time never goes backwards. */
	int64_t lasting = 0, top = 0;
	for (size_t k = 0; k < n; k++) {
		int64_t x = wsub(t[k], lasting);
		if (k == 0 || x > top)
			top = x;
		t[k] = wadd(top, lasting);
		lasting += (raw[k] & (CALL_SLOT | START_SLOT)) != 0;
	}
}

typedef struct {
	int64_t start;
	int32_t depth;
	int32_t ix;
} SortItem;

static inline bool item_le(const SortItem *a, const SortItem *b)
{
	return a->start < b->start || (a->start == b->start && a->depth <= b->depth);
}

/* Stable merge sort; linear on sorted input (frames come almost in start order). */
static void sort_items(SortItem *a, SortItem *tmp, size_t n)
{
	if (n <= 16) {
		for (size_t i = 1; i < n; i++) {
			SortItem x = a[i];
			size_t j = i;
			while (j > 0 && !item_le(&a[j - 1], &x)) {
				a[j] = a[j - 1];
				j--;
			}
			a[j] = x;
		}
		return;
	}
	size_t mid = n / 2;
	sort_items(a, tmp, mid);
	sort_items(a + mid, tmp, n - mid);
	if (item_le(&a[mid - 1], &a[mid]))
		return;
	memcpy(tmp, a, mid * sizeof(SortItem));
	size_t i = 0, j = mid, k = 0;
	while (i < mid && j < n)
		a[k++] = item_le(&tmp[i], &a[j]) ? tmp[i++] : a[j++];
	while (i < mid)
		a[k++] = tmp[i++];
}

typedef struct {
	Py_buffer view;
	bool held;
} Held;

static int get_contiguous(Held *h, PyObject *obj, Py_ssize_t itemsize, const char *name,
			  Py_ssize_t *count)
{
	if (PyObject_GetBuffer(obj, &h->view, PyBUF_C_CONTIGUOUS) < 0)
		return -1;
	h->held = true;
	if (h->view.len % itemsize) {
		PyErr_Format(PyExc_ValueError, "%s: not a whole number of %zd-byte items", name,
			     itemsize);
		return -1;
	}
	*count = h->view.len / itemsize;
	return 0;
}

enum { O_TIMES, O_START, O_END, O_DEPTH, O_NAME, O_ADDR, O_INSNS, O_CYCLES, O_FLAGS,
       O_SSLOT, O_ESLOT, NOUT };

static PyObject *final_pass(PyObject *Py_UNUSED(module), PyObject *args)
{
	PyObject *objs[7];
	int keep_slots;
	if (!PyArg_ParseTuple(args, "OOOOOOOp", &objs[0], &objs[1], &objs[2], &objs[3],
			      &objs[4], &objs[5], &objs[6], &keep_slots))
		return NULL;
	static const char *names[] = {"fd", "log", "update_slots", "insn_counts",
				      "cycle_counts", "name_ids", "depths"};
	static const Py_ssize_t sizes[] = {8, 8, 8, 8, 8, 4, 4};
	Held held[7] = {0};
	Py_ssize_t counts[7];
	void *out[NOUT] = {0};
	uint8_t *member = NULL;
	SortItem *items = NULL, *tmp = NULL;
	int64_t *at = NULL;
	PyObject *result = NULL;
	for (int i = 0; i < 7; i++)
		if (get_contiguous(&held[i], objs[i], sizes[i], names[i], &counts[i]) < 0)
			goto done;
	const int64_t *fd = held[0].view.buf, *raw = held[1].view.buf;
	const int64_t *upd = held[2].view.buf, *uins = held[3].view.buf, *ucyc = held[4].view.buf;
	const int32_t *name_ids = held[5].view.buf, *depths = held[6].view.buf;
	size_t n = (size_t)counts[0] / NFIELDS, nslots = (size_t)counts[1];
	size_t nupd = (size_t)counts[2];
	if (counts[0] % NFIELDS || (size_t)counts[5] != n || (size_t)counts[6] != n ||
	    counts[3] != counts[2] || counts[4] != counts[2] || n > INT32_MAX) {
		PyErr_SetString(PyExc_ValueError, "final_pass: arrays of inconsistent lengths");
		goto done;
	}
	for (size_t i = 0; i < n; i++) {
		int64_t s = fd[i * NFIELDS + F_START], e = fd[i * NFIELDS + F_END];
		if (s < 0 || e < 0 || (size_t)s >= nslots || (size_t)e >= nslots) {
			PyErr_SetString(PyExc_ValueError, "final_pass: a frame's slot is not in the log");
			goto done;
		}
	}
	for (size_t u = 0; u < nupd; u++) {
		if (upd[u] < 0 || (u && upd[u] <= upd[u - 1])) {
			PyErr_SetString(PyExc_ValueError, "final_pass: update slots not increasing");
			goto done;
		}
	}
	static const size_t widths[NOUT] = {8, 8, 8, 4, 4, 8, 8, 8, 1, 8, 8};
	for (int k = 0; k < NOUT; k++) {
		size_t count = k == O_TIMES ? nslots : n;
		if ((k == O_SSLOT || k == O_ESLOT) && !keep_slots)
			continue;
		out[k] = malloc((count ? count : 1) * widths[k]);
		if (!out[k]) {
			PyErr_NoMemory();
			goto done;
		}
	}
	member = malloc(nslots ? nslots : 1);
	items = malloc((n ? n : 1) * sizeof(SortItem));
	tmp = malloc((n / 2 + 1) * sizeof(SortItem));
	at = nupd && n ? malloc(nslots * sizeof(int64_t)) : NULL;
	if (!member || !items || !tmp || (nupd && n && !at)) {
		PyErr_NoMemory();
		goto done;
	}
	int64_t *times = out[O_TIMES];
	slot_times(raw, times, member, nslots);
	for (size_t i = 0; i < n; i++)
		items[i] = (SortItem){times[fd[i * NFIELDS + F_START]], depths[i], (int32_t)i};
	sort_items(items, tmp, n);
	if (at) {
		/* Index of the update in force at each slot (the last at or before it), -1: none. */
		size_t u = 0;
		for (size_t s = 0; s < nslots; s++) {
			while (u < nupd && (size_t)upd[u] <= s)
				u++;
			at[s] = (int64_t)u - 1;
		}
	}
	int64_t *o_start = out[O_START], *o_end = out[O_END], *o_addr = out[O_ADDR];
	int64_t *o_insns = out[O_INSNS], *o_cycles = out[O_CYCLES];
	int64_t *o_ss = out[O_SSLOT], *o_es = out[O_ESLOT];
	int32_t *o_depth = out[O_DEPTH], *o_name = out[O_NAME];
	uint8_t *o_flags = out[O_FLAGS];
	for (size_t k = 0; k < n; k++) {
		size_t i = (size_t)items[k].ix;
		const int64_t *f = fd + i * NFIELDS;
		o_start[k] = items[k].start;
		o_end[k] = times[f[F_END]];
		o_depth[k] = items[k].depth;
		o_name[k] = name_ids[i];
		o_addr[k] = f[F_ADDR];
		o_flags[k] = (uint8_t)(f[F_FLAGS] & 0xFF);
		if (keep_slots) {
			o_ss[k] = f[F_START];
			o_es[k] = f[F_END];
		}
		if (at) {
			int64_t a = at[f[F_START]], b = at[f[F_END]];
			o_insns[k] = wsub(b >= 0 ? uins[b] : 0, a >= 0 ? uins[a] : 0);
			o_cycles[k] = wsub(b >= 0 ? ucyc[b] : 0, a >= 0 ? ucyc[a] : 0);
		} else {
			o_insns[k] = o_cycles[k] = -1;
		}
	}
	PyObject *blocks[NOUT];
	bool ok = true;
	for (int k = 0; k < NOUT; k++) {
		if (!out[k]) {
			blocks[k] = Py_NewRef(Py_None);
			continue;
		}
		size_t count = k == O_TIMES ? nslots : n;
		blocks[k] = block_new(out[k], count * widths[k]);
		out[k] = NULL;
		ok = ok && blocks[k];
	}
	if (ok)
		result = Py_BuildValue("(OOOOOOOOOOO)", blocks[0], blocks[1], blocks[2], blocks[3],
				       blocks[4], blocks[5], blocks[6], blocks[7], blocks[8],
				       blocks[9], blocks[10]);
	for (int k = 0; k < NOUT; k++)
		Py_XDECREF(blocks[k]);
done:
	for (int k = 0; k < NOUT; k++)
		free(out[k]);
	free(member);
	free(items);
	free(tmp);
	free(at);
	for (int i = 0; i < 7; i++)
		if (held[i].held)
			PyBuffer_Release(&held[i].view);
	return result;
}

static PyObject *py_classify(PyObject *Py_UNUSED(module), PyObject *arg)
{
	unsigned long long flags = PyLong_AsUnsignedLongLong(arg);
	if (flags == (unsigned long long)-1 && PyErr_Occurred())
		return NULL;
	uint8_t ks = kind_state[flags & (FLAG_TABLE_SIZE - 1)];
	return Py_BuildValue("(ii)", ks & 15, ks >> 4);
}

static PyMethodDef module_methods[] = {
	{"classify", py_classify, METH_O,
	 "classify(flags) -> (kind, state): what the engine makes of raw perf flags"},
	{"final_pass", final_pass, METH_VARARGS,
	 "final_pass(fd, log, update_slots, insn_counts, cycle_counts, name_ids, depths, "
	 "keep_slots) -> (times, start, end, depth, name_id, address, instructions, cycles, "
	 "flags, start_slot, end_slot): engine.build_thread_timeline's columns (in slice "
	 "order; the slots None unless keep_slots)"},
	{NULL, NULL, 0, NULL},
};

static PyMethodDef engine_methods[] = {
	{"add_locations", (PyCFunction)engine_add_locations, METH_VARARGS,
	 "add_locations(function_ids, entries, offsets, ips) -> location count"},
	{"set_landing_pads", (PyCFunction)engine_set_landing_pads, METH_VARARGS,
	 "set_landing_pads(callable(location_id) -> [(start, end)] or None)"},
	{"mark_function", (PyCFunction)engine_mark_function, METH_VARARGS,
	 "mark_function(function_id, flags): 1 = its return switches stacks, 2 = a setjmp"},
	{"feed_batch", (PyCFunction)engine_feed_batch, METH_VARARGS,
	 "feed_batch(pid, tid, time, flags, src, dst, insn_count, cycle_count, gap_delta)"},
	{"decode_error", (PyCFunction)engine_decode_error, METH_VARARGS,
	 "decode_error(pid, tid, has_time, time, message_id) -> attributed"},
	{"counter", (PyCFunction)engine_counter, METH_VARARGS,
	 "counter(pid, tid, time, name_id, value)"},
	{"end_segment", (PyCFunction)engine_end_segment, METH_NOARGS, "end_segment()"},
	{"slot_count", (PyCFunction)engine_slot_count, METH_VARARGS, "slot_count(pid, tid)"},
	{"stats", (PyCFunction)engine_stats, METH_NOARGS,
	 "(events, branches, decode_errors, segments_started, stitched, roots_inferred, "
	 "unexpected, ignored)"},
	{"examples", (PyCFunction)engine_examples, METH_NOARGS,
	 "[(what, tid, time, fn, fn2)] for the unexpected events kept as examples"},
	{"thread_keys", (PyCFunction)engine_thread_keys, METH_NOARGS,
	 "[(pid, tid)] in order of appearance"},
	{"close_all", (PyCFunction)engine_close_all, METH_NOARGS, "close every open frame"},
	{"take_thread", (PyCFunction)engine_take_thread, METH_VARARGS,
	 "take_thread(index) -> the thread's arrays (see the C source)"},
	{NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
	PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ptscope.reconstruct._cengine.Engine",
	.tp_basicsize = sizeof(Engine),
	.tp_dealloc = (destructor)engine_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "The trace-segment engine's state (see fast_engine.FastEngine).",
	.tp_methods = engine_methods,
	.tp_init = (initproc)engine_init,
	.tp_new = PyType_GenericNew,
};

static struct PyModuleDef cengine_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "ptscope.reconstruct._cengine",
	.m_doc = "The trace-segment engine's ingestion in C (twin of reconstruct/engine.py).",
	.m_size = -1,
	.m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__cengine(void)
{
	for (uint32_t f = 0; f < FLAG_TABLE_SIZE; f++)
		kind_state[f] = classify(f);
	if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&BlockType) < 0)
		return NULL;
	PyObject *m = PyModule_Create(&cengine_module);
	if (!m)
		return NULL;
	Py_INCREF(&EngineType);
	if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
		Py_DECREF(&EngineType);
		Py_DECREF(m);
		return NULL;
	}
	if (PyModule_AddIntConstant(m, "FLAG_TABLE_SIZE", FLAG_TABLE_SIZE) < 0 ||
	    PyModule_AddIntConstant(m, "NAME_UNTRACED", NAME_UNTRACED) < 0 ||
	    PyModule_AddIntConstant(m, "NAME_SYSCALL", NAME_SYSCALL) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
