"""How far a decode has got, for a progress display: Intel PT bytes decoded (estimated
from the time of the latest event, against each perf.data's time range), events taken,
slices written.

The decoders' streams report through :class:`ProgressTracker` (:func:`counted` for event
batches, :func:`count_items` for the columnar stream); the writer reports the slices.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ptscope.decode.parallel import read_trace_layout
from ptscope.model import BranchBatch, BranchEvent, Event

__all__ = ["DecodeProgress", "Progress", "ProgressTracker", "count_items", "counted"]


@dataclass
class DecodeProgress:
    """Where a decode is, for a progress display."""

    trace_bytes: int = 0
    """Intel PT bytes in the recording's perf.data files (0 when unknown)."""
    decoded_bytes: int = 0
    """How many of them are decoded, estimated from the time of the latest event."""
    events: int = 0
    slices: int = 0
    """Slices written so far."""


Progress = Callable[[DecodeProgress], None]


class ProgressTracker:
    """Keeps a :class:`DecodeProgress` up to date and reports it (at most 20 times a
    second: a display needs no more, and each report costs a little)."""

    def __init__(self, progress: Progress | None, perf_data: Sequence[Path]) -> None:
        self._progress = progress
        self.state = DecodeProgress()
        self._files: list[tuple[int, int, int]] = []  # (first time, last time, bytes)
        if progress is not None:
            for path in perf_data:
                layout = read_trace_layout(path)
                span = layout.time_range if layout is not None else None
                size = layout.trace_bytes if layout is not None else 0
                self._files.append((*(span or (0, 0)), size))
            self.state.trace_bytes = sum(f[2] for f in self._files)
        self._before = 0  # bytes of the files already done
        self._file = -1
        self._last = 0.0

    def file(self, index: int) -> None:
        if self._file >= 0 and self._file < len(self._files):
            self._before += self._files[self._file][2]
        self._file = index
        self._report(force=True)

    def events(self, count: int, last_time: int | None) -> None:
        self.state.events += count
        if last_time is not None and 0 <= self._file < len(self._files):
            first, last, size = self._files[self._file]
            done = size if last <= first else size * (last_time - first) // (last - first)
            self.state.decoded_bytes = self._before + max(0, min(size, done))
        self._report()

    def slices(self, count: int) -> None:
        self.state.slices = count
        self._report()

    def finished(self) -> None:
        self.state.decoded_bytes = self.state.trace_bytes
        self._report(force=True)

    def _report(self, *, force: bool = False) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if force or now - self._last >= 0.05:
            self._last = now
            self._progress(self.state)


def counted(batches: Iterable[list[Event]], tracker: ProgressTracker) -> Iterator[list[Event]]:
    """``batches`` as they come, each reported to ``tracker``."""
    for batch in batches:
        last = next((e.time for e in reversed(batch) if isinstance(e, BranchEvent)), None)
        tracker.events(len(batch), last)
        yield batch


def count_items(items: Sequence[Event | BranchBatch], tracker: ProgressTracker) -> None:
    """Report a batch of the columnar stream (events and branch batches) to ``tracker``."""
    count, last = 0, None
    for e in items:
        if type(e) is BranchBatch:
            count += len(e)
            if len(e):
                last = int(e.time[-1])
        else:
            count += 1
    tracker.events(count, last)
