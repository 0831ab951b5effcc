"""``--filter START,STOP``: keep only what happens between a call of START and the next call
of STOP, as a pure transformation of a :class:`~ptscope.timeline.Timeline`.

Regions are global in time (a START on one thread opens the region for every thread, as
the first STOP after it, on any thread, closes it): each START call is paired with the
first STOP call that begins after it, and STARTs inside an open region are ignored.
Slices are clipped to the regions (a slice spanning two regions becomes two pieces); a
clipped start is flagged ``INFERRED_START`` and a clipped end ``OPEN_AT_END``. Clipping
keeps nesting: if a child lies inside its parent, its clipped piece lies inside the
parent's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ptscope.errors import UsageError
from ptscope.timeline import SliceFlags, ThreadTimeline, Timeline

__all__ = ["clip_to_regions", "filter_regions", "find_regions", "parse_filter"]


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
    starts = _call_times(timeline, start)
    stops = _call_times(timeline, stop)
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


def _clip_thread(thread: ThreadTimeline, regions: Sequence[tuple[int, int]]) -> ThreadTimeline:
    pieces: list[np.ndarray] = []
    new_start: list[np.ndarray] = []
    new_end: list[np.ndarray] = []
    new_flags: list[np.ndarray] = []
    s, e = thread.start, thread.end
    for begin, end in regions:
        overlaps = (s < end) & (e > begin)
        inside_point = (s == e) & (s >= begin) & (s < end)
        keep = np.flatnonzero(overlaps | inside_point)
        if keep.size == 0:
            continue
        ks, ke = s[keep], e[keep]
        flags = thread.flags[keep].copy()
        flags[ks < begin] |= np.uint8(SliceFlags.INFERRED_START)
        flags[ke > end] |= np.uint8(SliceFlags.OPEN_AT_END)
        pieces.append(keep)
        new_start.append(np.maximum(ks, begin))
        new_end.append(np.minimum(ke, end))
        new_flags.append(flags)
    out = ThreadTimeline(pid=thread.pid, tid=thread.tid, name=thread.name)
    if pieces:
        idx = np.concatenate(pieces)
        start = np.concatenate(new_start)
        depth = thread.depth[idx]
        order = np.lexsort((depth, start))
        idx = idx[order]
        out.start = start[order]
        out.end = np.concatenate(new_end)[order]
        out.depth = depth[order]
        out.name_id = thread.name_id[idx]
        out.address = thread.address[idx]
        out.instructions = thread.instructions[idx]
        out.cycles = thread.cycles[idx]
        out.flags = np.concatenate(new_flags)[order]
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
    return any(begin <= time <= end for begin, end in regions)


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
        why = (
            f"{' and '.join(missing)} never called in this trace"
            if missing
            else f"no call of {stop} after a call of {start}"
        )
        raise UsageError(f"--filter {start},{stop}: {why}", hint="nothing to keep")
    return clip_to_regions(timeline, regions)
