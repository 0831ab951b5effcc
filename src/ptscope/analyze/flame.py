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
from ptscope.analyze.stream import CallBatch, StreamThread

__all__ = [
    "Box",
    "FlameChartAccumulator",
    "FlameGraphAccumulator",
    "FlameModel",
    "differential_graph",
    "flame_chart",
    "flame_graph",
]

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
    delta: int | None = None
    """A differential graph's box: the change of its stack's self value (after - before)."""


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
    merged: int = 0
    """Chart: calls narrower than a pixel drawn merged with their neighbours (in
    ``merged_boxes`` boxes)."""
    merged_boxes: int = 0
    unit: str = "ns"
    """What x, widths and self values measure: ``ns``, or ``instructions``."""


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
    return _graph_model(
        calls.names, parent, name, depth, value, own.astype(np.int64), count,
        min_fraction, max_boxes,
    )  # fmt: skip


def _graph_model(
    names: list[str],
    parent: I64,
    name: I64,
    depth: I64,
    value: I64,
    own: I64,
    count: npt.NDArray[np.int64],
    min_fraction: float,
    max_boxes: int,
    delta: I64 | None = None,
) -> FlameModel:
    """Stacks (each with its parent stack, name, depth, time, self time and calls) laid
    out: siblings side by side in name order, those too narrow left out."""
    n_paths = len(parent)
    total = int(value[depth == 0].sum()) if n_paths else 0
    floor = _threshold(value, total, min_fraction, max_boxes)
    # Lay out level by level: x = parent's x + the widths of the siblings before it.
    rank = np.empty(len(names), dtype=np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(rank))
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
            names[int(name[p])],
            int(x[p]),
            int(value[p]),
            int(depth[p]),
            0,
            int(own[p]),
            int(count[p]),
            None if delta is None else int(delta[p]),
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


# -- streamed ----------------------------------------------------------------------------


class _Grow:
    """A growing int64 column."""

    def __init__(self) -> None:
        self.data = np.zeros(1024, dtype=np.int64)
        self.size = 0

    def reserve(self, size: int) -> None:
        if size > len(self.data):
            data = np.zeros(max(size, 2 * len(self.data)), dtype=np.int64)
            data[: self.size] = self.data[: self.size]
            self.data = data
        self.size = max(self.size, size)

    def append(self, values: I64) -> None:
        at = self.size
        self.reserve(at + len(values))
        self.data[at : at + len(values)] = values

    @property
    def view(self) -> I64:
        return self.data[: self.size]


class FlameGraphAccumulator:
    """:func:`flame_graph`, a :class:`CallBatch` at a time: per stack, not per call.
    ``weight``: what a box measures, ``ns`` (time) or ``instructions`` (each call's count;
    the batches then need the slices' arguments, and a call without one adds 0)."""

    def __init__(self, names: list[str], *, weight: str = "ns") -> None:
        self.names = names
        self.weight = weight
        self.n_names = max(len(names), 1)
        self.ids: dict[int, int] = {}
        self.parent, self.name, self.depth = _Grow(), _Grow(), _Grow()
        self.value, self.own, self.count = _Grow(), _Grow(), _Grow()
        self.carry = np.zeros(0, dtype=np.int64)  # the stacks of the carried calls

    def add(self, batch: CallBatch) -> None:
        c = batch.carried
        path = np.empty(len(batch), dtype=np.int64)
        if c:
            path[:c] = self.carry
        if c < len(batch):
            depth = batch.depth[c:]
            by_depth = np.argsort(depth, kind="stable") + c
            levels = np.bincount(depth - int(depth.min()))
            bounds = np.concatenate(([0], np.cumsum(levels)))
            for k in range(len(levels)):
                rows = by_depth[bounds[k] : bounds[k + 1]]
                if not len(rows):
                    continue
                up = batch.parent[rows]
                above = np.where(up >= 0, path[np.maximum(up, 0)], -1)
                keys = (above + 1) * self.n_names + batch.name[rows].astype(np.int64)
                unique, inverse = np.unique(keys, return_inverse=True)
                path[rows] = self._intern(unique, int(batch.depth[rows[0]]))[inverse]
            new = path[c:]
            self.value.reserve(len(self.ids))
            self.own.reserve(len(self.ids))
            self.count.reserve(len(self.ids))
            if self.weight == "ns":
                dur = batch.duration[c:]
            else:
                dur = np.maximum(batch.instructions[c:], 0)
            np.add.at(self.value.data, new, dur)
            np.add.at(self.own.data, new, dur)
            np.add.at(self.count.data, new, 1)
            up = batch.parent[c:]
            has = up >= 0
            np.subtract.at(self.own.data, path[up[has]], dur[has])
        self.carry = path[batch.next_carry]

    def _intern(self, keys: I64, depth: int) -> I64:
        out = np.empty(len(keys), dtype=np.int64)
        fresh: list[int] = []
        ids = self.ids
        for i, key in enumerate(keys.tolist()):
            found = ids.get(key)
            if found is None:
                found = ids[key] = len(ids)
                fresh.append(key)
            out[i] = found
        if fresh:
            f = np.asarray(fresh, dtype=np.int64)
            self.parent.append(f // self.n_names - 1)
            self.name.append(f % self.n_names)
            self.depth.append(np.full(len(f), depth, dtype=np.int64))
        return out

    def model(
        self,
        *,
        min_fraction: float = MIN_FRACTION,
        max_boxes: int = MAX_BOXES,
        delta: I64 | None = None,
    ) -> FlameModel:
        n = len(self.ids)
        for column in (self.value, self.own, self.count):
            column.reserve(n)
        model = _graph_model(
            self.names, self.parent.view, self.name.view, self.depth.view,
            self.value.view[:n], self.own.view[:n], self.count.view[:n],
            min_fraction, max_boxes, delta,
        )  # fmt: skip
        model.unit = self.weight
        return model

    def stacks(self) -> list[tuple[str, ...]]:
        """Each stack's names, from its top-level call down (index: the stack's id)."""
        parent, name = self.parent.view, self.name.view
        out: list[tuple[str, ...]] = []
        for up, n in zip(parent.tolist(), name.tolist(), strict=True):
            out.append((*(out[up] if up >= 0 else ()), self.names[n]))
        return out

    def self_values(self) -> I64:
        n = len(self.ids)
        self.own.reserve(n)
        return self.own.view[:n]


def differential_graph(
    before: FlameGraphAccumulator,
    after: FlameGraphAccumulator,
    *,
    min_fraction: float = MIN_FRACTION,
    max_boxes: int = MAX_BOXES,
) -> tuple[FlameModel, int]:
    """AFTER's flame graph, each box with the change of its stack's self value since
    BEFORE (stacks matched by their names); and BEFORE's self value in stacks AFTER does
    not have (not drawn)."""
    old = dict(zip(before.stacks(), before.self_values().tolist(), strict=True))
    after_own = after.self_values()
    delta = np.empty(len(after_own), dtype=np.int64)
    for i, stack in enumerate(after.stacks()):
        delta[i] = int(after_own[i]) - old.pop(stack, 0)
    return after.model(min_fraction=min_fraction, max_boxes=max_boxes, delta=delta), sum(
        old.values()
    )


PIXELS: Final = 1200
"""The width a chart is laid out for (calls narrower than 1/PIXELS of it are merged)."""


class FlameChartAccumulator:
    """:func:`flame_chart`, a :class:`CallBatch` at a time, over ``[left, right)`` (ns
    from the trace's first event). Calls as wide as a pixel or more are boxes of their
    own; narrower ones are merged with the narrow calls next to them at their depth (less
    than a pixel apart) into one box, which says how many calls it holds (flame charts
    draw that way); a box still narrower than ``min_fraction`` of the width is left out.
    Memory: boxes, at most about a pixel's worth per depth and thread."""

    def __init__(
        self,
        names: list[str],
        threads: list[StreamThread],
        left: int,
        right: int,
        *,
        min_fraction: float = MIN_FRACTION,
    ) -> None:
        self.names = names
        self.threads = threads
        self.left = left
        self.total = max(right - left, 1)
        self.pixel = max(self.total // PIXELS, 1)
        self.floor = max(1, int(self.total * min_fraction))
        self.x0, self.x1, self.depth, self.lane = _Grow(), _Grow(), _Grow(), _Grow()
        self.name, self.mixed, self.count, self.own = _Grow(), _Grow(), _Grow(), _Grow()
        self.carry = np.zeros(0, dtype=np.int64)  # the boxes of the carried calls
        self.open: dict[int, int] = {}  # depth -> box of the merged run still open there
        self.lane_now = -1
        self.base = 0
        self.calls = 0

    def _boxes(self, x0: I64, x1: I64, depth: I64, name: I64, mixed: I64, count: I64) -> I64:
        first = self.x0.size
        self.x0.append(x0)
        self.x1.append(x1)
        self.depth.append(depth)
        self.lane.append(np.full(len(x0), self.lane_now, dtype=np.int64))
        self.name.append(name)
        self.mixed.append(mixed)
        self.count.append(count)
        self.own.reserve(first + len(x0))
        return np.arange(first, first + len(x0), dtype=np.int64)

    def add(self, batch: CallBatch) -> None:
        if batch.thread != self.lane_now:
            self.lane_now = batch.thread
            self.open = {}
        c = batch.carried
        box = np.full(len(batch), -1, dtype=np.int64)
        if c:
            box[:c] = self.carry
        n = len(batch) - c
        if n:
            self.calls += n
            start, end = batch.start[c:], batch.end[c:]
            dur = end - start
            depth = batch.depth[c:].astype(np.int64)
            name = batch.name[c:].astype(np.int64)
            self.base += int(dur[depth == 0].sum())
            wide = np.flatnonzero(dur >= self.pixel)
            if len(wide):
                one = np.ones(len(wide), dtype=np.int64)
                box[c + wide] = self._boxes(
                    start[wide], end[wide], depth[wide], name[wide], one * 0, one
                )
            narrow = np.flatnonzero(dur < self.pixel)
            if len(narrow):
                box[c + narrow] = self._merge(start, end, depth, name, narrow)
            own = self.own.data
            mine = box[c:]
            ok = mine >= 0
            np.add.at(own, mine[ok], dur[ok])
            up = batch.parent[c:]
            has = up >= 0
            parent_box = box[up[has]]
            there = parent_box >= 0
            np.subtract.at(own, parent_box[there], dur[has][there])
        self.carry = box[batch.next_carry]

    def _merge(self, start: I64, end: I64, depth: I64, name: I64, rows: I64) -> I64:
        """The box of each narrow call ``rows``: runs at one depth, less than a pixel apart."""
        order = rows[np.argsort(depth[rows], kind="stable")]  # by depth, then start
        s, e, d, nm = start[order], end[order], depth[order], name[order]
        new_run = np.ones(len(order), dtype=bool)
        new_run[1:] = (d[1:] != d[:-1]) | (s[1:] - e[:-1] >= self.pixel)
        heads = np.flatnonzero(new_run)
        run = np.cumsum(new_run) - 1
        # The first run at each depth may go on from the run left open there.
        continued = np.zeros(len(heads), dtype=bool)
        existing = np.full(len(heads), -1, dtype=np.int64)
        for k, h in enumerate(heads.tolist()):
            if h and d[h] == d[h - 1]:
                continue
            was = self.open.get(int(d[h]), -1)
            if was >= 0 and s[h] - self.x1.data[was] < self.pixel:
                continued[k] = True
                existing[k] = was
        last = np.concatenate((heads[1:], [len(order)])) - 1
        fresh = ~continued
        ids = np.empty(len(heads), dtype=np.int64)
        ids[continued] = existing[continued]
        counts = np.diff(np.concatenate((heads, [len(order)])))
        lo = np.minimum.reduceat(nm, heads)
        hi = np.maximum.reduceat(nm, heads)
        if fresh.any():
            ids[fresh] = self._boxes(
                s[heads[fresh]], e[last[fresh]], d[heads[fresh]], nm[heads[fresh]],
                (lo != hi)[fresh].astype(np.int64), counts[fresh],
            )  # fmt: skip
        if continued.any():
            going_on = ids[continued]
            self.x1.data[going_on] = e[last[continued]]
            self.count.data[going_on] += counts[continued]
            self.mixed.data[going_on] |= (lo[continued] != hi[continued]) | (
                nm[heads[continued]] != self.name.data[going_on]
            )
        # The last run at each depth stays open.
        for k in np.flatnonzero(np.append(d[heads[1:]] != d[heads[:-1]], True)).tolist():
            self.open[int(d[heads[k]])] = int(ids[k])
        out = np.empty(len(rows), dtype=np.int64)
        out[np.searchsorted(rows, order)] = ids[run]
        return out

    def model(self, *, max_boxes: int = MAX_BOXES) -> FlameModel:
        n = self.x0.size
        width = self.x1.view - self.x0.view
        floor = _threshold(width, self.total, self.floor / self.total, max_boxes)
        keep = np.flatnonzero(width >= floor)
        count = self.count.view
        mixed = self.mixed.view
        depths = np.zeros(len(self.threads), dtype=np.int64)
        np.maximum.at(depths, self.lane.view[keep], self.depth.view[keep] + 1)
        boxes = []
        for i in keep.tolist():
            calls = int(count[i])
            label = self.names[int(self.name.data[i])]
            if mixed[i]:
                label = f"[{calls:,} calls]"
            boxes.append(
                Box(
                    label,
                    int(self.x0.data[i]) - self.left,
                    int(width[i]),
                    int(self.depth.data[i]),
                    int(self.lane.data[i]),
                    int(self.own.data[i]),
                    calls,
                )
            )
        joined = count[keep] > 1
        lanes = [
            f"{t.name or 'thread'} (tid {t.tid}{'' if t.tid == t.pid else f', pid {t.pid}'})"
            for t in self.threads
        ]
        return FlameModel(
            "chart",
            boxes,
            self.total,
            self.base,
            lanes,
            depths.tolist(),
            int(count.sum() - count[keep].sum()) if n else 0,
            self.left,
            merged=int(count[keep][joined].sum()),
            merged_boxes=int(joined.sum()),
        )
