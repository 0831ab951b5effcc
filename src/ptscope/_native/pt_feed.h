/* The own decoder's last layer (pt_feed.c): perf-equivalent samples -> the engine's
 * input, batch by batch.
 *
 * It applies the rules the dlfilter applies inside perf (dlfilter.c, filter_blocks.c;
 * docs/file-formats.md, "What the filter keeps" and "Instruction detail"): jumps inside
 * one function are dropped and their counts carried to the next kept branch, with the
 * time and instruction count of the first of them (the gap); with instruction detail a
 * kept branch carries the exact instructions and code lines since the thread's previous
 * kept branch; at the end each thread's trailing dropped jump is kept. What comes out is
 * the columns of a model.BranchBatch, the events between its rows (decode errors, power
 * changes, thread names) and the locations met for the first time, which Python turns
 * into Location objects once each.
 */
#ifndef PTSCOPE_PT_FEED_H
#define PTSCOPE_PT_FEED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pt_block.h"

struct pt_image;

/* A branch sample, as perf would hand it to the dlfilter, with what the walk knows. */
struct pt_sample {
	int32_t pid, tid, cpu;
	uint32_t flags; /* PERF_IP_FLAG_* */
	uint64_t time;	/* perf ns */
	uint64_t ip, addr;
	uint64_t insn_cnt, cyc_cnt; /* perf's (IPC) counts */
	long space;		    /* the address space of its thread (-1: none) */
	/* instruction detail: the instructions the walk went through since the queue's
	 * previous branch sample (its target: walk_from; 0: not one straight walk) */
	uint64_t walk_from, walked;
	uint8_t ip_len; /* the length of the instruction at ip (0: not known) */
	struct pt_block *src_blk; /* the block ending at ip, when known (its memos) */
};

/* The events between rows. */
enum { PT_EV_ERROR, PT_EV_POWER, PT_EV_COMM, PT_EV_DAMAGED };
/* PT_EV_DAMAGED (numbers past what the engine takes, in place of a row or a power
 * event, as dlfilter_stream.py checks the dlfilter's records): its code says which. */
enum { PT_DAMAGED_TIME, PT_DAMAGED_GAP, PT_DAMAGED_COUNTS, PT_DAMAGED_POWER_TIME };
struct pt_event {
	uint32_t kind;
	uint32_t row; /* it comes before this row */
	int32_t pid, tid, cpu;
	int32_t code;	 /* error: its code; comm: 1 if exec */
	uint64_t time;	 /* error: 0 if none; comm: 0 if none */
	uint64_t ip;	 /* error; damaged: the cycle count */
	uint64_t value;	 /* power: cbr | freq in kHz << 32; comm: the name's string id;
			  * damaged: the time, gap or instruction count */
};

/* A location met for the first time: C location id `id` is (ip, symbol, offset, dso). */
struct pt_location {
	uint64_t ip;
	int64_t offset; /* -1: no symbol */
	uint32_t name;	/* symbol string id, 0: none */
	uint32_t dso;	/* dso string id, 0: no map */
	int32_t pid;
	int32_t node;	/* the innermost inlined body at ip (pt_image.h), 0: none */
};

struct pt_vec {
	void *p;
	size_t n, cap, size;
};

struct pt_line_range {
	uint64_t first, count;
};

struct pt_feed_thread;

struct pt_feed {
	struct pt_image *image;
	bool keep_all, to_end, insns;
	int32_t *only_pids, *only_tids;
	size_t nonly_pids, nonly_tids;
	/* output: columns of the rows, the events, new locations */
	struct pt_vec pid, tid, time, flags, src, dst, insn, cyc, gap_delta, gap_insns;
	struct pt_vec line_offsets, lines; /* int32 (n + 1), uint64 */
	struct pt_vec events, locations;
	/* state */
	struct pt_feed_thread *threads;
	size_t nthreads, capthreads;
	uint64_t *thread_keys;
	uint32_t *thread_slots;
	size_t thread_cap;
	long last_thread;
	uint64_t last_key;
	/* location cache: (address, space, side) -> id */
	struct pt_loc_slot *locs;
	size_t loc_cap, loc_count;
	uint32_t next_loc;
	int failed;
	/* the engine's limits (model.TIME_LIMIT, model.COUNT_BUDGET) and what is left of
	 * the budget (the sum of all counts) */
	uint64_t time_limit, count_max, count_budget;
	/* counters (the dlfilter's trailer) */
	uint64_t samples, kept, dropped, power, other, blocks_unknown;
};

int pt_feed_init(struct pt_feed *f, struct pt_image *image, bool keep_all, bool to_end,
		 bool insns);
void pt_feed_free(struct pt_feed *f);
void pt_feed_limits(struct pt_feed *f, uint64_t time_limit, uint64_t count_budget);
int pt_feed_select(struct pt_feed *f, const int32_t *pids, size_t npids, const int32_t *tids,
		   size_t ntids);

int pt_feed_branch(struct pt_feed *f, const struct pt_sample *s);
int pt_feed_power(struct pt_feed *f, int32_t pid, int32_t tid, int32_t cpu, uint64_t time,
		  uint32_t cbr, uint32_t khz);
int pt_feed_error(struct pt_feed *f, int code, int32_t cpu, int32_t pid, int32_t tid, uint64_t ip,
		  uint64_t time);
int pt_feed_comm(struct pt_feed *f, int32_t pid, int32_t tid, uint64_t time, uint32_t name,
		 bool exec);
/* The end of the trace: each thread's trailing dropped jump (to_end). */
int pt_feed_finish(struct pt_feed *f);

/* Rows written since the last pt_feed_clear(). */
static inline size_t pt_feed_rows(const struct pt_feed *f)
{
	return f->pid.n;
}
void pt_feed_clear(struct pt_feed *f);

#endif
