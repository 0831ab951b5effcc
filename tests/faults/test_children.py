"""A child of ptscope killed under it (perf while decoding, QEMU while recording), and two
ptscopes at once in one directory (issue 20)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from ptscope.pipeline import decode_recording
from ptscope.recording import Recording
from support import programs
from support.emulated_corpus import needs_tools
from support.faults import environment, leftovers, one_line_error, run, start, wait_gone

pytestmark = pytest.mark.slow


def _names(trace: Path) -> set[str]:
    return {s.name for rows in read_trace(trace).slices.values() for s in rows}


def test_perf_killed_while_decoding(recordings: Callable[[str], Path], tmp_path: Path) -> None:
    """perf dies part way: one line says so; what was decoded before is a valid trace
    with a [decode error] where it stops; nothing is left behind."""
    rec = recordings("many_calls_long")
    out = tmp_path / "t.fxt.gz"
    env = environment(tmp_path)
    args = ["decode", "-j", "1", "--decoder", "dlfilter", str(rec), "-o", str(out)]
    running = start(args, env, tmp_path)
    # The trace's temporary file appears with the first slices written, while perf has
    # most of the recording still to decode (it runs ahead of ptscope by a pipe's worth).
    running.wait_for(lambda: any(tmp_path.glob("t.fxt.gz.ptscope-*.tmp")))
    perfs = running.children("perf")
    assert perfs, "perf ended before the test could kill it"
    for pid in perfs:
        os.kill(pid, signal.SIGKILL)
    done = running.finish()
    wait_gone(running.pid)
    line = one_line_error(done, 3)
    assert "perf script crashed (SIGKILL)" in line, line
    assert "holds what was decoded before" in line and f"wrote {out}" in done.stderr
    assert {"main", "step", "pair"} <= _names(out)
    instants = [i.name for rows in read_trace(out).instants.values() for i in rows]
    assert any(
        i.startswith("[decode error: decoding stopped: perf script crashed") for i in instants
    )
    assert leftovers(tmp_path, tmp_path) == []
    assert decode_recording(Recording.load(rec), tmp_path / "again.fxt.gz").slices > 0


def test_qemu_killed_while_recording(tmp_path: Path) -> None:
    """The emulator dies under the program: what it recorded until then is decoded."""
    needs_tools()
    exe = programs.build("spin")
    rec, out = tmp_path / "rec", tmp_path / "t.fxt.gz"
    env = environment(tmp_path)
    args = ["run", "--backend", "emulated", "--keep-recording", str(rec), "-o", str(out)]
    running = start([*args, "--", str(exe), "spinning", "paced"], env, tmp_path)
    running.wait_for(lambda: "spinning" in running.stdout())
    time.sleep(0.3)
    for pid in running.children("qemu-x86_64"):
        os.kill(pid, signal.SIGKILL)
    done = running.finish()
    wait_gone(running.pid)
    assert done.code == 128 + signal.SIGKILL, done.stderr  # the program's end, as time says
    assert "killed by SIGKILL" in done.stderr, done.stderr
    assert {"main", "step"} <= _names(out)
    assert leftovers(tmp_path, tmp_path) == []
    assert decode_recording(Recording.load(rec), tmp_path / "again.fxt.gz").slices > 0


def test_two_runs_at_once_in_one_directory(tmp_path: Path) -> None:
    """Two `ptscope run` in the same directory, each with its own output (and its own
    temporary recording): both succeed, and nothing is left behind."""
    needs_tools()
    exe = programs.build("many_calls", static=True)
    env = environment(tmp_path)
    runs = [
        start(["run", "--backend", "emulated", "-o", name, "--", str(exe), "2000"], env, tmp_path)
        for name in ("a.fxt.gz", "b.fxt.gz")
    ]
    for running in runs:
        done = running.finish()
        wait_gone(running.pid)
        assert done.code == 0, done.stderr
    for name in ("a.fxt.gz", "b.fxt.gz"):
        assert {"main", "step", "pair"} <= _names(tmp_path / name)
    assert leftovers(tmp_path, tmp_path) == []
    assert sorted(p.name for p in tmp_path.glob("*.fxt.gz")) == ["a.fxt.gz", "b.fxt.gz"]


def test_a_killed_writer_leaves_a_temporary_trace_the_next_one_removes(
    recordings: Callable[[str], Path], tmp_path: Path
) -> None:
    """A ptscope killed (SIGKILL) while it writes leaves `NAME.ptscope-PID.tmp` beside the
    output, never a partial NAME, and its perf dies with it; the next ptscope that writes
    NAME removes the leftover."""
    rec = recordings("many_calls_long")
    out = tmp_path / "t.fxt.gz"
    env = environment(tmp_path)
    running = start(["decode", "-j", "1", str(rec), "-o", str(out)], env, tmp_path)
    running.wait_for(lambda: any(tmp_path.glob("t.fxt.gz.ptscope-*.tmp")))
    running.signal(signal.SIGKILL)
    assert running.finish().code == -signal.SIGKILL
    wait_gone(running.pid)
    assert not out.exists()
    assert leftovers(tmp_path, tmp_path) == [f"t.fxt.gz.ptscope-{running.pid}.tmp"]
    done = run(["decode", str(rec), "-o", str(out)], env, tmp_path)
    assert done.code == 0, done.stderr
    assert leftovers(tmp_path, tmp_path) == [] and out.exists()
