"""The streamed analyses (bounded memory: the trace sorted in runs, merged, nested batch by
batch) against the in-memory ones they replace, on random traces written in start order and
in a shuffled order (as the streaming engine writes calls: when they return), with runs and
merge windows small enough that every batch boundary case is hit."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope.analyze.calls import ThreadInfo, TimeWindow, load_calls
from ptscope.analyze.flame import FlameGraphAccumulator, flame_graph
from ptscope.analyze.stats import (
    DurationHistogram,
    StatsAccumulator,
    _exact_quantiles,
    function_stats,
)
from ptscope.analyze.stream import CallStream
from ptscope.cli.dump import dump_lines, write_dump
from ptscope.errors import BadInputError
from ptscope.fxt import read_trace, write_timeline
from ptscope.timeline import Instant, ThreadTimeline, Timeline
from support.timeline_strategies import timelines

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


def shuffled(timeline: Timeline, seed: int) -> Timeline:
    """The same calls in another file order: groups of equal starts keep theirs (a parent
    before a child that starts with it, as Perfetto needs), the rest is shuffled."""
    rng = np.random.default_rng(seed)
    threads = []
    for t in timeline.threads:
        n = len(t.start)
        if not n:
            threads.append(t)
            continue
        _, group = np.unique(t.start, return_inverse=True)
        order = np.lexsort((np.arange(n), rng.permutation(group.max() + 1)[group]))
        threads.append(
            dataclasses.replace(
                t,
                **{
                    f: getattr(t, f)[order]
                    for f in (
                        "start",
                        "end",
                        "depth",
                        "name_id",
                        "address",
                        "instructions",
                        "cycles",
                        "flags",
                    )
                },
            )
        )
    return Timeline(names=timeline.names, threads=threads, processes=timeline.processes)


def streamed_stats(path: Path, run_rows: int, window: TimeWindow | None = None) -> object:
    with CallStream([path], run_rows=run_rows, window_rows=max(run_rows // 3, 1)) as calls:
        threads = calls.threads()
        stats = StatsAccumulator(calls.names, exact=True)
        bounds = None if window is None else (window.start, window.end)
        for batch in calls.batches(threads, window=bounds):
            stats.add(batch)
        return stats.report([ThreadInfo(t.pid, t.tid, t.name, t.process) for t in threads])


def as_table(report: object) -> dict[str, tuple[int, ...]]:
    functions = report.functions  # type: ignore[attr-defined]
    return {
        f.name: (f.calls, f.total_ns, f.self_ns, f.p50_ns, f.p90_ns, f.p99_ns, f.max_ns)
        for f in functions
    }


@SETTINGS
@given(timelines(), st.integers(0, 2**32), st.sampled_from([3, 7, 50, 1 << 20]))
def test_streamed_stats_equal_the_in_memory_ones(
    tmp_path_factory: pytest.TempPathFactory, timeline: Timeline, seed: int, run_rows: int
) -> None:
    path = tmp_path_factory.mktemp("s") / "t.fxt.gz"
    write_timeline(shuffled(timeline, seed), path)
    if not any(len(t.start) for t in timeline.threads):
        return
    exact = function_stats(load_calls(path))
    streamed = streamed_stats(path, run_rows)
    assert as_table(streamed) == as_table(exact)
    assert streamed.calls == exact.calls  # type: ignore[attr-defined]
    assert streamed.top_level_ns == exact.top_level_ns  # type: ignore[attr-defined]
    span = load_calls(path).span
    window = TimeWindow(span // 3, span // 3 + span // 2 + 1)
    try:
        clipped = function_stats(load_calls(path, window=window))
    except BadInputError:  # nothing in the window
        assert not streamed_stats(path, run_rows, window).calls  # type: ignore[attr-defined]
        return
    assert as_table(streamed_stats(path, run_rows, window)) == as_table(clipped)


@SETTINGS
@given(timelines(), st.integers(0, 2**32), st.sampled_from([3, 7, 1 << 20]))
def test_streamed_flame_graph_and_dump_equal_the_in_memory_ones(
    tmp_path_factory: pytest.TempPathFactory, timeline: Timeline, seed: int, run_rows: int
) -> None:
    for k, t in enumerate(timeline.threads):  # instants between and at slice starts
        starts = t.start.tolist()
        t.instants = [Instant(s + (k % 2), f"mark{j}") for j, s in enumerate(starts[:5])]
    path = tmp_path_factory.mktemp("f") / "t.fxt.gz"
    write_timeline(shuffled(timeline, seed), path)
    with CallStream([path], run_rows=run_rows, window_rows=2) as calls:
        graph = FlameGraphAccumulator(calls.names)
        for batch in calls.batches():
            graph.add(batch)
        model = graph.model(min_fraction=0, max_boxes=10**9)
    if any(len(t.start) for t in timeline.threads):
        old = flame_graph(load_calls(path), min_fraction=0, max_boxes=10**9)
        assert sorted(map(dataclasses.astuple, model.boxes)) == sorted(
            map(dataclasses.astuple, old.boxes)
        )
    for instants in (False, True):
        out = io.StringIO()
        write_dump([path], out, instants=instants)
        text = out.getvalue()
        assert text == "".join(
            line + "\n" for line in dump_lines(read_trace(path), instants=instants)
        )


def test_a_trace_in_several_runs_is_merged_in_start_order(tmp_path: Path) -> None:
    # 3,000 calls of `leaf` under one `main`, written as they return (main last): with
    # runs of 100 slices, main is in the last run and every leaf call must still be its
    # child.
    n = 3000
    start = np.concatenate(([0], 10 + 10 * np.arange(n)))
    end = np.concatenate(([10 * n + 20], 15 + 10 * np.arange(n)))
    order = np.concatenate((np.arange(1, n + 1), [0]))
    thread = ThreadTimeline(
        pid=1,
        tid=1,
        start=start[order],
        end=end[order],
        depth=np.where(order == 0, 0, 1).astype(np.int32),
        name_id=np.where(order == 0, 0, 1).astype(np.int32),
        address=np.zeros(n + 1, dtype=np.uint64),
        instructions=np.full(n + 1, -1, dtype=np.int64),
        cycles=np.full(n + 1, -1, dtype=np.int64),
        flags=np.zeros(n + 1, dtype=np.uint8),
    )
    path = tmp_path / "t.fxt.gz"
    write_timeline(Timeline(names=["main", "leaf"], threads=[thread]), path)
    with CallStream([path], run_rows=100, window_rows=16) as calls:
        assert len(calls.runs) == 31
        depths = np.concatenate([b.depth[b.carried :] for b in calls.batches()])
    assert depths.tolist() == [0] + [1] * n
    report = streamed_stats(path, 100)
    table = as_table(report)
    assert table["main"][:3] == (1, 10 * n + 20, 10 * n + 20 - 5 * n)
    assert table["leaf"][:3] == (n, 5 * n, 5 * n)


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.integers(0, 1 << 50), min_size=1, max_size=300), st.integers(1, 4))
def test_histogram_percentiles_are_within_their_bound(values: list[int], names: int) -> None:
    dur = np.asarray(values, dtype=np.int64)
    name = (np.arange(len(dur)) % names).astype(np.int32)
    count = np.bincount(name, minlength=names).astype(np.int64)
    longest = np.zeros(names, dtype=np.int64)
    np.maximum.at(longest, name, dur)
    histogram = DurationHistogram()
    histogram.add(name, dur)
    got = histogram.quantiles(count, longest)
    want = _exact_quantiles(name, dur, count)[:3]
    for g, w in zip(got, want, strict=True):
        assert np.all(np.abs(g - w) <= 0.004 * w + 1), (g, w)


@pytest.mark.parametrize("case", ["basics-static", "threads-pie", "signals-static", "fork-pie"])
def test_streamed_stats_on_the_corpus(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, case: str
) -> None:
    """Real traces: calls, totals and self times exactly as the in-memory computation,
    percentiles within the README's bound (0.4 %)."""
    from ptscope.pipeline import decode_recording
    from ptscope.recording import Recording
    from support.emulated_corpus import decode_case_recording

    perf_data = decode_case_recording(case, tmp_path_factory)
    trace = tmp_path / "t.fxt.gz"
    decode_recording(Recording.load(perf_data.parent), trace)
    exact = {f.name: f for f in function_stats(load_calls(trace)).functions}
    with CallStream([trace], run_rows=4096, window_rows=512) as calls:
        threads = calls.threads()
        stats = StatsAccumulator(calls.names)
        for batch in calls.batches(threads):
            stats.add(batch)
    streamed = {f.name: f for f in stats.report([]).functions}
    assert set(streamed) == set(exact)
    for name, want in exact.items():
        got = streamed[name]
        assert (got.calls, got.total_ns, got.self_ns, got.max_ns) == (
            want.calls, want.total_ns, want.self_ns, want.max_ns
        ), name  # fmt: skip
        for g, w in (
            (got.p50_ns, want.p50_ns),
            (got.p90_ns, want.p90_ns),
            (got.p99_ns, want.p99_ns),
        ):
            assert abs(g - w) <= 0.004 * w + 1, (name, g, w)
