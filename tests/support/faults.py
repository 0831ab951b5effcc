"""Running ptscope as a user does and hurting it on purpose (issue 20's fault suite).

Each ptscope runs in a session of its own (``start_new_session``), so that the processes
it started, and theirs, are found by session id (:func:`live_in_session`) without looking
at anything else on the machine: perf and QEMU keep ptscope's session, even after ptscope
died and they were re-parented. Each test gives ptscope a private ``TMPDIR`` and
``XDG_CACHE_HOME`` (:func:`environment`), so what is left there is what that run left.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PTSCOPE = [sys.executable, "-m", "ptscope"]
STANDIN = Path(__file__).with_name("standin_perf.py")

__all__ = [
    "Finished",
    "Running",
    "damage_data_size",
    "environment",
    "leftovers",
    "live_in_session",
    "one_line_error",
    "standin_perf",
    "start",
    "wait_gone",
]


def environment(tmp: Path, **extra: str) -> dict[str, str]:
    """ptscope's environment: the test's, with a private TMPDIR and cache, no terminal."""
    private = tmp / "tmpdir"
    private.mkdir(exist_ok=True)
    cache = tmp / "cache"
    cache.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    env.update(TMPDIR=str(private), XDG_CACHE_HOME=str(cache), TERM="dumb")
    env["PYTHONFAULTHANDLER"] = "1"  # a hung ptscope shows its stacks (Running.finish)
    env.update(extra)
    return env


def standin_perf(tmp: Path, mode: str) -> dict[str, str]:
    """Environment entries that make ptscope run a stand-in for perf: every command goes
    to the real perf, except ``perf script``, which (``mode``) ``hangs`` at once, without
    output, or ``decodes-then-hangs``: runs the real ``perf script`` to its end, then
    hangs with its output still open. A real process, as a broken perf would be."""
    real = shutil.which("perf")
    assert real is not None
    wrapper = tmp / "standin-perf"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return {"PTSCOPE_PERF": str(wrapper), "PTSCOPE_REAL_PERF": real, "STANDIN_MODE": mode}


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str


class Running:
    """A ptscope process in its own session; its output goes to files (never a pipe that
    nobody reads)."""

    def __init__(
        self,
        args: Sequence[str],
        env: dict[str, str],
        cwd: Path,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.out_path = cwd / f".ptscope-{time.monotonic_ns()}.out"
        self.err_path = self.out_path.with_suffix(".err")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.process = subprocess.Popen(
                [*PTSCOPE, *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=preexec,
            )
        self.pid = self.process.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, what: Callable[[], bool], timeout: float = 120) -> None:
        """Wait until ``what()`` holds (while ptscope runs)."""
        deadline = time.monotonic() + timeout
        while not what():
            assert self.process.poll() is None, (
                f"ptscope ended early ({self.process.returncode}): {self.stderr()}"
            )
            assert time.monotonic() < deadline, f"timed out; stderr: {self.stderr()}"
            time.sleep(0.05)

    def children(self, name: str) -> list[int]:
        """Live processes of this ptscope's session whose command is ``name`` (or whose
        command line holds it)."""
        return [
            pid
            for pid in live_in_session(self.pid)
            if pid != self.pid and (_comm(pid) == name or name in _cmdline(pid))
        ]

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def finish(self, timeout: float = 120) -> Finished:
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Where it hangs: faulthandler (PYTHONFAULTHANDLER) prints every thread's stack.
            self.process.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            raise AssertionError(f"ptscope did not end: {self.stderr()}") from None
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        result = Finished(code, self.stdout(), self.stderr())
        self.out_path.unlink(missing_ok=True)
        self.err_path.unlink(missing_ok=True)
        return result


def start(
    args: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    *,
    file_size_limit: int | None = None,
) -> Running:
    """Start ``ptscope ARGS``; ``file_size_limit``: RLIMIT_FSIZE in bytes (writes past it
    fail with EFBIG: SIGXFSZ is ignored, as Python itself does)."""

    def preexec() -> None:
        # As a terminal's program gets them: a suite started in the background by a shell
        # without job control runs with SIGINT ignored, which ptscope would inherit.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if file_size_limit is not None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return Running(args, env, cwd, preexec)


def run(
    args: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    *,
    file_size_limit: int | None = None,
    timeout: float = 120,
) -> Finished:
    """``ptscope ARGS`` to its end (killed past ``timeout``); every process it started
    must be gone after it."""
    running = start(args, env, cwd, file_size_limit=file_size_limit)
    result = running.finish(timeout)
    wait_gone(running.pid)
    return result


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def live_in_session(sid: int) -> list[int]:
    """Live (not zombie) processes of session ``sid``: what one ptscope started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is None or fields[0] in ("Z", "X"):
            continue
        if int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def wait_gone(sid: int, timeout: float = 20) -> None:
    """Every process of the session ends soon (children die with ptscope)."""
    deadline = time.monotonic() + timeout
    while (alive := live_in_session(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = {pid: _comm(pid) for pid in alive}
    for pid in alive:  # ours: do not leave them to the rest of the suite
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind: {left}"


def leftovers(tmp: Path, *outputs: Path) -> list[str]:
    """What a run left in its private TMPDIR (``tmp/tmpdir``, see :func:`environment`),
    and the temporary traces (``NAME.ptscope-PID.tmp``) it left beside ``outputs``."""
    found = sorted(entry.name for entry in (tmp / "tmpdir").iterdir())
    for directory in outputs:
        found += sorted(
            entry.name
            for entry in directory.iterdir()
            if re.fullmatch(r".*\.ptscope-\d+\.tmp", entry.name)
        )
    return found


def one_line_error(result: Finished, code: int | None = None) -> str:
    """Exactly one ``ptscope: error:`` line, no traceback, a non-zero exit; returns it."""
    assert result.code != 0, result.stderr
    if code is not None:
        assert result.code == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert "internal error" not in result.stderr, result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("ptscope: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def damage_data_size(perf_data: Path, value: int = 1) -> None:
    """Overwrite the low half of the perf.data header's data size (4 bytes at offset 48):
    perf 6.1's ``perf script`` then loops forever without printing anything."""
    raw = bytearray(perf_data.read_bytes())
    assert raw[:8] == b"PERFILE2"
    raw[48:52] = struct.pack("<I", value)
    perf_data.write_bytes(bytes(raw))
