"""The own decoder's view of each instruction (``_native/pt_insn.c``) against capstone.

The walker needs an instruction's length, whether and how it changes the flow of control,
and a direct branch's target. pt_insn.c shares nothing with the recorder's classifier
(``record/emulated/plugin/x86_branch.c``); here every instruction of real binaries,
decoded linearly by capstone, must get capstone's length, the kind capstone's mnemonic and
operands say, and capstone's target. (Lengths are ``x86_length.c``'s, tested on its own in
``test_x86_length.py``; the encodings where capstone departs from the SDM are skipped
there and here.)
"""

from __future__ import annotations

import capstone
import pytest

from native.test_x86_length import BINARIES, _departs, _executable_sections
from ptscope.decode import native

pytestmark = pytest.mark.skipif(not native.is_available(), reason="the own decoder is not built")

if native.is_available():
    from ptscope.decode import _ptdecode  # type: ignore[attr-defined]

MD = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
MD.detail = True

# pt_insn.h's kinds
OTHER, JCC, JMP, CALL, JMP_IND, CALL_IND, RET, FAR, SYSCALL, SYSRET, VMENTRY = range(11)

_JCC = {"jo", "jno", "jb", "jae", "je", "jne", "jbe", "ja", "js", "jns", "jp", "jnp", "jl",
        "jge", "jle", "jg", "loop", "loope", "loopne", "jrcxz", "jecxz"}  # fmt: skip
_FAR = {"int3", "int", "into", "int1", "iret", "iretd", "iretq"}


def _expected(insn: capstone.CsInsn) -> tuple[int, int | None]:
    """(kind, absolute target of a direct branch) as capstone reads the instruction."""
    m = insn.mnemonic.split()[-1]  # ("repz ret", "notrack jmp", "bnd jmp": prefixes)
    imm = [op.imm for op in insn.operands if op.type == capstone.x86.X86_OP_IMM]
    if m in _JCC:
        return JCC, imm[0]
    if m in ("jmp", "call"):
        if imm:
            return (JMP if m == "jmp" else CALL), imm[0]
        return (JMP_IND if m == "jmp" else CALL_IND), None
    if m in ("ljmp", "lcall"):  # FF /5, FF /3: perf takes them as indirect branches
        return (JMP_IND if m == "ljmp" else CALL_IND), None
    if m in ("ret", "retf", "retfq"):
        return RET, None
    if m in _FAR:
        return FAR, None
    if m in ("syscall", "sysenter"):
        return SYSCALL, None
    if m in ("sysret", "sysretq", "sysexit", "sysexitq"):
        return SYSRET, None
    if m in ("vmlaunch", "vmresume"):
        return VMENTRY, None
    return OTHER, None


@pytest.mark.parametrize("name", sorted(BINARIES))
def test_every_instruction_of_real_binaries(name: str) -> None:
    path = BINARIES[name]()
    if path is None or not path.exists():
        pytest.skip(f"{name} not found")
    total = branches = 0
    wrong: list[str] = []
    for section, data in _executable_sections(path):
        pos = 0
        while pos < len(data):
            before = pos
            for insn in MD.disasm(data[pos : pos + 65536], pos):
                address, size = insn.address, insn.size
                code = data[address : address + size]
                pos = address + size
                if _departs(code, insn.mnemonic):
                    continue
                total += 1
                ours = _ptdecode.insn(data[address : address + 15])
                kind, target = _expected(insn)
                branches += kind != OTHER
                got = None if ours is None else (ours[0], ours[1])
                if got != (size, kind):
                    wrong.append(f"{section}+{address:#x} {code.hex()} {insn.mnemonic}: {ours}")
                elif target is not None and address + size + ours[3] != target:
                    wrong.append(f"{section}+{address:#x} {insn.mnemonic}: rel {ours[3]}")
            if pos == before:
                pos += 1
    assert total > 100 and branches > 10
    assert not wrong, f"{len(wrong)} of {total} instructions differ, e.g. {wrong[:5]}"


@pytest.mark.parametrize(
    ("hex_code", "kind"),
    [
        ("e8 00 00 00 00", CALL),
        ("ff d0", CALL_IND),
        ("ff 25 00 00 00 00", JMP_IND),
        ("41 ff e3", JMP_IND),  # jmp r11 (REX)
        ("f2 ff e0", JMP_IND),  # bnd jmp rax
        ("f3 c3", RET),  # repz ret
        ("c2 08 00", RET),
        ("cb", RET),  # far return: pops the return stack too
        ("0f 05", SYSCALL),
        ("0f 01 c2", VMENTRY),
        ("e3 fe", JCC),  # jrcxz
        ("c5 f8 77", OTHER),  # vzeroupper: a VEX instruction is never a branch
        ("9a 00 00 00 00 00 00", CALL_IND),  # invalid in 64-bit mode; perf takes it
    ],
)
def test_known_branches(hex_code: str, kind: int) -> None:
    code = bytes.fromhex(hex_code)
    found = _ptdecode.insn(code + b"\xcc" * 15)
    assert found is not None and found[:2] == (len(code), kind)
