/* The own decoder's flow layer (pt_decoder.c): one AUX queue's packets and the code they
 * describe -> one decoder state at a time (a branch, a trace start or end, a PSB, a CBR
 * change, an error), with its time and counts.
 *
 * It follows the rules of perf 6.1's Intel PT decoder state for state, so that the same
 * trace gives the same samples (docs/architecture.md, "The own decoder"): how TNT bits,
 * compressed returns, deferred TIPs, FUPs, PSB+ and overflows are walked, which errors
 * come out where and how decoding resumes, and how each state's timestamp follows from
 * TSC, MTC/TMA, CYC and CBR. What it does differently is how it walks code: through the
 * block cache (pt_block.c), where perf decodes or looks up the run to the next branch at
 * every step.
 */
#ifndef PTSCOPE_PT_DECODER_H
#define PTSCOPE_PT_DECODER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pt_block.h"
#include "pt_insn.h"
#include "pt_packet.h"

/* State types (bits). */
enum {
	PT_ST_BRANCH = 1 << 0,
	PT_ST_INSTRUCTION = 1 << 1,
	PT_ST_TRANSACTION = 1 << 2,
	PT_ST_PTW = 1 << 3,
	PT_ST_MWAIT_OP = 1 << 4,
	PT_ST_PWR_ENTRY = 1 << 5,
	PT_ST_EX_STOP = 1 << 6,
	PT_ST_PWR_EXIT = 1 << 7,
	PT_ST_CBR_CHG = 1 << 8,
	PT_ST_TRACE_BEGIN = 1 << 9,
	PT_ST_TRACE_END = 1 << 10,
	PT_ST_BLK_ITEMS = 1 << 11,
	PT_ST_PSB_EVT = 1 << 12,
	PT_ST_EVT = 1 << 13,
	PT_ST_IFLAG_CHG = 1 << 14,
};

/* State flags. */
enum {
	PT_SF_IN_TX = 1 << 0,
	PT_SF_ABORT_TX = 1 << 1,
	PT_SF_ASYNC = 1 << 2,
	PT_SF_FUP_IP = 1 << 3,
	PT_SF_SAMPLE_IPC = 1 << 4,
};

/* Error codes, as perf numbers them (its messages: pt_error_message()). */
enum {
	PT_ERR_NOMEM = 1,
	PT_ERR_INTERN,
	PT_ERR_BADPKT,
	PT_ERR_NODATA,
	PT_ERR_NOINSN,
	PT_ERR_MISMAT,
	PT_ERR_OVR,
	PT_ERR_LOST,
	PT_ERR_UNK,
	PT_ERR_NELOOP,
	PT_ERR_EPTW,
	PT_ERR_MAX,
};
const char *pt_error_message(int code);

struct pt_state {
	int err; /* 0, or PT_ERR_* */
	uint32_t type, flags;
	uint64_t from_ip, to_ip;
	uint8_t insn_op, insn_len;
	uint64_t timestamp, est_timestamp;
	uint64_t tot_insn_cnt, tot_cyc_cnt;
	uint32_t cbr;
	uint64_t cbr_payload;
	uint64_t psb_offset;
	/* the block whose branch this state's from_ip is (NULL: not known): the feed's
	 * memos of its locations */
	struct pt_block *src_blk;
};

/* One piece of the queue's trace; consecutive: it continues the one before (else the
 * decoder starts over at its first PSB). */
struct pt_buffer {
	const uint8_t *data;
	size_t size;
	uint64_t ref_timestamp;
	bool consecutive;
};

struct pt_dec_config {
	bool return_compression;
	bool branch_enable;
	uint64_t ctl;	     /* the event's config: the CYC threshold */
	int mtc_period;	     /* MTC every 2^mtc_period CTC ticks */
	uint32_t tsc_ctc_ratio_n, tsc_ctc_ratio_d;
	uint32_t max_non_turbo_ratio;
	int max_loops;
	bool fup_with_nlip; /* Goldmont: a FUP may hold the next instruction's address */
	bool release_input; /* the buffers lie in a mapping of the file: the pages behind
			     * the decoder are handed back (see release_behind()) */
};

struct pt_image;

/* The return stack (perf's is unbounded): each return address with where the block
 * there is remembered (the call block's fall-through: NULL until known, and checked). */
struct pt_stack {
	uint64_t *addr;
	struct pt_block ***slot;
	size_t n, cap;
};

struct pt_dec {
	struct pt_dec_config cfg;
	/* input */
	const struct pt_buffer *bufs;
	size_t nbufs, next_buf;
	const uint8_t *buf; /* the current packet */
	const uint8_t *kept_from; /* release_input: the trace before it was handed back */
	size_t len;	    /* bytes left from it in the buffer */
	size_t pkt_step;
	uint64_t pos;
	struct pt_packet pkt, tnt;
	struct pt_packet_ctx ctx;
	int last_packet_type;
	/* flow */
	int pkt_state;
	uint32_t repositions; /* times the trace started over (a buffer that does not go on
			       * from the one before): what ran up to it is unknown */
	uint64_t ip, last_ip, psb_ip, ret_addr;
	struct pt_block **ret_slot;
	bool have_last_ip, pge, in_psb, overflow;
	struct pt_stack stack;
	uint32_t tx_flags, fup_tx_flags;
	bool set_fup_tx_flags, set_fup_ptw, set_fup_mwait, set_fup_pwre, set_fup_exstop;
	bool set_fup_bep, set_fup_cfe_ip, set_fup_cfe, set_fup_mode_exec;
	bool iflag, next_iflag;
	int evd_cnt;
	int exec_mode;
	/* timing */
	uint64_t timestamp, tsc_timestamp, ref_timestamp, buf_timestamp, sample_timestamp;
	uint64_t ctc_timestamp, ctc_delta, last_ctc, cycle_cnt, cyc_ref_timestamp;
	uint32_t last_mtc, tsc_ctc_mult, tsc_slip, ctc_rem_mask;
	bool have_tma, fixup_last_mtc, have_cyc, sample_cyc, have_calc_cyc_to_tsc;
	uint32_t cbr, cbr_seen;
	uint64_t cbr_payload;
	double max_non_turbo_ratio_fp, cbr_cyc_to_tsc, calc_cyc_to_tsc, tsc_to_cyc;
	uint64_t cyc_threshold;
	uint64_t tot_insn_cnt, tot_cyc_cnt, sample_tot_cyc_cnt, base_cyc_cnt, cyc_cnt_timestamp;
	uint64_t timestamp_insn_cnt, sample_insn_cnt;
	/* never-ending loops */
	int no_progress, stuck_ip_prd, stuck_ip_cnt;
	uint64_t stuck_ip;
	/* code */
	struct pt_image *image;
	long space; /* where the queue's code runs now (-1: its thread is unknown) */
	struct pt_block *blk;	   /* the block starting at ip, when known */
	struct pt_block **patch;   /* where to remember the block found next (a successor) */
	/* the state handed out */
	struct pt_state state;
};

int pt_dec_init(struct pt_dec *d, const struct pt_dec_config *cfg, const struct pt_buffer *bufs,
		size_t nbufs, struct pt_image *image);
void pt_dec_free(struct pt_dec *d);

/* The next state (perf's intel_pt_decode()); state.err PT_ERR_NODATA: the queue's trace
 * has ended. */
const struct pt_state *pt_dec_next(struct pt_dec *d);

#endif
