"""The one module that knows every stage: a recording (or perf script text) → events →
timeline → trace file. The CLI calls this; the stages never call each other."""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

from ptscope.children import sweep_stale
from ptscope.decode.binary_files import reading_binaries
from ptscope.decode.blocks import InstructionDetail
from ptscope.decode.dlfilter_stream import DlfilterRun, choose_decoder
from ptscope.decode.inline_runs import dlfilter_argument
from ptscope.decode.landing_pads import LandingPads
from ptscope.decode.native import NativeRun, decode_native, decode_native_columnar
from ptscope.decode.native_support import holds_stack_samples, unsupported_reason
from ptscope.decode.parallel import (
    WINDOWS_TEMP_PREFIX,
    SegmentBreak,
    decode_parallel,
    decode_parallel_columnar,
)
from ptscope.decode.perf_launch import (
    choose_perf_decoder,
    core_idle_beside,
    decode_extra,
    decode_jobs,
)
from ptscope.decode.perf_map import MapResolver, load_perf_maps
from ptscope.decode.perf_script import decode_perf_data_text, decode_text_file
from ptscope.decode.perf_text import TextStats
from ptscope.decode.progress import (
    Progress,
    ProgressTracker,
    count_items,
    counted,
)
from ptscope.errors import BadInputError, PtscopeError, ScratchSpaceError, UsageError
from ptscope.fxt import WriteStats, write_timeline
from ptscope.fxt.background import BackgroundWrites
from ptscope.fxt.stream import PartInfo, TraceStream
from ptscope.fxt.totals import FunctionStat, top_functions
from ptscope.fxt.writer import remove_written, written_in_place
from ptscope.model import (
    CommEvent,
    DecodeError,
    Event,
    InlineNodes,
    LocationTable,
    StackSample,
)
from ptscope.perftool import find_perf
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import EngineStats, TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine, make_engine
from ptscope.reconstruct.region_filter import StreamedRegions, filter_regions
from ptscope.reconstruct.sampled import SampledStackBuilder
from ptscope.recording import Recording, TriggerHit
from ptscope.timeline import Instant, SliceBatch, ThreadTimeline, Timeline

__all__ = [
    "HITS_PID",
    "DecodeOptions",
    "DecodeSummary",
    "FunctionStat",
    "IncompleteDecode",
    "decode_perf_script_text",
    "decode_recording",
    "timeline_from_events",
]

log = logging.getLogger("ptscope")

_T = TypeVar("_T")

HITS_PID: Final = 0x7FFFFFF0
"""The pseudo process that carries trigger hits on their own track."""


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode: decoder choice, parallelism, filters."""

    decoder: str = "auto"
    """``auto`` (the own decoder for what it takes, else perf's), ``native``, ``dlfilter``
    or ``text``."""
    jobs: int | None = None
    pids: tuple[int, ...] = ()
    tids: tuple[int, ...] = ()
    region: tuple[str, str] | None = None
    symfs: Path | None = None
    kallsyms: Path | None = None
    """Kernel symbols to use (perf ignores the machine's when given a symfs)."""
    split_size: int | None = None
    """Split the trace into parts of about this many bytes (``--split-size``)."""
    split_time: int | None = None
    """Split the trace into parts of this many ns of trace time (``--split-time``)."""
    time_axis: str = "time"
    """What slice times measure: ``time``, ``instructions`` or ``cycles`` (``--time-axis``)."""
    insn_detail: bool = True
    """Exact instruction counts and i-cache footprints from the basic-block cache
    (``--no-insn-detail`` turns it off)."""
    inline: bool = True
    """Inlined functions as slices of their own, from the binaries' DWARF (``--no-inline``
    turns it off); at the exact instruction with ``insn_detail``, else at the branches."""
    drill: Path | None = None
    """The kept recording that every slice's ``drill`` command names (None: no drill arg)."""
    writer_thread: bool | None = None
    """Encode, compress and write the trace on a thread of its own, beside the engine
    (:mod:`ptscope.fxt.background`; never with ``region``, nor into a FIFO or a device).
    None: when a core is idle for it (:func:`~ptscope.decode.perf_launch.core_idle_beside`),
    or the decode has windows."""
    read_ahead: bool = False
    """With windows, read their records on a thread of their own, ahead of the engine
    (:mod:`ptscope.decode.read_ahead`, which says why it is off by default; never where
    JIT maps add locations as the engine takes the batches)."""


@dataclass
class DecodeSummary:
    """What a decode produced (printed by the CLI)."""

    output: Path
    decoder: str
    decoder_reason: str
    threads: int = 0
    slices: int = 0
    events: int = 0
    branches: int = 0
    """Branch events the engine took (not counting decode errors and the like)."""
    samples: int = 0
    """Stack samples (sampling recordings)."""
    decode_errors: int = 0
    unexpected: int = 0
    unknown_lines: int = 0
    uncounted_blocks: int = 0
    """Instruction detail: runs of code between branches that could not be read (their
    instructions are in no count)."""
    ring_waits: int = 0
    ring_wait_ns: int = 0
    """Ring mode: how often, and how long in all, perf waited for ptscope to give a record
    chunk back (its time, lost while ptscope wrote; logged with -v)."""
    unknown_examples: list[str] = field(default_factory=list)
    missing_fields: list[str] = field(default_factory=list)
    """Saved perf script text: the ``-F`` fields it lacks, each with what is lost."""
    top_functions: list[FunctionStat] = field(default_factory=list)
    write: WriteStats = field(default_factory=WriteStats)
    parts: list[PartInfo] = field(default_factory=list)
    """The files written (one unless the trace was split)."""
    seconds: float = 0.0
    failure: PtscopeError | None = None
    """perf failed (or was stopped) part way: the trace holds what was decoded before."""


class IncompleteDecode(PtscopeError):
    """perf failed or was stopped part way through the decode: the trace was written with
    what was decoded before (``summary``; a ``[decode error]`` marks where it stops), and
    this is perf's error, in one line that says so."""

    def __init__(self, cause: PtscopeError, summary: DecodeSummary) -> None:
        super().__init__(
            f"{cause.message} (the trace holds what was decoded before)",
            details=cause.details,
            hint=cause.hint,
            exit_code=cause.exit_code,
        )
        self.cause = cause
        self.summary = summary


# ---------------------------------------------------------------------- entry points


def decode_recording(
    recording: Recording,
    output: Path,
    options: DecodeOptions = DecodeOptions(),
    *,
    progress: Progress | None = None,
) -> DecodeSummary:
    """Decode every perf.data of ``recording`` into one trace at ``output``."""
    # Names read from the binaries (PLT stubs, OCaml functions) come from where perf reads
    # them: under --symfs when given (an archive's copies).
    with reading_binaries(_binary_resolver(options.symfs)):
        return _decode_recording(recording, output, options, progress=progress)


def _recovered(recording: Recording) -> bool:
    """``record.emulated.recover``, imported only for a recording left unfinished (the
    recorder's modules would add a tenth to a decode's imports: 76 M instructions)."""
    from ptscope.record import emulated

    return emulated.recover(recording)


def _decode_recording(
    recording: Recording,
    output: Path,
    options: DecodeOptions,
    *,
    progress: Progress | None,
) -> DecodeSummary:
    started = time.perf_counter()
    # What a decode killed by SIGKILL left, whichever decoder this one uses (a decode
    # that makes windows sweeps them too, but the own decoder makes none).
    sweep_stale(WINDOWS_TEMP_PREFIX)
    if recording.unfinished and _recovered(recording):
        log.warning(
            "%s: its recording was not finished (ptscope was stopped while it ran); "
            "decoding what the recorder wrote",
            recording.directory,
        )
    for path in recording.perf_data_paths():
        if not path.exists():
            raise BadInputError(f"{path}: no such file (the recording is incomplete)")
    if sampled_recording(recording):
        summary = DecodeSummary(output, "text", "sampled stacks are decoded from perf's text")
        timeline = _sampled_timeline(recording, options, summary)
    else:
        choice = choose_decoder(options.decoder)
        log.info("decoder: %s (%s)", choice.name, choice.reason)
        summary = DecodeSummary(output, choice.name, choice.reason)
        if _streams(options):
            tracker = ProgressTracker(progress, recording.perf_data_paths())
            _stream(
                recording,
                options,
                summary,
                tracker,
                lambda engine, after: _feed_branches(
                    engine, recording, options, summary, choice.name, tracker, after
                ),
                perfs=_perfs(recording, options, choice.name),
            )
            _check_decoded(summary, str(recording.directory), options, recording)
            summary.seconds = time.perf_counter() - started
            return _complete(summary)
        timeline = _branch_timeline(recording, options, summary, choice.name, progress)
    _finish(timeline, recording, options, summary)
    _check_decoded(summary, str(recording.directory), options, recording)
    summary.seconds = time.perf_counter() - started
    return _complete(summary)


def sampled_recording(recording: Recording) -> bool:
    """A recording of stack samples: the sampling backend's, or a perf.data that ptscope
    did not record and that holds call chains and no Intel PT (``perf record -g``)."""
    if recording.backend == "sampling":
        return True
    paths = recording.perf_data_paths()
    return not recording.backend and bool(paths) and holds_stack_samples(paths[0])


def _complete(summary: DecodeSummary) -> DecodeSummary:
    """The summary of a decode, or :class:`IncompleteDecode` if perf stopped part way."""
    if summary.failure is not None:
        raise IncompleteDecode(summary.failure, summary)
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
    if str(source) != "-":
        try:
            Path(source).stat()
        except FileNotFoundError:
            raise BadInputError(f"{source}: no such file") from None
        except OSError as e:  # a name too long, a loop of links, no permission...
            raise BadInputError(f"cannot read {source}: {e.strerror or e}") from None
    summary = DecodeSummary(output, "text", "perf script text given")
    stats: list[TextStats] = []
    batches = decode_text_file(source, on_stats=stats.append)
    recording = Recording(directory=Path("."), backend="text")
    tracker = ProgressTracker(progress, [])
    events = _filtered(counted(batches, tracker), options)
    if _streams(options):

        def feed(engine: FastEngine, after: Callable[[], None]) -> None:
            for batch in events:
                engine.feed_all(batch)
                after()

        _stream(recording, options, summary, tracker, feed, perfs=0)
    else:
        timeline = timeline_from_events(events, summary=summary)
    if stats:
        _take_text_stats(summary, stats[-1])
        summary.missing_fields = stats[-1].shape.other_missing(stats[-1])
    if not _streams(options):
        _finish(timeline, recording, options, summary)
    _check_decoded(summary, "standard input" if str(source) == "-" else str(source), options)
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
    """Where to read a DSO that perf names (under ``--symfs`` when given). Each name is
    looked up once per decode: every new location asks (a stat and a path built per
    location were a sixth of a small decode's CPU)."""

    @functools.cache
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
    """The whole trace as one Timeline (``--filter`` needs it, and the Python engine when
    the C engine is not built)."""
    pads = LandingPads(_binary_resolver(options.symfs)).call_sites_landing_at
    spread = options.insn_detail  # exact counts: a run of equal times spreads by them
    engine = (
        FastEngine(landing_pads=pads, axis=options.time_axis, spread_by_instructions=spread)
        if options.time_axis != "time"
        else make_engine(landing_pads=pads, spread_by_instructions=spread)
    )
    tracker = ProgressTracker(progress, recording.perf_data_paths())
    _feed_branches(engine, recording, options, summary, decoder, tracker, lambda: None)
    timeline = engine.finish()
    tracker.finished()
    _take_engine_stats(summary, engine.stats)
    return timeline


def _streams(options: DecodeOptions) -> bool:
    """Decode straight into the file (flat memory), unless the C engine is not built."""
    if options.region is not None and (options.split_size or options.split_time):
        # Parts read as one join a call's pieces after the calls that begin with them,
        # while --filter begins many calls at one time (a region's begin).
        raise UsageError("--filter cannot be combined with --split-size or --split-time")
    if options.time_axis != "time" and not fast_engine.is_available():
        raise UsageError(
            f"--time-axis {options.time_axis} needs the C engine, which is not built here",
            hint="reinstall ptscope with a C compiler available",
        )
    return fast_engine.is_available()


def _stream(
    recording: Recording,
    options: DecodeOptions,
    summary: DecodeSummary,
    tracker: ProgressTracker,
    feed: Callable[[FastEngine, Callable[[], None]], None],
    *,
    perfs: int,
) -> None:
    """Decode straight into the trace file(s): ``feed`` gives the engine its events and
    calls back after each batch; the C engine writes each slice once known, so memory
    does not grow with the trace. ``perfs``: how many perfs the decode runs at once (its
    windows), which decides whether the trace is written on a thread of its own."""
    pads = LandingPads(_binary_resolver(options.symfs)).call_sites_landing_at
    engine = FastEngine(
        landing_pads=pads, axis=options.time_axis, spread_by_instructions=options.insn_detail
    )
    sink: TraceStream | None = None
    # The writing runs beside the engine (fxt/background.py) when a core is idle for it,
    # or with windows: the second and later ones are read from files once their perfs have
    # ended, when cores are idle (--jobs 2 on two cores: 0.88-0.96x the wall time with the
    # thread; one job there: 1.01-1.04x). Not with --filter, whose batches wait on disk
    # until the end, nor into a FIFO or a device: a write there waits for its reader, and
    # only the main thread is interrupted by a signal (Ctrl-C).
    wanted = (
        options.writer_thread
        if options.writer_thread is not None
        else perfs > 1 or core_idle_beside(perfs + 1)
    )
    threaded = wanted and options.region is None and not written_in_place(summary.output)
    writes: BackgroundWrites | None = None
    # --filter: the batches wait on disk until the regions are known (at the end).
    regions = (
        None
        if options.region is None
        else StreamedRegions(*options.region, spill_dir=summary.output.parent)
    )

    def open_sink(first: int | None) -> TraceStream:
        # Counts start at 0 on their axes; times at the first event.
        if options.time_axis != "time":
            first = 0
        return TraceStream(
            summary.output,
            first if first is not None else 0,
            split_size=options.split_size,
            split_time=options.split_time,
            processes=recording.processes,
            time_axis=options.time_axis,
            drill=options.drill,
        )

    def drain(force: bool = False) -> None:
        nonlocal sink
        # Big batches: each costs some Python work whatever its size.
        if not force and engine.pending() < _DRAIN_SLICES:
            return
        write(engine.take_output())

    def write(batch: SliceBatch) -> None:
        nonlocal sink, writes
        if not (len(batch) or batch.instants or batch.counters):
            return
        if regions is not None:
            regions.add(batch)
            return
        if sink is None:
            sink = open_sink(engine.first_time())
            if threaded:
                writes = BackgroundWrites(sink)
        if writes is not None:
            writes.write(batch)
        else:
            sink.write(batch)
        tracker.slices(sink.slices)

    try:
        feed(engine, drain)
        drain(force=True)
        write(engine.close())
        if writes is not None:
            writes.finish()
            log.info(
                "trace written on its own thread: %d of %d batches (the rest here, "
                "while it was behind)",
                writes.batches - writes.written_here,
                writes.batches,
            )
        if regions is not None:
            kept = regions.regions()
            sink = open_sink(kept[0][0])
            for batch in regions.clipped(kept):
                sink.write(batch)
        elif sink is None:
            sink = open_sink(engine.first_time())
        for hit in recording.hits:
            sink.instant(HITS_PID, HITS_PID, _hit_instant(hit))
        names = engine.thread_names()
        threads = {key: names.get(key) or recording.threads.get(key[1], "") for key in sink.threads}
        processes = dict(recording.processes)
        for pid, tid in sorted(threads):
            if pid not in processes:
                processes[pid] = threads.get((pid, pid)) or threads[(pid, tid)] or f"pid {pid}"
        if recording.hits:
            processes[HITS_PID] = "trigger hits"
            threads[(HITS_PID, HITS_PID)] = "hits"
        summary.parts, summary.write = sink.close(processes, threads)
        _take_engine_stats(summary, engine.stats)
        summary.threads = len(sink.threads)
        summary.slices = sink.slices
        summary.top_functions = sink.totals.top(sink.names)
    except BaseException:
        if writes is not None:
            writes.abandon()
        if sink is not None:
            sink.abort()  # no partial trace is left behind
        raise
    finally:
        if regions is not None:
            regions.close()
    tracker.slices(sink.slices)
    tracker.finished()


def _perfs(recording: Recording, options: DecodeOptions, decoder: str) -> int:
    """How many perfs a decode of ``recording`` runs at once (its windows; none where the
    own decoder decodes it all)."""
    if decoder == "native":
        paths = recording.perf_data_paths()
        if all(unsupported_reason(p) is None for p in paths):
            return 0
        decoder = choose_perf_decoder(options.decoder).name
    if decoder != "dlfilter":
        return 1
    return max((decode_jobs(options.jobs, p) for p in recording.perf_data_paths()), default=1)


def _feed_branches(
    engine: FastEngine | TraceSegmentEngine,
    recording: Recording,
    options: DecodeOptions,
    summary: DecodeSummary,
    decoder: str,
    tracker: ProgressTracker,
    after: Callable[[], None],
) -> None:
    """Decode every perf.data of ``recording`` into ``engine``, calling ``after`` after each
    batch. Both decoders feed the same engine: the dlfilter's as columns, the text
    decoder's as events (the C engine makes them columns)."""
    locations = LocationTable()
    maps = MapResolver(load_perf_maps(recording.directory, recording.processes))
    text_stats: list[TextStats] = []
    details: list[InstructionDetail] = []
    runs: list[DlfilterRun] = []
    native_runs: list[NativeRun] = []
    used: dict[str, None] = {}  # the decoders that decoded, in order
    for index, path in enumerate(recording.perf_data_paths()):
        if index:
            engine.end_segment()  # snapshots are separate stretches of time
        tracker.file(index)
        file_decoder = _file_decoder(path, decoder, options)
        used[file_decoder] = None
        scratch = contextlib.ExitStack()  # what this file's decode leaves, removed after it
        if file_decoder == "native":
            # (the C engine takes columns; the Python engine, event objects)
            if isinstance(engine, FastEngine):
                stream: Iterator[Any] = decode_native_columnar(
                    path,
                    locations=locations,
                    pids=options.pids,
                    tids=options.tids,
                    symfs=options.symfs,
                    insns=options.insn_detail,
                    inline=options.inline,
                    run_info=native_runs,
                )
            else:
                stream = decode_native(
                    path,
                    pids=options.pids,
                    tids=options.tids,
                    symfs=options.symfs,
                    insns=options.insn_detail,
                    run_info=native_runs,
                )
            batches: Iterator[list[Event]] = iter(())
        elif file_decoder == "dlfilter":
            perf = find_perf()
            filters = decode_extra(options.pids, options.tids, options.symfs)
            filters += _kernel_symbols(options)
            if options.inline and isinstance(engine, FastEngine):
                if locations.inline is None:
                    locations.inline = InlineNodes()
                filters += dlfilter_argument(path, locations.inline, options.symfs, scratch)
            # The C engine takes columns; the Python engine, event objects.
            # Not where JIT maps add locations to the table as the batches are fed.
            ahead = options.read_ahead and not maps.maps
            decode = (
                functools.partial(decode_parallel_columnar, locations=locations, read_ahead=ahead)
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
                insns=options.insn_detail,
            )
            batches = iter(())
        else:
            stream = iter(())
            inline = None
            if options.inline and isinstance(engine, FastEngine):
                if locations.inline is None:
                    locations.inline = InlineNodes()
                # (the events' locations name these, as the other files' batches may)
                inline = engine.inline_nodes(locations.inline)
            batches = decode_perf_data_text(
                path,
                pids=options.pids,
                tids=options.tids,
                symfs=options.symfs,
                extra=_kernel_symbols(options),
                task_events=True,
                perf=find_perf(),
                on_stats=text_stats.append,
                insns=options.insn_detail,
                on_detail=details.append,
                inline=inline,
            )
        stopped: list[PtscopeError] = []
        # Closed on every way out: its perf processes stop, its temporary files go.
        with scratch, _closing(stream), _closing(batches):
            if file_decoder in ("dlfilter", "native"):
                for item in _until_failure(stream, stopped):
                    if isinstance(item, SegmentBreak):
                        engine.end_segment()
                    else:
                        count_items(item, tracker)
                        engine.feed_all(maps.columnar(item))
                    after()
            else:
                for batch in counted(_until_failure(batches, stopped), tracker):
                    engine.feed_all(maps.events(batch))
                    after()
        if stopped:
            failure = stopped[0]
            if not tracker.state.events:
                raise failure  # nothing was decoded: no trace, only the error
            # perf failed part way: what it decoded is kept, the trace marks where it
            # stopped, and the error is raised once the trace is written.
            log.info("decoding stopped: %s", failure.message)
            stop = DecodeError(None, None, None, None, f"decoding stopped: {failure.message}")
            engine.feed_all([stop])
            after()
            summary.failure = failure
            break
    if used and list(used) != [decoder]:
        summary.decoder = " and ".join(used)
        summary.decoder_reason = "what the own decoder does not take is decoded by perf"
    for stats in text_stats:
        _take_text_stats(summary, stats)
    run_stats: list[tuple[TextStats, dict[str, int] | None]] = [
        (run.stats.text, run.stats.trailer) for run in runs
    ] + [(run.stats.text, run.stats.trailer) for run in native_runs]
    for text, counters in run_stats:
        _take_text_stats(summary, text)
        trailer = counters or {}
        summary.uncounted_blocks += int(trailer.get("blocks_unknown", 0))
        summary.ring_waits += int(trailer.get("ring_waits", 0))
        summary.ring_wait_ns += int(trailer.get("ring_wait_ns", 0))
    summary.uncounted_blocks += sum(d.unknown_blocks for d in details)
    if summary.ring_waits:
        log.info(
            "perf waited %d times (%.0f ms in all) for ptscope to give a record chunk back",
            summary.ring_waits,
            summary.ring_wait_ns / 1e6,
        )


def _file_decoder(path: Path, decoder: str, options: DecodeOptions) -> str:
    """The decoder of one perf.data: the own decoder where it takes it (else perf's, and
    one line says why, unless the own decoder was asked for: then that is an error)."""
    if decoder != "native":
        return decoder
    why = unsupported_reason(path)
    if why is None:
        if options.jobs is not None and options.jobs > 1:
            log.info("the own decoder decodes %s on one core (--jobs is perf's)", path)
        return "native"
    if options.decoder == "native":
        raise BadInputError(
            f"the own decoder does not decode {path}: {why}",
            hint="decode it with perf: --decoder dlfilter",
        )
    fallback = choose_perf_decoder(options.decoder).name
    log.warning("%s: decoding with perf (%s): the own decoder does not take it, as %s",
                path, fallback, why)  # fmt: skip
    return fallback


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
                    summary.samples += 1
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
    summary.write = write_timeline(
        timeline, summary.output, time_axis=options.time_axis, drill=options.drill
    )


def _check_decoded(
    summary: DecodeSummary,
    source: str,
    options: DecodeOptions,
    recording: Recording | None = None,
) -> None:
    """Say so when a decode gave no call: damaged or zeroed trace data decodes to nothing
    without perf failing.

    Nothing at all decoded (no branch, no sample; perhaps decode errors) is an error: the
    empty trace is removed (where ptscope created it: a device or a FIFO output stays).
    Branches or samples that made no call (a ``--filter`` that never matched, say) are a
    warning: the trace is kept.
    """
    if summary.slices:
        return
    if summary.branches or summary.samples:
        if summary.branches:
            found = f"{summary.branches:,} branch{'es' * (summary.branches != 1)}"
        else:
            found = f"{summary.samples:,} stack sample{'s' * (summary.samples != 1)}"
        region = f" (nothing inside --filter {','.join(options.region)})" if options.region else ""
        log.warning("warning: %s from %s decoded to no call: the trace is empty%s",
                    found, source, region)  # fmt: skip
        return
    for path in {summary.output, *(part.path for part in summary.parts)}:
        remove_written(path)  # a device or a FIFO written in place stays
    errors = summary.decode_errors
    only = f" (only {errors:,} decode error{'s' * (errors != 1)})" if errors else ""
    selected = " of the selected processes or threads" if options.pids or options.tids else ""
    if recording is not None and sampled_recording(recording):
        raise BadInputError(
            f"nothing could be decoded from {source}: no samples{selected} in it: "
            f"{'they were' if selected else 'the process was'} idle while recorded (or "
            "ended before the first sample)",
            hint="sampling sees only code that runs on a CPU: record while it works, or "
            "with a higher --frequency; no trace was written",
        )
    raise BadInputError(
        f"nothing could be decoded from {source}: no branch or sample{selected} in it{only}",
        hint="its trace data may be empty or damaged (all zero bytes?); no trace was written",
    )


# ---------------------------------------------------------------------- helpers


def _until_failure(stream: Iterable[_T], failures: list[PtscopeError]) -> Iterator[_T]:
    """``stream`` until the decoder fails (perf crashed, was stopped, wrote garbage): its
    error goes into ``failures`` and the stream ends. Errors of whoever consumes the
    stream (the engine, the trace's writer) are not the decoder's: they pass, and so does a
    full TMPDIR (:class:`~ptscope.errors.ScratchSpaceError`)."""
    try:
        yield from stream
    except ScratchSpaceError:
        raise  # not perf's failure: TMPDIR is full, and a half trace would hide it
    except PtscopeError as e:
        failures.append(e)


@contextlib.contextmanager
def _closing(stream: object) -> Iterator[None]:
    """Close a generator when the ``with`` ends, however it ends (its ``finally`` runs now,
    not when it is collected)."""
    try:
        yield
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def _kernel_symbols(options: DecodeOptions) -> list[str]:
    return [] if options.kallsyms is None else [f"--kallsyms={options.kallsyms}"]


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


def _hit_instant(hit: TriggerHit) -> Instant:
    return Instant(
        hit.time, f"hit {hit.symbol or hex(hit.ip)}", {"tid": hit.tid, "ip": hex(hit.ip)}
    )


def _hits_track(hits: Sequence[TriggerHit]) -> ThreadTimeline:
    track = ThreadTimeline(pid=HITS_PID, tid=HITS_PID, name="hits")
    track.instants = [_hit_instant(h) for h in sorted(hits, key=lambda h: h.time)]
    return track


_DRAIN_SLICES: Final = 1 << 15
"""Slices a streaming engine collects before they are written (bounded memory: ~2.5 MB).
While a batch is written, perf fills the record ring (decode/record_ring.py) and waits once
it is full: half of 1 << 16 halves that pause, and the peak RSS falls by 12 MB, for 0.9%
more instructions in ptscope's process (60k calls trace)."""


def _take_engine_stats(summary: DecodeSummary, stats: EngineStats) -> None:
    summary.events += stats.events
    summary.branches += stats.branches
    summary.decode_errors += stats.decode_errors
    summary.unexpected += stats.unexpected


def _take_text_stats(summary: DecodeSummary, stats: TextStats) -> None:
    summary.unknown_lines += stats.unknown_lines
    room = 5 - len(summary.unknown_examples)
    summary.unknown_examples += list(stats.unknown_examples)[: max(room, 0)]
