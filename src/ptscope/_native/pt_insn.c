/* The flow-of-control facts of an x86-64 instruction, for the own decoder's walker.
 *
 * Lengths come from x86_length.c (the SDM's encoding rules, tested against capstone on
 * every instruction of real binaries). The kind of branch follows the classification
 * perf's Intel PT decoder uses (so that both walk the same code the same way): after
 * the legacy prefixes and REX, any VEX/EVEX/XOP instruction is no branch; then by
 * opcode (docs/architecture.md, "The own decoder"). It shares no code with the
 * recorder's classifier (record/emulated/plugin/x86_branch.c): a bug shared by the
 * encoder and the decoder would make them agree on something wrong, and the tests
 * check this file against capstone instead (tests/native/test_pt_insn.py).
 */
#include "pt_insn.h"

#include "x86_length.h"

static int legacy_prefix(uint8_t b)
{
	switch (b) {
	case 0x26: case 0x2e: case 0x36: case 0x3e: case 0x64: case 0x65:
	case 0x66: case 0x67: case 0xf0: case 0xf2: case 0xf3:
		return 1;
	default:
		return 0;
	}
}

static int32_t rel_at(const uint8_t *p, unsigned n)
{
	switch (n) {
	case 1:
		return (int8_t)p[0];
	case 2:
		return (int16_t)(uint16_t)(p[0] | p[1] << 8);
	default:
		return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
				 (uint32_t)p[3] << 24);
	}
}

int pt_insn_decode(const uint8_t *code, size_t avail, struct pt_insn *out)
{
	out->kind = PT_INSN_OTHER;
	out->op = PT_OP_OTHER;
	out->far_ret = 0;
	out->interrupt = 0;
	out->rel = 0;
	size_t i = 0;
	while (i < avail && i < PTSCOPE_X86_MAX_LENGTH && legacy_prefix(code[i]))
		i++;
	size_t rex = i < avail && (code[i] & 0xf0) == 0x40 ? 1 : 0;
	size_t op_at = i + rex;
	if (op_at >= avail)
		return 0;
	uint8_t op = code[op_at];
	if (op == 0x9a || op == 0xea) {
		/* far call/jmp ptr16:32: invalid in 64-bit mode, but perf's decoder takes them
		 * (as indirect branches with a 6-byte pointer) */
		size_t len = op_at + 1 + 6;
		if (len > avail || len > PTSCOPE_X86_MAX_LENGTH)
			return 0;
		out->length = (uint8_t)len;
		out->kind = op == 0x9a ? PT_INSN_CALL_IND : PT_INSN_JMP_IND;
		out->op = op == 0x9a ? PT_OP_CALL : PT_OP_JMP;
		return 1;
	}
	int len = ptscope_x86_length(code, avail);
	if (len <= 0)
		return 0;
	out->length = (uint8_t)len;
	if (op == 0xc4 || op == 0xc5 || op == 0x62 || op == 0x8f) {
		/* VEX, EVEX (and XOP, 8F with ModRM.reg != 0): never a branch. 8F /0 is POP. */
		return 1;
	}
	const uint8_t *rest = code + op_at + 1;
	unsigned tail = (unsigned)len - (unsigned)(op_at + 1); /* bytes after the opcode */
	if (op >= 0x70 && op <= 0x7f) {
		out->kind = PT_INSN_JCC;
		out->rel = rel_at(code + len - 1, 1);
	} else if (op >= 0xe0 && op <= 0xe3) {
		out->kind = PT_INSN_JCC; /* LOOPNE, LOOPE, LOOP, JrCXZ: a TNT bit each */
		out->rel = rel_at(code + len - 1, 1);
	} else if (op == 0xe8 || op == 0xe9) {
		/* rel32 (a 66 prefix does not shorten it in 64-bit mode) */
		out->kind = op == 0xe8 ? PT_INSN_CALL : PT_INSN_JMP;
		out->rel = rel_at(code + len - 4, 4);
	} else if (op == 0xeb) {
		out->kind = PT_INSN_JMP;
		out->rel = rel_at(code + len - 1, 1);
	} else if (op == 0xc2 || op == 0xc3) {
		out->kind = PT_INSN_RET;
	} else if (op == 0xca || op == 0xcb) {
		out->kind = PT_INSN_RET; /* far returns pop the return stack too */
		out->far_ret = 1;
	} else if (op == 0xcf) {
		out->kind = PT_INSN_FAR; /* IRET */
		out->far_ret = 1;
		out->interrupt = 1;
	} else if (op >= 0xcc && op <= 0xce) {
		out->kind = PT_INSN_FAR; /* INT3, INT n, INTO */
		out->interrupt = 1;
	} else if (op == 0xff && tail >= 1) {
		unsigned reg = (rest[0] >> 3) & 7;
		if (reg == 2 || reg == 3)
			out->kind = PT_INSN_CALL_IND;
		else if (reg == 4 || reg == 5)
			out->kind = PT_INSN_JMP_IND;
	} else if (op == 0x0f && tail >= 1) {
		uint8_t op2 = rest[0];
		if (op2 >= 0x80 && op2 <= 0x8f) {
			out->kind = PT_INSN_JCC;
			out->rel = rel_at(code + len - 4, 4);
		} else if (op2 == 0x05 || op2 == 0x34) {
			out->kind = PT_INSN_SYSCALL;
		} else if (op2 == 0x07 || op2 == 0x35) {
			out->kind = PT_INSN_SYSRET;
		} else if (op2 == 0x01 && tail >= 2 && (rest[1] == 0xc2 || rest[1] == 0xc3)) {
			out->kind = PT_INSN_VMENTRY;
		}
	}
	switch (out->kind) {
	case PT_INSN_JCC:
		out->op = op >= 0xe0 && op <= 0xe2 ? PT_OP_LOOP : PT_OP_JCC;
		break;
	case PT_INSN_JMP: case PT_INSN_JMP_IND: out->op = PT_OP_JMP; break;
	case PT_INSN_CALL: case PT_INSN_CALL_IND: out->op = PT_OP_CALL; break;
	case PT_INSN_RET: out->op = PT_OP_RET; break;
	case PT_INSN_FAR: out->op = op == 0xcf ? PT_OP_IRET : PT_OP_INT; break;
	case PT_INSN_SYSCALL: out->op = PT_OP_SYSCALL; break;
	case PT_INSN_SYSRET: out->op = PT_OP_SYSRET; break;
	case PT_INSN_VMENTRY: out->op = PT_OP_VMENTRY; break;
	default: break;
	}
	return 1;
}
