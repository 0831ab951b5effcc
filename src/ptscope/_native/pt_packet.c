/* Intel PT packets other than the common ones pt_packet_next() reads inline: the
 * extended (0x02 ...) packets, TSC, MTC, MODE and BIP. See pt_packet.h. */
#include "pt_packet.h"

static size_t bad(struct pt_packet *pkt)
{
	pkt->type = PT_PKT_BAD;
	pkt->size = 1;
	pkt->count = 0;
	pkt->payload = 0;
	return 1;
}

static size_t got(struct pt_packet *pkt, int type, size_t size, uint64_t payload)
{
	pkt->type = (uint8_t)type;
	pkt->size = (uint8_t)size;
	pkt->count = 0;
	pkt->ip = 0;
	pkt->payload = payload;
	return size;
}

/* The 0x02-prefixed packets. */
static size_t extended(const uint8_t *buf, size_t len, struct pt_packet_ctx *ctx,
		       struct pt_packet *pkt)
{
	if (len < 2)
		return PT_NEED_MORE;
	uint8_t b = buf[1];
	switch (b) {
	case 0x82: /* PSB: 02 82 repeated 8 times */
		if (len < 16)
			return PT_NEED_MORE;
		for (size_t i = 2; i < 16; i += 2)
			if (buf[i] != 0x02 || buf[i + 1] != 0x82)
				return bad(pkt);
		return got(pkt, PT_PKT_PSB, 16, 0);
	case 0x23:
		return got(pkt, PT_PKT_PSBEND, 2, 0);
	case 0xf3:
		return got(pkt, PT_PKT_OVF, 2, 0);
	case 0x03: /* CBR: 02 03 ratio, then a byte perf keeps in the payload too */
		if (len < 4)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_CBR, 4, pt_le_bytes(buf + 2, 2));
	case 0xa3: { /* long TNT: 47 bits and a stop bit in 6 bytes */
		if (len < 8)
			return PT_NEED_MORE;
		uint64_t v = pt_le_bytes(buf + 2, 6);
		int top = v ? 63 - __builtin_clzll(v) : 0; /* the stop bit; no bits: none */
		got(pkt, PT_PKT_TNT, 8, top ? v << (64 - top) : 0);
		pkt->count = (uint8_t)top;
		return 8;
	}
	case 0x43: { /* PIP: CR3[51:5] in bits 63:5 of 6 bytes, NR in bit 0 */
		if (len < 8)
			return PT_NEED_MORE;
		uint64_t v = pt_le_bytes(buf + 2, 6);
		got(pkt, PT_PKT_PIP, 8, (v >> 1) << 5);
		pkt->count = (uint8_t)(v & 1);
		return 8;
	}
	case 0xc8: /* VMCS: 5 bytes, the address >> 12 */
		if (len < 7)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_VMCS, 7, pt_le_bytes(buf + 2, 5) << 12);
	case 0x73: /* TMA: CTC[15:0], a reserved byte, FC[7:0], FC[8] in bit 0 */
		if (len < 7)
			return PT_NEED_MORE;
		/* the fast counter has 9 bits: its low 8 in `count`, its high one in `ip` */
		got(pkt, PT_PKT_TMA, 7, (uint64_t)buf[2] | (uint64_t)buf[3] << 8);
		pkt->count = buf[5];
		pkt->ip = buf[6] & 1;
		return 7;
	case 0xc3: /* MNT: 02 C3 88 + 8 bytes */
		if (len < 11)
			return PT_NEED_MORE;
		if (buf[2] != 0x88)
			return bad(pkt);
		return got(pkt, PT_PKT_MNT, 11, pt_le_bytes(buf + 3, 8));
	case 0x62:
	case 0xe2: /* EXSTOP, with its IP bit */
		got(pkt, PT_PKT_EXSTOP, 2, 0);
		pkt->ip = b >> 7;
		return 2;
	case 0xc2: /* MWAIT: hints (4 bytes), extensions (4 bytes) */
		if (len < 10)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_MWAIT, 10, pt_le_bytes(buf + 2, 8));
	case 0x22: /* PWRE */
		if (len < 4)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_PWRE, 4, pt_le_bytes(buf + 2, 2));
	case 0xa2: /* PWRX */
		if (len < 7)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_PWRX, 7, pt_le_bytes(buf + 2, 5));
	case 0x63: /* BBP: SZ bit 7, type bits 4:0 */
		if (len < 3)
			return PT_NEED_MORE;
		got(pkt, PT_PKT_BBP, 3, buf[2] & 0x1f);
		pkt->count = buf[2] & 0x80 ? 4 : 8;
		return 3;
	case 0x83:
		return got(pkt, PT_PKT_TRACESTOP, 2, 0);
	case 0x33:
	case 0xb3: /* BEP, with its IP bit */
		got(pkt, PT_PKT_BEP, 2, 0);
		pkt->ip = b >> 7;
		return 2;
	case 0x13: /* CFE: IP bit 7 and type bits 4:0 of byte 2, vector (byte 3) */
		if (len < 4)
			return PT_NEED_MORE;
		got(pkt, PT_PKT_CFE, 4, buf[3]);
		pkt->count = buf[2] & 0x1f;
		pkt->ip = buf[2] >> 7;
		return 4;
	case 0x53: /* EVD: type (bits 5:0 of byte 2), 8 bytes of payload */
		if (len < 11)
			return PT_NEED_MORE;
		got(pkt, PT_PKT_EVD, 11, pt_le_bytes(buf + 3, 8));
		pkt->count = buf[2] & 0x3f;
		return 11;
	default:
		break;
	}
	if ((b & 0x1f) == 0x12) { /* PTWRITE: IP bit 7, payload size bits 6:5 */
		unsigned plc = (b >> 5) & 3;
		if (plc > 1)
			return bad(pkt);
		size_t n = plc ? 8 : 4;
		if (len < 2 + n)
			return PT_NEED_MORE;
		got(pkt, PT_PKT_PTWRITE, 2 + n, pt_le_bytes(buf + 2, n));
		pkt->count = (uint8_t)n;
		pkt->ip = b >> 7;
		return 2 + n;
	}
	return bad(pkt);
}

size_t pt_packet_other(const uint8_t *buf, size_t len, struct pt_packet_ctx *ctx,
		       struct pt_packet *pkt)
{
	if (!len)
		return PT_NEED_MORE;
	uint8_t b = buf[0];
	if (ctx->in_block && (b & 7) == 4) { /* BIP: id in bits 7:3 */
		size_t n = ctx->in_block;
		if (len < 1 + n)
			return PT_NEED_MORE;
		got(pkt, PT_PKT_BIP, 1 + n, pt_le_bytes(buf + 1, n));
		pkt->count = b >> 3;
		return 1 + n;
	}
	switch (b) {
	case 0x02:
		return extended(buf, len, ctx, pkt);
	case 0x19: /* TSC: 7 bytes */
		if (len < 8)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_TSC, 8, pt_le_bytes(buf + 1, 7));
	case 0x59: /* MTC */
		if (len < 2)
			return PT_NEED_MORE;
		return got(pkt, PT_PKT_MTC, 2, buf[1]);
	case 0x99: { /* MODE: leaf in bits 7:5 of the payload */
		if (len < 2)
			return PT_NEED_MORE;
		uint8_t p = buf[1];
		switch (p >> 5) {
		case 0: {
			static const uint8_t bits[4] = {16, 64, 32, 0};
			if (!bits[p & 3])
				return bad(pkt);
			got(pkt, PT_PKT_MODE_EXEC, 2, bits[p & 3]);
			pkt->count = (p >> 2) & 1; /* IF */
			return 2;
		}
		case 1:
			if ((p & 3) == 3)
				return bad(pkt);
			return got(pkt, PT_PKT_MODE_TSX, 2, p & 3);
		default:
			return bad(pkt);
		}
	}
	default:
		break;
	}
	/* What pt_packet_next() reads inline, for callers that start here. */
	struct pt_packet_ctx none = {0};
	if (ctx->in_block || (b != 0x02 && ((b & 1) == 0 || (b & 3) == 3 ||
					     (b & 0x1f) == 0x0d || (b & 0x1f) == 0x11 ||
					     (b & 0x1f) == 0x01 || (b & 0x1f) == 0x1d)))
		return pt_packet_next(buf, len, &none, pkt);
	return bad(pkt);
}
