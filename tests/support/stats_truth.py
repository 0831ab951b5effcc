"""Per-function statistics computed the slow, obvious way from what the third-party
``fxt`` reader (PyPI) reads: the ground truth for ``ptscope stats`` and flame graphs.

Complete events are taken in file order, per thread stable-sorted by start, and nested
by Perfetto's rule (a call closes every open call that ends at or before its start and
is the child of the innermost one still open). Then, per call: its duration, its self
time (minus its direct callees), whether a caller above it has the same name.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from fxt.models import DurationCompleteEventRecord
from fxt.reader import parse_records


@dataclass
class Call:
    name: str
    start: int
    end: int
    parent: int  # index in the thread's list, -1 for a top-level call
    stack: tuple[str, ...]
    instructions: int = -1  # the slice's `instructions` arg (-1: none)


@dataclass
class Truth:
    calls: int = 0
    total: int = 0
    self_time: int = 0
    durations: list[int] = field(default_factory=list)
    instructions: int = 0  # outermost calls' counts (recursion once)
    self_instructions: int = 0

    def percentile(self, q: float) -> int:
        return round(float(np.percentile(self.durations, q)))


def third_party_calls(path: Path) -> dict[tuple[int, int], list[Call]]:
    """Every complete event, nested per thread (times in ticks after the time base)."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if gz else open(path, "rb") as f:
        result = parse_records(f)
    by_thread: dict[tuple[int, int], list[tuple[int, int, str, int]]] = {}
    for records in result.records_by_provider.values():
        for r in records.records:
            if isinstance(r, DurationCompleteEventRecord):
                key = (r.thread.process_id, r.thread.thread_id)
                # This reader calls the end word a duration; it is the end tick.
                insns = int(r.args.get("instructions", -1)) if r.args else -1
                by_thread.setdefault(key, []).append((r.timestamp_ns, r.duration_ns, r.name, insns))
    out: dict[tuple[int, int], list[Call]] = {}
    for key, rows in by_thread.items():
        rows.sort(key=lambda r: r[0])  # stable: file order among equal starts
        calls: list[Call] = []
        stack: list[int] = []
        for start, end, name, insns in rows:
            while stack and calls[stack[-1]].end <= start:
                stack.pop()
            parent = stack[-1] if stack else -1
            above = calls[parent].stack if parent >= 0 else ()
            calls.append(Call(name, start, end, parent, (*above, name), insns))
            stack.append(len(calls) - 1)
        out[key] = calls
    return out


def clip(
    threads: dict[tuple[int, int], list[Call]], lo: int, hi: int | None
) -> dict[tuple[int, int], list[Call | None]]:
    """Calls that overlap [lo, hi) clipped to it (None for the others)."""
    top = hi if hi is not None else 1 << 62
    out: dict[tuple[int, int], list[Call | None]] = {}
    for key, calls in threads.items():
        kept: list[Call | None] = []
        for c in calls:
            inside = (c.end > lo and c.start < top) or (c.start == c.end and lo <= c.start < top)
            if inside:
                s, e = max(c.start, lo), min(c.end, top)
                kept.append(Call(c.name, s, e, c.parent, c.stack))
            else:
                kept.append(None)
        out[key] = kept
    return out


def function_truth(
    threads: dict[tuple[int, int], list[Call]] | dict[tuple[int, int], list[Call | None]],
) -> dict[str, Truth]:
    truth: dict[str, Truth] = {}
    for calls in threads.values():
        for c in calls:
            if c is None:
                continue
            t = truth.setdefault(c.name, Truth())
            duration = c.end - c.start
            t.calls += 1
            t.durations.append(duration)
            t.self_time += duration
            insns = max(c.instructions, 0)
            t.self_instructions += insns
            if c.parent >= 0:
                parent = calls[c.parent]
                assert parent is not None  # a kept call's caller overlaps the window too
                truth[parent.name].self_time -= duration
                truth[parent.name].self_instructions -= insns
            if c.name not in c.stack[:-1]:
                t.total += duration
                t.instructions += insns
    return truth


def stacks_truth(threads: dict[tuple[int, int], list[Call]]) -> dict[tuple[str, ...], int]:
    """Time per stack (what a flame graph's box is as wide as)."""
    widths: dict[tuple[str, ...], int] = {}
    for calls in threads.values():
        for c in calls:
            widths[c.stack] = widths.get(c.stack, 0) + c.end - c.start
    return widths
