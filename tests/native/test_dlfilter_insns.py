"""The dlfilter's instruction detail (``--dlarg insns``), driven with fabricated samples.

A fake process's code is served through perf's ``object_code()`` callback; the counts and
code lines of each kept branch are checked against the instructions written here by hand.
"""

from __future__ import annotations

import ctypes
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.decode import record_format as rf
from support.dlfilter_harness import (
    CALL,
    CODE,
    FOO,
    JMP,
    MAIN,
    NOPS,
    START,
    FakePerf,
    Output,
    build_dlfilter,
    call_and_loop,
    scattered_jumps,
    split_stream,
)


@pytest.fixture(scope="module")
def lib() -> Path:
    return build_dlfilter()


def run(
    lib: Path, out: Path, samples: list[dict[str, object]], *args: str
) -> tuple[Output, FakePerf]:
    perf = FakePerf(lib, [str(out), *args], code=dict(CODE))
    assert perf.start() == 0
    for i, sample in enumerate(samples):
        assert perf.sample(time=1000 + i, **sample) == 1  # type: ignore[arg-type]
    assert perf.stop() == 0
    return split_stream(out.read_bytes()), perf


def test_exact_counts_and_lines(lib: Path, tmp_path: Path) -> None:
    out, perf = run(lib, tmp_path / "s.bin", call_and_loop(), "insns")
    assert out.header["options"] == rf.OPT_INSNS
    got = [(b["ip"], b["insn_cnt"], b["ranges"]) for b in out.branches]
    assert got == [
        (0, 0, []),  # tracing starts: nothing ran before
        (0x1004, 3, [(0x1000 >> 6, 1)]),  # push, mov, call
        # xor add cmp jne | add cmp jne (x3) | add cmp jne(not taken) ret
        (0x110A, 4 + 3 * 3 + 4, [(0x1100 >> 6, 1)]),
        (0x100A, 1, [(0x1009 >> 6, 1)]),  # the nop; the ret at ip did not run
    ]
    assert out.trailer["blocks_unknown"] == 0
    # One read per distinct block, however often it ran.
    assert out.trailer["blocks_decoded"] == 5
    assert len(perf.object_code_calls) == 5
    assert out.trailer["lines"] == 0  # one range each: it fits in the branch record


def test_counts_replace_perfs_and_plain_mode_is_unchanged(lib: Path, tmp_path: Path) -> None:
    samples = [dict(s, insn_cnt=7, cyc_cnt=9) for s in call_and_loop()]
    plain, perf = run(lib, tmp_path / "plain.bin", samples)
    assert [b["insn_cnt"] for b in plain.branches] == [7, 7, 7 * 5, 7]
    assert "lines" not in plain.order and not perf.object_code_calls
    detail, _ = run(lib, tmp_path / "insns.bin", samples, "insns")
    assert [b["insn_cnt"] for b in detail.branches] == [0, 3, 17, 1]
    # Cycles stay perf's, carried from dropped jumps the same way.
    assert [b["cyc_cnt"] for b in detail.branches] == [b["cyc_cnt"] for b in plain.branches]


def test_lines_records_come_right_before_their_branch(lib: Path, tmp_path: Path) -> None:
    # Seven ranges: the last in the branch record, six in two lines records before it.
    out, _ = run(lib, tmp_path / "s.bin", scattered_jumps(), "insns")
    assert out.order[-4:] == ["lines", "lines", "branch", "trailer"]
    last = out.branches[-1]
    assert last["insn_cnt"] == 7
    assert last["ranges"] == [((0x2000 >> 6) + 2 * k, 1) for k in range(7)]


def test_adjacent_and_repeated_blocks_merge(lib: Path, tmp_path: Path) -> None:
    # Blocks 0x2000..0x2040 and 0x2041..0x2080, three times: lines 0x80..0x82 once.
    samples: list[dict[str, object]] = [dict(ip=0, addr=0x2000, flags=int(START), addr_sym=NOPS)]
    for _ in range(3):
        samples.append(dict(ip=0x2040, addr=0x2041, flags=int(JMP), ip_sym=NOPS, addr_sym=NOPS))
        samples.append(dict(ip=0x2080, addr=0x2000, flags=int(JMP), ip_sym=NOPS, addr_sym=NOPS))
    samples.append(dict(ip=0x2000, addr=0x1000, flags=int(CALL), ip_sym=NOPS, addr_sym=MAIN))
    out, _ = run(lib, tmp_path / "s.bin", samples, "insns")
    last = out.branches[-1]
    assert last["insn_cnt"] == 3 * (0x41 + 0x40) + 1
    assert last["ranges"] == [(0x2000 >> 6, 3)]


def test_blocks_that_cannot_be_counted(lib: Path, tmp_path: Path) -> None:
    samples: list[dict[str, object]] = [
        # A thread whose first sample is not a trace start: where its block began is unknown
        # (a parallel window starts so, and its count is fixed up: not unreadable code).
        dict(ip=0x1004, addr=0x1100, flags=int(CALL), ip_sym=MAIN, addr_sym=FOO, tid=101),
        # Code nobody can read.
        dict(ip=0, addr=0x9000, flags=int(START), tid=102),
        dict(ip=0x9010, addr=0x1000, flags=int(CALL), addr_sym=MAIN, tid=102),
        # A "block" that does not split into instructions ending at the branch.
        dict(ip=0x1002, addr=0x1100, flags=int(CALL), ip_sym=MAIN, addr_sym=FOO, tid=102),
        # A source before the block's start.
        dict(ip=0x10F0, addr=0x1000, flags=int(CALL), ip_sym=FOO, addr_sym=MAIN, tid=102),
    ]
    out, _ = run(lib, tmp_path / "s.bin", samples, "insns")
    assert [b["insn_cnt"] for b in out.branches] == [0, 0, 0, 0, 0]
    assert all(b["ranges"] == [] for b in out.branches)
    assert out.trailer["blocks_unknown"] == 3
    assert out.trailer["blocks_decoded"] == 0


def test_threads_count_apart(lib: Path, tmp_path: Path) -> None:
    a, b = call_and_loop(100), call_and_loop(200)
    interleaved = [s for pair in zip(a, b, strict=True) for s in pair]
    out, _ = run(lib, tmp_path / "s.bin", interleaved, "insns")
    for tid in (100, 200):
        assert [b["insn_cnt"] for b in out.branches if b["tid"] == tid] == [0, 3, 17, 1]


def test_trailing_jump_gets_the_carried_counts(lib: Path, tmp_path: Path) -> None:
    samples = call_and_loop()[:6]  # the trace ends inside foo's loop
    out, _ = run(lib, tmp_path / "s.bin", samples, "insns", "to-end")
    last = out.branches[-1]
    assert (last["ip"], last["insn_cnt"], last["ranges"]) == (0x1108, 4 + 3 * 3, [(0x44, 1)])


class LineSet(ctypes.Structure):
    _fields_ = [("r", ctypes.c_void_p), ("n", ctypes.c_uint32), ("cap", ctypes.c_uint32)]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.tuples(st.integers(0, 60), st.integers(0, 6)), st.none()), max_size=40)
)
def test_line_set_is_the_union_of_its_ranges(adds: list[tuple[int, int] | None]) -> None:
    """None: a kept branch takes the lines (the set is emptied, its buffer kept)."""
    fn = ctypes.CDLL(str(build_dlfilter())).ptscope_line_set_add
    fn.argtypes = [ctypes.POINTER(LineSet), ctypes.c_uint64, ctypes.c_uint64]
    s = LineSet()
    expected: set[int] = set()
    for add in adds:
        if add is None:
            s.n = 0
            expected.clear()
            continue
        lo, width = add
        assert fn(ctypes.byref(s), lo, lo + width) == 0
        expected.update(range(lo, lo + width + 1))
    pairs = ctypes.cast(s.r, ctypes.POINTER(ctypes.c_uint64))
    ranges = [(pairs[2 * i], pairs[2 * i + 1]) for i in range(s.n)]
    got = {line for first, count in ranges for line in range(first, first + count)}
    assert got == expected
    # ascending, disjoint, not adjacent
    for (f1, c1), (f2, _) in pairwise(ranges):
        assert f1 + c1 < f2
    ctypes.CDLL("libc.so.6").free(ctypes.c_void_p(s.r))
