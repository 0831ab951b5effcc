"""Fuzzing the dlfilter record stream reader: streams the real C filter wrote (driven by
the fake perf of ``support.dlfilter_harness``: calls, returns, dropped jumps, power
events, a trace gap, instruction detail with lines records), with perf's text lines
between the records as perf prints them, then damaged: record fields set at and past the
limits of their width (times, counts, gaps, ids, line ranges, sizes, trailer counters),
bytes flipped, pieces cut out or repeated, the end cut off.

The reader may refuse a stream in one line (:class:`BadInputError`). Otherwise what it
gives (events, or columnar batches, in a time window or not, whatever the chunking) the C
and Python engines take, and the trace writer writes, without an exception.
"""

from __future__ import annotations

import contextlib
import io
import struct
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.mutations import damaged_bytes, edge_numbers
from fuzz.target import FuzzTarget, quick
from ptscope.decode import record_format as rf
from ptscope.decode.dlfilter_stream import RecordStreamParser
from ptscope.errors import BadInputError
from ptscope.fxt import FxtWriter
from ptscope.model import BranchBatch, Event
from ptscope.model import BranchFlags as F
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import make_engine
from support.dlfilter_harness import (
    CODE,
    FakePerf,
    Sym,
    build_dlfilter,
    call_and_loop,
    scattered_jumps,
    split_stream,
)

MAIN = Sym("main", "/usr/bin/prog", 0x1000, 0x1100)
FOO = Sym("foo", "/usr/bin/prog", 0x1100, 0x1200)
BAR = Sym("bar", "/lib/libbar.so", 0x7000, 0x7100)
TEXT_LINES = [
    b" instruction trace error type 1 time 1.000000150 cpu 0 pid 100 tid 100 ip 0x1030 "
    b"code 6: Trace doesn't match instruction\n",
    b" 100/100      0.000000090: PERF_RECORD_COMM exec: prog:100/100\n",
    b"Warning: something odd\n",
]


def _plain_stream(path: Path) -> bytes:
    perf = FakePerf(build_dlfilter(), [str(path)])
    assert perf.start() == 0
    perf.sample(ip=0, addr=0x1000, flags=int(F.BRANCH | F.TRACE_BEGIN), addr_sym=MAIN, time=95)
    perf.sample(ip=0x1030, event="cbr", raw=struct.pack("<III", 20, 2_000_000, 0), time=96)
    for i in range(8):
        t = 100 + 10 * i
        for tid in (100, 101):
            perf.sample(ip=0x1030, addr=0x1100, flags=int(F.BRANCH | F.CALL), ip_sym=MAIN,
                        addr_sym=FOO, time=t, tid=tid, insn_cnt=3, cyc_cnt=9)  # fmt: skip
            perf.sample(ip=0x1110, addr=0x1120, flags=int(F.BRANCH | F.CONDITIONAL),
                        ip_sym=FOO, addr_sym=FOO, time=t + 1, tid=tid, insn_cnt=2)  # fmt: skip
            perf.sample(ip=0x1130, addr=0x7000, flags=int(F.BRANCH | F.CALL), ip_sym=FOO,
                        addr_sym=BAR, time=t + 2, tid=tid, cyc_cnt=4)  # fmt: skip
            perf.sample(ip=0x7010, addr=0x1135, flags=int(F.BRANCH | F.RETURN), ip_sym=BAR,
                        addr_sym=FOO, time=t + 3, tid=tid)  # fmt: skip
            perf.sample(ip=0x1140, addr=0x1035, flags=int(F.BRANCH | F.RETURN), ip_sym=FOO,
                        addr_sym=MAIN, time=t + 4, tid=tid)  # fmt: skip
        if i == 4:
            perf.sample(ip=0x1080, addr=0, flags=int(F.BRANCH | F.CALL | F.SYSCALLRET |
                        F.TRACE_END), ip_sym=MAIN, time=t + 5)  # fmt: skip
            perf.sample(ip=0, addr=0x1084, flags=int(F.BRANCH | F.TRACE_BEGIN), addr_sym=MAIN,
                        time=t + 8)  # fmt: skip
    assert perf.stop() == 0
    return path.read_bytes()


def _insns_stream(path: Path) -> bytes:
    perf = FakePerf(build_dlfilter(), [str(path), "insns"], code=dict(CODE))
    assert perf.start() == 0
    time = 1000
    for _ in range(3):
        for sample in [*call_and_loop(100), *scattered_jumps(300)]:
            time += 1
            perf.sample(time=time, **sample)  # type: ignore[arg-type]
    assert perf.stop() == 0
    return path.read_bytes()


def _with_text(stream: bytes) -> bytes:
    """perf's own lines between records, where perf would print them."""
    out = split_stream(stream)
    # Before a branch record (or the lines records that belong to it): between samples.
    kinds = ["", *out.order]
    at = [
        o
        for o, kind, before in zip(out.offsets, out.order, kinds, strict=False)
        if kind in ("branch", "lines") and before not in ("lines",)
    ]
    cuts = [at[len(at) // 5], at[len(at) // 2], at[-2]]
    pieces = [stream[: cuts[0]]]
    for i, cut in enumerate(cuts):
        pieces.append(TEXT_LINES[i])
        pieces.append(stream[cut : cuts[i + 1] if i + 1 < len(cuts) else len(stream)])
    return b"".join(pieces)


@cache
def seeds() -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        return [_plain_stream(Path(tmp) / "plain.bin"), _insns_stream(Path(tmp) / "insns.bin")]


_RECORDS = {
    "branch": rf.BRANCH_DTYPE,
    "location": rf.LOCATION_DTYPE,
    "string": rf.STRING_DTYPE,
    "power": rf.POWER_DTYPE,
    "trailer": rf.TRAILER_DTYPE,
    "lines": rf.LINES_DTYPE,
}


_VALUES = {
    "branch": {"cpumode", "gap_insns", "flags", "pid", "tid", "time", "ip", "addr", "insn_cnt",
               "cyc_cnt", "cpu", "gap_delta", "line_first", "line_count"},
    "power": {"pid", "tid", "cpu", "time", "cbr", "freq_mhz"},
    "location": {"ip", "offset", "pid"},
    "lines": {"range"},
}  # fmt: skip
"""The fields that are numbers, not structure (ids, sizes, tags)."""


@st.composite
def _field_edit(draw: st.DrawFn, data: bytearray) -> None:
    """Set one field of one record (found by walking the stream) to an edge value of its
    width; an instruction-detail branch's line range too."""
    try:
        out = split_stream(bytes(data))
    except (AssertionError, struct.error, UnicodeDecodeError, IndexError, KeyError):
        return  # no longer walkable: other edits do
    # Mostly the numbers a record carries (what the stream's structure does not check);
    # sometimes ids, sizes and counters too.
    structural = draw(st.integers(0, 4)) == 0
    kinds = _RECORDS if structural else _VALUES
    records = [(o, k) for o, k in zip(out.offsets, out.order, strict=True) if k in kinds]
    if not records:
        return
    offset, kind = draw(st.sampled_from(records))
    dtype = _RECORDS[kind]
    insns = bool(int(out.header["options"]) & rf.OPT_INSNS)  # type: ignore[call-overload]
    if kind == "branch" and insns:
        dtype = rf.INSNS_BRANCH_DTYPE
    names = [n for n in dtype.names or () if n != "tag" and (structural or n in _VALUES[kind])]
    name = draw(st.sampled_from(names))
    field_type, at = dtype.fields[name][:2]  # type: ignore[index]
    width = field_type.itemsize if field_type.subdtype is None else field_type.base.itemsize
    if field_type.subdtype is not None:  # the lines record's ranges: one of its numbers
        at += width * draw(st.integers(0, field_type.itemsize // width - 1))
    value = draw(edge_numbers(8 * width))
    data[offset + at : offset + at + width] = value.to_bytes(width, "little")


@st.composite
def damaged_streams(draw: st.DrawFn) -> bytes:
    """A real stream with record fields at their limits, perf's lines between its
    records or not, then (sometimes) bytes damaged."""
    data = bytearray(draw(st.sampled_from(seeds())))
    for _ in range(draw(st.integers(1, 4))):
        draw(_field_edit(data))
    stream = bytes(data)
    if draw(st.booleans()):
        with contextlib.suppress(AssertionError, struct.error, UnicodeDecodeError, IndexError):
            stream = _with_text(stream)
    if draw(st.integers(0, 3)):
        return stream
    return draw(damaged_bytes([stream], max_edits=3))


def _parse(data: bytes, chunk: int, columnar: bool, window: Any) -> list[Any]:
    parser = RecordStreamParser("fuzzed stream", time_window=window)
    items: list[Any] = []
    for i in range(0, len(data), chunk):
        piece = data[i : i + chunk]
        items += parser.feed_columnar(piece) if columnar else parser.feed(piece)
    parser.close()
    return items


def check_stream(case: tuple[bytes, int, Any]) -> None:
    data, chunk, window = case
    try:
        batches: list[Event | BranchBatch] = _parse(data, chunk, True, window)
        events: list[Event] = _parse(data, chunk, False, window)
    except BadInputError as e:
        assert "\n" not in e.message
        return
    for engine, items in ((make_engine(), batches), (TraceSegmentEngine(), events)):
        engine.feed_all(items)
        FxtWriter(io.BytesIO()).timeline(engine.finish())


TARGET = FuzzTarget(
    name="dlfilter-stream",
    inputs=st.tuples(
        damaged_streams(),
        st.sampled_from([1 << 20, 72, 101, 4096]),
        st.sampled_from([None, None, (None, 130), (120, None), (0, 1 << 62)]),
    ),
    check=check_stream,
)

test_fuzz = quick(TARGET)
