"""The columnar reader against the strict one: the same slices (depths included), names,
instants, counters and errors, on random traces, at any block size, with string and
thread tables reused, with words that look like record headers, and on traces outside
the subset it decodes itself (it must hand those to the strict reader)."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope.fxt import FxtFormatError, FxtWriter, columns, read_trace, write_timeline
from ptscope.fxt import records as rec
from ptscope.fxt.columns import TraceColumns, read_columns, timeline_from_trace
from ptscope.timeline import ThreadTimeline, Timeline, parents_from_depth
from support.timeline_strategies import timelines

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def strict(path: Path | bytes) -> Timeline:
    return timeline_from_trace(read_trace(path))


def assert_same(fast: TraceColumns, slow: Timeline) -> None:
    """Row for row, name for name: what the strict reader read."""
    got = fast.to_timeline()
    assert [(t.pid, t.tid, t.name) for t in got.threads] == [
        (t.pid, t.tid, t.name) for t in slow.threads
    ]
    for a, b in zip(got.threads, slow.threads, strict=True):
        for column in ("start", "end", "depth", "address", "instructions", "cycles", "flags"):
            assert np.array_equal(getattr(a, column), getattr(b, column)), column
        assert [got.names[i] for i in a.name_id] == [slow.names[i] for i in b.name_id]
        assert a.instants == b.instants and a.counters == b.counters
    assert got.processes == slow.processes
    # The parent column is the row one level up (checked against the strict depths).
    for t in fast.threads:
        rows = slice(t.first, t.stop)
        local = parents_from_depth(fast.depth[rows])
        assert np.array_equal(fast.parent[rows], np.where(local >= 0, local + t.first, -1))


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if the columnar reader hands the trace to the strict reader."""

    def refuse(source: object) -> object:
        raise AssertionError("the columnar reader fell back to the strict reader")

    monkeypatch.setattr(columns, "read_trace", refuse)


@SETTINGS
@given(timeline=timelines(), gz=st.booleans(), block=st.sampled_from([8, 24, 200, 4096, 0]))
def test_random_traces_read_as_the_strict_reader_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeline: Timeline, gz: bool, block: int
) -> None:
    path = tmp_path / ("t.fxt.gz" if gz else "t.fxt")
    write_timeline(timeline, path)
    slow = strict(path)
    if block:  # blocks of a few words: records cut at every possible place
        monkeypatch.setattr(columns, "_BLOCK_BYTES", block)
    monkeypatch.setattr(columns, "read_trace", lambda _: pytest.fail("fell back"))
    assert_same(read_columns(path), slow)


@SETTINGS
@given(
    timeline=timelines(max_threads=6),
    string_slots=st.sampled_from([5, 9]),
    thread_slots=st.sampled_from([1, 2]),
)
def test_reused_table_entries_resolve_to_what_they_held_then(
    monkeypatch: pytest.MonkeyPatch, timeline: Timeline, string_slots: int, thread_slots: int
) -> None:
    time_range = timeline.time_range()
    out = io.BytesIO()
    writer = FxtWriter(
        out,
        time_base=time_range[0] if time_range else 0,
        string_slots=string_slots,
        thread_slots=thread_slots,
    )
    writer.timeline(timeline)
    writer.close()
    data = out.getvalue()
    slow = strict(data)
    monkeypatch.setattr(columns, "read_trace", lambda _: pytest.fail("fell back"))
    assert_same(read_columns(data), slow)


def _lookalike(thread_ref: int, category_ref: int, size: int) -> int:
    """A word that reads as a complete-event header of that thread and category."""
    return (
        rec.RecordType.EVENT
        | (size << 4)
        | (rec.EventType.DURATION_COMPLETE << 16)
        | (thread_ref << 24)
        | (category_ref << 32)
        | (1 << 48)
    )


@pytest.mark.usefixtures("no_fallback")
@pytest.mark.parametrize("size", [1, 2, 3, 4, 40])
def test_words_that_look_like_slice_headers_do_not_fool_the_framer(size: int) -> None:
    """Start times, ends and addresses that look like the next record's header (with any
    size): the framer's chain check must not take them for records."""
    ticks = _lookalike(1, 1, size)  # thread slot 1, the category's pinned slot 1
    base = 1000
    n = 40
    start = base + ticks + np.arange(n, dtype=np.int64) * 10
    thread = ThreadTimeline(
        pid=1,
        tid=2,
        start=start,
        end=start + 5,
        depth=np.zeros(n, dtype=np.int32),
        name_id=np.arange(n, dtype=np.int32) % 3,
        address=np.full(n, _lookalike(1, 1, size), dtype=np.uint64),
        instructions=np.where(np.arange(n) % 7 == 0, -1, ticks).astype(np.int64),
        cycles=np.full(n, -1, dtype=np.int64),
        flags=np.where(np.arange(n) % 5 == 0, 1, 0).astype(np.uint8),
    )
    timeline = Timeline(names=["a", "b", "c"], threads=[thread])
    out = io.BytesIO()
    with FxtWriter(out, time_base=base) as writer:
        writer.timeline(timeline)
    data = out.getvalue()
    assert_same(read_columns(data), strict(data))


def test_begin_end_events_are_left_to_the_strict_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.BytesIO()
    with FxtWriter(out) as writer:
        writer.begin(1, 2, 10, "outer")
        writer.complete(1, 2, 12, 15, "inner", {"address": 5})
        writer.end(1, 2, 20, "outer")
        writer.instant(1, 2, 13, "[decode error: x]")
    data = out.getvalue()
    used: list[object] = []
    monkeypatch.setattr(columns, "read_trace", lambda s: used.append(s) or read_trace(s))
    got = read_columns(data)
    assert used == [data]
    assert_same(got, strict(data))
    assert [got.names[i] for i in got.name_id] == ["outer", "inner"]
    assert got.depth.tolist() == [0, 1] and got.parent.tolist() == [-1, 0]


def q(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *[w & (1 << 64) - 1 for w in words])


HEAD = (
    rec.magic_record()
    + rec.provider_info_record(0, "t")
    + rec.provider_section_record(0)
    + rec.initialization_record(rec.TICKS_PER_SECOND)
    + rec.thread_record(1, 10, 11)
    + rec.string_record(1, b"f")
)


def complete(start: int, end: int) -> bytes:
    return rec.event_record(rec.EventType.DURATION_COMPLETE, 1, 0, 1, start, trailing=[end])


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello, world\n",
        b"\x01\x02\x03",
        HEAD + q(0x4),  # size 0
        HEAD + complete(0, 5)[:20],  # truncated
        HEAD + complete(9, 5),  # ends before it starts
        HEAD + complete(0, 10) + complete(5, 15),  # overlaps without nesting
        HEAD + rec.event_record(rec.EventType.DURATION_COMPLETE, 1, 0, 7, 0, trailing=[5]),
        HEAD + rec.event_record(rec.EventType.DURATION_COMPLETE, 2, 0, 1, 0, trailing=[5]),
        HEAD + q(0x0001_0000_0104_0044, 0, 5, 0),  # size field one word too long
        b"\x1f\x8b\x08\x00garbage",
    ],
    ids=lambda d: repr(d[-12:]),
)
def test_bad_traces_fail_with_the_strict_readers_message(data: bytes) -> None:
    with pytest.raises(FxtFormatError) as expected:
        read_trace(data)
    with pytest.raises(FxtFormatError) as got:
        read_columns(data)
    assert str(got.value) == str(expected.value)


@pytest.mark.usefixtures("no_fallback")
def test_argument_columns_can_be_skipped(tmp_path: Path) -> None:
    thread = ThreadTimeline(
        pid=1,
        tid=1,
        start=np.array([0, 1], dtype=np.int64),
        end=np.array([9, 5], dtype=np.int64),
        depth=np.array([0, 1], dtype=np.int32),
        name_id=np.array([0, 1], dtype=np.int32),
        address=np.array([0x10, 0x20], dtype=np.uint64),
        instructions=np.array([100, 20], dtype=np.int64),
        cycles=np.array([-1, 7], dtype=np.int64),
        flags=np.array([1, 0], dtype=np.uint8),
    )
    path = tmp_path / "t.fxt"
    write_timeline(Timeline(names=["main", "leaf"], threads=[thread]), path)
    full = read_columns(path)
    assert full.address.tolist() == [0x10, 0x20] and full.cycles.tolist() == [-1, 7]
    bare = read_columns(path, with_args=False)
    assert bare.address.tolist() == [0, 0] and bare.instructions.tolist() == [-1, -1]
    assert np.array_equal(bare.start, full.start) and np.array_equal(bare.depth, full.depth)


@given(st.lists(st.integers(0, 2), max_size=60))
def test_parents_from_depth_is_the_stack_walk(steps: list[int]) -> None:
    """Random valid depth sequences (each row at most one level below the previous)."""
    depth: list[int] = []
    for step in steps:  # 0: up to 2 levels up, 1: same level, 2: one level down
        current = depth[-1] if depth else -1
        depth.append(max(0, current - 2) if step == 0 else current if step == 1 else current + 1)
    depth = [max(d, 0) for d in depth]
    if depth:
        depth[0] = 0
    want: list[int] = []
    stack: list[int] = []
    for row, d in enumerate(depth):
        del stack[d:]
        want.append(stack[-1] if stack else -1)
        stack.append(row)
    got = parents_from_depth(np.array(depth, dtype=np.int32))
    assert got.tolist() == want
