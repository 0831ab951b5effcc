/* What an x86-64 instruction does to control flow, as far as an Intel PT packet stream is
   concerned: the same rules as perf's PT decoder (intel_pt_insn_decoder()), which walks the
   program's code and expects a packet exactly where the hardware would have written one.

   Only the opcode (and ModRM.reg for FF) decides: legacy prefixes and REX are skipped, and
   VEX/EVEX encoded instructions are never branches. The caller knows each instruction's
   length (QEMU's translator splits blocks into instructions), so no length decoding is
   done here. The Python twin of these rules is tests/support/x86_branch_model.py. */
#ifndef PTSCOPE_X86_BRANCH_H
#define PTSCOPE_X86_BRANCH_H

#include <stddef.h>
#include <stdint.h>

enum branch_kind {
	BK_OTHER = 0,     /* not a branch (a rep string instruction included) */
	BK_COND = 1,      /* jcc, jrcxz, loop: one TNT bit */
	BK_JUMP = 2,      /* direct jmp: no packet */
	BK_CALL = 3,      /* direct near call: no packet, pushes the return address */
	BK_JUMP_IND = 4,  /* indirect or far jmp: TIP */
	BK_CALL_IND = 5,  /* indirect or far call: TIP, pushes the return address */
	BK_RET = 6,       /* near or far ret: a TNT bit when compressed, else TIP */
	BK_SYSCALL = 7,   /* syscall, sysenter: tracing stops (user-only PT) */
	BK_OTHER_IND = 8, /* int, int3, into, iret, sysret...: TIP */
};

struct branch_info {
	uint8_t kind;      /* enum branch_kind */
	uint8_t rep;       /* rep-prefixed string instruction: QEMU runs one iteration per block */
	uint8_t zero_call; /* call +0 (E8 00000000): perf pushes nothing for it */
	uint64_t target;   /* destination of a direct jump, call or conditional jump */
};

/* Classify the instruction `code[0..len)` at address `pc`. */
void x86_classify(const uint8_t *code, size_t len, uint64_t pc, struct branch_info *out);

#endif
