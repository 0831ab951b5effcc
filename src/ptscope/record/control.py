"""Driving a running ``perf record``: ready/snapshot/stop through ``--control`` with acks.

perf >= 5.10 reads commands from a control FIFO and answers each with ``ack\\n`` on an ack
FIFO (perf-record(1) ``--control``), so ptscope never sleeps on a guess: it waits until
perf answers before starting the workload, and each snapshot or stop is confirmed (or
times out with a clear error). ``ping`` and ``stop`` exist from perf 5.12; with 5.10/5.11
``enable`` (a no-op on enabled events) stands in for ``ping`` and ``SIGINT`` for ``stop``.
Older perf has no control channel: signals (``SIGUSR2`` snapshot, ``SIGINT`` stop) and a
readiness check on perf's open event file descriptors.

FIFO details that matter: perf opens the ack FIFO write-only, which blocks until a reader
exists, so the read end is opened (non-blocking) before perf starts; the control FIFO is
opened read-write by us so that writing never blocks or fails while perf is starting, and
a command written early simply waits in the FIFO until perf's main loop reads it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Final

from ptscope.errors import RecordingError
from ptscope.perftool import PerfTool
from ptscope.record.perf_commands import Control

__all__ = [
    "DEFAULT_ACK_TIMEOUT",
    "DEFAULT_READY_TIMEOUT",
    "ControlTimeoutError",
    "FifoControl",
    "PerfControl",
    "PerfExitedError",
    "SignalControl",
    "fifo_control",
    "make_control",
]

log = logging.getLogger(__name__)

DEFAULT_READY_TIMEOUT: Final = 60.0  # perf synthesising a huge process can take a while
DEFAULT_ACK_TIMEOUT: Final = 10.0
_ACK: Final = b"ack\n"
_POLL_SLICE: Final = 0.05


class PerfExitedError(RecordingError):
    """perf exited while ptscope was waiting for it."""


class ControlTimeoutError(RecordingError):
    """perf did not answer a control command in time."""


class PerfControl:
    """Common interface: a running perf that can be made ready, snapshotted and stopped."""

    kind: str = "none"

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        """Extra ``perf record`` arguments this control method needs."""
        return []

    def bind(self, process: subprocess.Popen[bytes]) -> None:
        """Attach to the perf process once it has been started."""
        self._process = process

    @property
    def process(self) -> subprocess.Popen[bytes]:
        if self._process is None:
            raise RuntimeError("control used before perf was started")
        return self._process

    def perf_alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _check_alive(self, what: str) -> None:
        if not self.perf_alive():
            code = self.process.returncode
            raise PerfExitedError(f"perf exited (status {code}) while {what}")

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> None:
        """Return once perf has its events enabled and is in its main loop."""
        raise NotImplementedError

    def snapshot(
        self, *, switch_output: bool = False, timeout: float = DEFAULT_ACK_TIMEOUT
    ) -> None:
        """Save the AUX ring buffer (into a new perf.data file with ``switch_output``)."""
        raise NotImplementedError

    def stop(self, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        """Ask perf to finish (perf then writes its exit snapshot, if any, and exits)."""
        raise NotImplementedError

    def wait_exit(self, timeout: float) -> int | None:
        """Wait for perf to exit; its status, or None if it is still running."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, grace: float = 5.0) -> int:
        """Make sure perf is gone: SIGINT, then SIGTERM, then SIGKILL."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            if not self.perf_alive():
                break
            _signal(self.process, sig)
            self.wait_exit(grace)
        return self.process.wait()

    def close(self) -> None:
        """Release file descriptors (perf itself is not touched)."""


def _signal(process: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, sig)


def fifo_control(directory: Path) -> Control:
    """Where the control FIFOs of a recording in ``directory`` are."""
    return Control(directory / "perf-control.fifo", directory / "perf-ack.fifo")


class FifoControl(PerfControl):
    """``perf record --control=fifo:CTL,ACK``; FIFOs are created in ``directory``."""

    kind = "fifo"

    def __init__(self, directory: Path, *, has_ping: bool = True, has_stop: bool = True) -> None:
        super().__init__()
        self.has_ping = has_ping
        self.has_stop = has_stop
        self.control = fifo_control(directory)
        for path in (self.control.ctl, self.control.ack):
            path.unlink(missing_ok=True)
            os.mkfifo(path, 0o600)
        self._ack_fd = os.open(self.control.ack, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self._ctl_fd = os.open(self.control.ctl, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._pending = b""

    def argv(self) -> list[str]:
        return self.control.argv()

    def close(self) -> None:
        for fd in (self._ack_fd, self._ctl_fd):
            if fd >= 0:
                os.close(fd)
        self._ack_fd = self._ctl_fd = -1
        for path in (self.control.ctl, self.control.ack):
            path.unlink(missing_ok=True)

    def send(self, command: str, *, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        """Write one command and wait for perf's ack."""
        self._check_alive(f"sending {command!r}")
        try:
            os.write(self._ctl_fd, command.encode() + b"\n")
        except OSError as e:
            raise PerfExitedError(f"cannot send {command!r} to perf: {e}") from e
        self._wait_ack(command, timeout)

    def _wait_ack(self, command: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            # perf writes "ack\n\0"; commands are answered in order, so count acks.
            if _ACK in self._pending:
                self._pending = self._pending.split(_ACK, 1)[1].lstrip(b"\0")
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise ControlTimeoutError(
                    f"perf did not acknowledge {command!r} within {timeout:g} s",
                    hint="perf may be overloaded; the recording directory is kept",
                )
            ready, _, _ = select.select([self._ack_fd], [], [], min(left, _POLL_SLICE))
            if ready:
                try:
                    data = os.read(self._ack_fd, 64)
                except BlockingIOError:
                    data = None
                if data:
                    self._pending += data
                    continue
            # No data (or EOF: no writer yet, or perf closed it): is perf still there?
            if not self.perf_alive():
                raise PerfExitedError(
                    f"perf exited (status {self.process.returncode}) before acknowledging "
                    f"{command!r}"
                )
            if ready:
                time.sleep(_POLL_SLICE / 5)  # EOF with perf alive: it has not opened it yet

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> None:
        self.send("ping" if self.has_ping else "enable", timeout=timeout)

    def ping(self, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        self.send("ping" if self.has_ping else "enable", timeout=timeout)

    def enable(self, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        self.send("enable", timeout=timeout)

    def disable(self, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        self.send("disable", timeout=timeout)

    def snapshot(
        self, *, switch_output: bool = False, timeout: float = DEFAULT_ACK_TIMEOUT
    ) -> None:
        if switch_output:
            # The control command snapshots without switching files; SIGUSR2 does both
            # (--switch-output=signal). The signal handler only sets a trigger that perf's
            # main loop acts on at the top of its next iteration, while control commands
            # are read at the bottom: the first ping can be answered in the iteration the
            # signal arrived in, before the switch. Each iteration answers at most one
            # command, so the ack of a second ping comes after the trigger was handled.
            self._check_alive("taking a snapshot")
            _signal(self.process, signal.SIGUSR2)
            self.ping(timeout)
            self.ping(timeout)
        else:
            self.send("snapshot", timeout=timeout)

    def stop(self, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        if not self.perf_alive():
            return
        if self.has_stop:
            with contextlib.suppress(PerfExitedError):  # it was exiting anyway
                self.send("stop", timeout=timeout)
        else:
            _signal(self.process, signal.SIGINT)


class SignalControl(PerfControl):
    """perf without ``--control`` (< 5.10): signals, and a readiness check through /proc."""

    kind = "signal"

    def __init__(self, expected_events: int = 1) -> None:
        super().__init__()
        self.expected_events = expected_events

    def _open_event_fds(self) -> int:
        count = 0
        fd_dir = Path(f"/proc/{self.process.pid}/fd")
        try:
            for entry in fd_dir.iterdir():
                try:
                    if os.readlink(entry) == "anon_inode:[perf_event]":
                        count += 1
                except OSError:
                    continue
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ESRCH):
                raise
        return count

    def wait_ready(self, timeout: float = DEFAULT_READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self._open_event_fds() < self.expected_events:
            self._check_alive("starting")
            if time.monotonic() > deadline:
                raise ControlTimeoutError(f"perf did not open its events within {timeout:g} s")
            time.sleep(0.005)
        # perf opens its events before enabling them and has no way to say when it has;
        # this old-perf path alone keeps a short settle time.
        time.sleep(0.1)
        self._check_alive("starting")

    def snapshot(
        self, *, switch_output: bool = False, timeout: float = DEFAULT_ACK_TIMEOUT
    ) -> None:
        self._check_alive("taking a snapshot")
        _signal(self.process, signal.SIGUSR2)

    def stop(self, timeout: float = DEFAULT_ACK_TIMEOUT) -> None:
        if self.perf_alive():
            _signal(self.process, signal.SIGINT)


def make_control(perf: PerfTool, directory: Path) -> PerfControl:
    """The best control method this perf supports."""
    if perf.has_control_fifo:
        modern = perf.at_least(5, 12)
        return FifoControl(directory, has_ping=modern, has_stop=modern)
    log.info("perf %s has no --control: falling back to signals", perf.version_text)
    return SignalControl()
