"""``ptscope decode --verify``: decode a recording with both decoders and compare.

The own decoder (:mod:`ptscope.decode.native`) follows perf's rules so that its events
equal those of perf with the dlfilter (:mod:`ptscope.decode.dlfilter_stream`), event for
event: the same branches with the same times, counts and code lines, the same decode
errors, power and thread-name events. The suite checks that on every recording it makes;
this lets a user check it on theirs (real hardware writes streams the emulator does not).
Both decoders run at once, perf in its process and the own decoder here, and their events
are compared as they come, so memory stays small whatever the recording's size.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

from ptscope.decode.dlfilter_stream import decode_with_dlfilter
from ptscope.decode.inline_runs import dlfilter_argument
from ptscope.decode.native import decode_native
from ptscope.decode.native_support import unsupported_reason
from ptscope.decode.perf_launch import decode_extra
from ptscope.errors import BadInputError
from ptscope.model import (
    BranchEvent,
    CommEvent,
    DecodeError,
    Event,
    InlineNodes,
    Location,
    LocationTable,
    PowerEvent,
)

__all__ = ["Difference", "Verdict", "describe", "differing_fields", "first_difference", "verify"]

_CONTEXT = 3
"""Identical events shown before a difference."""


@dataclass
class Difference:
    """Where the two streams first part: event ``index`` (from 0) of each."""

    index: int
    perf: Event | None
    """perf's event there (None: its stream had ended)."""
    own: Event | None
    before: list[Event] = field(default_factory=list)
    """The identical events just before it."""


@dataclass
class Verdict:
    """One perf.data compared: how many events agreed, and the first difference."""

    perf_data: Path
    events: int
    branches: int
    errors: int
    difference: Difference | None


def _chain(nodes: InlineNodes | None, node: int) -> tuple[tuple[str, str], ...]:
    """The inlined bodies at a location, innermost first: (function, call site) each."""
    out = []
    while nodes is not None and node:
        out.append((nodes.names[node], nodes.call_sites[node]))
        node = nodes.parents[node]
    return tuple(out)


def _same_bodies(a: Event, b: Event, nodes: tuple[InlineNodes | None, InlineNodes | None]) -> bool:
    """Two equal branches are in the same inlined bodies (each decoder numbers its own)."""
    if not isinstance(a, BranchEvent) or not isinstance(b, BranchEvent):
        return True
    na, nb = nodes
    return all(
        _chain(na, x.inline) == _chain(nb, y.inline) for x, y in ((a.src, b.src), (a.dst, b.dst))
    )


def first_difference(
    perf: Iterable[Event],
    own: Iterable[Event],
    nodes: tuple[InlineNodes | None, InlineNodes | None] = (None, None),
) -> Verdict:
    """Compare two event streams as they come (``perf_data`` is left for the caller);
    ``nodes``: each stream's inlined bodies, compared by name and call site."""
    before: deque[Event] = deque(maxlen=_CONTEXT)
    events = branches = errors = 0
    for a, b in zip_longest(perf, own):
        if a != b or (a is not None and b is not None and not _same_bodies(a, b, nodes)):
            diff = Difference(events, a, b, list(before))
            return Verdict(Path(), events, branches, errors, diff)
        events += 1
        branches += isinstance(a, BranchEvent)
        errors += isinstance(a, DecodeError)
        before.append(a)
    return Verdict(Path(), events, branches, errors, None)


def _flat(batches: Iterator[list[Event]]) -> Iterator[Event]:
    for batch in batches:
        yield from batch


def verify(
    paths: Sequence[Path],
    *,
    pids: Sequence[int] = (),
    tids: Sequence[int] = (),
    symfs: Path | None = None,
    insns: bool = True,
    inline: bool = True,
) -> list[Verdict]:
    """Decode each perf.data with perf's decoder and with the own one, and compare
    (with ``insns``, counts and code lines too; with ``inline``, the inlined bodies too).
    A perf.data the own decoder does not take is a :class:`~ptscope.errors.BadInputError`
    (nothing to compare)."""
    verdicts = []
    for path in paths:
        why = unsupported_reason(path)
        if why is not None:
            raise BadInputError(
                f"the own decoder does not decode {path}: {why}", hint="nothing to compare"
            )
        with contextlib.ExitStack() as scratch:
            extra = decode_extra(pids, tids, symfs)
            perf_table, own_table = LocationTable(), LocationTable()
            if inline:
                perf_table.inline, own_table.inline = InlineNodes(), InlineNodes()
                extra += dlfilter_argument(path, perf_table.inline, symfs, scratch)
            perf = decode_with_dlfilter(
                path, insns=insns, task_events=True, extra=extra, locations=perf_table
            )
            own = decode_native(
                path, pids=pids, tids=tids, symfs=symfs, insns=insns, inline=inline,
                locations=own_table,
            )  # fmt: skip
            try:
                verdict = first_difference(
                    _flat(perf), _flat(own), (perf_table.inline, own_table.inline)
                )
            finally:
                for stream in (perf, own):  # (a difference leaves both part way: perf stops)
                    close = getattr(stream, "close", None)
                    if close is not None:
                        close()
        verdicts.append(dataclasses.replace(verdict, perf_data=path))
        if verdict.difference is not None:
            break
    return verdicts


def _time(ns: int | None) -> str:
    return "-" if ns is None else f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def _where(loc: Location) -> str:
    if loc.ip == 0 and not loc.dso:
        return "0"
    if loc.offset >= 0:
        return f"{loc.symbol}+{loc.offset:#x}"
    return f"{loc.ip:#x} ({loc.dso or 'no map'})"


def describe(event: Event | None) -> str:
    """One line for an event, as a user reads it (what differs is listed apart)."""
    if event is None:
        return "(no more events)"
    if isinstance(event, BranchEvent):
        state = "" if event.state.name == "NONE" else f" [trace {event.state.name.lower()}]"
        counts = f"{event.insn_count} instructions, {event.cycle_count} cycles"
        return (
            f"{_time(event.time)} {event.pid}/{event.tid} {event.kind.name.lower()}{state} "
            f"{_where(event.src)} -> {_where(event.dst)} ({counts})"
        )
    if isinstance(event, DecodeError):
        ip = "" if event.ip is None else f" at {event.ip:#x}"
        return f"{_time(event.time)} {event.pid}/{event.tid} decode error: {event.message}{ip}"
    if isinstance(event, PowerEvent):
        return f"{_time(event.time)} {event.pid}/{event.tid} cbr {event.cbr} ({event.freq_mhz} MHz)"
    if isinstance(event, CommEvent):
        exec_ = " (exec)" if event.exec else ""
        return f"{_time(event.time)} {event.pid}/{event.tid} comm {event.comm!r}{exec_}"
    return repr(event)


def differing_fields(a: Event | None, b: Event | None) -> list[str]:
    """``name: perf's value != own value`` for each field of two events of one kind."""
    if a is None or b is None or type(a) is not type(b):
        return []
    out = []
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y:
            out.append(f"{f.name}: {_value(f.name, x)} != {_value(f.name, y)}")
    return out


def _value(name: str, value: object) -> str:
    if name == "ip" and isinstance(value, int):
        return f"{value:#x}"
    if name == "lines" and isinstance(value, tuple):
        return f"{len(value)} lines"
    return str(value)
