"""Numbers out of range in what the decoders read (perf's text, the dlfilter stream) are
damaged data: a counted ``[decode error]``, never an exception here or in the engines."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from ptscope.decode import record_format as rf
from ptscope.decode.dlfilter_stream import RecordStreamParser, StreamStats
from ptscope.decode.perf_text import PerfTextParser
from ptscope.model import (
    COUNT_BUDGET,
    DAMAGED_DATA,
    TIME_LIMIT,
    BranchBatch,
    BranchEvent,
    CommEvent,
    DecodeError,
    Event,
    PowerEvent,
    StackSample,
)
from ptscope.model import BranchFlags as F
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import make_engine
from support.cli import ptscope
from support.dlfilter_harness import FakePerf, Sym, build_dlfilter, split_stream

HEAD = "  1234/1234  12345.678901234:          1  branches:uH:"
CALL = "  call  401136 main+0x26 (/tmp/a.out) =>  401106 f+0x0 (/tmp/a.out)"
RETURN = "  return  401120 f+0x1a (/tmp/a.out) =>  40113b main+0x2b (/tmp/a.out)"
GOOD = [HEAD + CALL, "  1234/1234  12345.678901300:          1  branches:uH:" + RETURN]


def _time(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


DAMAGED_LINES = {
    "time 2**63": f"  1234/1234  {_time(1 << 63)}:          1  branches:uH:" + RETURN,
    "time 2**64": f"  1234/1234  {_time(1 << 64)}:          1  branches:uH:" + RETURN,
    "time at the engine's limit": f"  1234/1234  {_time(TIME_LIMIT)}:  1  branches:uH:" + RETURN,
    "time of 5,000 digits": "  1234/1234  " + "9" * 5000 + ".000000001:  1  branches:uH:" + RETURN,
    "address 2**64": HEAD + "  return  10000000000000000 f+0x1a (/tmp/a.out) =>  40113b main",
    "target 2**64": HEAD + "  call  401136 main+0x26 (/tmp/a.out) =>  ffffffffffffffff1 f+0x0",
    "pid 2**31": "  2147483648/1234  12345.678901300:  1  branches:uH:" + RETURN,
    "tid 2**32": "  1234/4294967296  12345.678901300:  1  branches:uH:" + RETURN,
    "pid of 5,000 digits": "  " + "1" * 5000 + "/1  12345.678901300:  1  branches:uH:" + RETURN,
    "counts past the budget": (
        "  1234/1234  12345.678901300:  1  branches:uH:"
        + RETURN
        + f" \t IPC: 0.50 ({COUNT_BUDGET}/{COUNT_BUDGET}) "
    ),
    "counts of 5,000 digits": (
        "  1234/1234  12345.678901300:  1  branches:uH:"
        + RETURN
        + f" \t IPC: 1.00 ({'7' * 5000}/1) "
    ),
    "frequency 2**64": (
        "  1234/1234  12345.678901300:  0  cbr:  cbr: 20 freq: 18446744073709551616 MHz (55%)"
        "  0 401136 main+0x26 (/tmp/a.out)"
    ),
}


def _feed_engines(events: list[Event]) -> None:
    """Both engines take what the parser gave (the C engine refuses out-of-range input
    with an exception: none may reach it)."""
    for engine in (make_engine(), TraceSegmentEngine()):
        engine.feed_all(events)
        engine.finish()


@pytest.mark.parametrize("line", DAMAGED_LINES.values(), ids=DAMAGED_LINES.keys())
def test_a_perf_text_line_with_a_number_out_of_range_is_a_decode_error(line: str) -> None:
    parser = PerfTextParser()
    events = parser.feed([GOOD[0], line, GOOD[1]])
    events += parser.finish()
    errors = [e for e in events if isinstance(e, DecodeError)]
    assert len(errors) == 1, events
    assert "out of range" in errors[0].message
    assert parser.stats.decode_errors == 1
    assert parser.stats.unknown_lines == 0
    # The good lines around it are still decoded.
    assert sum(isinstance(e, BranchEvent) for e in events) == 2
    _feed_engines(events)


def test_a_damaged_perf_text_line_keeps_the_numbers_in_range_on_its_error() -> None:
    line = f"  1234/1234  12345.678901300:  1  branches:uH:  return  {'f' * 17} f+0x1a (/x)"
    [error] = PerfTextParser().feed([line])
    assert isinstance(error, DecodeError)
    assert (error.pid, error.tid, error.time) == (1234, 1234, 12345_678901300)
    [error] = PerfTextParser().feed([DAMAGED_LINES["time 2**64"]])
    assert isinstance(error, DecodeError)
    assert (error.pid, error.tid, error.time) == (1234, 1234, None)


def test_perf_text_other_lines_with_numbers_out_of_range() -> None:
    """Error lines keep what is in range; thread names, samples and digits that Python's
    ``str.isdigit`` takes but ``int`` refuses are damage or foreign text, not a crash."""
    parser = PerfTextParser()
    events = parser.feed(
        [
            " instruction trace error type 1 time 99999999999999999999.000000001 cpu 0 "
            "pid 99999999999 tid 5 ip 0x1ffffffffffffffff code 6: Trace doesn't match",
            "  5/5  1.000000000: PERF_RECORD_COMM exec: prog:4294967296/5",
            "  5/5  1.000000000: 1 cycles:u: ",
            "\t10000000000000000000 main+0x1 (/x)",
            "",
            "  5/5  1.000000000: ²  cycles:u: ",
            "  5/5  ².000000000:  1  branches:uH:" + CALL,
            "  5/5²  1.000000000:  1  branches:uH:" + CALL,
        ]
    )
    events += parser.finish()
    first = events[0]
    assert isinstance(first, DecodeError)
    assert (first.pid, first.tid, first.time, first.ip, first.code) == (None, 5, None, None, 6)
    assert not any(isinstance(e, CommEvent | StackSample | PowerEvent) for e in events)
    assert parser.stats.decode_errors == 3
    _feed_engines(events)


def test_decode_of_perf_text_with_a_time_past_2_63_reports_a_decode_error(tmp_path: Path) -> None:
    text = "\n".join([GOOD[0], DAMAGED_LINES["time 2**64"], GOOD[1]]) + "\n"
    out = tmp_path / "t.fxt"
    result = ptscope("decode", "--perf-script", "-", "-o", str(out), stdin=text)
    assert result.returncode == 0, result.stderr
    assert "1 decode error" in result.stderr
    dumped = ptscope("dump", "--instants", str(out)).stdout
    assert "instant [decode error: time out of range in perf's text]" in dumped


# ----------------------------------------------------------------- dlfilter stream

MAIN = Sym("main", "/usr/bin/prog", 0x1000, 0x1100)
FOO = Sym("foo", "/usr/bin/prog", 0x1100, 0x1200)


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A stream from the real filter: a power event, then five calls and returns."""
    out = tmp_path_factory.mktemp("stream") / "s.bin"
    perf = FakePerf(build_dlfilter(), [str(out)])
    assert perf.start() == 0
    perf.sample(ip=0x1030, event="cbr", raw=struct.pack("<III", 20, 2_000_000, 0), time=10)
    for i in range(5):
        t = 100 + 10 * i
        call = int(F.BRANCH | F.CALL)
        perf.sample(ip=0x1030, addr=0x1100, flags=call, ip_sym=MAIN, addr_sym=FOO, time=t,
                    insn_cnt=3, cyc_cnt=4)  # fmt: skip
        perf.sample(ip=0x1140, addr=0x1035, flags=int(F.BRANCH | F.RETURN), ip_sym=FOO,
                    addr_sym=MAIN, time=t + 4, insn_cnt=5)  # fmt: skip
    assert perf.stop() == 0
    return out.read_bytes()


def _with(stream: bytes, record: str, index: int, **fields: int) -> bytes:
    """``stream`` with fields of its ``index``-th ``record`` (branch, power) changed."""
    out = split_stream(stream)
    at = [o for o, kind in zip(out.offsets, out.order, strict=True) if kind == record][index]
    dtype = rf.BRANCH_DTYPE if record == "branch" else rf.POWER_DTYPE
    data = bytearray(stream)
    for name, value in fields.items():
        field_type, offset = dtype.fields[name][:2]
        data[at + offset : at + offset + field_type.itemsize] = np.array(
            value, dtype=field_type
        ).tobytes()
    return bytes(data)


def _parse_both_ways(data: bytes) -> tuple[list[Event], list[Event | BranchBatch], StreamStats]:
    parser = RecordStreamParser("test stream")
    events = parser.feed(data)
    parser.close()
    columnar = RecordStreamParser("test stream")
    items = columnar.feed_columnar(data)
    columnar.close()
    assert columnar.stats.damaged == parser.stats.damaged
    for engine in (make_engine(), TraceSegmentEngine()):
        engine.feed_all(items)
        engine.finish()
    _feed_engines(events)
    return events, items, parser.stats


DAMAGED_RECORDS = {
    "time 2**64-1": ("branch", 3, {"time": (1 << 64) - 1}),
    "time 2**63": ("branch", 3, {"time": 1 << 63}),
    "time at the engine's limit": ("branch", 3, {"time": TIME_LIMIT}),
    "cycles 2**64-1": ("branch", 3, {"cyc_cnt": (1 << 64) - 1}),
    "instructions 2**63": ("branch", 3, {"insn_cnt": 1 << 63}),
    "gap before time 0": ("branch", 3, {"gap_delta": (1 << 32) - 1}),
    "power time 2**64-1": ("power", 0, {"time": (1 << 64) - 1}),
}


@pytest.mark.parametrize("damage", DAMAGED_RECORDS.values(), ids=DAMAGED_RECORDS.keys())
def test_a_dlfilter_record_with_a_number_out_of_range_is_a_decode_error(
    stream: bytes, damage: tuple[str, int, dict[str, int]]
) -> None:
    record, index, fields = damage
    plain, _, _ = _parse_both_ways(stream)
    events, items, stats = _parse_both_ways(_with(stream, record, index, **fields))
    assert stats.damaged == stats.decode_errors == 1
    errors = [i for i, e in enumerate(events) if isinstance(e, DecodeError)]
    assert len(errors) == 1
    error = events[errors[0]]
    assert isinstance(error, DecodeError)
    assert error.message.startswith(f"{DAMAGED_DATA}: ")
    assert (error.pid, error.tid) == (100, 100)
    # The damaged record is replaced, in place; everything else is as it was.
    i = errors[0]
    assert events[:i] + events[i + 1 :] == [e for j, e in enumerate(plain) if j != i]
    assert [type(e) for e in items if not isinstance(e, BranchBatch)].count(DecodeError) == 1


def test_dlfilter_counts_past_the_decodes_budget_are_decode_errors(stream: bytes) -> None:
    """Each count may be in range while their sum is not: the thread totals (int64 in the
    C engine) must not overflow, so counts past the decode's budget are damage too."""
    # The stream's counts add up to 60, 7 of them in the third branch: make it fill the
    # budget exactly.
    data = _with(stream, "branch", 2, insn_cnt=COUNT_BUDGET - 60 + 3)
    events, _, stats = _parse_both_ways(data)
    assert stats.damaged == 0
    # One cycle more, earlier: the last branch (a return with 5 instructions) overruns.
    data = _with(data, "branch", 4, cyc_cnt=5)
    events, _, stats = _parse_both_ways(data)
    assert stats.damaged == 1
    last = events[-1]
    assert isinstance(last, DecodeError) and "counts 5/0" in last.message
