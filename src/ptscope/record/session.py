"""Running perf and the workload together: the run/attach lifecycle of one recording.

``run``: the program is started but held before its first instruction (stopped at exec
under ``ptrace``; a shell gate where ptrace is forbidden), perf attaches to it, and only
once perf has answered ``ping`` is the program let go, so nothing is missed and nothing
waits on a guessed sleep. ``attach``: perf attaches to running processes and
"attached" is reported once perf has answered.

perf runs in its own process group, so the terminal's Ctrl-C reaches ptscope (and, for
``run``, the program) but not perf: ptscope then asks perf for the snapshot and stops it
cleanly. Whatever ends the session (the program exiting or crashing, Ctrl-C, perf dying, a
trigger), the recording directory is left complete on disk with its metadata.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final, Protocol

from ptscope.errors import BadInputError, RecordingError, UsageError
from ptscope.perftool import PerfTool, perf_env
from ptscope.record.control import (
    DEFAULT_ACK_TIMEOUT,
    DEFAULT_READY_TIMEOUT,
    FifoControl,
    PerfControl,
    PerfExitedError,
    make_control,
)
from ptscope.record.launch import (
    StoppedProgram,
    process_command_line,
    stop_with_parent,
    thread_names,
)
from ptscope.record.perf_commands import Control, Targets
from ptscope.record.stop_signals import STOP_SIGNALS, terminal_sent_sigint
from ptscope.recording import Recording, TriggerHit, keep_perf_maps

__all__ = [
    "PERF_LOG_NAME",
    "Hit",
    "HitSource",
    "PerfBackend",
    "PerfRecorder",
    "SessionOptions",
    "SessionResult",
    "attach_processes",
    "perf_data_files",
    "run_program",
]

log = logging.getLogger(__name__)

PERF_LOG_NAME: Final = "perf-record.log"
PERF_EXIT_TIMEOUT: Final = 120.0  # perf writes the snapshot, kcore and build-ids at exit


class PerfBackend(Protocol):
    """What the session needs from a perf-based backend (Intel PT or sampling)."""

    @property
    def name(self) -> str: ...

    @property
    def takes_snapshots(self) -> bool: ...

    def record_argv(
        self, perf: PerfTool, output: Path, targets: Targets, control: Control | None
    ) -> list[str]: ...

    def describe(self) -> dict[str, object]: ...

    def needs_snapshot_before_stop(self, perf: PerfTool) -> bool: ...


@dataclass(frozen=True)
class Hit:
    """A trigger fired (perf time, ns)."""

    time: int
    pid: int
    tid: int
    ip: int
    label: str


class HitSource(Protocol):
    """Triggers armed on the targets (hardware breakpoints)."""

    def fds(self) -> list[int]: ...

    def read_hits(self) -> list[Hit]: ...

    def disable(self) -> None: ...

    def close(self) -> None: ...


def _running(pid: int) -> bool:
    """The process exists and has not exited (a zombie keeps its /proc entry)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[-1].split()
    return bool(fields) and fields[0] not in ("Z", "X")


def _check_pids(pids: Sequence[int]) -> None:
    if not pids:
        raise UsageError("no process to attach to")
    if len(set(pids)) != len(pids):
        raise UsageError("a PID is given twice")
    for pid in pids:
        if pid <= 0 or not Path(f"/proc/{pid}").is_dir():
            raise BadInputError(f"no process with PID {pid}")


# --------------------------------------------------------------------------- perf


def perf_data_files(directory: Path) -> list[str]:
    """perf.data, or the perf.data.<timestamp> files of --switch-output, oldest first."""
    names = [
        p.name
        for p in directory.iterdir()
        if (p.name == "perf.data" or p.name.startswith("perf.data."))
        and not p.name.endswith(".old")
    ]
    return sorted(names)


_SWITCH_DUMP: Final = "[ perf record: dump data:"
"""What perf's log says for each file it writes at a --switch-output snapshot (the last
file, at its exit, is announced otherwise)."""


class PerfRecorder:
    """One ``perf record`` process: started, made ready, snapshotted and stopped."""

    def __init__(
        self,
        perf: PerfTool,
        backend: PerfBackend,
        directory: Path,
        *,
        print_commands: Callable[[str], None] | None = None,
    ) -> None:
        self.perf = perf
        self.backend = backend
        self.directory = directory
        self.print_commands = print_commands
        self.control: PerfControl = make_control(perf, directory)
        self.process: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []
        self.log_path = directory / PERF_LOG_NAME
        self.snapshots = 0

    def start(self, targets: Targets, *, ready_timeout: float = DEFAULT_READY_TIMEOUT) -> None:
        for old in perf_data_files(self.directory):
            path = self.directory / old
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        control = self.control.control if isinstance(self.control, FifoControl) else None
        self.argv = self.backend.record_argv(
            self.perf, self.directory / "perf.data", targets, control
        )
        if self.print_commands is not None:
            self.print_commands(shlex.join(self.argv))
        with open(self.log_path, "wb") as log_file:
            try:
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=log_file,
                    env=perf_env(),
                    process_group=0,  # the terminal's Ctrl-C must not reach perf
                    preexec_fn=stop_with_parent,
                )
            except OSError as e:
                raise RecordingError(f"cannot start perf: {e}") from e
        self.control.bind(self.process)
        try:
            self.control.wait_ready(ready_timeout)
        except PerfExitedError as e:
            raise self.failure("perf could not start recording") from e
        except RecordingError:
            self.control.terminate()
            raise

    def failure(self, message: str) -> RecordingError:
        """An error carrying perf's own explanation (its log) as details and a hint."""
        text = self.log_text()
        reason = _perf_error_line(text)
        hint = _perf_hint(text)
        if reason:
            message = f"{message}: {reason}"
        return RecordingError(message, details=text or None, hint=hint)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def snapshot(self, *, switch_output: bool = False) -> None:
        self.control.snapshot(switch_output=switch_output, timeout=DEFAULT_ACK_TIMEOUT)
        self.snapshots += 1

    def count_written_snapshots(self) -> None:
        """Once perf has exited: with --switch-output, :attr:`snapshots` is the number of
        files perf wrote at a snapshot (its log says ``dump data`` for each), not of the
        snapshots it acknowledged: one it took just before it exited (its targets had
        ended) may never have been acknowledged."""
        dumps = self.log_text().count(_SWITCH_DUMP)
        if dumps:
            self.snapshots = dumps

    def stop(self, *, timeout: float = PERF_EXIT_TIMEOUT) -> int:
        """Stop perf and wait for it to write everything; returns its exit status."""
        assert self.process is not None
        try:
            if self.alive:
                self.control.stop(DEFAULT_ACK_TIMEOUT)
        except RecordingError as e:
            log.warning("%s; stopping perf with a signal", e.message)
            self.control.terminate()
        status = self.control.wait_exit(timeout)
        if status is None:
            log.warning("perf did not finish within %g s; stopping it", timeout)
            status = self.control.terminate()
        self.control.close()
        return status

    def kill(self) -> None:
        if self.process is not None and self.alive:
            self.control.terminate(grace=2.0)
        self.control.close()


def _perf_error_line(text: str) -> str:
    """perf's most telling error line (it prints banners and hints around it)."""
    for line in text.splitlines():
        stripped = line.strip()
        lowered = stripped.lower()
        if any(
            key in lowered
            for key in (
                "error",
                "permission",
                "not permitted",
                "no such process",
                "invalid",
                "not supported",
                "failed",
                "cannot",
            )
        ):
            return stripped.rstrip(".:")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _perf_hint(text: str) -> str | None:
    lowered = text.lower()
    if "perf_event_paranoid" in lowered or "permission" in lowered or "not permitted" in lowered:
        return (
            "run as root (sudo), or attach to your own processes with "
            "kernel.perf_event_paranoid <= 2 (see: ptscope doctor)"
        )
    if "no such process" in lowered:
        return "the process is gone"
    if "mlock" in lowered or "cannot allocate memory" in lowered:
        return "use a smaller --snapshot-size, or raise kernel.perf_event_mlock_kb"
    return None


# --------------------------------------------------------------------------- session


@dataclass
class SessionOptions:
    """What ``run`` and ``attach`` share."""

    directory: Path
    multi_thread: bool = False
    multi_snapshot: bool = False
    print_commands: Callable[[str], None] | None = None
    ready_timeout: float = DEFAULT_READY_TIMEOUT
    on_ready: Callable[[str], None] | None = None
    make_hit_source: Callable[[Sequence[int]], HitSource | None] | None = None
    wait_for_libraries: bool = False
    notes: dict[str, object] = field(default_factory=dict)


@dataclass
class SessionResult:
    """How a recording session ended."""

    recording: Recording
    reason: str
    interrupted: bool = False
    exit_code: int | None = None
    perf_status: int = 0
    snapshots: int = 0
    hits: list[Hit] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    startup_seconds: float = 0.0


class _SignalWatch:
    """Turns SIGINT/SIGTERM/SIGHUP into readable bytes on a pipe (select-able)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.received: list[int] = []
        self._old_wakeup = -1
        self._old_handlers: dict[int, object] = {}

    def __enter__(self) -> _SignalWatch:
        self._old_wakeup = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            self._old_handlers[sig] = signal.signal(sig, self._handler)
        return self

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 64):
                pass

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._old_wakeup)
        os.close(self.read_fd)
        os.close(self.write_fd)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


class _Session:
    """The monitoring loop shared by run and attach."""

    def __init__(
        self,
        recorder: PerfRecorder,
        options: SessionOptions,
        targets: Sequence[int],
        program: StoppedProgram | None,
    ) -> None:
        self.recorder = recorder
        self.options = options
        self.targets = list(targets)
        self.program = program
        self.hits: list[Hit] = []
        self.hit_source: HitSource | None = None
        self.interrupted = False
        self.warnings: list[str] = []
        self.snapshot_taken = False
        self.perf_stopped = False
        self.unacknowledged: list[Hit] = []
        """Hits whose snapshot perf did not acknowledge: it exited first."""

    def warn_unsnapshotted(self) -> None:
        """Once perf has exited: a warning for each hit it exited before taking the
        snapshot of (the last ones: those it acknowledged were asked for first)."""
        wanted = len(self.hits) if self.options.multi_snapshot else 1
        missing = min(len(self.unacknowledged), wanted - self.recorder.snapshots)
        for hit in self.unacknowledged[len(self.unacknowledged) - max(missing, 0) :]:
            self.warnings.append(
                f"the program ended before the snapshot of the hit at {hit.time} was taken"
            )

    def _on_hit(self, hit: Hit) -> bool:
        """Handle one trigger hit; True when the recording is complete."""
        self.hits.append(hit)
        log.info("trigger %s hit on thread %d", hit.label, hit.tid)
        backend = self.recorder.backend
        if not backend.takes_snapshots or not self.recorder.alive:
            return False
        multi = self.options.multi_snapshot
        if multi or not self.snapshot_taken:
            try:
                self.recorder.snapshot(switch_output=multi)
                self.snapshot_taken = True
            except PerfExitedError:
                # The program ended right after the hit, and perf with it, before the
                # snapshot could be asked for, or before perf could say it took it: once
                # perf has exited, what it wrote tells (warn_unsnapshotted).
                self.unacknowledged.append(hit)
                return not multi
            except RecordingError as e:
                self.warnings.append(f"snapshot for the hit at {hit.time} failed: {e.message}")
        return not multi

    def watch(self, signals: _SignalWatch) -> str:
        """Wait until something ends the recording; returns why."""
        recorder = self.recorder
        assert recorder.process is not None
        perf_fd = _pidfd(recorder.process.pid)
        target_fds = {fd: pid for pid in self.targets if (fd := _pidfd(pid)) is not None}
        try:
            while True:
                fds = [signals.read_fd, *target_fds]
                if perf_fd is not None and recorder.alive:
                    fds.append(perf_fd)
                if self.hit_source is not None:
                    fds += self.hit_source.fds()
                # pidfds make this event-driven; the timeout only covers kernels without them.
                ready, _, _ = select.select(fds, [], [], 0.2)
                if signals.received:
                    signals.drain()
                    signals.received.clear()
                    self.interrupted = True
                    return "interrupted"
                if self.hit_source is not None and self._handle_hits():
                    if self.program is None:
                        return "trigger"
                    # run: perf has its snapshot; the program keeps running to its end.
                    self.perf_stopped = True
                    self.recorder.stop()
                for fd in [fd for fd in ready if fd in target_fds]:
                    os.close(fd)
                    del target_fds[fd]
                if self._targets_gone(target_fds):
                    return "exited"
                if not recorder.alive and not self.perf_stopped:
                    # perf also ends when its targets do, and it can see them go a little
                    # before they can be reaped: give them a moment to show up as gone.
                    return "exited" if self._targets_end_soon(target_fds) else "perf-exited"
        finally:
            for fd in target_fds:
                os.close(fd)
            if perf_fd is not None:
                os.close(perf_fd)

    def drain_hits(self) -> None:
        """Take the hits still in the breakpoints' rings once the watch is over: the
        program may have made one and exited while a snapshot was being taken for the one
        before (the watch then saw it gone before it read its rings again)."""
        if self.hit_source is not None:
            self._handle_hits()

    def _handle_hits(self) -> bool:
        assert self.hit_source is not None
        done = False
        for hit in self.hit_source.read_hits():
            done = self._on_hit(hit) or done
        if done:
            self.hit_source.disable()
        return done

    def _targets_end_soon(self, target_fds: dict[int, int], grace: float = 1.0) -> bool:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if self._targets_gone({} if self.program is None else target_fds):
                return True
            time.sleep(0.01)
        return False

    def _targets_gone(self, target_fds: dict[int, int]) -> bool:
        if self.program is not None:
            return self.program.process.poll() is not None
        if target_fds:
            return False
        return not any(_running(pid) for pid in self.targets)


def _finish(session: _Session, signals: _SignalWatch) -> int:
    """Snapshot if needed and stop perf; a second Ctrl-C stops waiting for perf."""
    recorder = session.recorder
    assert recorder.process is not None
    session.drain_hits()
    backend = recorder.backend
    if (
        recorder.alive
        and backend.takes_snapshots
        and backend.needs_snapshot_before_stop(recorder.perf)
        and not session.snapshot_taken
    ):
        with contextlib.suppress(RecordingError):
            recorder.snapshot()
            session.snapshot_taken = True
    if recorder.alive:
        try:
            recorder.control.stop(DEFAULT_ACK_TIMEOUT)
        except RecordingError as e:
            log.warning("%s", e.message)
    deadline = time.monotonic() + PERF_EXIT_TIMEOUT
    while recorder.alive:
        select.select([signals.read_fd], [], [], 0.05)
        if signals.received:
            signals.drain()
            signals.received.clear()
            log.warning("stopping perf now (its last data may be incomplete)")
            recorder.kill()
            break
        if time.monotonic() > deadline:
            log.warning("perf did not finish within %g s; stopping it", PERF_EXIT_TIMEOUT)
            recorder.kill()
            break
    recorder.control.close()
    status = recorder.process.wait()
    recorder.count_written_snapshots()
    session.warn_unsnapshotted()
    return status


def _result(
    recorder: PerfRecorder,
    session: _Session,
    recording: Recording,
    reason: str,
    status: int,
    startup: float,
    exit_code: int | None = None,
) -> SessionResult:
    """The session's outcome, with a warning when perf ended badly."""
    result = SessionResult(
        recording=recording,
        reason=reason,
        interrupted=session.interrupted,
        exit_code=exit_code,
        perf_status=status,
        snapshots=recorder.snapshots,
        hits=session.hits,
        warnings=session.warnings,
        startup_seconds=startup,
    )
    problem = _perf_exit_problem(recorder, status)
    if problem is not None:
        result.warnings.append(problem)
    return result


def _perf_exit_problem(recorder: PerfRecorder, status: int) -> str | None:
    if status == 0 or status in (-signal.SIGINT, -signal.SIGTERM, 130, 143):
        return None
    text = recorder.log_text()
    return f"perf exited with status {status}" + (
        f": {_perf_error_line(text)}" if _perf_error_line(text) else ""
    )


def _save(
    recorder: PerfRecorder,
    options: SessionOptions,
    command: list[str],
    processes: dict[int, str],
    threads: dict[int, str],
    hits: list[Hit],
    scope: str,
    extra: dict[str, object],
) -> Recording:
    perf_maps = keep_perf_maps(recorder.directory, processes)
    if perf_maps:
        extra = {**extra, "perf_maps": perf_maps}
    recording = Recording(
        directory=recorder.directory,
        backend=recorder.backend.name,
        perf_data=perf_data_files(recorder.directory) or ["perf.data"],
        command=command,
        processes=processes,
        threads=threads,
        hits=[TriggerHit(h.time, h.pid, h.tid, h.ip, h.label) for h in hits],
        perf_version=recorder.perf.version_text,
        scope=scope,
        notes={
            "perf_record": recorder.argv,
            "control": recorder.control.kind,
            "snapshots": recorder.snapshots,
            **recorder.backend.describe(),
            **options.notes,
            **extra,
        },
    )
    recording.save()
    return recording


def _scope_of(backend: PerfBackend) -> str:
    described = backend.describe().get("scope", "user")
    return str(described)


def _close_hits(source: HitSource | None) -> None:
    if source is not None:
        source.close()


def run_program(
    argv: Sequence[str],
    perf: PerfTool,
    backend: PerfBackend,
    options: SessionOptions,
    *,
    use_ptrace: bool = True,
) -> SessionResult:
    """Record a program from its first instruction to its end (or Ctrl-C / a trigger)."""
    t0 = time.perf_counter()
    recorder = PerfRecorder(perf, backend, options.directory, print_commands=options.print_commands)
    program = StoppedProgram.spawn(argv, use_ptrace=use_ptrace)
    pid = program.pid
    targets = Targets((pid,), all_threads=options.multi_thread)
    hits: HitSource | None = None
    try:
        if options.wait_for_libraries:
            log.info("running the dynamic loader first: the trigger is in a shared library")
            program.advance_to_entry()
        recorder.start(targets, ready_timeout=options.ready_timeout)
        if options.make_hit_source is not None:
            hits = options.make_hit_source([pid])
    except BaseException:
        _close_hits(hits)
        program.kill()
        recorder.kill()
        raise
    processes = {pid: shlex.join(argv)}
    # Metadata first, so that a ptscope killed mid-way still leaves a decodable recording.
    _save(recorder, options, list(argv), processes, {}, [], _scope_of(backend), {"complete": False})
    session = _Session(recorder, options, [pid], program)
    session.hit_source = hits
    with contextlib.ExitStack() as cleanup:
        signals = cleanup.enter_context(_SignalWatch())
        cleanup.callback(_close_hits, hits)
        try:
            program.release()
        except BaseException:
            program.kill()
            recorder.kill()
            raise
        startup = time.perf_counter() - t0
        if options.on_ready is not None:
            options.on_ready(f"recording {shlex.join(argv)} (pid {pid})")
        threads = thread_names(pid)
        reason = session.watch(signals)
        if (
            reason == "interrupted"
            and program.process.poll() is None
            and not terminal_sent_sigint()
        ):
            # A Ctrl-C typed in the terminal reached the program too (same process group);
            # one sent to ptscope alone is passed on, as the program would have got it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        threads.update(thread_names(pid))
        status = _finish(session, signals)
        exit_code = _wait_program(program, signals, patience=5.0 if session.interrupted else None)
    recording = _save(
        recorder,
        options,
        list(argv),
        processes,
        threads,
        session.hits,
        _scope_of(backend),
        {"exit_code": exit_code, "held_by": program.method, "complete": True},
    )
    return _result(recorder, session, recording, reason, status, startup, exit_code)


def _wait_program(
    program: StoppedProgram, signals: _SignalWatch, *, patience: float | None
) -> int | None:
    """Wait for the program to end; after an interrupt, ``patience`` seconds and then it is
    killed (as it is when Ctrl-C is pressed again)."""
    process = program.process
    deadline = None if patience is None else time.monotonic() + patience
    while process.poll() is None:
        select.select([signals.read_fd], [], [], 0.05)
        late = deadline is not None and time.monotonic() > deadline
        if signals.received or late:
            signals.received.clear()
            signals.drain()
            if deadline is None:
                # First Ctrl-C after perf stopped: let the program handle it itself.
                deadline = time.monotonic() + 5.0
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(program.pid, signal.SIGKILL)
            process.wait()
    return process.returncode


def attach_processes(
    pids: Sequence[int],
    perf: PerfTool,
    backend: PerfBackend,
    options: SessionOptions,
) -> SessionResult:
    """Record running processes until Ctrl-C, a trigger, or until they all exit."""
    _check_pids(pids)
    t0 = time.perf_counter()
    processes = {pid: process_command_line(pid) for pid in pids}
    threads: dict[int, str] = {}
    for pid in pids:
        threads.update(thread_names(pid))
    recorder = PerfRecorder(perf, backend, options.directory, print_commands=options.print_commands)
    targets = Targets(tuple(pids), all_threads=options.multi_thread)
    hits: HitSource | None = None
    try:
        recorder.start(targets, ready_timeout=options.ready_timeout)
        if options.make_hit_source is not None:
            hits = options.make_hit_source(pids)
    except BaseException:
        _close_hits(hits)
        recorder.kill()
        raise
    _save(recorder, options, [], processes, threads, [], _scope_of(backend), {"complete": False})
    session = _Session(recorder, options, pids, None)
    session.hit_source = hits
    with contextlib.ExitStack() as cleanup:
        signals = cleanup.enter_context(_SignalWatch())
        cleanup.callback(_close_hits, hits)
        startup = time.perf_counter() - t0
        if options.on_ready is not None:
            names = ", ".join(f"{pid} ({processes[pid] or '?'})" for pid in pids)
            options.on_ready(f"attached to {names}; press Ctrl-C to stop")
        reason = session.watch(signals)
        for pid in pids:
            threads.update(thread_names(pid))
        status = _finish(session, signals)
    recording = _save(
        recorder,
        options,
        [],
        processes,
        threads,
        session.hits,
        _scope_of(backend),
        {"complete": True},
    )
    result = _result(recorder, session, recording, reason, status, startup)
    if reason == "perf-exited" and not session.interrupted:
        text = recorder.log_text()
        if status != 0:
            raise recorder.failure("perf stopped recording")
        log.info("perf ended by itself: %s", _perf_error_line(text))
    return result
