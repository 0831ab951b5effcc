"""Comparing the C engine with the Python engine: same input as events or as batches."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

import numpy as np

from ptscope.model import BranchBatch, BranchEvent, Event, LocationTable
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine
from ptscope.timeline import Timeline

Item = Event | BranchBatch
Engine = TraceSegmentEngine | FastEngine


def to_items(
    events: Sequence[Event], table: LocationTable | None = None, cuts: random.Random | None = None
) -> list[Item]:
    """Runs of branch events as batches over one table, other events between them in order.

    With ``cuts``, runs are also cut at random places (batch boundaries must not matter).
    """
    table = table if table is not None else LocationTable()
    items: list[Item] = []
    run: list[BranchEvent] = []
    for ev in events:
        if type(ev) is BranchEvent:
            run.append(ev)
            if cuts is not None and cuts.random() < 0.2:
                items.append(BranchBatch.from_events(run, table))
                run = []
            continue
        if run:
            items.append(BranchBatch.from_events(run, table))
            run = []
        items.append(ev)
    if run:
        items.append(BranchBatch.from_events(run, table))
    return items


def assert_same(a: Engine, ta: Timeline, b: Engine, tb: Timeline, *, examples: bool = True) -> None:
    """Identical slices (names, columns), instants, counters, thread names, stats, slots.

    Name tables may be numbered differently (the Python engine numbers names in order of
    frame creation, the streaming C engine in order of output): slices are compared by name.
    """
    assert sorted(ta.names) == sorted(tb.names)
    assert [(t.pid, t.tid, t.name) for t in ta.threads] == [
        (t.pid, t.tid, t.name) for t in tb.threads
    ]
    for x, y in zip(ta.threads, tb.threads, strict=True):
        for column in (
            "start",
            "end",
            "depth",
            "address",
            "instructions",
            "cycles",
            "flags",
        ):
            want, got = getattr(x, column), getattr(y, column)
            assert want.dtype == got.dtype, column
            assert np.array_equal(want, got), (x.tid, column, want, got)
        if x.icache_lines is None or y.icache_lines is None:
            assert x.icache_lines is None and y.icache_lines is None, (x.tid, "icache_lines")
        else:
            assert np.array_equal(x.icache_lines, y.icache_lines), (
                x.tid,
                "icache_lines",
                x.icache_lines,
                y.icache_lines,
            )
        names_a = [ta.names[i] for i in x.name_id.tolist()]
        names_b = [tb.names[i] for i in y.name_id.tolist()]
        assert names_a == names_b, (x.tid, names_a, names_b)
        assert x.instants == y.instants
        assert x.counters == y.counters
    stats_a, stats_b = dataclasses.asdict(a.stats), dataclasses.asdict(b.stats)
    if not examples:  # (their messages carry times)
        del stats_a["unexpected_examples"], stats_b["unexpected_examples"]
    assert stats_a == stats_b
    assert a.orphan_errors() == b.orphan_errors()
    assert a.slot_columns.keys() == b.slot_columns.keys()
    for key, columns in a.slot_columns.items():
        for want, got in zip(columns, b.slot_columns[key], strict=True):
            assert np.array_equal(want, got), key


def check_outcome(engine: Engine, timeline: Timeline) -> str:
    """What self_check says ("" if happy): the engines' invariants fail alike or not at all.

    (They can fail: a transaction committed after a power event or a decode error of its
    thread replays its branches at their own, earlier times — the Python engine does this
    too, and the C engine must match it.)
    """
    try:
        engine.self_check(timeline)
    except AssertionError as e:
        return str(e)
    return ""
