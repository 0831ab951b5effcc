"""How commands report a finished decode to the user."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ptscope.pipeline import DecodeSummary

PERFETTO_URL = "https://ui.perfetto.dev"


def _ns(ns: int) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns} ns"


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on (escape sequences, bells,
    backspaces...) written as a Python escape: input is shown, never obeyed."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


@contextlib.contextmanager
def summary_of_incomplete() -> Iterator[None]:
    """A decode that perf cut short wrote what it decoded: say what was written (on
    stderr, as for a whole one: stdout is the traced program's) before its error."""
    from ptscope.pipeline import IncompleteDecode

    try:
        yield
    except IncompleteDecode as e:
        print_summary(e.summary, sys.stderr)
        raise


def print_summary(
    summary: DecodeSummary, out: TextIO, *, top: int = 0, served: bool = False
) -> None:
    """One line on what was written, warnings, optionally the top functions."""
    size = summary.write.file_bytes
    parts = summary.parts
    # A split trace is its parts (OUT-000.fxt.gz...): OUT itself is never written.
    split = any(part.path != summary.output for part in parts)
    if split and len(parts) > 1:
        written = f"{parts[0].path} … {parts[-1].path} ({len(parts)} parts)"
    elif split:
        written = f"{parts[0].path} (1 part)"
    else:
        written = str(summary.output)
    out.write(
        f"wrote {written}: {summary.threads} thread{'s' * (summary.threads != 1)}, "
        f"{summary.slices:,} slices, {size / 1024:.0f} KiB "
        f"({summary.decoder} decoder, {summary.seconds:.1f} s)\n"
    )
    if split:
        base = parts[0].start
        out.write(
            f"  split into {len(parts)} part{'s' * (len(parts) != 1)} "
            "(times from the trace's start):\n"
        )
        for part in summary.parts:
            out.write(
                f"    {part.path}  {_ns(part.start - base):>9} – {_ns(part.end - base):<9}"
                f"  {part.slices:,} slices, {part.file_bytes / 1024:.0f} KiB\n"
            )
    if summary.decode_errors:
        out.write(
            f"  {summary.decode_errors} decode error{'s' * (summary.decode_errors != 1)}: "
            "shown as [decode error] markers; stacks were stitched across them where they agree\n"
        )
    if summary.uncounted_blocks:
        n = summary.uncounted_blocks
        out.write(
            f"  instruction counts are short: {n:,} run{'s' * (n != 1)} of code between "
            "branches could not be read (code perf cannot find: --symfs, or kernel code "
            "without kcore)\n"
        )
    if summary.missing_fields:
        from ptscope.decode.perf_script import BRANCH_FIELDS, BRANCH_ITRACE

        out.write(
            "  the perf script text lacks "
            + "; ".join(summary.missing_fields)
            + f" (all of them: perf script --ns --itrace={BRANCH_ITRACE} -F {BRANCH_FIELDS})\n"
        )
    if summary.unknown_lines:
        n = summary.unknown_lines
        out.write(f"  {n:,} line{'s' * (n != 1)} of perf output not understood, e.g.:\n")
        for example in summary.unknown_examples:
            out.write(f"    {printable(example[:160])}\n")
    if top and summary.top_functions:
        out.write("  top functions (total time in calls, calls):\n")
        width = max(len(f.name[:60]) for f in summary.top_functions[:top])
        for f in summary.top_functions[:top]:
            out.write(f"    {f.name[:60]:<{width}}  {_ns(f.total_ns):>9}  {f.calls:>7,}\n")
    if not served:
        first = summary.parts[0].path if summary.parts else summary.output
        out.write(f"  open it in {PERFETTO_URL} (Open trace file), or: ptscope serve {first}\n")
