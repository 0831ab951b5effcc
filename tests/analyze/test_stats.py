"""Per-function statistics: recursion counted once, self time, percentiles, time windows,
thread selection — against the obvious computation on what the third-party ``fxt``
reader reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ptscope.analyze.calls import TimeWindow, load_calls, parse_time_window
from ptscope.analyze.stats import FunctionStats, function_stats, select_functions
from ptscope.errors import BadInputError, UsageError
from ptscope.fxt import write_timeline
from ptscope.timeline import Timeline
from support.stats_truth import clip, function_truth, third_party_calls
from support.timeline_strategies import thread_of_rows, timelines

F, G, H = 0, 1, 2
RECURSIVE = Timeline(
    names=["f", "g", "h"],
    threads=[
        # f [0,100] > f [10,60] > f [20,30];  f > g [70,90] > f [75,80];  h [100,101]
        thread_of_rows(
            1,
            1,
            [
                (0, 100, 0, F),
                (10, 60, 1, F),
                (20, 30, 2, F),
                (70, 90, 1, G),
                (75, 80, 2, F),
                (100, 101, 0, H),
            ],
        ),
        # mutual recursion: g [0,50] > f [5,45] > g [10,40] > f [15,20]
        thread_of_rows(1, 2, [(0, 50, 0, G), (5, 45, 1, F), (10, 40, 2, G), (15, 20, 3, F)]),
    ],
)


def stats_of(tmp_path: Path, timeline: Timeline, **kw: object) -> dict[str, FunctionStats]:
    path = tmp_path / "t.fxt.gz"
    write_timeline(timeline, path)
    report = function_stats(load_calls(path, **kw))  # type: ignore[arg-type]
    return {f.name: f for f in report.functions}


def test_recursion_counts_only_the_outermost_call(tmp_path: Path) -> None:
    stats = stats_of(tmp_path, RECURSIVE)
    f, g, h = stats["f"], stats["g"], stats["h"]
    assert f.calls == 6 and g.calls == 3 and h.calls == 1
    # f: thread 1 its outer call [0,100]; thread 2 [5,45] (the inner f is inside it).
    assert f.total_ns == 100 + 40
    # g: thread 1 [70,90]; thread 2 [0,50] (the inner g inside it).
    assert g.total_ns == 20 + 50
    assert f.self_ns == (100 - 50 - 20) + (50 - 10) + 10 + 5 + (40 - 30) + 5
    assert g.self_ns == (20 - 5) + (50 - 40) + (30 - 5)
    assert h.total_ns == h.self_ns == 1
    assert f.max_ns == 100
    durations = [100, 50, 10, 5, 40, 5]
    assert f.p50_ns == round(float(np.percentile(durations, 50)))
    assert f.p90_ns == round(float(np.percentile(durations, 90)))
    assert f.p99_ns == round(float(np.percentile(durations, 99)))


def test_time_window_clips_calls_and_tid_selects_threads(tmp_path: Path) -> None:
    stats = stats_of(tmp_path, RECURSIVE, window=TimeWindow(25, 78), tids=(1,))
    f, g = stats["f"], stats["g"]
    # Clipped: f [25,78], f [25,60], f [25,30], g [70,78], f [75,78].
    assert f.calls == 4 and g.calls == 1 and "h" not in stats
    assert f.total_ns == 53 and g.total_ns == 8
    assert f.self_ns == (53 - 35 - 8) + (35 - 5) + 5 + 3


def test_the_cli_offers_every_sort_key() -> None:
    from ptscope.analyze.stats import SORT_KEYS
    from ptscope.cli.stats import SORT_KEYS as CLI_SORT_KEYS

    assert CLI_SORT_KEYS == SORT_KEYS  # kept apart so that the CLI starts without numpy


def test_selection_sorts_filters_and_cuts(tmp_path: Path) -> None:
    path = tmp_path / "t.fxt"
    write_timeline(RECURSIVE, path)
    report = function_stats(load_calls(path))
    assert [f.name for f in select_functions(report)] == ["f", "g", "h"]
    assert [f.name for f in select_functions(report, sort="self")] == ["f", "g", "h"]
    assert [f.name for f in select_functions(report, sort="name", top=2)] == ["f", "g"]
    assert [f.name for f in select_functions(report, sort="calls", match="^[gh]$")] == ["g", "h"]
    assert report.top_level_ns == 101 + 50
    with pytest.raises(UsageError, match="not a regular expression"):
        select_functions(report, match="(")


@pytest.mark.parametrize(
    ("text", "window"),
    [("10ms,25ms", (10_000_000, 25_000_000)), (",2s", (0, 2_000_000_000)),
     ("1.5us,", (1500, None)), ("100,200ns", (100, 200)), (" .5 ms , 1ms", (500_000, 1_000_000))],
)  # fmt: skip
def test_time_windows_parse(text: str, window: tuple[int, int | None]) -> None:
    assert parse_time_window(text) == TimeWindow(*window)


@pytest.mark.parametrize("text", ["5ms", "a,b", "5ms,1ms", "1h,2h", "1,2,3"])
def test_bad_time_windows_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_time_window(text)


def test_nothing_to_analyse_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.fxt"
    write_timeline(Timeline(), path)
    with pytest.raises(BadInputError, match="no slices"):
        load_calls(path)
    path = tmp_path / "t.fxt"
    write_timeline(RECURSIVE, path)
    with pytest.raises(BadInputError, match="no thread 7"):
        load_calls(path, tids=(7,))
    with pytest.raises(BadInputError, match="no calls in that time window"):
        load_calls(path, window=TimeWindow(500, 600))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(timeline=timelines(), cut=st.tuples(st.integers(0, 60), st.integers(0, 200)))
def test_random_traces_match_the_obvious_computation(
    tmp_path: Path, timeline: Timeline, cut: tuple[int, int]
) -> None:
    assume(timeline.slice_count() > 0)
    path = tmp_path / "t.fxt.gz"
    write_timeline(timeline, path)
    calls = third_party_calls(path)
    for window in (None, TimeWindow(cut[0], cut[0] + cut[1] + 1)):
        if window is None:
            truth = function_truth(calls)
        else:
            truth = function_truth(clip(calls, window.start, window.end))
        if not truth:
            continue
        got = {f.name: f for f in function_stats(load_calls(path, window=window)).functions}
        assert set(got) == set(truth)
        for name, t in truth.items():
            want = (t.calls, t.total, t.self_time, t.percentile(50), t.percentile(90),
                    t.percentile(99), max(t.durations))  # fmt: skip
            f = got[name]
            assert (f.calls, f.total_ns, f.self_ns, f.p50_ns, f.p90_ns, f.p99_ns, f.max_ns) == want


def test_the_table_shows_bracketed_names_as_they_are(tmp_path: Path) -> None:
    """`[syscall]` and `[unknown] (DSO)` are names, not the table library's markup."""
    from support.cli import ptscope

    timeline = Timeline(
        names=["main", "[syscall]", "[unknown] (/lib/libc.so.6)", "[bold]x[/bold]"],
        threads=[thread_of_rows(1, 1, [(0, 100, 0, 0), (10, 20, 1, 1), (30, 40, 1, 2),
                                       (50, 60, 1, 3)])],
    )  # fmt: skip
    path = tmp_path / "t.fxt.gz"
    write_timeline(timeline, path)
    result = ptscope("stats", str(path))
    assert result.returncode == 0, result.stderr
    names = [line.split("  ")[0] for line in result.stdout.splitlines()[2:]]
    # (equal totals: in name order)
    assert names == ["main", "[bold]x[/bold]", "[syscall]", "[unknown] (/lib/libc.so.6)"]
