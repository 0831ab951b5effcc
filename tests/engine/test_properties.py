"""Property tests of the trace-segment engine over generated event streams."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope.fxt import read_trace, write_timeline
from ptscope.model import (
    NOWHERE,
    BranchEvent,
    BranchKind,
    DecodeError,
    Event,
    Location,
    TraceState,
)
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.timeline import SliceFlags
from support.fxt_check import check_against_timeline

FUNCS = ["main", "f", "g", "h", "memcpy", "puts@plt", "puts", "ksys_write"]


def loc(fn: str, off: int) -> Location:
    if fn == "ksys_write":  # a kernel address (above 2**63)
        return Location(0xFFFFFFFF81000000 + off, fn, off, "[kernel.kallsyms]")
    base = 0x400000 + 0x1000 * FUNCS.index(fn)
    return Location(base + off, fn, off, "prog")


KINDS = [
    (BranchKind.CALL, TraceState.NONE),
    (BranchKind.RETURN, TraceState.NONE),
    (BranchKind.JUMP, TraceState.NONE),
    (BranchKind.CONDITIONAL_JUMP, TraceState.NONE),
    (BranchKind.SYSCALL, TraceState.NONE),
    (BranchKind.SYSRET, TraceState.NONE),
    (BranchKind.HARDWARE_INTERRUPT, TraceState.NONE),
    (BranchKind.IRET, TraceState.NONE),
    (BranchKind.ASYNC, TraceState.NONE),
    (BranchKind.TX_ABORT, TraceState.NONE),
    (BranchKind.NONE, TraceState.END),
    (BranchKind.SYSCALL, TraceState.END),
    (BranchKind.CALL, TraceState.END),
    (BranchKind.RETURN, TraceState.END),
    (BranchKind.JUMP, TraceState.START),
]

locations = st.builds(loc, st.sampled_from(FUNCS), st.sampled_from([0, 0x8, 0x20]))


@st.composite
def random_event(draw: st.DrawFn, time: int) -> Event:
    tid = draw(st.sampled_from([1, 2]))
    if draw(st.integers(0, 30)) == 0:
        t = draw(st.sampled_from([None, time]))
        return DecodeError(1, draw(st.sampled_from([tid, None])), t, None, "lost")
    kind, state = draw(st.sampled_from(KINDS))
    src = NOWHERE if state == TraceState.START else draw(locations)
    dst = NOWHERE if state == TraceState.END else draw(locations)
    # Sometimes a decoder dropped a jump in between, whose time it passes on.
    gap = time - draw(st.sampled_from([1, 2, 5, 50])) if draw(st.integers(0, 4)) == 0 else 0
    return BranchEvent(1, tid, time, kind, state, src, dst, gap_time=max(gap, 0))


@st.composite
def random_streams(draw: st.DrawFn) -> list[Event]:
    n = draw(st.integers(0, 120))
    time = 1000
    events = []
    for _ in range(n):
        time += draw(st.sampled_from([0, 0, 1, 5, 100, -3]))
        events.append(draw(random_event(time)))
    return events


@settings(max_examples=150, deadline=None)
@given(random_streams())
def test_any_stream_gives_a_well_formed_trace(events: list[Event]) -> None:
    engine = TraceSegmentEngine()
    engine.feed_all(events)
    timeline = engine.finish()
    engine.self_check(timeline)  # every frame closed, nesting, monotonic time
    for tt in timeline.threads:
        assert all(int(s) <= int(e) for s, e in zip(tt.start, tt.end, strict=True))


@dataclass
class _Node:
    name: str
    start: int = 0
    end: int = 0
    children: list[_Node] = field(default_factory=list)


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[Event], list[tuple[int, int, int, str]]]:
    """A random call tree, emitted as a perfectly consistent event stream.

    Returns the events and the true slices (start, end, depth, name) of every call below
    the root (the root's own call is not in the stream, so it is inferred).
    """
    names = ["a", "b", "c", "d", "e"]
    time = [1000]
    events: list[Event] = []
    truth: list[tuple[int, int, int, str]] = []

    def tick() -> int:
        time[0] += draw(st.integers(1, 7))
        return time[0]

    def body(fn: str, depth: int, budget: int) -> None:
        for _ in range(draw(st.integers(0, 3 if budget > 0 else 0))):
            op = draw(st.sampled_from(["call", "jcc", "call", "tail"]))
            if op == "jcc":
                events.append(
                    BranchEvent(
                        1,
                        1,
                        tick(),
                        BranchKind.CONDITIONAL_JUMP,
                        TraceState.NONE,
                        loc2(fn, 0x10),
                        loc2(fn, 0x30),
                    )
                )
                continue
            callee = draw(st.sampled_from(names))
            start = tick()
            events.append(
                BranchEvent(
                    1,
                    1,
                    start,
                    BranchKind.CALL,
                    TraceState.NONE,
                    loc2(fn, 0x40),
                    loc2(callee, 0),
                )
            )
            index = len(truth)
            truth.append((start, -1, depth + 1, callee))
            current = callee
            body(callee, depth + 1, budget - 1)
            if op == "tail" and draw(st.booleans()):
                target = draw(st.sampled_from([n for n in names if n != current]))
                t = tick()
                events.append(
                    BranchEvent(
                        1,
                        1,
                        t,
                        BranchKind.JUMP,
                        TraceState.NONE,
                        loc2(current, 0x50),
                        loc2(target, 0),
                    )
                )
                truth[index] = (truth[index][0], t, depth + 1, current)
                index = len(truth)
                truth.append((t, -1, depth + 1, target))
                current = target
                body(target, depth + 1, budget - 1)
            end = tick()
            events.append(
                BranchEvent(
                    1,
                    1,
                    end,
                    BranchKind.RETURN,
                    TraceState.NONE,
                    loc2(current, 0x60),
                    loc2(fn, 0x45),
                )
            )
            truth[index] = (truth[index][0], end, depth + 1, current)

    # main runs a little before anything else (the thread's first event is its own).
    events.append(
        BranchEvent(
            1,
            1,
            tick(),
            BranchKind.CONDITIONAL_JUMP,
            TraceState.NONE,
            loc2("main", 0x4),
            loc2("main", 0x8),
        )
    )
    body("main", 0, 4)
    return events, truth


def loc2(fn: str, off: int) -> Location:
    base = 0x500000 + 0x1000 * (ord(fn[0]) - ord("a"))
    return Location(base + off, fn, off, "prog")


@settings(max_examples=100, deadline=None)
@given(programs())
def test_consistent_stream_is_reconstructed_exactly(
    program: tuple[list[Event], list[tuple[int, int, int, str]]],
) -> None:
    events, truth = program
    engine = TraceSegmentEngine()
    engine.feed_all(events)
    timeline = engine.finish()
    engine.self_check(timeline)
    if not events:
        assert timeline.slice_count() == 0
        return
    (tt,) = timeline.threads
    got = [
        (s.start, s.end, s.depth, s.name)
        for s in tt.slices(timeline.names)
        if not (s.depth == 0 and s.flags & SliceFlags.INFERRED_START)
    ]
    assert sorted(got) == sorted(truth)
    roots = [s for s in tt.slices(timeline.names) if s.depth == 0]
    assert [r.name for r in roots] == ["main"]


@settings(max_examples=150, deadline=None)
@given(random_streams())
def test_fast_path_matches_event_by_event_feeding(events: list[Event]) -> None:
    one = TraceSegmentEngine()
    for event in events:
        one.feed(event)
    many = TraceSegmentEngine()
    many.feed_all(events)
    a, b = one.finish(), many.finish()
    assert a.names == b.names
    assert [list(t.slices(a.names)) for t in a.threads] == [
        list(t.slices(b.names)) for t in b.threads
    ]
    assert [t.instants for t in a.threads] == [t.instants for t in b.threads]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(random_streams())
def test_engine_output_survives_the_fxt_round_trip(
    tmp_path_factory: pytest.TempPathFactory, events: list[Event]
) -> None:
    """events → engine → .fxt → strict reader and the PyPI `fxt` reader: same slices."""
    engine = TraceSegmentEngine()
    engine.feed_all(events)
    timeline = engine.finish()
    path = tmp_path_factory.mktemp("rt") / "t.fxt"
    write_timeline(timeline, path)
    trace = read_trace(path)  # times back in perf ns
    for tt in timeline.threads:
        want = sorted((s.start, s.end, s.depth, s.name) for s in tt.slices(timeline.names))
        got = sorted(
            (s.start, s.end, s.depth, s.name) for s in trace.slices.get((tt.pid, tt.tid), [])
        )
        assert got == want
    check_against_timeline(path, timeline)
