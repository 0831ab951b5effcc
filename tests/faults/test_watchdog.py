"""A perf that makes no progress is stopped (issue 20, bug 4): some damaged perf.data files
make ``perf script`` loop forever, and ptscope used to wait for it forever."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from support.faults import (
    damage_data_size,
    environment,
    leftovers,
    one_line_error,
    run,
    standin_perf,
)

pytestmark = pytest.mark.slow

STALL = "PTSCOPE_PERF_STALL_TIMEOUT"


def _names(trace: Path) -> set[str]:
    return {s.name for rows in read_trace(trace).slices.values() for s in rows}


def _instants(trace: Path) -> list[str]:
    return [i.name for rows in read_trace(trace).instants.values() for i in rows]


@pytest.mark.parametrize("decoder", ["dlfilter", "text"])
def test_a_perf_that_loops_forever_is_stopped_in_one_line(
    decoder: str, recording_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    """A recording whose header has a wrong data size (4 bytes changed): perf 6.1 loops
    without printing anything. ptscope stops it after the limit and says so."""
    rec = recording_copy("basics")
    damage_data_size(rec / "perf.data")
    out = tmp_path / "t.fxt.gz"
    env = environment(tmp_path, **{STALL: "1.5"})
    done = run(["decode", "--decoder", decoder, str(rec), "-o", str(out)], env, tmp_path)
    line = one_line_error(done, 3)
    assert "stopped making progress" in line and "perf.data" in line, line
    assert STALL in done.stderr  # how to wait longer
    assert not out.exists(), "nothing was decoded: no trace"
    assert leftovers(tmp_path, tmp_path) == []


def test_what_perf_decoded_before_it_stalled_is_written(
    recording_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    """perf decodes, then hangs with its output open: the trace holds what it decoded,
    with a [decode error] where it stops, and the error is the command's one line."""
    rec = recording_copy("basics")
    out = tmp_path / "t.fxt.gz"
    env = environment(tmp_path, **{STALL: "1"}, **standin_perf(tmp_path, "decodes-then-hangs"))
    args = ["decode", "-j", "1", "--decoder", "dlfilter", str(rec), "-o", str(out)]
    done = run(args, env, tmp_path)
    line = one_line_error(done, 3)
    assert "stopped making progress" in line and "holds what was decoded" in line, line
    assert f"wrote {out}" in done.stderr, done.stderr
    assert {"main", "fib"} <= _names(out)
    assert any(i.startswith("[decode error: decoding stopped: perf script") for i in _instants(out))
    assert leftovers(tmp_path, tmp_path) == []


def test_run_keeps_the_recording_and_the_partial_trace(
    recordings: Callable[[str], Path], tmp_path: Path
) -> None:
    from support import programs

    exe = programs.build("basics", static=True)
    rec, out = tmp_path / "rec", tmp_path / "t.fxt.gz"
    env = environment(tmp_path, **{STALL: "1"}, **standin_perf(tmp_path, "decodes-then-hangs"))
    args = ["run", "--backend", "emulated", "-j", "1", "--decoder", "dlfilter"]
    args += ["--keep-recording", str(rec)]
    done = run([*args, "-o", str(out), "--", str(exe), "3"], env, tmp_path)
    one_line_error(done, 3)
    assert "recording kept at" in done.stderr and f"wrote {out}" in done.stderr
    assert "main" in _names(out)
    again = run(
        ["decode", str(rec), "-o", str(tmp_path / "again.fxt.gz")], environment(tmp_path), tmp_path
    )
    assert again.code == 0, again.stderr
    assert leftovers(tmp_path, tmp_path) == []


def test_a_long_loop_without_calls_is_not_a_stall(
    recording_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    """Seconds of decoding with nothing to write (the dlfilter drops jumps inside main)
    count as progress: the dlfilter beats for every 65,536 samples."""
    rec = recording_copy("silent_loop")
    out = tmp_path / "t.fxt.gz"
    env = environment(tmp_path, **{STALL: "0.5"})
    args = ["decode", "-j", "1", "--decoder", "dlfilter", str(rec), "-o", str(out)]
    done = run(args, env, tmp_path)
    assert done.code == 0, done.stderr
    assert "main" in _names(out)


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_bad_limit_is_a_usage_error(
    value: str, recording_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    rec = recording_copy("basics")
    env = environment(tmp_path, **{STALL: value})
    args = ["decode", "--decoder", "dlfilter", str(rec), "-o", str(tmp_path / "t.fxt.gz")]
    done = run(args, env, tmp_path)
    assert STALL in one_line_error(done, 2)
