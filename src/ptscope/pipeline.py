"""The one module that knows every stage: a recording (or perf script text) → events →
timeline → trace file. The CLI calls this; the stages never call each other."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from ptscope.decode.dlfilter_stream import DlfilterRun, choose_decoder, selection_arguments
from ptscope.decode.landing_pads import LandingPads
from ptscope.decode.parallel import (
    SegmentBreak,
    decode_parallel,
    decode_parallel_columnar,
    feed_sink,
)
from ptscope.decode.perf_map import PerfMap, perf_map_path, resolve_location
from ptscope.decode.perf_script import decode_perf_data_text, decode_text_file
from ptscope.decode.perf_text import TextStats
from ptscope.errors import BadInputError
from ptscope.fxt import WriteStats, write_timeline
from ptscope.model import (
    BranchBatch,
    BranchEvent,
    CommEvent,
    Event,
    Location,
    LocationTable,
    StackSample,
)
from ptscope.perftool import find_perf
from ptscope.reconstruct.engine import EngineStats, TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine, make_engine
from ptscope.reconstruct.region_filter import filter_regions
from ptscope.reconstruct.sampled import SampledStackBuilder
from ptscope.recording import Recording, TriggerHit
from ptscope.timeline import Instant, ThreadTimeline, Timeline

__all__ = [
    "HITS_PID",
    "DecodeOptions",
    "DecodeSummary",
    "FunctionStat",
    "decode_perf_script_text",
    "decode_recording",
    "timeline_from_events",
]

log = logging.getLogger("ptscope")

HITS_PID: Final = 0x7FFFFFF0
"""The pseudo process that carries trigger hits on their own track."""


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: decoder choice, parallelism, filters."""

    decoder: str = "auto"
    jobs: int | None = None
    pids: tuple[int, ...] = ()
    tids: tuple[int, ...] = ()
    region: tuple[str, str] | None = None
    symfs: Path | None = None
    kallsyms: Path | None = None
    """Kernel symbols to use (perf ignores the machine's when given a symfs)."""


@dataclass
class FunctionStat:
    """How often a function was called and how long its calls took in total."""

    name: str
    calls: int
    total_ns: int


@dataclass
class DecodeSummary:
    """What a decode produced (printed by the CLI)."""

    output: Path
    decoder: str
    decoder_reason: str
    threads: int = 0
    slices: int = 0
    events: int = 0
    decode_errors: int = 0
    unexpected: int = 0
    unknown_lines: int = 0
    unknown_examples: list[str] = field(default_factory=list)
    top_functions: list[FunctionStat] = field(default_factory=list)
    write: WriteStats = field(default_factory=WriteStats)
    seconds: float = 0.0


Progress = Callable[[int], None]


# ---------------------------------------------------------------------- entry points


def decode_recording(
    recording: Recording,
    output: Path,
    options: DecodeOptions = DecodeOptions(),
    *,
    progress: Progress | None = None,
) -> DecodeSummary:
    """Decode every perf.data of ``recording`` into one trace at ``output``."""
    started = time.perf_counter()
    for path in recording.perf_data_paths():
        if not path.exists():
            raise BadInputError(f"{path}: no such file (the recording is incomplete)")
    if recording.backend == "sampling":
        summary = DecodeSummary(output, "text", "sampled stacks are decoded from perf's text")
        timeline = _sampled_timeline(recording, options, summary)
    else:
        choice = choose_decoder(options.decoder)
        log.info("decoder: %s (%s)", choice.name, choice.reason)
        summary = DecodeSummary(output, choice.name, choice.reason)
        timeline = _branch_timeline(recording, options, summary, choice.name, progress)
    _finish(timeline, recording, options, summary)
    summary.seconds = time.perf_counter() - started
    return summary


def decode_perf_script_text(
    source: Path | str,
    output: Path,
    options: DecodeOptions = DecodeOptions(),
    *,
    progress: Progress | None = None,
) -> DecodeSummary:
    """Decode saved ``perf script`` text (a file or ``-`` for stdin) into a trace."""
    started = time.perf_counter()
    if str(source) != "-" and not Path(source).exists():
        raise BadInputError(f"{source}: no such file")
    summary = DecodeSummary(output, "text", "perf script text given")
    stats: list[TextStats] = []
    batches = decode_text_file(source, on_stats=stats.append)
    timeline = timeline_from_events(
        _filtered(_counted(batches, progress), options), summary=summary
    )
    if stats:
        _take_text_stats(summary, stats[-1])
    _finish(timeline, Recording(directory=Path("."), backend="text"), options, summary)
    summary.seconds = time.perf_counter() - started
    return summary


def timeline_from_events(
    batches: Iterable[list[Event]], *, summary: DecodeSummary | None = None
) -> Timeline:
    """Run the trace-segment engine over event batches and return the finished timeline."""
    engine = TraceSegmentEngine(landing_pads=LandingPads().call_sites_landing_at)
    for batch in batches:
        engine.feed_all(batch)
    timeline = engine.finish()
    if summary is not None:
        _take_engine_stats(summary, engine.stats)
    return timeline


# ---------------------------------------------------------------------- stages


def _binary_resolver(symfs: Path | None) -> Callable[[str], Path | None]:
    """Where to read a DSO that perf names (under ``--symfs`` when given)."""

    def resolve(dso: str) -> Path | None:
        if not dso.startswith("/"):
            return None
        path = symfs / dso.lstrip("/") if symfs is not None else Path(dso)
        return path if path.is_file() else None

    return resolve


def _branch_timeline(
    recording: Recording,
    options: DecodeOptions,
    summary: DecodeSummary,
    decoder: str,
    progress: Progress | None,
) -> Timeline:
    perf = find_perf()
    filters = selection_arguments(options.pids, options.tids)
    if options.symfs is not None:
        filters.append(f"--symfs={options.symfs}")
    filters += _kernel_symbols(options)
    # Exceptions caught in recursion: which activation catches is in the binaries' tables.
    pads = LandingPads(_binary_resolver(options.symfs)).call_sites_landing_at
    # The C engine takes the dlfilter's branches as columns (no object per event).
    engine = (
        make_engine(landing_pads=pads)
        if decoder == "dlfilter"
        else TraceSegmentEngine(landing_pads=pads)
    )
    locations = LocationTable()
    maps = _perf_maps(recording)
    text_stats: list[TextStats] = []
    runs: list[DlfilterRun] = []
    for index, path in enumerate(recording.perf_data_paths()):
        if index:
            engine.end_segment()  # snapshots are separate stretches of time
        if decoder == "dlfilter":
            # The C engine takes columns; the Python engine, event objects.
            decode = (
                functools.partial(decode_parallel_columnar, locations=locations)
                if isinstance(engine, FastEngine)
                else decode_parallel
            )
            stream = decode(
                path,
                jobs=options.jobs,
                extra=filters,
                perf=perf,
                run_info=runs,
                task_events=True,
            )
            feed_sink(engine, _mapped_stream(stream, maps, progress))
        else:
            batches = decode_perf_data_text(
                path,
                pids=options.pids,
                tids=options.tids,
                symfs=options.symfs,
                extra=_kernel_symbols(options),
                task_events=True,
                perf=perf,
                on_stats=text_stats.append,
            )
            for batch in _counted(_with_maps(batches, maps), progress):
                engine.feed_all(batch)
    timeline = engine.finish()
    _take_engine_stats(summary, engine.stats)
    for stats in text_stats:
        _take_text_stats(summary, stats)
    for run in runs:
        _take_text_stats(summary, run.stats.text)
    return timeline


def _sampled_timeline(
    recording: Recording, options: DecodeOptions, summary: DecodeSummary
) -> Timeline:
    builder = SampledStackBuilder()
    text_stats: list[TextStats] = []
    comms: dict[tuple[int, int], str] = {}
    for path in recording.perf_data_paths():
        batches = decode_perf_data_text(
            path,
            sampling=True,
            pids=options.pids,
            tids=options.tids,
            symfs=options.symfs,
            extra=_kernel_symbols(options),
            task_events=True,
            on_stats=text_stats.append,
        )
        for batch in batches:
            for event in batch:
                if isinstance(event, StackSample):
                    builder.feed(event)
                    summary.events += 1
                elif isinstance(event, CommEvent):
                    comms[(event.pid, event.tid)] = event.comm
    timeline = builder.finish()
    for thread in timeline.threads:
        thread.name = thread.name or comms.get((thread.pid, thread.tid), "")
    for stats in text_stats:
        _take_text_stats(summary, stats)
    return timeline


def _finish(
    timeline: Timeline, recording: Recording, options: DecodeOptions, summary: DecodeSummary
) -> None:
    """Names, filters, the hits track, then write the file."""
    _name_processes(timeline, recording)
    if options.region is not None:
        start, stop = options.region
        timeline = filter_regions(timeline, start, stop)
    if recording.hits:
        timeline.threads.append(_hits_track(recording.hits))
        timeline.processes[HITS_PID] = "trigger hits"
    summary.threads = sum(1 for t in timeline.threads if t.pid != HITS_PID)
    summary.slices = timeline.slice_count()
    summary.top_functions = top_functions(timeline)
    summary.write = write_timeline(timeline, summary.output)


# ---------------------------------------------------------------------- helpers


def _kernel_symbols(options: DecodeOptions) -> list[str]:
    return [] if options.kallsyms is None else [f"--kallsyms={options.kallsyms}"]


def _counted(batches: Iterable[list[Event]], progress: Progress | None) -> Iterator[list[Event]]:
    if progress is None:
        yield from batches
        return
    total = 0
    for batch in batches:
        total += len(batch)
        progress(total)
        yield batch


def _filtered(batches: Iterable[list[Event]], options: DecodeOptions) -> Iterator[list[Event]]:
    """pid/tid filters for text that perf did not filter (``--perf-script`` input)."""
    if not options.pids and not options.tids:
        yield from batches
        return
    pids, tids = set(options.pids), set(options.tids)
    for batch in batches:
        yield [
            e
            for e in batch
            if (not pids or getattr(e, "pid", None) in pids)
            and (not tids or getattr(e, "tid", None) in tids)
        ]


def _perf_maps(recording: Recording) -> dict[int, PerfMap]:
    """JIT perf maps (``perf-PID.map``) kept with the recording or still in /tmp."""
    maps: dict[int, PerfMap] = {}
    candidates = list(recording.directory.glob("perf-*.map"))
    candidates += [perf_map_path(pid) for pid in recording.processes]
    for path in candidates:
        pid = PerfMap.pid_of(path)
        if pid is not None and pid not in maps and path.is_file():
            maps[pid] = PerfMap.load(path)
            log.info("using perf map %s (%d symbols)", path, len(maps[pid]))
    return maps


def _with_maps(batches: Iterable[list[Event]], maps: dict[int, PerfMap]) -> Iterator[list[Event]]:
    """Name JIT code that perf could not resolve, from the process's perf map."""
    if not maps:
        yield from batches
        return
    cache: dict[tuple[int, int], Location] = {}

    def fix(pid: int, loc: Location) -> Location:
        key = (pid, id(loc))
        found = cache.get(key)
        if found is None:
            found = cache[key] = resolve_location(loc, maps[pid])
        return found

    for batch in batches:
        for event in batch:
            if isinstance(event, BranchEvent) and event.pid in maps:
                event.src = fix(event.pid, event.src)
                event.dst = fix(event.pid, event.dst)
        yield batch


def _mapped_stream(
    stream: Iterable[list[Event] | list[Event | BranchBatch] | SegmentBreak],
    maps: dict[int, PerfMap],
    progress: Progress | None,
) -> Iterator[list[Event] | list[Event | BranchBatch] | SegmentBreak]:
    """The parallel decoder's stream (batches and segment breaks) with maps and progress."""
    total = 0
    cache: dict[tuple[int, int], int] = {}
    for item in stream:
        if isinstance(item, list):
            if maps:
                item = [_map_batch(e, maps, cache) if type(e) is BranchBatch else e for e in item]
                (item,) = _with_maps([item], maps)  # type: ignore[list-item]
            if progress is not None:
                total += sum(len(e) if type(e) is BranchBatch else 1 for e in item)
                progress(total)
        yield item


def _map_batch(
    batch: BranchBatch, maps: dict[int, PerfMap], cache: dict[tuple[int, int], int]
) -> BranchBatch:
    """:func:`_with_maps` for a batch: its rows of mapped processes get resolved locations."""
    rows = np.flatnonzero(np.isin(batch.pid, np.array(list(maps), dtype=np.int32)))
    if not len(rows):
        return batch
    table = batch.locations
    pids = batch.pid[rows]
    for column in ("src", "dst"):
        ids = getattr(batch, column).copy()
        keys = (pids.astype(np.int64) << 32) | ids[rows].astype(np.int64)
        uniq, inverse = np.unique(keys, return_inverse=True)
        new = np.empty(len(uniq), dtype=np.int32)
        for i, key in enumerate(uniq.tolist()):
            pid, loc = key >> 32, key & 0xFFFFFFFF
            found = cache.get((pid, loc))
            if found is None:
                found = cache[(pid, loc)] = table.add(resolve_location(table[loc], maps[pid]))
            new[i] = found
        ids[rows] = new[inverse]
        setattr(batch, column, ids)
    return batch


def _name_processes(timeline: Timeline, recording: Recording) -> None:
    for thread in timeline.threads:
        if not thread.name:
            thread.name = recording.threads.get(thread.tid, "")
    for pid, command in recording.processes.items():
        timeline.processes.setdefault(pid, command)
    for thread in timeline.threads:
        if thread.pid not in timeline.processes:
            main = next((t for t in timeline.threads if t.tid == thread.pid), thread)
            timeline.processes[thread.pid] = main.name or f"pid {thread.pid}"


def _hits_track(hits: Sequence[TriggerHit]) -> ThreadTimeline:
    track = ThreadTimeline(pid=HITS_PID, tid=HITS_PID, name="hits")
    track.instants = [
        Instant(h.time, f"hit {h.symbol or hex(h.ip)}", {"tid": h.tid, "ip": hex(h.ip)})
        for h in sorted(hits, key=lambda h: h.time)
    ]
    return track


_SUMMARY_CHUNK: Final = 8192


def top_functions(timeline: Timeline, limit: int = 10) -> list[FunctionStat]:
    """The functions with the most total time in their calls (inclusive), across threads."""
    n = len(timeline.names)
    if n == 0:
        return []
    calls = np.zeros(n, dtype=np.int64)
    total = np.zeros(n, dtype=np.int64)
    # In chunks: whole-column temporaries (durations, their float64 copy, bincount's intp
    # copy of the ids) are fresh mmapped memory, and first-touch page faults made this
    # summary cost more than writing the trace on a VM; small chunks reuse the heap.
    step = _SUMMARY_CHUNK
    for thread in timeline.threads:
        for i in range(0, len(thread), step):
            ids = thread.name_id[i : i + step]
            calls += np.bincount(ids, minlength=n)
            durations = thread.end[i : i + step] - thread.start[i : i + step]
            total += np.bincount(ids, weights=durations, minlength=n).astype(np.int64)
    order = np.argsort(-total, kind="stable")[:limit]
    return [
        FunctionStat(timeline.names[i], int(calls[i]), int(total[i]))
        for i in order
        if calls[i] and not timeline.names[i].startswith("[")
    ]


def _take_engine_stats(summary: DecodeSummary, stats: EngineStats) -> None:
    summary.events += stats.events
    summary.decode_errors += stats.decode_errors
    summary.unexpected += stats.unexpected


def _take_text_stats(summary: DecodeSummary, stats: TextStats) -> None:
    summary.unknown_lines += stats.unknown_lines
    room = 5 - len(summary.unknown_examples)
    summary.unknown_examples += list(stats.unknown_examples)[: max(room, 0)]
