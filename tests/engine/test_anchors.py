"""Anchors (C engine): each slice started by a call or a tail call names the instruction
that started it and which of that address's branches at that perf time it was, the place
``ptscope insns --after`` finds the call in perf's instruction listing. Worked out by hand
for small streams."""

from __future__ import annotations

import pytest

from engine.test_properties import loc2
from ptscope.model import BranchEvent, BranchKind, TraceState
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.fast_engine import FastEngine

pytestmark = pytest.mark.skipif(not fast_engine.is_available(), reason="the C engine is not built")

CALL, RET, JUMP = BranchKind.CALL, BranchKind.RETURN, BranchKind.JUMP


def br(
    t: int, kind: BranchKind, src: tuple[str, int], dst: tuple[str, int], in_tx: bool = False
) -> BranchEvent:
    return BranchEvent(
        1, 1, t, kind, TraceState.NONE, loc2(*src), loc2(*dst), insn_count=3, in_tx=in_tx
    )


def anchors(events: list[BranchEvent]) -> list[tuple[str, int, int, int]]:
    """(name, perf start, anchor address, occurrence) of every slice, by start."""
    engine = FastEngine()
    engine.feed_all(events)
    timeline = engine.finish()
    (thread,) = timeline.threads
    assert thread.perf_start is not None
    assert thread.anchor_ip is not None and thread.anchor_occurrence is not None
    return [
        (timeline.names[n], s, ip, k)
        for n, s, ip, k in zip(
            thread.name_id.tolist(),
            thread.perf_start.tolist(),
            thread.anchor_ip.tolist(),
            thread.anchor_occurrence.tolist(),
            strict=True,
        )
    ]


def at(fn: str, off: int) -> int:
    return loc2(fn, off).ip


def test_calls_count_per_address_and_perf_time() -> None:
    got = anchors(
        [
            br(10, CALL, ("a", 4), ("b", 0)),
            br(10, RET, ("b", 8), ("a", 9)),
            br(10, CALL, ("a", 4), ("b", 0)),  # the second call from a+4 at time 10
            br(10, RET, ("b", 8), ("a", 9)),
            br(10, CALL, ("a", 12), ("b", 0)),  # another address: its own count
            br(10, RET, ("b", 8), ("a", 17)),
            br(20, CALL, ("a", 4), ("b", 0)),  # a new time: counting starts over
            br(20, JUMP, ("b", 6), ("c", 0)),  # a tail call: c starts after the jump
            br(30, RET, ("c", 8), ("a", 9)),
        ]
    )
    assert got == [
        ("a", 10, 0, 0),  # inferred: no anchor
        ("b", 10, at("a", 4), 1),
        ("b", 10, at("a", 4), 2),
        ("b", 10, at("a", 12), 1),
        ("b", 20, at("a", 4), 1),
        ("c", 20, at("b", 6), 1),
    ]


def test_jumps_inside_a_function_do_not_count() -> None:
    # An indirect jump that once stays in its function, then leaves it: perf's listing
    # has the instruction twice, but only the second is a branch the engine counts (the
    # dlfilter drops the first), and `ptscope insns` counts it the same way.
    got = anchors(
        [
            br(10, CALL, ("a", 4), ("b", 0)),
            br(10, JUMP, ("b", 6), ("b", 2)),
            br(10, JUMP, ("b", 6), ("c", 0)),
            br(20, RET, ("c", 8), ("a", 9)),
        ]
    )
    assert got == [("a", 10, 0, 0), ("b", 10, at("a", 4), 1), ("c", 10, at("b", 6), 1)]


def test_a_transactions_calls_keep_the_count_they_came_with() -> None:
    # Held until the next branch outside the transaction, then applied: in their order.
    got = anchors(
        [
            br(10, CALL, ("a", 4), ("b", 0), in_tx=True),
            br(10, RET, ("b", 8), ("a", 9), in_tx=True),
            br(10, CALL, ("a", 4), ("b", 0)),
            br(20, RET, ("b", 8), ("a", 9)),
        ]
    )
    assert got == [("a", 10, 0, 0), ("b", 10, at("a", 4), 1), ("b", 10, at("a", 4), 2)]


def test_a_time_raised_to_keep_order_gives_no_anchor() -> None:
    # perf dates the second call 15, the engine puts it at 20: the listing at 20 does not
    # have it, so its drill command is the time range alone.
    got = anchors(
        [
            br(20, CALL, ("a", 4), ("b", 0)),
            br(20, RET, ("b", 8), ("a", 9)),
            br(15, CALL, ("a", 4), ("b", 0)),
            br(30, RET, ("b", 8), ("a", 9)),
        ]
    )
    assert got == [("a", 20, 0, 0), ("b", 20, at("a", 4), 1), ("b", 20, 0, 0)]
