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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ptscope.errors import BadInputError, PtscopeError, RecordingError, UsageError
from ptscope.record.emulated.cycle_model import DEFAULT_CYCLE_MODEL, CycleModel
from ptscope.record.emulated.elf_image import describe_machine, program_path, read_elf
from ptscope.record.emulated.perf_data import PerfDataWriter
from ptscope.record.emulated.qemu import BlockRun, LogSplitter, QemuProcess, find_qemu
from ptscope.record.emulated.tracer import EmulationState
from ptscope.recording import Recording

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
) -> EmulatedResult:
    """Run ``command`` under QEMU and write an Intel PT recording of it into ``directory``.

    Raises a :class:`~ptscope.errors.PtscopeError` when nothing could be recorded (program
    not found or not x86-64, QEMU missing or not understood). A program that crashes, is
    killed or reaches ``max_instructions`` still gives a recording of what it ran.
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
            tool, program, command, single_step=opts.single_step, env=opts.env, cwd=opts.cwd
        )
    except BaseException:
        writer.abort()
        perf_data.unlink(missing_ok=True)
        raise
    raw = open(opts.raw_log, "wb") if opts.raw_log else None  # noqa: SIM115
    state = EmulationState(
        writer,
        model,
        pid=proc.proc.pid,
        program=image,
        comm=os.path.basename(command[0])[:15],
        cwd=str(opts.cwd or Path.cwd()),
        psb_period=opts.psb_period,
        max_instructions=max_instructions,
    )
    state.progress = progress
    splitter = LogSplitter()
    try:
        _consume(proc, splitter, state, raw)
        rc = proc.wait()
        build_ids = state.finish()
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
    seconds = time.perf_counter() - started
    if not state.threads:
        writer.abort()
        perf_data.unlink(missing_ok=True)
        raise RecordingError(
            f"nothing was recorded: QEMU ran {command[0]} but it executed no instructions"
            + (f" (QEMU exit status {rc})" if rc else "")
        )
    writer.close(build_ids)
    return _result(command, directory, state, rc, proc.killed, tool.version, opts, model, seconds)


def _consume(proc: QemuProcess, splitter: LogSplitter, state: EmulationState, raw: object) -> None:
    write = raw.write if raw is not None else None  # type: ignore[attr-defined]
    for chunk in proc.chunks():
        if write is not None:
            write(chunk)
        for item in splitter.feed(chunk):
            if isinstance(item, BlockRun):
                if not state.blocks(item):
                    proc.stop()
                    return
            else:
                state.line(item)
        state.flush_buffers()
    for item in splitter.finish():
        if isinstance(item, BlockRun):
            if not state.blocks(item):
                return
        else:
            state.line(item)


def _result(
    command: Sequence[str],
    directory: Path,
    state: EmulationState,
    rc: int,
    killed: bool,
    qemu_version: tuple[int, ...],
    opts: EmulationOptions,
    model: CycleModel,
    seconds: float,
) -> EmulatedResult:
    exit_code = rc if rc >= 0 and not state.stopped_at_limit else None
    if exit_code is None and state.ending.exit_code is not None and not killed:
        exit_code = state.ending.exit_code
    sig = -rc if rc < 0 and not state.stopped_at_limit else None
    crashed = sig is not None and state.ending.fault
    notes: dict[str, object] = {
        "qemu_version": ".".join(map(str, qemu_version)),
        "mode": "single-step" if opts.single_step else "block",
        "instructions": state.insns,
        "cycle_model": asdict(model),
        "stopped_at_limit": state.stopped_at_limit,
    }
    if sig is not None:
        notes["signal"] = _signal_name(sig)
    if exit_code is not None:
        notes["exit_code"] = exit_code
    recording = Recording(
        directory=directory,
        backend="emulated",
        perf_data=["perf.data"],
        command=list(command),
        processes={state.pid: " ".join(command)},
        threads={t.tid: t.name for t in state.threads},
        scope="user",
        notes=notes,
    )
    with contextlib.suppress(PtscopeError):
        from ptscope.perftool import find_perf

        recording.perf_version = find_perf().version_text
    recording.save()
    return EmulatedResult(
        recording=recording,
        instructions=state.insns,
        exit_code=exit_code,
        signal=sig,
        stopped_at_limit=state.stopped_at_limit,
        crashed=crashed,
        seconds=seconds,
        threads=len(state.threads),
        notes=notes,
    )
