/* Branch classification of x86-64 instructions (see x86_branch.h for the rules' origin). */
#include "x86_branch.h"

static int legacy_prefix(uint8_t b)
{
	switch (b) {
	case 0x66: case 0x67: case 0xf2: case 0xf3: case 0xf0:
	case 0x2e: case 0x36: case 0x3e: case 0x26: case 0x64: case 0x65:
		return 1;
	default:
		return 0;
	}
}

static int rep_string_opcode(uint8_t op)
{
	return (op >= 0x6c && op <= 0x6f) || (op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf);
}

/* A little-endian signed displacement of 1, 2 or 4 bytes (whatever the encoding left). */
static int64_t displacement(const uint8_t *p, size_t n)
{
	if (n >= 4)
		return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
				 (uint32_t)p[3] << 24);
	if (n >= 2)
		return (int16_t)((uint16_t)p[0] | (uint16_t)p[1] << 8);
	if (n == 1)
		return (int8_t)p[0];
	return 0;
}

void x86_classify(const uint8_t *code, size_t len, uint64_t pc, struct branch_info *out)
{
	size_t i = 0;
	int rep = 0;
	uint64_t end = pc + len;

	out->kind = BK_OTHER;
	out->rep = 0;
	out->zero_call = 0;
	out->target = 0;
	while (i < len && legacy_prefix(code[i])) {
		rep |= code[i] == 0xf2 || code[i] == 0xf3;
		i++;
	}
	if (i < len && (code[i] & 0xf0) == 0x40) /* REX */
		i++;
	if (i >= len)
		return;
	uint8_t op = code[i];
	if (op == 0xc4 || op == 0xc5 || op == 0x62) /* VEX, EVEX: never a branch */
		return;
	if ((op >= 0x70 && op <= 0x7f) || (op >= 0xe0 && op <= 0xe3)) {
		/* The displacement of a relative branch is always the instruction's last bytes. */
		out->kind = BK_COND;
		out->target = end + (uint64_t)(int64_t)(int8_t)code[len - 1];
	} else if (op == 0x0f && i + 1 < len) {
		uint8_t op2 = code[i + 1];
		if (op2 >= 0x80 && op2 <= 0x8f) {
			out->kind = BK_COND;
			out->target = end + (uint64_t)displacement(code + i + 2, len - i - 2);
		} else if (op2 == 0x05 || op2 == 0x34) {
			out->kind = BK_SYSCALL;
		} else if (op2 == 0x07 || op2 == 0x35) {
			out->kind = BK_OTHER_IND;
		}
	} else if (op == 0xe8) {
		int64_t rel = displacement(code + i + 1, len - i - 1);
		out->kind = BK_CALL;
		out->target = end + (uint64_t)rel;
		out->zero_call = rel == 0;
	} else if (op == 0xe9 || op == 0xeb) {
		out->kind = BK_JUMP;
		out->target = end + (uint64_t)displacement(code + i + 1, len - i - 1);
	} else if (op == 0xea) {
		out->kind = BK_JUMP_IND;
	} else if (op == 0xc2 || op == 0xc3 || op == 0xca || op == 0xcb) {
		out->kind = BK_RET;
	} else if (op >= 0xcc && op <= 0xcf) {
		out->kind = BK_OTHER_IND;
	} else if (op == 0xff && i + 1 < len) {
		int reg = (code[i + 1] >> 3) & 7;
		if (reg == 2 || reg == 3)
			out->kind = BK_CALL_IND;
		else if (reg == 4 || reg == 5)
			out->kind = BK_JUMP_IND;
	} else if (rep && rep_string_opcode(op)) {
		out->rep = 1;
	}
}
