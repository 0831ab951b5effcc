"""Per-function differences between two traces (``ptscope diff``) and the CI gate on them.

Functions are matched by name (the names the decoder wrote: C++ and Rust ones demangled).
Each side is a :class:`~ptscope.analyze.stats.FunctionCounts` (calls; time, instructions
and cycles, each total and self, with the definitions of ``stats``), or ``None`` where the
function was not called in that trace (new, or vanished).

Instruction counts are exact and, on the emulated backend, deterministic, so they are what
the rows are sorted by (the largest absolute change of self instructions first) and what
``--fail-above`` compares: time on a shared machine is noise.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final

from ptscope.analyze.stats import FunctionCounts, match_pattern
from ptscope.errors import UsageError

__all__ = [
    "DIFF_SORT_KEYS",
    "DiffReport",
    "DiffRow",
    "Threshold",
    "TraceTotals",
    "crossed_thresholds",
    "diff_functions",
    "parse_threshold",
    "select_rows",
]

DIFF_SORT_KEYS: Final = {
    "self-insns": "self_instructions",
    "insns": "instructions",
    "self-cycles": "self_cycles",
    "cycles": "cycles",
    "self": "self_ns",
    "total": "total_ns",
    "calls": "calls",
    "name": "name",
}
"""``--sort`` keys: the field whose absolute change orders the rows (name: A to Z)."""

MEASURES: Final = (
    "calls", "instructions", "self_instructions", "cycles", "self_cycles", "total_ns", "self_ns",
)  # fmt: skip


COUNTED: Final = ("calls", "instructions", "self_instructions", "cycles", "self_cycles")


@dataclass
class TraceTotals:
    """One side of a diff: what all its top-level calls add up to."""

    label: str
    threads: int
    calls: int
    instructions: int
    """Instructions in the top-level calls of the selected threads (everything traced)."""
    cycles: int
    time_ns: int
    unknown_instructions: int
    """Calls whose slice has no instruction count (0: the counts are complete)."""

    def value(self, measure: str) -> int:
        return {"instructions": self.instructions, "cycles": self.cycles}.get(
            measure, self.calls if measure == "calls" else self.time_ns
        )


@dataclass
class DiffRow:
    name: str
    before: FunctionCounts | None
    after: FunctionCounts | None

    @property
    def status(self) -> str:
        """``new``, ``vanished`` or empty (called in both)."""
        if self.before is None:
            return "new"
        return "vanished" if self.after is None else ""

    def value(self, side: FunctionCounts | None, measure: str) -> int:
        return 0 if side is None else int(getattr(side, measure))

    def change(self, measure: str) -> int:
        return self.value(self.after, measure) - self.value(self.before, measure)

    def ratio(self, measure: str) -> float | None:
        """after / before; None when before is 0 (new, or nothing there)."""
        before = self.value(self.before, measure)
        return None if before == 0 else self.value(self.after, measure) / before

    def changed(self) -> bool:
        """New, vanished, or other calls, instructions or cycles (time is left out: it
        follows the cycles, rounded)."""
        return bool(self.status) or any(self.change(m) for m in MEASURES if m in COUNTED)


@dataclass
class DiffReport:
    before: TraceTotals
    after: TraceTotals
    rows: list[DiffRow]
    """Every function called in either trace, in name order."""


_IN_FILE: Final = re.compile(
    r"\[unknown\] \((?:[^()]*/)?([^/()]*)\)|\[unknown @ 0x[0-9a-f]+ \((?:[^()]*/)?([^/()]*)\)\]"
)


def matching_name(name: str) -> str:
    """The name rows are matched by: code without a symbol, ``[unknown @ 0xADDR
    (/path/FILE)]`` (or ``[unknown] (/path/FILE)``), is matched by FILE alone, its
    functions summed: two builds of a program are often in two directories, and their
    functions at other addresses."""
    found = _IN_FILE.fullmatch(name)
    return name if found is None else f"[unknown] ({found[1] or found[2]})"


def _by_name(rows: list[FunctionCounts]) -> dict[str, FunctionCounts]:
    out: dict[str, FunctionCounts] = {}
    for f in rows:
        name = matching_name(f.name)
        known = out.get(name)
        out[name] = f if known is None else known.merged(f)
    return out


def diff_functions(
    before: TraceTotals,
    before_rows: list[FunctionCounts],
    after: TraceTotals,
    after_rows: list[FunctionCounts],
) -> DiffReport:
    """Match the two traces' functions by name (:func:`matching_name`)."""
    old = _by_name(before_rows)
    new = _by_name(after_rows)
    rows = [DiffRow(name, old.get(name), new.get(name)) for name in sorted(old.keys() | new)]
    return DiffReport(before, after, rows)


def select_rows(
    report: DiffReport, *, sort: str = "self-insns", top: int = 0, match: str | None = None
) -> list[DiffRow]:
    """The rows to show: those matching ``match`` (a regular expression, searched), by the
    largest absolute change of ``sort`` (ties: the larger after value, then the name),
    the first ``top`` (all when 0)."""
    if sort not in DIFF_SORT_KEYS:
        raise UsageError(f"--sort {sort!r}: choose one of {', '.join(DIFF_SORT_KEYS)}")
    rows = report.rows
    pattern = match_pattern(match)
    if pattern is not None:
        rows = [r for r in rows if pattern.search(r.name)]
    if sort != "name":
        field = DIFF_SORT_KEYS[sort]
        rows = sorted(rows, key=lambda r: (-abs(r.change(field)), -r.value(r.after, field)))
    return rows[:top] if top else rows


@dataclass(frozen=True)
class Threshold:
    """``--fail-above [FUNCTION=]LIMIT``: the total instructions (of the trace, or of one
    function, recursion counted once) may rise by at most LIMIT: a percentage of the
    before value (``2%``) or a number of instructions (``5000``)."""

    function: str | None
    percent: float | None
    count: int | None

    def describe(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else f"{self.count:,}"

    def crossed(self, before: int, after: int) -> bool:
        rise = after - before
        if rise <= 0:
            return False
        if self.count is not None:
            return rise > self.count
        assert self.percent is not None
        return before == 0 or 100 * rise > self.percent * before


_LIMIT: Final = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<percent>%?)")


def parse_threshold(text: str) -> Threshold:
    """``2%``, ``0.5%``, ``5000``, ``FUNCTION=2%`` (the last ``=`` separates: C++ names
    may hold one, as in ``operator=``)."""
    function, _, limit = text.rpartition("=")
    found = _LIMIT.fullmatch(limit.strip())
    if found is None or (function == "" and "=" in text):
        raise UsageError(
            f"--fail-above {text!r}: give a rise such as 2% or 5000 (instructions), "
            "optionally for one function: NAME=2%"
        )
    number = float(found["number"])
    if not math.isfinite(number) or (not found["percent"] and not number.is_integer()):
        raise UsageError(f"--fail-above {text!r}: an instruction count is a whole number")
    name = function or None
    if found["percent"]:
        return Threshold(name, number, None)
    return Threshold(name, None, int(number))


@dataclass
class Crossing:
    threshold: Threshold
    what: str
    before: int
    after: int

    def describe(self) -> str:
        rise = self.after - self.before
        if self.before:
            share = f"{100 * rise / self.before:+.2f}%"
        else:
            share = "new"
        return (
            f"{self.what}: {self.before:,} -> {self.after:,} instructions ({share}, "
            f"{rise:+,}), above --fail-above {self.threshold.describe()}"
        )


def crossed_thresholds(report: DiffReport, thresholds: list[Threshold]) -> list[Crossing]:
    """The thresholds the AFTER trace crossed, in the order given. A function named by a
    threshold must be in one of the traces."""
    rows = {r.name: r for r in report.rows}
    out: list[Crossing] = []
    for t in thresholds:
        if t.function is None:
            before, after = report.before.instructions, report.after.instructions
            what = "total instructions"
        else:
            row = rows.get(t.function)
            if row is None:
                raise UsageError(
                    f"--fail-above {t.function}=...: no function {t.function!r} in either trace"
                )
            before = row.value(row.before, "instructions")
            after = row.value(row.after, "instructions")
            what = t.function
        if t.crossed(before, after):
            out.append(Crossing(t, what, before, after))
    return out
