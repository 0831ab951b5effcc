"""The default ``--jobs``: one window per free core beyond the engine's, none below three
free cores (on two, a second window never paid: bench/decode.py --peers), at most six,
none for a perf.data under 32 MiB, and no more than the trace has 8 MiB of perf.data
(bench/decode.py --scaling on 16 cores)."""

from __future__ import annotations

import pytest

from ptscope.decode.parallel import MAX_DEFAULT_JOBS, default_jobs
from ptscope.decode.perf_launch import WINDOW_MIN_BYTES, WINDOWS_FROM_BYTES


@pytest.mark.parametrize(
    ("cpus", "load", "jobs"),
    [
        (1, 0.0, 1),
        (2, 0.0, 1),  # the CI machine: one job
        (3, 0.0, 2),
        (4, 0.0, 3),
        (16, 0.0, MAX_DEFAULT_JOBS),
        (16, 13.9, 2),  # 13 cores busy: 3 free
        (16, 14.0, 1),
        (4, 7.5, 1),  # overloaded
    ],
)
def test_the_default_follows_the_free_cores(cpus: int, load: float, jobs: int) -> None:
    assert default_jobs(cpus, load) == jobs


def test_the_default_on_this_machine_is_a_valid_job_count() -> None:
    assert 1 <= default_jobs() <= MAX_DEFAULT_JOBS


@pytest.mark.parametrize(
    ("cpus", "trace_mb", "jobs"),
    [
        (16, 1, 1),  # a small trace: one job, whatever the cores
        (16, 12.5, 1),  # the 60k bench trace
        (16, 31.9, 1),  # under 32 MiB: one job
        (16, 40, 5),
        (16, 52, 6),  # the 300k one: 6 windows of 9 MB paid 1.28x on 16 cores
        (16, 121.6, MAX_DEFAULT_JOBS),  # the 700k one
        (2, 500, 1),  # a long trace on two cores: still one
        (4, 500, 3),
    ],
)
def test_the_default_follows_the_traces_size(cpus: int, trace_mb: float, jobs: int) -> None:
    size = int(trace_mb * (1 << 20))
    assert default_jobs(cpus, 0.0, size) == jobs
    assert default_jobs(cpus, 0.0, None) >= jobs  # (unknown size: the cores decide)
    assert default_jobs(cpus, 0.0, WINDOW_MIN_BYTES - 1) == 1
    assert default_jobs(cpus, 0.0, WINDOWS_FROM_BYTES - 1) == 1
    assert default_jobs(cpus, 0.0, 1 << 40) <= MAX_DEFAULT_JOBS


def test_free_cores_count_what_runs_now_not_only_the_minute_s_average() -> None:
    """A task spinning now counts (procs_running), and a load that has ended does not
    count for the minute the average remembers it: the cores free by default are never
    more than the average's, nor than what runs now leaves (ptscope run's QEMU had made a
    decode right after it think no core was idle)."""
    import os
    import subprocess
    import sys

    from ptscope.decode import perf_launch

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        now = perf_launch._running_besides_us()
        assert now is not None and now >= 1  # at least the spinner
        cpus = 1000
        assert perf_launch.free_cores(cpus) >= cpus - int(os.getloadavg()[0]) - 1
        assert perf_launch.free_cores(cpus) <= cpus - min(int(os.getloadavg()[0]), 1)
        assert perf_launch.free_cores(cpus, 3.5) == cpus - 3  # (an explicit load as it is)
    finally:
        spinner.kill()
        spinner.wait()
