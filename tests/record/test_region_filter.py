"""--filter START,STOP as a pure Timeline transformation (reconstruct/region_filter.py)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.errors import UsageError
from ptscope.reconstruct.region_filter import (
    clip_to_regions,
    filter_regions,
    find_regions,
    parse_filter,
)
from ptscope.timeline import (
    CounterSample,
    Instant,
    SliceFlags,
    ThreadTimeline,
    Timeline,
    check_nesting,
)


def make(rows_by_tid: dict[int, list[tuple[int, int, int, str]]]) -> Timeline:
    names: list[str] = []
    threads = []
    for tid, rows in sorted(rows_by_tid.items()):
        rows = sorted(rows, key=lambda r: (r[0], r[2]))
        ids = []
        for r in rows:
            if r[3] not in names:
                names.append(r[3])
            ids.append(names.index(r[3]))
        n = len(rows)
        threads.append(
            ThreadTimeline(
                pid=1,
                tid=tid,
                start=np.array([r[0] for r in rows], dtype=np.int64),
                end=np.array([r[1] for r in rows], dtype=np.int64),
                depth=np.array([r[2] for r in rows], dtype=np.int32),
                name_id=np.array(ids, dtype=np.int32),
                address=np.zeros(n, dtype=np.uint64),
                instructions=np.full(n, -1, dtype=np.int64),
                cycles=np.full(n, -1, dtype=np.int64),
                flags=np.zeros(n, dtype=np.uint8),
            )
        )
    return Timeline(names=names, threads=threads, processes={1: "prog"})


def rows(timeline: Timeline, tid: int = 1) -> list[tuple[int, int, int, str, SliceFlags]]:
    thread = next(t for t in timeline.threads if t.tid == tid)
    return [(s.start, s.end, s.depth, s.name, s.flags) for s in thread.slices(timeline.names)]


TRACE = {
    1: [
        (0, 100, 0, "main"),
        (10, 20, 1, "setup"),
        (30, 40, 1, "START"),
        (45, 60, 1, "work"),
        (46, 50, 2, "leaf"),
        (70, 75, 1, "STOP"),
        (80, 90, 1, "teardown"),
    ]
}


def test_parse_filter() -> None:
    assert parse_filter("a,b") == ("a", "b")
    assert parse_filter(" ns::f(int) , g ") == ("ns::f(int)", "g")
    for bad in ("a", "a,", ",b", "a,b,c", ""):
        with pytest.raises(UsageError):
            parse_filter(bad)


def test_keeps_the_region_and_clips_what_spans_it() -> None:
    out = filter_regions(make(TRACE), "START", "STOP")
    none, inferred, open_end = (
        SliceFlags.NONE,
        SliceFlags.INFERRED_START,
        SliceFlags.OPEN_AT_END,
    )
    assert rows(out) == [
        (30, 70, 0, "main", inferred | open_end),
        (30, 40, 1, "START", none),
        (45, 60, 1, "work", none),
        (46, 50, 2, "leaf", none),
    ]
    check_nesting(out.threads[0])


def test_regions_are_global_across_threads_and_pair_with_the_next_stop() -> None:
    trace = {
        1: [(0, 10, 0, "START"), (20, 25, 0, "START"), (100, 110, 0, "START")],
        2: [(5, 200, 0, "loop"), (50, 60, 1, "STOP"), (70, 80, 1, "STOP"), (150, 160, 1, "STOP")],
    }
    timeline = make(trace)
    # The second START is inside the open region; the STOP at 70 has no START before it.
    assert find_regions(timeline, "START", "STOP") == [(0, 50), (100, 150)]
    out = filter_regions(timeline, "START", "STOP")
    loop_pieces = [r[:2] for r in rows(out, 2) if r[3] == "loop"]
    assert loop_pieces == [(5, 50), (100, 150)]  # one slice, two pieces
    for thread in out.threads:
        check_nesting(thread)


def test_instants_and_counters_outside_are_dropped() -> None:
    timeline = make(TRACE)
    timeline.threads[0].instants = [Instant(35, "in"), Instant(95, "out")]
    timeline.threads[0].counters = [CounterSample(31, "freq", 1), CounterSample(5, "freq", 2)]
    out = filter_regions(timeline, "START", "STOP")
    assert [i.name for i in out.threads[0].instants] == ["in"]
    assert [c.value for c in out.threads[0].counters] == [1]


def test_clear_errors_when_nothing_matches() -> None:
    with pytest.raises(UsageError, match="nope never called"):
        filter_regions(make(TRACE), "START", "nope")
    with pytest.raises(UsageError, match="no call of START after a call of STOP"):
        filter_regions(make(TRACE), "STOP", "START")


def test_input_is_not_modified() -> None:
    timeline = make(TRACE)
    before = rows(timeline)
    filter_regions(timeline, "START", "STOP")
    assert rows(timeline) == before


@st.composite
def nested_threads(draw: st.DrawFn) -> list[tuple[int, int, int, str]]:
    """A random properly nested call tree (built by a random walk)."""
    rows: list[tuple[int, int, int, str]] = []
    stack: list[tuple[int, str]] = []
    t = 0
    for _ in range(draw(st.integers(1, 40))):
        t += draw(st.integers(1, 5))
        if stack and draw(st.booleans()):
            start, name = stack.pop()
            rows.append((start, t, len(stack), name))
        elif len(stack) < 6:
            stack.append((t, draw(st.sampled_from(["START", "STOP", "a", "b"]))))
    t += 1
    while stack:
        start, name = stack.pop()
        rows.append((start, t, len(stack), name))
        t += draw(st.integers(1, 2))
    return rows


@settings(max_examples=300, deadline=None)
@given(nested_threads(), nested_threads())
def test_properties(a: list[tuple[int, int, int, str]], b: list[tuple[int, int, int, str]]) -> None:
    timeline = make({1: a, 2: b})
    for thread in timeline.threads:
        check_nesting(thread)  # the generator makes valid input
    regions = find_regions(timeline, "START", "STOP")
    out = clip_to_regions(timeline, regions)
    for begin, end in regions:
        assert begin <= end
    assert all(r1[1] <= r2[0] for r1, r2 in pairwise(regions))
    for thread, original in zip(out.threads, timeline.threads, strict=True):
        check_nesting(thread)
        for i in range(len(thread)):
            s, e = int(thread.start[i]), int(thread.end[i])
            assert any(b <= s and e <= en for b, en in regions)
        # Nothing that overlaps a region with a positive length is lost.
        for i in range(len(original)):
            s, e = int(original.start[i]), int(original.end[i])
            for begin, end in regions:
                if s < end and e > begin:
                    lo, hi = max(s, begin), min(e, end)
                    assert any(
                        int(thread.start[j]) == lo
                        and int(thread.end[j]) == hi
                        and thread.depth[j] == original.depth[i]
                        for j in range(len(thread))
                    )
