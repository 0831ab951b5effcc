"""``ptscope diff BEFORE AFTER``: per-function differences between two traces, and a CI gate
(``--fail-above``) on their exact instruction counts."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptscope.cli.base import parse_id_list, reading_trace
from ptscope.cli.stats import add_listing_arguments

if TYPE_CHECKING:
    from ptscope.analyze.diff import Crossing, DiffReport, DiffRow, TraceTotals
    from ptscope.analyze.stats import FunctionCounts
    from ptscope.analyze.stream import CallBatch

__all__ = ["DiffCommand", "read_batches", "read_counts"]

SORT_KEYS = ("self-insns", "insns", "self-cycles", "cycles", "self", "total", "calls", "name")
"""analyze.diff.DIFF_SORT_KEYS, spelled out here: building the parser must not import numpy."""
FORMATS = ("table", "json", "csv", "markdown")


@contextmanager
def read_batches(
    path: Path, tids: tuple[int, ...]
) -> Iterator[tuple[list[str], Iterator[CallBatch]]]:
    """One trace's name table and calls with their counts (a block at a time), on the
    threads of ``tids`` it holds (all when empty): one line for every way it cannot be
    read."""
    from ptscope.analyze.calls import check_threads
    from ptscope.analyze.stream import CallStream
    from ptscope.errors import BadInputError

    label = str(path)
    with reading_trace(path), CallStream([path], with_args=True) as calls:
        threads = calls.threads()
        check_threads(label, calls.span, threads)
        if tids:
            threads = [t for t in threads if t.tid in tids]
            if not threads:
                listed = ", ".join(str(t.tid) for t in calls.threads()[:20])
                raise BadInputError(f"none of the threads of --tid in {label} (threads: {listed})")
        yield calls.names, calls.batches(threads)


def read_counts(path: Path, tids: tuple[int, ...]) -> tuple[TraceTotals, list[FunctionCounts]]:
    """Every function's sums in one trace (:func:`read_batches`)."""
    from ptscope.analyze.diff import TraceTotals
    from ptscope.analyze.stats import StatsAccumulator

    with read_batches(path, tids) as (names, batches):
        stats = StatsAccumulator(names, counts=True)
        threads: set[int] = set()
        for batch in batches:
            stats.add(batch)
            threads.add(batch.thread)
    assert stats.instructions is not None and stats.cycles is not None
    totals = TraceTotals(
        str(path),
        len(threads),
        stats.calls,
        stats.instructions.top_level,
        stats.cycles.top_level,
        stats.top_level,
        int(stats.instructions.unknown.sum()),
    )
    return totals, stats.function_counts()


def _read_both(
    before: Path, after: Path, tids: tuple[int, ...]
) -> list[tuple[TraceTotals, list[FunctionCounts]]]:
    """Both traces' sums, read side by side: AFTER in a forked child (the sums it sends
    back are small) while this process reads BEFORE. One CPU, or no fork: one by one."""
    import multiprocessing
    import os

    if (os.process_cpu_count() if hasattr(os, "process_cpu_count") else os.cpu_count() or 1) < 2:
        return [read_counts(before, tids), read_counts(after, tids)]
    from concurrent.futures import ProcessPoolExecutor

    try:
        context = multiprocessing.get_context("fork")
    except ValueError:
        return [read_counts(before, tids), read_counts(after, tids)]
    from ptscope.children import die_with_parent

    with ProcessPoolExecutor(1, mp_context=context, initializer=die_with_parent) as pool:
        other = pool.submit(read_counts, after, tids)
        first = read_counts(before, tids)
        return [first, other.result()]


class DiffCommand:
    name = "diff"
    help = "per-function differences between two traces (calls, instructions, cycles, time)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("before", metavar="BEFORE", type=Path, help="the baseline trace")
        parser.add_argument("after", metavar="AFTER", type=Path, help="the trace to compare")
        parser.add_argument(
            "--tid",
            metavar="TID[,TID...]",
            help="only these threads (each trace keeps those it holds: give one tid of each)",
        )
        parser.add_argument(
            "--sort",
            choices=SORT_KEYS,
            default="self-insns",
            help="order by the largest absolute change of this column (default self-insns: "
            "self instructions; name: A to Z)",
        )
        add_listing_arguments(parser)
        parser.add_argument(
            "--changed",
            action="store_true",
            help="only functions whose calls, instructions or cycles changed",
        )
        parser.add_argument(
            "--format", choices=FORMATS, default="table", help="output format (default table)"
        )
        parser.add_argument(
            "--fail-above",
            action="append",
            default=[],
            metavar="[FUNCTION=]RISE",
            help="exit 1 if the total instructions (or FUNCTION's, recursion counted once) "
            "rose by more than RISE: a percentage (2%%) or a count (5000); repeatable",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.analyze.diff import crossed_thresholds, diff_functions, parse_threshold
        from ptscope.cli.base import reuse_freed_memory

        reuse_freed_memory()
        from ptscope.errors import BadInputError

        thresholds = [parse_threshold(t) for t in args.fail_above]
        tids = parse_id_list(args.tid, "--tid") if args.tid else ()
        (before, before_rows), (after, after_rows) = _read_both(args.before, args.after, tids)
        report = diff_functions(before, before_rows, after, after_rows)
        crossings: list[Crossing] = []
        if thresholds:
            for side in (before, after):
                if side.unknown_instructions == side.calls:
                    raise BadInputError(
                        f"--fail-above: {side.label} has no instruction counts "
                        "(decoded with --no-insn-detail, or by the sampling backend?)"
                    )
            crossings = crossed_thresholds(report, thresholds)
        rows, cut = _selected(report, args)
        if args.format == "table":
            _print_table(report, rows, crossings, wide=args.wide)
        else:
            {"json": _print_json, "csv": _print_csv}.get(args.format, _print_markdown)(
                report, rows, crossings
            )
        if cut and args.format in ("table", "markdown"):
            blank = "\n" if args.format == "markdown" else ""  # not a row of the table
            print(f"{blank}({cut}; --top 0 for all)")
        for crossing in crossings:
            print(f"ptscope: diff: {crossing.describe()}", file=sys.stderr)
        if crossings:
            return 1
        if thresholds:
            print(
                f"ptscope: diff: within --fail-above {', '.join(args.fail_above)}", file=sys.stderr
            )
        return 0


def _selected(report: DiffReport, args: argparse.Namespace) -> tuple[list[DiffRow], str]:
    """The rows to show, and what --top left out (``3 of 40 changed functions``)."""
    from ptscope.analyze.diff import select_rows

    rows = select_rows(report, sort=args.sort, match=args.match)
    if args.changed:
        rows = [r for r in rows if r.changed()]
    if not args.top or len(rows) <= args.top:
        return rows, ""
    which = " ".join(w for w, on in (("changed", args.changed), ("matching", args.match)) if on)
    return rows[: args.top], f"{args.top} of {len(rows)} {which + ' ' if which else ''}functions"


def _change(before: int, after: int) -> str:
    """``+1,234 (+5.1%)``; ``new`` or ``gone`` when one side is 0."""
    if before == after:
        return "0"
    if before == 0:
        return f"{after - before:+,} (new)"
    return f"{after - before:+,} ({100 * (after - before) / before:+.1f}%)"


def _ratio(row: DiffRow, measure: str) -> str:
    ratio = row.ratio(measure)
    return "-" if ratio is None else f"{ratio:.3f}x"


def _name(row: DiffRow) -> str:
    return f"{row.name} ({row.status})" if row.status else row.name


def _total_line(report: DiffReport) -> str:
    from ptscope.analyze.calls import format_ns

    b, a = report.before, report.after
    return (
        f"total: instructions {b.instructions:,} -> {a.instructions:,} "
        f"[{_change(b.instructions, a.instructions)}], "
        f"cycles {b.cycles:,} -> {a.cycles:,}, calls {b.calls:,} -> {a.calls:,}, "
        f"time {format_ns(b.time_ns)} -> {format_ns(a.time_ns)}"
    )


def _cells(row: DiffRow) -> list[str]:
    from ptscope.analyze.calls import format_ns

    def pair(measure: str) -> str:
        return f"{row.value(row.before, measure):,} -> {row.value(row.after, measure):,}"

    def change(measure: str) -> str:
        return _change(row.value(row.before, measure), row.value(row.after, measure))

    time_change = row.change("total_ns")
    return [
        _name(row),
        pair("calls"),
        pair("self_instructions"),
        change("self_instructions"),
        _ratio(row, "self_instructions"),
        change("instructions"),
        change("cycles"),
        ("+" if time_change > 0 else "-" if time_change < 0 else "") + format_ns(abs(time_change)),
    ]


_HEADERS = (
    "function", "calls", "self instructions", "change", "ratio", "instructions (total)",
    "cycles (total)", "time (total)",
)  # fmt: skip


def _notes(report: DiffReport) -> list[str]:
    out = []
    for side in (report.before, report.after):
        if side.unknown_instructions:
            out.append(
                f"{side.label}: {side.unknown_instructions:,} of {side.calls:,} calls have no "
                "instruction count (counted as 0)"
            )
    return out


def _print_table(
    report: DiffReport, rows: list[DiffRow], crossings: list[Crossing], wide: bool = False
) -> None:
    from rich.console import Console

    from ptscope.cli.table import render

    terminal = sys.stdout.isatty()
    console = Console(
        file=sys.stdout,
        width=None if terminal else 200,
        no_color=not terminal,
        highlight=False,
        markup=False,
    )
    b, a = report.before, report.after
    for what, side in (("before:", b), ("after: ", a)):
        threads = f"{side.threads} thread{'s' * (side.threads != 1)}"
        console.print(f"{what} {side.label} ({side.calls:,} calls on {threads})", soft_wrap=True)
    console.print(_total_line(report), soft_wrap=True)
    # What gives way first: the totals, then the ratio, the calls, the counts themselves;
    # the name and the change of self instructions stay.
    cells = [_cells(row) for row in rows]
    render(_HEADERS, cells, drop_order=(6, 7, 4, 5, 1, 2), wide=wide, piped_width=200)
    for note in _notes(report):
        console.print(note, soft_wrap=True)


def _print_markdown(report: DiffReport, rows: list[DiffRow], crossings: list[Crossing]) -> None:
    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")

    out = [f"**ptscope diff** `{report.before.label}` → `{report.after.label}`", ""]
    out.append(_total_line(report).replace("->", "→"))
    out.append("")
    for crossing in crossings:
        out.append(f"- :x: {cell(crossing.describe())}")
    if crossings:
        out.append("")
    out.append("| " + " | ".join(_HEADERS) + " |")
    out.append("|" + "---|" + "---:|" * (len(_HEADERS) - 1))
    for row in rows:
        cells = _cells(row)
        cells[0] = f"`{cell(cells[0])}`"
        out.append("| " + " | ".join(cell(c).replace("->", "→") for c in cells) + " |")
    out.extend(f"\n{note}" for note in _notes(report))
    sys.stdout.write("\n".join(out) + "\n")


def _side(counts: FunctionCounts | None) -> dict[str, Any] | None:
    if counts is None:
        return None
    data = dict(vars(counts))
    del data["name"]
    return data


def _print_json(report: DiffReport, rows: list[DiffRow], crossings: list[Crossing]) -> None:
    from ptscope.analyze.diff import MEASURES

    def totals(side: TraceTotals) -> dict[str, Any]:
        return dict(vars(side))

    data = {
        "before": totals(report.before),
        "after": totals(report.after),
        "functions": [
            {
                "name": r.name,
                "status": r.status or "both",
                "before": _side(r.before),
                "after": _side(r.after),
                "change": {m: r.change(m) for m in MEASURES},
            }
            for r in rows
        ],
        "failed": [
            {
                "threshold": c.threshold.describe(),
                "what": c.what,
                "before": c.before,
                "after": c.after,
            }
            for c in crossings
        ],
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _print_csv(report: DiffReport, rows: list[DiffRow], crossings: list[Crossing]) -> None:
    from ptscope.analyze.diff import MEASURES

    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(
        ["name", "status"]
        + [f"{m}_{side}" for m in MEASURES for side in ("before", "after", "change")]
    )
    for r in rows:
        cells: list[object] = [r.name, r.status or "both"]
        for m in MEASURES:
            cells += [r.value(r.before, m), r.value(r.after, m), r.change(m)]
        writer.writerow(cells)
