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
 * records cross stdout. perf's text must still come out in order: before each sample (and
 * at the end) the filter checks whether stdout's buffer holds anything since its last
 * chunk record; if so, perf printed it after the records written so far, and the current
 * chunk is handed over at once (the reader takes a chunk, then the text before its chunk
 * record). Each chunk record is flushed, so "nothing since" is "nothing pending".
 *
 * The logic lives in functions that take plain values (ptscope_* below, also exported) so
 * that it can be unit-tested with fabricated samples and a fake perf_dlfilter_fns table.
 */
#define _GNU_SOURCE
#if defined(__has_include)
#if !__has_include(<perf/perf_dlfilter.h>)
#error "<perf/perf_dlfilter.h> not found: install perf's headers (Debian/Ubuntu: apt-get install linux-perf)"
#endif
#endif
#include <perf/perf_dlfilter.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "record_format.h"
#include "x86_length.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the record stream is little-endian; this target is not"
#endif

#define PTSCOPE_EXPORT __attribute__((visibility("default")))

/* perf copies its callback table here before calling start(). */
PTSCOPE_EXPORT struct perf_dlfilter_fns perf_dlfilter_fns;

/* ------------------------------------------------------------------ hashing */

static inline uint64_t mix64(uint64_t x)
{
	/* splitmix64 finaliser: cheap and good enough for addresses and ids. */
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebULL;
	x ^= x >> 31;
	return x;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ULL;
	}
	return mix64(h);
}

/* -------------------------------------------------------- string interning */

struct str_slot {
	uint64_t hash;
	char *text; /* owned copy; NULL = empty slot */
	uint32_t len;
	uint32_t id;
};

struct str_table {
	struct str_slot *slots;
	size_t cap; /* power of two */
	size_t count;
};

static int str_table_grow(struct str_table *t)
{
	size_t ncap = t->cap ? t->cap * 2 : 1024;
	struct str_slot *ns = calloc(ncap, sizeof(*ns));
	if (!ns)
		return -1;
	for (size_t i = 0; i < t->cap; i++) {
		struct str_slot *s = &t->slots[i];
		if (!s->text)
			continue;
		size_t j = s->hash & (ncap - 1);
		while (ns[j].text)
			j = (j + 1) & (ncap - 1);
		ns[j] = *s;
	}
	free(t->slots);
	t->slots = ns;
	t->cap = ncap;
	return 0;
}

/* Id of `s` (1, 2, ...); *is_new tells whether it was just added. 0 on out-of-memory. */
static uint32_t str_intern(struct str_table *t, const char *s, size_t len, int *is_new)
{
	*is_new = 0;
	if ((t->count + 1) * 2 > t->cap && str_table_grow(t) < 0)
		return 0;
	uint64_t h = hash_bytes(s, len);
	size_t j = h & (t->cap - 1);
	while (t->slots[j].text) {
		struct str_slot *e = &t->slots[j];
		if (e->hash == h && e->len == len && memcmp(e->text, s, len) == 0)
			return e->id;
		j = (j + 1) & (t->cap - 1);
	}
	char *copy = malloc(len + 1);
	if (!copy)
		return 0;
	memcpy(copy, s, len);
	copy[len] = 0;
	t->count++;
	t->slots[j] = (struct str_slot){ .hash = h, .text = copy, .len = (uint32_t)len,
					 .id = (uint32_t)t->count };
	*is_new = 1;
	return (uint32_t)t->count;
}

static void str_table_free(struct str_table *t)
{
	for (size_t i = 0; i < t->cap; i++)
		free(t->slots[i].text);
	free(t->slots);
	memset(t, 0, sizeof(*t));
}

/* ------------------------------------------------------- open addressing */

/* The location and block caches are open-addressing tables (linear probing, a power of two
 * slots, at most half full). Double one: `slots` holds `*cap` elements of `size` bytes;
 * every used one is placed again by its hash into a new array, returned (the old one is
 * freed, `*cap` updated), or NULL when out of memory. Rare: the callbacks cost nothing. */
static void *table_grow(void *slots, size_t *cap, size_t size, size_t first_cap,
			int (*used)(const void *), uint64_t (*hash)(const void *))
{
	size_t ncap = *cap ? *cap * 2 : first_cap;
	char *ns = calloc(ncap, size);
	if (!ns)
		return NULL;
	const char *old = slots;
	for (size_t i = 0; i < *cap; i++) {
		const void *s = old + i * size;
		if (!used(s))
			continue;
		size_t j = hash(s) & (ncap - 1);
		while (used(ns + j * size))
			j = (j + 1) & (ncap - 1);
		memcpy(ns + j * size, s, size);
	}
	free(slots);
	*cap = ncap;
	return ns;
}

/* ------------------------------------------------------------ location cache */

/* One resolved address. The key is (address, pid, generation, side): the ip and addr of a
 * sample are resolved by different perf functions (by the sample's cpumode vs. with a
 * fallback), so each side is cached separately to stay identical to perf's text output. */
struct loc_slot {
	uint64_t addr;
	uint64_t meta;       /* pid | generation << 32 | side << 63 */
	uint32_t id;         /* 0 = empty slot */
	uint32_t fn;         /* function-key id: equal <=> same function for the engine */
	const char *sym_ptr; /* perf's pointers at resolve time, to notice a changed mapping */
	const char *dso_ptr;
	/* A branch source's memo (side 0): the target of the last branch from here and the
	 * block that ended here last, so that a branch taken again (a loop, a call site in
	 * one) costs no lookup. Both are copies of entries that never change. */
	uint64_t next_addr; /* 0: none yet */
	uint32_t next_id, next_fn;
	uint64_t block_start; /* 0: none yet */
	uint32_t block_before;
	uint8_t block_end_len;
};

struct loc_table {
	struct loc_slot *slots;
	size_t cap;
	size_t count;
};

static inline uint64_t loc_meta(int32_t pid, uint32_t gen, int side)
{
	return (uint32_t)pid | ((uint64_t)(gen & 0x7fffffff) << 32) | ((uint64_t)(side & 1) << 63);
}

static inline uint64_t loc_hash(uint64_t addr, uint64_t meta)
{
	return mix64(addr ^ mix64(meta));
}

static int loc_used(const void *slot)
{
	return ((const struct loc_slot *)slot)->id != 0;
}

static uint64_t loc_slot_hash(const void *slot)
{
	const struct loc_slot *s = slot;
	return loc_hash(s->addr, s->meta);
}

static int loc_table_grow(struct loc_table *t)
{
	struct loc_slot *ns =
		table_grow(t->slots, &t->cap, sizeof(*t->slots), 4096, loc_used, loc_slot_hash);
	if (!ns)
		return -1;
	t->slots = ns;
	return 0;
}

/* The slot for the key: either the matching entry or the empty slot where it goes. */
static inline struct loc_slot *loc_find(struct loc_table *t, uint64_t addr, uint64_t meta)
{
	size_t j = loc_hash(addr, meta) & (t->cap - 1);
	for (;;) {
		struct loc_slot *s = &t->slots[j];
		if (!s->id || (s->addr == addr && s->meta == meta))
			return s;
		j = (j + 1) & (t->cap - 1);
	}
}

/* --------------------------------------------------------------- id maps */

/* u64 key -> dense index; used for threads (pid:tid) and processes (pid). */
struct id_map {
	uint64_t *keys;
	uint32_t *vals; /* index + 1; 0 = empty */
	size_t cap;
	size_t count;
};

static int id_map_grow(struct id_map *m)
{
	size_t ncap = m->cap ? m->cap * 2 : 256;
	uint64_t *nk = calloc(ncap, sizeof(*nk));
	uint32_t *nv = calloc(ncap, sizeof(*nv));
	if (!nk || !nv) {
		free(nk);
		free(nv);
		return -1;
	}
	for (size_t i = 0; i < m->cap; i++) {
		if (!m->vals[i])
			continue;
		size_t j = mix64(m->keys[i]) & (ncap - 1);
		while (nv[j])
			j = (j + 1) & (ncap - 1);
		nk[j] = m->keys[i];
		nv[j] = m->vals[i];
	}
	free(m->keys);
	free(m->vals);
	m->keys = nk;
	m->vals = nv;
	m->cap = ncap;
	return 0;
}

/* Index for key; a new key gets index `count` (the caller extends its arrays). -1: OOM. */
static long id_map_get(struct id_map *m, uint64_t key, int *is_new)
{
	*is_new = 0;
	if ((m->count + 1) * 2 > m->cap && id_map_grow(m) < 0)
		return -1;
	size_t j = mix64(key) & (m->cap - 1);
	while (m->vals[j]) {
		if (m->keys[j] == key)
			return (long)m->vals[j] - 1;
		j = (j + 1) & (m->cap - 1);
	}
	m->keys[j] = key;
	m->vals[j] = (uint32_t)++m->count;
	*is_new = 1;
	return (long)m->count - 1;
}

static void id_map_free(struct id_map *m)
{
	free(m->keys);
	free(m->vals);
	memset(m, 0, sizeof(*m));
}

/* ------------------------------------------------------------- block cache */

/* One basic block: the instructions from `start` up to `end` (the source of the branch
 * that ended it). `before` counts those before `end`; `end_len` is the length of the one
 * at `end` (0: not decodable). BLOCK_UNKNOWN: the block could not be decoded (its code is
 * unreadable, or splitting it does not land on `end`); it is remembered so as not to
 * read it again. */
struct block_slot {
	uint64_t start;
	uint64_t end;
	uint64_t meta; /* as loc_meta(pid, generation, 0) */
	uint32_t before;
	uint8_t end_len;
	uint8_t used;
};

#define BLOCK_UNKNOWN UINT32_MAX
/* Longest block decoded: a straight run of code without a taken branch this long is
 * not a block that ran (a stale start after a gap perf did not report). */
#define BLOCK_MAX_BYTES (1u << 20)

struct block_table {
	struct block_slot *slots;
	size_t cap;
	size_t count;
};

static inline uint64_t block_hash(uint64_t start, uint64_t end, uint64_t meta)
{
	return mix64(start ^ mix64(end ^ mix64(meta)));
}

static int block_used(const void *slot)
{
	return ((const struct block_slot *)slot)->used;
}

static uint64_t block_slot_hash(const void *slot)
{
	const struct block_slot *s = slot;
	return block_hash(s->start, s->end, s->meta);
}

static int block_table_grow(struct block_table *t)
{
	struct block_slot *ns =
		table_grow(t->slots, &t->cap, sizeof(*t->slots), 4096, block_used, block_slot_hash);
	if (!ns)
		return -1;
	t->slots = ns;
	return 0;
}

/* The slot for the key: the matching entry or the empty slot where it goes. */
static inline struct block_slot *block_find(struct block_table *t, uint64_t start, uint64_t end,
					    uint64_t meta)
{
	size_t j = block_hash(start, end, meta) & (t->cap - 1);
	for (;;) {
		struct block_slot *s = &t->slots[j];
		if (!s->used || (s->start == start && s->end == end && s->meta == meta))
			return s;
		j = (j + 1) & (t->cap - 1);
	}
}

/* Split `size` bytes of code (`code` holds `avail` >= size bytes) into instructions:
 * *before = how many start before offset `size`, *end_len = the length of the one at
 * `size` (0 if none decodes there). -1 if the instructions do not end exactly at `size`. */
PTSCOPE_EXPORT int ptscope_split_block(const uint8_t *code, size_t avail, size_t size,
				       uint32_t *before, uint8_t *end_len)
{
	size_t pos = 0;
	uint32_t n = 0;
	while (pos < size) {
		int len = ptscope_x86_length(code + pos, avail - pos);
		if (len <= 0)
			return -1;
		pos += (size_t)len;
		n++;
	}
	if (pos != size)
		return -1;
	int len = pos < avail ? ptscope_x86_length(code + pos, avail - pos) : 0;
	*before = n;
	*end_len = len > 0 ? (uint8_t)len : 0;
	return 0;
}

/* ------------------------------------------------------------- line sets */

/* A set of 64-byte code lines as ascending, disjoint, non-adjacent ranges [lo, hi]. */
struct line_set {
	struct ptscope_line_range *r; /* first, count */
	uint32_t n;
	uint32_t cap;
};

/* Add the lines lo..hi. 0, or -1 when out of memory. */
static inline int line_set_add(struct line_set *s, uint64_t lo, uint64_t hi)
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

/* ------------------------------------------------------------------ state */

#define SOURCE_HINTS 64 /* a power of two */

struct thread_state {
	int32_t pid;
	uint32_t pid_index; /* into ptscope_filter.pid_gen */
	const char *comm; /* perf's comm string at the last sample: a change means exec */
	uint64_t pending_insn; /* counts carried by dropped branches, added to the next kept */
	uint64_t pending_cyc;
	uint64_t block_start;  /* insns: where the thread's current block began (the last
				* branch's target); 0 = not known */
	int seen;	       /* insns: a sample of the thread came before (else a window's
				* first branch: its count is fixed up from the previous window) */
	struct line_set lines; /* insns: code lines run since the last kept branch */
	uint64_t last_kept;    /* time of the thread's last kept branch */
	uint64_t gap_time;     /* first dropped branch later than that, 0 if none yet */
	uint64_t gap_insn;     /* the instructions counted up to that branch, included */
	struct ptscope_branch_rec last_dropped; /* the latest dropped jump (to-end) */
	/* Where the locations of its branch sources are in the table (by a hash of the ip;
	 * each checked before use): the one lookup a branch taken again still needed. */
	uint32_t source_hints[SOURCE_HINTS];
};

enum event_kind { EV_OTHER, EV_BRANCH, EV_POWER };

/* A small set of process or thread ids (a filter argument). */
struct id_list {
	int32_t *ids;
	size_t count;
};

/* "1,2,3" into `list`; 0, or -EINVAL for anything but a comma-separated list of ids. */
static int id_list_parse(const char *text, struct id_list *list)
{
	size_t cap = 1;
	for (const char *c = text; *c; c++)
		cap += *c == ',';
	list->ids = calloc(cap, sizeof(*list->ids));
	if (!list->ids)
		return -ENOMEM;
	list->count = 0;
	while (*text) {
		char *end;
		long id = strtol(text, &end, 10);
		if (end == text || id < 0 || id > INT32_MAX || (*end && *end != ','))
			return -EINVAL;
		list->ids[list->count++] = (int32_t)id;
		text = *end ? end + 1 : end;
	}
	return list->count ? 0 : -EINVAL;
}

/* An empty list selects everything. */
static int id_list_selects(const struct id_list *list, int32_t id)
{
	if (!list->count)
		return 1;
	for (size_t i = 0; i < list->count; i++)
		if (list->ids[i] == id)
			return 1;
	return 0;
}

/* Ring mode: the shared chunks and the one being filled. */
struct ring {
	uint8_t *base; /* CHUNKS * BYTES shared bytes; NULL: not in ring mode */
	uint32_t chunks, chunk_bytes;
	int free_fd;	/* where ptscope gives chunks back */
	uint32_t *free; /* chunks ready to fill */
	uint32_t nfree;
	uint32_t cur;	/* the chunk being filled */
	uint32_t used;	/* bytes in it */
	size_t pending; /* what stdout's buffer held after our last chunk record */
};

struct ptscope_filter {
	FILE *out;
	struct ring ring;
	int own_out;  /* we opened it (close in stop) */
	int keep_all; /* do not drop same-function jumps */
	int to_end;   /* write each thread's trailing dropped jump at the end */
	int insns;    /* instruction detail: exact counts, code lines */
	int failed;   /* a write failed: stop asking perf for more */
	int beat_fd;  /* beat=: the watchdog's pipe (-1: none) */
	struct id_list only_pids; /* pid=: keep only these processes (empty: all) */
	struct id_list only_tids; /* tid=: keep only these threads (empty: all) */
	struct str_table names;  /* symbol and DSO names, sent as string records */
	struct str_table fnkeys; /* function keys, internal only */
	struct loc_table locs;
	uint32_t next_loc_id;
	struct block_table blocks; /* insns */
	uint8_t *code;             /* insns: buffer for object_code() */
	size_t code_cap;
	struct id_map thread_ids;
	struct thread_state *threads;
	size_t threads_cap;
	uint64_t last_thread_key; /* consecutive samples are mostly from one thread */
	long last_thread; /* index, -1 = none */
	struct id_map pid_ids;
	uint32_t *pid_gen;
	size_t pid_cap;
	const char *last_event; /* evsel name pointer of the previous sample */
	enum event_kind last_kind;
	struct ptscope_trailer_rec counters;
};

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

/* --------------------------------------------------------------- writing */

/* Ring mode: hand the current chunk over (a chunk record on stdout, flushed), and unless
 * it is the last, take a free one to fill, waiting for ptscope to give one back if none
 * is. An empty chunk is not handed over: the record then says "none" (it orders perf's
 * text only). */
static int ring_publish(struct ptscope_filter *f, int last)
{
	struct ring *r = &f->ring;
	struct ptscope_chunk_rec c;
	memset(&c, 0, sizeof(c));
	c.tag = PTSCOPE_TAG_CHUNK;
	c.chunk = r->used ? r->cur : PTSCOPE_NO_CHUNK;
	c.length = r->used;
	if (fwrite_unlocked(&c, sizeof(c), 1, f->out) != 1 || fflush(f->out) != 0)
		return -1;
	r->pending = __fpending(f->out);
	if (!r->used || last)
		return 0;
	while (!r->nfree) {
		ssize_t got = read(r->free_fd, r->free, r->chunks * sizeof(uint32_t));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0 || got % sizeof(uint32_t))
			return -1; /* ptscope went away, or wrote nonsense */
		r->nfree = (uint32_t)(got / sizeof(uint32_t));
		for (uint32_t i = 0; i < r->nfree; i++)
			if (r->free[i] >= r->chunks)
				return -1;
	}
	r->cur = r->free[--r->nfree];
	r->used = 0;
	return 0;
}

static void ring_write(struct ptscope_filter *f, const void *rec, size_t size)
{
	struct ring *r = &f->ring;
	const uint8_t *p = rec;
	while (size) {
		if (r->used == r->chunk_bytes && ring_publish(f, 0) < 0) {
			f->failed = 1;
			return;
		}
		size_t room = r->chunk_bytes - r->used;
		size_t n = size < room ? size : room;
		memcpy(r->base + (size_t)r->cur * r->chunk_bytes + r->used, p, n);
		r->used += (uint32_t)n;
		p += n;
		size -= n;
	}
}

/* Ring mode: perf printed something since our last chunk record (after the records
 * written so far): hand them over first. */
static inline void ring_order_text(struct ptscope_filter *f)
{
	if (f->ring.base && __fpending(f->out) != f->ring.pending && ring_publish(f, 0) < 0)
		f->failed = 1;
}

static inline void emit(struct ptscope_filter *f, const void *rec, size_t size)
{
	if (f->ring.base)
		ring_write(f, rec, size);
	else if (fwrite_unlocked(rec, size, 1, f->out) != 1)
		f->failed = 1;
}

static void emit_header(struct ptscope_filter *f)
{
	struct ptscope_header_rec h;
	memset(&h, 0, sizeof(h));
	h.tag = PTSCOPE_TAG_HEADER;
	memcpy(h.magic, PTSCOPE_STREAM_MAGIC, sizeof(h.magic));
	h.version = PTSCOPE_STREAM_VERSION;
	h.branch_size = f->insns ? sizeof(struct ptscope_insns_branch_rec)
				 : sizeof(struct ptscope_branch_rec);
	h.location_size = sizeof(struct ptscope_location_rec);
	h.string_size = sizeof(struct ptscope_string_rec);
	h.power_size = sizeof(struct ptscope_power_rec);
	h.trailer_size = sizeof(struct ptscope_trailer_rec);
	h.lines_size = sizeof(struct ptscope_lines_rec);
	h.options = (f->keep_all ? PTSCOPE_OPT_KEEP_ALL : 0) | (f->insns ? PTSCOPE_OPT_INSNS : 0);
	emit(f, &h, sizeof(h));
}

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
	const char *sym = al ? al->sym : NULL;
	const char *dso = al ? al->dso : NULL;
	struct ptscope_location_rec r;
	memset(&r, 0, sizeof(r));
	r.tag = PTSCOPE_TAG_LOCATION;
	r.ip = addr;
	r.pid = s->pid;
	r.offset = ptscope_symbol_offset(al);
	r.symbol = symbol_is_unknown(sym) ? PTSCOPE_NO_STRING : name_id(f, sym);
	r.dso = dso ? name_id(f, dso) : PTSCOPE_NO_STRING;
	r.id = ++f->next_loc_id;
	emit(f, &r, sizeof(r));
	f->counters.locations++;
	*slot = (struct loc_slot){ .addr = addr, .meta = meta, .id = r.id,
				   .fn = function_key_id(f, sym, dso), .sym_ptr = sym, .dso_ptr = dso };
	f->locs.count++;
	return slot;
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

/* The record of a branch sample (its counts and gap added when it is kept). */
static void branch_record(struct ptscope_filter *f, struct ptscope_branch_rec *r,
			  const struct perf_dlfilter_sample *s, uint32_t ip_loc, uint32_t addr_loc)
{
	memset(r, 0, sizeof(*r));
	r->tag = PTSCOPE_TAG_BRANCH;
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

/* Instruction detail: write a kept branch's lines records (all its line ranges but the
 * last) and return the last range, which goes into its branch record. The set is emptied. */
static struct ptscope_line_range take_lines(struct ptscope_filter *f, struct line_set *set)
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
	if (want > f->code_cap) {
		size_t ncap = f->code_cap ? f->code_cap : 4096;
		while (ncap < want)
			ncap *= 2;
		uint8_t *nc = realloc(f->code, ncap);
		if (!nc)
			return NULL;
		f->code = nc;
		f->code_cap = ncap;
	}
	int32_t got = perf_dlfilter_fns.object_code(ctx, start, f->code, (uint32_t)want);
	uint32_t before;
	uint8_t end_len;
	if (got >= (int64_t)(end - start) &&
	    ptscope_split_block(f->code, (size_t)got, (size_t)(end - start), &before, &end_len) == 0) {
		b->before = before;
		b->end_len = end_len;
		f->counters.blocks_decoded++;
	}
	return b;
}

/* Instruction detail: add the block the thread ran up to this branch to its pending count
 * and lines. The block starts at the previous branch's target and ends with this branch's
 * source, included unless the sample is asynchronous (an interrupt or the end of the
 * trace: its ip is where the thread would resume, not an instruction that ran). */
static int account_block(struct ptscope_filter *f, struct thread_state *th,
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
	th->pending_insn += count;
	return line_set_add(&th->lines, start >> 6, last_byte >> 6) ? -ENOMEM : 0;
}

/* Write a kept branch, with the counts of the jumps dropped before it and the time of the
 * first of them. */
static void keep_branch(struct ptscope_filter *f, struct thread_state *th,
			struct ptscope_branch_rec *r)
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
		struct ptscope_insns_branch_rec ir = { .branch = *r };
		ir.last = take_lines(f, &th->lines);
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
	if (s->addr && src->next_addr == s->addr) {
		dst_id = src->next_id; /* the same target as the last branch from here */
		dst_fn = src->next_fn;
	} else {
		/* `src` moves when the table grows: found again then. */
		const struct loc_slot *before = f->locs.slots;
		struct loc_slot *dst = location(f, s, ctx, *gen, 1, NULL);
		if (!dst)
			return -ENOMEM;
		dst_id = dst->id;
		dst_fn = dst->fn;
		if (f->locs.slots != before)
			src = loc_find(&f->locs, s->ip, loc_meta(s->pid, *gen, 0));
		src->next_addr = s->addr;
		src->next_id = dst_id;
		src->next_fn = dst_fn;
	}
	if (f->insns && account_block(f, th, s, ctx, *gen, src) < 0) {
		f->failed = 1;
		return -ENOMEM;
	}
	if (!f->keep_all && ptscope_droppable_flags(s->flags) && src_fn == dst_fn) {
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

static void beat(struct ptscope_filter *f)
{
	if (f->beat_fd >= 0) {
		char byte = 0;
		ssize_t done = write(f->beat_fd, &byte, 1); /* a full pipe drops the beat */
		(void)done;
	}
}

static int open_output(struct ptscope_filter *f, const char *target)
{
	if (!target || strcmp(target, "-") == 0 || strcmp(target, "stdout") == 0) {
		f->out = stdout;
		/* A large buffer: fewer pipe writes. Safe here: perf has printed nothing yet, and
		 * glibc flushes anything pending before switching buffers anyway. */
		setvbuf(stdout, NULL, _IOFBF, 1 << 20);
		return 0;
	}
	if (strncmp(target, "fd:", 3) == 0) {
		char *end;
		long fd = strtol(target + 3, &end, 10);
		if (*end || fd < 0)
			return -EINVAL;
		f->out = fdopen((int)fd, "wb");
	} else {
		f->out = fopen(target, "wb");
	}
	if (!f->out)
		return -errno;
	setvbuf(f->out, NULL, _IOFBF, 1 << 20);
	f->own_out = 1;
	return 0;
}

/* ring=MEMFD,FREEFD,CHUNKS,BYTES */
static int ring_parse(const char *text, struct ring *r, int *memfd)
{
	long v[4];
	for (int k = 0; k < 4; k++) {
		char *end;
		v[k] = strtol(text, &end, 10);
		if (end == text || *end != (k < 3 ? ',' : '\0') || v[k] < 0)
			return -EINVAL;
		text = end + 1;
	}
	if (v[0] > 1 << 20 || v[1] > 1 << 20 || v[2] < 2 || v[2] > 1024 || v[3] < 4096 ||
	    v[3] > 1 << 26)
		return -EINVAL;
	*memfd = (int)v[0];
	r->free_fd = (int)v[1];
	r->chunks = (uint32_t)v[2];
	r->chunk_bytes = (uint32_t)v[3];
	return 0;
}

static int ring_open(struct ptscope_filter *f, int memfd)
{
	struct ring *r = &f->ring;
	if (f->own_out)
		return -EINVAL; /* the chunk records go to perf's stdout, with perf's text */
	size_t bytes = (size_t)r->chunks * r->chunk_bytes;
	void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
	if (base == MAP_FAILED)
		return -errno;
	close(memfd);
	r->free = malloc(r->chunks * sizeof(uint32_t));
	if (!r->free) {
		munmap(base, bytes);
		return -ENOMEM;
	}
	r->base = base;
	r->cur = 0;
	r->nfree = r->chunks - 1;
	for (uint32_t i = 0; i < r->nfree; i++)
		r->free[i] = r->chunks - 1 - i;
	/* Anything perf printed before us comes first. */
	r->pending = __fpending(f->out);
	return r->pending && ring_publish(f, 0) < 0 ? -EIO : 0;
}

/* start() gives up: what it had made so far is freed, and `err` is perf's answer. */
static int start_failed(struct ptscope_filter *f, int err)
{
	if (f->own_out)
		fclose(f->out);
	free(f->only_pids.ids);
	free(f->only_tids.ids);
	free(f);
	return err;
}

PTSCOPE_EXPORT int start(void **data, void *ctx)
{
	struct ptscope_filter *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->last_thread = -1;
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
		else if (strncmp(argv[i], "ring=", 5) == 0)
			bad = ring_parse(argv[i] + 5, &f->ring, &ring_fd);
		else if (strncmp(argv[i], "beat=", 5) == 0) {
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
	emit(f, &f->counters, sizeof(f->counters));
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
			"records for ptscope (args: OUT [keep-all] [to-end] [insns] [pid=P,...] "
			"[tid=T,...] [beat=FD] [ring=MEMFD,FREEFD,CHUNKS,BYTES]; OUT = - | fd:N | PATH).";
	return "ptscope: compact branch record stream";
}
