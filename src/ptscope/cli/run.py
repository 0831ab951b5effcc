"""`ptscope run -- CMD ARGS`: record a program from its start, then decode it into a trace.

Also holds what ``attach`` shares with ``run``: the recording options, the backend choice,
the trigger set-up and the decode step (one call into :mod:`ptscope.pipeline`), with the
rule that a recording is never lost: when decoding fails or is interrupted, its directory
is kept and the command says how to decode it again.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ptscope.cli.base import (
    MAX_INT64,
    add_decoder_arguments,
    check_trace_output,
    int_between,
    settle_for_streaming,
)
from ptscope.cli.serve import add_serve_option, serve_in_perfetto
from ptscope.errors import PtscopeError, RecordingError, UsageError
from ptscope.recording import Recording

if TYPE_CHECKING:
    from ptscope.perftool import PerfTool
    from ptscope.record.capabilities import Capabilities
    from ptscope.record.intel_pt import IntelPtBackend
    from ptscope.record.perf_commands import TraceScope
    from ptscope.record.session import HitSource, PerfBackend, SessionOptions, SessionResult
    from ptscope.record.symbols import Selection

log = logging.getLogger("ptscope")

__all__ = ["RecordingPlace", "RunCommand", "add_record_arguments", "kept_message"]

BACKENDS = ("auto", "intel-pt", "emulated", "sampling")


def add_record_arguments(parser: argparse.ArgumentParser, *, run: bool) -> None:
    """Options common to ``run`` and ``attach``."""
    parser.add_argument(
        "--backend",
        choices=BACKENDS if run else ("auto", "intel-pt", "sampling"),
        default="auto",
        help="intel-pt (hardware), emulated (QEMU) or sampling (perf -g); auto: intel-pt "
        "where the CPU has it, else emulated"
        if run
        else "intel-pt (hardware) or sampling (perf -g); auto: intel-pt where the CPU has "
        "it, else sampling",
    )
    parser.add_argument(
        "-o", "--output", type=Path, default=Path("trace.fxt.gz"), help="trace file to write"
    )
    parser.add_argument(
        "--keep-recording",
        metavar="DIR",
        type=Path,
        help="keep perf.data and metadata in DIR (decode again with: ptscope decode DIR)",
    )
    add_serve_option(parser)
    add_decoder_arguments(parser)
    trig = parser.add_argument_group("snapshots and triggers")
    trig.add_argument(
        "--trigger",
        metavar="SEL",
        help="take the snapshot when this runs, on any thread: SYMBOL, 0xADDR, FILE:LINE, "
        "or ? to pick (default: snapshot at exit or Ctrl-C)",
    )
    trig.add_argument(
        "--multi-snapshot",
        action="store_true",
        help="a snapshot at every trigger hit (each in its own perf.data)",
    )
    trig.add_argument(
        "--filter",
        metavar="START,STOP",
        help="keep only what happens between a call of START and the next call of STOP",
    )
    pt = parser.add_argument_group("Intel PT")
    pt.add_argument(
        "--snapshot-size",
        metavar="SIZE",
        help="ring buffer size (e.g. 4M; rounded to a power-of-two number of pages)",
    )
    pt.add_argument(
        "--full-execution",
        action="store_true",
        help="record everything instead of the last SIZE bytes (hundreds of MB/s)",
    )
    pt.add_argument(
        "--timer-resolution",
        metavar="R",
        help="low, normal (default), high, or Intel PT terms like cyc=1,mtc_period=3 "
        "(terms: cyc, cyc_thresh, mtc, mtc_period, noretcomp, psb_period); "
        "sampling: low=1kHz, normal=10kHz, high=the machine's maximum",
    )
    scope = pt.add_mutually_exclusive_group()
    scope.add_argument("--kernel", action="store_true", help="trace the kernel too (root)")
    scope.add_argument("--kernel-only", action="store_true", help="trace only the kernel (root)")
    pt.add_argument(
        "--no-kcore", action="store_true", help="do not copy /proc/kcore with kernel traces"
    )
    parser.add_argument(
        "--multi-thread",
        action="store_true",
        help="trace every thread (default: the main thread only, with the whole buffer)",
    )
    samp = parser.add_argument_group("sampling")
    samp.add_argument(
        "--callgraph",
        choices=("auto", "fp", "dwarf", "lbr"),
        help="how perf unwinds stacks (auto, the default: lbr if the CPU has it, else dwarf)",
    )
    samp.add_argument(
        "--frequency", type=int_between(1, 10**9), metavar="HZ", help="samples per second"
    )
    parser.add_argument(
        "--print-perf-commands", action="store_true", help="print the perf command lines"
    )
    if run:
        parser.add_argument(
            "--max-instructions",
            type=int_between(1, MAX_INT64),
            metavar="N",
            help="emulated backend: stop after N instructions",
        )
        parser.add_argument(
            "--deterministic",
            action="store_true",
            help="emulated backend: run with a fixed environment (PATH, LC_ALL=C), address "
            "layout (no ASLR) and random seed, so that two runs of the same program count "
            "the same instructions (for ptscope diff)",
        )


def choose_backend(requested: str, intel_pt_present: bool, *, run: bool) -> str:
    """The backend for ``--backend``; ``auto`` says what it picked on one line."""
    if requested != "auto":
        return requested
    if intel_pt_present:
        return "intel-pt"
    fallback = "emulated" if run else "sampling"
    why = "exact, under QEMU" if run else "attach cannot emulate a running process"
    print(
        f"ptscope: no Intel PT on this machine: using the {fallback} backend ({why})",
        file=sys.stderr,
    )
    return fallback


def kept_message(directory: Path) -> str:
    return f"recording kept at {directory}; decode again with: ptscope decode {directory}"


class RecordingPlace:
    """The recording directory: the user's (kept) or a temporary one (deleted after a
    successful decode, kept whenever something went wrong)."""

    def __init__(self, keep: Path | None) -> None:
        self.keep = keep is not None
        if keep is not None:
            try:
                keep.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UsageError(f"--keep-recording {keep}: {e.strerror}") from e
            if any(keep.iterdir()) and not (keep / "ptscope-recording.json").exists():
                raise UsageError(
                    f"--keep-recording {keep}: the directory is not empty",
                    hint="give a new or empty directory (or a previous recording's)",
                )
            self.directory = keep.resolve()
        else:
            try:
                self.directory = Path(tempfile.mkdtemp(prefix="ptscope-"))
            except OSError as e:
                raise UsageError(
                    f"cannot create a recording directory in {tempfile.gettempdir()}: {e.strerror}",
                    hint="set TMPDIR to a writable directory, or use --keep-recording DIR",
                ) from e

    def has_data(self) -> bool:
        try:
            return any(
                p.name.startswith("perf.data") and (p.is_dir() or p.stat().st_size > 0)
                for p in self.directory.iterdir()
            )
        except OSError:
            return False

    def discard(self) -> None:
        if not self.keep:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _keep_and_say(self, error: BaseException) -> None:
        """Say where the recording is: in the error's hint (printed right after its one
        line), or directly for an interrupt or a bug."""
        message = kept_message(self.directory)
        if isinstance(error, PtscopeError):
            error.hint = f"{error.hint}\nptscope: {message}" if error.hint else message
        else:
            print(f"ptscope: {message}", file=sys.stderr)

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Recording stage: on failure, keep what was recorded (and say where)."""
        try:
            yield
        except BaseException as e:
            if self.has_data():
                self._keep_and_say(e)
            else:
                self.discard()
            raise

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """Decode stage: on failure or Ctrl-C the recording stays, with how to decode it."""
        try:
            yield
        except BaseException as e:
            self._keep_and_say(e)
            raise
        if self.keep:
            print(f"ptscope: {kept_message(self.directory)}", file=sys.stderr)
        else:
            self.discard()


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def status(message: str) -> Iterator[Callable[[str], None]]:
    """A rich spinner on stderr when it is a terminal; a no-op otherwise."""
    if not _stderr_is_terminal():
        yield lambda _text: None
        return
    from rich.console import Console

    console = Console(stderr=True)
    with console.status(message) as live:
        yield lambda text: live.update(text)


def region_of(args: argparse.Namespace) -> tuple[str, str] | None:
    """``--filter START,STOP`` (checked before recording, so a typo costs no recording)."""
    if not args.filter:
        return None
    from ptscope.reconstruct.region_filter import parse_filter

    return parse_filter(args.filter)


def decode_step(
    recording: Recording,
    output: Path,
    args: argparse.Namespace,
    place: RecordingPlace,
    closing: Sequence[str] = (),
) -> int:
    """Decode a recording into ``output`` (one call into the pipeline); then the
    ``closing`` lines (what the user must not miss under the summary)."""
    from ptscope.cli.decode import start_decode_early
    from ptscope.decode.perf_launch import early_launches

    with early_launches():
        start_decode_early(
            recording,
            decoder=args.decoder,
            jobs=args.jobs,
            insn_detail=args.insn_detail,
            inline=args.inline,
        )
        _decode_now(recording, output, args, place)
    for line in closing:
        print(f"ptscope: {line}", file=sys.stderr)
    return serve_in_perfetto(output) if args.serve else 0


def _decode_now(
    recording: Recording, output: Path, args: argparse.Namespace, place: RecordingPlace
) -> None:
    from ptscope.cli.base import signals_deferred
    from ptscope.cli.progress import decode_progress

    with signals_deferred():  # (perf may be running already: a signal stops both)
        from ptscope import pipeline

    options = pipeline.DecodeOptions(
        decoder=args.decoder,
        jobs=args.jobs,
        region=region_of(args),
        split_size=args.split_size,
        split_time=args.split_time,
        time_axis=args.time_axis,
        insn_detail=args.insn_detail,
        inline=args.inline,
        drill=place.directory if place.keep and args.drill else None,
    )
    from ptscope.cli.output import print_summary, summary_of_incomplete

    with place.decoding(), summary_of_incomplete(), decode_progress() as progress:
        summary = pipeline.decode_recording(recording, output, options, progress=progress)

    print_summary(summary, sys.stderr, served=args.serve)


@dataclass
class _Trigger:
    selection: Selection
    executable: str


def prepare_trigger(text: str | None, executable: str, pid: int | None = None) -> _Trigger | None:
    """Parse ``--trigger`` (asking with the picker for ``?``) and check that it names
    something, in the executable or its libraries (those mapped by process ``pid`` when
    it runs already): a typo fails here, before perf starts or a directory is made."""
    if not text:
        return None
    from ptscope.record.symbols import check_selection, parse_selection, read_maps

    selection = parse_selection(text)
    if selection.kind == "pick":
        from ptscope.record.picker import pick_function

        selection = pick_function(executable, selection)
    check_selection(
        selection, executable, read_maps(pid) if pid is not None else None, _instruction_length
    )
    return _Trigger(selection, executable)


def _instruction_length(code: bytes) -> int | None:
    """The length of the instruction ``code`` starts with (the own decoder's; None where
    this build has none: then no address is refused)."""
    try:
        from ptscope.decode import _ptdecode  # type: ignore[attr-defined]
    except ImportError:
        return None
    decoded = _ptdecode.insn(code)
    return None if decoded is None else int(decoded[0])


def hit_source_factory(
    trigger: _Trigger, *, wake_each_hit: bool
) -> Callable[[Sequence[int]], HitSource | None]:
    """Resolve the trigger in each target (its own executable and maps: PIE and library
    load addresses differ per process) and arm it on all of their threads."""

    def make(pids: Sequence[int]) -> HitSource | None:
        from ptscope.errors import BadInputError
        from ptscope.record.breakpoints import Breakpoint, BreakpointSet
        from ptscope.record.symbols import read_maps, resolve_selection

        per_process: dict[int, list[Breakpoint]] = {}
        failures: list[str] = []
        for index, pid in enumerate(pids):
            executable = trigger.executable if index == 0 else _process_executable(pid)
            try:
                per_process[pid] = resolve_selection(trigger.selection, executable, read_maps(pid))
            except BadInputError as e:
                if index == 0 or len(pids) == 1:
                    raise
                failures.append(f"process {pid}: {e.message}")
        for message in failures:
            print(f"ptscope: warning: no trigger in {message}", file=sys.stderr)
        first = per_process[pids[0]]
        for bp in first:
            log.info("trigger %s at %#x", bp.label, bp.address)
        source = BreakpointSet(first, wake_each_hit=wake_each_hit)
        try:
            source.arm(list(per_process), per_process)
        except BaseException:
            source.close()
            raise
        return source

    return make


def _process_executable(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError as e:
        from ptscope.errors import BadInputError

        raise BadInputError(f"process {pid}: cannot read its executable ({e.strerror})") from e


def build_perf_backend(
    args: argparse.Namespace, backend: str, caps: Capabilities, *, has_trigger: bool
) -> tuple[PerfBackend, list[str]]:
    """The perf-based backend object for the options, adapted to the machine."""
    if backend == "intel-pt":
        pt, warnings = intel_pt_backend(args, has_trigger=has_trigger)
        prepared, more = pt.prepare(caps)
        return prepared, warnings + more
    from ptscope.record.perf_commands import CallgraphMode, parse_timer_resolution
    from ptscope.record.sampling import SamplingBackend

    warnings = []
    if args.snapshot_size or args.full_execution:
        warnings.append("--snapshot-size/--full-execution do not apply to sampling: ignored")
    if args.multi_snapshot:
        warnings.append("--multi-snapshot does not apply to sampling: trigger hits are marked")
    callgraph = None if args.callgraph in (None, "auto") else CallgraphMode(args.callgraph)
    sampling = SamplingBackend(
        scope=_trace_scope(args),
        timer=parse_timer_resolution(args.timer_resolution or "normal"),
        callgraph=callgraph,
        frequency=args.frequency,
    )
    prepared_s, more = sampling.prepare(caps)
    return prepared_s, warnings + more


def _trace_scope(args: argparse.Namespace) -> TraceScope:
    from ptscope.record.perf_commands import TraceScope

    if args.kernel_only:
        return TraceScope.KERNEL
    return TraceScope.BOTH if args.kernel else TraceScope.USER


def intel_pt_backend(
    args: argparse.Namespace, *, has_trigger: bool
) -> tuple[IntelPtBackend, list[str]]:
    """The Intel PT backend the options ask for, before the machine is asked (its
    ``prepare``), with warnings about the options."""
    from ptscope.record.intel_pt import IntelPtBackend
    from ptscope.record.perf_commands import parse_size, parse_timer_resolution, snapshot_pages

    warnings: list[str] = []
    size = None
    if args.snapshot_size:
        size = snapshot_pages(parse_size(args.snapshot_size))
        if size.warning():
            warnings.append(str(size.warning()))
    backend = IntelPtBackend(
        scope=_trace_scope(args),
        timer=parse_timer_resolution(args.timer_resolution or "normal"),
        snapshot_size=size,
        full_execution=args.full_execution,
        multi_snapshot=args.multi_snapshot,
        kcore=not args.no_kcore,
        has_trigger=has_trigger,
    )
    return backend, warnings


def print_planned_intel_pt_command(
    args: argparse.Namespace, caps: Capabilities, *, has_trigger: bool, pids: Sequence[int]
) -> None:
    """``--print-perf-commands`` where Intel PT cannot record (no Intel PT, no perf, no
    permission): the ``perf record`` that ptscope would run, so it can be run elsewhere
    or by hand. PID stands for the program's process ID; the recording directory is the
    --keep-recording one, or a new temporary one (XXXXXXXX)."""
    from ptscope.perftool import PerfTool
    from ptscope.record.control import fifo_control
    from ptscope.record.perf_commands import Targets

    try:
        backend, _ = intel_pt_backend(args, has_trigger=has_trigger)
    except PtscopeError:
        return  # the options themselves are wrong: the error says which
    # Without perf here, the command is the one a current perf gets.
    perf = caps.perf or PerfTool("perf", (6, 0, 0), "6.0")
    if args.keep_recording is not None:
        directory = args.keep_recording.absolute()
    else:
        directory = Path(tempfile.gettempdir()) / "ptscope-XXXXXXXX"
    targets = Targets(tuple(pids), all_threads=args.multi_thread, placeholder="" if pids else "PID")
    control = fifo_control(directory) if perf.has_control_fifo else None
    try:
        argv = backend.record_argv(perf, directory / "perf.data", targets, control)
    except PtscopeError:
        return
    what = "" if pids else " (PID: the program's process ID)"
    print(f"ptscope: the perf command ptscope would run{what}:", file=sys.stderr)
    print(shlex.join(argv), file=sys.stderr)


def probe_capabilities() -> Capabilities:
    from ptscope import _native
    from ptscope.record.capabilities import probe

    return probe(dlfilter_path=_native.dlfilter_path())


def require_perf(caps: Capabilities) -> PerfTool:
    if caps.perf is None:  # the backends' prepare() refuses first; this is for the types
        raise RecordingError(caps.perf_problem or "perf not found")
    return caps.perf


def prepare_session(
    args: argparse.Namespace,
    backend: str,
    caps: Capabilities,
    trigger: _Trigger | None,
    pids: Sequence[int] = (),
) -> tuple[PerfBackend, RecordingPlace, SessionOptions]:
    """What ``run`` and ``attach`` share: the perf backend (its warnings printed), where the
    recording goes, and the session's options, with a hit source when there is a trigger.
    ``pids``: the processes ``attach`` records (for ``--print-perf-commands``)."""
    from ptscope.record.session import SessionOptions

    if args.multi_snapshot and trigger is None:
        raise UsageError("--multi-snapshot needs --trigger")
    try:
        perf_backend, warnings = build_perf_backend(
            args, backend, caps, has_trigger=trigger is not None
        )
    except PtscopeError:
        if args.print_perf_commands and backend == "intel-pt":
            # Printing the commands is what the option is for, recording or not.
            print_planned_intel_pt_command(args, caps, has_trigger=trigger is not None, pids=pids)
        raise
    for warning in warnings:
        print(f"ptscope: warning: {warning}", file=sys.stderr)
    place = RecordingPlace(args.keep_recording)

    def show(text: str) -> None:
        print(f"ptscope: {text}", file=sys.stderr)

    options = SessionOptions(
        directory=place.directory,
        multi_thread=args.multi_thread,
        multi_snapshot=args.multi_snapshot,
        print_commands=(lambda cmd: print(cmd, file=sys.stderr))
        if args.print_perf_commands
        else None,
        on_ready=show,
    )
    if trigger is not None:
        options.make_hit_source = hit_source_factory(
            trigger, wake_each_hit=perf_backend.takes_snapshots
        )
    return perf_backend, place, options


def report_session(result: SessionResult, trigger: _Trigger | None = None) -> list[str]:
    """Say what happened while recording; returns the lines to say once the trace is
    written (a trigger that never hit)."""
    for warning in result.warnings:
        print(f"ptscope: warning: {warning}", file=sys.stderr)
    if result.hits:
        print(f"ptscope: trigger hit {len(result.hits)} time(s)", file=sys.stderr)
    if result.reason == "interrupted":
        print("ptscope: stopped; decoding what was recorded", file=sys.stderr)
    elif result.reason == "perf-exited":
        print("ptscope: warning: perf stopped before the program ended", file=sys.stderr)
    if trigger is not None and not result.hits:
        return [f"warning: trigger never hit: {trigger.selection.text} did not run while recorded"]
    return []


def _report_exit(code: int | None) -> int:
    """Say how the program ended, unless it exited with 0, and return the status ptscope
    then leaves with (as ``time`` does): the program's own, 128+N for signal N (``code`` is
    Popen's: negative for a signal). No status (it was stopped by ptscope): 0."""
    if code is None or code == 0:
        return 0
    if code < 0:
        import signal

        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        print(f"ptscope: the program was killed by {name}", file=sys.stderr)
        return 128 + -code
    print(f"ptscope: the program exited with status {code}", file=sys.stderr)
    return code


def refuse_misplaced_options(command: Sequence[str], own_options: frozenset[str]) -> None:
    """Without ``--``, everything after the program is the program's: one of our options
    there (``ptscope run ./prog 3 -o x.fxt.gz``) is almost certainly meant for us, and
    would silently go to the program. Say so before anything runs."""
    for arg in command[1:]:
        option = arg.partition("=")[0] if arg.startswith("--") else arg
        if option in own_options:
            raise UsageError(
                f"{option} comes after the program, so it would be passed to {command[0]}",
                hint="put ptscope's options before the program; to pass them to the program, "
                "write -- before it: ptscope run [options] -- PROGRAM [ARGS]",
            )


def refuse_emulated_options(args: argparse.Namespace) -> None:
    """The emulated backend runs the whole program in user space under QEMU: options that
    choose what a hardware or sampling recording keeps mean nothing there. Refused in one
    line that says why, rather than accepted and ignored."""
    whole_run = "it always records the whole run, with no ring buffer"
    reasons = (
        ("--trigger", args.trigger, "it records the whole run: there is no snapshot to take"),
        ("--multi-snapshot", args.multi_snapshot, "it records the whole run in one file"),
        ("--snapshot-size", args.snapshot_size, whole_run),
        ("--full-execution", args.full_execution, whole_run),
        ("--multi-thread", args.multi_thread, "it always traces every thread"),
        (
            "--timer-resolution",
            args.timer_resolution,
            "its times come from its cycle model (docs/emulated-pt.md), not timing packets",
        ),
        ("--kernel", args.kernel, "QEMU runs the program's user space only"),
        ("--kernel-only", args.kernel_only, "QEMU runs the program's user space only"),
        ("--no-kcore", args.no_kcore, "there is no kernel in its trace"),
        ("--callgraph", args.callgraph, "it is an option of the sampling backend"),
        ("--frequency", args.frequency, "it is an option of the sampling backend"),
    )
    refused = [f"{flag}: {why}" for flag, value, why in reasons if value]
    if refused:
        raise UsageError(
            "not available with the emulated backend: " + "; ".join(refused),
            hint="the emulated backend records every instruction of every thread; "
            "--filter START,STOP keeps a region of the trace",
        )


class RunCommand:
    name = "run"
    help = "run a program and trace it (Ctrl-C or its exit takes the snapshot)"

    def __init__(self) -> None:
        self._own_options: frozenset[str] = frozenset()

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_record_arguments(parser, run=True)
        parser.add_argument("command", nargs=argparse.REMAINDER, help="-- PROGRAM [ARGS...]")
        self._own_options = frozenset(
            option for action in parser._actions for option in action.option_strings
        )

    def run(self, args: argparse.Namespace) -> int:
        command = list(args.command)
        if command and command[0] == "--":
            command = command[1:]
        elif command:
            refuse_misplaced_options(command, self._own_options)
        if not command:
            raise UsageError("no program given", hint="ptscope run [options] -- PROGRAM [ARGS]")
        output = check_trace_output(args.output)
        region_of(args)
        settle_for_streaming()
        caps = probe_capabilities()
        backend = choose_backend(args.backend, caps.intel_pt.present, run=True)
        if args.max_instructions is not None and backend != "emulated":
            raise UsageError("--max-instructions only applies to --backend emulated")
        if args.deterministic and backend != "emulated":
            raise UsageError("--deterministic only applies to --backend emulated")
        if backend == "emulated":
            return self._run_emulated(args, command, output)
        executable = shutil.which(command[0]) or command[0]
        trigger = prepare_trigger(args.trigger, executable) if args.trigger else None
        perf_backend, place, options = prepare_session(args, backend, caps, trigger)
        if trigger is not None:
            from ptscope.record.symbols import needs_libraries

            options.wait_for_libraries = needs_libraries(trigger.selection, executable)
        from ptscope.record.session import run_program

        with place.recording():
            result = run_program(
                command, require_perf(caps), perf_backend, options, use_ptrace=caps.can_ptrace
            )
        closing = report_session(result, trigger)
        exit_status = _report_exit(result.exit_code)
        if result.reason == "interrupted":
            exit_status = 0  # ptscope stopped it (Ctrl-C, SIGTERM): not the program's failure
        return decode_step(result.recording, output, args, place, closing) or exit_status

    def _run_emulated(self, args: argparse.Namespace, command: list[str], output: Path) -> int:
        refuse_emulated_options(args)
        try:
            from ptscope.record import emulated
        except ImportError as e:
            raise RecordingError("the emulated backend is not available in this build") from e
        place = RecordingPlace(args.keep_recording)
        with place.recording(), status("emulating…") as update:

            def progress(n: int) -> None:
                update(f"emulating… {n:,} instructions")

            result = emulated.record(
                command,
                place.directory,
                max_instructions=args.max_instructions,
                progress=progress,
                options=emulated.EmulationOptions(deterministic=args.deterministic),
                print_command=(lambda cmd: print(cmd, file=sys.stderr))
                if args.print_perf_commands
                else None,
            )
        exit_status = 0
        if result.interrupted:
            print("ptscope: stopped; decoding what was recorded", file=sys.stderr)
        elif result.stopped_at_limit:
            print(f"ptscope: stopped after {result.instructions:,} instructions", file=sys.stderr)
        elif result.disk_full:
            print(
                f"ptscope: the disk is full: the program was stopped; the recording keeps its "
                f"first {result.instructions:,} instructions",
                file=sys.stderr,
            )
        elif result.crashed:
            print(f"ptscope: the program crashed (signal {result.signal})", file=sys.stderr)
            exit_status = 128 + (result.signal or 0)
        elif result.signal is not None:
            # Killed from outside (it, or QEMU under it): what ran until then is decoded.
            exit_status = _report_exit(-result.signal)
        else:
            exit_status = _report_exit(result.exit_code)
        return decode_step(result.recording, output, args, place) or exit_status
