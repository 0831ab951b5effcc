/* Lengths of x86-64 instructions (64-bit mode), from the encoding rules of the Intel SDM
 * (volume 2, chapter 2 "Instruction format" and appendix A "Opcode map").
 *
 * Only the length is decoded: prefixes, REX, the VEX/EVEX/XOP prefixes, the opcode (one
 * byte, 0F xx, 0F 38 xx, 0F 3A xx, or a VEX/EVEX/XOP map), ModRM, SIB, displacement and
 * immediate. The dlfilter uses it to count the instructions of a basic block the first
 * time the block runs (see "Instruction detail" in docs/architecture.md); the test suite
 * compares it with capstone on every instruction of real binaries.
 */
#include "x86_length.h"

/* What follows an opcode. */
enum {
	F_MODRM = 1 << 0,  /* a ModRM byte (with SIB and displacement as it says) */
	F_I8 = 1 << 1,     /* an 8-bit immediate */
	F_I16 = 1 << 2,    /* a 16-bit immediate */
	F_IZ = 1 << 3,     /* a 16-bit immediate with operand size 16 (66), else 32-bit */
	F_IV = 1 << 4,     /* like F_IZ, but 64-bit with REX.W (MOV r64, imm64) */
	F_REL32 = 1 << 5,  /* a 32-bit displacement: near jumps and calls ignore 66 in 64-bit
			    * mode on Intel processors (capstone agrees) */
	F_MOFFS = 1 << 6,  /* a memory offset of the address size: 8 bytes, 4 with 67 */
	F_GROUP3 = 1 << 7, /* F6/F7: the TEST forms (/0, /1) take an immediate */
	F_BAD = 1 << 8,    /* invalid in 64-bit mode (or not an instruction of its own) */
};

/* The one-byte opcode map. Prefixes, REX and the VEX/EVEX escapes are handled before. */
static const uint16_t one_byte[256] = {
	/* 00-3F: the ALU block: xx0-xx3 r/m forms, xx4 AL,imm8, xx5 eAX,immz; the rest are
	 * invalid in 64-bit mode, prefixes or the 0F escape. */
	[0x00] = F_MODRM, [0x01] = F_MODRM, [0x02] = F_MODRM, [0x03] = F_MODRM,
	[0x04] = F_I8, [0x05] = F_IZ, [0x06] = F_BAD, [0x07] = F_BAD,
	[0x08] = F_MODRM, [0x09] = F_MODRM, [0x0A] = F_MODRM, [0x0B] = F_MODRM,
	[0x0C] = F_I8, [0x0D] = F_IZ, [0x0E] = F_BAD,
	[0x10] = F_MODRM, [0x11] = F_MODRM, [0x12] = F_MODRM, [0x13] = F_MODRM,
	[0x14] = F_I8, [0x15] = F_IZ, [0x16] = F_BAD, [0x17] = F_BAD,
	[0x18] = F_MODRM, [0x19] = F_MODRM, [0x1A] = F_MODRM, [0x1B] = F_MODRM,
	[0x1C] = F_I8, [0x1D] = F_IZ, [0x1E] = F_BAD, [0x1F] = F_BAD,
	[0x20] = F_MODRM, [0x21] = F_MODRM, [0x22] = F_MODRM, [0x23] = F_MODRM,
	[0x24] = F_I8, [0x25] = F_IZ, [0x27] = F_BAD,
	[0x28] = F_MODRM, [0x29] = F_MODRM, [0x2A] = F_MODRM, [0x2B] = F_MODRM,
	[0x2C] = F_I8, [0x2D] = F_IZ, [0x2F] = F_BAD,
	[0x30] = F_MODRM, [0x31] = F_MODRM, [0x32] = F_MODRM, [0x33] = F_MODRM,
	[0x34] = F_I8, [0x35] = F_IZ, [0x37] = F_BAD,
	[0x38] = F_MODRM, [0x39] = F_MODRM, [0x3A] = F_MODRM, [0x3B] = F_MODRM,
	[0x3C] = F_I8, [0x3D] = F_IZ, [0x3F] = F_BAD,
	/* 50-5F push/pop: nothing follows. */
	[0x60] = F_BAD, [0x61] = F_BAD, [0x63] = F_MODRM, /* MOVSXD */
	[0x68] = F_IZ, [0x69] = F_MODRM | F_IZ, [0x6A] = F_I8, [0x6B] = F_MODRM | F_I8,
	/* 70-7F: Jcc rel8 */
	[0x70] = F_I8, [0x71] = F_I8, [0x72] = F_I8, [0x73] = F_I8,
	[0x74] = F_I8, [0x75] = F_I8, [0x76] = F_I8, [0x77] = F_I8,
	[0x78] = F_I8, [0x79] = F_I8, [0x7A] = F_I8, [0x7B] = F_I8,
	[0x7C] = F_I8, [0x7D] = F_I8, [0x7E] = F_I8, [0x7F] = F_I8,
	/* 80-8F: group 1 (imm8 / immz), TEST, XCHG, MOV, LEA, MOV Sreg, POP r/m */
	[0x80] = F_MODRM | F_I8, [0x81] = F_MODRM | F_IZ, [0x82] = F_BAD,
	[0x83] = F_MODRM | F_I8,
	[0x84] = F_MODRM, [0x85] = F_MODRM, [0x86] = F_MODRM, [0x87] = F_MODRM,
	[0x88] = F_MODRM, [0x89] = F_MODRM, [0x8A] = F_MODRM, [0x8B] = F_MODRM,
	[0x8C] = F_MODRM, [0x8D] = F_MODRM, [0x8E] = F_MODRM, [0x8F] = F_MODRM,
	/* 90-9F: XCHG, CBW..., FWAIT (9B: an instruction of its own), PUSHF... */
	[0x9A] = F_BAD, /* far call ptr16:32 */
	[0xA0] = F_MOFFS, [0xA1] = F_MOFFS, [0xA2] = F_MOFFS, [0xA3] = F_MOFFS,
	[0xA8] = F_I8, [0xA9] = F_IZ,
	[0xB0] = F_I8, [0xB1] = F_I8, [0xB2] = F_I8, [0xB3] = F_I8,
	[0xB4] = F_I8, [0xB5] = F_I8, [0xB6] = F_I8, [0xB7] = F_I8,
	[0xB8] = F_IV, [0xB9] = F_IV, [0xBA] = F_IV, [0xBB] = F_IV,
	[0xBC] = F_IV, [0xBD] = F_IV, [0xBE] = F_IV, [0xBF] = F_IV,
	[0xC0] = F_MODRM | F_I8, [0xC1] = F_MODRM | F_I8, [0xC2] = F_I16, /* RET imm16 */
	[0xC6] = F_MODRM | F_I8, [0xC7] = F_MODRM | F_IZ, /* MOV r/m, imm; XABORT; XBEGIN */
	[0xC8] = F_I16 | F_I8, /* ENTER imm16, imm8 */
	[0xCA] = F_I16, [0xCD] = F_I8, [0xCE] = F_BAD,
	[0xD0] = F_MODRM, [0xD1] = F_MODRM, [0xD2] = F_MODRM, [0xD3] = F_MODRM,
	[0xD4] = F_BAD, [0xD5] = F_BAD, [0xD6] = F_BAD,
	/* D8-DF: x87 escapes */
	[0xD8] = F_MODRM, [0xD9] = F_MODRM, [0xDA] = F_MODRM, [0xDB] = F_MODRM,
	[0xDC] = F_MODRM, [0xDD] = F_MODRM, [0xDE] = F_MODRM, [0xDF] = F_MODRM,
	/* E0-E3 LOOPcc/JrCXZ rel8, E4-E7 IN/OUT imm8, E8 CALL, E9 JMP, EB JMP rel8 */
	[0xE0] = F_I8, [0xE1] = F_I8, [0xE2] = F_I8, [0xE3] = F_I8,
	[0xE4] = F_I8, [0xE5] = F_I8, [0xE6] = F_I8, [0xE7] = F_I8,
	[0xE8] = F_REL32, [0xE9] = F_REL32, [0xEA] = F_BAD, [0xEB] = F_I8,
	[0xF6] = F_MODRM | F_GROUP3, [0xF7] = F_MODRM | F_GROUP3,
	[0xFE] = F_MODRM, [0xFF] = F_MODRM,
};

/* The two-byte map (0F xx); 0F 38 and 0F 3A are separate maps. */
static const uint16_t two_byte[256] = {
	[0x00] = F_MODRM, [0x01] = F_MODRM, [0x02] = F_MODRM, [0x03] = F_MODRM,
	[0x04] = F_BAD, /* 05 SYSCALL 06 CLTS 07 SYSRET 08 INVD 09 WBINVD: nothing follows */
	[0x0A] = F_BAD, /* 0B UD2 */ [0x0C] = F_BAD, [0x0D] = F_MODRM, /* 0E FEMMS */
	[0x0F] = F_MODRM | F_I8, /* 3DNow!: the opcode comes last, as an imm8 */
	[0x10] = F_MODRM, [0x11] = F_MODRM, [0x12] = F_MODRM, [0x13] = F_MODRM,
	[0x14] = F_MODRM, [0x15] = F_MODRM, [0x16] = F_MODRM, [0x17] = F_MODRM,
	[0x18] = F_MODRM, [0x19] = F_MODRM, [0x1A] = F_MODRM, [0x1B] = F_MODRM,
	[0x1C] = F_MODRM, [0x1D] = F_MODRM, [0x1E] = F_MODRM, [0x1F] = F_MODRM,
	/* 20-23 MOV to/from CR/DR: see mov_control below */
	[0x20] = F_MODRM, [0x21] = F_MODRM, [0x22] = F_MODRM, [0x23] = F_MODRM,
	[0x24] = F_BAD, [0x25] = F_BAD, [0x26] = F_BAD, [0x27] = F_BAD,
	[0x28] = F_MODRM, [0x29] = F_MODRM, [0x2A] = F_MODRM, [0x2B] = F_MODRM,
	[0x2C] = F_MODRM, [0x2D] = F_MODRM, [0x2E] = F_MODRM, [0x2F] = F_MODRM,
	/* 30-35, 37: WRMSR RDTSC RDMSR RDPMC SYSENTER SYSEXIT GETSEC; 38/3A: escapes */
	[0x36] = F_BAD, [0x39] = F_BAD, [0x3B] = F_BAD, [0x3C] = F_BAD, [0x3D] = F_BAD,
	[0x3E] = F_BAD, [0x3F] = F_BAD,
	/* 40-4F CMOVcc */
	[0x40] = F_MODRM, [0x41] = F_MODRM, [0x42] = F_MODRM, [0x43] = F_MODRM,
	[0x44] = F_MODRM, [0x45] = F_MODRM, [0x46] = F_MODRM, [0x47] = F_MODRM,
	[0x48] = F_MODRM, [0x49] = F_MODRM, [0x4A] = F_MODRM, [0x4B] = F_MODRM,
	[0x4C] = F_MODRM, [0x4D] = F_MODRM, [0x4E] = F_MODRM, [0x4F] = F_MODRM,
	/* 50-7F SSE/MMX: ModRM; 70-73 with imm8; 77 EMMS alone */
	[0x50] = F_MODRM, [0x51] = F_MODRM, [0x52] = F_MODRM, [0x53] = F_MODRM,
	[0x54] = F_MODRM, [0x55] = F_MODRM, [0x56] = F_MODRM, [0x57] = F_MODRM,
	[0x58] = F_MODRM, [0x59] = F_MODRM, [0x5A] = F_MODRM, [0x5B] = F_MODRM,
	[0x5C] = F_MODRM, [0x5D] = F_MODRM, [0x5E] = F_MODRM, [0x5F] = F_MODRM,
	[0x60] = F_MODRM, [0x61] = F_MODRM, [0x62] = F_MODRM, [0x63] = F_MODRM,
	[0x64] = F_MODRM, [0x65] = F_MODRM, [0x66] = F_MODRM, [0x67] = F_MODRM,
	[0x68] = F_MODRM, [0x69] = F_MODRM, [0x6A] = F_MODRM, [0x6B] = F_MODRM,
	[0x6C] = F_MODRM, [0x6D] = F_MODRM, [0x6E] = F_MODRM, [0x6F] = F_MODRM,
	[0x70] = F_MODRM | F_I8, [0x71] = F_MODRM | F_I8, [0x72] = F_MODRM | F_I8,
	[0x73] = F_MODRM | F_I8, [0x74] = F_MODRM, [0x75] = F_MODRM, [0x76] = F_MODRM,
	[0x78] = F_MODRM, [0x79] = F_MODRM, /* VMREAD/VMWRITE; SSE4a: see sse4a below */
	[0x7A] = F_BAD, [0x7B] = F_BAD,
	[0x7C] = F_MODRM, [0x7D] = F_MODRM, [0x7E] = F_MODRM, [0x7F] = F_MODRM,
	/* 80-8F Jcc rel32 */
	[0x80] = F_REL32, [0x81] = F_REL32, [0x82] = F_REL32, [0x83] = F_REL32,
	[0x84] = F_REL32, [0x85] = F_REL32, [0x86] = F_REL32, [0x87] = F_REL32,
	[0x88] = F_REL32, [0x89] = F_REL32, [0x8A] = F_REL32, [0x8B] = F_REL32,
	[0x8C] = F_REL32, [0x8D] = F_REL32, [0x8E] = F_REL32, [0x8F] = F_REL32,
	/* 90-9F SETcc */
	[0x90] = F_MODRM, [0x91] = F_MODRM, [0x92] = F_MODRM, [0x93] = F_MODRM,
	[0x94] = F_MODRM, [0x95] = F_MODRM, [0x96] = F_MODRM, [0x97] = F_MODRM,
	[0x98] = F_MODRM, [0x99] = F_MODRM, [0x9A] = F_MODRM, [0x9B] = F_MODRM,
	[0x9C] = F_MODRM, [0x9D] = F_MODRM, [0x9E] = F_MODRM, [0x9F] = F_MODRM,
	/* A0/A1 PUSH/POP FS, A2 CPUID, A8/A9 PUSH/POP GS, AA RSM: nothing follows */
	[0xA3] = F_MODRM, [0xA4] = F_MODRM | F_I8, [0xA5] = F_MODRM,
	[0xA6] = F_MODRM, [0xA7] = F_MODRM, /* VIA PadLock: XSHA*, XSTORE, XCRYPT* */
	[0xAB] = F_MODRM, [0xAC] = F_MODRM | F_I8, [0xAD] = F_MODRM,
	[0xAE] = F_MODRM, [0xAF] = F_MODRM,
	[0xB0] = F_MODRM, [0xB1] = F_MODRM, [0xB2] = F_MODRM, [0xB3] = F_MODRM,
	[0xB4] = F_MODRM, [0xB5] = F_MODRM, [0xB6] = F_MODRM, [0xB7] = F_MODRM,
	[0xB8] = F_MODRM, [0xB9] = F_MODRM, [0xBA] = F_MODRM | F_I8, [0xBB] = F_MODRM,
	[0xBC] = F_MODRM, [0xBD] = F_MODRM, [0xBE] = F_MODRM, [0xBF] = F_MODRM,
	[0xC0] = F_MODRM, [0xC1] = F_MODRM, [0xC2] = F_MODRM | F_I8, [0xC3] = F_MODRM,
	[0xC4] = F_MODRM | F_I8, [0xC5] = F_MODRM | F_I8, [0xC6] = F_MODRM | F_I8,
	[0xC7] = F_MODRM, /* C8-CF BSWAP */
	[0xD0] = F_MODRM, [0xD1] = F_MODRM, [0xD2] = F_MODRM, [0xD3] = F_MODRM,
	[0xD4] = F_MODRM, [0xD5] = F_MODRM, [0xD6] = F_MODRM, [0xD7] = F_MODRM,
	[0xD8] = F_MODRM, [0xD9] = F_MODRM, [0xDA] = F_MODRM, [0xDB] = F_MODRM,
	[0xDC] = F_MODRM, [0xDD] = F_MODRM, [0xDE] = F_MODRM, [0xDF] = F_MODRM,
	[0xE0] = F_MODRM, [0xE1] = F_MODRM, [0xE2] = F_MODRM, [0xE3] = F_MODRM,
	[0xE4] = F_MODRM, [0xE5] = F_MODRM, [0xE6] = F_MODRM, [0xE7] = F_MODRM,
	[0xE8] = F_MODRM, [0xE9] = F_MODRM, [0xEA] = F_MODRM, [0xEB] = F_MODRM,
	[0xEC] = F_MODRM, [0xED] = F_MODRM, [0xEE] = F_MODRM, [0xEF] = F_MODRM,
	[0xF0] = F_MODRM, [0xF1] = F_MODRM, [0xF2] = F_MODRM, [0xF3] = F_MODRM,
	[0xF4] = F_MODRM, [0xF5] = F_MODRM, [0xF6] = F_MODRM, [0xF7] = F_MODRM,
	[0xF8] = F_MODRM, [0xF9] = F_MODRM, [0xFA] = F_MODRM, [0xFB] = F_MODRM,
	[0xFC] = F_MODRM, [0xFD] = F_MODRM, [0xFE] = F_MODRM, [0xFF] = F_MODRM, /* UD0 */
};

static int is_legacy_prefix(uint8_t b)
{
	switch (b) {
	case 0xF0: case 0xF2: case 0xF3:                         /* LOCK, REPNE, REP */
	case 0x2E: case 0x36: case 0x3E: case 0x26: case 0x64: case 0x65: /* segments */
	case 0x66: case 0x67:                                    /* operand / address size */
		return 1;
	default:
		return 0;
	}
}

/* Bytes taken by a ModRM byte at p[0] and what it implies (SIB, displacement), or -1 if
 * `avail` ends first. 16-bit addressing does not exist in 64-bit mode (67 selects 32-bit
 * addressing, whose ModRM/SIB forms are those of 64-bit addressing). */
static int modrm_bytes(const uint8_t *p, size_t avail)
{
	if (avail < 1)
		return -1;
	uint8_t modrm = p[0];
	unsigned mod = modrm >> 6, rm = modrm & 7;
	int n = 1;
	if (mod == 3)
		return n;
	if (rm == 4) { /* a SIB byte */
		if (avail < 2)
			return -1;
		n = 2;
		if (mod == 0 && (p[1] & 7) == 5)
			return n + 4; /* no base: disp32 */
	} else if (mod == 0 && rm == 5) {
		return n + 4; /* RIP-relative disp32 */
	}
	if (mod == 1)
		n += 1;
	else if (mod == 2)
		n += 4;
	return n;
}

/* Whether an opcode of a VEX or EVEX map takes an imm8 (maps: 1 = 0F, 2 = 0F38, 3 = 0F3A). */
static int vex_imm8(unsigned map, uint8_t op)
{
	if (map == 3)
		return 1;
	if (map == 1)
		return (op >= 0x70 && op <= 0x73) || op == 0xC2 || op == 0xC4 || op == 0xC5 ||
		       op == 0xC6;
	return 0;
}

int ptscope_x86_length(const uint8_t *code, size_t avail)
{
	const uint8_t *p = code;
	const uint8_t *end = code + (avail < PTSCOPE_X86_MAX_LENGTH ? avail : PTSCOPE_X86_MAX_LENGTH);
	int opsize16 = 0, addr32 = 0, rex_w = 0, rep_f2 = 0;
	/* Legacy prefixes, then REX (a REX followed by another prefix is ignored). */
	for (;;) {
		if (p >= end)
			return avail < PTSCOPE_X86_MAX_LENGTH ? -1 : 0;
		uint8_t b = *p;
		if (is_legacy_prefix(b)) {
			opsize16 |= b == 0x66;
			addr32 |= b == 0x67;
			rep_f2 |= b == 0xF2;
			rex_w = 0;
			p++;
		} else if ((b & 0xF0) == 0x40) {
			rex_w = (b & 0x08) != 0;
			p++;
		} else {
			break;
		}
	}
	uint8_t op = *p++;
	uint16_t flags;
	int need_modrm, imm = 0;
	if (op == 0xC4 || op == 0xC5 || op == 0x62 ||
	    (op == 0x8F && p < end && (*p & 0x38) != 0)) {
		/* VEX (C4: 3 bytes, C5: 2 bytes), EVEX (62: 4 bytes), XOP (8F, map >= 8). */
		size_t payload = op == 0xC5 ? 1 : op == 0x62 ? 3 : 2;
		if ((size_t)(end - p) < payload + 1)
			goto short_input;
		unsigned map;
		if (op == 0xC5)
			map = 1;
		else if (op == 0x62)
			map = p[0] & 0x07;
		else
			map = p[0] & 0x1F;
		p += payload;
		uint8_t vop = *p++;
		if (op == 0x8F) { /* XOP: map 8 imm8, map 9 none, map 10 imm32 */
			if (map < 8 || map > 10)
				return 0;
			imm = map == 8 ? 1 : map == 10 ? 4 : 0;
			need_modrm = 1;
		} else if (op == 0x62) {
			if (map == 0 || map == 4 || map == 7)
				return 0;
			need_modrm = 1;
			imm = vex_imm8(map, vop);
		} else {
			if (map < 1 || map > 3)
				return 0;
			/* VZEROUPPER / VZEROALL are the only VEX instructions without ModRM. */
			need_modrm = !(map == 1 && vop == 0x77);
			imm = vex_imm8(map, vop);
		}
		if (need_modrm) {
			int m = modrm_bytes(p, (size_t)(end - p));
			if (m < 0)
				goto short_input;
			p += m;
		}
		p += imm;
		goto done;
	}
	if (op == 0x0F) {
		if (p >= end)
			goto short_input;
		uint8_t op2 = *p++;
		if (op2 == 0x38 || op2 == 0x3A) {
			/* Three-byte maps: everything has ModRM; 0F 3A has an imm8 too. */
			if (p >= end)
				goto short_input;
			p++;
			flags = F_MODRM | (op2 == 0x3A ? F_I8 : 0);
		} else {
			flags = two_byte[op2];
			if ((op2 & 0xFC) == 0x20) {
				/* MOV to/from control and debug registers: "the mod field is
				 * ignored": always a register operand, no SIB or displacement. */
				if (p >= end)
					goto short_input;
				p++;
				goto done;
			}
			if (op2 == 0x78 && (opsize16 || rep_f2))
				imm = 2; /* SSE4a EXTRQ/INSERTQ imm8, imm8 */
		}
	} else {
		flags = one_byte[op];
	}
	if (flags & F_BAD)
		return 0;
	if (flags & F_MODRM) {
		if (p >= end)
			goto short_input;
		uint8_t modrm = *p;
		int m = modrm_bytes(p, (size_t)(end - p));
		if (m < 0)
			goto short_input;
		p += m;
		if ((flags & F_GROUP3) && ((modrm >> 3) & 7) < 2)
			imm += op == 0xF6 ? 1 : opsize16 && !rex_w ? 2 : 4;
	}
	if (flags & F_I8)
		imm += 1;
	if (flags & F_I16)
		imm += 2;
	if (flags & F_IZ)
		imm += opsize16 && !rex_w ? 2 : 4;
	if (flags & F_IV)
		imm += rex_w ? 8 : opsize16 ? 2 : 4;
	if (flags & F_REL32)
		imm += 4;
	if (flags & F_MOFFS)
		imm += addr32 ? 4 : 8;
	p += imm;
done:
	if (p > code + PTSCOPE_X86_MAX_LENGTH)
		return 0;
	if ((size_t)(p - code) > avail)
		return -1;
	return (int)(p - code);
short_input:
	return avail < PTSCOPE_X86_MAX_LENGTH ? -1 : 0;
}

int ptscope_x86_split(const uint8_t *code, size_t avail, size_t size, uint32_t *before,
		      uint8_t *end_len)
{
	size_t pos = 0;
	uint32_t n = 0;
	while (pos < size) {
		int len = ptscope_x86_length(code + pos, avail - pos);
		if (len <= 0)
			return -1;
		pos += (size_t)len;
		n++;
	}
	if (pos != size)
		return -1;
	int len = pos < avail ? ptscope_x86_length(code + pos, avail - pos) : 0;
	*before = n;
	*end_len = len > 0 ? (uint8_t)len : 0;
	return 0;
}
