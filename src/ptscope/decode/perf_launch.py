"""Starting ``perf script`` with the dlfilter, apart from reading what it writes.

This module is light on purpose (no numpy, nothing of the reader): a decode starts perf
*before* it imports its decoder, engine and writer, so that perf decodes while Python
imports them. Those imports took 0.10 s before perf could start (numpy alone half of it),
on a decode whose perf runs about a second for the 2.5 M calls of the 60k-round bench
trace; perf's own start-up, until the dlfilter's first record, takes about 10 ms.

A :class:`LaunchSpec` says everything that decides perf's command line but its file
descriptors; :class:`PerfLaunch` is a perf started from one (its ring, watchdog pipe and
stderr file with it). :func:`start_early` starts one ahead of time and
:func:`take_launch` hands it to the reader that asks for an *equal* spec, or starts a new
one: an early perf that no reader takes (the options turned out different, the decode
failed first) is stopped by :func:`discard_early`, so starting one early can cost time,
never a different trace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

from ptscope import _native
from ptscope.children import die_with_parent
from ptscope.decode.record_ring import SharedRing, ring_supported
from ptscope.errors import BadInputError, PtscopeError, ToolMissingError
from ptscope.perftool import PerfTool, PerfWatch, beat_pipe, find_perf, perf_env, stall_limit

__all__ = [
    "DEFAULT_ITRACE",
    "MAX_DEFAULT_JOBS",
    "WINDOWS_FROM_BYTES",
    "WINDOW_MIN_BYTES",
    "DecoderChoice",
    "LaunchSpec",
    "PerfLaunch",
    "check_dlfilter_prerequisites",
    "choose_decoder",
    "choose_perf_decoder",
    "decode_extra",
    "default_jobs",
    "discard_early",
    "dlfilter_command",
    "early_launches",
    "launch_spec",
    "selection_arguments",
    "start_early",
    "take_launch",
    "trace_size",
]

log = logging.getLogger("ptscope")

DEFAULT_ITRACE: Final = "bep"
"""Branches, errors, power events: the same as the text decoder, so both see the same."""


# ---------------------------------------------------------------------- perf's argv


def dlfilter_command(
    perf_data: Path,
    *,
    perf: str = "perf",
    dlfilter: Path | None = None,
    itrace: str = DEFAULT_ITRACE,
    keep_all: bool = False,
    to_end: bool = True,
    insns: bool = False,
    extra: Sequence[str] = (),
    beat: int | None = None,
    ring: str | None = None,
    until: int | None = None,
) -> list[str]:
    """The ``perf script`` argv that decodes ``perf_data`` through the dlfilter to stdout.

    ``--ns -F pid,tid,time`` makes whatever text perf prints besides decode errors (task
    events with ``--show-task-events`` in ``extra``) look as it does for the text decoder.
    ``to_end``: the decode reaches the end of the trace (not a time window before it), so
    each thread's trailing dropped jump is written (as the text decoder does at its end).
    ``insns``: instruction detail (exact instruction counts and code lines, ``--dlarg
    insns``). ``beat``: the file descriptor of the watchdog's pipe (``--dlarg beat=FD``,
    see :class:`~ptscope.perftool.PerfWatch`). ``ring``: ring mode's ``--dlarg``
    (:meth:`~ptscope.decode.record_ring.SharedRing.argument`). ``until``: the decode is a
    time window that ends there (perf time, ns): the filter writes each thread's first
    kept branch after it and ignores the thread's later samples (``--dlarg until=NS``).
    """
    so = dlfilter if dlfilter is not None else _native.dlfilter_path()
    argv = [perf, "script", "-i", str(perf_data), f"--itrace={itrace}", "--ns"]
    argv += ["-F", "pid,tid,time", "--dlfilter", str(so), "--dlarg", "-"]
    if keep_all:
        argv += ["--dlarg", "keep-all"]
    if to_end:
        argv += ["--dlarg", "to-end"]
    if insns:
        argv += ["--dlarg", "insns"]
    if beat is not None:
        argv += ["--dlarg", f"beat={beat}"]
    if ring is not None:
        argv += ["--dlarg", ring]
    if until is not None:
        argv += ["--dlarg", f"until={until}"]
    argv += list(extra)
    return argv


def selection_arguments(pids: Sequence[int], tids: Sequence[int]) -> list[str]:
    """perf options that keep only these processes / threads in a dlfilter decode.

    perf applies its own ``--pid``/``--tid`` after the filter's ``filter_event_early`` has
    seen (and written) a sample, so the lists go to the filter too; perf's options still
    filter the text perf prints itself (task events), as for the text decoder."""
    argv: list[str] = []
    for name, ids in (("pid", pids), ("tid", tids)):
        if ids:
            listed = ",".join(map(str, ids))
            argv += [f"--{name}={listed}", "--dlarg", f"{name}={listed}"]
    return argv


def check_dlfilter_prerequisites(tool: PerfTool, perf_data: Path) -> None:
    """Check what running the dlfilter needs; raise a one-line error if something is off."""
    if not tool.has_dlfilter:
        raise ToolMissingError(
            f"perf {'.'.join(map(str, tool.version))} has no --dlfilter (needs perf >= 5.14)",
            hint="use --decoder text, or install a newer perf",
        )
    if not _native.is_available():
        raise ToolMissingError(
            f"the ptscope dlfilter is not built ({_native.dlfilter_path()} is missing)",
            hint="reinstall ptscope with perf's headers present (apt-get install linux-perf),"
            " or use --decoder text",
        )
    if not perf_data.exists():
        raise BadInputError(f"{perf_data}: no such file")


# ----------------------------------------------------------------- decoder choice


@dataclass(frozen=True)
class DecoderChoice:
    """Which decoder to use and, in one line, why."""

    name: str  # "dlfilter" or "text"
    reason: str


def choose_decoder(requested: str = "auto", perf: PerfTool | None = None) -> DecoderChoice:
    """Resolve ``--decoder auto|native|dlfilter|text``.

    ``auto`` picks ptscope's own decoder when it was built (the pipeline still hands a
    recording it does not take to perf, saying why), else the dlfilter when perf has
    ``--dlfilter`` (>= 5.14) and the library was built, else the text decoder; ``native``
    and ``dlfilter`` raise if what they need is missing. :func:`choose_perf_decoder` is
    the choice among perf's decoders alone.
    """
    from ptscope.decode.native_support import is_built

    if requested == "native" or (requested == "auto" and is_built()):
        if not is_built():
            raise ToolMissingError(
                "cannot decode with the own decoder: it is not built",
                hint="reinstall ptscope with a C compiler available, or use --decoder dlfilter",
            )
        return DecoderChoice("native", "ptscope's own Intel PT decoder")
    return choose_perf_decoder(requested, perf)


def choose_perf_decoder(requested: str = "auto", perf: PerfTool | None = None) -> DecoderChoice:
    """Resolve ``--decoder auto|dlfilter|text`` among perf's decoders: ``auto`` picks the
    dlfilter when perf has ``--dlfilter`` (>= 5.14) and the library was built, else the
    text decoder; ``dlfilter`` raises if either is missing."""
    if requested == "text":
        return DecoderChoice("text", "text decoder requested")
    if requested not in ("auto", "dlfilter", "native"):
        raise ValueError(f"unknown decoder {requested!r}")
    tool = perf if perf is not None else find_perf()
    version = ".".join(map(str, tool.version))
    problem = None
    if not tool.has_dlfilter:
        problem = f"perf {version} has no --dlfilter (needs >= 5.14)"
    elif not _native.is_available():
        problem = f"the dlfilter library is not built ({_native.dlfilter_path().name} missing)"
    if problem is None:
        return DecoderChoice("dlfilter", f"perf {version} supports --dlfilter")
    if requested == "dlfilter":
        raise ToolMissingError(f"cannot decode with the dlfilter: {problem}")
    return DecoderChoice("text", f"using the text decoder: {problem}")


MAX_DEFAULT_JOBS: Final = 6
"""The most windows the default asks for (more only with an explicit ``--jobs``)."""

WINDOW_MIN_BYTES: Final = 8 << 20
"""The least perf.data per window the default asks for."""

WINDOWS_FROM_BYTES: Final = 32 << 20
"""The shortest perf.data the default cuts into windows: below it, one job.

Why these three (``bench/decode.py --scaling``, on a lent 16-core Xeon, the call-heavy
traces, medians of 6-7 interleaved rounds of each row's speed-up over one job, its range
in brackets): every window's records still go through one engine and one writer, which
do about half of a one-job decode's work, so windows speed up perf's part only, and each
costs a perf of its own and a file its records go through.

- 300k (54.5 MB): 3 windows (18 MB each, the old default) 1.13x [0.79-1.50], and the
  same decode as the default 0.95x [0.84-1.75]: a wash, sometimes slower than one job;
  4 windows 1.15x [0.94-2.21]; **6 windows (9 MB each) 1.28x [1.15-2.03]**, never
  slower, for 1.16x one job's CPU; 8-16 windows 1.10-1.19x for 1.4-1.7x its CPU.
- 700k (121.6 MB, 2-4 rounds): 2 windows 1.30x, 4 windows 1.49x [1.18-1.49], 8 windows
  1.39x [1.27-1.50] for 1.35x the CPU, 16 windows 1.46x for 1.46x the CPU.
- Under 32 MiB nothing was measured on many cores; on two, windows never paid, and the
  60k trace (12.5 MB, a second of perf) lost with them: its fixed costs weigh most there.
"""


def free_cores(cpus: int | None = None, load: float | None = None) -> int:
    """The CPUs this process may run on (``cpus``) less the machine's load (``load``; by
    default the 1-minute average, rounded down, or the tasks running now besides this one
    where fewer): the cores a decode may keep busy.

    The average alone still counts, for a minute, what just ended: after ``ptscope run``'s
    QEMU it said no core was idle on two cores, so the decode wrote its trace on its own
    thread (1 G instructions: 55.8 s; 42 s with the writer thread beside it)."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
        now = _running_besides_us()
        if now is not None:
            load = min(load, float(now))
    return cpus - int(load)


def _running_besides_us() -> int | None:
    """Tasks running or runnable now (``procs_running`` of /proc/stat), this one aside;
    None where that is not known."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"procs_running "):
                    return max(0, int(line.split()[1]) - 1)
    except (OSError, ValueError):
        return None
    return None


def core_idle_beside(busy_threads: int, cpus: int | None = None, load: float | None = None) -> bool:
    """Whether one more thread would find a core idle (:func:`free_cores`) beside the
    ``busy_threads`` that a decode keeps running (its perfs and the engine's thread): where
    the trace's writer thread (``fxt/background.py``) pays."""
    return free_cores(cpus, load) > busy_threads


def default_jobs(
    cpus: int | None = None, load: float | None = None, trace_bytes: int | None = None
) -> int:
    """Default ``--jobs``: one window per free core beyond the one that the engine and
    writer (one process, after every window) keep busy, at most :data:`MAX_DEFAULT_JOBS`;
    one job below three free cores or for a trace under :data:`WINDOWS_FROM_BYTES`, and
    no more windows than the trace has :data:`WINDOW_MIN_BYTES` (``trace_bytes``: the
    perf.data's size; None: not limited).
    Free: the CPUs this process may run on (``cpus``) less the machine's load (``load``,
    the 1-minute average, rounded down).

    Why: a window parallelises perf's decoding only; every window's records still go
    through one engine, and one job already keeps two cores busy (perf, and the engine
    beside it). On two cores ``--jobs 2`` was no faster than one job (bench/decode.py
    --peers, issue 19: 1.6-1.8x the floor's wall against 1.2-1.3x, and a quarter to a
    third more CPU), so a second window needs a third core, and a trace long enough to
    repay its costs (measured on 16 cores: :data:`WINDOWS_FROM_BYTES`).
    """
    free = free_cores(cpus, load)
    jobs = 1 if free < 3 else min(free - 1, MAX_DEFAULT_JOBS)
    if trace_bytes is not None:
        windows = trace_bytes // WINDOW_MIN_BYTES if trace_bytes >= WINDOWS_FROM_BYTES else 1
        jobs = max(1, min(jobs, windows))
    return jobs


def decode_jobs(jobs: int | None, perf_data: Path) -> int:
    """The windows a dlfilter decode of ``perf_data`` runs: ``jobs`` when given (``--jobs``),
    else :func:`default_jobs` for its size."""
    return jobs if jobs is not None else default_jobs(trace_bytes=trace_size(perf_data))


def trace_size(perf_data: Path) -> int | None:
    """The size of a perf.data, for :func:`default_jobs` (None if it cannot be read)."""
    try:
        return perf_data.stat().st_size
    except OSError:
        return None


# ------------------------------------------------------------------- starting perf


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that decides a dlfilter decode's perf command line, but its file
    descriptors (see :func:`dlfilter_command` for the fields). ``stdout_path``: perf
    writes into that file instead of a pipe (and then never in ring mode)."""

    perf_data: Path
    perf: str
    itrace: str = DEFAULT_ITRACE
    keep_all: bool = False
    insns: bool = False
    extra: tuple[str, ...] = ()
    stdout_path: Path | None = None
    until: int | None = None

    @property
    def to_end(self) -> bool:
        """The decode reaches the trace's end: it is not a time window ending before it."""
        return self.until is None


def launch_spec(
    perf_data: Path,
    perf: str,
    *,
    itrace: str = DEFAULT_ITRACE,
    keep_all: bool = False,
    time_window: tuple[int | None, int | None] | None = None,
    insns: bool = False,
    task_events: bool = False,
    extra: Sequence[str] = (),
    stdout_path: Path | None = None,
) -> LaunchSpec:
    """The spec of a decode of ``perf_data`` (``time_window``: the decode stops before
    the trace's end if it has one; ``task_events``: perf prints thread names, as the text
    decoder's option does; see :class:`~ptscope.decode.dlfilter_stream.DlfilterProcess`)."""
    return LaunchSpec(
        perf_data,
        perf,
        itrace=itrace,
        keep_all=keep_all,
        insns=insns,
        extra=(*(["--show-task-events"] if task_events else []), *extra),
        stdout_path=stdout_path,
        until=time_window[1] if time_window is not None else None,
    )


def decode_extra(pids: Sequence[int], tids: Sequence[int], symfs: Path | None) -> list[str]:
    """What a decode adds to perf's argv: its process and thread selection, and where perf
    finds the binaries."""
    extra = selection_arguments(pids, tids)
    if symfs is not None:
        extra.append(f"--symfs={symfs}")
    return extra


class PerfLaunch:
    """A ``perf script --dlfilter`` process started from a :class:`LaunchSpec`: perf's
    stdout (a pipe, or the spec's file), its stderr (a temporary file: a pipe nobody reads
    could fill up and stall perf), ring mode's shared chunks when perf writes into a pipe
    and memory files work, and the watchdog over it. perf dies with ptscope.
    :meth:`kill` stops perf, :meth:`close` lets go of everything it was given."""

    def __init__(self, spec: LaunchSpec) -> None:
        limit = stall_limit()
        self.spec = spec
        beat_read, beat_write = beat_pipe()
        self.ring = _shared_ring() if spec.stdout_path is None and ring_supported() else None
        self.argv = dlfilter_command(
            spec.perf_data,
            perf=spec.perf,
            itrace=spec.itrace,
            keep_all=spec.keep_all,
            to_end=spec.to_end,
            insns=spec.insns,
            extra=spec.extra,
            beat=beat_write,
            ring=self.ring.argument() if self.ring is not None else None,
            until=spec.until,
        )
        self.err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the reader)
        fds = (beat_write, *(self.ring.perf_fds if self.ring is not None else ()))
        try:
            if spec.stdout_path is not None:
                with open(spec.stdout_path, "wb") as out:
                    self.proc = _popen(self.argv, out, self.err, fds)
            else:
                self.proc = _popen(self.argv, subprocess.PIPE, self.err, fds)
        except BaseException:
            self.err.close()
            os.close(beat_read)
            if self.ring is not None:
                self.ring.close()
            raise
        finally:
            os.close(beat_write)
            if self.ring is not None:
                self.ring.started()
        self.watch = PerfWatch(self.proc, limit, beat_read)
        self.stderr = ""
        """What perf wrote into stderr (read by :meth:`close`)."""

    def kill(self) -> int:
        """Kill perf (if still running); its exit status."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait()

    def close(self) -> None:
        """Close what perf was given (once it has exited, or to let it go), keeping what it
        wrote into stderr (:attr:`stderr`). Closing again does nothing."""
        self.watch.close()
        if self.ring is not None:
            self.ring.close()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        if not self.err.closed:
            self.err.seek(0)
            self.stderr = self.err.read().decode("utf-8", "replace")
            self.err.close()


def _shared_ring() -> SharedRing | None:
    """The shared chunks of ring mode, or None (the pipe) when they cannot be made: a
    memory file counts against the file size limit (``ulimit -f``), and may be refused."""
    try:
        return SharedRing()
    except OSError as e:
        log.debug("ring mode: %s; the records go through the pipe", e)
        return None


def _popen(
    argv: list[str], stdout: Any, stderr: Any, fds: tuple[int, ...]
) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            stdout=stdout,
            stderr=stderr,
            env=perf_env(),
            pass_fds=fds,
            preexec_fn=die_with_parent,  # no perf left running if ptscope is killed
        )
    except OSError as e:
        raise ToolMissingError(f"cannot run {argv[0]}: {e.strerror or e}") from e


# ----------------------------------------------------------- starting perf early

_early: PerfLaunch | None = None
_counts = {"started early": 0, "taken": 0, "discarded": 0}


def start_early(spec: LaunchSpec) -> None:
    """Start perf for ``spec`` now, for the reader that will ask for it (best effort: a
    perf that cannot start here is started, and its error raised, when the reader asks).
    Replaces an early perf nobody took."""
    global _early
    discard_early()
    try:
        check_dlfilter_prerequisites(find_perf(), spec.perf_data)
        _early = PerfLaunch(spec)
    except (PtscopeError, OSError) as e:
        log.debug("perf not started early: %s", e)
        return
    _counts["started early"] += 1
    log.debug("perf started early: %s", " ".join(_early.argv))


def take_launch(spec: LaunchSpec) -> PerfLaunch:
    """The perf started early for an equal ``spec``, or a new one."""
    global _early
    if _early is not None and _early.spec == spec:
        launch, _early = _early, None
        _counts["taken"] += 1
        return launch
    return PerfLaunch(spec)


def discard_early() -> None:
    """Stop the perf started early if no reader took it."""
    global _early
    if _early is not None:
        launch, _early = _early, None
        launch.kill()
        launch.close()
        _counts["discarded"] += 1
        log.debug("perf started early was not used: stopped")


@contextlib.contextmanager
def early_launches() -> Iterator[None]:
    """A decode that may start perf early: whatever it did not take is stopped at the end."""
    try:
        yield
    finally:
        discard_early()


def launch_counts() -> dict[str, int]:
    """How many perfs were started early, taken by a reader, discarded (for the tests)."""
    return dict(_counts)
