"""Per-function statistics of a trace: calls, total (inclusive) and self time, and the
spread of call durations (p50/p90/p99/max), computed with numpy over every call at once.

Definitions (documented in the README):

- **total**: the time inside the function, each moment counted once. A recursive call
  inside another call of the same function on the same thread adds nothing: only the
  *outermost* active call of a function counts (``f`` calling ``f`` for 10 ms in a 12 ms
  call of ``f`` is 12 ms of ``f``, not 22).
- **self**: the time in the function's own code: each call's duration minus its direct
  callees' durations, summed over all calls (never double-counted).
- **percentiles** and **max**: over the durations of all calls (recursive ones too), with
  numpy's default (linear) interpolation. Streamed (:class:`StatsAccumulator`), the
  percentiles come from a log-bucket histogram (:class:`DurationHistogram`: within 0.4 % of
  the exact value); the maximum stays exact, and ``exact=True`` keeps every duration.
- **share**: a time divided by the time in all top-level calls of the selected threads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ptscope.analyze.calls import Calls, ThreadInfo
from ptscope.analyze.stream import CallBatch
from ptscope.errors import UsageError

__all__ = [
    "SORT_KEYS",
    "FunctionCounts",
    "FunctionStats",
    "StatsAccumulator",
    "StatsReport",
    "function_stats",
    "match_pattern",
    "select_functions",
]

SORT_KEYS: Final = ("total", "self", "calls", "p50", "p90", "p99", "max", "name")
QUANTILES: Final = (0.5, 0.9, 0.99)

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass
class FunctionStats:
    name: str
    calls: int
    total_ns: int
    self_ns: int
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int

    def as_dict(self) -> dict[str, int | str]:
        return asdict(self)


@dataclass
class FunctionCounts:
    """A function's sums (:class:`StatsAccumulator` with ``counts``): time, instructions
    and cycles, each as a total (each moment counted once under recursion) and as self
    (the function's own code). Calls whose slice has no count add 0 to the sums and 1 to
    ``unknown_instructions`` / ``unknown_cycles``."""

    name: str
    calls: int
    total_ns: int
    self_ns: int
    instructions: int
    self_instructions: int
    cycles: int
    self_cycles: int
    unknown_instructions: int = 0
    unknown_cycles: int = 0

    def merged(self, other: FunctionCounts) -> FunctionCounts:
        """The sums of two functions of the same name (e.g. two static functions)."""
        values = [getattr(self, f) + getattr(other, f) for f in _COUNT_FIELDS]
        return FunctionCounts(self.name, *values)


_COUNT_FIELDS: Final = (
    "calls", "total_ns", "self_ns", "instructions", "self_instructions", "cycles",
    "self_cycles", "unknown_instructions", "unknown_cycles",
)  # fmt: skip


@dataclass
class StatsReport:
    functions: list[FunctionStats]
    """Every function with at least one call, in name-table order."""
    top_level_ns: int
    """Time in the top-level calls of the selected threads (the base of shares)."""
    calls: int
    threads: list[ThreadInfo]


def _grouped_by_name(name_id: npt.NDArray[np.int32], n_names: int) -> npt.NDArray[np.intp]:
    """Row numbers grouped by name, each group in row order (a radix sort when names fit
    in 16 bits)."""
    key = name_id.astype(np.uint16) if n_names <= 1 << 16 else name_id
    return np.argsort(key, kind="stable")


def _segmented_running_max(values: I64, segment: I64) -> I64:
    """``max(values[first of its segment .. i])`` for every i (segments contiguous,
    numbered upwards, values >= 0)."""
    if not len(values):
        return values
    top = int(values.max()) + 1
    if int(segment[-1]) < (np.iinfo(np.int64).max // max(top, 1)) - 1:
        # Lift each segment above every earlier one: one cumulative max does it.
        lifted = segment * top + values
        return np.maximum.accumulate(lifted) - segment * top
    out = values.copy()  # pointer doubling: log2(n) vectorised passes, any magnitude
    step = 1
    while step < len(out):
        same = segment[step:] == segment[:-step]
        np.maximum(out[step:], np.where(same, out[:-step], out[step:]), out=out[step:])
        step *= 2
    return out


def outermost_calls(calls: Calls) -> B:
    """True for a call with no caller of the same function above it on its thread."""
    order = _grouped_by_name(calls.name_id, len(calls.names))
    name = calls.name_id[order].astype(np.int64)
    thread = calls.thread[order].astype(np.int64)
    start, end = calls.start[order], calls.end[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (name[1:] != name[:-1]) | (thread[1:] != thread[:-1])
    segment = np.cumsum(first) - 1
    reach = _segmented_running_max(end, segment)  # latest end among calls so far
    # Rows of one segment are in (start, depth) order, so a same-named caller comes
    # before its callee; the callee is nested iff an earlier call is still open.
    nested = np.zeros(len(order), dtype=bool)
    nested[1:] = ~first[1:] & (reach[:-1] > start[1:])
    outermost = np.empty(len(order), dtype=bool)
    outermost[order] = ~nested
    return outermost


def _quantiles(calls: Calls, count: I64) -> tuple[I64, ...]:
    """Per name: the duration quantiles of :data:`QUANTILES` and the maximum."""
    return _exact_quantiles(calls.name_id, calls.duration, count)


def _exact_quantiles(name_id: npt.NDArray[np.int32], dur: I64, count: I64) -> tuple[I64, ...]:
    n_names = len(count)
    name = name_id.astype(np.int64)
    dur_bits = int(dur.max()).bit_length() if len(dur) else 0
    if dur_bits + max(n_names, 1).bit_length() <= 62:
        key = np.sort((name << dur_bits) | dur)
        ordered = key & ((1 << dur_bits) - 1)
    else:
        ordered = dur[np.lexsort((dur, name))]
    first = np.concatenate(([0], np.cumsum(count)[:-1]))
    present = count > 0
    quantiles = _interpolated(count, lambda k: ordered[np.where(present, first + k, 0)])
    last = np.maximum(count - 1, 0)
    return (*quantiles, np.where(present, ordered[np.where(present, first + last, 0)], 0))


def _interpolated(
    count: I64, nth: Callable[[I64], npt.NDArray[Any]], cap: I64 | None = None
) -> tuple[I64, ...]:
    """Per name: the quantiles of :data:`QUANTILES` with numpy's linear interpolation
    between the order statistics ``nth(k)`` (the k-th duration of each name, 0-based),
    at most ``cap``."""
    present = count > 0
    last = np.maximum(count - 1, 0)
    out: list[I64] = []
    for q in QUANTILES:
        h = last * q
        lo = np.floor(h).astype(np.int64)
        hi = np.minimum(lo + 1, last)
        a, b = nth(lo), nth(hi)
        t = h - lo
        # numpy's lerp, to the last bit: from the nearer end of the interval.
        value = np.where(t >= 0.5, b - (b - a) * (1 - t), a + (b - a) * t)
        if cap is not None:
            value = np.minimum(value, cap)
        out.append(np.where(present, np.round(value), 0).astype(np.int64))
    return tuple(out)


def function_stats(calls: Calls) -> StatsReport:
    """Statistics of every function called in ``calls``."""
    n_names = len(calls.names)
    name = calls.name_id
    dur = calls.duration
    count = np.bincount(name, minlength=n_names).astype(np.int64)
    has_parent = calls.parent >= 0
    in_callees = np.bincount(
        calls.parent[has_parent], weights=dur[has_parent], minlength=len(calls)
    )
    self_time = np.bincount(name, weights=dur - in_callees, minlength=n_names)
    outer = outermost_calls(calls)
    total = np.bincount(name[outer], weights=dur[outer], minlength=n_names)
    p50, p90, p99, longest = _quantiles(calls, count) if len(calls) else (count,) * 4
    functions = [
        FunctionStats(
            calls.names[i],
            int(count[i]),
            round(float(total[i])),
            round(float(self_time[i])),
            int(p50[i]),
            int(p90[i]),
            int(p99[i]),
            int(longest[i]),
        )
        for i in np.flatnonzero(count).tolist()
    ]
    top = calls.depth == 0
    return StatsReport(functions, int(dur[top].sum()), len(calls), calls.threads)


def _sort_key(key: str) -> tuple[str, bool]:
    if key not in SORT_KEYS:
        raise UsageError(f"--sort {key!r}: choose one of {', '.join(SORT_KEYS)}")
    attribute = {"total": "total_ns", "self": "self_ns", "calls": "calls", "max": "max_ns"}
    return attribute.get(key, f"{key}_ns" if key.startswith("p") else key), key != "name"


def match_pattern(match: str | None) -> re.Pattern[str] | None:
    """``--match REGEX`` compiled (None: every function), or a usage error."""
    if match is None:
        return None
    try:
        return re.compile(match)
    except re.error as e:
        raise UsageError(f"--match {match!r} is not a regular expression: {e}") from None


def select_functions(
    report: StatsReport, *, sort: str = "total", top: int = 0, match: str | None = None
) -> list[FunctionStats]:
    """The functions to show: those whose name matches ``match`` (a regular expression,
    searched), sorted by ``sort`` (largest first; names A to Z), the first ``top`` (all
    when 0)."""
    rows = report.functions
    pattern = match_pattern(match)
    if pattern is not None:
        rows = [f for f in rows if pattern.search(f.name)]
    attribute, descending = _sort_key(sort)
    rows = sorted(rows, key=lambda f: f.name)  # ties in name order
    rows.sort(key=lambda f: getattr(f, attribute), reverse=descending)
    return rows[:top] if top else rows


# -- streamed ----------------------------------------------------------------------------

_EXACT_BELOW: Final = 256
"""Durations below this many ns have a bucket each."""
_MANTISSA_BITS: Final = 7
"""Above, a bucket per 1/128 of a power of two: a bucket's middle is within 1/256 (0.4 %)
of every value in it."""


def _bucket(dur: I64) -> I64:
    """The histogram bucket of each duration (>= 0)."""
    value = np.maximum(dur, 0)
    _, exponent = np.frexp(value.astype(np.float64))  # value = m * 2**exponent, m in [.5, 1)
    shift = np.maximum(exponent.astype(np.int64) - 1 - _MANTISSA_BITS, 0)
    mantissa = value >> shift  # in [128, 256) above the exact range
    # (float rounding may put a value just under a power of two one bucket up: still
    # within the bucket's error.)
    mantissa = np.minimum(mantissa, (2 << _MANTISSA_BITS) - 1)
    buckets: I64 = np.where(
        value < _EXACT_BELOW,
        value,
        _EXACT_BELOW + (shift - 1) * (1 << _MANTISSA_BITS) + mantissa - (1 << _MANTISSA_BITS),
    )
    return buckets


def _bucket_value(bucket: I64) -> npt.NDArray[np.float64]:
    """The middle of each bucket."""
    above = np.maximum(bucket - _EXACT_BELOW, 0)
    shift = above // (1 << _MANTISSA_BITS) + 1
    low = ((above % (1 << _MANTISSA_BITS)) + (1 << _MANTISSA_BITS)).astype(np.float64) * (
        2.0 ** shift.astype(np.float64)
    )
    middle = low + (2.0 ** shift.astype(np.float64) - 1) / 2
    return np.where(bucket < _EXACT_BELOW, bucket.astype(np.float64), middle)


class DurationHistogram:
    """Per name, how many calls fell in each log bucket (sparse: names x buckets used)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)  # name << 16 | bucket, sorted
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, name: npt.NDArray[np.int32], dur: I64) -> None:
        if not len(dur):
            return
        found = np.unique((name.astype(np.int64) << 16) | _bucket(dur), return_counts=True)
        keys: I64 = found[0]
        counts: I64 = found[1]
        at: I64 = np.searchsorted(self.keys, keys)
        known: B = at < len(self.keys)
        known[known] = self.keys[at[known]] == keys[known]
        np.add.at(self.counts, at[known], counts[known])
        if not known.all():  # buckets seen for the first time (rarer and rarer)
            fresh = ~known
            merged = np.concatenate((self.keys, keys[fresh]))
            order = np.argsort(merged, kind="stable")
            self.keys = merged[order]
            self.counts = np.concatenate((self.counts, counts[fresh]))[order]

    def quantiles(self, count: I64, longest: I64) -> tuple[I64, ...]:
        """Per name: the quantiles of :data:`QUANTILES` (numpy's linear interpolation
        between the order statistics, each read as its bucket's middle, capped at the
        maximum)."""
        n_names = len(count)
        middle = _bucket_value(self.keys & 0xFFFF)
        cumulative = np.cumsum(self.counts)
        first_of_name = np.concatenate(([0], np.cumsum(count)[:-1]))
        present = count > 0
        # The k-th duration of a name (0-based) is in the first of its buckets whose
        # running count passes first_of_name + k.
        return _interpolated(
            count,
            lambda k: _nth(middle, cumulative, np.where(present, first_of_name + k, 0), n_names),
            longest,
        )


def _nth(
    middle: npt.NDArray[np.float64], cumulative: I64, index: I64, n_names: int
) -> npt.NDArray[np.float64]:
    """The value (bucket middle) of the ``index``-th duration of the histogram."""
    if not len(middle):
        return np.zeros(n_names)
    found = np.searchsorted(cumulative, index, "right").clip(max=len(middle) - 1)
    values: npt.NDArray[np.float64] = middle[found]
    return values


def _outermost_rows(name: npt.NDArray[np.int32], start: I64, end: I64) -> B:
    """``outermost_calls`` for the rows of one thread in start order (each call's callers
    among the rows before it)."""
    order = np.argsort(name, kind="stable")
    n = name[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = n[1:] != n[:-1]
    segment = np.cumsum(first) - 1
    reach = _segmented_running_max(end[order], segment)
    nested = np.zeros(len(order), dtype=bool)
    nested[1:] = ~first[1:] & (reach[:-1] > start[order][1:])
    outermost = np.empty(len(order), dtype=bool)
    outermost[order] = ~nested
    return outermost


class _Measure:
    """Per name: a per-call quantity's total (outermost calls) and self (minus direct
    callees) sums, and how many calls did not know it (-1 in the batch)."""

    def __init__(self, n: int) -> None:
        self.total = np.zeros(n, dtype=np.int64)
        self.own = np.zeros(n, dtype=np.int64)
        self.unknown = np.zeros(n, dtype=np.int64)
        self.top_level = 0

    def add(self, batch: CallBatch, value: I64, outer: B, has_parent: B) -> None:
        c = batch.carried
        known = value >= 0
        v = np.where(known, value, 0)
        new, name = v[c:], batch.name
        new_name = name[c:]
        n = len(self.own)
        self.own += _sum_by(new_name, new, n)
        self.own -= _sum_by(name[batch.parent[c:][has_parent]], new[has_parent], n)
        self.total += _sum_by(new_name[outer], new[outer], n)
        self.unknown += np.bincount(new_name[~known[c:]], minlength=n)
        self.top_level += int(new[batch.depth[c:] == 0].sum())


def _sum_by(index: npt.NDArray[np.int32], values: I64, n: int) -> I64:
    """``values`` summed per ``index`` (0..n-1), exactly: with one bincount (float64
    sums, exact while they stay below 2^53) when they do, else with ``np.add.at``."""
    if not len(values):
        return np.zeros(n, dtype=np.int64)
    if int(values.max()) < (1 << 53) // len(values):  # values >= 0
        return np.bincount(index, weights=values, minlength=n).astype(np.int64)
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, index, values)
    return out


class StatsAccumulator:
    """:func:`function_stats`, a batch of :class:`CallBatch` at a time; with ``counts``,
    also instruction and cycle sums (:meth:`function_counts`; the batches then need the
    slices' arguments)."""

    def __init__(self, names: list[str], *, exact: bool = False, counts: bool = False) -> None:
        self.names = names
        n = len(names)
        self.count = np.zeros(n, dtype=np.int64)
        self.total = np.zeros(n, dtype=np.int64)
        self.self_time = np.zeros(n, dtype=np.int64)
        self.longest = np.zeros(n, dtype=np.int64)
        self.top_level = 0
        self.calls = 0
        self.histogram = DurationHistogram()
        self.exact = exact
        self._durations: list[tuple[npt.NDArray[np.int32], I64]] = []
        self.instructions = _Measure(n) if counts else None
        self.cycles = _Measure(n) if counts else None

    def add(self, batch: CallBatch) -> None:
        c = batch.carried
        if c == len(batch):
            return
        dur = batch.duration
        name = batch.name
        new_name, new_dur = name[c:], dur[c:]
        self.calls += len(new_dur)
        np.add.at(self.count, new_name, 1)
        np.add.at(self.self_time, new_name, new_dur)
        parent = batch.parent[c:]
        has = parent >= 0
        np.subtract.at(self.self_time, name[parent[has]], new_dur[has])
        outer = _outermost_rows(name, batch.start, batch.end)[c:]
        np.add.at(self.total, new_name[outer], new_dur[outer])
        self.top_level += int(new_dur[batch.depth[c:] == 0].sum())
        np.maximum.at(self.longest, new_name, new_dur)
        if self.instructions is not None and self.cycles is not None:
            self.instructions.add(batch, batch.instructions, outer, has)
            self.cycles.add(batch, batch.cycles, outer, has)
        if self.exact:
            self._durations.append((new_name, new_dur))
        else:
            self.histogram.add(new_name, new_dur)

    def function_counts(self) -> list[FunctionCounts]:
        """Every function with at least one call (needs ``counts``), one per name: the
        name table's entries that share a name are summed."""
        insns, cycles = self.instructions, self.cycles
        if insns is None or cycles is None:
            raise ValueError("StatsAccumulator(counts=True) keeps the counts")
        out: dict[str, FunctionCounts] = {}
        for i in np.flatnonzero(self.count).tolist():
            row = FunctionCounts(
                self.names[i], int(self.count[i]), int(self.total[i]),
                int(self.self_time[i]), int(insns.total[i]), int(insns.own[i]),
                int(cycles.total[i]), int(cycles.own[i]), int(insns.unknown[i]),
                int(cycles.unknown[i]),
            )  # fmt: skip
            known = out.get(row.name)
            out[row.name] = row if known is None else known.merged(row)
        return list(out.values())

    def report(self, threads: list[ThreadInfo]) -> StatsReport:
        count = self.count
        if self.exact:
            name = np.concatenate([n for n, _ in self._durations] or [np.zeros(0, np.int32)])
            dur = np.concatenate([d for _, d in self._durations] or [np.zeros(0, np.int64)])
            p50, p90, p99, _ = _exact_quantiles(name, dur, count) if len(dur) else (count,) * 4
        else:
            p50, p90, p99 = self.histogram.quantiles(count, self.longest)
        functions = [
            FunctionStats(
                self.names[i],
                int(count[i]),
                int(self.total[i]),
                int(self.self_time[i]),
                int(p50[i]),
                int(p90[i]),
                int(p99[i]),
                int(self.longest[i]),
            )
            for i in np.flatnonzero(count).tolist()
        ]
        return StatsReport(functions, self.top_level, self.calls, threads)
