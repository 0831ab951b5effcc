"""Reading instruction detail (lines records, exact counts) from streams the real filter
writes with ``--dlarg insns``: events, columnar batches, chunking, windows, damage."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decode.test_dlfilter_columnar import expand, parse_columnar
from decode.test_dlfilter_stream import ERROR_LINE, parse
from ptscope.decode import record_format as rf
from ptscope.decode.dlfilter_stream import RecordStreamParser, make_location
from ptscope.errors import BadInputError
from ptscope.model import BranchBatch, BranchEvent, BranchKind, LocationTable, TraceState
from support.dlfilter_harness import (
    CODE,
    FakePerf,
    build_dlfilter,
    call_and_loop,
    scattered_jumps,
    split_stream,
)

BRANCH_COLUMNS = (
    "pid",
    "tid",
    "time",
    "flags",
    "src",
    "dst",
    "insn_count",
    "cycle_count",
    "gap_delta",
)
FOO_LINE = 0x1100 >> 6
MAIN_LINE = 0x1000 >> 6


@pytest.fixture(scope="module")
def insns_stream(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Two threads running main -> foo (a loop) -> back, twenty times each, and a third
    one's branches with seven line ranges (lines records)."""
    out = tmp_path_factory.mktemp("insns") / "s.bin"
    perf = FakePerf(build_dlfilter(), [str(out), "insns"], code=dict(CODE))
    assert perf.start() == 0
    time = 1000
    for _ in range(20):
        for tid in (100, 200):
            for sample in call_and_loop(tid):
                time += 1
                assert perf.sample(time=time, **sample) == 1  # type: ignore[arg-type]
        for sample in scattered_jumps(300):
            time += 1
            assert perf.sample(time=time, **sample) == 1  # type: ignore[arg-type]
    assert perf.stop() == 0
    return out.read_bytes()


def with_error_line(data: bytes, before_branch: int) -> bytes:
    """perf's error text before the n-th branch and its lines records (perf prints
    between samples; the filter writes a branch's records in one go)."""
    out = split_stream(data)
    at = None
    seen = 0
    for offset, kind in zip(out.offsets, out.order, strict=True):
        if kind == "lines":
            at = offset if at is None else at
        elif kind == "branch":
            if seen == before_branch:
                at = offset if at is None else at
                break
            seen += 1
            at = None
        else:
            at = None
    assert at is not None
    return data[:at] + ERROR_LINE.encode() + data[at:]


def _branches(events: list[object]) -> list[BranchEvent]:
    return [e for e in events if isinstance(e, BranchEvent)]


def test_events_carry_exact_counts_and_lines(insns_stream: bytes) -> None:
    parser = RecordStreamParser("test")
    events = _branches(parser.feed(insns_stream))
    parser.close()
    assert parser.stats.insns
    assert parser.stats.trailer is not None and parser.stats.trailer["blocks_unknown"] == 0
    assert [(e.insn_count, e.lines) for e in events if e.tid == 100][:4] == [
        (0, ()),
        (3, (MAIN_LINE,)),
        (17, (FOO_LINE,)),
        (1, (MAIN_LINE,)),
    ]
    scattered = [e for e in events if e.tid == 300 and e.insn_count]
    assert len(scattered) == 20
    assert {e.lines for e in scattered} == {tuple((0x2000 >> 6) + 2 * k for k in range(7))}
    assert len(events) == 2 * 20 * 4 + 20 * 2
    assert parser.stats.lines_records == 20 * 2


@pytest.fixture(scope="module")
def plain_stream(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The same program, without instruction detail."""
    out = tmp_path_factory.mktemp("plain") / "s.bin"
    perf = FakePerf(build_dlfilter(), [str(out)], code=dict(CODE))
    assert perf.start() == 0
    for i, sample in enumerate(call_and_loop()):
        perf.sample(time=10 + i, **sample)  # type: ignore[arg-type]
    assert perf.stop() == 0
    return out.read_bytes()


def test_plain_streams_have_no_lines(plain_stream: bytes) -> None:
    events = _branches(parse(plain_stream))
    assert events and all(e.lines is None for e in events)
    batches = [i for i in parse_columnar(plain_stream) if isinstance(i, BranchBatch)]
    assert batches and all(b.line_offsets is None and b.lines is None for b in batches)


@pytest.mark.parametrize("chunk", [None, 1, 7, 72, 144, 1000])
def test_any_chunking_and_columns_give_the_same_events(
    insns_stream: bytes, chunk: int | None
) -> None:
    data = with_error_line(insns_stream, 9)
    events = parse(data, chunk)
    assert _branches(events) == _branches(parse(insns_stream))
    items = parse_columnar(data, chunk)
    batches = [i for i in items if isinstance(i, BranchBatch)]
    assert batches and all(b.line_offsets is not None for b in batches)
    assert expand(items) == events


def test_batch_columns(insns_stream: bytes) -> None:
    batches = [i for i in parse_columnar(insns_stream) if isinstance(i, BranchBatch)]
    batch = max(batches, key=len)
    assert len(batch) > 100
    assert batch.line_offsets is not None and batch.lines is not None
    assert batch.line_offsets.dtype == np.int32 and batch.lines.dtype == np.uint64
    counts = np.diff(batch.line_offsets)
    # The threads running main and foo: one line of code per branch but the trace starts.
    loops = batch.tid != 300
    assert set(counts[loops].tolist()) == {0, 1}
    rows = [list(e.lines or ()) for e in batch.events()]
    expected = [
        [FOO_LINE if insns == 17 else MAIN_LINE] if n else []
        for insns, n in zip(batch.insn_count.tolist(), counts.tolist(), strict=True)
    ]
    got_loops = [r for r, keep in zip(rows, loops.tolist(), strict=True) if keep]
    assert got_loops == [e for e, keep in zip(expected, loops.tolist(), strict=True) if keep]
    # The seven-range branches.
    assert set(counts[~loops].tolist()) <= {0, 7}
    # Round trip through events.
    again = BranchBatch.from_events(batch.events(), LocationTable())
    assert list(again.events()) == list(batch.events())


def test_time_window_keeps_each_branchs_lines(insns_stream: bytes) -> None:
    whole = _branches(parse(insns_stream))
    lo, hi = whole[10].time, whole[50].time
    parser = RecordStreamParser("test", time_window=(lo, hi))
    inside = _branches(parser.feed(insns_stream))
    parser.close()
    assert inside == [e for e in whole if lo <= e.time <= hi]
    assert (
        parse_columnar(insns_stream, window=(lo, hi))
        and expand(parse_columnar(insns_stream, window=(lo, hi))) == inside
    )
    # The first branch after the window, per thread, keeps its lines for the next window.
    fix = parser.first_after_end[(100, 200)]
    after = next(e for e in whole if e.tid == 200 and e.time > hi)
    assert (fix.insn_count, fix.lines) == (after.insn_count, after.lines)


def test_lines_record_without_its_branch_is_an_error(insns_stream: bytes) -> None:
    out = split_stream(insns_stream)
    at = out.offsets[out.order.index("lines")]
    # Text between lines records and their branch: perf cannot print there.
    end = at + 2 * rf.LINES.size
    damaged = insns_stream[:end] + ERROR_LINE.encode() + insns_stream[end:]
    with pytest.raises(BadInputError, match="lines record not followed"):
        parse(damaged)


def test_lines_records_in_a_plain_stream_are_an_error(
    insns_stream: bytes, plain_stream: bytes
) -> None:
    # The header says what it holds: without its insns bit, the records' sizes are wrong.
    header = bytearray(insns_stream[: rf.HEADER.size])
    options_at = rf.HEADER_DTYPE.fields["options"][1]
    header[options_at] = 0
    with pytest.raises(BadInputError, match="record sizes"):
        parse(bytes(header) + insns_stream[rf.HEADER.size :])
    # A lines record among a plain stream's branch records.
    plain = plain_stream
    records = split_stream(plain)
    at = records.offsets[records.order.index("branch")]
    fake = bytes([rf.TAG_LINES, 1]) + bytes(rf.BRANCH.size - 2)
    with pytest.raises(BadInputError, match="no instruction detail"):
        parse(plain[:at] + fake + plain[at:])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corruption_is_an_error_or_harmless(insns_stream: bytes, data: st.DataObject) -> None:
    raw = bytearray(insns_stream)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(rf.HEADER.size, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(BadInputError):
        events = parse(bytes(raw))
        assert all(e.lines is not None for e in _branches(events))


def test_branch_batch_line_columns_round_trip() -> None:
    table = LocationTable()
    src, dst = make_location(0x1004, "main", 4, "/p"), make_location(0x1100, "foo", 0, "/p")
    events = [
        BranchEvent(
            1, 1, 10, BranchKind.CALL, TraceState.NONE, src, dst, insn_count=3, lines=(64,)
        ),
        BranchEvent(1, 1, 11, BranchKind.CALL, TraceState.NONE, src, dst, lines=()),
        BranchEvent(1, 1, 12, BranchKind.CALL, TraceState.NONE, src, dst, lines=(7, 8, 9)),
    ]
    batch = BranchBatch.from_events(events, table)
    assert batch.line_offsets is not None and batch.lines is not None
    assert batch.line_offsets.tolist() == [0, 1, 1, 4]
    assert batch.lines.tolist() == [64, 7, 8, 9]
    assert list(batch.events()) == events
    # Without lines anywhere: no line columns, and events say None.
    plain = [BranchEvent(1, 1, 10, BranchKind.CALL, TraceState.NONE, src, dst)]
    assert BranchBatch.from_events(plain, table).lines is None
    assert next(BranchBatch.from_events(plain, table).events()).lines is None
    # Columns that do not fit are refused.
    with pytest.raises(ValueError, match="line offsets"):
        BranchBatch(
            table,
            *(getattr(batch, c) for c in BRANCH_COLUMNS),
            line_offsets=batch.line_offsets[:-1],
            lines=batch.lines,
        )
    with pytest.raises(ValueError, match="not both"):
        BranchBatch(table, *(getattr(batch, c) for c in BRANCH_COLUMNS), lines=batch.lines)


def test_more_lines_than_instructions_can_touch_is_an_error(insns_stream: bytes) -> None:
    """A block of c instructions spans at most 15c bytes: c + 1 lines. A branch whose
    lines pass twice its count is damage (a campaign's such stream took 13 s)."""
    records = split_stream(insns_stream)
    for offset, kind in zip(records.offsets, records.order, strict=True):
        if kind != "branch":
            continue
        rec = np.frombuffer(insns_stream, dtype=rf.INSNS_BRANCH_DTYPE, count=1, offset=offset)
        insns, count = int(rec["insn_cnt"][0]), int(rec["line_count"][0])
        if insns and count:
            break
    else:
        raise AssertionError("no branch with lines")
    assert count <= 2 * insns  # the genuine stream keeps the rule
    damaged = bytearray(insns_stream)
    field = rf.INSNS_BRANCH_DTYPE.fields["line_count"][1]
    damaged[offset + field : offset + field + 8] = (2 * insns + 1).to_bytes(8, "little")
    with pytest.raises(BadInputError, match="more code lines than its instructions"):
        parse(bytes(damaged))


def test_first_branch_after_the_window_is_each_threads_first(insns_stream: bytes) -> None:
    # perf decodes tens of thousands of branches past a window's end; only each thread's
    # first one is kept for the next window, wherever the end falls.
    whole = _branches(parse(insns_stream))
    assert len({(e.pid, e.tid) for e in whole}) > 1
    for hi in sorted({e.time for e in whole})[::7]:
        parser = RecordStreamParser("test", time_window=(None, hi))
        parser.feed(insns_stream)
        parser.close()
        expected = {}
        for e in whole:
            if e.time > hi:
                expected.setdefault((e.pid, e.tid), e)
        assert parser.first_after_end.keys() == expected.keys()
        for key, after in expected.items():
            fix = parser.first_after_end[key]
            assert (fix.time, fix.insn_count, fix.lines) == (
                after.time,
                after.insn_count,
                after.lines,
            )
