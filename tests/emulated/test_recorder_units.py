"""Unit tests of the recorder plugin's pieces, each against an independent reference:
the branch classifier against capstone and its Python twin, the PT packet writer against
the Intel SDM's packet rules (a decoder written here), the perf.data checkpoint against its
Python twin, the cycle model's arithmetic against perf's."""

from __future__ import annotations

import ctypes
from functools import cache
from pathlib import Path

import capstone
import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ptscope.record.emulated.cycle_model import CycleModel
from ptscope.record.emulated.perf_data import checkpoint_bytes
from ptscope.record.emulated.state import read_state
from support.dlfilter_harness import compile_c
from support.emulated_corpus import Case, recorded
from support.pt_corrupt import packets
from support.x86_branch_model import InsnKind, classify

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "src" / "ptscope" / "record" / "emulated" / "plugin"
HARNESS = ROOT / "tests" / "support" / "recorder_harness.c"

_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.detail = True


class BranchInfo(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("rep", ctypes.c_uint8),
        ("zero_call", ctypes.c_uint8),
        ("target", ctypes.c_uint64),
    ]


@cache
def _harness() -> ctypes.CDLL:
    lib = ctypes.CDLL(
        str(
            compile_c(
                [HARNESS, PLUGIN / "x86_branch.c"],
                "recorder-harness",
                shared=True,
                extra=[f"-I{PLUGIN}"],
                depends=[PLUGIN / "pt_writer.h", PLUGIN / "x86_branch.h"],
            )
        )
    )
    lib.harness_classify.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_uint64,
        ctypes.POINTER(BranchInfo),
    ]
    lib.harness_writer_size.restype = ctypes.c_size_t
    lib.harness_writer_init.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_uint64,
        ctypes.c_uint32,
    ]
    lib.harness_writer_op.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64]
    lib.harness_writer_op.restype = ctypes.c_size_t
    lib.harness_writer_top.argtypes = [ctypes.c_void_p]
    lib.harness_writer_top.restype = ctypes.c_uint64
    return lib


def c_classify(pc: int, code: bytes) -> BranchInfo:
    out = BranchInfo()
    _harness().harness_classify(code, len(code), pc, ctypes.byref(out))
    return out


# -- the branch classifier ------------------------------------------------------------------


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
        if insn.id == 0:
            continue
        mine = c_classify(insn.address, bytes(insn.bytes))
        expected = _capstone_kind(insn)
        assert mine.kind == expected, (hex(insn.address), insn.mnemonic, insn.op_str, mine.kind)
        if mine.kind in (InsnKind.COND, InsnKind.JUMP, InsnKind.CALL):
            assert mine.target == insn.operands[0].imm
        seen[InsnKind(mine.kind)] += 1
        checked += 1
    assert checked > 50_000
    assert all(seen[k] for k in (InsnKind.COND, InsnKind.CALL, InsnKind.RET, InsnKind.SYSCALL))


def test_rep_string_instructions_and_call_zero_are_recognised() -> None:
    assert c_classify(0x1000, b"\xf3\xa4").rep  # rep movsb
    assert c_classify(0x1000, b"\xf3\x48\xab").rep  # rep stosq
    assert not c_classify(0x1000, b"\xa4").rep
    assert c_classify(0x1000, b"\xf3\xc3").kind == InsnKind.RET  # rep ret is a return
    zero = c_classify(0x1000, b"\xe8\x00\x00\x00\x00")
    assert zero.kind == InsnKind.CALL and zero.zero_call and zero.target == 0x1005


@settings(max_examples=3000, deadline=None)
@given(st.binary(min_size=1, max_size=15), st.integers(0, (1 << 48) - 1))
def test_classifier_and_its_python_twin_agree_on_any_instruction(raw: bytes, pc: int) -> None:
    """Random bytes, cut to the instruction capstone decodes at their start (the recorder
    is always given exactly one instruction)."""
    insn = next(_CS.disasm_lite(raw, pc, 1), None)
    assume(insn is not None)
    assert insn is not None
    code = raw[: insn[1]]
    c = c_classify(pc, code)
    py = classify(pc, code)
    assert (c.kind, bool(c.rep), bool(c.zero_call)) == (py.kind, py.rep, py.zero_call)
    if py.target is not None:
        assert c.target == py.target & ((1 << 64) - 1)


# -- the PT packet writer --------------------------------------------------------------------

OPS = {
    "advance": 0,
    "start": 1,
    "cond": 2,
    "push": 3,
    "ret": 4,
    "indirect": 5,
    "disable": 6,
    "interrupt": 7,
    "maybe_psb": 8,
    "tail": 9,
    "flush": 10,
}


class Writer:
    """A pt_writer over a Python-owned buffer."""

    def __init__(self, psb_period: int = 4096, cyc_threshold: int = 1, size: int = 1 << 20):
        lib = _harness()
        self.lib = lib
        self.buf = (ctypes.c_uint8 * size)()
        self.state = ctypes.create_string_buffer(lib.harness_writer_size())
        lib.harness_writer_init(self.state, self.buf, size, psb_period, cyc_threshold)
        self.pos = 0

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        op = OPS[name]

        def call(arg: int = 0) -> None:
            self.pos = self.lib.harness_writer_op(self.state, op, arg)

        return call

    def top(self) -> int:
        return int(self.lib.harness_writer_top(self.state))

    def bytes(self, extra: int = 0) -> bytes:
        return bytes(self.buf[: self.pos + extra])


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
    st.integers(0xFFFFFFFFFF600000, 0xFFFFFFFFFF601000),
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["tip", "cond", "call", "ret", "sys"]), _addresses), max_size=300
    )
)
def test_writer_ips_decode_back(ops: list[tuple[str, int]]) -> None:
    w = Writer(psb_period=256)
    w.start(0x401000)
    ips = [(0x11, 0x401000)]
    for op, ip in ops:
        w.advance(3)
        if op == "tip":
            w.indirect(ip)
            ips.append((0x0D, ip))
        elif op == "cond":
            w.cond(ip & 1)
        elif op == "call":
            w.push(ip)
        elif op == "ret":
            compressed = w.top() == ip
            w.ret(ip)
            if not compressed:
                ips.append((0x0D, ip))
        else:
            w.disable()
            w.advance(100)
            w.start(ip)
            ips.append((0x11, ip))
        w.maybe_psb(ip)
    w.flush()
    stream = w.bytes()
    decoded = [(op, ip) for op, ip in _decode_ips(stream) if op != 0x1D]  # FUPs are in PSB+
    assert decoded == ips


@given(st.integers(1, 1 << 40))
def test_cyc_packets_carry_the_cycles(cycles: int) -> None:
    w = Writer()
    w.start(0x401000)
    before = w.pos
    w.advance(cycles)
    w.cond(1)
    w.flush()
    raw = w.bytes()[before:-1]  # CYC, then the TNT packet
    assert raw[0] & 3 == 3
    value = raw[0] >> 3
    shift = 5
    for b in raw[1:]:
        value |= (b >> 1) << shift
        shift += 7
    assert value == cycles


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1), max_size=12), _addresses, st.integers(1, 4))
def test_the_provisional_end_completes_the_stream(bits: list[int], ip: int, threshold: int) -> None:
    """After any packets, the bytes past the last one are the pending TNT bits, FUP(ip),
    TIP.PGD and zeros (PAD): a stream cut there ends cleanly where the thread was."""
    w = Writer(cyc_threshold=threshold)
    w.start(0x401000)
    for bit in bits:
        w.advance(1)
        w.cond(bit)
    w.tail(ip)
    stream = w.bytes(extra=16)
    walked = packets(stream)
    assert sum(length for _, length in walked) == len(stream)
    tail = [stream[off : off + n] for off, n in walked if off >= w.pos]
    kinds = [t[0] for t in tail if t != b"\0"]
    if kinds and kinds[0] & 1 == 0 and kinds[0] & 0x1F != 0x1D:  # a short TNT first
        tnt = kinds.pop(0)
        pending = tnt.bit_length() - 2
        assert 0 < pending < 6
        assert [(tnt >> (pending - k)) & 1 for k in range(pending)] == bits[-pending:]
    assert [k & 0x1F for k in kinds] == [0x1D, 0x01]
    assert [ip2 for _, ip2 in _decode_ips(stream)][-1] == ip


# -- the cycle model --------------------------------------------------------------------------


def test_cycle_model_conversions() -> None:
    model = CycleModel()
    assert model.ratio == 20 and model.time_mult == 1 << 30
    assert model.tsc_to_ns(model.start_tsc) == 1_000_000_000
    assert model.tsc_to_ns(model.start_tsc + 3) == 1_000_000_001  # 1.5 ns, floored like perf
    with pytest.raises(ValueError):
        CycleModel(tsc_hz=1_234_567)


# -- the perf.data checkpoint -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", [Case("dlopen"), Case("threads"), Case("fork")], ids=str)
def test_python_twin_writes_the_same_checkpoint(case: Case, corpus_dir: Path) -> None:
    """The header and feature sections the plugin wrote last are exactly what the
    Python twin (used to finish a recording whose recorder died) makes of the state."""
    rec = recorded(case, corpus_dir)
    perf_data = rec.directory / "perf.data"
    state = read_state(rec.directory)
    header, features = checkpoint_bytes(state, rec.result.recording.command)
    raw = perf_data.read_bytes()
    assert raw[: len(header)] == header
    assert raw[state.data_end : state.data_end + len(features)] == features
    assert state.build_ids and state.index
