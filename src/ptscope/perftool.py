"""Finding and running the ``perf`` tool: the one place that knows its path and version.

Shared infrastructure for the record and decode stages. ``PTSCOPE_PERF`` overrides the
binary (default: ``perf`` on ``PATH``).

A decoding perf is watched (:class:`PerfWatch`): some damaged perf.data files (a header's
data size changed, a file cut short) make ``perf script`` loop forever, printing nothing.
perf is stopped when it makes no progress for ``PTSCOPE_PERF_STALL_TIMEOUT`` seconds
(default 30; 0: never). Progress is output (the text decoder prints every branch) or a
*beat*: the dlfilter writes a byte into a pipe every 65,536 samples it is given, dropped
ones included, so a long stretch of code that the record stream leaves out (a loop
without calls) still counts as work. Only time that ptscope spends waiting for perf
counts: output that perf wrote and ptscope has not read yet is progress too, and so is
time during which ptscope itself was stopped (Ctrl-Z).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import re
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ptscope.errors import ToolMissingError, UsageError

__all__ = [
    "DEFAULT_STALL_SECONDS",
    "STALL_ENV",
    "PerfTool",
    "PerfWatch",
    "beat_pipe",
    "find_perf",
    "perf_env",
    "perf_output",
    "stall_limit",
]

_VERSION_RE = re.compile(r"perf version (\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class PerfTool:
    """A located perf binary and its version (major, minor, patch)."""

    path: str
    version: tuple[int, int, int]
    version_text: str

    def at_least(self, major: int, minor: int) -> bool:
        return self.version[:2] >= (major, minor)

    @property
    def has_dlfilter(self) -> bool:
        return self.at_least(5, 14)

    @property
    def has_control_fifo(self) -> bool:
        return self.at_least(5, 10)

    @property
    def has_snapshot_on_exit(self) -> bool:
        return self.at_least(5, 4)

    @property
    def has_kcore(self) -> bool:
        return self.at_least(5, 5)


def perf_env() -> dict[str, str]:
    """Environment for perf subprocesses: no pager, C locale for stable text."""
    env = dict(os.environ)
    env["PAGER"] = "cat"
    env["LC_ALL"] = "C"
    return env


@functools.cache
def find_perf() -> PerfTool:
    """Locate perf and read its version, or raise :class:`ToolMissingError`."""
    name = os.environ.get("PTSCOPE_PERF", "perf")
    path = shutil.which(name) if os.sep not in name else (name if Path(name).exists() else None)
    hint = "install it with: sudo apt-get install linux-perf (or set PTSCOPE_PERF)"
    if path is None:
        raise ToolMissingError(f"perf not found ({name})", hint=hint)
    cached = _cache_get(path, ("--version",))
    if cached is not None:
        m = _VERSION_RE.search(cached[1])
        if m:
            version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
            return PerfTool(path=path, version=version, version_text=cached[1].strip())
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, env=perf_env(), timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissingError(f"cannot run {path}: {e}", hint=hint) from e
    text = (out.stdout or out.stderr).strip()
    m = _VERSION_RE.search(text)
    if out.returncode != 0 or not m:
        raise ToolMissingError(
            f"{path} does not look like perf (`perf --version` said: {text[:80]!r})",
            details=out.stderr,
            hint=hint,
        )
    _cache_put(path, ("--version",), out.returncode, out.stdout, out.stderr)
    version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    return PerfTool(path=path, version=version, version_text=text)


# What perf says about itself (version, build options) changes only with the binary, and
# asking costs ~12 ms a call: `ptscope run` must start the workload right after perf is
# ready, so the answers are kept on disk, keyed by the binary's path, size and mtime.


def _cache_file(path: str, args: tuple[str, ...]) -> Path | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{' '.join(args)}"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(base) / "ptscope" / "perf" / f"{digest}.json"


def _cache_get(path: str, args: tuple[str, ...]) -> tuple[int, str, str] | None:
    file = _cache_file(path, args)
    if file is None:
        return None
    try:
        data = json.loads(file.read_text())
        return int(data["rc"]), str(data["stdout"]), str(data["stderr"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_put(path: str, args: tuple[str, ...], rc: int, stdout: str, stderr: str) -> None:
    file = _cache_file(path, args)
    if file is None:
        return
    tmp = file.with_suffix(f".{os.getpid()}.tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"rc": rc, "stdout": stdout, "stderr": stderr}))
        tmp.replace(file)
    except OSError:
        # A cache that cannot be written only costs time; a half-written file goes.
        with contextlib.suppress(OSError):
            tmp.unlink()


def perf_output(path: str, *args: str, timeout: float = 30) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``perf ARGS`` for questions about perf itself (its
    version, build options), answered from the on-disk cache when the binary is unchanged.
    Raises OSError / TimeoutExpired like ``subprocess.run``."""
    cached = _cache_get(path, args)
    if cached is not None:
        return cached
    out = subprocess.run(
        [path, *args], capture_output=True, text=True, env=perf_env(), timeout=timeout
    )
    _cache_put(path, args, out.returncode, out.stdout, out.stderr)
    return out.returncode, out.stdout, out.stderr


# ------------------------------------------------------------------ the watchdog

STALL_ENV: Final = "PTSCOPE_PERF_STALL_TIMEOUT"
DEFAULT_STALL_SECONDS: Final = 30.0
_POLL: Final = 0.25
"""Seconds between two looks at a perf that has shown nothing new."""
_LONGEST_WAIT: Final = 1.0
"""A look counts for at most this long: a longer one means ptscope itself was stopped."""


def stall_limit() -> float | None:
    """Seconds a decoding perf may go without progress (``PTSCOPE_PERF_STALL_TIMEOUT``,
    default :data:`DEFAULT_STALL_SECONDS`); None: never stop it (``0``)."""
    text = os.environ.get(STALL_ENV, "").strip()
    if not text:
        return DEFAULT_STALL_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{STALL_ENV}={text!r}: give a number of seconds (0: never stop perf)")
    return value or None


def beat_pipe() -> tuple[int, int]:
    """A pipe for the dlfilter's beats: (read end, write end), both non-blocking (a full
    pipe drops beats rather than stalling perf), both closed at exec (pass the write end
    with ``pass_fds``)."""
    return os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


class PerfWatch:
    """Stops a perf process that makes no progress for ``limit`` seconds (None: never).

    The reader of perf's output calls :meth:`wait_readable` before each read of the pipe
    (or :meth:`wait` when perf writes into a file): they return when there is something to
    read, or perf has exited, and count the time spent waiting with nothing new, neither
    output nor a beat on ``beat`` (the read end of :func:`beat_pipe`, owned from then on).
    Past the limit perf is killed and :attr:`stalled` says how it looked (its output then
    ends, and its exit status is SIGKILL's)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], limit: float | None, beat: int | None = None
    ) -> None:
        self.proc = proc
        self.limit = limit
        self._beat = beat
        self._idle = 0.0
        self._cpu_at_progress = 0.0
        self.stalled: str | None = None
        """What the stalled perf did (``"kept the CPU busy"``...), once it was stopped."""

    def progress(self) -> None:
        """Something came from perf: the waiting starts over."""
        if self._idle:
            self._idle = 0.0
            self._cpu_at_progress = _cpu_seconds(self.proc.pid)

    def _beats(self) -> bool:
        if self._beat is None:
            return False
        got = False
        while True:
            try:
                chunk = os.read(self._beat, 4096)
            except BlockingIOError:
                return got
            except OSError:
                return got
            if not chunk:
                return got
            got = True

    def _waited(self, seconds: float) -> None:
        if self._beats():
            self.progress()
            return
        if self._idle == 0.0:
            self._cpu_at_progress = _cpu_seconds(self.proc.pid)
        self._idle += min(max(seconds, 0.0), _LONGEST_WAIT)
        if self.limit is None or self._idle < self.limit or self.stalled is not None:
            return
        if self.proc.poll() is not None:
            return  # it has just finished: not a stall
        cpu = _cpu_seconds(self.proc.pid) - self._cpu_at_progress
        busy = cpu >= 0.1 * self._idle  # a perf that loops gets some CPU, even on a busy machine
        self.stalled = (
            f"no output for {self.limit:g} s while it kept the CPU busy"
            if busy
            else f"no output for {self.limit:g} s while it did nothing"
        )
        self.proc.kill()

    def wait_readable(self, fd: int) -> None:
        """Return once ``fd`` (perf's output pipe) has data or is at its end."""
        while True:
            started = time.monotonic()
            ready, _, _ = select.select([fd], [], [], _POLL)
            if ready:
                self.progress()
                return
            self._waited(time.monotonic() - started)

    def wait(self, output: Path) -> int:
        """Wait for perf to exit (it writes into ``output``); returns its exit status."""
        size = -1
        while True:
            started = time.monotonic()
            try:
                return self.proc.wait(timeout=_POLL)
            except subprocess.TimeoutExpired:
                pass
            try:
                now = output.stat().st_size
            except OSError:
                now = size
            if now != size:
                size = now
                self.progress()
            else:
                self._waited(time.monotonic() - started)

    def close(self) -> None:
        if self._beat is not None:
            os.close(self._beat)
            self._beat = None
