"""The default ``--jobs``: one window per free core beyond the engine's, none below three
free cores (on two, a second window never paid: bench/decode.py --peers), at most four."""

from __future__ import annotations

import pytest

from ptscope.decode.parallel import MAX_DEFAULT_JOBS, default_jobs


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
