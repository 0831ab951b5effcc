"""An oracle for what Perfetto's FXT importer keeps: it replays a trace as that importer does
and reports every slice (complete event or instant) it would drop.

Written from the rules in docs/file-formats.md ("What Perfetto keeps"), which were read off
Perfetto's trace processor (v58.2: the Fuchsia tokenizer and parser, the trace sorter, the
slice tracker), not from ptscope's writer, and it reads the file with the third-party
``fxt`` reader (PyPI), not with ours:

- every event goes to the track of its thread (pid, tid); an instant is a slice of length 0
  on that track;
- a complete event that ends before it starts is dropped (``fuchsia_timestamp_overflow``);
- the whole file is sorted by start time, ties in file order (a stable sort);
- per track, each event in that order first closes open slices, from the innermost out:
  one that ends before the event's start, or at it (unless both are of length 0), is
  closed; then an open slice that the event starts inside and ends after makes it dropped
  (``slice_drop_overlapping_complete_event``); else, with 512 slices open already, it is
  dropped (``slice_max_depth_exceeded``); else it becomes the child of the innermost open
  slice.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fxt.models import (
    DurationBeginEventRecord,
    DurationCompleteEventRecord,
    DurationEndEventRecord,
    InstantEventRecord,
)
from fxt.reader import parse_records

__all__ = [
    "MAX_DEPTH",
    "Drop",
    "ImportResult",
    "ImportedEvent",
    "assert_perfetto_keeps_everything",
    "drops_in",
    "events_from_records",
    "events_of",
    "replay",
]

MAX_DEPTH = 512
"""The slice tracker's most slices open on one track (``SliceTracker::kMaxDepth``)."""

OVERLAP = "slice_drop_overlapping_complete_event"
TOO_DEEP = "slice_max_depth_exceeded"
NEGATIVE = "fuchsia_timestamp_overflow"


@dataclass(frozen=True)
class ImportedEvent:
    """One complete event (or instant, ``end == start``) as the file holds it."""

    track: tuple[int, int]
    """(pid, tid): Perfetto's thread track."""
    start: int
    end: int
    name: str
    order: int
    """Its position among the file's events."""
    instant: bool = False


@dataclass(frozen=True)
class Drop:
    event: ImportedEvent
    reason: str
    """The Perfetto statistic it counts in."""
    conflict: ImportedEvent | None = None
    """The open slice it overlaps (``slice_drop_overlapping_complete_event``), or the
    innermost of the :data:`MAX_DEPTH` open (``slice_max_depth_exceeded``)."""

    def __str__(self) -> str:
        e = self.event
        kind = "instant" if e.instant else "slice"
        text = f"{self.reason}: {kind} {e.name!r} [{e.start}, {e.end}] on {e.track}"
        text += f" (event {e.order})"
        if self.conflict is not None:
            c = self.conflict
            how = "overlaps" if self.reason == OVERLAP else f"{MAX_DEPTH} deep, under"
            text += f", {how} {c.name!r} [{c.start}, {c.end}] (event {c.order})"
        return text


@dataclass
class ImportResult:
    kept: list[tuple[ImportedEvent, int]] = field(default_factory=list)
    """Every event kept, with its depth, in the importer's order (per track)."""
    dropped: list[Drop] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for drop in self.dropped:
            out[drop.reason] += 1
        return dict(out)


def events_of(path: Path) -> list[ImportedEvent]:
    """The complete events and instants of ``path`` in file order, read with ``fxt``."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
        result = parse_records(f)
    assert not result.had_unexpected_eof, result.eof_error
    return events_from_records(
        r for provider in result.records_by_provider.values() for r in provider.records
    )


def events_from_records(records: Iterable[object]) -> list[ImportedEvent]:
    """The complete events and instants among ``fxt`` records (in file order)."""
    events: list[ImportedEvent] = []
    for r in records:
        if isinstance(r, DurationCompleteEventRecord):
            # (``fxt`` reads the event's last word, its end tick, as a duration)
            track = (r.thread.process_id, r.thread.thread_id)
            events.append(ImportedEvent(track, r.timestamp_ns, r.duration_ns, r.name, len(events)))
        elif isinstance(r, InstantEventRecord):
            track = (r.thread.process_id, r.thread.thread_id)
            t = r.timestamp_ns
            events.append(ImportedEvent(track, t, t, r.name, len(events), instant=True))
        elif isinstance(r, DurationBeginEventRecord | DurationEndEventRecord):
            raise AssertionError("begin/end events: this oracle replays complete events only")
    return events


def replay(events: Iterable[ImportedEvent]) -> ImportResult:
    """What the importer makes of ``events`` (in file order): the kept ones with their
    depths, and the dropped ones with the statistic each counts in."""
    result = ImportResult()
    per_track: dict[tuple[int, int], list[ImportedEvent]] = defaultdict(list)
    for event in events:
        if event.end < event.start:
            result.dropped.append(Drop(event, NEGATIVE))
        else:
            per_track[event.track].append(event)
    for track_events in per_track.values():
        # Sorted by start, ties in file order (the sorter's key is the time, then the
        # order in which the tokenizer pushed the events: the file's).
        track_events.sort(key=lambda e: (e.start, e.order))
        _replay_track(track_events, result)
    return result


def _replay_track(events: Sequence[ImportedEvent], result: ImportResult) -> None:
    stack: list[ImportedEvent] = []  # the open slices, outermost first
    for event in events:
        length = event.end - event.start
        conflict: ImportedEvent | None = None
        # The open slices are looked at from the innermost out: a closing one takes the
        # innermost off. The importer looks at all of them, but what it keeps open nests
        # (each one inside the one below it), so past the first that stays open and is not
        # overlapped, none closes and none is overlapped.
        while stack:
            open_ = stack[-1]
            if open_.end < event.start or (
                open_.end == event.start and not (open_.end == open_.start and length == 0)
            ):
                stack.pop()
                continue
            if event.start < open_.end < event.end:
                conflict = open_
            break
        if conflict is not None:
            result.dropped.append(Drop(event, OVERLAP, conflict))
        elif len(stack) >= MAX_DEPTH:
            result.dropped.append(Drop(event, TOO_DEEP, stack[-1]))
        else:
            result.kept.append((event, len(stack)))
            stack.append(event)


def assert_perfetto_keeps_everything(*paths: Path, max_depth_ok: bool = False) -> None:
    """Perfetto's importer would keep every slice and instant of every trace in ``paths``
    (each one a trace of its own, as each part of a split trace is loaded).
    ``max_depth_ok``: slices past the importer's depth limit are allowed (a recursion
    deeper than :data:`MAX_DEPTH` has them whatever the writer does)."""
    problems = [
        problem
        for path in paths
        if (problem := drops_in(path.name, replay(events_of(path)), max_depth_ok=max_depth_ok))
    ]
    assert not problems, "Perfetto would drop slices:\n" + "\n".join(problems)


def drops_in(what: str, result: ImportResult, *, max_depth_ok: bool = False) -> str:
    """A few lines on what ``result`` dropped ("" when nothing)."""
    drops = [d for d in result.dropped if not (max_depth_ok and d.reason == TOO_DEEP)]
    if not drops:
        return ""
    counts: dict[str, int] = defaultdict(int)
    for drop in drops:
        counts[drop.reason] += 1
    shown = "\n  ".join(str(d) for d in drops[:5])
    return f"{what}: {len(drops)} dropped {dict(counts)}\n  {shown}"
