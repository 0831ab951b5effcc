"""``ptscope stats TRACE``: which function took the time, and how are its calls spread?"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ptscope.cli.base import non_negative_int, parse_id_list, reading_trace

if TYPE_CHECKING:
    from ptscope.analyze.calls import ThreadInfo, TimeWindow
    from ptscope.analyze.stats import FunctionStats, StatsReport
    from ptscope.analyze.stream import CallBatch, CallStream, StreamThread
    from ptscope.errors import PtscopeError

__all__ = [
    "Selection",
    "StatsCommand",
    "add_listing_arguments",
    "add_selection_arguments",
    "selected_calls",
]

SORT_KEYS = ("total", "self", "calls", "p50", "p90", "p99", "max", "name")
"""analyze.stats.SORT_KEYS, spelled out here: building the parser must not import numpy."""


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """TRACE, --tid and --time: what `stats` and `flame` look at."""
    parser.add_argument(
        "trace",
        metavar="TRACE",
        type=Path,
        nargs="+",
        help="a .fxt or .fxt.gz trace (several: the parts of a split trace, read as one)",
    )
    parser.add_argument("--tid", metavar="TID[,TID...]", help="only these threads")
    parser.add_argument(
        "--time",
        metavar="START,END",
        help="only this stretch, from the trace's first event: e.g. 10ms,25ms or ,2s "
        "(units ns, us, ms, s; calls are clipped to it)",
    )


def add_listing_arguments(parser: argparse.ArgumentParser) -> None:
    """--top and --match: which functions `stats` and `diff` list; --wide: how."""
    parser.add_argument(
        "--top",
        type=non_negative_int,
        default=25,
        metavar="N",
        help="show the first N functions (default 25; 0: all)",
    )
    parser.add_argument(
        "--match", metavar="REGEX", help="only functions whose name matches (re.search)"
    )
    parser.add_argument(
        "--wide",
        action="store_true",
        help="the table with every column and whole names, however wide (by default it "
        "fits the terminal: long names shortened in the middle, the least useful columns "
        "left out)",
    )


@dataclass
class Selection:
    """What `stats` and `flame` read: the trace's calls (streamed), the threads and the
    time window chosen."""

    calls: CallStream
    threads: list[StreamThread]
    window: TimeWindow | None
    label: str

    def batches(self) -> Iterator[CallBatch]:
        window = None if self.window is None else (self.window.start, self.window.end)
        return self.calls.batches(self.threads, window=window)

    def thread_infos(self) -> list[ThreadInfo]:
        from ptscope.analyze.calls import ThreadInfo

        return [ThreadInfo(t.pid, t.tid, t.name, t.process) for t in self.threads]


@contextmanager
def selected_calls(args: argparse.Namespace) -> Iterator[Selection]:
    """The calls ``args`` select, read in bounded memory (one line for every way the
    trace cannot be read)."""
    from ptscope.analyze.calls import check_threads, check_tids, parse_time_window
    from ptscope.analyze.stream import CallStream

    window = parse_time_window(args.time) if args.time else None
    tids = parse_id_list(args.tid, "--tid") if args.tid else ()
    paths: list[Path] = list(args.trace)
    label = str(paths[0]) if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} parts)"
    with reading_trace(paths[0]), CallStream(paths) as calls:
        threads = calls.threads()
        check_threads(label, calls.span, threads)
        if tids:
            check_tids(label, threads, tids)
            threads = [t for t in threads if t.tid in tids]
        yield Selection(calls, threads, window, label)


def no_calls_in_window(selection: Selection) -> PtscopeError:
    from ptscope.analyze.calls import format_ns
    from ptscope.errors import BadInputError

    return BadInputError(
        f"no calls in that time window of {selection.label} "
        f"(it spans {format_ns(selection.calls.span)})"
    )


class StatsCommand:
    name = "stats"
    help = "per-function calls, total and self time, and duration percentiles"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_selection_arguments(parser)
        add_listing_arguments(parser)
        parser.add_argument(
            "--sort",
            choices=SORT_KEYS,
            default="total",
            help="order by this column, largest first (name: A to Z); default total",
        )
        parser.add_argument(
            "--exact",
            action="store_true",
            help="exact percentiles (memory then grows with the calls; by default they come "
            "from a histogram, within 0.4%% of the exact value)",
        )
        out = parser.add_mutually_exclusive_group()
        out.add_argument("--json", action="store_true", help="print JSON (times in ns)")
        out.add_argument("--csv", action="store_true", help="print CSV (times in ns)")

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.analyze.stats import StatsAccumulator, select_functions
        from ptscope.cli.base import reuse_freed_memory

        reuse_freed_memory()

        with selected_calls(args) as selection:
            stats = StatsAccumulator(selection.calls.names, exact=args.exact)
            for batch in selection.batches():
                stats.add(batch)
            report = stats.report(selection.thread_infos())
            if not report.calls:
                raise no_calls_in_window(selection)
        window = selection.window
        rows = select_functions(report, sort=args.sort, top=args.top, match=args.match)
        if args.json:
            _print_json(args, report, rows, window)
        elif args.csv:
            _print_csv(rows)
        else:
            _print_table(args, report, rows)
        return 0


def _print_json(
    args: argparse.Namespace,
    report: StatsReport,
    rows: list[FunctionStats],
    window: TimeWindow | None,
) -> None:
    data = {
        "trace": str(args.trace[0]) if len(args.trace) == 1 else [str(p) for p in args.trace],
        "threads": [{"pid": t.pid, "tid": t.tid, "name": t.name} for t in report.threads],
        "window_ns": None if window is None else [window.start, window.end],
        "calls": report.calls,
        "top_level_ns": report.top_level_ns,
        "sort": args.sort,
        "functions": [r.as_dict() for r in rows],
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _print_csv(rows: list[FunctionStats]) -> None:
    fields = ("name", "calls", "total_ns", "self_ns", "p50_ns", "p90_ns", "p99_ns", "max_ns")
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(fields)
    for r in rows:
        writer.writerow([getattr(r, f) for f in fields])


def _print_table(args: argparse.Namespace, report: StatsReport, rows: list[FunctionStats]) -> None:
    from rich.console import Console

    from ptscope.analyze.calls import format_ns
    from ptscope.cli.table import PIPED_WIDTH, render

    terminal = sys.stdout.isatty()
    console = Console(
        file=sys.stdout,
        width=None if terminal else PIPED_WIDTH,
        no_color=not terminal,
        highlight=False,
        markup=False,
    )

    def share(ns: int) -> str:
        return f"{100 * ns / report.top_level_ns:.1f}%" if report.top_level_ns else "-"

    threads = len(report.threads)
    label = (
        str(args.trace[0])
        if len(args.trace) == 1
        else f"{args.trace[0]} (+{len(args.trace) - 1} parts)"
    )
    console.print(
        f"{label}: {report.calls:,} calls on {threads} thread{'s' * (threads != 1)}, "
        f"{format_ns(report.top_level_ns)} in top-level calls",
        soft_wrap=True,
    )
    headers = ("function", "calls", "total", "%", "self", "%", "p50", "p90", "p99", "max")
    labels = (*headers[:5], "self %", *headers[6:])
    cells = [
        (
            r.name,
            f"{r.calls:,}",
            format_ns(r.total_ns),
            share(r.total_ns),
            format_ns(r.self_ns),
            share(r.self_ns),
            format_ns(r.p50_ns),
            format_ns(r.p90_ns),
            format_ns(r.p99_ns),
            format_ns(r.max_ns),
        )
        for r in rows
    ]
    # What gives way first: the percentiles in between, then the rest from the right.
    render(headers, cells, drop_order=(7, 6, 8, 9, 5, 3), wide=args.wide, labels=labels)
    if args.top and len(rows) == args.top:
        from ptscope.analyze.stats import select_functions

        matching = len(select_functions(report, match=args.match))
        if matching > len(rows):
            which = "matching " if args.match else ""
            console.print(f"({len(rows)} of {matching} {which}functions; --top 0 for all)")
