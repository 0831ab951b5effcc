/* perf --dlfilter plugin: drops jumps inside one function and streams the rest as records.
 *
 * Usage: perf script --itrace=bep --dlfilter dlfilter.so --dlarg OUT [--dlarg keep-all]
 *        [--dlarg pid=P,P...] [--dlarg tid=T,T...]
 *   OUT = "-" or "stdout": write to perf's own stdout FILE, so that perf's decode error
 *         lines (which perf prints to stdout too) land in the stream in exactly the right
 *         place; "fd:N": an inherited file descriptor; anything else: a file path.
 *   keep-all: write every branch (no same-function dropping), for comparisons.
 *   to-end: the decode reaches the end of the trace (not a time window before it): each
 *         thread's last branch is written even if it is a dropped jump, so that what was
 *         still running is seen to run until then (a trace cut off mid-function).
 *   until=NS: the decode is a time window that ends at NS (perf decodes a little past it,
 *         ptscope's parallel.py): each thread's first kept branch after NS is written,
 *         which the next window needs (its counts), and the thread's later samples are
 *         ignored (counted as other): perf decodes tens of thousands of them.
 *   pid=, tid=: only samples of these processes / threads. perf's own --pid/--tid filter
 *         samples after filter_event_early has seen them, so the filter applies them itself.
 *   insns: instruction detail. Every kept branch's insn_cnt is the exact number of
 *         instructions executed since the thread's previous kept branch (counted from the
 *         basic blocks between the branches, see "Basic blocks" below), and its record
 *         (with lines records before it when there are several ranges) gives the 64-byte
 *         code lines those instructions touched.
 *   ring=MEMFD,FREEFD,CHUNKS,BYTES: ring mode. The records go into CHUNKS chunks of BYTES
 *         bytes each of the shared memory MEMFD (mapped here), and a chunk record on
 *         stdout hands each chunk over when it is full, or earlier when perf printed text
 *         (see "Ring mode" below); ptscope gives chunks back by writing their indices
 *         (uint32) into the pipe FREEFD. OUT must then be stdout.
 *   beat=FD: write one byte into the inherited file descriptor FD (a non-blocking pipe)
 *         at start and every BEAT_SAMPLES samples, dropped ones included: ptscope's
 *         watchdog sees that perf works even while the stream is silent (a loop without
 *         calls), and stops a perf that loops without decoding anything (perftool.py).
 *
 * Records (record_format.h) are written per sample with fwrite_unlocked into the stdio
 * buffer, never buffered on the side: that is what keeps perf's text lines in order.
 * Every filter call returns 1, so perf prints nothing for the samples themselves.
 *
 * Each address is resolved once per process (perf's resolve_ip/resolve_addr are only
 * cached per sample, and resolve_ip alone costs about as much as perf's own per-sample
 * work): the cache key is (address, pid, ip-or-addr side, generation). The generation of a
 * process is bumped when perf's comm for one of its threads changes (exec), checked at
 * trace boundaries (trace begin/end, syscalls, interrupts) where an exec must show; at those
 * samples a cached ip is also checked against perf's current symbol (remapped code).
 *
 * Basic blocks (insns): the instructions a thread ran between two consecutive branch
 * samples are the straight run from the first one's target to the second one's source
 * (perf synthesizes a sample for every taken branch; branches not taken fall through).
 * The first time such a block runs its code is read through perf's object_code() and
 * split with x86_length.c; the block cache keeps its count, keyed by (start, end, pid,
 * generation), the same identity of code as the location cache's.
 *
 * Ring mode: a pipe costs a copy on each side, perf spinning on the pipe's lock while
 * ptscope reads, and fresh pages for each buffer: a tenth of a decode's CPU. In ring mode
 * the records are copied once, into memory ptscope maps, and only 16-byte chunk
 * records cross stdout. A record never straddles two chunks unless it is longer than one
 * (filter_output.c, ring_write), so that ptscope reads each chunk in one run. perf's text
 * must still come out in order: before each sample (and at the end) the filter checks
 * whether stdout's buffer holds anything since its last
 * chunk record; if so, perf printed it after the records written so far, and the current
 * chunk is handed over at once (the reader takes a chunk, then the text before its chunk
 * record). Each chunk record is flushed, so "nothing since" is "nothing pending".
 *
 * The logic lives in functions that take plain values (ptscope_* below, also exported) so
 * that it can be unit-tested with fabricated samples and a fake perf_dlfilter_fns table.
 *
 * This file holds perf's entry points, resolving and the per-sample path; the filter's
 * other parts are files of their own (filter_internal.h lists them): instruction detail
 * (filter_blocks.c), the record stream and ring mode (filter_output.c), the tables
 * (filter_tables.c).
 */
#include "filter_internal.h"

/* perf copies its callback table here before calling start(). */
PTSCOPE_EXPORT struct perf_dlfilter_fns perf_dlfilter_fns;

/* ------------------------------------------------------------ pure helpers */

/* Flags of a branch that the engine ignores when source and target are in one function:
 * plain and conditional jumps. Anything else (calls, returns, syscalls, interrupts, trace
 * begin/end, transactions, unknown bits) is always kept. */
PTSCOPE_EXPORT int ptscope_droppable_flags(uint32_t flags)
{
	const uint32_t jump = PERF_DLFILTER_FLAG_BRANCH | PERF_DLFILTER_FLAG_CONDITIONAL;
	return (flags & PERF_DLFILTER_FLAG_BRANCH) && (flags & ~jump) == 0;
}

static int symbol_is_unknown(const char *sym)
{
	return !sym || !sym[0] || strcmp(sym, "[unknown]") == 0;
}

/* The function key of a resolved address, written into buf (NUL-terminated); returns its
 * length or the length needed if it does not fit. Mirrors ptscope.model.function_key():
 * a known symbol without its GCC ".cold" suffix; unknown code grouped per DSO. */
PTSCOPE_EXPORT size_t ptscope_function_key(const char *sym, const char *dso, char *buf,
					   size_t size)
{
	int n;
	if (symbol_is_unknown(sym)) {
		if (dso && dso[0])
			n = snprintf(buf, size, "[unknown] (%s)", dso);
		else
			n = snprintf(buf, size, "[unknown]");
	} else {
		size_t len = strlen(sym);
		if (len >= 5 && memcmp(sym + len - 5, ".cold", 5) == 0)
			len -= 5;
		n = snprintf(buf, size, "%.*s", (int)len, sym);
	}
	return n < 0 ? 0 : (size_t)n;
}

/* The offset of an address from its symbol's start, as perf script prints it. */
PTSCOPE_EXPORT int64_t ptscope_symbol_offset(const struct perf_dlfilter_al *al)
{
	if (!al || symbol_is_unknown(al->sym))
		return PTSCOPE_NO_OFFSET;
	/* perf's own 32-bit symoff truncates; recompute it when the address is inside the
	 * symbol. Outside it perf uses a map-relative formula we cannot redo here. */
	if (al->addr >= al->sym_start && al->addr < al->sym_end)
		return (int64_t)(al->addr - al->sym_start);
	return (int64_t)al->symoff;
}

/* ------------------------------------------------------------------- names */

/* Id of a symbol or DSO name, writing its string record the first time. 0 if none. */
static uint32_t name_id(struct ptscope_filter *f, const char *s)
{
	if (!s)
		return PTSCOPE_NO_STRING;
	size_t len = strlen(s);
	int is_new;
	uint32_t id = str_intern(&f->names, s, len, &is_new);
	if (!id) {
		f->failed = 1;
		return PTSCOPE_NO_STRING;
	}
	if (is_new) {
		struct ptscope_string_rec r;
		memset(&r, 0, sizeof(r));
		r.tag = PTSCOPE_TAG_STRING;
		r.id = id;
		r.length = (uint32_t)len;
		emit_whole(f, sizeof(r) + len);
		emit(f, &r, sizeof(r));
		if (len)
			emit(f, s, len);
		f->counters.strings++;
	}
	return id;
}

static uint32_t function_key_id(struct ptscope_filter *f, const char *sym, const char *dso)
{
	char small[256];
	char *buf = small;
	size_t n = ptscope_function_key(sym, dso, small, sizeof(small));
	if (n >= sizeof(small)) {
		buf = malloc(n + 1);
		if (!buf) {
			f->failed = 1;
			return 0;
		}
		ptscope_function_key(sym, dso, buf, n + 1);
	}
	int is_new;
	uint32_t id = str_intern(&f->fnkeys, buf, n, &is_new);
	if (buf != small)
		free(buf);
	if (!id)
		f->failed = 1;
	return id;
}

/* ------------------------------------------------------------- resolving */

static long generation_index(struct ptscope_filter *f, int32_t pid)
{
	int is_new;
	long i = id_map_get(&f->pid_ids, (uint32_t)pid, &is_new);
	if (i < 0)
		return -1;
	if (is_new) {
		if ((size_t)i >= f->pid_cap) {
			size_t ncap = f->pid_cap ? f->pid_cap * 2 : 64;
			uint32_t *ng = realloc(f->pid_gen, ncap * sizeof(*ng));
			if (!ng)
				return -1;
			f->pid_gen = ng;
			f->pid_cap = ncap;
		}
		f->pid_gen[i] = 0;
	}
	return i;
}

static struct thread_state *thread_of(struct ptscope_filter *f, int32_t pid, int32_t tid)
{
	uint64_t key = ((uint64_t)(uint32_t)pid << 32) | (uint32_t)tid;
	if (f->last_thread >= 0 && key == f->last_thread_key)
		return &f->threads[f->last_thread];
	int is_new;
	long i = id_map_get(&f->thread_ids, key, &is_new);
	if (i < 0)
		return NULL;
	if (is_new) {
		long g = generation_index(f, pid);
		if (g < 0)
			return NULL;
		if ((size_t)i >= f->threads_cap) {
			size_t ncap = f->threads_cap ? f->threads_cap * 2 : 64;
			struct thread_state *nt = realloc(f->threads, ncap * sizeof(*nt));
			if (!nt)
				return NULL;
			f->threads = nt;
			f->threads_cap = ncap;
		}
		f->threads[i] = (struct thread_state){ .pid = pid, .pid_index = (uint32_t)g };
	}
	f->last_thread_key = key;
	f->last_thread = i;
	return &f->threads[i];
}

/* What perf resolves the sample's ip (side 0) or addr (side 1) to; NULL if it cannot. */
static const struct perf_dlfilter_al *resolve_side(const struct perf_dlfilter_sample *s, void *ctx,
						   int side)
{
	if (side == 0)
		return perf_dlfilter_fns.resolve_ip ? perf_dlfilter_fns.resolve_ip(ctx) : NULL;
	if (s->addr_correlates_sym && perf_dlfilter_fns.resolve_addr)
		return perf_dlfilter_fns.resolve_addr(ctx);
	return NULL;
}

/* A location's record, written when it is first met, and its slot: resolved through
 * perf (`al`; NULL: nothing known there). */
static struct loc_slot *new_location(struct ptscope_filter *f, struct loc_slot *slot, uint64_t addr,
				     uint64_t meta, int32_t pid, const struct perf_dlfilter_al *al)
{
	const char *sym = al ? al->sym : NULL;
	const char *dso = al ? al->dso : NULL;
	const struct inline_runs *inl = dso ? inline_runs_of(&f->inl, dso) : NULL;
	uint64_t next;
	int32_t node = inl && al ? inline_runs_node(inl, al->addr, &next) : 0;
	struct ptscope_location_rec r;
	memset(&r, 0, sizeof(r));
	r.tag = PTSCOPE_TAG_LOCATION;
	r.ip = addr;
	r.pid = pid;
	r.offset = ptscope_symbol_offset(al);
	r.symbol = symbol_is_unknown(sym) ? PTSCOPE_NO_STRING : name_id(f, sym);
	r.dso = dso ? name_id(f, dso) : PTSCOPE_NO_STRING;
	r.node = node;
	r.id = ++f->next_loc_id;
	emit(f, &r, sizeof(r));
	f->counters.locations++;
	*slot = (struct loc_slot){ .addr = addr, .meta = meta, .id = r.id,
				   .fn = function_key_id(f, sym, dso), .sym_ptr = sym, .dso_ptr = dso,
				   .has_map = al != NULL, .node = node, .inl = inl,
				   .map_addr = al ? al->addr : 0 };
	f->locs.count++;
	return slot;
}

/* The cached location of the sample's ip or addr. On a miss it is resolved through perf
 * (`al` if the caller already has it, else resolve_side()) and its records are written.
 * Returns the slot (valid until the next lookup), or NULL. */
static struct loc_slot *location(struct ptscope_filter *f, const struct perf_dlfilter_sample *s,
				 void *ctx, uint32_t gen, int side,
				 const struct perf_dlfilter_al *al)
{
	if ((f->locs.count + 1) * 2 > f->locs.cap && loc_table_grow(&f->locs) < 0) {
		f->failed = 1;
		return NULL;
	}
	uint64_t addr = side ? s->addr : s->ip;
	uint64_t meta = loc_meta(s->pid, gen, side);
	struct loc_slot *slot = loc_find(&f->locs, addr, meta);
	if (slot->id)
		return slot;
	if (!al)
		al = resolve_side(s, ctx, side);
	return new_location(f, slot, addr, meta, s->pid, al);
}

struct loc_slot *location_at(struct ptscope_filter *f, const struct perf_dlfilter_sample *s,
			     void *ctx, uint32_t gen, uint64_t addr)
{
	if ((f->locs.count + 1) * 2 > f->locs.cap && loc_table_grow(&f->locs) < 0) {
		f->failed = 1;
		return NULL;
	}
	uint64_t meta = loc_meta(s->pid, gen, 1);
	struct loc_slot *slot = loc_find(&f->locs, addr, meta);
	if (slot->id)
		return slot;
	struct perf_dlfilter_al al;
	memset(&al, 0, sizeof(al));
	al.size = sizeof(al);
	int found = perf_dlfilter_fns.resolve_address &&
		     perf_dlfilter_fns.resolve_address(ctx, addr, &al) == 0;
	return new_location(f, slot, addr, meta, s->pid, found ? &al : NULL);
}

/* ------------------------------------------------------------ per sample */

static enum event_kind event_kind_of(struct ptscope_filter *f, const char *event)
{
	if (event == f->last_event && event)
		return f->last_kind;
	enum event_kind k = EV_OTHER;
	if (event && strncmp(event, "branches", 8) == 0)
		k = EV_BRANCH;
	else if (event && strncmp(event, "cbr", 3) == 0)
		k = EV_POWER;
	f->last_event = event;
	f->last_kind = k;
	return k;
}

static int handle_power(struct ptscope_filter *f, const struct perf_dlfilter_sample *s)
{
	/* perf's synthesized cbr raw data: u32 flags (cbr in the low byte), u32 frequency in
	 * kHz, which perf script prints rounded to MHz. */
	if (s->raw_size < 8 || !s->raw_data) {
		f->counters.other++;
		return 1;
	}
	const uint8_t *raw = s->raw_data;
	struct ptscope_power_rec r;
	memset(&r, 0, sizeof(r));
	r.tag = PTSCOPE_TAG_POWER;
	r.pid = s->pid;
	r.tid = s->tid;
	r.cpu = s->cpu;
	r.time = s->time;
	uint32_t khz;
	memcpy(&khz, raw + 4, sizeof(khz));
	r.cbr = raw[0];
	r.freq_mhz = (uint32_t)(((uint64_t)khz + 500) / 1000);
	emit(f, &r, sizeof(r));
	f->counters.power++;
	return 1;
}

/* Samples where the program may have changed under us (exec happens in a syscall, so its
 * new image starts with a trace begin or a return from the kernel). */
#define PTSCOPE_BOUNDARY_FLAGS                                                              \
	(PERF_DLFILTER_FLAG_TRACE_BEGIN | PERF_DLFILTER_FLAG_TRACE_END |                     \
	 PERF_DLFILTER_FLAG_SYSCALLRET | PERF_DLFILTER_FLAG_INTERRUPT | PERF_DLFILTER_FLAG_ASYNC | \
	 PERF_DLFILTER_FLAG_VMENTRY | PERF_DLFILTER_FLAG_VMEXIT)

/* The record of a branch sample (its counts and gap added when it is kept). Every field
 * is set: the record is packed, so they are all of its bytes (no memset first). */
void branch_record(struct ptscope_filter *f, struct ptscope_branch_rec *r,
		   const struct perf_dlfilter_sample *s, uint32_t ip_loc, uint32_t addr_loc)
{
	_Static_assert(sizeof(*r) == 1 + 1 + 2 + 3 * 4 + 5 * 8 + 4 * 4,
		       "branch_record sets every field");
	r->tag = PTSCOPE_TAG_BRANCH;
	r->gap_insns = 0;
	r->gap_delta = 0;
	r->cpumode = s->cpumode;
	r->flags = s->flags;
	r->pid = s->pid;
	r->tid = s->tid;
	r->time = s->time;
	r->ip = s->ip;
	r->addr = s->addr;
	/* With instruction detail the count comes from the blocks (all in pending_insn). */
	r->insn_cnt = f->insns ? 0 : s->insn_cnt;
	r->cyc_cnt = s->cyc_cnt;
	r->ip_loc = ip_loc;
	r->addr_loc = addr_loc;
	r->cpu = s->cpu;
}

/* Write a kept branch, with the counts of the jumps dropped before it and the time of the
 * first of them. */
void keep_branch(struct ptscope_filter *f, struct thread_state *th, struct ptscope_branch_rec *r)
{
	r->insn_cnt += th->pending_insn;
	r->cyc_cnt += th->pending_cyc;
	th->pending_insn = 0;
	th->pending_cyc = 0;
	if (th->gap_time && th->gap_time < r->time && r->time - th->gap_time <= UINT32_MAX) {
		r->gap_delta = (uint32_t)(r->time - th->gap_time);
		r->gap_insns = th->gap_insn <= UINT16_MAX ? (uint16_t)th->gap_insn : 0;
	}
	th->gap_time = 0;
	th->last_kept = r->time;
	if (f->insns) {
		struct ptscope_insns_branch_rec ir;
		/* its lines records and itself in one chunk: the reader takes them together */
		uint32_t ranges = th->lines.n ? th->lines.n - 1 : 0;
		uint32_t recs = (ranges + PTSCOPE_LINES_PER_REC - 1) / PTSCOPE_LINES_PER_REC;
		emit_whole(f, recs * sizeof(struct ptscope_lines_rec) + sizeof(ir));
		struct ptscope_line_range last = take_lines(f, &th->lines);
		/* Written where it goes (ring mode, the usual case) rather than copied there. */
		struct ptscope_insns_branch_rec *out = emit_place(f, sizeof(ir));
		if (!out)
			out = &ir;
		out->branch = *r;
		out->last = last;
		if (out == &ir)
			emit(f, &ir, sizeof(ir));
	} else {
		emit(f, r, sizeof(*r));
	}
	f->counters.branches_kept++;
}

static inline size_t source_hint_index(uint64_t ip)
{
	return (ip ^ (ip >> 6) ^ (ip >> 12)) & (SOURCE_HINTS - 1);
}

/* The location of a branch source the thread met before, from its hints (a slot index,
 * checked against the slot's key: exact whatever moved since); NULL if not there. */
static inline struct loc_slot *source_hint(struct ptscope_filter *f, struct thread_state *th,
					   uint64_t ip, uint32_t gen)
{
	uint32_t i = th->source_hints[source_hint_index(ip)];
	if (i >= f->locs.cap)
		return NULL;
	struct loc_slot *slot = &f->locs.slots[i];
	return slot->id && slot->addr == ip && slot->meta == loc_meta(th->pid, gen, 0) ? slot
										     : NULL;
}

static int handle_branch(struct ptscope_filter *f, const struct perf_dlfilter_sample *s,
			 void *ctx)
{
	struct thread_state *th = thread_of(f, s->pid, s->tid);
	if (!th) {
		f->failed = 1;
		return -ENOMEM;
	}
	if (th->past_until) {
		f->counters.other++;
		return 1;
	}
	uint32_t *gen = &f->pid_gen[th->pid_index];
	const struct perf_dlfilter_al *ip_al = NULL;
	/* resolve_ip costs about as much as perf's whole per-sample work, so it is called
	 * only on a cache miss and at trace boundaries, where an exec would show. */
	if (!th->comm || (s->flags & PTSCOPE_BOUNDARY_FLAGS) || !(s->flags & PERF_DLFILTER_FLAG_BRANCH)) {
		ip_al = resolve_side(s, ctx, 0);
		if (ip_al && ip_al->comm != th->comm) {
			/* The thread's name changed (exec, or prctl): what its addresses resolve to
			 * may have changed too, so resolve this process's addresses afresh. */
			if (th->comm)
				++*gen;
			th->comm = ip_al->comm;
		}
	}
	struct loc_slot *src = ip_al ? NULL : source_hint(f, th, s->ip, *gen);
	if (!src) {
		src = location(f, s, ctx, *gen, 0, ip_al);
		if (src && ip_al && (src->sym_ptr != ip_al->sym || src->dso_ptr != ip_al->dso)) {
			/* perf resolves this ip differently than when we cached it: remapped code. */
			++*gen;
			src = location(f, s, ctx, *gen, 0, ip_al);
		}
		if (!src)
			return -ENOMEM;
		th->source_hints[source_hint_index(s->ip)] = (uint32_t)(src - f->locs.slots);
	}
	uint32_t src_id = src->id, src_fn = src->fn, dst_id, dst_fn;
	int32_t src_node = src->node, dst_node;
	if (s->addr && src->next_addr == s->addr) {
		dst_id = src->next_id; /* the same target as the last branch from here */
		dst_fn = src->next_fn;
		dst_node = src->next_node;
	} else {
		/* `src` moves when the table grows: found again then. */
		const struct loc_slot *before = f->locs.slots;
		struct loc_slot *dst = location(f, s, ctx, *gen, 1, NULL);
		if (!dst)
			return -ENOMEM;
		dst_id = dst->id;
		dst_fn = dst->fn;
		dst_node = dst->node;
		if (f->locs.slots != before)
			src = loc_find(&f->locs, s->ip, loc_meta(s->pid, *gen, 0));
		src->next_addr = s->addr;
		src->next_id = dst_id;
		src->next_fn = dst_fn;
		src->next_node = dst_node;
	}
	if (f->insns && account_block(f, th, s, ctx, *gen, src) < 0) {
		f->failed = 1;
		return -ENOMEM;
	}
	th->last_time = s->time;
	/* (a jump between inlined bodies is kept: the engine sees where it goes) */
	if (!f->keep_all && ptscope_droppable_flags(s->flags) && src_fn == dst_fn &&
	    src_node == dst_node) {
		if (!f->insns)
			th->pending_insn += s->insn_cnt;
		th->pending_cyc += s->cyc_cnt;
		/* Its time still tells how long the previous branches' timestamp lasted. */
		if (!th->gap_time && s->time > th->last_kept) {
			th->gap_time = s->time;
			/* where perf's time moved on, for the engine to spread times by */
			th->gap_insn = th->pending_insn;
		}
		if (f->to_end)
			branch_record(f, &th->last_dropped, s, src_id, dst_id);
		f->counters.branches_dropped++;
		return 1;
	}
	struct ptscope_branch_rec r;
	branch_record(f, &r, s, src_id, dst_id);
	keep_branch(f, th, &r);
	if (s->time > f->until)
		th->past_until = 1;
	return 1;
}

static int by_time(const void *a, const void *b)
{
	const struct thread_state *x = *(struct thread_state *const *)a;
	const struct thread_state *y = *(struct thread_state *const *)b;
	const struct ptscope_branch_rec *p = &x->last_dropped, *q = &y->last_dropped;
	if (p->time != q->time)
		return p->time < q->time ? -1 : 1;
	if (p->pid != q->pid)
		return p->pid < q->pid ? -1 : 1;
	return (p->tid > q->tid) - (p->tid < q->tid);
}

/* to-end: each thread whose trace ends with dropped jumps gets its last one written (its
 * own counts are among those carried), in time order: it was running until then. */
static void keep_trailing_jumps(struct ptscope_filter *f)
{
	size_t n = f->thread_ids.count, kept = 0;
	struct thread_state **tail = calloc(n ? n : 1, sizeof(*tail));
	if (!tail) {
		f->failed = 1;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct thread_state *th = &f->threads[i];
		if (th->last_dropped.tag && th->last_dropped.time > th->last_kept)
			tail[kept++] = th;
	}
	qsort(tail, kept, sizeof(*tail), by_time);
	for (size_t i = 0; i < kept; i++) {
		struct ptscope_branch_rec r = tail[i]->last_dropped;
		r.insn_cnt = r.cyc_cnt = 0; /* already in the thread's pending counts */
		keep_branch(f, tail[i], &r);
		f->counters.branches_dropped--; /* counted when it was dropped */
	}
	free(tail);
}

/* ------------------------------------------------------------ perf's API */

#define BEAT_SAMPLES (1u << 16) /* samples between two beats (a power of two) */

/* start() gives up: what it had made so far is freed, and `err` is perf's answer. */
static int start_failed(struct ptscope_filter *f, int err)
{
	if (f->own_out)
		fclose(f->out);
	free(f->only_pids.ids);
	free(f->only_tids.ids);
	inline_free(&f->inl);
	free(f);
	return err;
}

PTSCOPE_EXPORT int start(void **data, void *ctx)
{
	struct ptscope_filter *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->last_thread = -1;
	f->until = UINT64_MAX;
	f->beat_fd = -1;
	f->ring.free_fd = -1;
	int ring_fd = -1;
	int argc = 0;
	char **argv = perf_dlfilter_fns.args ? perf_dlfilter_fns.args(ctx, &argc) : NULL;
	const char *target = argc > 0 ? argv[0] : NULL;
	for (int i = 1; i < argc; i++) {
		int bad = 0;
		if (strcmp(argv[i], "keep-all") == 0)
			f->keep_all = 1;
		else if (strcmp(argv[i], "to-end") == 0)
			f->to_end = 1;
		else if (strcmp(argv[i], "insns") == 0)
			f->insns = 1;
		else if (strncmp(argv[i], "pid=", 4) == 0)
			bad = id_list_parse(argv[i] + 4, &f->only_pids);
		else if (strncmp(argv[i], "tid=", 4) == 0)
			bad = id_list_parse(argv[i] + 4, &f->only_tids);
		else if (strncmp(argv[i], "inline=", 7) == 0)
			bad = inline_load(&f->inl, argv[i] + 7);
		else if (strncmp(argv[i], "ring=", 5) == 0)
			bad = ring_parse(argv[i] + 5, &f->ring, &ring_fd);
		else if (strncmp(argv[i], "until=", 6) == 0) {
			char *end;
			errno = 0;
			unsigned long long t = strtoull(argv[i] + 6, &end, 10);
			if (*end || end == argv[i] + 6 || argv[i][6] == '-' || errno)
				bad = -EINVAL;
			f->until = t;
		} else if (strncmp(argv[i], "beat=", 5) == 0) {
			char *end;
			long fd = strtol(argv[i] + 5, &end, 10);
			if (*end || end == argv[i] + 5 || fd < 0 || fd > 1 << 20)
				bad = -EINVAL;
			else
				f->beat_fd = (int)fd;
		} else
			bad = -EINVAL;
		if (bad) {
			fprintf(stderr, "ptscope dlfilter: bad argument '%s'\n", argv[i]);
			return start_failed(f, bad);
		}
	}
	int err = open_output(f, target);
	if (err) {
		fprintf(stderr, "ptscope dlfilter: cannot open output '%s': %s\n", target,
			strerror(-err));
		return start_failed(f, err);
	}
	if (ring_fd >= 0) {
		err = ring_open(f, ring_fd);
		if (err) {
			fprintf(stderr, "ptscope dlfilter: cannot map the ring: %s\n", strerror(-err));
			return start_failed(f, err);
		}
	}
	emit_header(f);
	beat(f);
	*data = f;
	return 0;
}

PTSCOPE_EXPORT int filter_event_early(void *data, const struct perf_dlfilter_sample *sample,
				      void *ctx)
{
	struct ptscope_filter *f = data;
	if (f->failed)
		return -EIO;
	ring_order_text(f);
	if ((++f->counters.samples & (BEAT_SAMPLES - 1)) == 0)
		beat(f);
	if (!id_list_selects(&f->only_pids, sample->pid) ||
	    !id_list_selects(&f->only_tids, sample->tid)) {
		f->counters.other++;
		return 1;
	}
	int ret;
	switch (event_kind_of(f, sample->event)) {
	case EV_BRANCH:
		ret = handle_branch(f, sample, ctx);
		break;
	case EV_POWER:
		ret = handle_power(f, sample);
		break;
	default:
		f->counters.other++;
		ret = 1;
	}
	return f->failed ? -EIO : ret;
}

PTSCOPE_EXPORT int stop(void *data, void *ctx)
{
	(void)ctx;
	struct ptscope_filter *f = data;
	int ret = 0;
	if (!f)
		return 0;
	ring_order_text(f);
	if (f->to_end && !f->failed)
		keep_trailing_jumps(f);
	f->counters.tag = PTSCOPE_TAG_TRAILER;
	/* A copy: writing it may wait for a chunk, which counts in f->counters. */
	struct ptscope_trailer_rec trailer = f->counters;
	emit(f, &trailer, sizeof(trailer));
	if (f->ring.base && !f->failed && ring_publish(f, 1) < 0)
		f->failed = 1;
	if (fflush(f->out) != 0 || ferror(f->out))
		f->failed = 1;
	if (f->own_out && fclose(f->out) != 0)
		f->failed = 1;
	if (f->failed) {
		fprintf(stderr, "ptscope dlfilter: writing the record stream failed\n");
		ret = -EIO;
	}
	str_table_free(&f->names);
	str_table_free(&f->fnkeys);
	free(f->locs.slots);
	free(f->blocks.slots);
	free(f->code);
	for (size_t i = 0; i < f->thread_ids.count; i++)
		free(f->threads[i].lines.r);
	id_map_free(&f->thread_ids);
	free(f->threads);
	id_map_free(&f->pid_ids);
	free(f->pid_gen);
	free(f->only_pids.ids);
	free(f->only_tids.ids);
	inline_free(&f->inl);
	if (f->ring.base)
		munmap(f->ring.base, (size_t)f->ring.chunks * f->ring.chunk_bytes);
	free(f->ring.free);
	free(f);
	return ret;
}

PTSCOPE_EXPORT const char *filter_description(const char **long_description)
{
	if (long_description)
		*long_description =
			"Drops jumps inside one function and writes the other branches as binary "
			"records for ptscope (args: OUT [keep-all] [to-end] [until=NS] [insns] [inline=PATH] [pid=P,...] "
			"[tid=T,...] [beat=FD] [ring=MEMFD,FREEFD,CHUNKS,BYTES]; OUT = - | fd:N | PATH).";
	return "ptscope: compact branch record stream";
}
