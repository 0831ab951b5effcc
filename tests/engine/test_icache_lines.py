"""I-cache footprints (``icache_lines``): the distinct code lines a slice executed, callees
included, worked out by hand for small streams and checked on both engines."""

from __future__ import annotations

import pytest

from engine.test_properties import loc2
from ptscope.model import BranchEvent, BranchKind, TraceState
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine
from ptscope.timeline import Timeline

CALL, RET, JUMP = BranchKind.CALL, BranchKind.RETURN, BranchKind.JUMP


def br(
    t: int, kind: BranchKind, src: tuple[str, int], dst: tuple[str, int], lines: tuple[int, ...]
) -> BranchEvent:
    """A branch whose instructions since the previous one touched ``lines``."""
    return BranchEvent(
        1, 1, t, kind, TraceState.NONE, loc2(*src), loc2(*dst), insn_count=len(lines) or 1,
        lines=lines,
    )  # fmt: skip


def footprints(timeline: Timeline) -> list[tuple[str, int, int]]:
    (thread,) = timeline.threads
    assert thread.icache_lines is not None
    return [
        (timeline.names[n], d, c)
        for n, d, c in zip(
            thread.name_id.tolist(),
            thread.depth.tolist(),
            thread.icache_lines.tolist(),
            strict=True,
        )
    ]


ENGINES = [TraceSegmentEngine] + ([FastEngine] if fast_engine.is_available() else [])


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_callees_lines_count_once_in_their_callers(engine: type) -> None:
    events = [
        br(10, CALL, ("a", 4), ("b", 0), (1,)),  # a ran line 1, calls b
        br(20, CALL, ("b", 4), ("c", 0), (2, 3)),  # b: lines 2, 3
        br(30, RET, ("c", 8), ("b", 9), (3, 4)),  # c: lines 3, 4
        br(40, CALL, ("b", 12), ("c", 0), (2,)),
        br(50, RET, ("c", 8), ("b", 17), (4,)),  # second c: line 4 only
        br(60, RET, ("b", 20), ("a", 9), (5,)),
        br(70, JUMP, ("a", 12), ("a", 4), (1, 6)),
    ]
    e = engine()
    e.feed_all(events)
    got = footprints(e.finish())
    # a (inferred root, to the end): 1..6; b: 2, 3, 4, 5; the c's: {3, 4} and {4}.
    assert got == [("a", 0, 6), ("b", 1, 4), ("c", 2, 2), ("c", 2, 1)]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_a_root_found_later_holds_what_ran_before_it(engine: type) -> None:
    events = [
        br(10, CALL, ("b", 4), ("c", 0), (7,)),  # started inside b
        br(20, RET, ("c", 8), ("b", 9), (8,)),
        br(30, RET, ("b", 20), ("a", 9), (9,)),  # b returns into a: a is a root found now
        br(40, JUMP, ("a", 12), ("a", 4), (1,)),
    ]
    e = engine()
    e.feed_all(events)
    assert sorted(footprints(e.finish())) == [("a", 0, 4), ("b", 1, 3), ("c", 2, 1)]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.__name__)
def test_without_lines_there_is_no_footprint(engine: type) -> None:
    e = engine()
    e.feed_all([BranchEvent(1, 1, 10, CALL, TraceState.NONE, loc2("a", 4), loc2("b", 0))])
    (thread,) = e.finish().threads
    assert thread.icache_lines is None
