"""What ptscope says of sampled data with nothing wrong in it (issue 44): a ``perf record
-g`` perf.data made outside ptscope is decoded as the sampling backend's recordings are,
and attaching to an idle process says that it was idle, never that the trace data may be
damaged. Real perf, real processes."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from ptscope.perftool import perf_env
from support.cli import one_line_error, ptscope
from support.programs import build

pytestmark = pytest.mark.slow


def test_a_perf_record_g_perf_data_is_decoded_as_sampled_stacks(tmp_path: Path) -> None:
    perf = shutil.which("perf")
    if perf is None:
        pytest.skip("perf is not installed")
    perf_data = tmp_path / "perf.data"
    recorded = subprocess.run(
        [perf, "record", "-g", "-o", str(perf_data), "--", str(build("exit_status")), "0", "300"],
        capture_output=True,
        text=True,
        env=perf_env(),
        timeout=120,
    )
    if recorded.returncode != 0:
        pytest.skip(f"perf record -g cannot sample here: {recorded.stderr.strip()[-200:]}")
    out = tmp_path / "t.fxt.gz"
    done = ptscope("decode", str(perf_data), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "damaged" not in done.stderr and "all zero bytes" not in done.stderr
    names = {s.name for rows in read_trace(out).slices.values() for s in rows}
    assert {"main", "work"} <= names, names


def test_attaching_to_an_idle_process_says_it_was_idle(tmp_path: Path) -> None:
    idle = subprocess.Popen(["sleep", "60"])
    try:
        attach = subprocess.Popen(
            [
                *(sys.executable, "-m", "ptscope", "attach", "-p", str(idle.pid)),
                *("--backend", "sampling", "-o", str(tmp_path / "t.fxt.gz")),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TMPDIR": str(tmp_path)},
        )
        assert attach.stderr is not None
        deadline = time.monotonic() + 60
        while "attached to" not in attach.stderr.readline():
            assert attach.poll() is None and time.monotonic() < deadline, "never attached"
        time.sleep(1.0)
        attach.send_signal(signal.SIGINT)
        stdout, stderr = attach.communicate(timeout=120)
    finally:
        idle.kill()
        idle.wait()
    done = subprocess.CompletedProcess(attach.args, attach.returncode, stdout, stderr)
    line = one_line_error(done, code=3)
    assert "no samples in it: the process was idle while recorded" in line, line
    assert "damaged" not in stderr and "all zero bytes" not in stderr, stderr
