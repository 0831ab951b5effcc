"""Every thread of an emulated recording has its real thread id, in every run (issue 14:
QEMU's strace lines of several threads interleave, and clone results went to the wrong
call: 2 runs in 21 invented ids such as 15 or 4194305).

The ground truth is the program's own: each thread writes what gettid() returned.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.perftool import find_perf
from ptscope.record.emulated import record
from support import programs
from support.emulated_corpus import needs_tools, perf_branches

pytestmark = pytest.mark.slow

RUNS = 30


def test_thread_ids_are_the_real_ones_in_every_run(tmp_path: Path) -> None:
    needs_tools()
    exe = str(programs.build("thread_ids", static=True))
    wrong: list[str] = []
    for run in range(RUNS):
        directory, truth = tmp_path / f"run{run}", tmp_path / f"tids{run}"
        result = record([exe, "4", str(truth)], directory)
        real = sorted(int(line) for line in truth.read_text().split())
        assert len(real) == 5 and result.exit_code == 0
        recorded = sorted(result.recording.threads)
        if recorded != real:
            wrong.append(f"run {run}: recorded {recorded}, the threads were {real}")
        elif run == 0:
            # perf sees the same threads, each with its own branches.
            find_perf()
            assert sorted(perf_branches(directory / "perf.data").by_tid) == real
    assert not wrong, f"{len(wrong)} of {RUNS} runs:\n" + "\n".join(wrong)
