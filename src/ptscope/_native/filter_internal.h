/* What the dlfilter's files share; not an interface (perf's dlfilter API is one).
 *
 * The dlfilter is one shared object cut into files that each hold one part of it:
 *   dlfilter.c       perf's entry points (start, filter_event_early, stop), resolving
 *                    addresses into locations, and what is done per sample;
 *   filter_blocks.c  instruction detail: basic blocks split and counted, code lines;
 *   filter_output.c  the record stream: stdout or a file, ring mode's shared chunks;
 *   filter_tables.c  the tables (no perf in them): strings, locations, blocks, ids.
 * They are linked with link-time optimisation (setup.py), so the calls between them cost
 * what calls within one file did.
 */
#ifndef PTSCOPE_FILTER_INTERNAL_H
#define PTSCOPE_FILTER_INTERNAL_H

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

#include "filter_tables.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the record stream is little-endian; this target is not"
#endif

#define PTSCOPE_EXPORT __attribute__((visibility("default")))

/* perf copies its callback table here before calling start() (dlfilter.c). */
extern struct perf_dlfilter_fns perf_dlfilter_fns;

/* ------------------------------------------------------------- line sets */

/* A set of 64-byte code lines as ascending, disjoint, non-adjacent ranges [lo, hi]. */
struct line_set {
	struct ptscope_line_range *r; /* first, count */
	uint32_t n;
	uint32_t cap;
};

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
	uint64_t last_time;    /* time of its last branch, kept or not (inlined code's rows) */
	uint64_t gap_time;     /* first dropped branch later than that, 0 if none yet */
	uint64_t gap_insn;     /* the instructions counted up to that branch, included */
	struct ptscope_branch_rec last_dropped; /* the latest dropped jump (to-end) */
	int past_until; /* until=: its first kept branch past the end is written */
	/* Where the locations of its branch sources are in the table (by a hash of the ip;
	 * each checked before use): the one lookup a branch taken again still needed. */
	uint32_t source_hints[SOURCE_HINTS];
};

enum event_kind { EV_OTHER, EV_BRANCH, EV_POWER };

/* filter_inline.c: the runs file (--dlarg inline=PATH), and the runs of a DSO by name. */
struct inline_dso {
	const char *name;
	struct inline_runs runs;
};
#define INLINE_SEEN 16
struct inline_seen {
	const char *name; /* perf's pointer */
	const struct inline_runs *runs;
};
struct inline_file {
	uint8_t *data;
	struct inline_dso *dsos;
	size_t ndsos;
	struct inline_seen seen[INLINE_SEEN];
	size_t next_seen;
};

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
	uint64_t until; /* until=: ignore a thread's samples after its first kept branch past
			 * it (UINT64_MAX: none) */
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
	struct inline_file inl;
};

/* ------------------------------------------------ filter_inline.c */

int inline_load(struct inline_file *in, const char *path);
void inline_free(struct inline_file *in);
const struct inline_runs *inline_runs_of(struct inline_file *in, const char *dso);

/* ------------------------------------------------ dlfilter.c, for filter_blocks.c */

/* The location of an address met inside a block (an inlined body's first instruction),
 * resolved through perf's resolve_address() as a branch target is. */
struct loc_slot *location_at(struct ptscope_filter *f, const struct perf_dlfilter_sample *s,
			     void *ctx, uint32_t gen, uint64_t addr);
void branch_record(struct ptscope_filter *f, struct ptscope_branch_rec *r,
		   const struct perf_dlfilter_sample *s, uint32_t ip_loc, uint32_t addr_loc);
void keep_branch(struct ptscope_filter *f, struct thread_state *th, struct ptscope_branch_rec *r);

/* ------------------------------------------------ filter_output.c: the stream */

/* Ring mode: hand the current chunk over (a chunk record on stdout, flushed), and unless
 * it is the last, take a free one to fill, waiting for ptscope to give one back if none
 * is. An empty chunk is not handed over: the record then says "none" (it orders perf's
 * text only). */
int ring_publish(struct ptscope_filter *f, int last);

void ring_write(struct ptscope_filter *f, const void *rec, size_t size);

/* Ring mode: perf printed something since our last chunk record (after the records
 * written so far): hand them over first. */
static inline void ring_order_text(struct ptscope_filter *f)
{
	if (f->ring.base && __fpending(f->out) != f->ring.pending && ring_publish(f, 0) < 0)
		f->failed = 1;
}

/* Ring mode: where the next byte goes in the chunk being filled. */
static inline uint8_t *ring_cursor(const struct ring *r)
{
	return r->base + (size_t)r->cur * r->chunk_bytes + r->used;
}

/* Ring mode: the place of a record of `size` bytes at the end of the chunk being filled,
 * where the caller writes it (every byte); NULL when it does not fit or the stream is not
 * a ring (then the caller emit()s it). */
static inline void *emit_place(struct ptscope_filter *f, size_t size)
{
	struct ring *r = &f->ring;
	if (!r->base || r->chunk_bytes - r->used < size)
		return NULL;
	void *at = ring_cursor(r);
	r->used += (uint32_t)size;
	return at;
}

static inline void emit(struct ptscope_filter *f, const void *rec, size_t size)
{
	/* ring_write's common case, inline: the record fits in the chunk being filled (its
	 * size is a constant here, so the copy is a few stores, not a call) */
	void *at = emit_place(f, size);
	if (at)
		memcpy(at, rec, size);
	else if (f->ring.base)
		ring_write(f, rec, size);
	else if (fwrite_unlocked(rec, size, 1, f->out) != 1)
		f->failed = 1;
}

/* Ring mode: a record of `size` bytes (or one written in parts: a string record and its
 * bytes, a branch record and its lines records) that does not fit in what is left of the
 * chunk starts the next one, rather than straddle two: the reader then finds each chunk's
 * records whole and reads them in one run where they lie, instead of joining the piece
 * left over with the next chunk's start (a second run, and its Python work, per chunk).
 * The chunk's tail stays unused (its chunk record gives the length used); a record longer
 * than a chunk (a long string) still straddles. */
static inline void emit_whole(struct ptscope_filter *f, size_t size)
{
	struct ring *r = &f->ring;
	if (r->base && r->used && r->chunk_bytes - r->used < size && size <= r->chunk_bytes &&
	    ring_publish(f, 0) < 0)
		f->failed = 1;
}

void emit_header(struct ptscope_filter *f);

/* The watchdog's beat: one byte into the beat pipe, if any. */
void beat(struct ptscope_filter *f);

int open_output(struct ptscope_filter *f, const char *target);

/* ring=MEMFD,FREEFD,CHUNKS,BYTES */
int ring_parse(const char *text, struct ring *r, int *memfd);

int ring_open(struct ptscope_filter *f, int memfd);

/* ------------------------------------- filter_blocks.c: instruction detail */

/* Instruction detail: write a kept branch's lines records (all its line ranges but the
 * last) and return the last range, which goes into its branch record. The set is emptied. */
struct ptscope_line_range take_lines(struct ptscope_filter *f, struct line_set *set);

/* Instruction detail: add the block the thread ran up to this branch to its pending count
 * and lines. The block starts at the previous branch's target and ends with this branch's
 * source, included unless the sample is asynchronous (an interrupt or the end of the
 * trace: its ip is where the thread would resume, not an instruction that ran). */
int account_block(struct ptscope_filter *f, struct thread_state *th,
		  const struct perf_dlfilter_sample *s, void *ctx, uint32_t gen,
		  struct loc_slot *src);

#endif /* PTSCOPE_FILTER_INTERNAL_H */
