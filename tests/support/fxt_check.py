"""Loads a trace with the third-party ``fxt`` reader (PyPI) and compares it to a Timeline;
every trace loaded so is also replayed as Perfetto's importer would load it, and must lose
nothing there (``support.perfetto_import``).

That reader's caveats (perf-pt-fxt-reference §5.1): it needs provider info first and an
initialization record, and reads a complete event's last word as a *duration* — so we
compare names, start times and counts, and its "duration" with our end tick.
"""

from __future__ import annotations

import gzip
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from fxt.models import (
    CounterEventRecord,
    DurationBeginEventRecord,
    DurationCompleteEventRecord,
    DurationEndEventRecord,
    InstantEventRecord,
    KernelObjectRecord,
)
from fxt.reader import parse_records
from fxt.types import KernelObjectType

from ptscope.fxt import records as rec
from ptscope.timeline import Timeline
from support.perfetto_import import drops_in, events_from_records, replay

_MASK64 = (1 << 64) - 1


@dataclass
class ThirdPartyView:
    """What the ``fxt`` reader saw (times in ticks = ns after the time base)."""

    records: list[object] = field(default_factory=list)
    complete: Counter[tuple[int, int, str, int, int]] = field(default_factory=Counter)
    """(pid, tid, name, start tick, end tick) of every complete event."""
    begins: int = 0
    ends: int = 0
    instants: Counter[tuple[int, int, str, int]] = field(default_factory=Counter)
    counters: Counter[tuple[int, int, str, int, int]] = field(default_factory=Counter)
    processes: dict[int, str] = field(default_factory=dict)
    threads: dict[int, str] = field(default_factory=dict)
    kernel_object_args: list[dict[str, object]] = field(default_factory=list)


def third_party_view(path: Path, *, perfetto_keeps_all: bool = True) -> ThirdPartyView:
    """Parse ``path`` with ``fxt.reader.parse_records``; fails the test on any error, and,
    with ``perfetto_keeps_all``, when Perfetto's importer would drop any slice or instant
    of it (``support.perfetto_import``, replayed on the same records)."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
        result = parse_records(f)  # raises FxtParseError on what it rejects
    assert not result.had_unexpected_eof, result.eof_error
    assert list(result.records_by_provider) == [rec.PROVIDER_ID]
    provider = result.records_by_provider[rec.PROVIDER_ID]
    assert provider.name == rec.PROVIDER_NAME
    view = ThirdPartyView(records=list(provider.records))
    if perfetto_keeps_all:
        dropped = drops_in(path.name, replay(events_from_records(view.records)))
        assert not dropped, f"Perfetto would drop slices of {path}:\n{dropped}"
    for r in provider.records:
        if isinstance(r, DurationCompleteEventRecord):
            t = r.thread
            name = rec.full_name(r.name, r.args)  # a long name is whole in its args
            view.complete[(t.process_id, t.thread_id, name, r.timestamp_ns, r.duration_ns)] += 1
        elif isinstance(r, DurationBeginEventRecord):
            view.begins += 1
        elif isinstance(r, DurationEndEventRecord):
            view.ends += 1
        elif isinstance(r, InstantEventRecord):
            t = r.thread
            name = rec.full_name(r.name, r.args)
            view.instants[(t.process_id, t.thread_id, name, r.timestamp_ns)] += 1
        elif isinstance(r, CounterEventRecord):
            t = r.thread
            value = r.args[rec.ARG_COUNTER_VALUE]
            assert isinstance(value, int)
            view.counters[(t.process_id, t.thread_id, r.name, r.timestamp_ns, value)] += 1
        elif isinstance(r, KernelObjectRecord):
            view.kernel_object_args.append(r.args)
            if r.type == KernelObjectType.PROCESS:
                view.processes[r.id] = r.name
            else:
                view.threads[r.id] = r.name
    return view


def check_against_timeline(path: Path, timeline: Timeline) -> ThirdPartyView:
    """The ``fxt`` reader sees every slice (name, start, end), instant, counter, process
    and thread name of ``timeline``, with times rebased to its earliest time."""
    view = third_party_view(path)
    time_range = timeline.time_range()
    base = time_range[0] if time_range else 0

    def cut(text: str) -> str:
        return rec.truncate_utf8(text).decode("utf-8")

    want_complete: Counter[tuple[int, int, str, int, int]] = Counter()
    want_instants: Counter[tuple[int, int, str, int]] = Counter()
    want_counters: Counter[tuple[int, int, str, int, int]] = Counter()
    for th in timeline.threads:
        pid, tid = th.pid & _MASK64, th.tid & _MASK64
        for s in th.slices(timeline.names):
            want_complete[(pid, tid, s.name, s.start - base, s.end - base)] += 1
        for i in th.instants:
            want_instants[(pid, tid, i.name, i.time - base)] += 1
        for c in th.counters:
            want_counters[(pid, tid, cut(c.name), c.time - base, c.value)] += 1
    assert view.complete == want_complete
    assert view.instants == want_instants
    assert view.counters == want_counters
    pids = {t.pid for t in timeline.threads} | set(timeline.processes)
    assert view.processes == {p & _MASK64: cut(timeline.processes.get(p, "")) for p in pids}
    named = {t.tid & _MASK64: cut(t.name) for t in timeline.threads if t.name}
    assert view.threads == named
    return view
