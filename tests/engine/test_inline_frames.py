"""Inlined frames in both engines: where control enters and leaves inlined bodies (the
locations' nodes, and the decoders' INLINE rows), the same slices from the C engine and the
Python reference, nested inside the frame they were inlined in.

The decoders' side (DWARF, block splits) is tested end to end in
tests/decode/test_inlined_frames.py; here the engines get hand-made and random input.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import test_cengine as ce  # tests/ is on sys.path
from ptscope.model import (
    NOWHERE,
    BranchEvent,
    BranchKind,
    Event,
    InlineNodes,
    Location,
    LocationTable,
    TraceState,
)
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine
from ptscope.timeline import SliceFlags, Timeline, check_nesting
from support.engine_diff import assert_same, to_items

pytestmark = pytest.mark.skipif(not fast_engine.is_available(), reason="the C engine is not built")

NONE = TraceState.NONE


def _nodes() -> InlineNodes:
    """In f: g (inlined at a.c:10), h inlined in g (a.c:20), and k (a.c:30)."""
    nodes = InlineNodes()
    g = nodes.add("g", "g", "a.c:10", 0)
    nodes.add("h", "h", "a.c:20", g)
    nodes.add("k", "k", "a.c:30", 0)
    return nodes


G, H, K = 1, 2, 3


def at(fn: str, off: int, node: int = 0) -> Location:
    base = {"main": 0x1000, "f": 0x2000, "leaf": 0x3000}[fn]
    return Location(base + off, fn, off, "prog", inline=node)


def br(time: int, kind: BranchKind, src: Location, dst: Location, insns: int = 0) -> BranchEvent:
    return BranchEvent(1, 1, time, kind, NONE, src, dst, insn_count=insns)


def inline(time: int, where: Location, insns: int = 0) -> BranchEvent:
    return BranchEvent(1, 1, time, BranchKind.INLINE, NONE, where, where, insn_count=insns)


def run_both(
    events: list[Event], nodes: InlineNodes, cuts: random.Random | None = None
) -> tuple[Timeline, Timeline]:
    a = TraceSegmentEngine(keep_slots=True, inline=nodes)
    a.feed_all(events)
    ta = a.finish()
    table = LocationTable()
    table.inline = nodes
    b = FastEngine(keep_slots=True)
    b.feed_all(to_items(events, table=table, cuts=cuts))
    tb = b.finish()
    assert_same(a, ta, b, tb)
    return ta, tb


def tree(t: Timeline) -> list[tuple[int, str, bool]]:
    """(depth, name, inlined) in start order."""
    th = t.threads[0]
    rows = sorted(range(len(th.start)), key=lambda i: (th.start[i], th.depth[i]))
    return [
        (int(th.depth[i]), t.names[th.name_id[i]], bool(th.flags[i] & SliceFlags.INLINED))
        for i in rows
    ]


def test_inlined_bodies_nest_in_their_function_and_hold_its_calls() -> None:
    """main calls f; f runs g's body, then h's inside it, which calls leaf; leaf returns
    into h's body; then f's own code, then k's body; f returns."""
    events: list[Event] = [
        br(100, BranchKind.CALL, at("main", 4), at("f", 0)),
        inline(100, at("f", 8, G), 3),
        inline(100, at("f", 12, H), 2),
        br(110, BranchKind.CALL, at("f", 16, H), at("leaf", 0), 2),
        br(120, BranchKind.RETURN, at("leaf", 9), at("f", 21, H), 4),
        inline(120, at("f", 30), 3),
        inline(120, at("f", 40, K), 4),
        br(140, BranchKind.RETURN, at("f", 50, K), at("main", 9), 5),
    ]
    ta, _ = run_both(events, _nodes())
    assert tree(ta) == [
        (0, "main", False),
        (1, "f", False),
        (2, "g", True),
        (3, "h", True),
        (4, "leaf", False),
        (2, "k", True),
    ]
    for th in ta.threads:
        check_nesting(th)


def test_a_return_out_of_an_inlined_body_ends_it_with_its_function() -> None:
    """f's return instruction is inside h's body (``return h(x)``): g and h end there too;
    an exception's way out and the end of the trace end them like any frame."""
    events: list[Event] = [
        br(100, BranchKind.CALL, at("main", 4), at("f", 0)),
        inline(100, at("f", 12, H), 2),
        br(130, BranchKind.RETURN, at("f", 20, H), at("main", 9), 5),
        br(140, BranchKind.CALL, at("main", 12), at("f", 0)),
        inline(150, at("f", 8, G), 3),
    ]
    ta, _ = run_both(events, _nodes())
    th = ta.threads[0]
    got = {
        (ta.names[th.name_id[i]], int(th.start[i]), int(th.end[i])) for i in range(len(th.start))
    }
    f_ends = sorted(e for name, _, e in got if name == "f")
    g_ends = sorted(e for name, _, e in got if name == "g")
    h_ends = [e for name, _, e in got if name == "h"]
    assert h_ends == [f_ends[0]]  # h (and g) end where their f returned
    assert g_ends == [f_ends[0], f_ends[1]]  # the second g: open to the trace's end
    for th in ta.threads:
        check_nesting(th)


def test_a_jump_between_bodies_and_a_branch_from_inside_one_move_the_bodies() -> None:
    """Without instruction detail the decoders give no INLINE rows: the bodies move at the
    branches, from their sources (a call from inside k) and to their targets."""
    events: list[Event] = [
        br(100, BranchKind.CALL, at("main", 4), at("f", 0, G)),  # g's body at f's entry
        br(110, BranchKind.JUMP, at("f", 6, G), at("f", 40, K)),
        br(120, BranchKind.CALL, at("f", 44, K), at("leaf", 0)),
        br(130, BranchKind.RETURN, at("leaf", 9), at("f", 49, K)),
        br(140, BranchKind.RETURN, at("f", 50), at("main", 9)),
    ]
    ta, _ = run_both(events, _nodes())
    assert tree(ta) == [
        (0, "main", False),
        (1, "f", False),
        (2, "g", True),
        (2, "k", True),
        (3, "leaf", False),
    ]


# ------------------------------------------------------------------ random input

_TREE = _nodes()


def _with_node(loc: Location, salt: int) -> Location:
    """``loc`` in one of the tree's bodies, or none: a function of its address, as DWARF
    makes it (the same address is never in two bodies)."""
    if loc is NOWHERE or loc.function not in ("f", "g", "main"):
        return loc
    node = random.Random(loc.ip * 7919 + salt).choice([0, 0, G, H, K])
    return dataclasses.replace(loc, inline=node) if node else loc


@settings(max_examples=200, deadline=None)
@given(ce.events_(), st.integers(0, 2**32))
def test_random_streams_with_inlined_bodies_give_identical_traces(
    events: list[Event], seed: int
) -> None:
    pick = random.Random(seed)
    out: list[Event] = []
    for ev in events:
        if type(ev) is BranchEvent:
            ev = dataclasses.replace(ev, src=_with_node(ev.src, seed), dst=_with_node(ev.dst, seed))
            if pick.random() < 0.15 and ev.state == NONE and ev.src is not NOWHERE:
                out.append(dataclasses.replace(ev, kind=BranchKind.INLINE, dst=ev.src))
        out.append(ev)
    ta, _ = run_both(out, _TREE, cuts=random.Random(seed))
    for th in ta.threads:
        check_nesting(th)
