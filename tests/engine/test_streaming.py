"""The streaming C engine: memory that does not grow with the trace, slices written in the
order they finish that still load as the reference engine nests them, and the bounded
window for long runs of equal timestamps."""

from __future__ import annotations

import dataclasses
import io
import random

import numpy as np
import pytest
from hypothesis import given, settings

from engine.test_cengine import events_
from ptscope.fxt.reader import read_trace
from ptscope.fxt.writer import FxtWriter
from ptscope.model import (
    BranchBatch,
    BranchEvent,
    BranchKind,
    DecodeError,
    Event,
    Location,
    LocationTable,
    PowerEvent,
    TraceState,
)
from ptscope.model import branch_flags as flags_of
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine
from ptscope.timeline import SliceBatch, Timeline
from support.engine_diff import assert_same, to_items

pytestmark = pytest.mark.skipif(not fast_engine.is_available(), reason="C engine not built")

CALL = flags_of(BranchKind.CALL, TraceState.NONE)
RETURN = flags_of(BranchKind.RETURN, TraceState.NONE)


def _rounds(table: LocationTable, rounds: int, first_round: int, t0: int) -> BranchBatch:
    """The call-heavy program's shape: per round, top calls mid, mid calls leaf 40-43
    times, mid returns; a few ns apart."""
    top = table.add(Location(0x1000, "top", 0, "p"))
    top_call = table.add(Location(0x1010, "top", 0x10, "p"))
    top_back = table.add(Location(0x1015, "top", 0x15, "p"))
    mid = table.add(Location(0x2000, "mid", 0, "p"))
    mid_call = table.add(Location(0x2010, "mid", 0x10, "p"))
    mid_back = table.add(Location(0x2015, "mid", 0x15, "p"))
    mid_ret = table.add(Location(0x2030, "mid", 0x30, "p"))
    leaf = table.add(Location(0x3000, "leaf", 0, "p"))
    leaf_ret = table.add(Location(0x3008, "leaf", 8, "p"))
    del top
    flags, src, dst = [], [], []
    for r in range(first_round, first_round + rounds):
        flags.append(CALL), src.append(top_call), dst.append(mid)
        for _ in range(40 + (r & 3)):
            flags += [CALL, RETURN]
            src += [mid_call, leaf_ret]
            dst += [leaf, mid_back]
        flags.append(RETURN), src.append(mid_ret), dst.append(top_back)
    n = len(flags)
    ones = np.ones(n, dtype=np.int32)
    time = t0 + np.arange(n, dtype=np.int64) * 3
    time[1::7] = time[0::7][: len(time[1::7])]  # some equal timestamps: runs to spread
    zeros = np.zeros(n, dtype=np.uint64)
    return BranchBatch(
        table, ones, ones, np.maximum.accumulate(time), np.array(flags, np.uint32),
        np.array(src, np.int32), np.array(dst, np.int32), zeros, zeros,
    )  # fmt: skip


def _peak(rounds: int, per_batch: int = 500) -> tuple[dict[str, int], int]:
    engine = FastEngine()
    table = LocationTable()
    written = 0
    t = 1000
    for first in range(0, rounds, per_batch):
        batch = _rounds(table, min(per_batch, rounds - first), first, t)
        t = int(batch.time[-1]) + 10
        engine.feed_batch(batch)
        written += len(engine.take_output())
    held = engine.memory()
    written += len(engine.close())
    return held, written


def test_memory_does_not_grow_with_the_trace() -> None:
    small, n_small = _peak(2_000)
    big, n_big = _peak(10_000)
    assert n_big > 4 * n_small > 300_000  # every call was written
    # What the engine holds is the open frames and the current run: the same whatever
    # the length of the trace.
    for what in ("peak_frames", "arena_frames", "live_frames", "contexts"):
        assert big[what] == small[what] <= 8, (what, small, big)
    assert big["window_slots"] <= 8 and big["waiters"] <= 16


def test_a_run_of_equal_timestamps_longer_than_the_window_stays_bounded() -> None:
    limit = fast_engine._cengine.MAX_RUN  # type: ignore[union-attr]
    table = LocationTable()
    batch = _rounds(table, 4 * limit // 80, 0, 1000)
    batch.time[:] = 5000  # one timestamp for everything: one enormous run
    engine = FastEngine()
    engine.feed_batch(batch)
    assert engine.memory()["window_slots"] <= limit
    timeline = engine.finish()
    engine.self_check(timeline)  # still nests, time never goes backwards
    assert timeline.slice_count() == 1 + sum(1 + 40 + (r & 3) for r in range(4 * limit // 80))


def _stream_fxt(items: list[object]) -> tuple[bytes, list[str]]:
    """Feed, take the output after every item, write each batch as it comes (close order)."""
    engine = FastEngine()
    buf = io.BytesIO()
    writer = FxtWriter(buf, time_base=0)
    batches: list[SliceBatch] = []
    for item in items:
        engine.feed_all([item])  # type: ignore[list-item]
        batches.append(engine.take_output())
    batches.append(engine.close())
    for b in batches:
        for key in sorted(set(zip(b.pid.tolist(), b.tid.tolist(), strict=True))):
            rows = np.flatnonzero((b.pid == key[0]) & (b.tid == key[1]))
            writer.slices(*key, b.names, b.start[rows], b.end[rows], b.name_id[rows])
    writer.flush()
    return buf.getvalue(), engine.names


@settings(max_examples=300, deadline=None)
@given(events_())
def test_slices_written_as_they_finish_load_as_the_reference_nests_them(
    events: list[Event],
) -> None:
    """A reader that nests like Perfetto (sort by start, ties in file order) sees exactly
    the reference engine's trees: close order, spines and equal starts are safe."""
    reference = TraceSegmentEngine()
    reference.feed_all(events)
    want = reference.finish()
    data, _ = _stream_fxt(to_items(events, cuts=random.Random(len(events))))
    got = read_trace(data)
    expected = {
        (t.pid, t.tid): [(s.start, s.end, s.depth, s.name) for s in t.slices(want.names)]
        for t in want.threads
        if len(t)
    }
    seen = {
        key: [(s.start, s.end, s.depth, s.name) for s in rows] for key, rows in got.slices.items()
    }
    assert seen == expected


def _on_axis(events: list[Event], axis: str) -> list[Event]:
    """The reference meaning of a time axis: each event happens at its thread's cumulative
    instruction (or cycle) count, its own count included, and a thread's history starts at
    0 (given as the first event's gap time). Shifted by one: a gap time of 0 means none."""
    cum: dict[tuple[int, int], int] = {}
    out: list[Event] = []
    last: tuple[int, int] | None = None  # where an error without a thread goes
    for ev in events:
        key = (getattr(ev, "pid", None) or 0, getattr(ev, "tid", None) or 0)
        if not isinstance(ev, (BranchEvent, DecodeError, PowerEvent)):
            out.append(ev)  # names and samples: no time of the thread's
            continue
        if isinstance(ev, DecodeError) and (ev.tid is None or ev.tid < 0):
            if last is not None:
                ev = dataclasses.replace(ev, time=cum[last] + 1)
            out.append(ev)
            continue
        if isinstance(ev, DecodeError) and (ev.pid is None or ev.pid < 0):
            key = next((k for k in cum if k[1] == ev.tid), (ev.tid, ev.tid))
        last = key
        first = key not in cum
        before = cum.setdefault(key, 0)
        if isinstance(ev, BranchEvent):
            cum[key] += ev.insn_count if axis == "instructions" else ev.cycle_count
            gap = before + 1 if first else 0
            out.append(dataclasses.replace(ev, time=cum[key] + 1, gap_time=gap))
        elif isinstance(ev, DecodeError):
            out.append(dataclasses.replace(ev, time=cum[key] + 1))  # a time on every axis
        elif isinstance(ev, PowerEvent):
            out.append(dataclasses.replace(ev, time=cum[key] + 1))
        else:
            out.append(ev)
    return out


def _shifted_back(timeline: Timeline) -> Timeline:
    for t in timeline.threads:
        t.start = t.start - 1
        t.end = t.end - 1
        t.instants = [dataclasses.replace(i, time=i.time - 1) for i in t.instants]
        t.counters = [dataclasses.replace(c, time=c.time - 1) for c in t.counters]
    return timeline


@settings(max_examples=200, deadline=None)
@given(events_())
def test_time_axes_are_the_counts_as_times(events: list[Event]) -> None:
    """--time-axis instructions|cycles: the C engine gives the slices the reference gives
    for events timed by their thread's cumulative counts."""
    events = [e for e in events if not getattr(e, "in_tx", False)]  # replay times differ
    for axis in ("instructions", "cycles"):
        reference = TraceSegmentEngine(keep_slots=True, spread_by_instructions=True)
        reference.feed_all(_on_axis(events, axis))
        want = _shifted_back(reference.finish())
        if axis == "cycles":
            # On the cycles axis a slice's cycles are its length, whatever the spreading.
            for t in want.threads:
                t.cycles = np.where(t.cycles >= 0, t.end - t.start, t.cycles)
        engine = FastEngine(keep_slots=True, axis=axis)
        engine.feed_all(to_items(events))
        got = engine.finish()
        assert_same(reference, want, engine, got, examples=False)
