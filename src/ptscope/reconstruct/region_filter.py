"""``--filter START,STOP``: keep only what happens between a call of START and the next call
of STOP, as a pure transformation of a :class:`~ptscope.timeline.Timeline`.

Regions are global in time (a START on one thread opens the region for every thread, as
the first STOP after it, on any thread, closes it): each START call is paired with the
first STOP call that begins after it, and STARTs inside an open region are ignored.
Slices are clipped to the regions (a slice spanning two regions becomes two pieces); a
clipped start is flagged ``INFERRED_START`` and a clipped end ``OPEN_AT_END``. Clipping
keeps nesting: if a child lies inside its parent, its clipped piece lies inside the
parent's.

A streamed decode (:class:`StreamedRegions`) cannot know the regions before its end: the
slices come as calls return, and a START seen last may open a region that a call returned
long ago overlaps. So it keeps the START and STOP call times, spills every batch to an
unnamed temporary file beside the trace (memory stays flat; the file is gone whatever
happens), and once the decode has ended reads the batches back clipped.
"""

from __future__ import annotations

import bisect
import dataclasses
import pickle
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from ptscope.errors import PtscopeError, UsageError
from ptscope.timeline import SliceBatch, SliceFlags, ThreadTimeline, Timeline

__all__ = [
    "StreamedRegions",
    "clip_to_regions",
    "filter_regions",
    "find_regions",
    "parse_filter",
    "regions_between",
]


def parse_filter(text: str) -> tuple[str, str]:
    """``START,STOP`` → (start, stop) function names."""
    start, comma, stop = text.partition(",")
    start, stop = start.strip(), stop.strip()
    if not comma or not start or not stop or "," in stop:
        raise UsageError(
            f"--filter {text!r}: expected two function names, START,STOP",
            hint="for example: --filter handle_request,send_reply",
        )
    return start, stop


def _call_times(timeline: Timeline, name: str) -> np.ndarray:
    ids = [i for i, n in enumerate(timeline.names) if n == name]
    if not ids:
        return np.zeros(0, dtype=np.int64)
    times = [t.start[np.isin(t.name_id, ids)] for t in timeline.threads]
    return np.sort(np.concatenate(times)) if times else np.zeros(0, dtype=np.int64)


def find_regions(timeline: Timeline, start: str, stop: str) -> list[tuple[int, int]]:
    """[(begin, end)] of every START … STOP region, in time order."""
    return regions_between(_call_times(timeline, start), _call_times(timeline, stop))


def regions_between(
    starts: npt.NDArray[np.int64], stops: npt.NDArray[np.int64]
) -> list[tuple[int, int]]:
    """[(begin, end)] of the regions that the sorted START and STOP call times make."""
    regions: list[tuple[int, int]] = []
    i = 0
    n = len(starts)
    while i < n:
        begin = int(starts[i])
        j = int(np.searchsorted(stops, begin, side="right"))
        if j >= len(stops):
            break
        end = int(stops[j])
        regions.append((begin, end))
        i = int(np.searchsorted(starts, end, side="left"))
    return regions


def _overlaps(
    s: npt.NDArray[np.int64], e: npt.NDArray[np.int64], bounds: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Every (slice, region) pair where the slice ``[s, e]`` overlaps the region (a point
    slice: lies at or after its begin and before its end), slice by slice. The regions a
    slice overlaps are a run: from the first that ends after it starts to the last that
    begins before it ends."""
    begins, ends = bounds[:, 0], bounds[:, 1]
    first = np.searchsorted(ends, s, "right")
    stop = np.where(s == e, np.searchsorted(begins, s, "right"), np.searchsorted(begins, e, "left"))
    return _runs(first, np.maximum(stop - first, 0))


def _runs(
    first: npt.NDArray[np.intp], counts: npt.NDArray[np.intp]
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Each run ``first[i] .. first[i] + counts[i] - 1`` spelled out: (i, value) for every
    value of every run, run by run."""
    owner = np.repeat(np.arange(len(first)), counts)
    offsets = np.cumsum(counts) - counts
    return owner, np.repeat(first - offsets, counts) + np.arange(len(owner))


def _clip_thread(thread: ThreadTimeline, regions: Sequence[tuple[int, int]]) -> ThreadTimeline:
    bounds = np.array(regions, dtype=np.int64).reshape(-1, 2)
    idx, region = _overlaps(thread.start, thread.end, bounds)
    begin, end = bounds[region, 0], bounds[region, 1]
    start, stop = thread.start[idx], thread.end[idx]
    flags = thread.flags[idx].copy()
    flags[start < begin] |= np.uint8(SliceFlags.INFERRED_START)
    flags[stop > end] |= np.uint8(SliceFlags.OPEN_AT_END)
    start = np.maximum(start, begin)
    depth = thread.depth[idx]
    # By (start, depth); ties region by region, each in the thread's order.
    order = np.lexsort((idx, region, depth, start))
    idx = idx[order]
    out = ThreadTimeline(pid=thread.pid, tid=thread.tid, name=thread.name)
    out.start = start[order]
    out.end = np.minimum(stop, end)[order]
    out.depth = depth[order]
    out.name_id = thread.name_id[idx]
    out.address = thread.address[idx]
    out.instructions = thread.instructions[idx]
    out.cycles = thread.cycles[idx]
    out.flags = flags[order]
    # A piece keeps what its whole call ran (as the counts) and the call's perf times
    # and anchor (its drill command lists the whole call).
    if thread.icache_lines is not None:
        out.icache_lines = thread.icache_lines[idx]
    if thread.perf_start is not None and thread.perf_end is not None:
        out.perf_start = thread.perf_start[idx]
        out.perf_end = thread.perf_end[idx]
    if thread.anchor_ip is not None and thread.anchor_occurrence is not None:
        out.anchor_ip = thread.anchor_ip[idx]
        out.anchor_occurrence = thread.anchor_occurrence[idx]
    out.instants = [i for i in thread.instants if _inside(i.time, regions)]
    out.counters = [c for c in thread.counters if _inside(c.time, regions)]
    return out


def _inside(time: int, regions: Sequence[tuple[int, int]]) -> bool:
    k = bisect.bisect_right(regions, time, key=lambda r: r[0]) - 1
    return k >= 0 and time <= regions[k][1]


def clip_to_regions(timeline: Timeline, regions: Sequence[tuple[int, int]]) -> Timeline:
    """The timeline restricted to ``regions`` (sorted, non-overlapping)."""
    return Timeline(
        names=list(timeline.names),
        threads=[_clip_thread(t, regions) for t in timeline.threads],
        processes=dict(timeline.processes),
    )


def filter_regions(timeline: Timeline, start: str, stop: str) -> Timeline:
    """Keep only START … STOP regions; a clear error when there is none."""
    regions = find_regions(timeline, start, stop)
    if not regions:
        missing = [n for n in (start, stop) if not len(_call_times(timeline, n))]
        raise _no_region(start, stop, missing)
    return clip_to_regions(timeline, regions)


def _no_region(start: str, stop: str, missing: Sequence[str]) -> UsageError:
    why = (
        f"{' and '.join(missing)} never called in this trace"
        if missing
        else f"no call of {stop} after a call of {start}"
    )
    return UsageError(f"--filter {start},{stop}: {why}", hint="nothing to keep")


_COLUMNS = tuple(
    f.name
    for f in dataclasses.fields(SliceBatch)
    if f.name not in ("names", "call_sites", "instants", "counters")
)


def _rows(batch: SliceBatch, rows: npt.NDArray[np.intp]) -> SliceBatch:
    """The ``rows`` of ``batch`` (slices only)."""
    picked: dict[str, Any] = {}
    for name in _COLUMNS:
        column = getattr(batch, name)
        picked[name] = None if column is None else column[rows]
    return SliceBatch(names=batch.names, call_sites=batch.call_sites, **picked)


class StreamedRegions:
    """``--filter START,STOP`` on slice batches as a streaming engine gives them.

    :meth:`add` every batch, then :meth:`clipped` gives the same slices, instants and
    counters as :func:`filter_regions` on the whole Timeline would keep, as batches: first
    the pieces of calls that a region's begin cuts (begun before it: as many as the calls
    open there), outermost first, since they all start at that begin and a viewer nests
    equal starts in file order; then everything else in the engine's order. The spill
    lives in ``spill_dir`` (the trace's directory: where the user keeps big files, while
    ``/tmp`` may be memory).
    """

    def __init__(self, start: str, stop: str, spill_dir: Path) -> None:
        self.start, self.stop = start, stop
        self._dir = spill_dir
        try:  # closed by close(): it outlives this call
            self._spill: IO[bytes] = tempfile.TemporaryFile(  # noqa: SIM115
                dir=spill_dir, prefix=".ptscope-filter-"
            )
        except OSError as e:
            raise self._cannot(e) from None
        self._names: list[str] = []
        self._call_sites: dict[int, str] | None = None
        self._known = 0  # names looked at so far
        self._ids: dict[str, list[int]] = {start: [], stop: []}
        self._times: dict[str, list[npt.NDArray[np.int64]]] = {start: [], stop: []}
        self._batches = 0

    def add(self, batch: SliceBatch) -> None:
        """Take a batch (its slices, instants and counters)."""
        self._names = batch.names
        self._call_sites = batch.call_sites
        for i in range(self._known, len(batch.names)):
            ids = self._ids.get(batch.names[i])
            if ids is not None:
                ids.append(i)
        self._known = len(batch.names)
        for name, ids in self._ids.items():
            if ids and len(batch):
                self._times[name].append(batch.start[np.isin(batch.name_id, ids)])
        # Protocol 5 writes the columns' buffers as they are; the name table is shared by
        # every batch (it only grows) and is put back when the batches are read.
        try:
            pickle.dump(
                dataclasses.replace(batch, names=[], call_sites=None), self._spill, protocol=5
            )
        except OSError as e:
            raise self._cannot(e) from None
        self._batches += 1

    def _cannot(self, error: OSError) -> PtscopeError:
        return PtscopeError(
            f"--filter: cannot keep the calls in {self._dir} until the regions are known: "
            f"{error.strerror or error}",
            hint="check the free space there (the trace's directory)",
        )

    def regions(self) -> list[tuple[int, int]]:
        """The regions, once every batch is in; :class:`UsageError` when there is none."""
        starts, stops = (
            np.sort(np.concatenate(self._times[n])) if self._times[n] else np.zeros(0, np.int64)
            for n in (self.start, self.stop)
        )
        regions = regions_between(starts, stops)
        if not regions:
            missing = [n for n, t in ((self.start, starts), (self.stop, stops)) if not len(t)]
            raise _no_region(self.start, self.stop, missing)
        return regions

    def clipped(self, regions: Sequence[tuple[int, int]]) -> Iterator[SliceBatch]:
        """Every batch clipped to ``regions`` (two reads of the spill)."""
        bounds = np.array(regions, dtype=np.int64).reshape(-1, 2)
        begins = bounds[:, 0]
        # Pass 1: the calls that a region's begin cuts (few: a call open at many begins
        # is one row here, its pieces are made a chunk of regions at a time).
        cut: list[SliceBatch] = []
        spans: list[npt.NDArray[np.int64]] = []
        for batch in self._read():
            first = np.searchsorted(begins, batch.start, "right")
            stop = np.searchsorted(begins, batch.end, "left")
            rows = np.flatnonzero(stop > first)
            if len(rows):
                cut.append(_rows(batch, rows))
                spans.append(np.stack([first[rows], stop[rows]]))
        if cut:
            yield from _cut_pieces(_joined(cut, self._names), np.hstack(spans), bounds)
        # Pass 2: each call's piece in the region it began in, in the engine's order.
        for batch in self._read():
            kept = _begun_inside(batch, bounds)
            kept.instants = [i for i in batch.instants if _inside(i[2].time, regions)]
            kept.counters = [c for c in batch.counters if _inside(c[2].time, regions)]
            yield kept

    def _read(self) -> Iterator[SliceBatch]:
        self._spill.flush()
        self._spill.seek(0)
        for _ in range(self._batches):
            batch: SliceBatch = pickle.load(self._spill)
            batch.names = self._names
            batch.call_sites = self._call_sites
            yield batch

    def close(self) -> None:
        self._spill.close()


def _begun_inside(batch: SliceBatch, bounds: npt.NDArray[np.int64]) -> SliceBatch:
    """The slices that begin inside a region (a point: at its begin, or after and before
    its end), each cut at the region's end (``OPEN_AT_END`` when that cut it)."""
    s = batch.start
    region = np.searchsorted(bounds[:, 0], s, "right") - 1
    end = bounds[np.maximum(region, 0), 1]
    rows = np.flatnonzero((region >= 0) & (s < end))
    kept = _rows(batch, rows)
    end = end[rows]
    kept.flags = np.where(kept.end > end, kept.flags | np.uint8(SliceFlags.OPEN_AT_END), kept.flags)
    kept.end = np.minimum(kept.end, end)
    return kept


_CUT_CHUNK = 4096
"""Regions whose cut calls are made into pieces at once."""


def _cut_pieces(
    calls: SliceBatch, spans: npt.NDArray[np.int64], bounds: npt.NDArray[np.int64]
) -> Iterator[SliceBatch]:
    """The pieces of ``calls`` that begin at a region's begin (call ``i`` is cut by the
    regions ``spans[0, i]`` to ``spans[1, i] - 1``), region by region, outermost first:
    they all start at that begin, and a viewer nests equal starts in file order. The
    longest piece is the outermost; of pieces that end together, the call that began
    first (then the engine's order, which writes an outer call before an inner one that
    began at the same time)."""
    first, stop = spans
    for lo in range(int(first.min()), int(stop.max()), _CUT_CHUNK):
        hi = lo + _CUT_CHUNK
        calls_here = np.flatnonzero((first < hi) & (stop > lo))
        a = np.maximum(first[calls_here], lo)
        owner, region = _runs(a, np.minimum(stop[calls_here], hi) - a)
        rows = calls_here[owner]
        begin, end = bounds[region, 0], bounds[region, 1]
        piece_end = np.minimum(calls.end[rows], end)
        order = np.lexsort((rows, calls.start[rows], -piece_end, region))
        rows, begin, end, piece_end = rows[order], begin[order], end[order], piece_end[order]
        pieces = _rows(calls, rows)
        flags = pieces.flags | np.uint8(SliceFlags.INFERRED_START)
        flags[pieces.end > end] |= np.uint8(SliceFlags.OPEN_AT_END)
        # A piece keeps what its whole call ran (the counts, perf times and anchor).
        pieces.start, pieces.end, pieces.flags = begin, piece_end, flags
        yield pieces


def _joined(batches: list[SliceBatch], names: list[str]) -> SliceBatch:
    """The slices of ``batches`` as one batch."""
    joined = SliceBatch(names=names, call_sites=batches[0].call_sites if batches else None)
    for name in _COLUMNS:
        columns = [getattr(b, name) for b in batches]
        setattr(
            joined,
            name,
            None if any(c is None for c in columns) else np.concatenate(columns),
        )
    return joined
