/* The own decoder's session: see pt_session.h. Each function names the perf function whose
 * rules it follows (tools/perf/util/intel-pt.c, auxtrace.c, machine.c, thread.c). */
#include "pt_session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KERNEL_START (UINT64_C(1) << 63) /* x86-64: perf's machine__kernel_start() */

/* PERF_IP_FLAG_* */
enum {
	IP_BRANCH = 1 << 0,
	IP_CALL = 1 << 1,
	IP_RETURN = 1 << 2,
	IP_CONDITIONAL = 1 << 3,
	IP_SYSCALLRET = 1 << 4,
	IP_ASYNC = 1 << 5,
	IP_INTERRUPT = 1 << 6,
	IP_TX_ABORT = 1 << 7,
	IP_TRACE_BEGIN = 1 << 8,
	IP_TRACE_END = 1 << 9,
	IP_IN_TX = 1 << 10,
	IP_VMENTRY = 1 << 11,
};

struct pt_queue {
	struct pt_dec dec;
	int32_t queue_tid, queue_cpu;
	int32_t pid, tid, cpu;
	long thread; /* index into the session's threads, -1: none */
	uint64_t timestamp;
	bool have_sample, on_heap;
	uint32_t flags;
	uint8_t insn_len;
	uint32_t cbr_seen;
	uint64_t last_br_insn, last_br_cyc, ipc_insn, ipc_cyc;
	bool sample_ipc;
	/* the walk since the last branch sample (for instruction detail) */
	uint64_t last_to, last_tot;
	uint32_t last_repositions; /* the decoder's at the last branch */
	bool straight;		   /* the walk went on from last_to since the last branch */
};

enum { P_NEXT_SB, P_QUEUES, P_RUN, P_DONE };

uint64_t pt_tsc_to_perf_time(const struct pt_session_config *c, uint64_t tsc)
{
	uint64_t quot = tsc >> c->time_shift;
	uint64_t rem = tsc & ((UINT64_C(1) << c->time_shift) - 1);
	return c->time_zero + quot * c->time_mult + ((rem * c->time_mult) >> c->time_shift);
}

uint64_t pt_perf_time_to_tsc(const struct pt_session_config *c, uint64_t ns)
{
	uint64_t t = ns - c->time_zero;
	if (!c->time_mult)
		return 0;
	uint64_t quot = t / c->time_mult, rem = t % c->time_mult;
	return (quot << c->time_shift) + (rem << c->time_shift) / c->time_mult;
}

static int fail(struct pt_session *s, int err, const char *what)
{
	s->error = err;
	snprintf(s->message, sizeof(s->message), "%s", what);
	return err;
}

int pt_session_init(struct pt_session *s, const struct pt_session_config *cfg,
		    struct pt_image *image, struct pt_feed *feed)
{
	memset(s, 0, sizeof(*s));
	s->cfg = *cfg;
	s->image = image;
	s->feed = feed;
	s->phase = P_NEXT_SB;
	return 0;
}

void pt_session_free(struct pt_session *s)
{
	for (size_t i = 0; i < s->nqueues; i++) {
		pt_dec_free(&s->queues[i]->dec);
		free(s->queues[i]);
	}
	free(s->queues);
	free(s->threads);
	free(s->tid_keys);
	free(s->tid_slots);
	free(s->current_tid);
	free(s->heap);
	memset(s, 0, sizeof(*s));
}

int pt_session_add_queue(struct pt_session *s, int32_t tid, int32_t cpu,
			 const struct pt_buffer *bufs, size_t nbufs)
{
	if (s->nqueues == s->capqueues) {
		size_t ncap = s->capqueues ? s->capqueues * 2 : 16;
		struct pt_queue **nq = realloc(s->queues, ncap * sizeof(*nq));
		if (!nq)
			return -ENOMEM;
		s->queues = nq;
		s->capqueues = ncap;
	}
	struct pt_queue *q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	pt_dec_init(&q->dec, &s->cfg.dec, bufs, nbufs, s->image);
	q->queue_tid = tid;
	q->queue_cpu = cpu;
	q->pid = -1;
	q->tid = tid;
	q->cpu = cpu;
	q->thread = -1;
	q->cbr_seen = UINT32_MAX;
	s->queues[s->nqueues++] = q;
	return 0;
}

void pt_session_set_sideband(struct pt_session *s, const struct pt_sb *sb, size_t n)
{
	s->sb = sb;
	s->nsb = n;
}

/* ------------------------------------------------------------------ threads */

static inline size_t tid_hash(int32_t tid)
{
	uint64_t x = (uint32_t)tid * UINT64_C(0x9e3779b97f4a7c15);
	return (size_t)(x >> 17);
}

static int tids_grow(struct pt_session *s)
{
	size_t ncap = s->tid_cap ? s->tid_cap * 2 : 256;
	int32_t *nk = calloc(ncap, sizeof(*nk));
	uint32_t *ns = calloc(ncap, sizeof(*ns));
	if (!nk || !ns) {
		free(nk);
		free(ns);
		return -ENOMEM;
	}
	for (size_t i = 0; i < s->tid_cap; i++) {
		if (!s->tid_slots[i])
			continue;
		size_t j = tid_hash(s->tid_keys[i]) & (ncap - 1);
		while (ns[j])
			j = (j + 1) & (ncap - 1);
		nk[j] = s->tid_keys[i];
		ns[j] = s->tid_slots[i];
	}
	free(s->tid_keys);
	free(s->tid_slots);
	s->tid_keys = nk;
	s->tid_slots = ns;
	s->tid_cap = ncap;
	return 0;
}

/* The slot of a tid in the table (its entry, or the empty slot where it goes). */
static size_t tid_slot(struct pt_session *s, int32_t tid)
{
	size_t j = tid_hash(tid) & (s->tid_cap - 1);
	while (s->tid_slots[j] && s->tid_keys[j] != tid)
		j = (j + 1) & (s->tid_cap - 1);
	return j;
}

/* machine__find_thread(machine, -1, tid): -1 if none. */
static long find_thread(struct pt_session *s, int32_t tid)
{
	if (!s->tid_cap)
		return -1;
	size_t j = tid_slot(s, tid);
	return s->tid_slots[j] ? (long)s->tid_slots[j] - 1 : -1;
}

static long new_thread(struct pt_session *s, int32_t pid, int32_t tid, long space)
{
	if ((s->nthreads + 1) * 2 > s->tid_cap && tids_grow(s) < 0)
		return -1;
	if (s->nthreads == s->capthreads) {
		size_t ncap = s->capthreads ? s->capthreads * 2 : 64;
		struct pt_thread *nt = realloc(s->threads, ncap * sizeof(*nt));
		if (!nt)
			return -1;
		s->threads = nt;
		s->capthreads = ncap;
	}
	long i = (long)s->nthreads++;
	s->threads[i] = (struct pt_thread){ pid, tid, space, -1 };
	size_t j = tid_slot(s, tid);
	s->tid_keys[j] = tid;
	s->tid_slots[j] = (uint32_t)i + 1;
	return i;
}

static long findnew_thread(struct pt_session *s, int32_t pid, int32_t tid);

/* The space a new thread gets (thread__init_maps): its own for a process's first thread,
 * else its process's. */
static long space_for(struct pt_session *s, int32_t pid, int32_t tid)
{
	if (pid == tid || pid == -1)
		return pt_image_new_space(s->image);
	long leader = findnew_thread(s, pid, pid);
	return leader < 0 ? -1 : s->threads[leader].space;
}

/* machine__findnew_thread(). */
static long findnew_thread(struct pt_session *s, int32_t pid, int32_t tid)
{
	long i = find_thread(s, tid);
	if (i >= 0) {
		struct pt_thread *th = &s->threads[i];
		if (th->pid == -1 && pid != -1 && pid != tid) {
			/* machine__update_thread_pid: now it joins its process's maps */
			long leader = findnew_thread(s, pid, pid);
			if (leader < 0)
				return -1;
			th = &s->threads[i];
			th->pid = pid;
			th->space = s->threads[leader].space;
		} else if (th->pid == -1 && pid != -1) {
			th->pid = pid;
		}
		return i;
	}
	long space = space_for(s, pid, tid);
	if (space < 0)
		return -1;
	return new_thread(s, pid, tid, space);
}

static int set_current_tid(struct pt_session *s, int32_t cpu, int32_t pid, int32_t tid)
{
	if (cpu < 0)
		return -EINVAL;
	if ((size_t)cpu >= s->ncpus) {
		size_t n = (size_t)cpu + 1;
		int32_t *nc = realloc(s->current_tid, n * sizeof(*nc));
		if (!nc)
			return -ENOMEM;
		for (size_t i = s->ncpus; i < n; i++)
			nc[i] = -1;
		s->current_tid = nc;
		s->ncpus = n;
	}
	s->current_tid[cpu] = tid;
	long th = findnew_thread(s, pid, tid);
	if (th < 0)
		return -ENOMEM;
	s->threads[th].cpu = cpu;
	return 0;
}

static int32_t current_tid(const struct pt_session *s, int32_t cpu)
{
	return cpu >= 0 && (size_t)cpu < s->ncpus ? s->current_tid[cpu] : -1;
}

/* ------------------------------------------------------------------- heap */

static void heap_place(struct pt_session *s, size_t pos, uint32_t q, uint64_t ordinal)
{
	while (pos) {
		size_t parent = (pos - 1) >> 1;
		if (s->heap[parent].ordinal <= ordinal)
			break;
		s->heap[pos] = s->heap[parent];
		pos = parent;
	}
	s->heap[pos].q = q;
	s->heap[pos].ordinal = ordinal;
}

static int heap_add(struct pt_session *s, uint32_t q, uint64_t ordinal)
{
	if (s->heap_n == s->heap_cap) {
		size_t ncap = s->heap_cap ? s->heap_cap * 2 : 32;
		void *nh = realloc(s->heap, ncap * sizeof(*s->heap));
		if (!nh)
			return -ENOMEM;
		s->heap = nh;
		s->heap_cap = ncap;
	}
	heap_place(s, s->heap_n++, q, ordinal);
	return 0;
}

/* auxtrace_heap__pop(): the hole left at the root moves down to a leaf, the smaller
 * child moving up (the right one when equal), then the last item fills it. */
static void heap_pop(struct pt_session *s)
{
	size_t n = s->heap_n;
	if (!n)
		return;
	s->heap_n--;
	size_t pos = 0;
	for (;;) {
		size_t left = (pos << 1) + 1;
		if (left >= n)
			break;
		size_t right = left + 1;
		if (right >= n) {
			s->heap[pos] = s->heap[left];
			return;
		}
		if (s->heap[left].ordinal < s->heap[right].ordinal) {
			s->heap[pos] = s->heap[left];
			pos = left;
		} else {
			s->heap[pos] = s->heap[right];
			pos = right;
		}
	}
	heap_place(s, pos, s->heap[n - 1].q, s->heap[n - 1].ordinal);
}

/* ------------------------------------------------------------------ samples */

/* intel_pt_insn_type(). */
static uint32_t op_flags(uint8_t op)
{
	switch (op) {
	case PT_OP_CALL: return IP_BRANCH | IP_CALL;
	case PT_OP_RET: return IP_BRANCH | IP_RETURN;
	case PT_OP_JCC: case PT_OP_LOOP: return IP_BRANCH | IP_CONDITIONAL;
	case PT_OP_JMP: return IP_BRANCH;
	case PT_OP_IRET: return IP_BRANCH | IP_RETURN | IP_INTERRUPT;
	case PT_OP_INT: return IP_BRANCH | IP_CALL | IP_INTERRUPT;
	case PT_OP_SYSCALL: return IP_BRANCH | IP_CALL | IP_SYSCALLRET;
	case PT_OP_SYSRET: return IP_BRANCH | IP_RETURN | IP_SYSCALLRET;
	case PT_OP_VMENTRY: return IP_BRANCH | IP_CALL | IP_VMENTRY;
	default: return 0;
	}
}

/* intel_pt_sample_flags(). */
static void sample_flags(struct pt_queue *q)
{
	const struct pt_state *st = &q->dec.state;
	q->insn_len = 0;
	if (st->flags & PT_SF_ABORT_TX) {
		q->flags = IP_BRANCH | IP_TX_ABORT;
	} else if (st->flags & PT_SF_ASYNC) {
		q->flags = st->to_ip ? IP_BRANCH | IP_CALL | IP_ASYNC | IP_INTERRUPT
				     : IP_BRANCH | IP_ASYNC | IP_TRACE_END;
	} else {
		q->flags = st->from_ip ? op_flags(st->insn_op) : IP_BRANCH | IP_TRACE_BEGIN;
		if (st->flags & PT_SF_IN_TX)
			q->flags |= IP_IN_TX;
		q->insn_len = st->insn_len;
	}
	if (st->type & PT_ST_TRACE_BEGIN)
		q->flags |= IP_TRACE_BEGIN;
	if (st->type & PT_ST_TRACE_END)
		q->flags |= IP_TRACE_END;
}

/* intel_pt_sample(): the samples of a queue's pending state, in perf's order (the PSB,
 * the CBR change, power events, then the branch). */
static int sample(struct pt_session *s, struct pt_queue *q)
{
	if (!q->have_sample)
		return 0;
	q->have_sample = false;
	const struct pt_state *st = &q->dec.state;
	q->ipc_insn = st->tot_insn_cnt;
	q->ipc_cyc = st->tot_cyc_cnt;
	q->sample_ipc = st->flags & PT_SF_SAMPLE_IPC;
	struct pt_feed *f = s->feed;
	uint64_t time = pt_tsc_to_perf_time(&s->cfg, q->timestamp);
	int err = 0;
	if (st->type & PT_ST_PSB_EVT) { /* a psb sample: the dlfilter counts it as other */
		f->samples++;
		f->other++;
	}
	if (st->cbr != q->cbr_seen) {
		q->cbr_seen = st->cbr;
		uint32_t cbr = (uint32_t)(st->cbr_payload & 0xff);
		err = pt_feed_power(f, q->pid, q->tid, q->cpu, time, cbr,
				    (uint32_t)(cbr * s->cfg.cbr2khz));
		if (err)
			return err;
	}
	if (!(st->type & PT_ST_BRANCH))
		return 0;
	struct pt_sample smp = {
		.pid = q->pid,
		.tid = q->tid,
		.cpu = q->cpu,
		.flags = q->flags,
		.time = time,
		.ip = st->from_ip,
		.addr = st->to_ip,
		.space = q->dec.space,
		.walk_from = q->straight && q->dec.repositions == q->last_repositions ? q->last_to : 0,
		.walked = st->tot_insn_cnt - q->last_tot,
		.ip_len = q->insn_len,
		.src_blk = st->src_blk && st->src_blk->branch_ip == st->from_ip ? st->src_blk : NULL,
	};
	uint64_t cyc = q->sample_ipc ? q->ipc_cyc - q->last_br_cyc : 0;
	if (cyc) {
		smp.cyc_cnt = cyc;
		smp.insn_cnt = q->ipc_insn - q->last_br_insn;
		q->last_br_insn = q->ipc_insn;
		q->last_br_cyc = q->ipc_cyc;
	}
	q->last_to = st->to_ip;
	q->last_tot = st->tot_insn_cnt;
	q->last_repositions = q->dec.repositions;
	q->straight = true;
	return pt_feed_branch(f, &smp);
}

static int synth_error(struct pt_session *s, struct pt_queue *q, const struct pt_state *st)
{
	q->straight = false;
	return pt_feed_error(s->feed, st->err, q->cpu, q->pid, q->tid, st->from_ip,
			     pt_tsc_to_perf_time(&s->cfg, q->timestamp));
}

/* ------------------------------------------------------------------ queues */

/* intel_pt_set_pid_tid_cpu(). */
static void set_pid_tid_cpu(struct pt_session *s, struct pt_queue *q)
{
	if (q->queue_tid == -1 || s->cfg.have_sched_switch) {
		q->tid = current_tid(s, q->cpu);
		if (q->tid == -1)
			q->pid = -1;
		q->thread = -1;
	}
	if (q->thread < 0 && q->tid != -1)
		q->thread = find_thread(s, q->tid);
	if (q->thread >= 0) {
		const struct pt_thread *th = &s->threads[q->thread];
		q->pid = th->pid;
		if (q->queue_cpu == -1)
			q->cpu = th->cpu;
		q->dec.space = th->space;
	} else {
		q->dec.space = -1;
	}
}

/* intel_pt_setup_queue(): decode to the first state with a timestamp (what comes before
 * is dropped, errors too), which becomes the queue's pending state. */
static int setup_queues(struct pt_session *s)
{
	s->set_up = true;
	for (size_t i = 0; i < s->nqueues; i++) {
		struct pt_queue *q = s->queues[i];
		if (!q->dec.nbufs)
			continue;
		const struct pt_state *st;
		for (;;) {
			st = pt_dec_next(&q->dec);
			if (st->err) {
				if (st->err == PT_ERR_NODATA)
					break;
				continue;
			}
			if (st->timestamp)
				break;
		}
		if (st->err)
			continue;
		q->timestamp = st->timestamp;
		q->have_sample = true;
		sample_flags(q);
		if (heap_add(s, (uint32_t)i, q->timestamp) < 0)
			return -ENOMEM;
		q->on_heap = true;
	}
	return 0;
}

/* intel_pt_run_decoder(): 0 at the limit (*limit: the queue's time), 1 at the end of its
 * trace, 2 paused (the feed has enough rows), negative on failure. */
static int run_decoder(struct pt_session *s, struct pt_queue *q, uint64_t *limit, size_t max_rows)
{
	for (;;) {
		if (pt_feed_rows(s->feed) >= max_rows)
			return 2;
		int err = sample(s, q);
		if (err)
			return err;
		const struct pt_state *st = pt_dec_next(&q->dec);
		if (st->err) {
			if (st->err == PT_ERR_NODATA)
				return 1;
			q->timestamp = st->est_timestamp;
			err = synth_error(s, q, st);
			if (err)
				return err;
			continue;
		}
		q->have_sample = true;
		sample_flags(q);
		if ((st->from_ip >= KERNEL_START || !st->from_ip) && st->to_ip &&
		    st->to_ip < KERNEL_START)
			q->timestamp = st->est_timestamp; /* control enters user space */
		else if (st->timestamp > q->timestamp)
			q->timestamp = st->timestamp;
		if (q->timestamp >= *limit) {
			*limit = q->timestamp;
			return 0;
		}
	}
}

/* ----------------------------------------------------------------- sideband */

/* machine__process_fork_event() with thread__fork(). */
static int process_fork(struct pt_session *s, const struct pt_sb *e)
{
	long parent = findnew_thread(s, e->ppid, e->ptid);
	if (parent < 0)
		return -ENOMEM;
	long old = find_thread(s, e->tid);
	if (old >= 0) { /* a thread of that tid is gone: a new one takes it */
		size_t j = tid_slot(s, e->tid);
		/* (removing it from the table; the entry stays for queues that hold it) */
		s->tid_slots[j] = 0;
		/* re-insert the others of the probe chain */
		size_t k = (j + 1) & (s->tid_cap - 1);
		while (s->tid_slots[k]) {
			int32_t key = s->tid_keys[k];
			uint32_t val = s->tid_slots[k];
			s->tid_slots[k] = 0;
			size_t at = tid_slot(s, key);
			s->tid_keys[at] = key;
			s->tid_slots[at] = val;
			k = (k + 1) & (s->tid_cap - 1);
		}
	}
	long th = findnew_thread(s, e->pid, e->tid);
	if (th < 0)
		return -ENOMEM;
	struct pt_thread *child = &s->threads[th];
	const struct pt_thread *par = &s->threads[parent];
	if (child->pid != par->pid && !(e->flags & PT_SB_FORK_EXEC) && par->space >= 0) {
		/* a new process: a copy of its parent's maps */
		long space = pt_image_clone_space(s->image, (size_t)par->space);
		if (space < 0)
			return -ENOMEM;
		s->threads[th].space = space;
	}
	return 0;
}

/* intel_pt_context_switch(). */
static int process_switch(struct pt_session *s, const struct pt_sb *e)
{
	bool out = e->flags & PT_SB_SWITCH_OUT;
	int32_t pid, tid;
	if (s->cfg.have_sched_switch == 3) {
		if (!out) {
			if (current_tid(s, e->cpu) == e->sample_tid)
				return 0;
			return set_current_tid(s, e->cpu, e->sample_pid, e->sample_tid);
		}
		if (e->kind != PT_SB_SWITCH_CPU_WIDE)
			return 0;
		pid = e->ppid;
		tid = e->ptid;
	} else {
		if (out)
			return 0;
		pid = e->sample_pid;
		tid = e->sample_tid;
	}
	return set_current_tid(s, e->cpu, pid, tid);
}

/* The record's effect, once the queues have been decoded up to it: the samples after it
 * see it (perf_session__deliver_event: auxtrace__process_event, then the machine's). */
static int apply(struct pt_session *s, const struct pt_sb *e)
{
	switch (e->kind) {
	case PT_SB_MMAP: {
		if (e->file == PT_NO_FILE)
			return 0;
		long th = findnew_thread(s, e->pid, e->tid);
		if (th < 0 || s->threads[th].space < 0)
			return -ENOMEM;
		return pt_image_map(s->image, (size_t)s->threads[th].space, e->start, e->len,
				    e->pgoff, e->file);
	}
	case PT_SB_COMM: {
		if (findnew_thread(s, e->pid, e->tid) < 0)
			return -ENOMEM;
		uint64_t t = e->time == UINT64_MAX ? 0 : e->time;
		return pt_feed_comm(s->feed, e->pid, e->tid, t, e->name,
				    e->flags & PT_SB_COMM_EXEC);
	}
	case PT_SB_FORK:
		return process_fork(s, e);
	case PT_SB_ITRACE_START:
		if (s->cfg.per_cpu)
			return set_current_tid(s, e->cpu, e->pid, e->tid);
		return 0;
	case PT_SB_AUX:
		if (e->aux_flags & PT_AUX_TRUNCATED) /* intel_pt_lost(): its time as is */
			return pt_feed_error(s->feed, PT_ERR_LOST, e->cpu, e->sample_pid,
					     e->sample_tid, 0, e->time);
		return 0;
	case PT_SB_SWITCH:
	case PT_SB_SWITCH_CPU_WIDE:
		if (s->cfg.have_sched_switch)
			return process_switch(s, e);
		return 0;
	default:
		return 0;
	}
}

static inline bool timed(uint64_t t)
{
	return t && t != UINT64_MAX;
}

int pt_session_run(struct pt_session *s, size_t max_rows)
{
	int r;
	for (;;) {
		if (s->error)
			return s->error;
		switch (s->phase) {
		case P_NEXT_SB:
			if (pt_feed_rows(s->feed) >= max_rows)
				return 0;
			if (s->next_sb >= s->nsb) {
				if (!s->flushed) {
					/* intel_pt_flush(): everything left, in heap order */
					if (!s->set_up && setup_queues(s) < 0)
						return fail(s, -ENOMEM, "out of memory");
					s->flushed = true;
					s->target = UINT64_MAX;
					s->phase = P_QUEUES;
					continue;
				}
				if (pt_feed_finish(s->feed) < 0)
					return fail(s, -ENOMEM, "out of memory");
				s->phase = P_DONE;
				return 1;
			}
			{
				const struct pt_sb *e = &s->sb[s->next_sb];
				if (timed(e->time)) {
					if (!s->set_up && setup_queues(s) < 0)
						return fail(s, -ENOMEM, "out of memory");
					uint64_t t = pt_perf_time_to_tsc(&s->cfg, e->time);
					if (t) {
						s->target = t;
						s->phase = P_QUEUES;
						continue;
					}
				}
				s->next_sb++;
				if (apply(s, e) < 0)
					return fail(s, -ENOMEM, "out of memory");
			}
			continue;
		case P_QUEUES:
			if (!s->heap_n || s->heap[0].ordinal >= s->target) {
				s->phase = P_NEXT_SB;
				if (!s->flushed || s->next_sb < s->nsb) {
					const struct pt_sb *e = &s->sb[s->next_sb++];
					if (apply(s, e) < 0)
						return fail(s, -ENOMEM, "out of memory");
				}
				continue;
			}
			{
				uint32_t qi = s->heap[0].q;
				heap_pop(s);
				uint64_t ts = s->target;
				if (s->heap_n && s->heap[0].ordinal + 1 < ts)
					ts = s->heap[0].ordinal + 1;
				s->running = qi;
				s->limit = ts;
				set_pid_tid_cpu(s, s->queues[qi]);
				s->phase = P_RUN;
			}
			continue;
		case P_RUN: {
			struct pt_queue *q = s->queues[s->running];
			r = run_decoder(s, q, &s->limit, max_rows);
			if (r == 2)
				return 0;
			if (r < 0)
				return fail(s, r, "out of memory");
			if (r == 0) {
				if (heap_add(s, s->running, s->limit) < 0)
					return fail(s, -ENOMEM, "out of memory");
			} else {
				q->on_heap = false;
			}
			s->phase = P_QUEUES;
			continue;
		}
		default:
			return 1;
		}
	}
}
