/* The own decoder's feed: see pt_feed.h. Each rule names the dlfilter function it
 * matches (dlfilter.c: handle_branch, keep_branch, keep_trailing_jumps; filter_blocks.c:
 * account_block), whose events these must equal (tests/decode/test_native_decoder.py). */
#include "pt_feed.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "pt_image.h"
#include "x86_length.h"

#define F_BRANCH (1u << 0)
#define F_CONDITIONAL (1u << 3)
#define F_ASYNC (1u << 5)
#define F_INLINE (1u << 30) /* engine.h: BF_INLINE */

#define BLOCK_MAX_BYTES (1u << 20) /* filter_tables.h: a longer straight run is no block */

struct pt_line_set {
	struct pt_line_range *r;
	uint32_t n, cap;
};

struct pt_row {
	int32_t pid, tid;
	uint64_t time;
	uint32_t flags;
	uint32_t src, dst;
	uint64_t insn, cyc;
};

struct pt_feed_thread {
	int32_t pid, tid;
	uint64_t pending_insn, pending_cyc;
	uint64_t block_start;
	bool seen;
	struct pt_line_set lines;
	uint64_t last_kept, gap_time, gap_insn;
	uint64_t last_time; /* of its last branch, kept or not */
	struct pt_row last_dropped;
	bool has_dropped;
};

/* (address, space and side) -> location: side 0 for a branch's source, 1 for its target
 * (perf resolves them apart: the ip by the sample's cpumode, the target with a fallback). */
struct pt_loc_slot {
	uint64_t addr;
	uint64_t key; /* (space + 1) << 1 | side; 0: empty */
	uint32_t id, fn, epoch;
	int32_t node;
};

/* ------------------------------------------------------------------ vectors */

static int vec_reserve(struct pt_vec *v, size_t more)
{
	if (v->n + more <= v->cap)
		return 0;
	size_t ncap = v->cap ? v->cap * 2 : 4096;
	while (ncap < v->n + more)
		ncap *= 2;
	void *np = realloc(v->p, ncap * v->size);
	if (!np)
		return -ENOMEM;
	v->p = np;
	v->cap = ncap;
	return 0;
}

#define VEC_PUSH(v, type, value)                                                            \
	(vec_reserve(&(v), 1) ? -ENOMEM : (((type *)(v).p)[(v).n++] = (value), 0))

int pt_feed_init(struct pt_feed *f, struct pt_image *image, bool keep_all, bool to_end,
		 bool insns)
{
	memset(f, 0, sizeof(*f));
	f->image = image;
	f->keep_all = keep_all;
	f->to_end = to_end;
	f->insns = insns;
	f->last_thread = -1;
	f->pid.size = f->tid.size = sizeof(int32_t);
	f->time.size = sizeof(int64_t);
	f->flags.size = sizeof(uint32_t);
	f->src.size = f->dst.size = sizeof(int32_t);
	f->insn.size = f->cyc.size = sizeof(uint64_t);
	f->gap_delta.size = sizeof(uint32_t);
	f->gap_insns.size = sizeof(uint16_t);
	f->line_offsets.size = sizeof(int32_t);
	f->lines.size = sizeof(uint64_t);
	f->events.size = sizeof(struct pt_event);
	f->locations.size = sizeof(struct pt_location);
	f->next_loc = 1;
	return VEC_PUSH(f->line_offsets, int32_t, 0);
}

void pt_feed_limits(struct pt_feed *f, uint64_t time_limit, uint64_t count_budget)
{
	f->time_limit = time_limit;
	f->count_max = f->count_budget = count_budget;
}

void pt_feed_free(struct pt_feed *f)
{
	struct pt_vec *vs[] = { &f->pid, &f->tid, &f->time, &f->flags, &f->src, &f->dst, &f->insn,
				&f->cyc, &f->gap_delta, &f->gap_insns, &f->line_offsets, &f->lines,
				&f->events, &f->locations };
	for (size_t i = 0; i < sizeof(vs) / sizeof(vs[0]); i++)
		free(vs[i]->p);
	for (size_t i = 0; i < f->nthreads; i++)
		free(f->threads[i].lines.r);
	free(f->threads);
	free(f->thread_keys);
	free(f->thread_slots);
	free(f->locs);
	free(f->only_pids);
	free(f->only_tids);
	memset(f, 0, sizeof(*f));
}

int pt_feed_select(struct pt_feed *f, const int32_t *pids, size_t npids, const int32_t *tids,
		   size_t ntids)
{
	if (npids) {
		f->only_pids = malloc(npids * sizeof(*pids));
		if (!f->only_pids)
			return -ENOMEM;
		memcpy(f->only_pids, pids, npids * sizeof(*pids));
		f->nonly_pids = npids;
	}
	if (ntids) {
		f->only_tids = malloc(ntids * sizeof(*tids));
		if (!f->only_tids)
			return -ENOMEM;
		memcpy(f->only_tids, tids, ntids * sizeof(*tids));
		f->nonly_tids = ntids;
	}
	return 0;
}

static bool selected(const int32_t *ids, size_t n, int32_t id)
{
	if (!n)
		return true;
	for (size_t i = 0; i < n; i++)
		if (ids[i] == id)
			return true;
	return false;
}

void pt_feed_clear(struct pt_feed *f)
{
	f->pid.n = f->tid.n = f->time.n = f->flags.n = f->src.n = f->dst.n = 0;
	f->insn.n = f->cyc.n = f->gap_delta.n = f->gap_insns.n = 0;
	f->lines.n = 0;
	f->line_offsets.n = 1; /* (its 0 stays) */
	f->events.n = 0;
	f->locations.n = 0;
}

/* ------------------------------------------------------------------ threads */

static inline uint64_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= UINT64_C(0x9e3779b97f4a7c15);
	x ^= x >> 29;
	return x;
}

static int threads_grow(struct pt_feed *f)
{
	size_t ncap = f->thread_cap ? f->thread_cap * 2 : 256;
	uint64_t *nk = calloc(ncap, sizeof(*nk));
	uint32_t *ns = calloc(ncap, sizeof(*ns));
	if (!nk || !ns) {
		free(nk);
		free(ns);
		return -ENOMEM;
	}
	for (size_t i = 0; i < f->thread_cap; i++) {
		if (!f->thread_slots[i])
			continue;
		size_t j = mix(f->thread_keys[i]) & (ncap - 1);
		while (ns[j])
			j = (j + 1) & (ncap - 1);
		nk[j] = f->thread_keys[i];
		ns[j] = f->thread_slots[i];
	}
	free(f->thread_keys);
	free(f->thread_slots);
	f->thread_keys = nk;
	f->thread_slots = ns;
	f->thread_cap = ncap;
	return 0;
}

static struct pt_feed_thread *thread_of(struct pt_feed *f, int32_t pid, int32_t tid)
{
	uint64_t key = (uint64_t)(uint32_t)pid << 32 | (uint32_t)tid;
	if (f->last_thread >= 0 && f->last_key == key)
		return &f->threads[f->last_thread];
	if ((f->nthreads + 1) * 2 > f->thread_cap && threads_grow(f) < 0)
		return NULL;
	size_t j = mix(key) & (f->thread_cap - 1);
	while (f->thread_slots[j]) {
		if (f->thread_keys[j] == key) {
			f->last_thread = f->thread_slots[j] - 1;
			f->last_key = key;
			return &f->threads[f->last_thread];
		}
		j = (j + 1) & (f->thread_cap - 1);
	}
	if (f->nthreads == f->capthreads) {
		size_t ncap = f->capthreads ? f->capthreads * 2 : 64;
		struct pt_feed_thread *nt = realloc(f->threads, ncap * sizeof(*nt));
		if (!nt)
			return NULL;
		f->threads = nt;
		f->capthreads = ncap;
	}
	struct pt_feed_thread *th = &f->threads[f->nthreads];
	memset(th, 0, sizeof(*th));
	th->pid = pid;
	th->tid = tid;
	f->thread_keys[j] = key;
	f->thread_slots[j] = (uint32_t)++f->nthreads;
	f->last_thread = (long)f->nthreads - 1;
	f->last_key = key;
	return th;
}

/* ---------------------------------------------------------------- locations */

static int locs_grow(struct pt_feed *f)
{
	size_t ncap = f->loc_cap ? f->loc_cap * 2 : 4096;
	struct pt_loc_slot *nl = calloc(ncap, sizeof(*nl));
	if (!nl)
		return -ENOMEM;
	for (size_t i = 0; i < f->loc_cap; i++) {
		struct pt_loc_slot *s = &f->locs[i];
		if (!s->key)
			continue;
		size_t j = mix(s->addr ^ mix(s->key)) & (ncap - 1);
		while (nl[j].key)
			j = (j + 1) & (ncap - 1);
		nl[j] = *s;
	}
	free(f->locs);
	f->locs = nl;
	f->loc_cap = ncap;
	return 0;
}

/* The location of an address as seen from a space (resolved now if new, or if the
 * space's maps changed since): its id and function key; 0 when out of memory. */
static uint32_t location(struct pt_feed *f, uint64_t addr, long space, int side, int32_t pid,
			 uint32_t *fn, int32_t *node)
{
	if ((f->loc_count + 1) * 2 > f->loc_cap && locs_grow(f) < 0)
		return 0;
	uint64_t key = ((uint64_t)(space + 1) + 1) << 1 | (uint64_t)side;
	uint32_t epoch = space >= 0 ? f->image->spaces[space]->epoch : 0;
	size_t j = mix(addr ^ mix(key)) & (f->loc_cap - 1);
	struct pt_loc_slot *slot;
	for (;;) {
		slot = &f->locs[j];
		if (!slot->key)
			break;
		if (slot->addr == addr && slot->key == key) {
			if (slot->epoch == epoch) {
				*fn = slot->fn;
				*node = slot->node;
				return slot->id;
			}
			break; /* resolved under other maps: again */
		}
		j = (j + 1) & (f->loc_cap - 1);
	}
	struct pt_resolved r = { 0, 0, f->image->unknown_fn, -1, 0 };
	if (space >= 0 && pt_image_resolve(f->image, (size_t)space, addr, &r) < 0)
		return 0;
	bool fresh = !slot->key;
	struct pt_location loc = { addr, r.name ? r.offset : -1, r.name, r.dso, pid, r.node };
	if (VEC_PUSH(f->locations, struct pt_location, loc))
		return 0;
	if (fresh)
		f->loc_count++;
	*slot = (struct pt_loc_slot){ addr, key, f->next_loc++, r.fn, epoch, r.node };
	*fn = slot->fn;
	*node = slot->node;
	return slot->id;
}

/* ---------------------------------------------------------------- code lines */

/* Add lines lo..hi to a thread's set of ranges (sorted, disjoint, not adjacent). */
static int lines_add(struct pt_line_set *s, uint64_t lo, uint64_t hi)
{
	if (s->n) {
		struct pt_line_range *last = &s->r[s->n - 1];
		uint64_t end = last->first + last->count;
		if (lo >= last->first && lo <= end) { /* the common case: code runs forward */
			if (hi >= end)
				last->count = hi - last->first + 1;
			return 0;
		}
	}
	uint32_t a = 0, b = s->n;
	while (a < b) { /* the first range ending at or after lo - 1 */
		uint32_t m = (a + b) / 2;
		if (s->r[m].first + s->r[m].count < lo)
			a = m + 1;
		else
			b = m;
	}
	if (a < s->n && s->r[a].first <= lo && s->r[a].first + s->r[a].count > hi)
		return 0;
	uint32_t c = a;
	while (c < s->n && s->r[c].first <= hi + 1) {
		if (s->r[c].first < lo)
			lo = s->r[c].first;
		uint64_t last = s->r[c].first + s->r[c].count - 1;
		if (last > hi)
			hi = last;
		c++;
	}
	if (c == a) {
		if (s->n == s->cap) {
			uint32_t ncap = s->cap ? s->cap * 2 : 8;
			struct pt_line_range *nr = realloc(s->r, ncap * sizeof(*nr));
			if (!nr)
				return -ENOMEM;
			s->r = nr;
			s->cap = ncap;
		}
		memmove(&s->r[a + 1], &s->r[a], (s->n - a) * sizeof(*s->r));
		s->n++;
	} else if (c > a + 1) {
		memmove(&s->r[a + 1], &s->r[c], (s->n - c) * sizeof(*s->r));
		s->n -= c - a - 1;
	}
	s->r[a].first = lo;
	s->r[a].count = hi - lo + 1;
	return 0;
}

/* The instructions of the code from start up to `end` (not included) and the length of
 * the one at `end`, split as the dlfilter splits a block it reads through perf
 * (filter_blocks.c: block_of, then ptscope_x86_split): the bytes of the map holding
 * `start`, one after the other. -1: they do not split exactly there. */
static int split_block(struct pt_image *im, long space, uint64_t start, uint64_t end,
		       uint32_t *before, uint8_t *end_len)
{
	if (space < 0)
		return -1;
	const struct pt_map *m = pt_space_find(im->spaces[space], start);
	if (!m)
		return -1;
	const struct pt_file *file = &im->files[m->file];
	uint64_t off = pt_map_ip(im, m, start);
	if (!file->data || off >= file->size)
		return -1;
	size_t avail = file->size - off, size = (size_t)(end - start);
	if (avail > size + PTSCOPE_X86_MAX_LENGTH)
		avail = size + PTSCOPE_X86_MAX_LENGTH;
	if (avail < size)
		return -1;
	return ptscope_x86_split(file->data + off, avail, size, before, end_len);
}

static int emit_row(struct pt_feed *f, struct pt_feed_thread *th, const struct pt_row *r);

/* The inlined bodies that the run from `start` to its last instruction executed (at
 * `last`) enters or leaves inside it: a row of their own each (F_INLINE, src and dst the
 * first instruction there), with the instructions and code lines before it, dated with the
 * thread's last branch (the engine spreads it by instructions up to the next time). *done:
 * the run's instructions those rows took; *from: where the code lines left begin. A
 * boundary that is not where an instruction begins is no transition (damaged code). */
static int split_inlined(struct pt_feed *f, struct pt_feed_thread *th, const struct pt_sample *s,
			 uint64_t start, uint64_t last, uint64_t *done, uint64_t *from)
{
	struct pt_image *im = f->image;
	if (!im->inlined || s->space < 0)
		return 0;
	const struct pt_map *m = pt_space_find(im->spaces[s->space], start);
	if (!m)
		return 0;
	const struct pt_symbols *sy = &im->files[m->file].syms;
	if (!sy->ninl)
		return 0;
	uint64_t a0 = pt_map_ip(im, m, start), next, after;
	uint64_t end = a0 + (last - start); /* the last instruction's file address */
	int32_t node = pt_symbols_node(sy, a0, &next);
	/* Counted from the last place split (an instruction's start), not from the block's:
	 * a long block with many bodies in it costs its length once, not once per body. */
	uint64_t from_at = start;
	uint64_t base = 0;
	while (next <= end) {
		uint64_t b = next;
		int32_t now = pt_symbols_node(sy, b, &after);
		next = after;
		if (now == node)
			continue;
		uint64_t at = start + (b - a0);
		uint32_t n;
		uint8_t len;
		if (split_block(im, s->space, from_at, at, &n, &len) < 0)
			continue;
		uint64_t before = base + n;
		from_at = at;
		base = before;
		node = now;
		if (f->insns && lines_add(&th->lines, *from >> 6, (at - 1) >> 6) < 0)
			return -ENOMEM;
		*from = at;
		th->pending_insn += before - *done;
		*done = before;
		uint32_t fn;
		int32_t nd;
		uint32_t loc = location(f, at, s->space, 1, s->pid, &fn, &nd);
		if (!loc)
			return -ENOMEM;
		struct pt_row r = { s->pid, s->tid, th->last_time, F_INLINE, loc, loc, 0, 0 };
		if (emit_row(f, th, &r) < 0)
			return -ENOMEM;
	}
	return 0;
}

/* account_block: the instructions and code lines of the run from the thread's block
 * start (its previous branch's target) to this branch. */
static int account_block(struct pt_feed *f, struct pt_feed_thread *th, const struct pt_sample *s)
{
	uint8_t ip_len = s->ip_len;
	uint64_t start = th->block_start;
	bool seen = th->seen;
	th->block_start = s->addr;
	th->seen = true;
	if (!s->ip)
		return 0; /* tracing (re)starts: nothing ran since */
	if (!start) {
		if (seen)
			f->blocks_unknown++;
		return 0;
	}
	bool inclusive = !(s->flags & F_ASYNC);
	uint64_t count;
	uint8_t end_len;
	if (s->ip < start || s->ip - start > BLOCK_MAX_BYTES) {
		f->blocks_unknown++;
		return 0;
	}
	if (s->walk_from == start && ip_len) {
		/* the walk went straight from there: its count */
		count = s->walked;
		end_len = ip_len;
	} else {
		uint32_t before;
		if (split_block(f->image, s->space, start, s->ip, &before, &end_len) < 0 ||
		    (inclusive && !end_len)) {
			f->blocks_unknown++;
			return 0;
		}
		count = before + (inclusive ? 1u : 0u);
	}
	if (!count)
		return 0;
	uint64_t last_byte = inclusive ? s->ip + end_len - 1 : s->ip - 1;
	uint64_t done = 0, from = start;
	if (split_inlined(f, th, s, start, inclusive ? s->ip : s->ip - 1, &done, &from) < 0)
		return -ENOMEM;
	th->pending_insn += count - done;
	return lines_add(&th->lines, from >> 6, last_byte >> 6);
}

/* ------------------------------------------------------------------ output */

static int push_event(struct pt_feed *f, struct pt_event ev)
{
	ev.row = (uint32_t)f->pid.n;
	return VEC_PUSH(f->events, struct pt_event, ev);
}

/* Room for one more row in every column (they grow together). */
static int reserve_row(struct pt_feed *f)
{
	if (f->pid.n < f->pid.cap && f->line_offsets.n < f->line_offsets.cap)
		return 0;
	struct pt_vec *cols[] = { &f->pid, &f->tid, &f->time, &f->flags, &f->src, &f->dst,
				  &f->insn, &f->cyc, &f->gap_delta, &f->gap_insns,
				  &f->line_offsets };
	for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++)
		if (vec_reserve(cols[i], 1) < 0)
			return -ENOMEM;
	return 0;
}

static int emit_row(struct pt_feed *f, struct pt_feed_thread *th, const struct pt_row *r)
{
	if (reserve_row(f) < 0)
		return -ENOMEM;
	uint64_t insn = r->insn + th->pending_insn;
	uint64_t cyc = r->cyc + th->pending_cyc;
	th->pending_insn = th->pending_cyc = 0;
	uint32_t gap_delta = 0;
	uint16_t gap_insns = 0;
	if (th->gap_time && th->gap_time < r->time && r->time - th->gap_time <= UINT32_MAX) {
		gap_delta = (uint32_t)(r->time - th->gap_time);
		gap_insns = th->gap_insn <= UINT16_MAX ? (uint16_t)th->gap_insn : 0;
	}
	th->gap_time = 0;
	th->last_kept = r->time;
	if (r->time >= f->time_limit || gap_delta > r->time || insn > f->count_max ||
	    cyc > f->count_max || insn + cyc > f->count_budget) {
		/* numbers the engine cannot take (damaged data): an error in the row's place */
		f->kept++;
		th->lines.n = 0;
		int code = r->time >= f->time_limit ? PT_DAMAGED_TIME
			   : gap_delta > r->time    ? PT_DAMAGED_GAP
						    : PT_DAMAGED_COUNTS;
		uint64_t value = code == PT_DAMAGED_GAP ? gap_delta : insn;
		return push_event(f, (struct pt_event){ PT_EV_DAMAGED, 0, r->pid, r->tid, 0, code,
							code == PT_DAMAGED_TIME ? 0 : r->time,
							cyc, code == PT_DAMAGED_TIME ? r->time : value });
	}
	f->count_budget -= insn + cyc;
	size_t n = f->pid.n;
	((int32_t *)f->pid.p)[n] = r->pid;
	((int32_t *)f->tid.p)[n] = r->tid;
	((int64_t *)f->time.p)[n] = (int64_t)r->time;
	((uint32_t *)f->flags.p)[n] = r->flags;
	((int32_t *)f->src.p)[n] = (int32_t)r->src;
	((int32_t *)f->dst.p)[n] = (int32_t)r->dst;
	((uint64_t *)f->insn.p)[n] = insn;
	((uint64_t *)f->cyc.p)[n] = cyc;
	((uint32_t *)f->gap_delta.p)[n] = gap_delta;
	((uint16_t *)f->gap_insns.p)[n] = gap_insns;
	f->pid.n = f->tid.n = f->time.n = f->flags.n = f->src.n = f->dst.n = n + 1;
	f->insn.n = f->cyc.n = f->gap_delta.n = f->gap_insns.n = n + 1;
	if (f->insns) {
		struct pt_line_set *ls = &th->lines;
		for (uint32_t i = 0; i < ls->n; i++) {
			if (vec_reserve(&f->lines, ls->r[i].count) < 0)
				return -ENOMEM;
			uint64_t *out = (uint64_t *)f->lines.p + f->lines.n;
			for (uint64_t k = 0; k < ls->r[i].count; k++)
				out[k] = ls->r[i].first + k;
			f->lines.n += ls->r[i].count;
		}
		ls->n = 0;
	}
	((int32_t *)f->line_offsets.p)[f->line_offsets.n++] = (int32_t)f->lines.n;
	f->kept++;
	return 0;
}

/* ptscope_droppable_flags: plain and conditional jumps. */
static inline bool droppable(uint32_t flags)
{
	return (flags & F_BRANCH) && (flags & ~(F_BRANCH | F_CONDITIONAL)) == 0;
}

int pt_feed_branch(struct pt_feed *f, const struct pt_sample *s)
{
	f->samples++;
	if (!selected(f->only_pids, f->nonly_pids, s->pid) ||
	    !selected(f->only_tids, f->nonly_tids, s->tid)) {
		f->other++;
		return 0;
	}
	struct pt_feed_thread *th = thread_of(f, s->pid, s->tid);
	if (!th)
		return -ENOMEM;
	uint32_t src_fn, dst_fn, src, dst;
	int32_t src_node, dst_node;
	struct pt_block *b = s->src_blk;
	uint32_t epoch = s->space >= 0 ? f->image->spaces[s->space]->epoch + 1 : 0;
	if (b && b->loc_epoch == epoch && epoch) {
		/* the block's memos: no lookup for a branch taken again */
		src = b->src_loc;
		src_fn = b->src_fn;
		src_node = b->src_node;
		if (b->dst_addr == s->addr) {
			dst = b->dst_loc;
			dst_fn = b->dst_fn;
			dst_node = b->dst_node;
		} else {
			dst = location(f, s->addr, s->space, 1, s->pid, &dst_fn, &dst_node);
			b->dst_addr = s->addr;
			b->dst_loc = dst;
			b->dst_fn = dst_fn;
			b->dst_node = dst_node;
		}
	} else {
		src = location(f, s->ip, s->space, 0, s->pid, &src_fn, &src_node);
		dst = location(f, s->addr, s->space, 1, s->pid, &dst_fn, &dst_node);
		if (b && epoch) {
			b->loc_epoch = epoch;
			b->src_loc = src;
			b->src_fn = src_fn;
			b->src_node = src_node;
			b->dst_addr = s->addr;
			b->dst_loc = dst;
			b->dst_fn = dst_fn;
			b->dst_node = dst_node;
		}
	}
	if (!src || !dst)
		return -ENOMEM;
	if (f->insns && account_block(f, th, s) < 0)
		return -ENOMEM;
	th->last_time = s->time;
	struct pt_row r = { s->pid, s->tid, s->time, s->flags, src, dst,
			    f->insns ? 0 : s->insn_cnt, s->cyc_cnt };
	/* (a jump between inlined bodies is kept: the engine sees where it goes) */
	if (!f->keep_all && droppable(s->flags) && src_fn == dst_fn && src_node == dst_node) {
		if (!f->insns)
			th->pending_insn += s->insn_cnt;
		th->pending_cyc += s->cyc_cnt;
		/* its time still tells how long the previous branches' timestamp lasted */
		if (!th->gap_time && s->time > th->last_kept) {
			th->gap_time = s->time;
			th->gap_insn = th->pending_insn;
		}
		if (f->to_end) {
			th->last_dropped = r;
			th->has_dropped = true;
		}
		f->dropped++;
		return 0;
	}
	return emit_row(f, th, &r);
}

int pt_feed_power(struct pt_feed *f, int32_t pid, int32_t tid, int32_t cpu, uint64_t time,
		  uint32_t cbr, uint32_t khz)
{
	f->samples++;
	if (!selected(f->only_pids, f->nonly_pids, pid) ||
	    !selected(f->only_tids, f->nonly_tids, tid)) {
		f->other++;
		return 0;
	}
	f->power++;
	if (time >= f->time_limit)
		return push_event(f, (struct pt_event){ PT_EV_DAMAGED, 0, pid, tid, cpu,
							PT_DAMAGED_POWER_TIME, 0, 0, time });
	uint64_t mhz = ((uint64_t)khz + 500) / 1000;
	return push_event(f, (struct pt_event){ PT_EV_POWER, 0, pid, tid, cpu, 0, time, 0,
						(uint64_t)(cbr & 0xff) | mhz << 32 });
}

int pt_feed_error(struct pt_feed *f, int code, int32_t cpu, int32_t pid, int32_t tid, uint64_t ip,
		  uint64_t time)
{
	return push_event(f, (struct pt_event){ PT_EV_ERROR, 0, pid, tid, cpu, code, time, ip, 0 });
}

int pt_feed_comm(struct pt_feed *f, int32_t pid, int32_t tid, uint64_t time, uint32_t name,
		 bool exec)
{
	return push_event(f, (struct pt_event){ PT_EV_COMM, 0, pid, tid, -1, exec, time, 0, name });
}

static int by_time(const void *a, const void *b)
{
	const struct pt_feed_thread *x = *(struct pt_feed_thread *const *)a;
	const struct pt_feed_thread *y = *(struct pt_feed_thread *const *)b;
	const struct pt_row *p = &x->last_dropped, *q = &y->last_dropped;
	if (p->time != q->time)
		return p->time < q->time ? -1 : 1;
	if (p->pid != q->pid)
		return p->pid < q->pid ? -1 : 1;
	return (p->tid > q->tid) - (p->tid < q->tid);
}

int pt_feed_finish(struct pt_feed *f)
{
	if (!f->to_end)
		return 0;
	struct pt_feed_thread **tail = calloc(f->nthreads ? f->nthreads : 1, sizeof(*tail));
	if (!tail)
		return -ENOMEM;
	size_t n = 0;
	for (size_t i = 0; i < f->nthreads; i++) {
		struct pt_feed_thread *th = &f->threads[i];
		if (th->has_dropped && th->last_dropped.time > th->last_kept)
			tail[n++] = th;
	}
	qsort(tail, n, sizeof(*tail), by_time);
	int err = 0;
	for (size_t i = 0; i < n && !err; i++) {
		struct pt_row r = tail[i]->last_dropped;
		r.insn = r.cyc = 0; /* already in the thread's pending counts */
		err = emit_row(f, tail[i], &r);
		f->dropped--;
	}
	free(tail);
	return err;
}
