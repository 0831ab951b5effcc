/* The own decoder's session (pt_session.c): every AUX queue of a perf.data decoded in
 * the order perf decodes them, with the sideband applied between, each state turned into
 * the samples perf would synthesize for `--itrace=bep` and handed to the feed.
 *
 * perf's rules (tools/perf/util/intel-pt.c, docs/architecture.md "The own decoder"):
 * before a sideband record at time T is applied, every queue is decoded up to T, the
 * queue with the earliest timestamp first (a binary heap, ties as perf breaks them); a
 * queue's first states up to its first timestamp are dropped; each state's samples come
 * out just before the next state is decoded, with a time that follows perf's (the
 * estimated time where control enters user space, never going back otherwise); a
 * queue's pid and tid are the thread's (per-thread traces) or the CPU's current one
 * (per-CPU traces, from context-switch records).
 */
#ifndef PTSCOPE_PT_SESSION_H
#define PTSCOPE_PT_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pt_decoder.h"
#include "pt_feed.h"
#include "pt_image.h"

/* Sideband records, as the binding hands them over (in perf's processing order). */
enum {
	PT_SB_MMAP,
	PT_SB_COMM,
	PT_SB_FORK,
	PT_SB_EXIT,
	PT_SB_ITRACE_START,
	PT_SB_AUX,
	PT_SB_SWITCH,
	PT_SB_SWITCH_CPU_WIDE,
	PT_SB_LOST,
};

#define PT_SB_COMM_EXEC 1u	 /* COMM: at exec */
#define PT_SB_SWITCH_OUT 2u	 /* SWITCH: the task leaves the CPU */
#define PT_SB_FORK_EXEC 4u	 /* FORK: synthesized by perf (no copy of the maps) */
#define PT_AUX_TRUNCATED 1u

struct pt_sb {
	uint64_t time; /* perf ns; 0 or ~0: none */
	uint32_t kind, flags;
	int32_t pid, tid;		  /* the record's own (MMAP, COMM, FORK, EXIT, ITRACE_START) */
	int32_t ppid, ptid;		  /* FORK/EXIT; SWITCH_CPU_WIDE: next_prev pid/tid */
	int32_t sample_pid, sample_tid; /* its sample id trailer's */
	int32_t cpu;
	uint64_t start, len, pgoff; /* MMAP */
	uint32_t file;		    /* MMAP: the file (PT_NO_FILE: none) */
	uint32_t name;		    /* COMM: string id */
	uint64_t aux_flags;	    /* AUX */
};

struct pt_session_config {
	uint64_t time_shift, time_mult, time_zero;
	bool per_cpu;
	int have_sched_switch; /* 0, 1 (tracepoint), 2 (SWITCH), 3 (SWITCH_CPU_WIDE) */
	uint32_t max_non_turbo_ratio;
	uint64_t cbr2khz;
	struct pt_dec_config dec;
};

struct pt_thread {
	int32_t pid, tid;
	long space;
	int32_t cpu;
};

struct pt_queue;

struct pt_session {
	struct pt_session_config cfg;
	struct pt_image *image;
	struct pt_feed *feed;
	struct pt_queue **queues;
	size_t nqueues, capqueues;
	const struct pt_sb *sb;
	size_t nsb;
	/* machine threads (never freed: a queue may hold one that a FORK replaced) */
	struct pt_thread *threads;
	size_t nthreads, capthreads;
	int32_t *tid_keys;
	uint32_t *tid_slots; /* thread index + 1 */
	size_t tid_cap;
	int32_t *current_tid; /* per CPU */
	size_t ncpus;
	/* the heap of queues by timestamp */
	struct { uint32_t q; uint64_t ordinal; } *heap;
	size_t heap_n, heap_cap;
	/* where the run stands */
	size_t next_sb;
	int phase;
	uint64_t target; /* the TSC the queues are decoded up to */
	uint32_t running;
	uint64_t limit;
	bool set_up, flushed, finished;
	int error;
	char message[160];
};

int pt_session_init(struct pt_session *s, const struct pt_session_config *cfg,
		    struct pt_image *image, struct pt_feed *feed);
void pt_session_free(struct pt_session *s);
/* A queue (idx order) and its buffers (kept by the caller while the session lives). */
int pt_session_add_queue(struct pt_session *s, int32_t tid, int32_t cpu,
			 const struct pt_buffer *bufs, size_t nbufs);
void pt_session_set_sideband(struct pt_session *s, const struct pt_sb *sb, size_t n);

/* Decode until the feed holds max_rows rows (or more) or the end: 0 paused, 1 done,
 * negative on failure (message set). */
int pt_session_run(struct pt_session *s, size_t max_rows);

uint64_t pt_tsc_to_perf_time(const struct pt_session_config *c, uint64_t tsc);
uint64_t pt_perf_time_to_tsc(const struct pt_session_config *c, uint64_t ns);

#endif
