"""Flame graphs (call stacks merged, width = time) and flame charts (time on the x axis)
as lists of boxes, computed with numpy; :mod:`ptscope.analyze.flame_svg` draws them.

A flame graph merges every call with the same *stack* (the names from the thread's
top-level call down to it) into one box whose width is the time spent in those calls;
its children are the stacks one call deeper, side by side in name order. Recursion shows
as a stack that repeats a name, so nothing is counted twice. Threads are merged.

A flame chart draws every call where and when it ran: one band per thread, x = time.

Boxes narrower than ``min_fraction`` of the whole width are left out (with everything
above them), and the threshold rises until about ``max_boxes`` remain: an SVG of millions
of elements helps nobody.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from ptscope.analyze.calls import Calls

__all__ = ["Box", "FlameModel", "flame_chart", "flame_graph"]

MIN_FRACTION: Final = 1 / 12000
"""0.1 pixel of a 1200-pixel-wide drawing."""
MAX_BOXES: Final = 30_000

I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Box:
    """One box: ``x`` and ``width`` in ns (from the left edge), ``depth`` from the
    thread's top-level calls, ``lane`` the thread band (flame charts; 0 in a graph)."""

    name: str
    x: int
    width: int
    depth: int
    lane: int
    self_ns: int
    calls: int


@dataclass
class FlameModel:
    kind: str
    """``graph`` or ``chart``."""
    boxes: list[Box]
    total: int
    """ns that the full width stands for."""
    base_ns: int
    """What shares are taken of: the time in all top-level calls."""
    lanes: list[str]
    """Band labels (flame charts: one per thread); one empty label for a graph."""
    lane_depths: list[int]
    """Rows each band needs."""
    left_out: int
    """Calls (chart) or stacks (graph) too narrow to draw."""
    origin_ns: int = 0
    """Chart: the trace time (ns from its first event) at the left edge."""


def _threshold(widths: I64, total: int, min_fraction: float, max_boxes: int) -> int:
    """The smallest width drawn: ``min_fraction`` of the total (at least 1 ns), raised to
    the width of the ``max_boxes``-th widest box when there are more (equal widths
    there may add a few)."""
    floor = max(1, int(total * min_fraction))
    if len(widths) > max_boxes:
        kth = np.partition(widths, len(widths) - max_boxes)[len(widths) - max_boxes]
        floor = max(floor, int(kth))
    return floor


def _stacks(calls: Calls) -> tuple[I64, I64, I64, I64]:
    """Merge calls by stack: (path of each call, parent path of each path, name of each
    path, depth of each path). Paths are numbered level by level."""
    n_names = max(len(calls.names), 1)
    path = np.empty(len(calls), dtype=np.int64)
    levels = int(calls.depth.max()) + 1 if len(calls) else 0
    key = calls.depth.astype(np.uint16) if levels <= 1 << 16 else calls.depth
    by_depth = np.argsort(key, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(calls.depth, minlength=levels))))
    parents: list[I64] = []
    names: list[I64] = []
    depths: list[I64] = []
    count = 0
    for d in range(levels):
        rows = by_depth[bounds[d] : bounds[d + 1]]
        up = path[calls.parent[rows]] if d else np.full(len(rows), -1, dtype=np.int64)
        keys = (up + 1) * n_names + calls.name_id[rows]
        unique, inverse = np.unique(keys, return_inverse=True)
        path[rows] = count + inverse
        parents.append(unique // n_names - 1)
        names.append(unique % n_names)
        depths.append(np.full(len(unique), d, dtype=np.int64))
        count += len(unique)
    if not parents:
        empty = np.zeros(0, dtype=np.int64)
        return path, empty, empty, empty
    return path, np.concatenate(parents), np.concatenate(names), np.concatenate(depths)


def _self_times(calls: Calls) -> I64:
    dur = calls.duration
    has_parent = calls.parent >= 0
    in_callees = np.bincount(
        calls.parent[has_parent], weights=dur[has_parent], minlength=len(calls)
    )
    return dur - np.round(in_callees).astype(np.int64)


def flame_graph(
    calls: Calls, *, min_fraction: float = MIN_FRACTION, max_boxes: int = MAX_BOXES
) -> FlameModel:
    """Calls merged by stack; siblings in name order."""
    path, parent, name, depth = _stacks(calls)
    n_paths = len(parent)
    dur = calls.duration
    value = np.bincount(path, weights=dur, minlength=n_paths).round().astype(np.int64)
    own = np.bincount(path, weights=_self_times(calls), minlength=n_paths).round()
    count = np.bincount(path, minlength=n_paths)
    total = int(value[depth == 0].sum()) if n_paths else 0
    floor = _threshold(value, total, min_fraction, max_boxes)
    # Lay out level by level: x = parent's x + the widths of the siblings before it.
    rank = np.empty(len(calls.names), dtype=np.int64)
    rank[sorted(range(len(calls.names)), key=calls.names.__getitem__)] = np.arange(len(rank))
    x = np.zeros(n_paths, dtype=np.int64)
    shown = value >= floor
    for d in range(int(depth.max()) + 1 if n_paths else 0):
        at = np.flatnonzero(depth == d)
        if d:
            shown[at] &= shown[parent[at]]
        owner = parent[at] if d else np.zeros(len(at), dtype=np.int64)
        order = at[np.lexsort((rank[name[at]], owner))]
        widths = value[order]
        owner = parent[order] if d else np.zeros(len(order), dtype=np.int64)
        before = np.cumsum(widths) - widths
        first = np.ones(len(order), dtype=bool)
        first[1:] = owner[1:] != owner[:-1]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
        x[order] = (x[owner] if d else 0) + before - before[group_start]
    keep = np.flatnonzero(shown)
    boxes = [
        Box(
            calls.names[int(name[p])],
            int(x[p]),
            int(value[p]),
            int(depth[p]),
            0,
            int(own[p]),
            int(count[p]),
        )
        for p in keep.tolist()
    ]
    lane_depth = int(depth[keep].max()) + 1 if len(keep) else 0
    return FlameModel("graph", boxes, total, total, [""], [lane_depth], n_paths - len(keep))


def flame_chart(
    calls: Calls, *, min_fraction: float = MIN_FRACTION, max_boxes: int = MAX_BOXES
) -> FlameModel:
    """Every call at its time, one band per thread."""
    left = int(calls.start.min()) if len(calls) else 0
    right = int(calls.end.max()) if len(calls) else 0
    total = max(right - left, 1)
    dur = calls.duration
    floor = _threshold(dur, total, min_fraction, max_boxes)
    keep = np.flatnonzero(dur >= floor)
    own = _self_times(calls)
    depths = np.zeros(len(calls.threads), dtype=np.int64)
    np.maximum.at(depths, calls.thread[keep], calls.depth[keep].astype(np.int64) + 1)
    boxes = [
        Box(
            calls.names[int(calls.name_id[i])],
            int(calls.start[i]) - left,
            int(dur[i]),
            int(calls.depth[i]),
            int(calls.thread[i]),
            int(own[i]),
            1,
        )
        for i in keep.tolist()
    ]
    lanes = [
        f"{t.name or 'thread'} (tid {t.tid}{'' if t.tid == t.pid else f', pid {t.pid}'})"
        for t in calls.threads
    ]
    base = int(dur[calls.depth == 0].sum())
    return FlameModel(
        "chart", boxes, total, base, lanes, depths.tolist(), len(calls) - len(keep), left
    )
