"""`ptscope dump`: print a Fuchsia trace's slices as text, one line per slice."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ptscope.cli.base import reading_trace

if TYPE_CHECKING:
    from ptscope.fxt.reader import FxtTrace

__all__ = ["DumpCommand", "dump_lines"]


def _clean(name: str) -> str:
    # One slice per line, whatever a symbol contains.
    return name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def dump_lines(trace: FxtTrace, *, instants: bool = False) -> list[str]:
    """``pid tid start_ns end_ns depth name`` per slice, sorted by (pid, tid, start,
    depth); with ``instants``, also ``pid tid time_ns instant name`` lines in time order
    (after the slices that start at the same time)."""
    lines: list[str] = []
    for key in trace.thread_keys():
        pid, tid = key
        rows = [
            (s.start, 0, s.depth, f"{pid} {tid} {s.start} {s.end} {s.depth} {_clean(s.name)}")
            for s in trace.slices.get(key, ())
        ]
        if instants:
            rows += [
                (i.time, 1, 0, f"{pid} {tid} {i.time} instant {_clean(i.name)}")
                for i in trace.instants.get(key, ())
            ]
            rows.sort(key=lambda r: r[:3])
        lines += [r[3] for r in rows]
    return lines


class DumpCommand:
    name = "dump"
    help = "print a trace's slices as text: pid tid start_ns end_ns depth name"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("trace", metavar="TRACE", help="a .fxt or .fxt.gz trace")
        parser.add_argument(
            "--instants",
            action="store_true",
            help="also print instants (decode errors...) as 'pid tid time_ns instant name'",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.fxt.reader import read_trace

        path = Path(args.trace)
        with reading_trace(path):
            trace = read_trace(path)
        out = sys.stdout
        lines = dump_lines(trace, instants=args.instants)
        for i in range(0, len(lines), 4096):
            out.write("\n".join(lines[i : i + 4096]) + "\n")
        out.flush()
        return 0
