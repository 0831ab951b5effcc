"""The emulated Intel PT backend: run a program under QEMU and record it as a PT perf.data.

``record()`` runs the program under ``qemu-x86_64`` (user mode), turns QEMU's exact
instruction trace into a genuine Intel PT packet stream per thread, and writes it with its
sideband into ``DIRECTORY/perf.data`` plus the recording metadata, so the normal decode
pipeline (the real ``perf script``) reads it like a hardware recording.
See ``docs/emulated-pt.md`` for the design.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from ptscope.errors import BadInputError, PtscopeError, RecordingError, UsageError
from ptscope.record.emulated.cycle_model import DEFAULT_CYCLE_MODEL, CycleModel
from ptscope.record.emulated.elf_image import describe_machine, program_path, read_elf
from ptscope.record.emulated.perf_data import PerfDataWriter
from ptscope.record.emulated.qemu import BlockRun, LogSplitter, QemuProcess, find_qemu
from ptscope.record.emulated.tracer import EmulationState, Session
from ptscope.record.stop_signals import STOP_SIGNALS, terminal_sent_sigint
from ptscope.recording import Recording, keep_perf_maps

__all__ = ["CycleModel", "EmulatedResult", "EmulationOptions", "record"]


@dataclass(frozen=True)
class EmulationOptions:
    """Knobs that are not part of the everyday API (tests and benchmarks use them)."""

    single_step: bool = False
    """One instruction per QEMU block (slower; the log then shows every instruction)."""
    psb_period: int = 4096
    """Bytes of PT between PSB+ packets (resynchronisation points for the decoder)."""
    raw_log: Path | None = None
    """Also copy QEMU's raw log to this file (for tests that compute the ground truth)."""
    env: dict[str, str] | None = None
    cwd: Path | None = None


@dataclass
class EmulatedResult:
    """What an emulated recording produced and how the program ended."""

    recording: Recording
    instructions: int
    """Instructions traced (each ``rep`` string instruction counts once, as in PT)."""
    exit_code: int | None
    """The program's exit status when it exited by itself."""
    signal: int | None
    """The signal that killed the program, if one did."""
    stopped_at_limit: bool
    """``max_instructions`` was reached and the program was stopped."""
    crashed: bool
    """The program died of a fault (SIGSEGV, SIGILL, ...) under emulation."""
    interrupted: bool = False
    """Ctrl-C (or SIGTERM, SIGHUP) stopped the recording; what ran until then is kept."""
    seconds: float = 0.0
    threads: int = 1
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """One line saying how the program ended."""
        n = f"{self.instructions:,} instructions"
        if self.stopped_at_limit:
            return f"stopped after {n} (--max-instructions)"
        if self.signal is not None:
            name = _signal_name(self.signal)
            what = "crashed with" if self.crashed else "was killed by"
            return f"program {what} {name} after {n}"
        return f"program exited with status {self.exit_code} after {n}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def record(
    command: Sequence[str],
    directory: Path,
    *,
    max_instructions: int | None = None,
    progress: Callable[[int], None] | None = None,
    cycle_model: CycleModel | None = None,
    options: EmulationOptions | None = None,
    print_command: Callable[[str], None] | None = None,
) -> EmulatedResult:
    """Run ``command`` under QEMU and write an Intel PT recording of it into ``directory``.

    Raises a :class:`~ptscope.errors.PtscopeError` when nothing could be recorded (program
    not found or not x86-64, QEMU missing or not understood). A program that crashes, is
    killed or reaches ``max_instructions`` still gives a recording of what it ran, and so
    does Ctrl-C (see :class:`_StopOnSignal`): the program is stopped, not the recording.
    ``print_command`` is given the QEMU command line (shell-quoted) before it starts.
    """
    if not command:
        raise UsageError("no program to run")
    if max_instructions is not None and max_instructions <= 0:
        raise UsageError("--max-instructions must be positive")
    opts = options or EmulationOptions()
    model = cycle_model or DEFAULT_CYCLE_MODEL
    program = program_path(command[0])
    image = read_elf(str(program))
    if not image.is_x86_64:
        raise BadInputError(
            f"{command[0]} is a {describe_machine(image)} program; "
            "the emulated backend runs x86-64 programs only"
        )
    tool = find_qemu()
    directory.mkdir(parents=True, exist_ok=True)
    perf_data = directory / "perf.data"
    writer = PerfDataWriter(perf_data, model, command=list(command))
    started = time.perf_counter()
    try:
        proc = QemuProcess(
            tool,
            program,
            command,
            single_step=opts.single_step,
            env=opts.env,
            cwd=opts.cwd,
            print_command=print_command,
        )
    except BaseException:
        writer.abort()
        perf_data.unlink(missing_ok=True)
        raise
    raw = _RawLogCopy(opts.raw_log) if opts.raw_log else None
    session = Session(
        writer,
        model,
        psb_period=opts.psb_period,
        max_instructions=max_instructions,
        progress=progress,
    )
    main = EmulationState(
        session,
        pid=proc.proc.pid,
        program=image,
        comm=os.path.basename(command[0])[:15],
        cwd=str(opts.cwd or Path.cwd()),
    )
    stop = _StopOnSignal(proc)
    try:
        with stop.installed():
            _consume(proc, main, raw, stop.check)
            rc = proc.wait()
        for state in session.processes:
            state.finish()
        writer.finished_round()
    except BaseException:
        proc.stop()
        proc.wait()
        writer.abort()
        perf_data.unlink(missing_ok=True)
        raise
    finally:
        proc.close()
        if raw is not None:
            raw.close()
        if session.jit_file is not None:
            session.jit_file.close()
    seconds = time.perf_counter() - started
    if not main.threads:
        writer.abort()
        perf_data.unlink(missing_ok=True)
        raise RecordingError(
            f"nothing was recorded: QEMU ran {command[0]} but it executed no instructions"
            + (f" (QEMU exit status {rc})" if rc else "")
        )
    writer.close(main.build_ids())
    return _result(
        command,
        directory,
        session,
        main,
        rc,
        proc,
        tool.version,
        opts,
        model,
        seconds,
        interrupted=bool(stop.received),
    )


class _StopOnSignal:
    """Ctrl-C (SIGINT), SIGTERM or SIGHUP while the program runs stops the program, not the
    recording: the signal goes to the program (QEMU passes it on; a Ctrl-C typed in the
    terminal reached it already), the log is read to its end and the recording written
    as usual. If the program is still running 5 s later, or at a second signal, QEMU is
    killed; what was read until then is still written."""

    PATIENCE = 5.0

    def __init__(self, proc: QemuProcess) -> None:
        self.proc = proc
        self.received: list[int] = []
        self.deadline: float | None = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        try:
            old = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        except ValueError:  # not the main thread: signals keep their usual meaning
            yield
            return
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            self.proc.stop()
            return
        self.deadline = time.monotonic() + self.PATIENCE
        if not (signum == signal.SIGINT and terminal_sent_sigint()):
            self.proc.send_signal(signum)

    def check(self) -> None:
        """Called while the log is read: past the patience, kill the program."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.deadline = None
            self.proc.stop()


class _Stream:
    """One process's log: its splitter, and its state once the fork point is known."""

    def __init__(self, state: EmulationState | None) -> None:
        self.splitter = LogSplitter()
        self.state = state
        self.waiting: list[bytes] = []


def _feed(stream: _Stream, data: bytes, final: bool = False) -> bool:
    state = stream.state
    assert state is not None
    items = stream.splitter.finish() if final else stream.splitter.feed(data)
    for item in items:
        if isinstance(item, BlockRun):
            if not state.blocks(item):
                return False
        else:
            state.line(item)
    return True


def _consume(
    proc: QemuProcess, main: EmulationState, raw: _RawLogCopy | None, idle: Callable[[], None]
) -> None:
    streams: dict[int, _Stream] = {0: _Stream(main)}
    for pid, chunk in proc.chunks(idle):
        if raw is not None:
            raw.write(pid, chunk)
        stream = streams.get(pid)
        if stream is None:
            stream = streams[pid] = _Stream(None)
        if stream.state is None:
            # A forked child: its blocks may need translations its parent logged before
            # the fork, so it waits until the parent's log has shown the fork.
            stream.waiting.append(chunk)
            _adopt_children(streams)
            continue
        if not _feed(stream, chunk):
            proc.stop()
            return
        if pid == 0 or main.forks:
            _adopt_children(streams)
        main.session.writer_flush()
    if proc.killed:
        return  # a line QEMU was writing when it was killed is cut off: left out
    for stream in streams.values():
        if stream.state is not None and not _feed(stream, b"", final=True):
            return


class _RawLogCopy:
    """Copies of the raw QEMU logs (tests): ``PATH`` for the program, ``PATH.<pid>`` for
    each forked child."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.files: dict[int, BinaryIO] = {}

    def write(self, pid: int, data: bytes) -> None:
        f = self.files.get(pid)
        if f is None:
            name = self.path if pid == 0 else self.path.with_name(f"{self.path.name}.{pid}")
            f = self.files[pid] = open(name, "wb")  # noqa: SIM115 - closed by close()
        f.write(data)

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _adopt_children(streams: dict[int, _Stream]) -> None:
    """Start the state of every child whose parent has now logged the fork."""
    for pid, stream in streams.items():
        if stream.state is not None or pid == 0:
            continue
        for other in list(streams.values()):
            parent = other.state
            if parent is None:
                continue
            fork = next((f for f in parent.forks if f.pid == pid), None)
            if fork is None:
                continue
            stream.state = EmulationState(
                parent.session,
                pid=pid,
                program=parent.program,
                comm=parent.comm,
                cwd=parent.cwd,
                parent=parent,
                fork=fork,
            )
            for chunk in stream.waiting:
                _feed(stream, chunk)
            stream.waiting.clear()
            break


def _result(
    command: Sequence[str],
    directory: Path,
    session: Session,
    state: EmulationState,
    rc: int,
    proc: QemuProcess,
    qemu_version: tuple[int, ...],
    opts: EmulationOptions,
    model: CycleModel,
    seconds: float,
    *,
    interrupted: bool,
) -> EmulatedResult:
    limit = session.stopped_at_limit
    exit_code = rc if rc >= 0 and not limit else None
    if exit_code is None and state.ending.exit_code is not None and not proc.killed:
        exit_code = state.ending.exit_code
    sig = -rc if rc < 0 and not limit else None
    crashed = sig is not None and state.ending.fault
    notes: dict[str, object] = {
        "qemu_version": ".".join(map(str, qemu_version)),
        "mode": "single-step" if opts.single_step else "block",
        "instructions": session.insns,
        "cycle_model": asdict(model),
        "stopped_at_limit": limit,
        "forks_separated": proc.separates_forks,
        "threads_named_by": "plugin" if proc.names_threads else "strace",
    }
    if sig is not None:
        notes["signal"] = _signal_name(sig)
    if interrupted:
        notes["interrupted"] = True
    perf_maps = keep_perf_maps(directory, (p.pid for p in session.processes if p.threads))
    if perf_maps:
        notes["perf_maps"] = perf_maps
    if session.jit_file is not None:
        notes["jitted_code"] = session.jit_file.path.name
    if exit_code is not None:
        notes["exit_code"] = exit_code
    recording = Recording(
        directory=directory,
        backend="emulated",
        perf_data=["perf.data"],
        command=list(command),
        processes={p.pid: " ".join(command) for p in session.processes if p.threads},
        threads={t.tid: t.name for p in session.processes for t in p.threads},
        scope="user",
        notes=notes,
    )
    with contextlib.suppress(PtscopeError):
        from ptscope.perftool import find_perf

        recording.perf_version = find_perf().version_text
    recording.save()
    return EmulatedResult(
        recording=recording,
        instructions=session.insns,
        exit_code=exit_code,
        signal=sig,
        stopped_at_limit=limit,
        crashed=crashed,
        interrupted=interrupted,
        seconds=seconds,
        threads=sum(len(p.threads) for p in session.processes),
        notes=notes,
    )
