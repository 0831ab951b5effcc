/* The own decoder's flow layer: see pt_decoder.h.
 *
 * The state machine is perf 6.1's (tools/perf/util/intel-pt-decoder), rule for rule, so
 * that a trace decodes to the same states; the functions here are named after what they
 * do in it (walk_trace, walk_tnt, walk_tip, walk_fup, fup_tip, psb ...) and the comments
 * say which rule each bit is. Internal results are negative codes (R_*), turned into
 * perf's error numbers at the end of pt_dec_next(). */
#define _GNU_SOURCE /* memmem */
#include "pt_decoder.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pt_image.h"
#include "pt_insn.h"

/* Internal results. R_TAKEN: a branch was resolved and is the state to hand out. */
enum {
	R_OK = 0,
	R_TAKEN = 1,
	R_AGAIN = -1,	 /* go on (the packet or the target was reached without a state) */
	R_RESTART = -2,	 /* start over silently (a new buffer, code known unreadable) */
	R_NODATA = -3,	 /* the trace has ended */
	R_BADPKT = -4,	 /* bad packet */
	R_NOINSN = -5,	 /* the code cannot be read or decoded */
	R_MISMATCH = -6, /* the trace does not match the code */
	R_OVERFLOW = -7, /* OVF */
	R_LOOP = -8,	 /* never-ending loop */
	R_INTERNAL = -9, /* a packet where none can be */
	R_NOMEM = -10,
};

/* Packet states (perf's pkt_state). */
enum {
	S_NO_PSB,
	S_NO_IP,
	S_ERR_RESYNC,
	S_IN_SYNC,
	S_TNT_CONT,
	S_TNT,
	S_TIP,
	S_TIP_PGD,
	S_FUP,
	S_FUP_NO_TIP,
	S_FUP_IN_PSB,
};

/* States after which the sample time moves to the current time (perf's
 * intel_pt_sample_time()): where no packet is half used. */
static inline bool sample_time_state(int s)
{
	return !(s == S_TNT || s == S_TIP || s == S_TIP_PGD || s == S_FUP || s == S_FUP_NO_TIP ||
		 s == S_FUP_IN_PSB);
}

#define PT_MAX_LOOPS 100000
#define PT_MAX_EVDS 64
#define BIT63 (UINT64_C(1) << 63)
#define CYC_ENABLE 0x2
#define CYC_THRESHOLD_MASK 0x780000
#define CYC_THRESHOLD_SHIFT 19

static const char *const error_messages[PT_ERR_MAX] = {
	[0] = "",
	[PT_ERR_NOMEM] = "Memory allocation failed",
	[PT_ERR_INTERN] = "Internal error",
	[PT_ERR_BADPKT] = "Bad packet",
	[PT_ERR_NODATA] = "No more data",
	[PT_ERR_NOINSN] = "Failed to get instruction",
	[PT_ERR_MISMAT] = "Trace doesn't match instruction",
	[PT_ERR_OVR] = "Overflow packet",
	[PT_ERR_LOST] = "Lost trace data",
	[PT_ERR_UNK] = "Unknown error!",
	[PT_ERR_NELOOP] = "Never-ending loop (refer perf config intel-pt.max-loops)",
	[PT_ERR_EPTW] = "Broken emulated ptwrite",
};

const char *pt_error_message(int code)
{
	if (code < 1 || code >= PT_ERR_MAX)
		code = PT_ERR_UNK;
	return error_messages[code];
}

static int error_code(int r)
{
	switch (r) {
	case R_NOMEM: return PT_ERR_NOMEM;
	case R_INTERNAL: return PT_ERR_INTERN;
	case R_BADPKT: return PT_ERR_BADPKT;
	case R_NODATA: return PT_ERR_NODATA;
	case R_NOINSN: return PT_ERR_NOINSN;
	case R_MISMATCH: return PT_ERR_MISMAT;
	case R_OVERFLOW: return PT_ERR_OVR;
	case R_LOOP: return PT_ERR_NELOOP;
	default: return PT_ERR_UNK;
	}
}

/* ------------------------------------------------------------------ set up */

int pt_dec_init(struct pt_dec *d, const struct pt_dec_config *cfg, const struct pt_buffer *bufs,
		size_t nbufs, struct pt_image *image)
{
	memset(d, 0, sizeof(*d));
	d->cfg = *cfg;
	if (!d->cfg.max_loops)
		d->cfg.max_loops = PT_MAX_LOOPS;
	d->bufs = bufs;
	d->nbufs = nbufs;
	d->image = image;
	d->space = -1;
	d->pkt_state = S_NO_PSB;
	d->last_packet_type = PT_PKT_BAD;
	d->max_non_turbo_ratio_fp = cfg->max_non_turbo_ratio;
	d->cyc_threshold = cfg->ctl & CYC_ENABLE
				   ? (cfg->ctl & CYC_THRESHOLD_MASK) >> CYC_THRESHOLD_SHIFT
				   : 0;
	d->ctc_rem_mask = (1u << cfg->mtc_period) - 1;
	if (!cfg->tsc_ctc_ratio_n)
		d->cfg.tsc_ctc_ratio_d = 0;
	if (d->cfg.tsc_ctc_ratio_d && !(cfg->tsc_ctc_ratio_n % d->cfg.tsc_ctc_ratio_d))
		d->tsc_ctc_mult = cfg->tsc_ctc_ratio_n / d->cfg.tsc_ctc_ratio_d;
	/* a TSC packet can slip past MTCs: a small step back is not a new time */
	d->tsc_slip = 0x10000;
	return 0;
}

void pt_dec_free(struct pt_dec *d)
{
	free(d->stack.addr);
	free(d->stack.slot);
	memset(&d->stack, 0, sizeof(d->stack));
}

/* ------------------------------------------------------------ return stack */

static int push(struct pt_dec *d, uint64_t addr, struct pt_block **slot)
{
	struct pt_stack *s = &d->stack;
	if (s->n == s->cap) {
		size_t ncap = s->cap ? s->cap * 2 : 64;
		uint64_t *na = realloc(s->addr, ncap * sizeof(*na));
		if (!na)
			return R_NOMEM;
		s->addr = na;
		struct pt_block ***ns = realloc(s->slot, ncap * sizeof(*ns));
		if (!ns)
			return R_NOMEM;
		s->slot = ns;
		s->cap = ncap;
	}
	s->addr[s->n] = addr;
	s->slot[s->n] = slot;
	s->n++;
	return R_OK;
}

static inline void pop(struct pt_dec *d)
{
	struct pt_stack *s = &d->stack;
	if (!s->n) {
		d->ret_addr = 0;
		d->ret_slot = NULL;
		return;
	}
	s->n--;
	d->ret_addr = s->addr[s->n];
	d->ret_slot = s->slot[s->n];
}

static inline void clear_stack(struct pt_dec *d)
{
	d->stack.n = 0;
}

/* --------------------------------------------------------------- packets */

static inline uint64_t packet_ip(const struct pt_dec *d)
{
	return pt_packet_ip(&d->pkt, d->last_ip);
}

static inline void set_last_ip(struct pt_dec *d)
{
	uint64_t ip;
	switch (d->pkt.count) {
	case 1: case 2: case 3: case 4: case 6:
		ip = packet_ip(d);
		break;
	default:
		ip = 0;
	}
	d->last_ip = ip;
	d->have_last_ip = true;
}

static inline void set_ip(struct pt_dec *d)
{
	set_last_ip(d);
	d->ip = d->last_ip;
	d->blk = NULL;
}

/* An IP packet whose IP can be known (perf's intel_pt_have_ip()). */
static inline bool have_ip(const struct pt_dec *d)
{
	return d->pkt.count && (d->have_last_ip || d->pkt.count == 3 || d->pkt.count == 6);
}

static int bad_packet(struct pt_dec *d)
{
	d->tx_flags = 0;
	d->have_tma = false;
	d->pkt_step = 1;
	if (d->pkt_state != S_NO_PSB)
		;	/* the state stays as it is (non-strict decoding) */
	return R_BADPKT;
}

static void reposition(struct pt_dec *d)
{
	d->repositions++;
	d->ip = 0;
	d->blk = NULL;
	d->pkt_state = S_NO_PSB;
	d->timestamp = 0;
	d->have_tma = false;
}

/* With release_input, the whole pages of trace between kept_from and `upto` go back to
 * the kernel: the decoder never reads behind itself, and the pages of a file mapping are
 * read again from the page cache if another queue's buffer shares one. A decode's
 * memory then stays flat however large the recording (its pages would otherwise count
 * in the process's RSS as they are read). */
#define RELEASE_STEP ((size_t)8 << 20)
#define PAGE_BYTES ((uintptr_t)4096) /* x86-64's (a larger page: madvise refuses, no harm) */

static void release_behind(struct pt_dec *d, const uint8_t *upto)
{
	uintptr_t mask = PAGE_BYTES - 1;
	uintptr_t lo = ((uintptr_t)d->kept_from + mask) & ~mask;
	uintptr_t hi = (uintptr_t)upto & ~mask;
	if (d->kept_from && hi > lo)
		madvise((void *)lo, hi - lo, MADV_DONTNEED);
	d->kept_from = upto;
}

/* The next buffer: R_OK, R_RESTART for one that does not continue the last, R_NODATA. */
static int next_data(struct pt_dec *d)
{
	if (d->cfg.release_input && d->buf)
		release_behind(d, d->buf);
	d->pkt_step = 0;
	while (d->next_buf < d->nbufs && !d->bufs[d->next_buf].size)
		d->next_buf++;
	if (d->next_buf >= d->nbufs) {
		d->buf = NULL;
		d->len = 0;
		return R_NODATA;
	}
	const struct pt_buffer *b = &d->bufs[d->next_buf++];
	d->buf = b->data;
	d->len = b->size;
	d->kept_from = b->data;
	d->buf_timestamp = b->ref_timestamp;
	if (!b->consecutive) {
		reposition(d);
		d->ref_timestamp = b->ref_timestamp;
		return R_RESTART;
	}
	return R_OK;
}

/* Step past the current packet to the next one that is not PAD. */
static int next_packet(struct pt_dec *d)
{
	d->last_packet_type = d->pkt.type;
	for (;;) {
		d->pos += d->pkt_step;
		d->buf += d->pkt_step;
		d->len -= d->pkt_step;
		if (!d->len) {
			int r = next_data(d);
			if (r)
				return r;
		} else if (d->cfg.release_input && (size_t)(d->buf - d->kept_from) >= RELEASE_STEP) {
			release_behind(d, d->buf);
		}
		size_t n = pt_packet_next(d->buf, d->len, &d->ctx, &d->pkt);
		if (n == PT_NEED_MORE || d->pkt.type == PT_PKT_BAD) {
			/* (a packet cut by the end of a buffer is a bad one: perf joins pieces only
			 * on 32-bit hosts) */
			d->pkt.type = PT_PKT_BAD;
			return bad_packet(d);
		}
		pt_packet_update_ctx(&d->ctx, &d->pkt);
		d->pkt_step = n;
		if (d->pkt.type != PT_PKT_PAD)
			return R_OK;
	}
}

/* Look at the packets after the current one in the current buffer, without taking them:
 * cb returns nonzero to stop. `prev` is the type of the packet before each one. */
typedef int (*lookahead_fn)(struct pt_dec *d, const struct pt_packet *pkt, int prev, void *data);

static void lookahead(struct pt_dec *d, lookahead_fn cb, void *data)
{
	const uint8_t *buf = d->buf;
	size_t len = d->len, step = d->pkt_step;
	struct pt_packet_ctx ctx = d->ctx;
	int prev = d->last_packet_type;
	for (;;) {
		struct pt_packet pkt;
		do {
			buf += step;
			len -= step;
			if (!len)
				return;
			size_t n = pt_packet_next(buf, len, &ctx, &pkt);
			if (n == PT_NEED_MORE || pkt.type == PT_PKT_BAD)
				return;
			pt_packet_update_ctx(&ctx, &pkt);
			step = n;
		} while (pkt.type == PT_PKT_PAD);
		if (cb(d, &pkt, prev, data))
			return;
		prev = pkt.type;
	}
}

/* ------------------------------------------------------------------ timing */

static uint64_t multdiv(uint64_t t, uint32_t n, uint32_t dd)
{
	if (!dd)
		return 0;
	return (t / dd) * n + ((t % dd) * n) / dd;
}

static inline uint64_t ctc_to_tsc(const struct pt_dec *d, uint64_t ctc)
{
	if (d->tsc_ctc_mult)
		return ctc * d->tsc_ctc_mult;
	return multdiv(ctc, d->cfg.tsc_ctc_ratio_n, d->cfg.tsc_ctc_ratio_d);
}

static inline void update_sample_time(struct pt_dec *d)
{
	d->sample_timestamp = d->timestamp;
	d->sample_insn_cnt = d->timestamp_insn_cnt;
}

/* The TMA's low CTC bits lack MTC bits when MTCs are rarer than 2^8 CTC ticks: take
 * them from the first MTC, the closest value before it. */
static void fixup_last_mtc(uint32_t mtc, int shift, uint32_t *last)
{
	uint32_t first_missing = 1u << (16 - shift);
	uint32_t mask = ~(first_missing - 1);
	*last |= mtc & mask;
	if (*last >= mtc) {
		*last -= first_missing;
		*last &= 0xff;
	}
}

/* The cycles-to-TSC ratio measured from the CYCs between two MTCs (perf's
 * intel_pt_calc_cyc_to_tsc: only after an MTC that follows a CYC). */
struct cyc_lookahead {
	uint64_t cycle_cnt;
	uint32_t cbr;
	uint32_t last_mtc;
	uint64_t ctc_timestamp, ctc_delta, tsc_timestamp, timestamp;
	bool have_tma, fixup_last_mtc;
	double cbr_cyc_to_tsc;
};

static int cyc_lookahead_cb(struct pt_dec *d, const struct pt_packet *pkt, int prev, void *data)
{
	struct cyc_lookahead *c = data;
	uint64_t t;
	switch (pkt->type) {
	case PT_PKT_TNT: case PT_PKT_TIP_PGE: case PT_PKT_TIP: case PT_PKT_FUP: case PT_PKT_PSB:
	case PT_PKT_PIP: case PT_PKT_MODE_EXEC: case PT_PKT_MODE_TSX: case PT_PKT_PSBEND:
	case PT_PKT_PAD: case PT_PKT_VMCS: case PT_PKT_MNT: case PT_PKT_PTWRITE: case PT_PKT_BBP:
	case PT_PKT_BIP: case PT_PKT_BEP: case PT_PKT_CFE: case PT_PKT_EVD:
		return 0;
	case PT_PKT_MTC: {
		if (!c->have_tma)
			return 0;
		uint32_t mtc = (uint32_t)pkt->payload;
		if (d->cfg.mtc_period > 8 && c->fixup_last_mtc) {
			c->fixup_last_mtc = false;
			fixup_last_mtc(mtc, d->cfg.mtc_period, &c->last_mtc);
		}
		uint32_t delta = mtc > c->last_mtc ? mtc - c->last_mtc : mtc + 256 - c->last_mtc;
		c->ctc_delta += (uint64_t)delta << d->cfg.mtc_period;
		c->last_mtc = mtc;
		t = c->ctc_timestamp + ctc_to_tsc(d, c->ctc_delta);
		if (t < c->timestamp)
			return 1;
		if (prev != PT_PKT_CYC) {
			c->timestamp = t;
			return 0;
		}
		break;
	}
	case PT_PKT_TSC:
	case PT_PKT_TMA:
		return 1; /* (the lookahead runs only from an MTC: TSC and TMA end it) */
	case PT_PKT_CYC:
		c->cycle_cnt += pkt->payload;
		return 0;
	case PT_PKT_CBR: {
		uint32_t cbr = (uint32_t)pkt->payload;
		if (c->cbr && c->cbr != cbr)
			return 1;
		c->cbr = cbr;
		c->cbr_cyc_to_tsc = d->max_non_turbo_ratio_fp / cbr;
		return 0;
	}
	default:
		return 1;
	}
	if (!c->cbr && d->cbr) {
		c->cbr = d->cbr;
		c->cbr_cyc_to_tsc = d->cbr_cyc_to_tsc;
	}
	if (!c->cycle_cnt)
		return 1;
	double ratio = (double)(t - d->timestamp) / c->cycle_cnt;
	if (c->cbr && ratio > c->cbr_cyc_to_tsc && ratio / c->cbr_cyc_to_tsc > 1.25)
		return 1; /* too far from what the CBR says */
	d->calc_cyc_to_tsc = ratio;
	d->have_calc_cyc_to_tsc = true;
	return 1;
}

static void calc_cyc_to_tsc(struct pt_dec *d)
{
	struct cyc_lookahead c = {
		.last_mtc = d->last_mtc,
		.ctc_timestamp = d->ctc_timestamp,
		.ctc_delta = d->ctc_delta,
		.tsc_timestamp = d->tsc_timestamp,
		.timestamp = d->timestamp,
		.have_tma = d->have_tma,
		.fixup_last_mtc = d->fixup_last_mtc,
	};
	lookahead(d, cyc_lookahead_cb, &c);
}

/* A TSC value's top byte, which the packet lacks, from a reference TSC. */
static uint64_t tsc_8b(uint64_t t, uint64_t ref)
{
	t |= ref & (UINT64_C(0xff) << 56);
	if (t < ref) {
		if (ref - t > (UINT64_C(1) << 55))
			t += UINT64_C(1) << 56;
	} else if (t - ref > (UINT64_C(1) << 55)) {
		t -= UINT64_C(1) << 56;
	}
	return t;
}

static void calc_tsc(struct pt_dec *d)
{
	d->have_tma = false;
	if (d->ref_timestamp) {
		uint64_t t = tsc_8b(d->pkt.payload, d->ref_timestamp);
		d->tsc_timestamp = d->timestamp = t;
		d->ref_timestamp = 0;
		d->timestamp_insn_cnt = 0;
	} else if (d->timestamp) {
		uint64_t t = d->pkt.payload | (d->timestamp & (UINT64_C(0xff) << 56));
		d->tsc_timestamp = t;
		if (t < d->timestamp && d->timestamp - t < d->tsc_slip)
			t = d->timestamp; /* a slip back: not a new time */
		if (t < d->timestamp) {
			if (!d->buf_timestamp || t + (UINT64_C(1) << 56) < d->buf_timestamp) {
				t += UINT64_C(1) << 56; /* the 56 bits wrapped around */
				d->tsc_timestamp = t;
			} else {
				t = d->timestamp; /* a bad TSC: ignored */
			}
		}
		d->timestamp = t;
		d->timestamp_insn_cnt = 0;
	}
	if (d->last_packet_type == PT_PKT_CYC) {
		/* CYCs count from the TSC that follows one */
		d->cyc_ref_timestamp = d->timestamp;
		d->cycle_cnt = 0;
		d->have_calc_cyc_to_tsc = false;
	}
}

/* Cycle counts estimated from the time, where the trace has no CYC. */
static inline void mtc_cyc_cnt_pge(struct pt_dec *d)
{
	if (d->have_cyc)
		return;
	d->cyc_cnt_timestamp = d->timestamp;
	d->base_cyc_cnt = d->tot_cyc_cnt;
}

static inline void mtc_cyc_cnt_upd(struct pt_dec *d)
{
	if (d->have_cyc)
		return;
	d->sample_cyc = true;
	if (!d->pge || d->timestamp <= d->cyc_cnt_timestamp)
		return;
	uint64_t delta = d->timestamp - d->cyc_cnt_timestamp;
	uint64_t tot = (uint64_t)(delta * d->tsc_to_cyc + d->base_cyc_cnt);
	if (tot > d->tot_cyc_cnt)
		d->tot_cyc_cnt = tot;
}

static void calc_tma(struct pt_dec *d)
{
	uint32_t ctc = (uint32_t)d->pkt.payload;
	uint32_t fc = d->pkt.count | (uint32_t)d->pkt.ip << 8;
	uint32_t ctc_rem = ctc & d->ctc_rem_mask;
	if (!d->cfg.tsc_ctc_ratio_d)
		return;
	if (d->pge && !d->in_psb)
		mtc_cyc_cnt_pge(d);
	else
		mtc_cyc_cnt_upd(d);
	d->last_mtc = (ctc >> d->cfg.mtc_period) & 0xff;
	d->last_ctc = ctc - ctc_rem;
	d->ctc_timestamp = d->tsc_timestamp - fc - ctc_to_tsc(d, ctc_rem);
	d->ctc_delta = 0;
	d->have_tma = true;
	d->fixup_last_mtc = true;
}

static void calc_mtc(struct pt_dec *d)
{
	if (!d->have_tma)
		return;
	uint32_t mtc = (uint32_t)d->pkt.payload;
	if (d->cfg.mtc_period > 8 && d->fixup_last_mtc) {
		d->fixup_last_mtc = false;
		fixup_last_mtc(mtc, d->cfg.mtc_period, &d->last_mtc);
	}
	/* equal values are a whole turn of the 8 bits */
	uint32_t delta = mtc > d->last_mtc ? mtc - d->last_mtc : mtc + 256 - d->last_mtc;
	d->ctc_delta += (uint64_t)delta << d->cfg.mtc_period;
	uint64_t t = d->ctc_timestamp + ctc_to_tsc(d, d->ctc_delta);
	if (t >= d->timestamp)
		d->timestamp = t;
	mtc_cyc_cnt_upd(d);
	d->timestamp_insn_cnt = 0;
	d->last_mtc = mtc;
	if (d->last_packet_type == PT_PKT_CYC) {
		d->cyc_ref_timestamp = d->timestamp;
		d->cycle_cnt = 0;
		d->have_calc_cyc_to_tsc = false;
		calc_cyc_to_tsc(d);
	}
}

static void calc_cbr(struct pt_dec *d)
{
	uint32_t cbr = (uint32_t)(d->pkt.payload & 0xff);
	d->cbr_payload = d->pkt.payload;
	if (d->cbr == cbr)
		return;
	d->cbr = cbr;
	d->cbr_cyc_to_tsc = d->max_non_turbo_ratio_fp / cbr;
	d->cyc_ref_timestamp = d->timestamp;
	d->cycle_cnt = 0;
	d->tsc_to_cyc = cbr / d->max_non_turbo_ratio_fp;
	if (d->pge)
		mtc_cyc_cnt_pge(d);
}

static void calc_cyc(struct pt_dec *d)
{
	uint64_t t = d->cyc_ref_timestamp;
	d->have_cyc = true;
	d->cycle_cnt += d->pkt.payload;
	if (d->pge)
		d->tot_cyc_cnt += d->pkt.payload;
	d->sample_cyc = true;
	if (!d->cyc_ref_timestamp)
		return;
	/* (in doubles, truncated: as perf computes it) */
	if (d->have_calc_cyc_to_tsc)
		t = (uint64_t)((double)t + d->cycle_cnt * d->calc_cyc_to_tsc);
	else if (d->cbr)
		t = (uint64_t)((double)t + d->cycle_cnt * d->cbr_cyc_to_tsc);
	else
		return;
	if (t >= d->timestamp)
		d->timestamp = t;
	d->timestamp_insn_cnt = 0;
}

/* -------------------------------------------------------------- mode, FUPs */

static void mode_exec_status(struct pt_dec *d)
{
	bool iflag = d->pkt.count & 1;
	d->exec_mode = (int)d->pkt.payload;
	d->iflag = d->next_iflag = iflag;
}

static void mode_exec(struct pt_dec *d)
{
	d->exec_mode = (int)d->pkt.payload;
	d->next_iflag = d->pkt.count & 1;
}

static inline void sample_iflag_chg(struct pt_dec *d)
{
	if (d->iflag != d->next_iflag) {
		d->state.type |= PT_ST_IFLAG_CHG;
		d->iflag = d->next_iflag;
	}
}

static void clear_fup_event(struct pt_dec *d)
{
	d->set_fup_tx_flags = d->set_fup_ptw = d->set_fup_mwait = d->set_fup_pwre = false;
	d->set_fup_exstop = d->set_fup_bep = d->set_fup_cfe_ip = d->set_fup_cfe = false;
	d->set_fup_mode_exec = false;
	d->evd_cnt = 0;
	d->iflag = d->next_iflag;
}

/* What a FUP stands for when packets before it said (perf's intel_pt_fup_event()):
 * returns whether it is a state of its own. */
static bool fup_event(struct pt_dec *d, bool no_tip)
{
	(void)no_tip;
	uint32_t type = d->state.type;
	bool ret = false;
	d->state.type &= ~(uint32_t)PT_ST_BRANCH;
	d->state.insn_op = PT_OP_OTHER;
	d->state.insn_len = 0;
	if (d->set_fup_cfe_ip || d->set_fup_cfe) {
		bool ip = d->set_fup_cfe_ip;
		d->set_fup_cfe_ip = d->set_fup_cfe = false;
		d->state.type |= PT_ST_EVT;
		if (!ip && d->pge)
			d->state.type |= PT_ST_BRANCH;
		d->evd_cnt = 0;
		if (ip || d->pge)
			d->state.flags |= PT_SF_FUP_IP;
		ret = true;
	}
	if (d->set_fup_mode_exec) {
		d->set_fup_mode_exec = false;
		d->state.type |= PT_ST_IFLAG_CHG;
		d->iflag = d->next_iflag;
		ret = true;
	}
	if (d->set_fup_tx_flags) {
		d->set_fup_tx_flags = false;
		d->tx_flags = d->fup_tx_flags;
		d->state.type |= PT_ST_TRANSACTION;
		if (d->fup_tx_flags & PT_SF_ABORT_TX)
			d->state.type |= PT_ST_BRANCH;
		d->state.flags = d->fup_tx_flags;
		ret = true;
	}
	if (d->set_fup_ptw) {
		d->set_fup_ptw = false;
		d->state.type |= PT_ST_PTW;
		d->state.flags |= PT_SF_FUP_IP;
		ret = true;
	}
	if (d->set_fup_mwait) {
		d->set_fup_mwait = false;
		d->state.type |= PT_ST_MWAIT_OP;
		ret = true;
	}
	if (d->set_fup_pwre) {
		d->set_fup_pwre = false;
		d->state.type |= PT_ST_PWR_ENTRY;
		ret = true;
	}
	if (d->set_fup_exstop) {
		d->set_fup_exstop = false;
		d->state.type |= PT_ST_EX_STOP;
		d->state.flags |= PT_SF_FUP_IP;
		ret = true;
	}
	if (d->set_fup_bep) {
		d->set_fup_bep = false;
		d->state.type |= PT_ST_BLK_ITEMS;
		ret = true;
	}
	if (d->overflow) {
		d->overflow = false;
		if (!ret && !d->pge) {
			/* the first FUP after an overflow: tracing goes on from here */
			d->pge = true;
			d->state.type |= PT_ST_BRANCH | PT_ST_TRACE_BEGIN;
			d->state.from_ip = 0;
			d->state.to_ip = d->ip;
			return true;
		}
	}
	if (ret) {
		d->state.from_ip = d->ip;
		d->state.to_ip = 0;
	} else {
		d->state.type = type;
	}
	return ret;
}

static int overflow(struct pt_dec *d)
{
	d->tx_flags = 0;
	d->timestamp_insn_cnt = 0;
	d->pkt_state = S_IN_SYNC;
	d->state.from_ip = d->ip; /* the error's ip: where decoding was */
	d->ip = 0;
	d->blk = NULL;
	d->pge = false;
	clear_fup_event(d);
	d->overflow = true;
	return R_OVERFLOW;
}

/* -------------------------------------------------------------- the walk */

/* The branch a walk stopped at. */
struct walked {
	uint8_t kind, op, len;
	bool zero_call;
	int32_t rel;
	struct pt_block *blk; /* the block walked (NULL for a walk to an address) */
};

/* perf's branch classes. */
static inline bool is_conditional(uint8_t kind)
{
	return kind == PT_INSN_JCC;
}

static inline bool is_unconditional(uint8_t kind)
{
	return kind == PT_INSN_JMP || kind == PT_INSN_CALL;
}

/* The code at ip fails to walk: perf's answer, counting a file's failures. */
static int walk_failed(struct pt_dec *d, uint8_t status, uint32_t file, uint64_t at)
{
	d->no_progress = 0;
	d->pkt_state = S_NO_IP;
	if (status == PT_BLOCK_NO_DATA) {
		struct pt_file *f = &d->image->files[file];
		/* perf reports a file it cannot read twice, then resyncs silently */
		if (f->failures >= 2) {
			d->ip = at;
			d->blk = NULL;
			return R_RESTART;
		}
		f->failures++;
	}
	d->ip = at;
	d->blk = NULL;
	return R_NOINSN;
}

/* The instruction ahead: walk from ip to the next branch (or to to_ip when it comes
 * first, when given), as perf's intel_pt_walk_insn() does, through the block cache. */
static int walk_insn(struct pt_dec *d, struct walked *w, uint64_t to_ip)
{
	long space = d->space;
	uint32_t n;
	uint8_t kind;
	if (space < 0) {
		/* no thread for the queue: perf's walk fails ("no thread") */
		d->no_progress = 0;
		d->pkt_state = S_NO_IP;
		return R_NOINSN;
	}
	if (!to_ip) {
		struct pt_block *b = d->blk;
		if (!b || b->start != d->ip || b->epoch != d->image->spaces[space]->epoch) {
			b = pt_block_at(d->image, (size_t)space, d->ip);
			if (!b)
				return R_NOMEM;
			if (d->patch)
				*d->patch = b;
		}
		d->patch = NULL;
		if (b->status != PT_BLOCK_OK)
			return walk_failed(d, b->status, b->file, b->branch_ip);
		n = b->ninsn;
		d->ip = b->branch_ip;
		d->state.src_blk = b;
		kind = b->kind;
		w->kind = kind;
		w->op = b->op;
		w->len = b->len;
		w->rel = b->rel;
		w->zero_call = b->zero_call;
		w->blk = b;
	} else {
		struct pt_walk pw;
		pt_walk_code(d->image, (size_t)space, d->ip, to_ip, &pw);
		d->patch = NULL;
		d->blk = NULL;
		d->state.src_blk = NULL;
		if (pw.status != PT_BLOCK_OK && pw.status != PT_WALK_REACHED)
			return walk_failed(d, pw.status, pw.file, pw.ip);
		n = pw.ninsn;
		d->ip = pw.ip;
		if (pw.status == PT_WALK_REACHED) {
			d->tot_insn_cnt += n;
			d->timestamp_insn_cnt += n;
			d->sample_insn_cnt += n;
			d->no_progress = 0;
			d->state.insn_op = PT_OP_OTHER;
			d->state.insn_len = 0;
			if (d->tx_flags & PT_SF_IN_TX)
				d->state.flags |= PT_SF_IN_TX;
			return R_AGAIN;
		}
		kind = pw.kind;
		w->kind = kind;
		w->op = pw.op;
		w->len = pw.len;
		w->rel = pw.rel;
		w->zero_call = pw.zero_call;
		w->blk = NULL;
	}
	d->tot_insn_cnt += n;
	d->timestamp_insn_cnt += n;
	d->sample_insn_cnt += n;
	int r = R_OK;
	if (kind == PT_INSN_CALL || kind == PT_INSN_CALL_IND) {
		if (!(kind == PT_INSN_CALL && w->zero_call)) {
			/* the return point, and where the block there is remembered */
			r = push(d, d->ip + w->len, w->blk ? &w->blk->fall : NULL);
			if (r)
				goto out;
		}
	} else if (kind == PT_INSN_RET) {
		pop(d);
	}
	if (is_unconditional(kind)) {
		int cnt = d->no_progress++;
		d->state.from_ip = d->ip;
		d->ip += w->len + (uint64_t)(int64_t)w->rel;
		d->state.to_ip = d->ip;
		if (w->blk) {
			d->blk = w->blk->taken;
			d->patch = &w->blk->taken;
		} else {
			d->blk = NULL;
		}
		r = R_TAKEN;
		/* stuck in a loop of direct jumps (a bad ip after an error can land in one) */
		if (cnt) {
			if (cnt == 1) {
				d->stuck_ip = d->state.to_ip;
				d->stuck_ip_prd = 1;
				d->stuck_ip_cnt = 1;
			} else if (cnt > d->cfg.max_loops || d->state.to_ip == d->stuck_ip) {
				d->pkt_state = S_ERR_RESYNC;
				r = R_LOOP;
				goto out;
			} else if (!--d->stuck_ip_cnt) {
				d->stuck_ip_prd += 1;
				d->stuck_ip_cnt = d->stuck_ip_prd;
				d->stuck_ip = d->state.to_ip;
			}
		}
		goto out_no_progress;
	}
out:
	d->no_progress = 0;
out_no_progress:
	d->state.insn_op = w->op;
	d->state.insn_len = w->len;
	if (d->tx_flags & PT_SF_IN_TX)
		d->state.flags |= PT_SF_IN_TX;
	return r;
}

/* Where the block after a taken conditional or a fall-through is remembered. */
static inline void follow(struct pt_dec *d, struct pt_block *b, bool taken)
{
	if (!b) {
		d->blk = NULL;
		d->patch = NULL;
		return;
	}
	struct pt_block **slot = taken ? &b->taken : &b->fall;
	d->blk = *slot;
	d->patch = slot;
}

static int walk_fup(struct pt_dec *d)
{
	uint64_t ip = d->last_ip;
	for (;;) {
		struct walked w;
		int r = walk_insn(d, &w, ip);
		if (r == R_TAKEN)
			return R_OK;
		if (r == R_AGAIN ||
		    (d->cfg.fup_with_nlip && r == R_OK && !is_conditional(w.kind) &&
		     !is_unconditional(w.kind) && ip == d->ip + w.len)) {
			bool no_tip = d->pkt_state != S_FUP;
			d->pkt_state = S_IN_SYNC;
			if (fup_event(d, no_tip) && no_tip)
				return R_OK;
			return R_AGAIN;
		}
		d->set_fup_tx_flags = false;
		if (r)
			return r;
		/* a branch before the FUP's ip: the trace and the code disagree */
		d->pkt_state = S_ERR_RESYNC;
		return R_MISMATCH;
	}
}

static int walk_tip(struct pt_dec *d)
{
	struct walked w;
	int r = walk_insn(d, &w, 0);
	if (r == R_TAKEN)
		return R_OK;
	if (r)
		return r;
	sample_iflag_chg(d);
	if (!is_conditional(w.kind)) { /* indirect */
		if (d->pkt_state == S_TIP_PGD) {
			d->pge = false;
			d->state.type |= PT_ST_TRACE_END;
		}
		d->pkt_state = S_IN_SYNC;
		d->state.from_ip = d->ip;
		if (d->pkt.count == 0) {
			d->state.to_ip = 0; /* (ip stays at the branch) */
			d->blk = NULL;
		} else {
			d->state.to_ip = d->last_ip;
			/* the TIP's target, through the block's memo of the last one */
			struct pt_block *b = w.blk;
			d->ip = d->last_ip;
			if (b) {
				if (b->tip_ip == d->ip) {
					d->blk = b->tip_block;
					d->patch = &b->tip_block;
				} else {
					b->tip_ip = d->ip;
					b->tip_block = NULL;
					d->blk = NULL;
					d->patch = &b->tip_block;
				}
			} else {
				d->blk = NULL;
			}
		}
		return R_OK;
	}
	/* conditional: a TIP where a TNT bit was due (no address filters here) */
	d->pkt_state = S_ERR_RESYNC;
	return R_MISMATCH;
}

static int walk_tnt(struct pt_dec *d)
{
	for (;;) {
		struct walked w;
		int r = walk_insn(d, &w, 0);
		if (r == R_TAKEN)
			return R_OK;
		if (r)
			return r;
		if (w.kind == PT_INSN_RET) {
			/* a TNT bit for a return: compressed */
			if (!d->cfg.return_compression || !d->ret_addr || !(d->tnt.payload & BIT63)) {
				d->pkt_state = S_ERR_RESYNC;
				return R_MISMATCH;
			}
			d->tnt.count -= 1;
			d->pkt_state = d->tnt.count ? S_TNT_CONT : S_IN_SYNC;
			d->tnt.payload <<= 1;
			d->state.from_ip = d->ip;
			d->ip = d->ret_addr;
			d->state.to_ip = d->ip;
			d->blk = d->ret_slot ? *d->ret_slot : NULL;
			d->patch = d->ret_slot;
			return R_OK;
		}
		if (!is_conditional(w.kind)) {
			/* indirect: its TIP must come right after this TNT (a deferred TIP) */
			r = next_packet(d);
			if (r)
				return r;
			if (d->pkt.type != PT_PKT_TIP || d->pkt.count == 0) {
				d->pkt_state = S_ERR_RESYNC;
				d->pkt_step = 0; /* the packet is read again by the resync */
				return R_MISMATCH;
			}
			set_last_ip(d);
			d->state.from_ip = d->ip;
			d->state.to_ip = d->last_ip;
			d->ip = d->last_ip;
			d->blk = NULL;
			d->patch = NULL;
			sample_iflag_chg(d);
			return R_OK;
		}
		d->tnt.count -= 1;
		d->pkt_state = d->tnt.count ? S_TNT_CONT : S_IN_SYNC;
		if (d->tnt.payload & BIT63) {
			d->tnt.payload <<= 1;
			d->state.from_ip = d->ip;
			d->ip += w.len + (uint64_t)(int64_t)w.rel;
			d->state.to_ip = d->ip;
			follow(d, w.blk, true);
			return R_OK;
		}
		/* not taken: on without a state */
		d->sample_cyc = false;
		d->ip += w.len;
		follow(d, w.blk, false);
		if (!d->tnt.count) {
			update_sample_time(d);
			return R_AGAIN;
		}
		d->tnt.payload <<= 1;
	}
}

/* --------------------------------------------------------------- PSB+ */

/* PSB+ when already in sync: its timing packets, its FUP's ip as the PSB's. */
static int walk_psbend(struct pt_dec *d)
{
	int r;
	d->in_psb = true;
	for (;;) {
		r = next_packet(d);
		if (r)
			goto out;
		switch (d->pkt.type) {
		case PT_PKT_PSBEND:
			r = R_OK;
			goto out;
		case PT_PKT_TIP_PGD: case PT_PKT_TIP_PGE: case PT_PKT_TIP: case PT_PKT_TNT:
		case PT_PKT_TRACESTOP: case PT_PKT_BAD: case PT_PKT_PSB: case PT_PKT_PTWRITE:
		case PT_PKT_EXSTOP: case PT_PKT_MWAIT: case PT_PKT_PWRE: case PT_PKT_PWRX:
		case PT_PKT_BBP: case PT_PKT_BIP: case PT_PKT_BEP: case PT_PKT_CFE: case PT_PKT_EVD:
			/* not a packet of PSB+: the walk goes on with it */
			d->have_tma = false;
			r = R_AGAIN;
			goto out;
		case PT_PKT_OVF:
			r = overflow(d);
			goto out;
		case PT_PKT_TSC: calc_tsc(d); break;
		case PT_PKT_TMA: calc_tma(d); break;
		case PT_PKT_CBR: calc_cbr(d); break;
		case PT_PKT_MODE_EXEC: mode_exec_status(d); break;
		case PT_PKT_FUP:
			d->pge = true;
			if (d->pkt.count) {
				set_last_ip(d);
				d->psb_ip = d->last_ip;
			}
			break;
		case PT_PKT_MODE_TSX: d->tx_flags = d->pkt.payload & PT_SF_IN_TX; break;
		case PT_PKT_MTC: calc_mtc(d); break;
		case PT_PKT_CYC: calc_cyc(d); break;
		default: break;
		}
	}
out:
	d->in_psb = false;
	return r;
}

static int psb(struct pt_dec *d)
{
	d->last_ip = 0;
	d->psb_ip = 0;
	d->have_last_ip = true;
	clear_stack(d);
	int r = walk_psbend(d);
	if (r)
		return r;
	d->state.type = PT_ST_PSB_EVT;
	d->state.from_ip = d->psb_ip;
	d->state.to_ip = 0;
	return R_OK;
}

static int fup_in_psb(struct pt_dec *d)
{
	if (d->ip != d->last_ip) {
		int r = walk_fup(d);
		if (r != R_AGAIN)
			return r;
	}
	d->pkt_state = S_IN_SYNC;
	if (psb(d)) {
		d->pkt_state = S_ERR_RESYNC;
		return R_MISMATCH;
	}
	return R_OK;
}

/* The FUP of a PSB+ (perf's intel_pt_psb_lookahead_cb): the walk first goes to its ip,
 * unless a TIP.PGE follows PSBEND closely. */
struct psb_info {
	struct pt_packet fup;
	bool found;
	int after_psbend;
};

static int psb_lookahead_cb(struct pt_dec *d, const struct pt_packet *pkt, int prev, void *data)
{
	(void)d;
	(void)prev;
	struct psb_info *p = data;
	switch (pkt->type) {
	case PT_PKT_PAD: case PT_PKT_MNT: case PT_PKT_TSC: case PT_PKT_TMA: case PT_PKT_MODE_EXEC:
	case PT_PKT_MODE_TSX: case PT_PKT_MTC: case PT_PKT_CYC: case PT_PKT_VMCS: case PT_PKT_CBR:
	case PT_PKT_PIP:
		if (p->after_psbend && !--p->after_psbend)
			return 1;
		return 0;
	case PT_PKT_FUP:
		if (p->after_psbend || p->found || pkt->count == 0)
			return 1;
		p->fup = *pkt;
		p->found = true;
		return 0;
	case PT_PKT_PSBEND:
		if (!p->found)
			return 1;
		p->after_psbend = 6;
		return 0;
	case PT_PKT_TIP_PGE:
		if (p->after_psbend)
			p->found = false;
		return 1;
	case PT_PKT_PTWRITE: case PT_PKT_EXSTOP: case PT_PKT_MWAIT: case PT_PKT_PWRE:
	case PT_PKT_PWRX: case PT_PKT_BBP: case PT_PKT_BIP: case PT_PKT_BEP: case PT_PKT_CFE:
	case PT_PKT_EVD:
		if (p->after_psbend) {
			if (!--p->after_psbend)
				return 1;
			return 0;
		}
		return 1;
	default:
		return 1;
	}
}

static bool psb_with_fup(struct pt_dec *d, int *r)
{
	struct psb_info p = {0};
	if (!d->cfg.branch_enable)
		return false;
	lookahead(d, psb_lookahead_cb, &p);
	if (!p.found)
		return false;
	struct pt_packet saved = d->pkt;
	d->pkt = p.fup;
	set_last_ip(d);
	d->pkt = saved;
	d->pkt_state = S_FUP_IN_PSB;
	*r = fup_in_psb(d);
	return true;
}

/* ------------------------------------------------------------ in sync */

/* MODE.TSX while tracing: its FUP says where the transaction changed. */
static int mode_tsx(struct pt_dec *d, bool *no_tip)
{
	uint32_t flags = d->pkt.payload & (PT_SF_IN_TX | PT_SF_ABORT_TX);
	int r = next_packet(d);
	if (r)
		return r;
	if (d->pkt.type == PT_PKT_FUP) {
		d->fup_tx_flags = flags;
		d->set_fup_tx_flags = true;
		if (!(flags & PT_SF_ABORT_TX))
			*no_tip = true;
	} else {
		d->tx_flags = d->pkt.payload & PT_SF_IN_TX; /* (perf reads the next packet's) */
	}
	return R_OK;
}

/* After an asynchronous FUP: the TIP that says where control went. */
static int walk_fup_tip(struct pt_dec *d)
{
	if (d->tx_flags & PT_SF_ABORT_TX) {
		d->tx_flags = 0;
		d->state.flags &= ~(uint32_t)PT_SF_IN_TX;
		d->state.flags |= PT_SF_ABORT_TX;
	} else {
		d->state.flags |= PT_SF_ASYNC;
	}
	for (;;) {
		int r = next_packet(d);
		if (r)
			return r;
		switch (d->pkt.type) {
		case PT_PKT_CBR: calc_cbr(d); break;
		case PT_PKT_OVF: return overflow(d);
		case PT_PKT_TIP_PGD:
			d->state.from_ip = d->ip;
			if (d->pkt.count == 0) {
				d->state.to_ip = 0;
			} else {
				set_ip(d);
				d->state.to_ip = d->ip;
			}
			d->pge = false;
			d->state.type |= PT_ST_TRACE_END;
			return R_OK;
		case PT_PKT_TIP_PGE:
			d->pge = true;
			d->state.from_ip = 0;
			if (d->pkt.count == 0) {
				d->state.to_ip = 0;
			} else {
				set_ip(d);
				d->state.to_ip = d->ip;
			}
			d->state.type |= PT_ST_TRACE_BEGIN;
			mtc_cyc_cnt_pge(d);
			return R_OK;
		case PT_PKT_TIP:
			d->state.from_ip = d->ip;
			if (d->pkt.count == 0) {
				d->state.to_ip = 0;
			} else {
				set_ip(d);
				d->state.to_ip = d->ip;
			}
			sample_iflag_chg(d);
			return R_OK;
		case PT_PKT_PIP: break;
		case PT_PKT_MTC: calc_mtc(d); break;
		case PT_PKT_CYC: calc_cyc(d); break;
		case PT_PKT_MODE_EXEC: mode_exec(d); break;
		case PT_PKT_VMCS: case PT_PKT_MNT: case PT_PKT_PAD: break;
		default:
			/* no TIP after the FUP */
			d->pkt_state = S_ERR_RESYNC;
			d->pkt_step = 0;
			return R_MISMATCH;
		}
	}
}

static int walk_trace(struct pt_dec *d)
{
	int last_type = PT_PKT_PAD;
	bool no_tip = false;
	for (;;) {
		int r = next_packet(d);
		if (r)
			return r;
	next:
		if (d->cyc_threshold) {
			if (d->sample_cyc && last_type != PT_PKT_CYC)
				d->sample_cyc = false;
			last_type = d->pkt.type;
		}
		switch (d->pkt.type) {
		case PT_PKT_TNT:
			if (!d->pkt.count)
				break;
			d->tnt = d->pkt;
			d->pkt_state = S_TNT;
			r = walk_tnt(d);
			if (r == R_AGAIN)
				break;
			return r;
		case PT_PKT_TIP_PGD:
			if (d->pkt.count)
				set_last_ip(d);
			d->pkt_state = S_TIP_PGD;
			return walk_tip(d);
		case PT_PKT_TIP_PGE:
			d->pge = true;
			d->overflow = false;
			mtc_cyc_cnt_pge(d);
			if (d->pkt.count == 0)
				break; /* no ip: nothing to start from */
			sample_iflag_chg(d);
			set_ip(d);
			d->state.from_ip = 0;
			d->state.to_ip = d->ip;
			d->state.type |= PT_ST_TRACE_BEGIN;
			return R_OK;
		case PT_PKT_OVF:
			return overflow(d);
		case PT_PKT_TIP:
			if (d->pkt.count)
				set_last_ip(d);
			d->pkt_state = S_TIP;
			return walk_tip(d);
		case PT_PKT_FUP:
			if (d->pkt.count == 0) {
				no_tip = false;
				break;
			}
			set_last_ip(d);
			if (!d->cfg.branch_enable || !d->pge) {
				d->ip = d->last_ip;
				d->blk = NULL;
				if (fup_event(d, no_tip))
					return R_OK;
				no_tip = false;
				break;
			}
			if (d->set_fup_mwait)
				no_tip = true;
			d->pkt_state = no_tip ? S_FUP_NO_TIP : S_FUP;
			r = walk_fup(d);
			if (r != R_AGAIN)
				return r;
			if (no_tip) {
				no_tip = false;
				break;
			}
			return walk_fup_tip(d);
		case PT_PKT_TRACESTOP:
			d->pge = false;
			d->tx_flags = 0;
			d->have_tma = false;
			break;
		case PT_PKT_PSB:
			d->state.psb_offset = d->pos;
			d->psb_ip = 0;
			if (psb_with_fup(d, &r))
				return r;
			r = psb(d);
			if (r == R_AGAIN)
				goto next;
			return r;
		case PT_PKT_PIP: break;
		case PT_PKT_MTC: calc_mtc(d); break;
		case PT_PKT_TSC: calc_tsc(d); break;
		case PT_PKT_TMA: calc_tma(d); break;
		case PT_PKT_CYC: calc_cyc(d); break;
		case PT_PKT_CBR:
			calc_cbr(d);
			if (d->cbr != d->cbr_seen) {
				d->state.type = 0;
				return R_OK;
			}
			break;
		case PT_PKT_MODE_EXEC:
			mode_exec(d);
			r = next_packet(d);
			if (r)
				return r;
			if (d->pkt.type == PT_PKT_FUP) {
				d->set_fup_mode_exec = true;
				no_tip = true;
			}
			goto next;
		case PT_PKT_MODE_TSX:
			if (!d->pge || d->in_psb) {
				d->tx_flags = d->pkt.payload & PT_SF_IN_TX;
				break;
			}
			r = mode_tsx(d, &no_tip);
			if (r)
				return r;
			goto next;
		case PT_PKT_BAD:
			d->pkt_state = S_NO_PSB;
			return R_INTERNAL;
		case PT_PKT_PSBEND: case PT_PKT_VMCS: case PT_PKT_MNT: case PT_PKT_PAD:
			break;
		case PT_PKT_PTWRITE:
			if (d->pkt.ip) {
				r = next_packet(d);
				if (r)
					return r;
				if (d->pkt.type == PT_PKT_FUP) {
					d->set_fup_ptw = true;
					no_tip = true;
				}
				goto next;
			}
			d->state.type = PT_ST_PTW;
			d->state.from_ip = d->ip;
			d->state.to_ip = 0;
			return R_OK;
		case PT_PKT_MWAIT:
			d->set_fup_mwait = true;
			break;
		case PT_PKT_PWRE:
			if (d->set_fup_mwait) {
				d->set_fup_pwre = true;
				break;
			}
			d->state.type = PT_ST_PWR_ENTRY;
			d->state.from_ip = d->ip;
			d->state.to_ip = 0;
			return R_OK;
		case PT_PKT_EXSTOP:
			if (d->pkt.ip) {
				r = next_packet(d);
				if (r)
					return r;
				if (d->pkt.type == PT_PKT_FUP) {
					d->set_fup_exstop = true;
					no_tip = true;
				}
				goto next;
			}
			d->state.type = PT_ST_EX_STOP;
			d->state.from_ip = d->ip;
			d->state.to_ip = 0;
			return R_OK;
		case PT_PKT_PWRX:
			d->state.type = PT_ST_PWR_EXIT;
			d->state.from_ip = d->ip;
			d->state.to_ip = 0;
			return R_OK;
		case PT_PKT_BBP: case PT_PKT_BIP:
			break; /* block items: not used by branch decoding */
		case PT_PKT_BEP:
			if (d->pkt.ip) {
				r = next_packet(d);
				if (r)
					return r;
				if (d->pkt.type == PT_PKT_FUP) {
					d->set_fup_bep = true;
					no_tip = true;
				}
				goto next;
			}
			d->state.type = PT_ST_BLK_ITEMS;
			d->state.from_ip = d->ip;
			d->state.to_ip = 0;
			return R_OK;
		case PT_PKT_CFE:
			if (d->pkt.ip) {
				r = next_packet(d);
				if (r)
					return r;
				if (d->pkt.type == PT_PKT_FUP) {
					d->set_fup_cfe_ip = true;
					no_tip = true;
				}
				goto next;
			}
			d->set_fup_cfe = true;
			if (!d->pge) {
				fup_event(d, true);
				return R_OK;
			}
			break;
		case PT_PKT_EVD:
			if (d->evd_cnt >= PT_MAX_EVDS)
				return R_INTERNAL;
			d->evd_cnt++;
			break;
		default:
			d->pkt_state = S_NO_PSB;
			return R_INTERNAL;
		}
	}
}

/* ------------------------------------------------------------ resync */

/* PSB+ while not in sync (perf's intel_pt_walk_psb). */
static int walk_psb(struct pt_dec *d)
{
	int r;
	d->in_psb = true;
	for (;;) {
		r = next_packet(d);
		if (r)
			goto out;
		switch (d->pkt.type) {
		case PT_PKT_TIP_PGD: case PT_PKT_TIP_PGE: case PT_PKT_TIP: case PT_PKT_PTWRITE:
		case PT_PKT_EXSTOP: case PT_PKT_MWAIT: case PT_PKT_PWRE: case PT_PKT_PWRX:
		case PT_PKT_BBP: case PT_PKT_BIP: case PT_PKT_BEP: case PT_PKT_CFE: case PT_PKT_EVD:
			r = R_MISMATCH;
			goto out;
		case PT_PKT_FUP:
			d->pge = true;
			if (have_ip(d)) {
				set_ip(d);
				d->psb_ip = d->ip;
			}
			break;
		case PT_PKT_MTC: calc_mtc(d); break;
		case PT_PKT_TSC: calc_tsc(d); break;
		case PT_PKT_TMA: calc_tma(d); break;
		case PT_PKT_CYC: calc_cyc(d); break;
		case PT_PKT_CBR: calc_cbr(d); break;
		case PT_PKT_PIP: break;
		case PT_PKT_MODE_EXEC: mode_exec_status(d); break;
		case PT_PKT_MODE_TSX: d->tx_flags = d->pkt.payload & PT_SF_IN_TX; break;
		case PT_PKT_TRACESTOP:
			d->pge = false;
			d->tx_flags = 0;
			/* fall through */
		case PT_PKT_TNT:
			d->have_tma = false;
			d->pkt_state = d->ip ? S_IN_SYNC : S_ERR_RESYNC;
			r = R_MISMATCH;
			goto out;
		case PT_PKT_BAD:
			d->pkt_state = S_NO_PSB;
			r = R_INTERNAL;
			goto out;
		case PT_PKT_OVF:
			r = overflow(d);
			goto out;
		case PT_PKT_PSBEND:
			r = R_OK;
			goto out;
		default:
			break;
		}
	}
out:
	d->in_psb = false;
	return r;
}

/* Until a packet gives a whole ip (perf's intel_pt_walk_to_ip). */
static int walk_to_ip(struct pt_dec *d)
{
	for (;;) {
		int r = next_packet(d);
		if (r)
			return r;
		switch (d->pkt.type) {
		case PT_PKT_TIP_PGD:
			d->pge = false;
			if (have_ip(d))
				set_ip(d);
			if (!d->ip)
				break;
			d->state.type |= PT_ST_TRACE_END;
			return R_OK;
		case PT_PKT_TIP_PGE:
			d->pge = true;
			mtc_cyc_cnt_pge(d);
			if (have_ip(d))
				set_ip(d);
			if (!d->ip)
				break;
			d->state.type |= PT_ST_TRACE_BEGIN;
			return R_OK;
		case PT_PKT_TIP:
			d->pge = true;
			if (have_ip(d))
				set_ip(d);
			if (!d->ip)
				break;
			return R_OK;
		case PT_PKT_FUP:
			if (have_ip(d))
				set_ip(d);
			if (d->ip)
				return R_OK;
			break;
		case PT_PKT_MTC: calc_mtc(d); break;
		case PT_PKT_TSC: calc_tsc(d); break;
		case PT_PKT_TMA: calc_tma(d); break;
		case PT_PKT_CYC: calc_cyc(d); break;
		case PT_PKT_CBR: calc_cbr(d); break;
		case PT_PKT_PIP: break;
		case PT_PKT_MODE_EXEC: mode_exec_status(d); break;
		case PT_PKT_MODE_TSX: d->tx_flags = d->pkt.payload & PT_SF_IN_TX; break;
		case PT_PKT_OVF: return overflow(d);
		case PT_PKT_BAD:
			d->pkt_state = S_NO_PSB;
			return R_INTERNAL;
		case PT_PKT_TRACESTOP:
			d->pge = false;
			d->tx_flags = 0;
			d->have_tma = false;
			break;
		case PT_PKT_PSB:
			d->state.psb_offset = d->pos;
			d->psb_ip = 0;
			d->last_ip = 0;
			d->have_last_ip = true;
			clear_stack(d);
			r = walk_psb(d);
			if (r)
				return r;
			d->state.type = PT_ST_PSB_EVT;
			d->state.from_ip = d->psb_ip;
			d->state.to_ip = 0;
			return R_OK;
		default:
			break;
		}
	}
}

static int sync_ip(struct pt_dec *d)
{
	clear_fup_event(d);
	d->overflow = false;
	if (!d->cfg.branch_enable) {
		d->pkt_state = S_IN_SYNC;
		d->state.type = 0;
		return R_OK;
	}
	int r = walk_to_ip(d);
	if (r || ((d->state.type & PT_ST_PSB_EVT) && !d->ip))
		return r;
	d->pkt_state = S_IN_SYNC;
	d->state.from_ip = 0;
	d->state.to_ip = d->ip;
	return R_OK;
}

static const uint8_t PSB_BYTES[16] = {2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82,
				      2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82};

/* The next PSB, across buffers (one may end in the middle of it). */
static int scan_for_psb(struct pt_dec *d)
{
	for (;;) {
		if (!d->len) {
			int r = next_data(d);
			if (r)
				return r;
		}
		const uint8_t *at = memmem(d->buf, d->len, PSB_BYTES, sizeof(PSB_BYTES));
		if (at) {
			d->pkt_step = (size_t)(at - d->buf);
			return next_packet(d);
		}
		/* A PSB cut by the buffer's end: its start here, its rest in the next buffer. */
		size_t part = 0;
		for (size_t i = sizeof(PSB_BYTES) - 1; i; i--) {
			if (i <= d->len && !memcmp(d->buf + d->len - i, PSB_BYTES, i)) {
				part = i;
				break;
			}
		}
		d->pos += d->len;
		d->len = 0;
		if (!part)
			continue;
		int r = next_data(d);
		if (r)
			return r;
		size_t rest = sizeof(PSB_BYTES) - part;
		if (rest > d->len || memcmp(d->buf, PSB_BYTES + part, rest))
			continue;
		/* the joined PSB is the packet: go on after its rest */
		d->pos -= part;
		d->buf += rest;
		d->len -= rest;
		d->pkt.type = PT_PKT_PSB;
		d->pkt.size = 16;
		d->pkt_step = 0;
		pt_packet_update_ctx(&d->ctx, &d->pkt);
		d->pos += 16;
		d->pos -= rest;
		return R_OK;
	}
}

static int sync(struct pt_dec *d)
{
	d->pge = false;
	d->have_last_ip = false;
	d->last_ip = 0;
	d->psb_ip = 0;
	d->ip = 0;
	d->blk = NULL;
	clear_stack(d);
	int r = scan_for_psb(d);
	if (r)
		return r;
	d->have_last_ip = true;
	d->pkt_state = S_IN_SYNC;
	r = walk_psb(d);
	if (r)
		return r;
	d->state.type = PT_ST_PSB_EVT; /* only a PSB: no branch at the first sync */
	d->state.from_ip = d->psb_ip;
	d->state.to_ip = 0;
	if (d->ip)
		d->pkt_state = S_IN_SYNC;
	return R_OK;
}

/* ------------------------------------------------------------ the state */

static uint64_t est_timestamp(const struct pt_dec *d)
{
	uint64_t est = d->sample_insn_cnt << 1;
	if (d->cbr && d->cfg.max_non_turbo_ratio) {
		est *= d->cfg.max_non_turbo_ratio;
		est /= d->cbr;
	}
	return d->sample_timestamp + est;
}

const struct pt_state *pt_dec_next(struct pt_dec *d)
{
	int r;
	do {
		d->state.type = PT_ST_BRANCH;
		d->state.flags = 0;
		switch (d->pkt_state) {
		case S_NO_PSB:
			r = sync(d);
			break;
		case S_NO_IP:
			d->have_last_ip = false;
			d->last_ip = 0;
			d->ip = 0;
			d->blk = NULL;
			/* fall through */
		case S_ERR_RESYNC:
			r = sync_ip(d);
			break;
		case S_IN_SYNC:
			r = walk_trace(d);
			break;
		case S_TNT:
		case S_TNT_CONT:
			r = walk_tnt(d);
			if (r == R_AGAIN)
				r = walk_trace(d);
			break;
		case S_TIP:
		case S_TIP_PGD:
			r = walk_tip(d);
			break;
		case S_FUP:
			r = walk_fup(d);
			if (r == R_AGAIN)
				r = walk_fup_tip(d);
			break;
		case S_FUP_NO_TIP:
			r = walk_fup(d);
			if (r == R_AGAIN)
				r = walk_trace(d);
			break;
		case S_FUP_IN_PSB:
			r = fup_in_psb(d);
			break;
		default:
			d->pkt_state = S_NO_PSB;
			r = R_INTERNAL;
			break;
		}
	} while (r == R_RESTART);

	if (r) {
		d->state.err = error_code(r);
		if (r != R_OVERFLOW)
			d->state.from_ip = d->ip;
		update_sample_time(d);
		d->sample_tot_cyc_cnt = d->tot_cyc_cnt;
	} else {
		d->state.err = 0;
		if (d->cbr != d->cbr_seen) {
			d->cbr_seen = d->cbr;
			if (!d->state.type) {
				d->state.from_ip = d->ip;
				d->state.to_ip = 0;
			}
			d->state.type |= PT_ST_CBR_CHG;
			d->state.cbr_payload = d->cbr_payload;
			d->state.cbr = d->cbr;
		}
		if (sample_time_state(d->pkt_state)) {
			update_sample_time(d);
			if (d->sample_cyc) {
				d->sample_tot_cyc_cnt = d->tot_cyc_cnt;
				d->state.flags |= PT_SF_SAMPLE_IPC;
				d->sample_cyc = false;
			}
		}
		/* with only TSC/MTC to count cycles, IPC is known whenever they change */
		if (!d->have_cyc)
			d->state.flags |= PT_SF_SAMPLE_IPC;
	}
	/* a PSB's state has the time of its TSC */
	if ((d->state.type & PT_ST_PSB_EVT) && d->tsc_timestamp)
		d->sample_timestamp = d->tsc_timestamp;
	d->state.timestamp = d->sample_timestamp;
	d->state.est_timestamp = est_timestamp(d);
	d->state.tot_insn_cnt = d->tot_insn_cnt;
	d->state.tot_cyc_cnt = d->sample_tot_cyc_cnt;
	return &d->state;
}
