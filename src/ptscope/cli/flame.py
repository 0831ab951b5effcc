"""``ptscope flame TRACE -o OUT.svg``: an interactive flame graph (or ``--chart``: a flame
chart) as one SVG file to open in a browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ptscope.cli.stats import add_selection_arguments, no_calls_in_window, selected_calls
from ptscope.errors import UsageError

if TYPE_CHECKING:
    from ptscope.analyze.flame import FlameModel

__all__ = ["FlameCommand"]


class FlameCommand:
    name = "flame"
    help = "write an interactive flame graph (or --chart: flame chart) as SVG"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_selection_arguments(parser)
        parser.add_argument(
            "-o",
            "--output",
            type=Path,
            default=Path("flame.svg"),
            help="SVG file to write (default flame.svg)",
        )
        parser.add_argument(
            "--chart",
            action="store_true",
            help="a flame chart: calls where and when they ran (time on the x axis, one "
            "band per thread) instead of stacks merged",
        )
        parser.add_argument(
            "--diff",
            action="store_true",
            help="a differential flame graph of two traces, BEFORE AFTER: AFTER's stacks, "
            "widths in instructions, each box red where its self instructions grew and blue "
            "where they shrank",
        )
        parser.add_argument("--title", help="title of the drawing (default: the kind and file)")

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.analyze.calls import format_ns
        from ptscope.analyze.flame import FlameChartAccumulator, FlameGraphAccumulator
        from ptscope.cli.base import check_output, reuse_freed_memory

        reuse_freed_memory()

        output = check_output(args.output)
        if args.diff:
            return self._diff(args, output)
        with selected_calls(args) as selection:
            calls = selection.calls
            window = selection.window
            accumulator: FlameChartAccumulator | FlameGraphAccumulator
            if args.chart:
                left = 0 if window is None else window.start
                right = calls.span if window is None or window.end is None else window.end
                accumulator = FlameChartAccumulator(
                    calls.names, selection.threads, left, min(right, calls.span)
                )
            else:
                accumulator = FlameGraphAccumulator(calls.names)
            count = 0
            for batch in selection.batches():
                accumulator.add(batch)
                count += len(batch) - batch.carried
            if not count:
                raise no_calls_in_window(selection)
            model = accumulator.model()
        kind = "Flame chart" if args.chart else "Flame graph"
        threads = len(selection.threads)
        where = ""
        if window is not None:
            until = "the end" if window.end is None else format_ns(window.end)
            where = f" (from {format_ns(window.start)} to {until})"
        merged = ""
        if model.merged:
            merged = (
                f"; {model.merged:,} calls narrower than a pixel drawn merged in "
                f"{model.merged_boxes:,} boxes"
            )
        subtitle = (
            f"{selection.label}: {count:,} calls on {threads} thread{'s' * (threads != 1)}, "
            f"{format_ns(model.base_ns)} in top-level calls{where}{merged}"
        )
        _write(output, model, args.title or kind, subtitle, "calls" if args.chart else "stacks")
        return 0

    def _diff(self, args: argparse.Namespace, output: Path) -> int:
        from ptscope.analyze.flame import FlameGraphAccumulator, differential_graph
        from ptscope.cli.base import parse_id_list
        from ptscope.cli.diff import read_batches

        if len(args.trace) != 2:
            raise UsageError(f"--diff takes two traces, BEFORE AFTER (not {len(args.trace)})")
        if args.chart or args.time:
            raise UsageError("--diff draws a flame graph of whole traces: no --chart or --time")
        tids = parse_id_list(args.tid, "--tid") if args.tid else ()
        sides: list[FlameGraphAccumulator] = []
        calls: list[int] = []
        for path in args.trace:
            with read_batches(path, tids) as (names, batches):
                accumulator = FlameGraphAccumulator(names, weight="instructions")
                count = 0
                for batch in batches:
                    accumulator.add(batch)
                    count += len(batch) - batch.carried
            sides.append(accumulator)
            calls.append(count)
        model, vanished = differential_graph(sides[0], sides[1])
        before, after = args.trace
        grew = sum(b.delta for b in model.boxes if b.delta is not None and b.delta > 0)
        shrank = sum(b.delta for b in model.boxes if b.delta is not None and b.delta < 0)
        subtitle = (
            f"{before} -> {after}: {calls[0]:,} -> {calls[1]:,} calls; self instructions "
            f"{grew:+,} in red, {shrank:+,} in blue"
            + (f", {-vanished:+,} in stacks {after} no longer has" if vanished else "")
        )
        _write(output, model, args.title or "Differential flame graph", subtitle, "stacks")
        return 0


def _write(output: Path, model: FlameModel, title: str, subtitle: str, what: str) -> None:
    from ptscope.analyze.flame_svg import render_svg
    from ptscope.errors import PtscopeError
    from ptscope.fxt.writer import write_whole

    svg = render_svg(model, title=title, subtitle=subtitle)
    try:
        write_whole(output, svg.encode())  # never a truncated SVG (a full disk)
    except OSError as e:
        raise PtscopeError(f"cannot write {output}: {e.strerror or e}") from e
    skipped = f" ({model.left_out:,} {what} too narrow to draw)" if model.left_out else ""
    sys.stderr.write(
        f"wrote {output}: {len(model.boxes):,} boxes{skipped}; open it in a web browser\n"
    )
