"""The Python twin of the recorder's branch classifier (``plugin/x86_branch.c``).

The Intel PT decoder walks the program's code and needs a packet exactly where the hardware
would have produced one, so the recorder classifies every instruction with the same rules
as perf (``intel_pt_insn_decoder()``): legacy prefixes and REX are skipped, VEX/EVEX opcodes
are never branches, and only the opcode (plus ModRM.reg for ``FF``) decides the kind. The
tests run both on the same bytes (``tests/emulated/test_recorder_units.py``).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final, NamedTuple

__all__ = ["Insn", "InsnKind", "classify"]


class InsnKind(IntEnum):
    """What an instruction does to control flow, as far as the PT packet stream is concerned."""

    OTHER = 0
    """Not a branch (includes ``rep`` string instructions, which PT counts once)."""
    COND = 1
    """Conditional jump (jcc, jrcxz, loop): one TNT bit."""
    JUMP = 2
    """Direct jump (E9, EB): no packet."""
    CALL = 3
    """Direct near call (E8): no packet; pushes a return address."""
    JUMP_INDIRECT = 4
    """Indirect or far jump: a TIP packet."""
    CALL_INDIRECT = 5
    """Indirect or far call: a TIP packet; pushes a return address."""
    RET = 6
    """Near or far return: a TNT bit when compressed, else a TIP."""
    SYSCALL = 7
    """syscall / sysenter: tracing stops (user-only), resumes after the kernel returns."""
    OTHER_INDIRECT = 8
    """int, int3, into, iret, sysret and friends: a TIP (never seen in normal user code)."""


BRANCH_KINDS: Final = frozenset(InsnKind) - {InsnKind.OTHER}

_LEGACY_PREFIXES: Final = frozenset(b"\x66\x67\xf2\xf3\xf0\x2e\x36\x3e\x26\x64\x65")
_REP_STRING_OPCODES: Final = frozenset(b"\x6c\x6d\x6e\x6f\xa4\xa5\xa6\xa7\xaa\xab\xac\xad\xae\xaf")
_MASK64: Final = (1 << 64) - 1


class Insn(NamedTuple):
    """One decoded instruction: its address, length, kind and (for direct branches) target."""

    pc: int
    length: int
    kind: InsnKind
    target: int | None
    """Destination of a direct jump, call or conditional jump; ``None`` otherwise."""
    rep: bool = False
    """A ``rep``-prefixed string instruction (QEMU logs one execution per iteration)."""
    zero_call: bool = False
    """``call +0`` (E8 00000000): perf pushes nothing for it, so neither may the encoder."""

    @property
    def end(self) -> int:
        """Address of the next instruction in memory (the fall-through / return address)."""
        return (self.pc + self.length) & _MASK64


def _signed(raw: bytes) -> int:
    return int.from_bytes(raw, "little", signed=True)


def classify(pc: int, code: bytes) -> Insn:
    """Classify the instruction ``code`` (exactly one instruction's bytes) at address ``pc``."""
    n = len(code)
    i = 0
    rep = False
    while i < n and code[i] in _LEGACY_PREFIXES:
        rep = rep or code[i] in (0xF2, 0xF3)
        i += 1
    if i < n and 0x40 <= code[i] <= 0x4F:
        i += 1
    if i >= n:
        return Insn(pc, n, InsnKind.OTHER, None)
    op = code[i]
    end = (pc + n) & _MASK64
    kind = InsnKind.OTHER
    target: int | None = None
    # The immediate of a relative branch is always the instruction's last bytes.
    if op in (0xC4, 0xC5, 0x62):  # VEX / EVEX: never a branch
        pass
    elif 0x70 <= op <= 0x7F or 0xE0 <= op <= 0xE3:
        kind, target = InsnKind.COND, (end + _signed(code[-1:])) & _MASK64
    elif op == 0x0F and i + 1 < n:
        op2 = code[i + 1]
        if 0x80 <= op2 <= 0x8F:
            kind, target = InsnKind.COND, (end + _signed(code[i + 2 :])) & _MASK64
        elif op2 in (0x05, 0x34):
            kind = InsnKind.SYSCALL
        elif op2 in (0x07, 0x35):
            kind = InsnKind.OTHER_INDIRECT
    elif op == 0xE8:
        rel = _signed(code[i + 1 :])
        return Insn(pc, n, InsnKind.CALL, (end + rel) & _MASK64, False, rel == 0)
    elif op in (0xE9, 0xEB):
        kind, target = InsnKind.JUMP, (end + _signed(code[i + 1 :])) & _MASK64
    elif op == 0xEA:
        kind = InsnKind.JUMP_INDIRECT
    elif op in (0xC2, 0xC3, 0xCA, 0xCB):
        kind = InsnKind.RET
    elif 0xCC <= op <= 0xCF:
        kind = InsnKind.OTHER_INDIRECT
    elif op == 0xFF and i + 1 < n:
        reg = (code[i + 1] >> 3) & 7
        if reg in (2, 3):
            kind = InsnKind.CALL_INDIRECT
        elif reg in (4, 5):
            kind = InsnKind.JUMP_INDIRECT
    elif rep and op in _REP_STRING_OPCODES:
        return Insn(pc, n, InsnKind.OTHER, None, True)
    return Insn(pc, n, kind, target)
