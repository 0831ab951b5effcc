/* Intel PT packets: bytes -> one packet at a time (the own decoder's first layer).
 *
 * The packet formats are those of the Intel SDM (volume 3C, "Intel Processor Trace",
 * section "Packet Definitions"); what counts as a bad packet, and how payloads are kept,
 * follows perf 6.1's packet decoder, so that the same bytes give the same packets and
 * the same errors (tests/native/test_pt_packets.py compares every packet of recordings
 * with `perf script -D`). No decoding state lives here but the block context of BBP/BIP
 * (a BIP header is only one after a BBP), which the caller keeps.
 *
 * pt_packet_next() is inline: the walker calls it for every packet, and the common ones
 * (TNT, CYC, TIP/FUP, PAD) take a few instructions; the rest go to pt_packet_other().
 */
#ifndef PTSCOPE_PT_PACKET_H
#define PTSCOPE_PT_PACKET_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum pt_packet_type {
	PT_PKT_BAD,	/* not a packet (the decoder's "bad packet" error) */
	PT_PKT_PAD,
	PT_PKT_TNT,	/* short or long: `count` bits, the oldest in bit 63 of `payload` */
	PT_PKT_TIP_PGD,
	PT_PKT_TIP_PGE,
	PT_PKT_TIP,
	PT_PKT_FUP,	/* IP packets: `count` is the IPBytes field, `payload` its raw bytes */
	PT_PKT_PSB,
	PT_PKT_PSBEND,
	PT_PKT_MODE_EXEC, /* payload: 16, 32 or 64 (bits); count: the IF bit */
	PT_PKT_MODE_TSX,  /* payload: bit 0 InTX, bit 1 TXAbort */
	PT_PKT_PIP,	/* payload: CR3; count: the NR bit */
	PT_PKT_TSC,	/* payload: the 56-bit TSC */
	PT_PKT_MTC,	/* payload: the 8-bit CTC */
	PT_PKT_TMA,	/* payload: CTC[15:0]; count: the fast counter (9 bits) */
	PT_PKT_CYC,	/* payload: the cycle count */
	PT_PKT_CBR,	/* payload: the core:bus ratio and the byte after it (as perf reads it) */
	PT_PKT_VMCS,	/* payload: the VMCS base address */
	PT_PKT_OVF,
	PT_PKT_MNT,	/* payload: 8 bytes */
	PT_PKT_PTWRITE, /* payload: 4 or 8 bytes (count); ip: its IP bit */
	PT_PKT_EXSTOP,	/* ip: its IP bit */
	PT_PKT_MWAIT,	/* payload: hints (bits 0-31) and extensions (32-63) */
	PT_PKT_PWRE,	/* payload: the packet's two bytes (hw, resolved C-state) */
	PT_PKT_PWRX,	/* payload: the packet's five bytes */
	PT_PKT_BBP,	/* payload: the block type; count: 8 (SZ set) or 4: BIP size */
	PT_PKT_BIP,	/* payload: the value; count: the id */
	PT_PKT_BEP,	/* ip: its IP bit */
	PT_PKT_CFE,	/* payload: the vector; count: the type; ip: its IP bit */
	PT_PKT_EVD,	/* payload: 8 bytes; count: the type */
	PT_PKT_TRACESTOP,
	PT_PKT_TYPES
};

struct pt_packet {
	uint8_t type;
	uint8_t size;  /* bytes it took */
	uint8_t count; /* see the types */
	uint8_t ip;    /* PTWRITE, EXSTOP, BEP, CFE: the packet's IP bit */
	uint64_t payload;
};

/* pt_packet_next's results besides a packet's size. */
#define PT_NEED_MORE 0 /* the buffer ends inside a packet */

/* Block context (after a BBP): BIP headers are read as BIP, not TNT. */
struct pt_packet_ctx {
	uint8_t in_block; /* 0, or the BIP size (4 or 8) */
};

/* The context after a packet: a BBP opens a block, packets that may come between a
 * block's items keep it, any other closes it. */
static inline void pt_packet_update_ctx(struct pt_packet_ctx *ctx, const struct pt_packet *pkt)
{
	switch (pkt->type) {
	case PT_PKT_BBP:
		ctx->in_block = pkt->count;
		break;
	case PT_PKT_BAD: case PT_PKT_PAD: case PT_PKT_TSC: case PT_PKT_TMA: case PT_PKT_MTC:
	case PT_PKT_FUP: case PT_PKT_CYC: case PT_PKT_CBR: case PT_PKT_MNT: case PT_PKT_EXSTOP:
	case PT_PKT_PWRE: case PT_PKT_PWRX: case PT_PKT_BIP:
		break;
	default:
		ctx->in_block = 0;
	}
}

/* The packet at buf (len bytes readable) into *pkt; returns its size, or PT_NEED_MORE.
 * A bad packet is type PT_PKT_BAD with size 1. */
size_t pt_packet_other(const uint8_t *buf, size_t len, struct pt_packet_ctx *ctx,
		       struct pt_packet *pkt);

static inline uint64_t pt_le_bytes(const uint8_t *p, size_t n)
{
	uint64_t v = 0;
	memcpy(&v, p, n);
	return v;
}

/* How many IP bytes an IP packet's IPBytes field says (0: suppressed), -1: reserved. */
static inline int pt_ip_bytes(unsigned ipbytes)
{
	static const signed char n[8] = {0, 2, 4, 6, 6, -1, 8, -1};
	return n[ipbytes & 7];
}

static inline size_t pt_packet_next(const uint8_t *buf, size_t len, struct pt_packet_ctx *ctx,
				    struct pt_packet *pkt)
{
	if (!len)
		return PT_NEED_MORE;
	uint8_t b = buf[0];
	if (ctx->in_block && (b & 7) == 4)
		return pt_packet_other(buf, len, ctx, pkt);
	if ((b & 1) == 0) {
		if (b > 2) { /* short TNT: bits below the stop bit, oldest highest */
			int top = 31 - __builtin_clz((unsigned)b);
			pkt->type = PT_PKT_TNT;
			pkt->size = 1;
			pkt->count = (uint8_t)(top - 1);
			pkt->payload = (uint64_t)(b >> 1) << (64 - top + 1);
			return 1;
		}
		if (b == 0) {
			pkt->type = PT_PKT_PAD;
			pkt->size = 1;
			return 1;
		}
		return pt_packet_other(buf, len, ctx, pkt);
	}
	if ((b & 3) == 3) { /* CYC */
		uint64_t v = b >> 3;
		size_t i = 1;
		if (b & 4) {
			unsigned shift = 5;
			for (;;) {
				if (i > 9) { /* at most 10 bytes */
					pkt->type = PT_PKT_BAD;
					pkt->size = 1;
					return 1;
				}
				if (i >= len)
					return PT_NEED_MORE;
				uint8_t c = buf[i++];
				if (shift < 64)
					v |= (uint64_t)(c >> 1) << shift;
				shift += 7;
				if (!(c & 1))
					break;
			}
		}
		pkt->type = PT_PKT_CYC;
		pkt->size = (uint8_t)i;
		pkt->payload = v;
		return i;
	}
	unsigned low = b & 0x1f;
	if (low == 0x0d || low == 0x11 || low == 0x01 || low == 0x1d) {
		int n = pt_ip_bytes(b >> 5);
		if (n < 0) {
			pkt->type = PT_PKT_BAD;
			pkt->size = 1;
			return 1;
		}
		if ((size_t)n + 1 > len)
			return PT_NEED_MORE;
		pkt->type = low == 0x0d ? PT_PKT_TIP
			    : low == 0x11 ? PT_PKT_TIP_PGE
			    : low == 0x01 ? PT_PKT_TIP_PGD
					  : PT_PKT_FUP;
		pkt->size = (uint8_t)(n + 1);
		pkt->count = (uint8_t)(b >> 5);
		pkt->payload = n ? pt_le_bytes(buf + 1, (size_t)n) : 0;
		return (size_t)n + 1;
	}
	return pt_packet_other(buf, len, ctx, pkt);
}

/* An IP packet's IP given the last IP (the SDM's IP compression). */
static inline uint64_t pt_packet_ip(const struct pt_packet *pkt, uint64_t last_ip)
{
	switch (pkt->count) {
	case 1:
		return (last_ip & ~UINT64_C(0xffff)) | pkt->payload;
	case 2:
		return (last_ip & ~UINT64_C(0xffffffff)) | pkt->payload;
	case 3: /* 48 bits, sign-extended */
		return (uint64_t)((int64_t)(pkt->payload << 16) >> 16);
	case 4:
		return (last_ip & ~UINT64_C(0xffffffffffff)) | pkt->payload;
	case 6:
		return pkt->payload;
	default:
		return last_ip;
	}
}

#endif
