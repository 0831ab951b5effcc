/* Instruction detail (--dlarg insns): the basic block a thread ran between two branch
 * samples, decoded once through perf's object_code() and split with x86_length.c, its
 * count cached in the block table; the 64-byte code lines it touched, kept as ranges
 * until the next kept branch takes them (dlfilter.c's comment, "Basic blocks").
 */
#include "filter_internal.h"

/* ------------------------------------------------------------- line sets */

static int line_set_add_anywhere(struct line_set *s, uint64_t lo, uint64_t hi);

/* Add the lines lo..hi. 0, or -1 when out of memory. The common cases are inlined where
 * blocks are counted, the rest is a call: left to itself, the compiler's choice of what
 * to inline moved with unrelated changes to the per-sample path (one that added two
 * checks there cost perf 1.2 % more instructions, most of it here). */
static inline __attribute__((always_inline)) int line_set_add(struct line_set *s, uint64_t lo,
							      uint64_t hi)
{
	/* The set is empty (a kept branch took its lines, and this is the first block since),
	 * or lo..hi starts inside its last range or right after it, which no other range can
	 * touch (code mostly runs forward). */
	if (!s->n && s->cap) {
		s->r[0].first = lo;
		s->r[0].count = hi - lo + 1;
		s->n = 1;
		return 0;
	}
	if (s->n) {
		struct ptscope_line_range *last = &s->r[s->n - 1];
		uint64_t end = last->first + last->count; /* its last line + 1 */
		if (lo >= last->first && lo <= end) {
			if (hi >= end)
				last->count = hi - last->first + 1;
			return 0;
		}
	}
	return line_set_add_anywhere(s, lo, hi);
}

/* line_set_add's other cases: lo..hi anywhere in the set. */
__attribute__((noinline)) static int line_set_add_anywhere(struct line_set *s, uint64_t lo,
							   uint64_t hi)
{
	/* The first range that ends at or after lo - 1 (it may touch or overlap lo..hi). */
	uint32_t a = 0, b = s->n;
	while (a < b) {
		uint32_t m = (a + b) / 2;
		if (s->r[m].first + s->r[m].count < lo) /* its last line + 1 < lo */
			a = m + 1;
		else
			b = m;
	}
	if (a < s->n && s->r[a].first <= lo && s->r[a].first + s->r[a].count > hi)
		return 0; /* already there: the common case (a loop runs the same block) */
	/* Ranges a..c-1 touch or overlap lo..hi: merge them into one. */
	uint32_t c = a;
	while (c < s->n && s->r[c].first <= hi + 1) {
		if (s->r[c].first < lo)
			lo = s->r[c].first;
		uint64_t last = s->r[c].first + s->r[c].count - 1;
		if (last > hi)
			hi = last;
		c++;
	}
	if (c == a) { /* insert at a */
		if (s->n == s->cap) {
			uint32_t ncap = s->cap ? s->cap * 2 : 8;
			struct ptscope_line_range *nr = realloc(s->r, ncap * sizeof(*nr));
			if (!nr)
				return -1;
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

/* line_set_add for the tests (an exported function is called through the PLT). */
PTSCOPE_EXPORT int ptscope_line_set_add(struct line_set *s, uint64_t lo, uint64_t hi)
{
	return line_set_add(s, lo, hi);
}

/* ----------------------------------------------------------- per branch */

struct ptscope_line_range take_lines(struct ptscope_filter *f, struct line_set *set)
{
	struct ptscope_line_range last = { 0, 0 };
	if (!set->n)
		return last;
	uint32_t before = set->n - 1;
	for (uint32_t i = 0; i < before; i += PTSCOPE_LINES_PER_REC) {
		struct ptscope_lines_rec r;
		memset(&r, 0, sizeof(r));
		r.tag = PTSCOPE_TAG_LINES;
		uint32_t k = before - i < PTSCOPE_LINES_PER_REC ? before - i : PTSCOPE_LINES_PER_REC;
		r.ranges = (uint8_t)k;
		memcpy(r.range, &set->r[i], k * sizeof(r.range[0]));
		emit(f, &r, sizeof(r));
		f->counters.lines++;
	}
	last = set->r[before];
	set->n = 0;
	return last;
}

/* The block cache entry of the code from `start` to `end` in the sample's process,
 * decoded now if it is new (through perf's object_code, which reads the sample's
 * thread's mapping of it). NULL only when out of memory. */
/* Room for `want` bytes of code in f->code (0), or -1 when out of memory. */
static int code_room(struct ptscope_filter *f, size_t want)
{
	if (want <= f->code_cap)
		return 0;
	size_t ncap = f->code_cap ? f->code_cap : 4096;
	while (ncap < want)
		ncap *= 2;
	uint8_t *nc = realloc(f->code, ncap);
	if (!nc)
		return -1;
	f->code = nc;
	f->code_cap = ncap;
	return 0;
}

static struct block_slot *block_of(struct ptscope_filter *f, uint64_t start, uint64_t end,
				   uint64_t meta, void *ctx)
{
	if ((f->blocks.count + 1) * 2 > f->blocks.cap && block_table_grow(&f->blocks) < 0)
		return NULL;
	struct block_slot *b = block_find(&f->blocks, start, end, meta);
	if (b->used)
		return b;
	*b = (struct block_slot){ .start = start, .end = end, .meta = meta, .used = 1,
				  .before = BLOCK_UNKNOWN };
	f->blocks.count++;
	if (end < start || end - start > BLOCK_MAX_BYTES || !perf_dlfilter_fns.object_code)
		return b;
	size_t want = (size_t)(end - start) + PTSCOPE_X86_MAX_LENGTH;
	if (code_room(f, want) < 0)
		return NULL;
	int32_t got = perf_dlfilter_fns.object_code(ctx, start, f->code, (uint32_t)want);
	uint32_t before;
	uint8_t end_len;
	if (got >= (int64_t)(end - start) &&
	    ptscope_x86_split(f->code, (size_t)got, (size_t)(end - start), &before, &end_len) == 0) {
		b->before = before;
		b->end_len = end_len;
		f->counters.blocks_decoded++;
	}
	return b;
}

/* The instructions from `start` up to `at` (not included): -1 where `at` is no
 * instruction boundary (ptscope_x86_split on the code perf reads there). */
static long insns_before(struct ptscope_filter *f, void *ctx, uint64_t start, uint64_t at)
{
	if (!perf_dlfilter_fns.object_code || at - start > BLOCK_MAX_BYTES)
		return -1;
	size_t want = (size_t)(at - start) + PTSCOPE_X86_MAX_LENGTH;
	if (code_room(f, want) < 0)
		return -1;
	int32_t got = perf_dlfilter_fns.object_code(ctx, start, f->code, (uint32_t)want);
	uint32_t before;
	uint8_t len;
	if (got < (int64_t)(at - start) ||
	    ptscope_x86_split(f->code, (size_t)got, (size_t)(at - start), &before, &len) != 0)
		return -1;
	return before;
}

/* The inlined bodies that the block from `start` to its last instruction executed (at
 * `last`) enters or leaves inside it, as the own decoder finds them (pt_feed.c:
 * split_inlined, which says what the rows are): the same addresses, the same instruction
 * counts (x86_length.c on the same bytes), the same rows. */
static int split_inlined(struct ptscope_filter *f, struct thread_state *th,
			 const struct perf_dlfilter_sample *s, void *ctx, uint32_t gen,
			 const struct loc_slot *src, uint64_t start, uint64_t last, uint64_t *done,
			 uint64_t *from)
{
	const struct inline_runs *runs = src->inl;
	if (!runs || !src->has_map || s->ip - start > src->map_addr)
		return 0;
	/* the block's file addresses: the source's, less the bytes before it */
	uint64_t a0 = src->map_addr - (s->ip - start), next, after;
	uint64_t end = a0 + (last - start);
	int32_t node = inline_runs_node(runs, a0, &next);
	uint64_t from_at = start, base = 0;
	while (next <= end) {
		uint64_t b = next;
		int32_t now = inline_runs_node(runs, b, &after);
		next = after;
		if (now == node)
			continue;
		uint64_t at = start + (b - a0);
		/* counted from the last place split (see pt_feed.c) */
		long n = insns_before(f, ctx, from_at, at);
		if (n < 0)
			continue;
		uint64_t before = base + (uint64_t)n;
		from_at = at;
		base = before;
		node = now;
		if (f->insns && line_set_add(&th->lines, *from >> 6, (at - 1) >> 6))
			return -ENOMEM;
		*from = at;
		th->pending_insn += before - *done;
		*done = before;
		struct loc_slot *loc = location_at(f, s, ctx, gen, at);
		if (!loc)
			return -ENOMEM;
		struct ptscope_branch_rec r;
		branch_record(f, &r, s, loc->id, loc->id);
		r.flags = PTSCOPE_FLAG_INLINE;
		r.ip = r.addr = at;
		r.time = th->last_time;
		r.cyc_cnt = 0;
		keep_branch(f, th, &r);
	}
	return 0;
}

int account_block(struct ptscope_filter *f, struct thread_state *th,
		  const struct perf_dlfilter_sample *s, void *ctx, uint32_t gen,
		  struct loc_slot *src)
{
	uint64_t start = th->block_start;
	int seen = th->seen;
	th->block_start = s->addr; /* 0 when tracing stops: nothing known until it restarts */
	th->seen = 1;
	if (!s->ip)
		return 0; /* tracing (re)starts: nothing ran since the previous sample */
	if (!start) {
		/* The thread's first sample in this decode starts mid-block (a parallel window
		 * begins at a PSB): not unknown code, and parallel.py fixes its count. */
		if (seen)
			f->counters.blocks_unknown++;
		return 0;
	}
	/* The block from `start` to this branch's source: the source's memo, else the
	 * block table (src is keyed by this ip, pid and generation, like the block). */
	if (src->block_start != start) {
		struct block_slot *b = block_of(f, start, s->ip, loc_meta(s->pid, gen, 0), ctx);
		if (!b)
			return -ENOMEM;
		src->block_start = start;
		src->block_before = b->before;
		src->block_end_len = b->end_len;
	}
	uint32_t before = src->block_before;
	uint8_t end_len = src->block_end_len;
	int inclusive = !(s->flags & PERF_DLFILTER_FLAG_ASYNC);
	if (before == BLOCK_UNKNOWN || (inclusive && !end_len)) {
		f->counters.blocks_unknown++;
		return 0;
	}
	uint64_t count = before + (inclusive ? 1u : 0u);
	if (!count)
		return 0;
	uint64_t last_byte = inclusive ? s->ip + end_len - 1 : s->ip - 1;
	uint64_t done = 0, from = start;
	if (src->inl &&
	    split_inlined(f, th, s, ctx, gen, src, start, inclusive ? s->ip : s->ip - 1, &done,
			  &from) < 0)
		return -ENOMEM;
	th->pending_insn += count - done;
	return line_set_add(&th->lines, from >> 6, last_byte >> 6) ? -ENOMEM : 0;
}
