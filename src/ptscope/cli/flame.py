"""``ptscope flame TRACE -o OUT.svg``: an interactive flame graph (or ``--chart``: a flame
chart) as one SVG file to open in a browser."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ptscope.cli.stats import add_selection_arguments, load_selected_calls

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
        parser.add_argument("--title", help="title of the drawing (default: the kind and file)")

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.analyze.calls import format_ns
        from ptscope.analyze.flame import flame_chart, flame_graph
        from ptscope.analyze.flame_svg import render_svg
        from ptscope.cli.base import check_output
        from ptscope.errors import PtscopeError

        output = check_output(args.output)
        calls, window = load_selected_calls(args)
        model = flame_chart(calls) if args.chart else flame_graph(calls)
        kind = "Flame chart" if args.chart else "Flame graph"
        threads = len(calls.threads)
        where = ""
        if window is not None:
            until = "the end" if window.end is None else format_ns(window.end)
            where = f" (from {format_ns(window.start)} to {until})"
        subtitle = (
            f"{args.trace}: {len(calls):,} calls on {threads} thread{'s' * (threads != 1)}, "
            f"{format_ns(model.base_ns)} in top-level calls{where}"
        )
        svg = render_svg(model, title=args.title or kind, subtitle=subtitle)
        try:
            output.write_text(svg, encoding="utf-8")
        except OSError as e:
            raise PtscopeError(f"cannot write {output}: {e.strerror or e}") from e
        what = "calls" if args.chart else "stacks"
        skipped = f" ({model.left_out:,} {what} too narrow to draw)" if model.left_out else ""
        sys.stdout.write(
            f"wrote {output}: {len(model.boxes):,} boxes{skipped}; open it in a web browser\n"
        )
        return 0
