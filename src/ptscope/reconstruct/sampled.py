"""Sampled call stacks → per-thread slices, by diffing each stack against the previous one.

A frame stays open for as long as it stays on the sampled stack: for each new sample of a
thread, the frames are compared from the root with the frames currently open; the first
position where the *function* differs (not the return address: a caller sampled at two
different call sites is still one activation) closes everything above it at the sample's
time and opens the sample's remaining frames. At the end of a thread every open frame is
closed one sampling interval after the last sample (the last stack was seen then, and is
assumed to have lasted as long as a sample stands for) and marked ``OPEN_AT_END``.

This is the py-spy ``chrometrace`` algorithm (style-anchors §9.10). Sampling cannot see a
function that returned and was called again between two samples: those become one slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ptscope.model import StackSample
from ptscope.timeline import SliceFlags, ThreadTimeline, Timeline

__all__ = ["SampledStackBuilder", "timeline_from_samples"]

_U64 = (1 << 64) - 1


@dataclass(slots=True)
class _Open:
    function: str
    start: int
    address: int
    flags: int


@dataclass
class _ThreadState:
    pid: int
    tid: int
    stack: list[_Open] = field(default_factory=list)
    first_time: int | None = None
    last_time: int = 0
    gaps: list[int] = field(default_factory=list)
    # Finished slices as parallel lists (converted to numpy columns at the end).
    start: list[int] = field(default_factory=list)
    end: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    name_id: list[int] = field(default_factory=list)
    address: list[int] = field(default_factory=list)
    flags: list[int] = field(default_factory=list)


class SampledStackBuilder:
    """Feed :class:`~ptscope.model.StackSample`s in time order (per thread), then :meth:`finish`.

    Samples of different threads may interleave. A sample older than the previous one of
    the same thread is clamped to it (perf orders samples per CPU, not globally).
    """

    def __init__(self) -> None:
        self._threads: dict[tuple[int, int], _ThreadState] = {}
        self._names: list[str] = []
        self._name_ids: dict[str, int] = {}

    def _name_id(self, name: str) -> int:
        try:
            return self._name_ids[name]
        except KeyError:
            self._name_ids[name] = len(self._names)
            self._names.append(name)
            return self._name_ids[name]

    def feed(self, sample: StackSample) -> None:
        key = (sample.pid, sample.tid)
        state = self._threads.get(key)
        if state is None:
            state = self._threads[key] = _ThreadState(sample.pid, sample.tid)
        time = sample.time
        if state.first_time is None:
            state.first_time = time
        else:
            if time < state.last_time:
                time = state.last_time
            state.gaps.append(time - state.last_time)
        state.last_time = time
        stack = state.stack
        frames = sample.frames
        common = 0
        limit = min(len(stack), len(frames))
        while common < limit and stack[common].function == frames[common].function:
            common += 1
        self._close(state, common, time, 0)
        initial = time == state.first_time
        for loc in frames[common:]:
            flags = SliceFlags.INFERRED_START if initial else SliceFlags.NONE
            # An entry below 0 (perf's garbage offsets past a symbol's end) is kept as
            # the engines keep it: two's complement in 64 bits.
            address = loc.entry & _U64 if loc.offset >= 0 else 0
            stack.append(_Open(loc.function, time, address, int(flags)))

    def feed_all(self, samples: Iterable[StackSample]) -> None:
        for sample in samples:
            self.feed(sample)

    def _close(self, state: _ThreadState, keep: int, time: int, extra_flags: int) -> None:
        stack = state.stack
        while len(stack) > keep:
            depth = len(stack) - 1
            frame = stack.pop()
            if frame.start == time:
                # Seen in no sample but one with the same timestamp: nothing to show.
                continue
            state.start.append(frame.start)
            state.end.append(time)
            state.depth.append(depth)
            state.name_id.append(self._name_id(frame.function))
            state.address.append(frame.address)
            state.flags.append(frame.flags | extra_flags)

    def finish(self) -> Timeline:
        """Close every thread's frames and return the timeline (threads ordered by pid, tid)."""
        threads: list[ThreadTimeline] = []
        for key in sorted(self._threads):
            state = self._threads[key]
            interval = max(1, int(np.median(state.gaps))) if state.gaps else 1
            self._close(state, 0, state.last_time + interval, int(SliceFlags.OPEN_AT_END))
            threads.append(_columns(state))
        return Timeline(names=list(self._names), threads=threads)


def _columns(state: _ThreadState) -> ThreadTimeline:
    start = np.asarray(state.start, dtype=np.int64)
    depth = np.asarray(state.depth, dtype=np.int32)
    order = np.lexsort((depth, start))
    return ThreadTimeline(
        pid=state.pid,
        tid=state.tid,
        start=start[order],
        end=np.asarray(state.end, dtype=np.int64)[order],
        depth=depth[order],
        name_id=np.asarray(state.name_id, dtype=np.int32)[order],
        address=np.asarray(state.address, dtype=np.uint64)[order],
        instructions=np.full(len(start), -1, dtype=np.int64),
        cycles=np.full(len(start), -1, dtype=np.int64),
        flags=np.asarray(state.flags, dtype=np.uint8)[order],
    )


def timeline_from_samples(samples: Iterable[StackSample]) -> Timeline:
    """All samples → a :class:`~ptscope.timeline.Timeline` (one call for the pipeline)."""
    builder = SampledStackBuilder()
    builder.feed_all(samples)
    return builder.finish()
