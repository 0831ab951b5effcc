"""Every call of a trace as flat numpy columns, with the filters the analysis commands share.

A trace is read through :func:`ptscope.fxt.columns.read_timeline` (the columnar reader);
the threads' slices are laid end to end (thread by thread, each in (start, depth) order)
and each row gets its parent row, so that questions such as "time in callees" are one
``bincount`` away.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import numpy as np
import numpy.typing as npt

from ptscope.errors import BadInputError, UsageError
from ptscope.fxt.columns import TraceColumns, read_columns

__all__ = [
    "Calls",
    "TimeWindow",
    "check_threads",
    "check_tids",
    "format_ns",
    "load_calls",
    "parse_time_window",
]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

_UNITS: Final = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_TIME_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ns|us|µs|ms|s)?\s*$")


@dataclass(frozen=True)
class TimeWindow:
    """``[start, end)`` in ns from the trace's first event; ``end`` None: to the end."""

    start: int = 0
    end: int | None = None


@dataclass
class ThreadInfo:
    pid: int
    tid: int
    name: str
    process: str


@dataclass
class Calls:
    """All slices of the selected threads, one row each.

    Rows are grouped by thread (``thread`` indexes :attr:`threads`) and, within a thread,
    sorted by (start, depth). ``parent`` is the row of the enclosing call (-1 for a
    thread's top-level calls). Times are ns from :attr:`origin`, the trace's first event;
    with a time window they are clipped to it.
    """

    names: list[str]
    threads: list[ThreadInfo]
    thread: I32
    start: I64
    end: I64
    depth: I32
    name_id: I32
    parent: I64
    origin: int
    span: int
    """ns from the first event to the last one in the trace (before any window)."""

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @property
    def duration(self) -> I64:
        return self.end - self.start


def format_ns(ns: float) -> str:
    """A duration for people: ``850 ns``, ``12.3 us``, ``4.56 ms``, ``1.20 s``."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            value = ns / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{ns:.0f} ns"


_LATEST: Final = (1 << 63) - 1
"""Times past this (292 years) are taken as this: past the end of any trace."""


def _parse_time(text: str, what: str) -> int:
    m = _TIME_RE.match(text)
    if m is None:
        raise UsageError(f"--time: {what} {text!r} is not a time (e.g. 1.5ms, 200us, 2s)")
    ns = float(m.group(1)) * _UNITS[m.group(2) or "ns"]  # digits only: never NaN
    return round(ns) if ns < _LATEST else _LATEST


def parse_time_window(text: str) -> TimeWindow:
    """``START,END`` from the trace's first event, each a number with an optional unit
    (ns, us, ms, s; ns without one); either may be empty (``,5ms``: the first 5 ms)."""
    parts = text.split(",")
    if len(parts) != 2:
        raise UsageError(f"--time {text!r}: give START,END (e.g. 10ms,20ms or ,5ms)")
    start = _parse_time(parts[0], "start") if parts[0].strip() else 0
    end = _parse_time(parts[1], "end") if parts[1].strip() else None
    if end is not None and end <= start:
        raise UsageError(f"--time {text!r}: the end must be after the start")
    return TimeWindow(start, end)


SUM_LIMIT: Final = 1 << 62
"""Threads times span, in ns, must stay below this (146 years) for the analyses' sums
to fit in 64 bits with room to spare."""


class _Thread(Protocol):
    tid: int


def check_threads(label: str, span: int, threads: Sequence[object]) -> None:
    """A trace with calls, whose sums fit: else one line."""
    if not threads:
        raise BadInputError(f"{label} holds no calls (no slices in the trace)")
    if span * len(threads) >= SUM_LIMIT:
        # Calls with one stack never overlap on a thread, so every sum the analyses make
        # (a flame box, a function's total) is below threads x span: it fits an int64.
        raise BadInputError(
            f"{label} spans {span:,} ns on {len(threads):,} "
            f"thread{'s' * (len(threads) != 1)}: more time than the statistics can add up "
            "(a damaged trace?)"
        )


def check_tids(label: str, threads: Sequence[_Thread], tids: tuple[int, ...]) -> None:
    """Every thread asked for is in the trace: else one line listing those that are."""
    known = {t.tid for t in threads}
    missing = [tid for tid in tids if tid not in known]
    if missing:
        listed = ", ".join(str(t.tid) for t in threads[:20])
        raise BadInputError(
            f"no thread {', '.join(map(str, missing))} in {label} (threads: {listed})"
        )


def _time_range(trace: TraceColumns) -> tuple[int, int]:
    """(first, last) time of anything in the trace: slices, instants, counters."""
    times = [i.time for t in trace.threads for i in t.instants]
    times += [c.time for t in trace.threads for c in t.counters]
    if len(trace):
        times += [int(trace.start.min()), int(trace.end.max())]
    return (min(times), max(times)) if times else (0, 0)


def load_calls(
    path: Path,
    *,
    tids: tuple[int, ...] = (),
    window: TimeWindow | None = None,
) -> Calls:
    """Read ``path`` and return its calls, keeping only threads ``tids`` (all when
    empty) and calls that overlap ``window`` (clipped to it).

    Raises :class:`ptscope.fxt.FxtFormatError` / OSError as the reader does, and
    :class:`BadInputError` when nothing is left to analyse.
    """
    trace = read_columns(path, with_args=False)
    first, last = _time_range(trace)
    threads = [t for t in trace.threads if len(t)]
    check_threads(str(path), last - first, threads)
    # In place: the reader's columns are ours, and fresh 100 MB arrays cost page faults.
    trace.start -= first
    trace.end -= first
    calls = Calls(
        names=trace.names,
        threads=[ThreadInfo(t.pid, t.tid, t.name, trace.processes.get(t.pid, "")) for t in threads],
        thread=np.repeat(np.arange(len(threads), dtype=np.int32), [len(t) for t in threads]),
        start=trace.start,
        end=trace.end,
        depth=trace.depth,
        name_id=trace.name_id,
        parent=trace.parent,
        origin=first,
        span=last - first,
    )
    if tids:
        check_tids(str(path), threads, tids)
        chosen = [i for i, t in enumerate(threads) if t.tid in tids]
        rows = np.concatenate([np.arange(threads[i].first, threads[i].stop) for i in chosen])
        renumber = np.full(len(threads), -1, dtype=np.int32)
        renumber[chosen] = np.arange(len(chosen), dtype=np.int32)
        calls = _select_rows(calls, rows)
        calls.thread = renumber[calls.thread]
        calls.threads = [calls.threads[i] for i in chosen]
    if window is not None:
        calls = _clip(calls, window)
        if not len(calls):
            raise BadInputError(
                f"no calls in that time window of {path} (it spans {format_ns(calls.span)})"
            )
    return calls


def _select_rows(
    calls: Calls, rows: I64, start: I64 | None = None, end: I64 | None = None
) -> Calls:
    """The calls at ``rows`` (each kept call's parent must be kept too), renumbered."""
    renumber = np.full(len(calls), -1, dtype=np.int64)
    renumber[rows] = np.arange(len(rows))
    parent = calls.parent[rows]
    return Calls(
        names=calls.names,
        threads=calls.threads,
        thread=calls.thread[rows],
        start=calls.start[rows] if start is None else start,
        end=calls.end[rows] if end is None else end,
        depth=calls.depth[rows],
        name_id=calls.name_id[rows],
        parent=np.where(parent >= 0, renumber[np.maximum(parent, 0)], -1),
        origin=calls.origin,
        span=calls.span,
    )


def _clip(calls: Calls, window: TimeWindow) -> Calls:
    """The calls that overlap the window, clipped to it; parents stay (they contain their
    children, so they overlap too)."""
    lo = window.start
    hi = window.end if window.end is not None else np.iinfo(np.int64).max
    keep = (calls.end > lo) & (calls.start < hi)
    keep |= (calls.start == calls.end) & (calls.start >= lo) & (calls.start < hi)
    rows = np.flatnonzero(keep)
    return _select_rows(
        calls, rows, np.maximum(calls.start[rows], lo), np.minimum(calls.end[rows], hi)
    )
