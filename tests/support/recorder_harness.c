/* The recorder plugin's pure parts, callable from Python (ctypes) for unit tests:
   the branch classifier (x86_branch.c) and the PT packet writer (pt_writer.h). */
#include "pt_writer.h"
#include "x86_branch.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT void harness_classify(const uint8_t *code, size_t len, uint64_t pc,
			     struct branch_info *out)
{
	x86_classify(code, len, pc, out);
}

EXPORT size_t harness_writer_size(void) { return sizeof(struct pt_writer); }

EXPORT void harness_writer_init(struct pt_writer *w, uint8_t *buf, size_t cap,
				uint64_t psb_period, uint32_t cyc_threshold)
{
	memset(w, 0, sizeof *w);
	w->buf = buf;
	w->cap = cap;
	w->start_tsc = 2000000000ULL;
	w->psb_period = psb_period;
	w->next_psb = psb_period;
	w->cyc_threshold = cyc_threshold;
	w->ratio = 20;
}

enum { OP_ADVANCE, OP_START, OP_COND, OP_PUSH, OP_RET, OP_INDIRECT, OP_DISABLE, OP_INTERRUPT,
       OP_MAYBE_PSB, OP_TAIL, OP_FLUSH };

/* One writer call; returns the bytes written so far. */
EXPORT size_t harness_writer_op(struct pt_writer *w, int op, uint64_t arg)
{
	switch (op) {
	case OP_ADVANCE: w->now += arg; break;
	case OP_START: pt_start(w, arg); break;
	case OP_COND: pt_cond(w, (int)arg); break;
	case OP_PUSH: pt_push(w, arg); break;
	case OP_RET: pt_ret(w, arg); break;
	case OP_INDIRECT: pt_indirect(w, arg); break;
	case OP_DISABLE: pt_disable(w); break;
	case OP_INTERRUPT: pt_interrupt(w, arg); break;
	case OP_MAYBE_PSB: pt_maybe_psb(w, arg); break;
	case OP_TAIL: pt_tail(w, arg); break;
	case OP_FLUSH: pt_flush_tnt(w); break;
	}
	return w->pos;
}

/* The return-stack entry a ret would compare with (0 when empty). */
EXPORT uint64_t harness_writer_top(const struct pt_writer *w)
{
	return w->stack_n ? w->stack[w->stack_top] : 0;
}
