"""Unit tests of the emulated backend's pieces, each against an independent reference."""

from __future__ import annotations

from pathlib import Path

import capstone
import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.record.emulated.cycle_model import CycleModel
from ptscope.record.emulated.pt_encoder import PtEncoder
from ptscope.record.emulated.x86 import InsnKind, classify, split_block
from support.pt_corrupt import packets

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.detail = True


def _capstone_kind(insn: capstone.CsInsn) -> InsnKind:
    groups = set(insn.groups)
    m = insn.mnemonic
    direct = bool(insn.operands) and insn.operands[0].type == capstone.x86.X86_OP_IMM
    if m in ("syscall", "sysenter"):
        return InsnKind.SYSCALL
    if m in ("xbegin", "xabort"):
        return InsnKind.OTHER  # TSX: not a branch for perf's PT decoder
    if capstone.x86.X86_GRP_CALL in groups:
        return InsnKind.CALL if direct and not m.startswith("lcall") else InsnKind.CALL_INDIRECT
    if capstone.x86.X86_GRP_RET in groups:
        return InsnKind.RET
    if capstone.x86.X86_GRP_JUMP in groups:
        if "jmp" not in m:
            return InsnKind.COND
        return InsnKind.JUMP if direct else InsnKind.JUMP_INDIRECT
    if capstone.x86.X86_GRP_INT in groups or capstone.x86.X86_GRP_IRET in groups:
        return InsnKind.OTHER_INDIRECT
    return InsnKind.OTHER


def test_classification_agrees_with_capstone_on_libc() -> None:
    """Every instruction of libc's code: kind and direct target as capstone sees them."""
    with open("/lib/x86_64-linux-gnu/libc.so.6", "rb") as f:
        text = ELFFile(f).get_section_by_name(".text")
        code, base = text.data()[:400_000], text["sh_addr"]
    seen = dict.fromkeys(InsnKind, 0)
    checked = 0
    for insn in _CS.disasm(code, base):
        if insn.mnemonic.startswith(("bnd ", "notrack ")) is False and insn.id == 0:
            continue
        mine = classify(insn.address, bytes(insn.bytes))
        assert mine.length == insn.size
        expected = _capstone_kind(insn)
        assert mine.kind == expected, (hex(insn.address), insn.mnemonic, insn.op_str, mine)
        if mine.kind in (InsnKind.COND, InsnKind.JUMP, InsnKind.CALL):
            assert mine.target == insn.operands[0].imm
        seen[mine.kind] += 1
        checked += 1
    assert checked > 50_000
    assert all(seen[k] for k in (InsnKind.COND, InsnKind.CALL, InsnKind.RET, InsnKind.SYSCALL))


def test_rep_string_instructions_are_recognised() -> None:
    assert classify(0x1000, b"\xf3\xa4").rep  # rep movsb
    assert classify(0x1000, b"\xf3\x48\xab").rep  # rep stosq
    assert not classify(0x1000, b"\xa4").rep
    assert classify(0x1000, b"\xf3\xc3").kind == InsnKind.RET  # rep ret is a return
    zero = classify(0x1000, b"\xe8\x00\x00\x00\x00")
    assert zero.kind == InsnKind.CALL and zero.zero_call and zero.target == 0x1005


def test_block_split_fixes_what_qemu_could_not_disassemble() -> None:
    """QEMU's disassembler lists CET's rdsspq as four .byte lines and a bogus enter."""
    listing = [
        (0x1000, b"\xf3"),
        (0x1001, b"\x48"),
        (0x1002, b"\x0f"),
        (0x1003, b"\x1e"),
        (0x1004, b"\xc8\x48\x85\xc0"),
        (0x1008, b"\x74\x26"),
    ]
    assert split_block(listing) == [
        (0x1000, b"\xf3\x48\x0f\x1e\xc8"),
        (0x1005, b"\x48\x85\xc0"),
        (0x1008, b"\x74\x26"),
    ]


def _decode_ips(stream: bytes) -> list[tuple[int, int]]:
    """(opcode, IP) of every IP packet, decompressed against the last IP (reference:
    the Intel SDM's IP compression rules), the last IP reset at each PSB."""
    out = []
    last = 0
    for off, length in packets(stream):
        b = stream[off]
        if stream[off : off + 2] == b"\x02\x82":
            last = 0
        if b & 0x1F in (0x01, 0x0D, 0x11, 0x1D) and b >> 5:
            payload = int.from_bytes(stream[off + 1 : off + length], "little")
            kind = b >> 5
            if kind == 1:
                ip = (last & ~0xFFFF) | payload
            elif kind == 2:
                ip = (last & ~0xFFFFFFFF) | payload
            elif kind == 3:
                ip = payload | (((1 << 16) - 1) << 48 if payload >> 47 else 0)
            elif kind == 4:
                ip = (last & ~((1 << 48) - 1)) | payload
            else:
                ip = payload
            last = ip
            out.append((b & 0x1F, ip))
    return out


_addresses = st.one_of(
    st.integers(0x400000, 0x500000),
    st.integers(0x4000000000, 0x4003000000),
    st.integers(0x7FFF00000000, 0x7FFFFFFFFFFF),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["tip", "cond", "call", "ret", "sys"]), _addresses), max_size=300
    )
)
def test_encoder_ips_decode_back(ops: list[tuple[str, int]]) -> None:
    enc = PtEncoder(CycleModel(), psb_period=256)
    enc.start(0x401000)
    ips = [(0x11, 0x401000)]
    for op, ip in ops:
        enc.advance(3)
        if op == "tip":
            enc.indirect(ip)
            ips.append((0x0D, ip))
        elif op == "cond":
            enc.cond(ip & 1 == 1)
        elif op == "call":
            enc.call(ip)
        elif op == "ret":
            compressed = bool(enc._stack) and enc._stack[-1] == ip
            enc.ret(ip)
            if not compressed:
                ips.append((0x0D, ip))
        else:
            enc.disable()
            enc.advance(100)
            enc.start(ip)
            ips.append((0x11, ip))
        enc.maybe_psb(ip)
    stream = enc.finish()
    decoded = [(op, ip) for op, ip in _decode_ips(stream) if op != 0x1D]  # FUPs are in PSB+
    assert decoded == ips


@given(st.integers(1, 1 << 40))
def test_cyc_packets_carry_the_cycles(cycles: int) -> None:
    enc = PtEncoder(CycleModel())
    enc.start(0x401000)
    before = len(enc.out)
    enc.advance(cycles)
    enc.cond(True)
    enc._flush_tnt()
    raw = bytes(enc.out[before:-1])  # CYC, then the TNT packet
    assert raw[0] & 3 == 3
    value = raw[0] >> 3
    shift = 5
    for b in raw[1:]:
        value |= (b >> 1) << shift
        shift += 7
    assert value == cycles


def test_cycle_model_conversions() -> None:
    model = CycleModel()
    assert model.ratio == 20 and model.time_mult == 1 << 30
    assert model.tsc_to_ns(model.start_tsc) == 1_000_000_000
    assert model.tsc_to_ns(model.start_tsc + 3) == 1_000_000_001  # 1.5 ns, floored like perf
    with pytest.raises(ValueError):
        CycleModel(tsc_hz=1_234_567)


def test_perf_data_writer_layout(tmp_path: Path) -> None:
    """File header fields perf checks: magic, sizes, sections inside the file."""
    from ptscope.record.emulated.perf_data import PerfDataWriter

    path = tmp_path / "perf.data"
    w = PerfDataWriter(path, CycleModel(), command=["x"])
    w.comm(1, 1, "x", 10)
    w.auxtrace(0, 1, 0, b"\x02\x82" * 8, 5)
    w.close([])
    raw = path.read_bytes()
    assert raw[:8] == b"PERFILE2"
    size, attr_size = int.from_bytes(raw[8:16], "little"), int.from_bytes(raw[16:24], "little")
    assert (size, attr_size) == (104, 144)
    data_off, data_size = int.from_bytes(raw[40:48], "little"), int.from_bytes(raw[48:56], "little")
    assert data_off + data_size <= len(raw)
