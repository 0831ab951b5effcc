"""The emulated Intel PT backend: run a program under QEMU and record it as a PT perf.data.

``record()`` runs the program under ``qemu-x86_64`` (user mode) with ptscope's recorder
plugin (``plugin/``, C), which turns every block the program executes into Intel PT packets
and writes them, with the sideband perf needs, straight into ``DIRECTORY/perf.data``. The
normal decode pipeline (the real ``perf script``) reads it like a hardware recording.
Python only starts QEMU, reports progress from the recorder's shared state (:mod:`.state`)
and writes the recording's metadata. See ``docs/emulated-pt.md`` for the design.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Final

from ptscope.errors import BadInputError, PtscopeError, RecordingError, UsageError
from ptscope.record.emulated.cycle_model import DEFAULT_CYCLE_MODEL, CycleModel
from ptscope.record.emulated.elf_image import describe_machine, program_path, read_elf
from ptscope.record.emulated.perf_data import (
    RepairRefused,
    finish_perf_data,
    header_matches,
    scan_sideband,
)
from ptscope.record.emulated.qemu import find_qemu, plugin_arguments, recorder_plugin, start_qemu
from ptscope.record.emulated.state import (
    DISK_FULL,
    FAILED,
    LIMIT_REACHED,
    NO_REGISTERS,
    STATE_NAME,
    EmulationState,
    NotStarted,
    StateError,
    read_state,
)
from ptscope.record.stop_signals import STOP_SIGNALS, terminal_sent_sigint
from ptscope.recording import Recording, keep_perf_maps, open_regular

__all__ = ["CycleModel", "EmulatedResult", "EmulationOptions", "record", "recover"]

log = logging.getLogger("ptscope")

_FAULT_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP, signal.SIGSYS}
)
_OUTPUTS = ("perf.data", STATE_NAME, "jitted-code.bin")


@dataclass(frozen=True)
class EmulationOptions:
    """Knobs that are not part of the everyday API (tests and benchmarks use them)."""

    single_step: bool = False
    """One instruction per QEMU block (slower; QEMU's log then shows every instruction)."""
    psb_period: int = 4096
    """Bytes of PT between PSB+ packets (resynchronisation points for the decoder)."""
    raw_log: Path | None = None
    """Also have QEMU log what it executes (``-d exec,nochain,in_asm,page,strace``) to this
    file, ``.<pid>`` beside it for each forked child: the tests' ground truth."""
    env: dict[str, str] | None = None
    cwd: Path | None = None
    chunk_size: int | None = None
    """Bytes of the first trace chunk of each thread (tests of chunk boundaries)."""
    deterministic: bool = False
    """Run with :data:`DETERMINISTIC_ENV` (unless ``env`` is given), no address-space
    randomisation and a fixed seed for what QEMU gives the program as random
    (``AT_RANDOM``, ``getrandom``): two runs then execute the same instructions."""


DETERMINISTIC_ENV: Final = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}
"""The environment of a deterministic run: the loader and libc walk the environment (its
size changes their instruction counts), and the locale changes what libc runs."""


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
    disk_full: bool = False
    """The disk filled up: the program was stopped, the recording holds what was written."""
    seconds: float = 0.0
    threads: int = 1
    notes: dict[str, object] = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """One line saying how the program ended."""
        n = f"{self.instructions:,} instructions"
        if self.stopped_at_limit:
            return f"stopped after {n} (--max-instructions)"
        if self.disk_full:
            return f"the disk is full: stopped after {n}, the recording holds them"
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
    not found or not x86-64, QEMU missing or without plugins). A program that crashes, is
    killed or reaches ``max_instructions`` still gives a recording of what it ran, and so
    does Ctrl-C (see :class:`_StopOnSignal`): the program is stopped, not the recording.
    The metadata is written before the program starts, so even a recording whose ptscope
    was killed can be decoded (:func:`recover`). ``print_command`` is given the QEMU
    command line (shell-quoted) before it starts.
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
    plugin = recorder_plugin(tool)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name in _OUTPUTS:
            (directory / name).unlink(missing_ok=True)
    except OSError as e:
        raise _cannot_write(directory, e) from e
    notes: dict[str, object] = {
        "qemu_version": tool.version_text,
        "mode": "single-step" if opts.single_step else "block",
        "cycle_model": asdict(model),
        "state": "recording",
        "recorder_pid": os.getpid(),
    }
    if opts.deterministic:
        notes["deterministic"] = True
    recording = Recording(
        directory=directory,
        backend="emulated",
        perf_data=["perf.data"],
        command=list(command),
        scope="user",
        notes=notes,
    )
    with contextlib.suppress(PtscopeError):
        from ptscope.perftool import find_perf

        recording.perf_version = find_perf().version_text
    try:
        recording.save()
    except OSError as e:
        raise _cannot_write(directory, e) from e
    arguments = plugin_arguments(
        directory,
        command,
        model,
        psb_period=opts.psb_period,
        max_instructions=max_instructions,
        raw_log=opts.raw_log,
        chunk_size=opts.chunk_size,
    )
    started = time.perf_counter()
    proc = start_qemu(
        tool,
        plugin,
        program,
        command,
        arguments,
        single_step=opts.single_step,
        raw_log=opts.raw_log,
        env=DETERMINISTIC_ENV if opts.deterministic and opts.env is None else opts.env,
        cwd=opts.cwd,
        deterministic=opts.deterministic,
        print_command=print_command,
    )
    stop = _StopOnSignal(proc, directory)
    try:
        with stop.installed():
            rc = _wait(proc, directory, progress, stop)
    except BaseException:
        stop.kill_all()
        proc.wait()
        raise
    seconds = time.perf_counter() - started
    try:
        state = read_state(directory)
    except StateError:
        raise RecordingError(
            f"QEMU could not start the recording of {command[0]} ({_qemu_status(rc)})"
        ) from None
    if not state.threads or (state.has(DISK_FULL) and not state.instructions):
        for name in _OUTPUTS:
            (directory / name).unlink(missing_ok=True)
        if state.has(DISK_FULL):
            raise RecordingError(f"the disk is full: nothing could be recorded in {directory}")
        raise RecordingError(
            f"nothing was recorded: QEMU ran {command[0]} but it executed no instructions"
            + (f" ({_qemu_status(rc)})" if rc else "")
            + (f": {state.error}" if state.error else "")
        )
    try:
        _finish(recording, state)
    except OSError as e:
        raise RecordingError(
            f"cannot finish the recording in {directory}: {e.strerror or e} "
            f"(`ptscope decode {directory}` finishes it once this is fixed)"
        ) from e
    return _result(recording, state, rc, seconds, interrupted=bool(stop.received))


def _cannot_write(directory: Path, error: OSError) -> RecordingError:
    return RecordingError(
        f"cannot write the recording in {directory}: {error.strerror or error}",
        hint="check the free space, or give --keep-recording a directory with room",
    )


def _qemu_status(rc: int) -> str:
    """How QEMU ended, for a message: its exit status, or the signal that killed it."""
    if rc >= 0:
        return f"QEMU exit status {rc}; its message is above" if rc else "QEMU exited"
    if -rc == signal.SIGXFSZ:
        return "QEMU was killed by SIGXFSZ: a file reached the file size limit (ulimit -f)"
    return f"QEMU was killed by {_signal_name(-rc)}"


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie has finished)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1][:3].strip() not in ("Z", "X")


def _wait(
    proc: subprocess.Popen[bytes],
    directory: Path,
    progress: Callable[[int], None] | None,
    stop: _StopOnSignal,
) -> int:
    """Wait for QEMU, then for the processes the program forked (each its own QEMU), with
    progress reports from the recorder's state."""
    reported = 0.0

    def report() -> EmulationState | None:
        nonlocal reported
        try:
            state = read_state(directory, details=False)
        except StateError:
            return None
        if progress is not None and time.monotonic() - reported >= 0.1:
            reported = time.monotonic()
            progress(state.instructions)
        return state

    rc: int | None = None
    while rc is None:
        try:
            rc = proc.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            stop.check()
            report()
    while True:
        state = report()
        if state is None:
            break
        others = [pid for pid in state.pids if pid != proc.pid and _alive(pid)]
        if not others:
            break
        if state.has(LIMIT_REACHED | DISK_FULL | FAILED):
            stop.kill_all()  # the recording is over: the rest of the program stops with it
        time.sleep(0.05)
        stop.check()
    if progress is not None and state is not None:
        progress(state.instructions)
    return rc


def _finish(recording: Recording, state: EmulationState) -> None:
    """Make the recording whole from what the recorder left: the perf.data's last
    checkpoint (if QEMU died in the middle of one), the processes and threads, the notes.
    The perf.data is opened as a regular file of the directory, never through a link
    (:func:`open_regular`: a directory someone else prepared cannot make this write
    elsewhere), and written only when the state describes it (:class:`RepairRefused`)."""
    perf_data = recording.directory / "perf.data"
    fd = open_regular(perf_data)
    try:
        if not header_matches(fd, state):
            os.close(fd)
            fd = -1
            fd = open_regular(perf_data, os.O_RDWR, sole=True)
            try:
                finish_perf_data(fd, state, recording.command)
            except RepairRefused as e:
                raise BadInputError(
                    f"cannot finish the recording in {recording.directory}: {perf_data} "
                    f"does not match the recorder's state: {e} (the file was left as it was)"
                ) from None
        with open(fd, "rb", closefd=False) as f:
            sideband = scan_sideband(f, state.data_end)
    finally:
        if fd >= 0:
            os.close(fd)
    command = " ".join(recording.command)
    recording.processes = {pid: command for pid in sideband.processes or state.pids}
    recording.threads = {t.tid: sideband.threads.get(t.tid, "") for t in state.threads}
    notes = recording.notes
    notes.pop("state", None)
    notes.pop("recorder_pid", None)
    notes["instructions"] = state.instructions
    notes["stopped_at_limit"] = state.has(LIMIT_REACHED)
    notes["registers"] = not state.has(NO_REGISTERS)
    if state.has(DISK_FULL):
        notes["disk_full"] = True
    if state.error:
        notes["recorder_error"] = state.error
    perf_maps = keep_perf_maps(recording.directory, recording.processes)
    if perf_maps:
        notes["perf_maps"] = perf_maps
    if state.jit_size:
        notes["jitted_code"] = "jitted-code.bin"


def _result(
    recording: Recording, state: EmulationState, rc: int, seconds: float, *, interrupted: bool
) -> EmulatedResult:
    limit = state.has(LIMIT_REACHED)
    disk_full = state.has(DISK_FULL)
    stopped = limit or disk_full
    exit_code = rc if rc >= 0 and not stopped else None
    sig = -rc if rc < 0 and not stopped else None
    crashed = sig is not None and sig in _FAULT_SIGNALS and not interrupted
    notes = recording.notes
    if sig is not None:
        notes["signal"] = _signal_name(sig)
    if interrupted:
        notes["interrupted"] = True
    if exit_code is not None:
        notes["exit_code"] = exit_code
    try:
        recording.save()
    except OSError as e:
        # A full disk: the metadata written at the start stays, and `ptscope decode`
        # finishes it from the recorder's state (recover()).
        log.warning("cannot update %s: %s", recording.directory, e.strerror or e)
    return EmulatedResult(
        recording=recording,
        instructions=state.instructions,
        exit_code=exit_code,
        signal=sig,
        stopped_at_limit=limit,
        crashed=crashed,
        interrupted=interrupted,
        disk_full=disk_full,
        seconds=seconds,
        threads=len(state.threads),
        notes=notes,
    )


def recover(recording: Recording) -> bool:
    """Finish a recording whose ptscope was killed while it ran (its metadata still says
    "recording"): the perf.data as the recorder last left it, the processes and threads.
    Returns whether anything was done; raises if the recording is still going on."""
    if recording.backend != "emulated" or not recording.unfinished:
        return False
    owner = recording.notes.get("recorder_pid")
    if isinstance(owner, int) and owner != os.getpid() and _alive(owner):
        raise RecordingError(
            f"{recording.directory} is still being recorded (by ptscope, process {owner})"
        )
    try:
        state = read_state(recording.directory)
    except NotStarted as e:
        raise BadInputError(f"{recording.directory}: the recording never started ({e})") from e
    except StateError as e:
        raise BadInputError(f"cannot finish the recording in {recording.directory}: {e}") from e
    try:
        _finish(recording, state)
        recording.notes["recovered"] = True
        recording.save()
    except OSError as e:
        raise BadInputError(
            f"cannot finish the recording in {recording.directory}: {e.strerror or e}",
            hint="check the free space and the permissions of the recording's directory",
        ) from e
    return True


class _StopOnSignal:
    """Ctrl-C (SIGINT), SIGTERM or SIGHUP while the program runs stops the program, not the
    recording: the signal goes to the program (QEMU passes it on; a Ctrl-C typed in the
    terminal reached it already) and the recording is finished as usual: everything the
    recorder wrote until then is a valid perf.data. If the program is still running 5 s
    later, or at a second signal, QEMU is killed."""

    PATIENCE = 5.0

    def __init__(self, proc: subprocess.Popen[bytes], directory: Path) -> None:
        self.proc = proc
        self.directory = directory
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

    def _pids(self) -> list[int]:
        pids = [self.proc.pid]
        with contextlib.suppress(StateError):
            pids += [p for p in read_state(self.directory, details=False).pids if p not in pids]
        return pids

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if len(self.received) > 1:
            self.kill_all()
            return
        self.deadline = time.monotonic() + self.PATIENCE
        if not (signum == signal.SIGINT and terminal_sent_sigint()):
            self._send(signum)

    def _send(self, signum: int) -> None:
        for pid in self._pids():
            if pid == self.proc.pid and self.proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def kill_all(self) -> None:
        """Kill QEMU and the program's forked processes (each its own QEMU)."""
        self._send(signal.SIGKILL)

    def check(self) -> None:
        """Called while waiting: past the patience, kill the program."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.deadline = None
            self.kill_all()
