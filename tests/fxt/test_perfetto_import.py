"""What Perfetto's FXT importer keeps: the oracle that replays a trace as the importer does
(``support.perfetto_import``), on traces written in a chosen order."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from ptscope.fxt import FxtWriter
from support.perfetto_import import (
    MAX_DEPTH,
    OVERLAP,
    TOO_DEEP,
    ImportResult,
    assert_perfetto_keeps_everything,
    drops_in,
    events_of,
    replay,
)

NAMES = ["main", "f", "g", "h"]


def _write(path: Path, rows: list[tuple[int, int, int]], instants: tuple[int, ...] = ()) -> None:
    """(start, end, name id) slices of one thread in this file order, then instants."""
    with FxtWriter.open(path, compress=False, time_base=0) as writer:
        writer.process(1, "p")
        for start, end, name in rows:  # one call each: the file order is the rows'
            writer.slices(1, 2, NAMES, [start], [end], [name])
        for time in instants:
            writer.instant(1, 2, time, "i", {})


def _imported(path: Path) -> ImportResult:
    return replay(events_of(path))


def _depths(result: ImportResult) -> list[tuple[str, int, int, int]]:
    return sorted((e.name, e.start, e.end, depth) for e, depth in result.kept)


def test_a_parent_written_after_a_child_that_starts_with_it_is_dropped(tmp_path: Path) -> None:
    _write(tmp_path / "t.fxt", [(10, 20, 1), (10, 50, 0)])
    result = _imported(tmp_path / "t.fxt")
    ((drop,),) = [result.dropped]
    assert (drop.reason, drop.event.name, drop.conflict and drop.conflict.name) == (
        OVERLAP,
        "main",
        "f",
    )
    # Written first, it is the parent; with another start, the file order does not matter.
    _write(tmp_path / "u.fxt", [(10, 50, 0), (10, 20, 1)])
    _write(tmp_path / "v.fxt", [(11, 20, 1), (10, 50, 0)])
    for name in ("u.fxt", "v.fxt"):
        result = _imported(tmp_path / name)
        assert not result.dropped
        assert {(e.name, d) for e, d in result.kept} == {("main", 0), ("f", 1)}


def test_only_slices_that_nest_are_kept(tmp_path: Path) -> None:
    _write(
        tmp_path / "t.fxt",
        [
            (0, 100, 0),
            (10, 100, 1),  # ends with its parent: inside it
            (20, 30, 2),
            (30, 40, 2),  # starts where its sibling ends: closes it
            (35, 120, 3),  # ends after the one it starts in
            (100, 100, 1),  # empty, where its parents end: they are closed, it is not inside
        ],
    )
    result = _imported(tmp_path / "t.fxt")
    assert [(d.reason, d.event.start, d.event.end) for d in result.dropped] == [(OVERLAP, 35, 120)]
    assert _depths(result) == [
        ("f", 10, 100, 1),
        ("f", 100, 100, 0),
        ("g", 20, 30, 2),
        ("g", 30, 40, 2),
        ("main", 0, 100, 0),
    ]


def test_instants_are_empty_slices_that_stack_on_each_other(tmp_path: Path) -> None:
    _write(tmp_path / "t.fxt", [(0, 10, 0), (10, 20, 0)], instants=(5, 10, 10, 20))
    result = _imported(tmp_path / "t.fxt")
    assert not result.dropped
    instants = sorted((e.start, d) for e, d in result.kept if e.instant)
    # In a slice: its child; at the end of one and the start of the next: inside the
    # next, and the second at that time on top of the first; at a slice's end: outside.
    assert instants == [(5, 1), (10, 1), (10, 2), (20, 0)]


def test_past_the_depth_limit_slices_are_dropped(tmp_path: Path) -> None:
    n = MAX_DEPTH + 3
    _write(tmp_path / "t.fxt", [(i, 2 * n - i, i % 4) for i in range(n)])
    result = _imported(tmp_path / "t.fxt")
    assert len(result.kept) == MAX_DEPTH
    assert Counter(d.reason for d in result.dropped) == {TOO_DEEP: 3}
    assert drops_in("t", result, max_depth_ok=True) == ""
    with pytest.raises(AssertionError, match="slice_max_depth_exceeded"):
        assert_perfetto_keeps_everything(tmp_path / "t.fxt")


def test_threads_do_not_meet(tmp_path: Path) -> None:
    with FxtWriter.open(tmp_path / "t.fxt", compress=False, time_base=0) as writer:
        writer.process(1, "p")
        writer.slices(1, 2, NAMES, [10], [20], [1])
        writer.slices(1, 3, NAMES, [10], [50], [0])  # would be dropped on thread 2
        writer.slices(1, 2, NAMES, [15], [30], [2])  # overlaps its thread's slice
    result = _imported(tmp_path / "t.fxt")
    assert [(d.event.track, d.event.start) for d in result.dropped] == [((1, 2), 15)]
