"""`ptscope dump`: print a Fuchsia trace's slices as text, one line per slice."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from ptscope.cli.base import reading_trace

if TYPE_CHECKING:
    from ptscope.fxt.reader import FxtTrace

__all__ = ["DumpCommand", "dump_lines", "write_dump"]


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
        parser.add_argument(
            "trace",
            metavar="TRACE",
            nargs="+",
            help="a .fxt or .fxt.gz trace (several: the parts of a split trace, read as one)",
        )
        parser.add_argument(
            "--instants",
            action="store_true",
            help="also print instants (decode errors...) as 'pid tid time_ns instant name'",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.cli.base import reuse_freed_memory

        reuse_freed_memory()
        paths = [Path(p) for p in args.trace]
        with reading_trace(paths[0]):
            write_dump(paths, sys.stdout, instants=args.instants)
        return 0


def write_dump(paths: list[Path], out: TextIO, *, instants: bool = False) -> int:
    """:func:`dump_lines` of the trace at ``paths`` (a split trace's parts, as one), written
    to ``out`` as it is read (memory does not grow with the trace). Returns the lines
    written."""
    import numpy as np

    from ptscope.analyze.stream import CallStream

    written = 0
    with CallStream(paths) as calls:
        names = [_clean(n) for n in calls.names]
        origin = calls.origin
        by_key = {(t.pid, t.tid): t for t in calls.threads()}
        keys = set(by_key)
        if instants:
            keys |= {k for k, v in calls.meta.instants.items() if v}
        for key in sorted(keys):
            pid, tid = key
            prefix = f"{pid} {tid} "
            marks = (
                sorted(calls.meta.instants.get(key, ()), key=lambda i: i.time) if instants else []
            )
            lines: list[str] = []
            thread = by_key.get(key)
            for batch in calls.batches([thread]) if thread is not None else ():
                c = batch.carried
                start = (batch.start[c:] + origin).tolist()
                lines = [
                    f"{prefix}{s} {e} {d} {names[n]}"
                    for s, e, d, n in zip(
                        start,
                        (batch.end[c:] + origin).tolist(),
                        batch.depth[c:].tolist(),
                        batch.name[c:].tolist(),
                        strict=True,
                    )
                ]
                if marks and start:
                    # An instant goes after the slices that start when it happens (or
                    # before): those at the batch's last start may go on in the next one.
                    due = 0
                    while due < len(marks) and marks[due].time < start[-1]:
                        due += 1
                    at = np.searchsorted(start, [m.time for m in marks[:due]], side="right")
                    for k in range(due - 1, -1, -1):
                        lines.insert(
                            int(at[k]), f"{prefix}{marks[k].time} instant {_clean(marks[k].name)}"
                        )
                    del marks[:due]
                if lines:
                    out.write("\n".join(lines) + "\n")
                    written += len(lines)
            rest = [f"{prefix}{m.time} instant {_clean(m.name)}" for m in marks]
            if rest:
                out.write("\n".join(rest) + "\n")
                written += len(rest)
    out.flush()
    return written
