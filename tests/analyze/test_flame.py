"""Flame graphs and charts: boxes as wide as the obvious per-stack sums, laid out without
gaps or overlaps, and an SVG that is well-formed XML whatever the function names."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings

from ptscope.analyze.calls import load_calls
from ptscope.analyze.flame import Box, flame_chart, flame_graph
from ptscope.analyze.flame_svg import render_svg
from ptscope.fxt import write_timeline
from ptscope.timeline import Timeline
from support.stats_truth import stacks_truth, third_party_calls
from support.timeline_strategies import thread_of_rows, timelines

SVG = "{http://www.w3.org/2000/svg}"


def boxes_by_stack(boxes: list[Box]) -> dict[tuple[str, ...], Box]:
    """Rebuild each box's stack from the layout: its parent is the box one level down
    whose span holds it."""
    out: dict[tuple[str, ...], Box] = {}
    for box in boxes:
        parents = [p for p in boxes if p.depth < box.depth and p.x <= box.x
                   and box.x + box.width <= p.x + p.width]  # fmt: skip
        chain = sorted(parents, key=lambda p: p.depth)
        names = (*(p.name for p in chain), box.name)
        out[names] = box
    return out


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(timeline=timelines())
def test_graph_boxes_are_the_time_of_each_stack(tmp_path: Path, timeline: Timeline) -> None:
    assume(timeline.slice_count() > 0)
    path = tmp_path / "t.fxt"
    write_timeline(timeline, path)
    truth = stacks_truth(third_party_calls(path))
    model = flame_graph(load_calls(path), min_fraction=0, max_boxes=10**9)
    assert model.total == sum(w for stack, w in truth.items() if len(stack) == 1)
    # Boxes of no width are not drawn (nor is anything above them: no width either).
    assert model.left_out == sum(1 for w in truth.values() if w == 0)
    truth = {stack: w for stack, w in truth.items() if w > 0}
    assert {b.depth for b in model.boxes} == {len(s) - 1 for s in truth}
    # Siblings sit side by side from their parent's left edge, in name order.
    for depth in {b.depth for b in model.boxes}:
        row = sorted((b for b in model.boxes if b.depth == depth), key=lambda b: b.x)
        for a, b in itertools.pairwise(row):
            assert a.x + a.width <= b.x
    widths = sorted(b.width for b in model.boxes)
    assert widths == sorted(truth.values())
    rebuilt = {s: b.width for s, b in boxes_by_stack(model.boxes).items()}
    assert rebuilt == truth


def test_recursion_and_merging_in_a_graph(tmp_path: Path) -> None:
    timeline = Timeline(
        names=["main", "f", "g"],
        threads=[
            thread_of_rows(
                1,
                1,
                [(0, 100, 0, 0), (10, 40, 1, 1), (15, 30, 2, 1), (50, 90, 1, 2), (60, 70, 2, 1)],
            ),
            thread_of_rows(1, 2, [(0, 10, 0, 0), (2, 6, 1, 1)]),
        ],
    )
    path = tmp_path / "t.fxt"
    write_timeline(timeline, path)
    model = flame_graph(load_calls(path), min_fraction=0)
    got = {(b.depth, b.name, b.x, b.width, b.calls, b.self_ns) for b in model.boxes}
    assert got == {
        (0, "main", 0, 110, 2, 110 - 30 - 4 - 40),
        (1, "f", 0, 34, 2, 30 - 15 + 4),  # main>f from both threads, merged
        (2, "f", 0, 15, 1, 15),  # f>f: recursion is a stack, not double time
        (1, "g", 34, 40, 1, 30),
        (2, "f", 34, 10, 1, 10),
    }
    assert model.total == model.base_ns == 110


def test_chart_boxes_are_the_calls_at_their_time(tmp_path: Path) -> None:
    timeline = Timeline(
        names=["main", "f"],
        threads=[
            thread_of_rows(1, 1, [(100, 200, 0, 0), (120, 130, 1, 1)]),
            thread_of_rows(1, 2, [(150, 400, 0, 1)]),
        ],
    )
    path = tmp_path / "t.fxt"
    write_timeline(timeline, path)
    model = flame_chart(load_calls(path), min_fraction=0)
    assert model.total == 300 and model.lane_depths == [2, 1]
    assert {(b.lane, b.depth, b.name, b.x, b.width) for b in model.boxes} == {
        (0, 0, "main", 0, 100), (0, 1, "f", 20, 10), (1, 0, "f", 50, 250)
    }  # fmt: skip


def test_too_many_boxes_keeps_the_widest(tmp_path: Path) -> None:
    rows = [(i * 200, i * 200 + 1 + i, 0, i % 2) for i in range(100)]
    timeline = Timeline(names=["a", "b"], threads=[thread_of_rows(1, 1, rows)])
    path = tmp_path / "t.fxt"
    write_timeline(timeline, path)
    model = flame_chart(load_calls(path), min_fraction=0, max_boxes=10)
    assert len(model.boxes) == 10 and model.left_out == 90
    assert min(b.width for b in model.boxes) == 91


def test_svg_is_well_formed_whatever_the_names(tmp_path: Path) -> None:
    nasty = ['std::map<int, std::string>::operator[](int&&) "quoted" & more',
             "]]></script><script>alert(1)</script>", "ctl\x01\x1bchars\ufffe", "new\nline",
             "\udcff surrogate", "[untraced]"]  # fmt: skip
    rows = [(i * 10, i * 10 + 8, 0, i) for i in range(len(nasty))]
    timeline = Timeline(names=nasty, threads=[thread_of_rows(1, 1, rows)])
    path = tmp_path / "t.fxt"
    write_timeline(timeline, path)
    for model in (flame_graph(load_calls(path)), flame_chart(load_calls(path))):
        svg = render_svg(model, title="<t&t>", subtitle="a \"b\" 'c'")
        root = ET.fromstring(svg.encode("utf-8"))
        boxes = root.findall(f".//{SVG}g[@class='f']")
        assert len(boxes) == len(nasty)
        titles = [b.find(f"{SVG}title").text or "" for b in boxes]  # type: ignore[union-attr]
        first_lines = {t.split("\n")[0] for t in titles}
        assert 'std::map<int, std::string>::operator[](int&&) "quoted" & more' in first_lines
        assert "]]></script><script>alert(1)</script>" in first_lines
        assert "new line" in first_lines  # a name never spans two title lines
        assert len(root.findall(f".//{SVG}script")) == 1
        assert root.find(f".//{SVG}text[@class='title']").text == "<t&t>"  # type: ignore[union-attr]
        fills = {b.find(f"{SVG}rect").get("fill") for b in boxes}  # type: ignore[union-attr]
        assert "#a9bccf" in fills and len(fills) > 2  # pseudo-frames grey, others warm
