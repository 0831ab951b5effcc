"""The C engine on real recordings: emulated Intel PT of the test corpus, decoded by the real
perf with the dlfilter. Columnar batches through FastEngine give exactly what events through
the Python engine give, with one job, with time windows, and on a damaged trace."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ptscope import _native
from ptscope.decode.dlfilter_stream import (
    DlfilterRun,
    decode_with_dlfilter,
    decode_with_dlfilter_columnar,
)
from ptscope.decode.parallel import (
    decode_parallel,
    decode_parallel_columnar,
    feed_sink,
    plan_windows,
    read_trace_layout,
)
from ptscope.model import BranchBatch, DecodeError, LocationTable
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine
from support.emulated_corpus import damaged_copy, decode_case_recording
from support.engine_diff import assert_same

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not fast_engine.is_available(), reason="the C engine is not built"),
    pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built"),
    pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-x86_64 is missing"),
]

IDS = [
    "basics-static",
    "basics-pie",
    "tailcall-static",
    "longjmp-static",
    "signals-static",
    "exceptions-pie",
    "threads-pie",
    "fork-pie",
    "dlopen-pie",
]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {key: decode_case_recording(key, tmp_path_factory) for key in IDS}


def _compare(events: object, columns: object) -> TraceSegmentEngine:
    a = TraceSegmentEngine(keep_slots=True)
    feed_sink(a, events)  # type: ignore[arg-type]
    ta = a.finish()
    a.self_check(ta)
    b = FastEngine(keep_slots=True)
    feed_sink(b, columns)  # type: ignore[arg-type]
    tb = b.finish()
    b.self_check(tb)
    assert_same(a, ta, b, tb)
    assert ta.slice_count() > 50
    return a


@pytest.mark.parametrize("key", IDS)
def test_batches_through_the_c_engine_equal_events_through_python(
    recordings: dict[str, Path], key: str
) -> None:
    perf_data = recordings[key]
    columns = list(decode_with_dlfilter_columnar(perf_data, task_events=True))
    assert any(isinstance(b, BranchBatch) for items in columns for b in items)
    _compare(decode_with_dlfilter(perf_data, task_events=True), columns)


@pytest.mark.parametrize("key", IDS[:3] + IDS[6:7])
@pytest.mark.parametrize("jobs", [2, 3])
def test_time_windows_too(recordings: dict[str, Path], key: str, jobs: int) -> None:
    perf_data = recordings[key]
    windows = plan_windows(read_trace_layout(perf_data), jobs, min_window_bytes=1)
    assert len(windows) == jobs
    table = LocationTable()
    runs: list[DlfilterRun] = []
    a = _compare(
        decode_parallel(perf_data, windows=windows, task_events=True),
        decode_parallel_columnar(
            perf_data, windows=windows, task_events=True, locations=table, run_info=runs
        ),
    )
    assert a.stats.segments_started >= 1  # the windows were stitched
    # Inside its window, a window's runs of records are read in C, as a whole decode's
    # (on these short traces a window may have none that its edges leave whole).
    assert len(runs) == jobs and sum(run.stats.runs_in_c for run in runs) > 0
    # One table for every window: each location once.
    assert len({(x.ip, x.symbol, x.offset, x.dso) for x in table.locations}) == len(table)


@pytest.mark.parametrize("key", ["basics-static", "threads-pie"])
def test_damaged_trace(recordings: dict[str, Path], key: str, tmp_path: Path) -> None:
    damaged = damaged_copy(recordings[key], tmp_path / "perf.data")
    columns = list(decode_with_dlfilter_columnar(damaged))
    assert any(isinstance(e, DecodeError) for items in columns for e in items)
    a = _compare(decode_with_dlfilter(damaged), columns)
    assert a.stats.decode_errors
