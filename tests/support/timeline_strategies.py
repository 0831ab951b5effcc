"""Hypothesis strategies for random, properly nested Timelines (threads of slices with
names, addresses, counts and flags, instants and counters), shared by the FXT tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from ptscope.timeline import (
    CounterSample,
    Instant,
    SliceBatch,
    ThreadTimeline,
    Timeline,
    check_nesting,
)

__all__ = ["NAME_TEXT", "stream_order", "thread_columns", "thread_of_rows", "timelines"]

NAME_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
ADDRESSES = st.sampled_from([0, 1, 0x401000, 0x7FFF_FFFF_F000, (1 << 64) - 1])
COUNTS = st.one_of(st.just(-1), st.integers(0, (1 << 63) - 1))
FLAGS = st.sampled_from([0, 0, 0, 1, 2, 3, 4, 7, 0x80])


@st.composite
def thread_columns(draw: st.DrawFn, pid: int, tid: int, n_names: int, base: int) -> ThreadTimeline:
    """A properly nested random call tree: push/pop operations with small time steps
    (0 included, so slices can share start times and be empty)."""
    ops = draw(
        st.lists(
            st.tuples(
                st.booleans(),
                st.integers(0, 4),
                st.integers(0, n_names - 1),
                ADDRESSES,
                COUNTS,
                COUNTS,
                FLAGS,
            ),
            max_size=40,
        )
    )
    now = base + draw(st.integers(0, 1000))
    # (start, has children, (name, address, instructions, cycles, flags))
    stack: list[tuple[int, list[bool], tuple[int, int, int, int, int]]] = []
    rows: list[tuple[int, int, int, int, int, int, int, int]] = []

    def pop() -> None:
        nonlocal now
        start, has_children, (name, address, instructions, cycles, flags) = stack.pop()
        if start == now and (has_children[0] or (stack and stack[-1][0] != now)):
            # As the engine does (every call lasts at least 1 ns): an empty slice may
            # neither sit exactly at its parent's end nor have children (Perfetto would
            # show them as its siblings).
            now += 1
        rows.append((start, now, len(stack), name, address, instructions, cycles, flags))

    for push, step, name, address, instructions, cycles, flags in ops:
        now += step
        if push:
            if stack:
                stack[-1][1][0] = True
            stack.append((now, [False], (name, address, instructions, cycles, flags)))
        elif stack:
            pop()
    while stack:
        now += draw(st.integers(0, 3))
        pop()
    rows.sort(key=lambda r: (r[0], r[2]))  # stable: equal (start, depth) keep pop order
    cols = list(zip(*rows, strict=True)) if rows else [()] * 8
    thread = ThreadTimeline(
        pid=pid,
        tid=tid,
        name=draw(st.one_of(st.just(""), NAME_TEXT)),
        start=np.array(cols[0], dtype=np.int64),
        end=np.array(cols[1], dtype=np.int64),
        depth=np.array(cols[2], dtype=np.int32),
        name_id=np.array(cols[3], dtype=np.int32),
        address=np.array(cols[4], dtype=np.uint64),
        instructions=np.array(cols[5], dtype=np.int64),
        cycles=np.array(cols[6], dtype=np.int64),
        flags=np.array(cols[7], dtype=np.uint8),
    )
    check_nesting(thread)
    end = now + 5
    for _ in range(draw(st.integers(0, 3))):
        args = draw(
            st.dictionaries(
                st.sampled_from(["code", "ip", "why"]),
                st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), NAME_TEXT),
                max_size=2,
            )
        )
        name = "[decode error: " + draw(NAME_TEXT) + "]"
        thread.instants.append(Instant(draw(st.integers(base, end)), name, args))
    for _ in range(draw(st.integers(0, 3))):
        value = draw(st.integers(-(1 << 63), (1 << 63) - 1))
        name = draw(st.sampled_from(["cbr", "MHz"]))
        thread.counters.append(CounterSample(draw(st.integers(base, end)), name, value))
    return thread


@st.composite
def timelines(draw: st.DrawFn, max_threads: int = 4) -> Timeline:
    names = draw(st.lists(NAME_TEXT, min_size=1, max_size=30))  # repeats and "" included
    base = draw(st.one_of(st.integers(0, 10**6), st.integers(0, 1 << 62)))
    n_threads = draw(st.integers(0, max_threads))
    pids = draw(st.lists(st.sampled_from([0, 1, 4242, (1 << 31) - 1]), min_size=n_threads,
                         max_size=n_threads))  # fmt: skip
    threads = [draw(thread_columns(pid, 100 + i, len(names), base)) for i, pid in enumerate(pids)]
    threads.sort(key=lambda t: (t.pid, t.tid))
    processes = draw(
        st.dictionaries(st.sampled_from([1, 4242, 7]), st.one_of(NAME_TEXT, st.just("")))
    )
    return Timeline(names=names, threads=threads, processes=processes)


def thread_of_rows(pid: int, tid: int, rows: list[tuple[int, int, int, int]]) -> ThreadTimeline:
    """A thread from hand-written (start, end, depth, name id) rows in (start, depth)
    order, without addresses or counts."""
    cols = np.array(rows, dtype=np.int64).reshape(-1, 4).T
    n = len(rows)
    thread = ThreadTimeline(
        pid=pid,
        tid=tid,
        start=cols[0],
        end=cols[1],
        depth=cols[2].astype(np.int32),
        name_id=cols[3].astype(np.int32),
        address=np.zeros(n, dtype=np.uint64),
        instructions=np.full(n, -1, dtype=np.int64),
        cycles=np.full(n, -1, dtype=np.int64),
        flags=np.zeros(n, dtype=np.uint8),
    )
    check_nesting(thread)
    return thread


def stream_order(timeline: Timeline, seed: int) -> SliceBatch:
    """Every slice in one batch, in an order a streaming engine may write: calls that
    start together on a thread outermost first, everything else shuffled."""
    rng = np.random.default_rng(seed)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("pid", "tid", "start", "end", "depth")}
    extra: dict[str, list[np.ndarray]] = {k: [] for k in ("name_id", "address", "flags")}
    extra |= {"instructions": [], "cycles": []}
    for t in timeline.threads:
        n = len(t)
        cols["pid"].append(np.full(n, t.pid, np.int64))
        cols["tid"].append(np.full(n, t.tid, np.int64))
        cols["start"].append(t.start)
        cols["end"].append(t.end)
        cols["depth"].append(t.depth.astype(np.int64))
        for k in extra:
            extra[k].append(getattr(t, k))
    joined = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in cols.items()}
    group = rng.permutation(1 << 20)[(joined["tid"] * 7919 + joined["start"]) % (1 << 20)]
    order = np.lexsort((joined["depth"], joined["start"], joined["tid"], group))
    batch = SliceBatch(names=timeline.names)
    for k in ("pid", "tid", "start", "end"):
        setattr(batch, k, joined[k][order])
    for k, v in extra.items():
        setattr(batch, k, np.concatenate(v)[order] if v else getattr(batch, k))
    return batch
