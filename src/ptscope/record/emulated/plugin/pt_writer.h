/* Intel PT packets for one thread's stream, written the way user-only hardware tracing
   writes them and perf's decoder reads them (docs/emulated-pt.md, "The PT encoder"):

   - PSB+ (PSB, CYC, TSC, CBR, MODE.Exec, [FUP], PSBEND) at the start and every psb_period
     bytes; perf's decoder forgets the last IP and its return stack at a PSB, so do we; the
     FUP in PSB+ carries its whole IP (pt_ip_full);
   - short TNT (oldest bit highest), flushed before any other packet;
   - TIP / TIP.PGE / TIP.PGD / FUP with last-IP compression;
   - return compression: a ret whose target is the top of a 64-deep stack of return
     addresses is a taken TNT bit, else a TIP; the stack is popped on every ret;
   - CYC (cycles since the previous CYC) before TNT, TIP, FUP and TIP.PGD once
     cyc_threshold cycles passed, and right before every TSC: perf re-bases its
     cycle-counted time on a TSC only when a CYC comes right before it.

   The writer appends to a buffer the caller owns (a mapped chunk of the perf.data file),
   and after every event it can leave a *provisional end* past the last packet: the pending
   TNT bits, FUP(next IP), TIP.PGD. The next packets overwrite it; if the process dies
   first, the stream in the file still ends cleanly where the thread was. Bytes past the
   end are zero, which are PAD packets. Everything here is inline: it runs for every block
   the emulated program executes. */
#ifndef PTSCOPE_PT_WRITER_H
#define PTSCOPE_PT_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PT_RET_STACK 64
#define PT_TAIL_BYTES 16   /* a provisional end (at most 11 bytes) and the zeros after it */
#define PT_BLOCK_ROOM 256  /* the most one block's packets (PSB+ included) and tail take */

enum {
	PT_TIP = 0x0d,
	PT_TIP_PGE = 0x11,
	PT_TIP_PGD = 0x01,
	PT_FUP = 0x1d,
};

struct pt_writer {
	uint8_t *buf;         /* the current chunk (NULL before the first one) */
	size_t pos;           /* bytes of packets in it */
	size_t cap;           /* its size */
	uint64_t chunk_start; /* stream offset of buf[0] */
	uint64_t next_psb;    /* stream offset from which the next PSB+ is due */
	uint64_t now;         /* cycles since the model's start TSC (1 cycle = 1 TSC tick) */
	uint64_t last_timing; /* `now` at the last CYC or TSC */
	uint64_t last_ip;
	uint32_t tnt_bits, tnt_n;
	uint32_t stack_top, stack_n; /* return stack: a ring of PT_RET_STACK addresses */
	uint64_t stack[PT_RET_STACK];
	int enabled;          /* between TIP.PGE and TIP.PGD */
	int started;          /* the stream's first PSB+ is written */
	/* the cycle model, copied from the recording's configuration */
	uint64_t start_tsc;
	uint64_t psb_period;
	uint32_t cyc_threshold;
	uint8_t ratio;
};

static inline uint64_t pt_stream_pos(const struct pt_writer *w)
{
	return w->chunk_start + w->pos;
}

static inline void pt_byte(struct pt_writer *w, uint8_t b)
{
	w->buf[w->pos++] = b;
}

static inline void pt_bytes(struct pt_writer *w, const void *p, size_t n)
{
	memcpy(w->buf + w->pos, p, n);
	w->pos += n;
}

static inline void pt_le(struct pt_writer *w, uint64_t v, size_t n)
{
	/* Little-endian, n <= 8: one unaligned store, the extra bytes overwritten later. */
	memcpy(w->buf + w->pos, &v, 8);
	w->pos += n;
}

static inline void pt_flush_tnt(struct pt_writer *w)
{
	if (w->tnt_n) {
		pt_byte(w, (uint8_t)((1u << (w->tnt_n + 1)) | (w->tnt_bits << 1)));
		w->tnt_n = 0;
		w->tnt_bits = 0;
	}
}

static inline void pt_cyc_packet(struct pt_writer *w, uint64_t elapsed)
{
	uint8_t first = (uint8_t)(((elapsed & 0x1f) << 3) | 0x03);
	elapsed >>= 5;
	if (!elapsed) {
		pt_byte(w, first);
		return;
	}
	pt_byte(w, first | 0x04);
	for (;;) {
		uint64_t more = elapsed >> 7;
		pt_byte(w, (uint8_t)(((elapsed & 0x7f) << 1) | (more ? 1 : 0)));
		if (!more)
			return;
		elapsed = more;
	}
}

/* A CYC packet for the cycles since the last one, when due (or forced). */
static inline void pt_cyc(struct pt_writer *w, int force)
{
	uint64_t elapsed = w->now - w->last_timing;
	if (elapsed >= w->cyc_threshold || force) {
		pt_flush_tnt(w);
		w->last_timing = w->now;
		pt_cyc_packet(w, elapsed);
	}
}

/* The header bits (IPBytes << 5) and payload size of an IP packet for `ip` compressed
   against `last`: 2, 4 or 6 low bytes replace the last IP's, or 6 sign-extended, or 8. */
static inline size_t pt_ip_form(uint64_t ip, uint64_t last, uint8_t *header)
{
	uint64_t x = ip ^ last;
	if ((x >> 16) == 0) {
		*header = 0x20;
		return 2;
	}
	if ((x >> 32) == 0) {
		*header = 0x40;
		return 4;
	}
	if ((x >> 48) == 0) {
		*header = 0x80;
		return 6;
	}
	if (ip < (1ULL << 47) || (ip >> 47) == 0x1ffff) {
		*header = 0x60; /* 48 bits, sign-extended */
		return 6;
	}
	*header = 0xc0;
	return 8;
}

static inline void pt_ip_packet(struct pt_writer *w, uint8_t opcode, uint64_t ip)
{
	uint8_t header;
	size_t n = pt_ip_form(ip, w->last_ip, &header);
	w->buf[w->pos] = header | opcode;
	memcpy(w->buf + w->pos + 1, &ip, 8); /* the bytes past n are overwritten later */
	w->pos += 1 + n;
	w->last_ip = ip;
}

/* An IP packet that does not depend on the last IP: the one in PSB+. perf's decoder
   reads it before it forgets its last IP at the PSB (intel_pt_psb_with_fup()), so a
   compressed one would take the upper bits of whatever IP came before: a program below
   4 GiB (not position-independent) would seem to run at 0x40_0000_0000 plus its address. */
static inline void pt_ip_full(struct pt_writer *w, uint8_t opcode, uint64_t ip)
{
	int sign_extended = ip < (1ULL << 47) || (ip >> 47) == 0x1ffff;
	pt_byte(w, (uint8_t)((sign_extended ? 0x60 : 0xc0) | opcode));
	pt_le(w, ip, sign_extended ? 6 : 8);
	w->last_ip = ip;
}

static inline void pt_tsc(struct pt_writer *w)
{
	pt_cyc(w, 1);
	pt_byte(w, 0x19);
	pt_le(w, w->start_tsc + w->now, 7);
	w->last_timing = w->now;
}

static inline void pt_psb(struct pt_writer *w, const uint64_t *ip)
{
	static const uint8_t psb[16] = {2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82,
					2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82};
	pt_flush_tnt(w);
	pt_bytes(w, psb, sizeof psb);
	pt_tsc(w);
	uint8_t cbr[4] = {0x02, 0x03, w->ratio, 0x00};
	pt_bytes(w, cbr, 4);
	pt_byte(w, 0x99);
	pt_byte(w, 0x01); /* MODE.Exec: 64-bit */
	w->last_ip = 0;
	w->stack_n = 0;
	if (ip)
		pt_ip_full(w, PT_FUP, *ip);
	pt_byte(w, 0x02);
	pt_byte(w, 0x23); /* PSBEND */
	w->next_psb = pt_stream_pos(w) + w->psb_period;
}

/* Tracing starts, or resumes after the kernel, at `ip`. */
static inline void pt_start(struct pt_writer *w, uint64_t ip)
{
	if (!w->started) {
		pt_psb(w, NULL);
		w->started = 1;
	} else {
		pt_flush_tnt(w);
		pt_tsc(w);
	}
	pt_byte(w, 0x99);
	pt_byte(w, 0x01);
	pt_ip_packet(w, PT_TIP_PGE, ip);
	w->enabled = 1;
}

/* A periodic PSB+ when due; `ip` is the next instruction to run. */
static inline void pt_maybe_psb(struct pt_writer *w, uint64_t ip)
{
	if (pt_stream_pos(w) >= w->next_psb && w->enabled)
		pt_psb(w, &ip);
}

static inline void pt_request_psb(struct pt_writer *w)
{
	w->next_psb = pt_stream_pos(w);
}

static inline void pt_cond(struct pt_writer *w, int taken)
{
	pt_cyc(w, 0);
	w->tnt_bits = (w->tnt_bits << 1) | (taken ? 1u : 0u);
	if (++w->tnt_n == 6)
		pt_flush_tnt(w);
}

static inline void pt_push(struct pt_writer *w, uint64_t return_address)
{
	w->stack_top = (w->stack_top + 1) % PT_RET_STACK;
	w->stack[w->stack_top] = return_address;
	if (w->stack_n < PT_RET_STACK)
		w->stack_n++;
}

static inline void pt_indirect(struct pt_writer *w, uint64_t target)
{
	pt_cyc(w, 0);
	pt_flush_tnt(w);
	pt_ip_packet(w, PT_TIP, target);
}

static inline void pt_ret(struct pt_writer *w, uint64_t target)
{
	if (w->stack_n) {
		uint64_t top = w->stack[w->stack_top];
		w->stack_top = (w->stack_top + PT_RET_STACK - 1) % PT_RET_STACK;
		w->stack_n--;
		if (top == target) {
			pt_cond(w, 1);
			return;
		}
	}
	pt_indirect(w, target);
}

/* The thread enters the kernel by a system call: TIP.PGD with the IP suppressed. */
static inline void pt_disable(struct pt_writer *w)
{
	pt_cyc(w, 0);
	pt_flush_tnt(w);
	pt_byte(w, PT_TIP_PGD);
	w->enabled = 0;
}

/* An asynchronous exit to the kernel before `ip` runs (a signal): FUP(ip), TIP.PGD. */
static inline void pt_interrupt(struct pt_writer *w, uint64_t ip)
{
	pt_cyc(w, 0);
	pt_flush_tnt(w);
	pt_ip_packet(w, PT_FUP, ip);
	pt_byte(w, PT_TIP_PGD);
	w->enabled = 0;
}

/* The provisional end after the last packet: pending TNT bits, FUP(ip) and TIP.PGD while
   tracing is on (the thread is about to run `ip`), nothing but zeros while it is off. It is
   written after every block, so it is cheap: the FUP carries the whole IP (6 bytes,
   sign-extended: no compression to work out) and the bytes go in two 8-byte stores. */
static inline void pt_tail(struct pt_writer *w, uint64_t ip)
{
	uint64_t lo = 0, hi = 0;
	if (w->enabled) {
		lo = (uint64_t)(0x60 | PT_FUP) | (ip & 0xffffffffffffULL) << 8 |
		     (uint64_t)PT_TIP_PGD << 56;
		if (w->tnt_n) {
			hi = lo >> 56;
			lo = lo << 8 | (uint8_t)((1u << (w->tnt_n + 1)) | (w->tnt_bits << 1));
		}
	}
	memcpy(w->buf + w->pos, &lo, 8);
	memcpy(w->buf + w->pos + 8, &hi, 8);
}

#endif
