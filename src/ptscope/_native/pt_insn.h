/* What the own decoder's walker needs to know of one x86-64 instruction: its length, how
 * it changes the flow of control, and a direct branch's target (see pt_insn.c). */
#ifndef PTSCOPE_PT_INSN_H
#define PTSCOPE_PT_INSN_H

#include <stddef.h>
#include <stdint.h>

enum pt_insn_kind {
	PT_INSN_OTHER,	  /* not a branch: execution goes on after it */
	PT_INSN_JCC,	  /* conditional (Jcc, LOOPcc, JrCXZ): a TNT bit */
	PT_INSN_JMP,	  /* direct jump: no packet */
	PT_INSN_CALL,	  /* direct call: no packet; its return address is pushed */
	PT_INSN_JMP_IND,  /* indirect jump: a TIP */
	PT_INSN_CALL_IND, /* indirect call: a TIP; its return address is pushed */
	PT_INSN_RET,	  /* near return: a TNT bit (compressed) or a TIP */
	PT_INSN_FAR,	  /* far transfers (far call/jmp/ret, INT n, INT3, INTO, IRET): a TIP */
	PT_INSN_SYSCALL,  /* SYSCALL, SYSENTER */
	PT_INSN_SYSRET,	  /* SYSRET, SYSEXIT */
	PT_INSN_VMENTRY,  /* VMLAUNCH, VMRESUME */
	PT_INSN_KINDS
};

/* Kinds that end a basic block (every branch). */
static inline int pt_insn_is_branch(int kind)
{
	return kind != PT_INSN_OTHER;
}

/* What perf's decoder calls an instruction's op: a branch sample's flags come from it. */
enum pt_insn_op {
	PT_OP_OTHER,
	PT_OP_CALL,
	PT_OP_RET,
	PT_OP_JCC,
	PT_OP_JMP,
	PT_OP_LOOP,
	PT_OP_IRET,
	PT_OP_INT,
	PT_OP_SYSCALL,
	PT_OP_SYSRET,
	PT_OP_VMENTRY,
};

struct pt_insn {
	uint8_t length; /* 1..15 */
	uint8_t kind;	/* enum pt_insn_kind */
	uint8_t op;	/* enum pt_insn_op */
	uint8_t far_ret; /* PT_INSN_FAR: a far return or IRET (flags as returns) */
	uint8_t interrupt; /* PT_INSN_FAR: INT n, INT3, INTO, IRET */
	int32_t rel;	/* direct branches: the displacement (target = next + rel) */
};

/* Decode the instruction at `code` (avail bytes readable). Returns 1, or 0 when the bytes
 * are no valid instruction or the instruction does not fit in avail. */
int pt_insn_decode(const uint8_t *code, size_t avail, struct pt_insn *out);

#endif
