"""Signals at every stage of ``run`` and ``decode`` (issue 20, bug 7): SIGINT, SIGTERM,
SIGHUP and SIGKILL while recording, decoding and writing. After each: no process of that
ptscope is left (perf and QEMU die with it, even by SIGKILL), no temporary file is left
(a SIGKILL leaves the decode's temporary directory, which the next ptscope removes), and
the recording decodes."""

from __future__ import annotations

import fcntl
import os
import signal
import termios
from collections.abc import Callable
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from ptscope.pipeline import decode_recording
from ptscope.recording import Recording
from support import programs
from support.emulated_corpus import needs_tools
from support.faults import (
    Finished,
    Running,
    damage_data_size,
    environment,
    leftovers,
    run,
    standin_perf,
    start,
    wait_gone,
)

pytestmark = pytest.mark.slow

SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL]
ids = [s.name for s in SIGNALS]
MESSAGE = {
    signal.SIGINT: "ptscope: interrupted",
    signal.SIGTERM: "ptscope: stopped by SIGTERM",
    signal.SIGHUP: "ptscope: stopped by SIGHUP",
}


def _stopped(done: Finished, sig: signal.Signals) -> None:
    """ptscope ended as that signal says: killed, or a line and the conventional code."""
    if sig == signal.SIGKILL:
        assert done.code == -signal.SIGKILL
        return
    assert done.code == 128 + sig, (done.code, done.stderr)
    assert MESSAGE[sig] in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr


def _decodes(rec: Path, tmp_path: Path) -> None:
    """The recording is whole: it decodes into the program's calls."""
    summary = decode_recording(Recording.load(rec), tmp_path / "again.fxt.gz")
    assert summary.slices > 0


def _after_kill(tmp_path: Path, env: dict[str, str], rec: Path) -> None:
    """A SIGKILL leaves at most the decode's temporary directory, named after the dead
    ptscope; the next ptscope removes it (and the recording decodes)."""
    left = leftovers(tmp_path, tmp_path)
    assert all(name.startswith("ptscope-decode-") for name in left), left
    done = run(["decode", "-j", "2", str(rec), "-o", str(tmp_path / "next.fxt.gz")], env, tmp_path)
    assert done.code == 0, done.stderr
    assert leftovers(tmp_path, tmp_path) == []


def _start_run(
    tmp_path: Path, env: dict[str, str], program: list[str], *options: str
) -> tuple[Running, Path, Path]:
    needs_tools()
    rec, out = tmp_path / "rec", tmp_path / "t.fxt.gz"
    args = ["run", "--backend", "emulated", "--keep-recording", str(rec), "-o", str(out)]
    return start([*args, *options, "--", *program], env, tmp_path), rec, out


# ------------------------------------------------------------------ run: recording


@pytest.mark.parametrize("sig", SIGNALS, ids=ids)
def test_run_while_recording(sig: signal.Signals, tmp_path: Path) -> None:
    """SIGINT, SIGTERM, SIGHUP stop the program and decode what ran (exit 0); SIGKILL
    kills ptscope, QEMU stops with it, and the recording decodes later."""
    exe = programs.build("spin")
    env = environment(tmp_path)
    running, rec, out = _start_run(tmp_path, env, [str(exe), "spinning", "paced"])
    running.wait_for(lambda: "spinning" in running.stdout())
    running.signal(sig)
    done = running.finish()
    wait_gone(running.pid)
    if sig == signal.SIGKILL:
        assert done.code == -signal.SIGKILL
        assert not out.exists()
    else:
        assert done.code == 0, done.stderr
        assert "stopped; decoding what was recorded" in done.stderr
        assert {"main", "step"} <= {s.name for r in read_trace(out).slices.values() for s in r}
    assert leftovers(tmp_path, tmp_path) == []
    _decodes(rec, tmp_path)


# ------------------------------------------------------------------ run: decoding


@pytest.mark.parametrize("sig", SIGNALS, ids=ids)
def test_run_while_decoding(sig: signal.Signals, tmp_path: Path) -> None:
    """perf (a stand-in that hangs) decodes two windows, one into a temporary directory:
    the signal stops perf and removes the directory; the recording is kept."""
    exe = programs.build("many_calls", static=True)
    env = environment(tmp_path, PTSCOPE_PERF_STALL_TIMEOUT="0", **standin_perf(tmp_path, "hangs"))
    running, rec, out = _start_run(
        tmp_path, env, [str(exe), "6000"], "-j", "2", "--decoder", "dlfilter"
    )
    tmpdir = tmp_path / "tmpdir"

    def decoding() -> bool:
        windows = any(p.name.startswith("ptscope-decode-") for p in tmpdir.iterdir())
        return windows and len(running.children("standin_perf.py script")) >= 2

    running.wait_for(decoding)
    running.signal(sig)
    done = running.finish()
    wait_gone(running.pid)
    _stopped(done, sig)
    assert not out.exists()
    if sig == signal.SIGKILL:
        _after_kill(tmp_path, environment(tmp_path), rec)
    else:
        assert f"recording kept at {rec}" in done.stderr
        assert leftovers(tmp_path, tmp_path) == []
    _decodes(rec, tmp_path)


# ------------------------------------------------------------------ writing


def _blocked_writer(running: Running, fifo: Path) -> int:
    """Open the FIFO that ptscope writes the trace into and read nothing: once the pipe is
    full, ptscope is stuck in the middle of writing. Returns the reading end."""
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    size = fcntl.fcntl(reader, fcntl.F_GETPIPE_SZ)
    seen: list[int] = []

    def full() -> bool:
        # Writes fill the pipe's pages partly: "full" is most of it, and no longer growing.
        waiting = bytearray(4)
        fcntl.ioctl(reader, termios.FIONREAD, waiting)
        seen.append(int.from_bytes(waiting, "little"))
        return seen[-1] >= size // 2 and seen[-6:] == [seen[-1]] * 6

    running.wait_for(full)
    return reader


@pytest.mark.parametrize("sig", SIGNALS, ids=ids)
def test_run_while_writing(sig: signal.Signals, tmp_path: Path) -> None:
    exe = programs.build("many_calls", static=True)
    env = environment(tmp_path)
    fifo = tmp_path / "t.fxt"
    os.mkfifo(fifo)
    running, rec, _ = _start_run(tmp_path, env, [str(exe), "6000"], "-o", str(fifo))
    reader = _blocked_writer(running, fifo)
    try:
        running.signal(sig)
        done = running.finish()
        wait_gone(running.pid)
    finally:
        os.close(reader)
    _stopped(done, sig)
    if sig == signal.SIGKILL:
        _after_kill(tmp_path, environment(tmp_path), rec)
    else:
        assert f"recording kept at {rec}" in done.stderr
        assert leftovers(tmp_path, tmp_path) == []
    _decodes(rec, tmp_path)


@pytest.mark.parametrize("sig", SIGNALS, ids=ids)
def test_decode_while_writing(
    sig: signal.Signals, recording_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    rec = recording_copy("many_calls")
    env = environment(tmp_path)
    fifo = tmp_path / "t.fxt"
    os.mkfifo(fifo)
    running = start(["decode", str(rec), "-o", str(fifo)], env, tmp_path)
    reader = _blocked_writer(running, fifo)
    try:
        running.signal(sig)
        done = running.finish()
        wait_gone(running.pid)
    finally:
        os.close(reader)
    _stopped(done, sig)
    if sig == signal.SIGKILL:
        _after_kill(tmp_path, env, rec)
    assert leftovers(tmp_path, tmp_path) == []
    _decodes(rec, tmp_path)


# ------------------------------------------------------------------ decode: decoding


@pytest.mark.parametrize("sig", SIGNALS, ids=ids)
def test_decode_while_decoding(
    sig: signal.Signals, recording_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    """The real perf, looping forever on a damaged recording (and not stopped: the
    watchdog is off): the signal stops it, whichever it is."""
    rec = recording_copy("basics")
    damage_data_size(rec / "perf.data")
    env = environment(tmp_path, PTSCOPE_PERF_STALL_TIMEOUT="0")
    out = tmp_path / "t.fxt.gz"
    running = start(["decode", "--decoder", "dlfilter", str(rec), "-o", str(out)], env, tmp_path)
    running.wait_for(lambda: bool(running.children("perf")))
    running.signal(sig)
    done = running.finish()
    wait_gone(running.pid)
    _stopped(done, sig)
    assert not out.exists()
    assert leftovers(tmp_path, tmp_path) == []


class _Stopped(Exception):
    pass


def test_a_signal_while_the_pipeline_is_imported_is_delivered_after_it() -> None:
    """A decode imports its pipeline while its perf already runs; a signal then must not
    interrupt the import (an exception inside a C extension's import becomes an
    ImportError), but stop the command right after it."""
    from ptscope.cli.base import signals_deferred

    def stop(signum: int, _frame: object) -> None:
        raise _Stopped(signum)

    old = signal.signal(signal.SIGHUP, stop)
    try:
        finished = []
        with pytest.raises(_Stopped), signals_deferred():
            signal.raise_signal(signal.SIGHUP)
            signal.raise_signal(signal.SIGHUP)
            finished.append(True)  # the block runs to its end first
        assert finished == [True]
        assert signal.getsignal(signal.SIGHUP) is stop
    finally:
        signal.signal(signal.SIGHUP, old)
