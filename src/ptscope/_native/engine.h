/* The streaming trace-segment engine: its state and its entry points, without Python.
 *
 * engine.c holds the rules (the twin of src/ptscope/reconstruct/engine.py), its other
 * files the rest (engine_internal.h says which holds what); its callers
 * are the Python extension (reconstruct/_cengine.c, which turns buffers into columns and
 * failures into exceptions) and, later, the dlfilter. The state is declared here, whole,
 * so that a binding can read its counters and drain its output vectors.
 *
 * Every entry point returns PTSCOPE_ENGINE_OK or a failure code with `message` set; after
 * a failure other than PTSCOPE_ENGINE_BAD_INPUT (refused before anything changed) the
 * engine is broken: it refuses further work, and can only be freed.
 */
#ifndef PTSCOPE_ENGINE_H
#define PTSCOPE_ENGINE_H


#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "line_set.h"

/* SliceFlags, and the engine's private flag (engine.py: _AFTER_CALL). */
#define FL_INFERRED 1
#define FL_OPEN_AT_END 2
#define FL_SYNTHETIC 4
#define FL_INLINED 8 /* SliceFlags.INLINED: an inlined body, not a call */
#define FL_AFTER_CALL (1 << 8)
#define FL_KERNEL_ENTRY (1 << 9) /* engine.py: _KERNEL_ENTRY */
#define FL_ARMED (1 << 10)	 /* engine.py: _Thread.armed (its setjmp just returned) */
/* A frame's name id lives above its flags. */
#define NAME_SHIFT 16

#define CALL_SLOT 1
#define START_SLOT 2
#define MAX_INSN 15u

/* A run of equal timestamps longer than this is spread as if it ended here (no timing
 * packet for that many frame boundaries): the window stays bounded. */
#define MAX_RUN 65536

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
	K_INLINE, /* control enters or leaves an inlined body (no branch: see "Inlined frames") */
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
	/* ptscope's own: not a branch but the first instruction of another inlined body (the
	 * decoders split blocks there; the row's src and dst are that instruction) */
	BF_INLINE = 1 << 30, /* far from perf's bits, which grow (6.x: branch miss, 1 << 15) */
};
#define IN_TX_FLAG BF_IN_TX
#define FLAG_TABLE_SIZE 32768 /* classify_flags depends on bits 0..14 only, and BF_INLINE */

/* Name ids the Python side reserves for the synthetic frames. */
#define NAME_UNTRACED 0
#define NAME_SYSCALL 1

/* Times are stored as time*4 + flags: beyond this they do not fit in an int64. */
#define TIME_LIMIT (INT64_C(1) << 61)

typedef struct {
	int64_t *v;
	size_t n, cap;
	size_t hint; /* when it grows from empty: room for this many at once (0: the usual) */
} Vec;


/* A slot's resolved time (on the engine's time axis), the cumulative instruction/cycle
 * counts in force there, its perf time (as the event said, not spread: what
 * `perf script --time` selects by), and its anchor: for the slot of a call or a tail
 * call, the address of that call or jump instruction and which of its executions at that
 * perf time it was (1-based; 0: no anchor). See "Anchors" below. */
typedef struct {
	int64_t time, insn, cyc, real;
	int64_t anchor, occurrence;
} SlotValue;

/* A slot in the window, its time not resolved yet: raw = its time * 4 + CALL_SLOT /
 * START_SLOT flags, and the rest of its SlotValue (one record per slot: one capacity
 * check where there were six). */
typedef struct {
	int64_t raw, insn, cyc, real;
	int64_t anchor, occurrence;
} WinSlot;

/* What slot times measure (engine.py: the events' times; the other axes are the thread's
 * cumulative instruction or cycle counts, as if events carried those as their times). */
enum { AXIS_TIME, AXIS_INSTRUCTIONS, AXIS_CYCLES };

/* One function activation (engine.py: a frame's fields), in its thread's arena. */
typedef struct {
	int64_t start_slot, end_slot; /* end -1: open */
	int64_t addr;
	int64_t flags; /* name id << NAME_SHIFT | slice flags */
	int64_t callsite;
	int64_t seq; /* creation order (ties in a spine) */
	SlotValue start, end;
	/* The frame it was called from (to be written after it if both start at the same
	 * time), and the frames waiting to be written after this one (a list). */
	int64_t parent;
	uint32_t parent_gen;
	int64_t first_follower, last_follower, next_follower;
	uint32_t gen; /* bumped when the entry is reused */
	/* Code lines executed while it was the innermost open frame, its closed callees'
	 * merged in (see "I-cache footprint" below); their number once it closed (-1 before). */
	LineSet lines;
	int64_t icache;
	uint8_t known; /* KNOWN_START | KNOWN_END */
	bool spine;    /* starts where its context starts: written with its context's group */
	bool live;
	/* Inlined frames (FL_INLINED) are not on any context's stack: a frame of the stack has
	 * the innermost inlined body open in it (inl_top, -1: none), each inlined frame the
	 * one it is inlined in as its parent, up to the stack's frame, and its node. */
	int32_t node;
	int64_t inl_top;
} Frame;
#define KNOWN_START 1
#define KNOWN_END 2

/* An open frame on a context's stack: the function events are matched against, and the
 * frame's arena index (engine.py: Handle). */
typedef struct {
	int64_t ix;
	int32_t fn;
} Handle;

typedef struct {
	Handle *frames;
	size_t nframes, capframes;
	int64_t start_slot;
	int64_t suspend_slot;
	SlotValue start, suspend; /* once their slots resolve */
	bool start_known, suspend_known;
	bool detached;
	bool switched_in; /* began with a stack switch: older contexts are other stacks */
	bool after_break; /* began at a segment break: its segment starts at its first frame */
	bool interrupting; /* a signal handler: runs on top of the context below (engine.py) */
	Vec spine;	  /* arena indices of the frames that start where this context starts */
	/* Code lines since the context's start that no frame of it holds (executed before its
	 * first frame, or by frames that ended at its bottom): a root inferred later takes
	 * them. `before`: those of the context's earlier starts (a detached context that
	 * started over), which only a frame enclosing the whole context (a landing) takes. */
	LineSet base, before;
} Ctx;

/* A branch held until its transaction commits, with its anchor as counted when it came. */
typedef struct {
	int32_t kind, state, src, dst;
	int64_t time;
	uint64_t ip;
	uint32_t occurrence;
} TxEvent;

/* How many branches of a thread at one perf time came from each address (see "Anchors"):
 * open addressing, an entry counts only while its stamp is the current generation, so a
 * new time empties the table in O(1). */
typedef struct {
	uint64_t ip;
	uint32_t count, stamp;
} Occurrence;
typedef struct {
	Occurrence *v;
	uint32_t cap, n, gen; /* cap: a power of two; n: entries of generation gen */
	int64_t time;
} Occurrences;

/* A branch held while an ambiguous landing waits (engine.py: _Lookahead); its code lines
 * are lines[line0, line0 + nlines) of the lookahead. */
typedef struct {
	int32_t kind, state, src, dst;
	bool in_tx;
	int64_t time, gap_time;
	uint64_t insns, cycles, gap_insns;
	size_t line0, nlines;
} HeldEvent;

/* engine.py: _Hypothesis. One way the held events may have run: on candidate cand's stack,
 * whose top is now frame top of the landing's context, with above[0, nabove) pushed on it
 * since the landing (fn -1: an untraced gap; resume: the point a setjmp armed, 0 if none). */
typedef struct {
	int32_t fn;
	uint64_t resume;
} Pushed;
typedef struct {
	size_t cand;
	ptrdiff_t top;
	Pushed *above;
	size_t nabove, capabove;
} Hypothesis;

/* engine.py: _Lookahead. A landing in one of several activations armed at the same resume
 * point, and the thread's events held until they tell which one it was. */
#define LOOKAHEAD_EVENTS 65536
#define K_HELD_COUNTER (-1) /* a held counter sample: name in insns, value in cycles */
#define K_HELD_BREAK (-2)   /* a held segment break */
#define MAX_HYPOTHESES 256
typedef struct {
	bool on;
	size_t ci;	 /* the context landed in */
	int64_t t;	 /* the landing's time */
	ptrdiff_t *cand; /* candidate frame indices, nearest first */
	size_t ncand, capcand;
	Hypothesis *hyp, *next; /* the stacks the events fit; next: being built */
	size_t nhyp, caphyp, nnext, capnext;
	size_t nearest; /* the nearest candidate they fitted after the last event followed */
	HeldEvent *ev;
	size_t nev, capev;
	uint64_t *lines;
	size_t nlines, caplines;
} Lookahead;

/* Something waiting for a slot's value. */
enum { W_START, W_END, W_INSTANT, W_COUNTER };
typedef struct {
	int64_t slot;
	int32_t kind;
	uint32_t gen;
	int64_t a, b, c; /* frame index (a); message id (a); counter name (a), value (b) */
} Waiter;

/* A context's spine, waiting for its last member to be known before it is written. */
typedef struct {
	int64_t *ix;
	size_t n;
} Group;

typedef struct {
	int64_t pid, tid;
	/* frames */
	Frame *fr;
	size_t nfr, capfr;
	Vec free_ix;
	int64_t seq;
	/* contexts: [0, nctx) live; [nctx, pool) allocated, kept for reuse */
	Ctx **ctxs;
	size_t nctx, pool, capctx;
	/* slots: [0, done) resolved; the window holds [done, nslots), all one timestamp */
	int64_t nslots, done;
	int64_t last_raw; /* the newest slot's raw value (time*4 + flags) */
	WinSlot *win; /* the window's slots, [0, nwin) */
	size_t nwin, capwin;
	SlotValue *win_out; /* resolution scratch */
	size_t capout;
	int64_t lasting, top; /* the catch-up clock (engine._slot_times) */
	bool clock_started;
	Waiter *waiters;
	size_t nwait, capwait;
	Group *groups;
	size_t ngroups, capgroups;
	/* counts */
	int64_t cum_insn, cum_cyc, last_time;
	int64_t first_update_slot; /* -1: no count yet */
	int64_t first_line_slot;   /* -1: no code lines yet */
	TxEvent *txq;
	size_t ntx, captx;
	Vec resume; /* (frame index, generation, address, guard) quadruples: setjmp resume
		     * points, and the call site of the first call after each (0: none yet) */
	Lookahead look;
	/* The branch being applied (its source address, perf time and occurrence there), and
	 * whether the next slot taken is the one it starts a callee at (see "Anchors"). */
	Occurrences seen;
	uint64_t ev_ip;
	int64_t ev_time;
	uint32_t ev_occurrence;
	bool anchor_next;
	bool closed;
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

/* Functions a rule names (engine.py: SPECIAL_FUNCTIONS); the first two make a return
 * special (engine.py: SPECIAL_RETURNS). */
#define FN_SWITCHES 1 /* engine.py: STACK_SWITCHERS */
#define FN_SETJMP 2   /* engine.py: SETJMPS */
#define FN_GOGO 4     /* engine.py: GOROUTINE_SWITCHERS */
#define FN_PARKS 8    /* engine.py: GOROUTINE_PARKERS */
#define FN_PLT0 16    /* engine.py: PLT_HEADERS */
#define FN_PLT_STUB 32 /* engine.py: is_plt_stub */
#define FN_SPECIAL_RETURN (FN_SWITCHES | FN_SETJMP)
#define FN_ALL (FN_SWITCHES | FN_SETJMP | FN_GOGO | FN_PARKS | FN_PLT0 | FN_PLT_STUB)

/* Output columns, drained by the binding. */
/* Output columns, drained by take_output(). */
enum { O_PID, O_TID, O_START, O_END, O_NAME, O_ADDR, O_INSN, O_CYC, O_FLAGS, O_SSLOT, O_ESLOT,
       O_RSTART, O_REND, O_LINES, O_ANCHOR, O_OCCURRENCE, NOUT };
enum { I_PID, I_TID, I_TIME, I_MSG, NINST };
enum { N_PID, N_TID, N_TIME, N_NAME, N_VALUE, NCTR };

enum {
	PTSCOPE_ENGINE_OK,
	PTSCOPE_ENGINE_NOMEM,	  /* out of memory */
	PTSCOPE_ENGINE_BAD_INPUT, /* refused before anything changed */
	PTSCOPE_ENGINE_OVERFLOW,  /* a time or a count past what the engine holds */
	PTSCOPE_ENGINE_INTERNAL,  /* an internal inconsistency (a bug) */
	PTSCOPE_ENGINE_BROKEN,	  /* it failed earlier and cannot continue */
	PTSCOPE_ENGINE_FINISHED,  /* close_all was called */
};

/* The call-site ranges whose exceptions land at location `loc`: sets *pairs to 2*n int64s
 * (start, end, start, end...) valid until the next call, and returns n. Asked once per
 * location. */
typedef size_t (*ptscope_landing_pads_fn)(void *ctx, int32_t loc, const int64_t **pairs);

/* A column of n items, any stride (a strided buffer). */
typedef struct {
	const char *p;
	ptrdiff_t stride;
} ptscope_column;
#define PTSCOPE_AT(col, type, i) (*(const type *)((col).p + (ptrdiff_t)(i) * (col).stride))

/* feed()'s columns, in this order. */
enum { C_PID, C_TID, C_TIME, C_FLAGS, C_SRC, C_DST, C_INSN, C_CYC, C_GAP, NCOLS };

/* Inlined bodies are nodes of a tree (a node's parent: the body it is inlined in, 0: the
 * function itself); a location names the innermost one at its address (0: none). */
#define MAX_INLINE_DEPTH 64

struct ptscope_engine {
	int32_t *loc_node; /* NULL: no location is in an inlined body */
	int32_t *node_parent, *node_name;
	uint8_t *node_depth;
	size_t nnodes, capnodes; /* node 0 (none) included once any is added */
	int32_t *loc_fn;
	int64_t *loc_entry, *loc_off;
	uint64_t *loc_ip;
	size_t nloc, caploc;
	uint8_t *fn_flags; /* by function id: FN_SWITCHES, FN_SETJMP */
	size_t nfn_flags;
	/* location id -> the (start, end) call-site ranges landing there (NULL: none) */
	ptscope_landing_pads_fn landing_pads;
	void *landing_ctx;
	Vec pad_index;		/* (location, first range, count) triples, asked so far */
	Vec pad_ranges;		/* (start, end) pairs */
	Thread **threads;
	size_t nthreads, capthreads;
	Slot *map;
	size_t mapcap; /* power of two */
	Thread *last;
	int64_t events, branches, decode_errors, segments_started, stitched, roots_inferred,
		unexpected, ignored;
	int64_t slices_out, live_frames, peak_frames;
	int64_t first_time; /* the earliest first slot of any thread (valid if nthreads) */
	Example *examples;
	size_t nexamples, max_examples;
	Vec out[NOUT], inst[NINST], ctr[NCTR];
	bool keep_slots;
	bool lines_on; /* some batch had code lines: i-cache footprints are computed */
	int axis;      /* AXIS_* */
	bool spread;   /* on the time axis too, a run of equal times is spread by instructions */
	bool broken, closed;
	jmp_buf jb;
	int error;	    /* PTSCOPE_ENGINE_* of the last failure */
	char message[160]; /* what it was */
};
typedef struct ptscope_engine Engine;

/* classify() of every flags value (kind | state << 4), filled by ptscope_engine_setup(). */
extern uint8_t ptscope_kind_state[FLAG_TABLE_SIZE];
static inline uint8_t ptscope_classify(uint32_t flags)
{
	return flags & BF_INLINE ? K_INLINE : ptscope_kind_state[flags & (FLAG_TABLE_SIZE - 1)];
}
void ptscope_engine_setup(void);

/* PTSCOPE_ENGINE_OK, or why the engine takes no more: BROKEN, or with `open` FINISHED (a
 * binding asks before it converts its arguments). */
int ptscope_engine_usable(Engine *e, bool open);
/* `e` zeroed: ready for locations and branches. */
int ptscope_engine_init(Engine *e, size_t max_examples, bool keep_slots, int axis, bool spread);
/* Everything the engine holds (not `e` itself). */
void ptscope_engine_free(Engine *e);

int ptscope_engine_add_locations(Engine *e, ptscope_column fn, ptscope_column entry,
				 ptscope_column offset, ptscope_column ip, size_t n);
int ptscope_engine_mark_function(Engine *e, int fn, int flags);
/* Inlined bodies, numbered from nnodes on (the first call adds node 0, none, first):
 * parent (a node added before; 0: inlined in the function itself) and the name id its
 * slices take. */
int ptscope_engine_add_inline_nodes(Engine *e, const int32_t *parent, const int32_t *name,
				    size_t n);
/* The innermost inlined body of locations [first, first + n) (0: none). */
int ptscope_engine_set_location_nodes(Engine *e, size_t first, const int32_t *node, size_t n);
void ptscope_engine_set_landing_pads(Engine *e, ptscope_landing_pads_fn fn, void *ctx);
/* n branches: cols[NCOLS] as the C_* enum says (pid, tid: int32; time: int64; flags:
 * uint32; src, dst: int32; insn, cyc: uint64; gap_delta: uint32). Code lines (instruction
 * detail, may be NULL): row i's are lines[line_offsets[i] .. line_offsets[i + 1]) (int32
 * offsets, checked by the caller); gap_insns (may be NULL): uint16 per row. */
int ptscope_engine_feed(Engine *e, const ptscope_column *cols, size_t n,
			const ptscope_column *line_offsets, const uint64_t *lines,
			const ptscope_column *gap_insns);
/* pid/tid < 0: unknown. *attributed: whether it went to a thread. */
int ptscope_engine_decode_error(Engine *e, int64_t pid, int64_t tid, bool has_time,
				int64_t time, int64_t message, bool *attributed);
int ptscope_engine_counter(Engine *e, int64_t pid, int64_t tid, int64_t time, int64_t name,
			   int64_t value);
int ptscope_engine_end_segment(Engine *e);
int ptscope_engine_close_all(Engine *e);
Thread *ptscope_engine_find_thread(Engine *e, int64_t pid, int64_t tid);

#endif /* PTSCOPE_ENGINE_H */
