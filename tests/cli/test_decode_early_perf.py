"""`ptscope decode` with perf's decoder starts perf before it imports its decoder
(decode/perf_launch.py): the pipeline's reader must take that perf over (not start a
second one) for every option that reaches perf's command line, the trace must be the one a
decode started the usual way writes, and a perf that nobody takes must not outlive the
command. With the own decoder (the default) nothing starts early."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ptscope.decode import perf_launch
from ptscope.pipeline import DecodeOptions, decode_recording
from ptscope.recording import Recording
from support import programs
from support.emulated_corpus import decode_case_recording

pytestmark = pytest.mark.slow

# Runs `ptscope decode` in a fresh interpreter (the CLI's main), noting whether numpy and
# which commands' modules were imported when the CLI started perf early; prints what
# happened as JSON.
_DRIVER = textwrap.dedent(
    """
    import json, sys
    from ptscope import cli
    from ptscope.decode import perf_launch

    seen = {"numpy_imported_first": None, "started": False, "commands_imported_first": None}
    start = perf_launch.start_early

    def watched(spec):
        seen["numpy_imported_first"] = "numpy" in sys.modules
        seen["commands_imported_first"] = sorted(
            name for name, _ in cli._COMMANDS if f"ptscope.cli.{name}" in sys.modules
        )
        start(spec)
        seen["started"] = perf_launch._early is not None

    perf_launch.start_early = watched
    code = cli.main(sys.argv[1:])
    seen["recorder_imported"] = "ptscope.record.emulated" in sys.modules
    print(json.dumps({**seen, "code": code, "counts": perf_launch.launch_counts()}))
    """
)


@pytest.fixture(scope="module")
def perf_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decode_case_recording("threads-pie", tmp_path_factory)


def _drive(*argv: str) -> tuple[dict[str, object], str]:
    """What the driver saw running ``ptscope ARGV``, and the command's stderr."""
    run = subprocess.run(
        [sys.executable, "-c", _DRIVER, *argv], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result, run.stderr


def _decode_early(perf_data: Path, out: Path, *options: str) -> dict[str, object]:
    result, stderr = _drive("decode", str(perf_data), "-o", str(out), *options)
    assert result["code"] == 0, stderr
    return result


def _first_pid_and_tid(perf_data: Path) -> tuple[int, int]:
    recording = Recording.find(perf_data)
    tids = sorted(recording.threads)
    assert len(tids) >= 2, recording.threads
    return min(recording.processes), tids[-1]


@pytest.mark.parametrize(
    "options",
    [
        # (with inlined frames perf reads the runs file the pipeline writes: nothing
        # starts early, test_nothing_starts_early_where_the_pipeline_would_not_take_it)
        ("--decoder", "dlfilter", "--no-inline"),
        ("--decoder", "dlfilter", "--no-inline", "--no-insn-detail", "--time-axis", "instructions"),
        ("--decoder", "dlfilter", "--no-inline", "--pid", "PID", "--no-drill"),
        ("--decoder", "dlfilter", "--no-inline", "--tid", "TID", "--symfs", "/"),
        ("--jobs", "1", "--decoder", "dlfilter", "--no-inline"),
    ],
    ids=["defaults", "no-insn-detail", "pid", "tid-symfs", "one-job"],
)
def test_the_pipeline_takes_the_perf_started_early_and_writes_the_same_trace(
    perf_data: Path, tmp_path: Path, options: tuple[str, ...]
) -> None:
    pid, tid = _first_pid_and_tid(perf_data)
    argv = [o.replace("PID", str(pid)).replace("TID", str(tid)) for o in options]
    early = tmp_path / "early.fxt"
    result = _decode_early(perf_data, early, *argv)
    assert result["started"], "perf was not started early"
    assert not result["numpy_imported_first"], "numpy was imported before perf started"
    # nor any other command's module (the recorders'...) but serve's, which holds the
    # --serve option every command that writes a trace has
    assert result["commands_imported_first"] == ["decode", "serve"]
    # nor, at all, the emulated recorder's modules: only an unfinished recording needs them
    assert Recording.find(perf_data).backend == "emulated"
    assert result["recorder_imported"] is False
    assert result["counts"] == {"started early": 1, "taken": 1, "discarded": 0}

    # The same decode, perf started by the pipeline (in this process nothing starts early).
    late = tmp_path / "late.fxt"
    decode_recording(
        Recording.find(perf_data),
        late,
        DecodeOptions(
            decoder="dlfilter",
            pids=(pid,) if "--pid" in options else (),
            tids=(tid,) if "--tid" in options else (),
            symfs=Path("/") if "--symfs" in options else None,
            insn_detail="--no-insn-detail" not in options,
            time_axis="instructions" if "--time-axis" in options else "time",
            drill=None if "--no-drill" in options else perf_data.resolve(),
            inline=False,
        ),
    )
    assert perf_launch.launch_counts()["taken"] == 0
    assert early.read_bytes() == late.read_bytes()


def test_nothing_starts_early_where_the_pipeline_would_not_take_it(
    perf_data: Path, tmp_path: Path
) -> None:
    for options in (
        (),
        ("--decoder", "text"),
        ("--decoder", "dlfilter", "--jobs", "2"),
        ("--decoder", "dlfilter"),  # (inlined frames: the pipeline writes perf's runs file)
    ):
        result = _decode_early(perf_data, tmp_path / "t.fxt", *options)
        assert not result["started"], options
        assert result["counts"] == {"started early": 0, "taken": 0, "discarded": 0}


def test_a_decode_that_fails_first_stops_its_early_perf(perf_data: Path, tmp_path: Path) -> None:
    """--filter is checked after perf started early: its error is one line, and the
    perf that no reader took does not outlive the command."""
    wrapper = tmp_path / "perf"
    pids = tmp_path / "pids"
    wrapper.write_text(f'#!/bin/sh\necho "$$ $1" >> {pids}\nexec perf "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PTSCOPE_PERF": str(wrapper)}
    argv = ["decode", str(perf_data), "-o", str(tmp_path / "t.fxt"), "--decoder", "dlfilter"]
    argv += ["--no-inline", "--filter", "only-one-name"]
    run = subprocess.run(
        [sys.executable, "-m", "ptscope", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert len(run.stderr.strip().splitlines()) <= 2, run.stderr  # the error, its hint
    runs = [line.split() for line in pids.read_text().splitlines()] if pids.exists() else []
    decodes = [int(pid) for pid, what in runs if what == "script"]
    assert decodes, "perf was not started early (the test would prove nothing)"
    for pid in decodes:
        assert _gone(pid), f"perf {pid} outlived the command"


def _gone(pid: int) -> bool:
    """The process is gone (or its pid was reused by a program that is not perf script)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"script" not in cmdline


def test_an_early_perf_nobody_takes_leaves_nothing_open(perf_data: Path) -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    tool = perf_launch.find_perf()
    perf_launch.start_early(perf_launch.launch_spec(perf_data, tool.path, task_events=True))
    launch = perf_launch._early
    assert launch is not None
    counts = perf_launch.launch_counts()
    perf_launch.discard_early()
    assert launch.proc.returncode is not None
    assert perf_launch.launch_counts()["discarded"] == counts["discarded"] + 1
    assert sorted(os.listdir("/proc/self/fd")) == before


def test_run_decodes_with_the_perf_it_started_early(tmp_path: Path) -> None:
    """`ptscope run` (and `attach`) start the decode's perf before the pipeline's imports
    too, once the program has run."""
    program = programs.build("leaf37", static=True)
    out = tmp_path / "t.fxt"
    args = ["--backend", "emulated", "--decoder", "dlfilter", "--no-inline", "-o", str(out)]
    result, stderr = _drive("run", *args, "--", str(program))
    assert result["code"] == 0, stderr
    assert result["started"]
    assert result["counts"] == {"started early": 1, "taken": 1, "discarded": 0}
    assert out.stat().st_size > 1000


def test_a_recording_whose_perf_data_is_gone_is_one_clear_error(
    perf_data: Path, tmp_path: Path
) -> None:
    """Nothing starts early for it, and the pipeline says what is wrong, as before."""
    copy = tmp_path / "rec"
    shutil.copytree(perf_data.parent, copy)
    (copy / perf_data.name).unlink()
    result, stderr = _drive("decode", str(copy), "-o", str(tmp_path / "t.fxt"))
    assert result["code"] != 0
    assert not result["started"]
    assert "no such file (the recording is incomplete)" in stderr
    assert "Traceback" not in stderr
