"""Starting a program held before its first instruction (stopped at exec under ptrace, or
behind a shell gate), so that perf can attach before it runs anything."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shlex
import shutil
import signal
import struct
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from ptscope.errors import BadInputError, RecordingError, UsageError

__all__ = [
    "StoppedProgram",
    "die_with_parent",
    "process_command_line",
    "stop_with_parent",
    "thread_names",
]

log = logging.getLogger(__name__)

_PTRACE_TRACEME: Final = 0
_PTRACE_PEEKTEXT: Final = 1
_PTRACE_POKETEXT: Final = 4
_PTRACE_CONT: Final = 7
_PTRACE_GETREGS: Final = 12
_PTRACE_SETREGS: Final = 13
_PTRACE_DETACH: Final = 17
_AT_ENTRY: Final = 9
_PR_SET_PDEATHSIG: Final = 1
_WALL: Final = 0x40000000


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _hold_at_exec() -> None:  # runs in the child between fork and exec
    libc = _libc()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if libc.ptrace(ctypes.c_long(_PTRACE_TRACEME), 0, None, None) != 0:
        raise OSError(ctypes.get_errno(), "PTRACE_TRACEME failed")


def die_with_parent() -> None:  # runs in the child between fork and exec
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def stop_with_parent() -> None:  # perf, between fork and exec
    # SIGINT, not SIGKILL: if ptscope is killed, perf still finishes its file (and its
    # exit snapshot), so the recording directory stays decodable.
    _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGINT, 0, 0, 0)


def process_command_line(pid: int) -> str:
    """The command line of a process (its comm for kernel threads); '' when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        raw = b""
    if raw:
        return shlex.join(a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0"))
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def thread_names(pid: int) -> dict[int, str]:
    names: dict[int, str] = {}
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                names[int(task.name)] = (task / "comm").read_text().strip()
    return names


class StoppedProgram:
    """A program started but held before its first instruction, until :meth:`release`."""

    def __init__(self, process: subprocess.Popen[bytes], method: str, gate: int = -1) -> None:
        self.process = process
        self.method = method
        self._gate = gate
        self.released = False
        self.argv: list[str] = []

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def spawn(
        cls, argv: Sequence[str], *, use_ptrace: bool = True, stdout: int | None = None
    ) -> StoppedProgram:
        if not argv:
            raise UsageError("no program given: ptscope run [options] -- PROGRAM [ARGS]")
        exe = _find_program(argv[0])
        program: StoppedProgram | None = None
        if use_ptrace:
            try:
                program = cls._spawn_ptrace([exe, *argv[1:]], argv[0], stdout)
            except subprocess.SubprocessError as e:
                log.info("cannot hold the program with ptrace (%s): using a shell gate", e)
        if program is None:
            program = cls._spawn_gate([exe, *argv[1:]], argv[0], stdout)
        program.argv = list(argv)
        return program

    @classmethod
    def _spawn_ptrace(cls, argv: list[str], name: str, stdout: int | None) -> StoppedProgram:
        try:
            process = subprocess.Popen(
                argv, executable=argv[0], stdout=stdout, preexec_fn=_hold_at_exec
            )
        except OSError as e:
            raise BadInputError(f"cannot start {name}: {e.strerror or e}") from e
        _pid, status = os.waitpid(process.pid, _WALL)
        if not os.WIFSTOPPED(status):
            # It never reached its first instruction (killed before exec completed).
            process.returncode = os.waitstatus_to_exitcode(status)
            raise RecordingError(f"{name} ended before it started (status {status:#x})")
        return cls(process, "ptrace")

    @classmethod
    def _spawn_gate(cls, argv: list[str], name: str, stdout: int | None) -> StoppedProgram:
        read_end, write_end = os.pipe()
        # The shell blocks on the gate (fd 3: POSIX sh only takes single-digit fds), then
        # execs the program in place (same pid): perf follows the exec. EOF (ptscope
        # gone) exits without running anything.
        script = 'read _ <&3 || exit 125; exec 3<&-; exec "$@"'

        def setup() -> None:  # in the child, before exec
            die_with_parent()
            os.dup2(read_end, 3)

        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", script, "ptscope-gate", *argv],
                stdout=stdout,
                pass_fds=(3,),
                preexec_fn=setup,
            )
        except OSError as e:
            os.close(write_end)
            raise BadInputError(f"cannot start {name}: {e.strerror or e}") from e
        finally:
            os.close(read_end)
        return cls(process, "gate", write_end)

    def advance_to_entry(self) -> None:
        """Run the dynamic loader up to the program's entry point, so that its shared
        libraries are mapped (a trigger in a library needs their addresses).

        A one-shot ``int3`` at ``AT_ENTRY``: ptrace writes it, continues, and restores the
        instruction and the instruction pointer when the program stops there.
        """
        if self.method != "ptrace" or self.released:
            raise RecordingError("cannot wait for shared libraries: the program is not held")
        pid = self.pid
        entry = _auxv_entry(pid)
        libc = _libc()
        libc.ptrace.restype = ctypes.c_long
        ctypes.set_errno(0)
        word = libc.ptrace(_PTRACE_PEEKTEXT, pid, ctypes.c_void_p(entry), None)
        if word == -1 and ctypes.get_errno():
            raise RecordingError(
                f"cannot read the program's entry point: {os.strerror(ctypes.get_errno())}"
            )
        original = word & 0xFFFFFFFFFFFFFFFF
        trap = (original & ~0xFF) | 0xCC
        _ptrace_ok(
            libc.ptrace(_PTRACE_POKETEXT, pid, ctypes.c_void_p(entry), ctypes.c_void_p(trap))
        )
        deliver = 0
        while True:
            _ptrace_ok(libc.ptrace(_PTRACE_CONT, pid, None, ctypes.c_void_p(deliver)))
            _pid, status = os.waitpid(pid, _WALL)
            if not os.WIFSTOPPED(status):
                self.process.returncode = os.waitstatus_to_exitcode(status)
                self.released = True
                raise RecordingError("the program ended before reaching its entry point")
            if os.WSTOPSIG(status) == signal.SIGTRAP:
                break
            deliver = os.WSTOPSIG(status)  # a signal of its own: deliver it and go on
        regs = _UserRegs()
        _ptrace_ok(libc.ptrace(_PTRACE_GETREGS, pid, None, ctypes.byref(regs)))
        if regs.rip != entry + 1:
            raise RecordingError(f"the program stopped at {regs.rip:#x}, not at its entry point")
        regs.rip = entry
        _ptrace_ok(libc.ptrace(_PTRACE_SETREGS, pid, None, ctypes.byref(regs)))
        _ptrace_ok(
            libc.ptrace(_PTRACE_POKETEXT, pid, ctypes.c_void_p(entry), ctypes.c_void_p(original))
        )

    def release(self) -> None:
        """Let the program run."""
        if self.released:
            return
        self.released = True
        if self.method == "ptrace":
            if _libc().ptrace(ctypes.c_long(_PTRACE_DETACH), self.pid, None, None) != 0:
                err = ctypes.get_errno()
                raise RecordingError(f"cannot resume the program: {os.strerror(err)}")
        else:
            os.write(self._gate, b"go\n")
            os.close(self._gate)
            self._gate = -1

    def kill(self) -> None:
        """Discard a program that was never released (setup failed)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self.method == "ptrace" and not self.released:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, _WALL)
            self.process.returncode = -signal.SIGKILL
        else:
            self.process.wait()
        if self._gate >= 0:
            os.close(self._gate)
            self._gate = -1


_USER_REGS: Final = (
    *("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx"),
    *("rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base"),
    *("gs_base", "ds", "es", "fs", "gs"),
)


class _UserRegs(ctypes.Structure):
    """``struct user_regs_struct`` (x86-64)."""

    _fields_ = tuple((name, ctypes.c_ulonglong) for name in _USER_REGS)


def _ptrace_ok(result: int) -> None:
    if result == -1:
        err = ctypes.get_errno()
        raise RecordingError(f"ptrace failed: {os.strerror(err)}")


def _auxv_entry(pid: int) -> int:
    """The program's entry point (``AT_ENTRY``) from ``/proc/PID/auxv``."""
    data = Path(f"/proc/{pid}/auxv").read_bytes()
    for i in range(0, len(data) - 15, 16):
        key, value = struct.unpack_from("<QQ", data, i)
        if key == _AT_ENTRY:
            return int(value)
    raise RecordingError("cannot find the program's entry point")


def _find_program(name: str) -> str:
    if os.sep in name:
        path = Path(name)
        if not path.exists():
            raise BadInputError(f"{name}: no such file")
        if not os.access(path, os.X_OK) or path.is_dir():
            raise BadInputError(f"{name}: not an executable program")
        return name
    found = shutil.which(name)
    if found is None:
        raise BadInputError(f"{name}: command not found")
    return found
