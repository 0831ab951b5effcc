"""The reconstructed trace: per-thread slices, instants and counters, ready to be written.

This is the contract between the reconstruct stage (which builds it) and the write stage
(which serialises it). It is pure data: column arrays so that writers can encode millions
of slices without a Python loop per slice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntFlag

import numpy as np
import numpy.typing as npt

__all__ = [
    "CounterSample",
    "Instant",
    "NestingError",
    "Slice",
    "SliceBatch",
    "SliceFlags",
    "ThreadTimeline",
    "Timeline",
    "check_nesting",
    "parents_from_depth",
]

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
UInt64Array = npt.NDArray[np.uint64]
UInt8Array = npt.NDArray[np.uint8]


class SliceFlags(IntFlag):
    """Facts about a slice that a viewer may want to show."""

    NONE = 0
    INFERRED_START = 1
    """The call was never seen (trace started inside it): it starts at its segment's start."""
    OPEN_AT_END = 2
    """The return was never seen: it ends where the thread's trace ends (or its segment)."""
    SYNTHETIC = 4
    """Not a function: ``[untraced]``, ``[syscall]``."""
    INLINED = 8
    """Not a call: an inlined function's body, inside the function it was inlined in."""


@dataclass(slots=True)
class Slice:
    """One slice as a row (for tests and ``dump``; writers use the columns)."""

    start: int
    end: int
    depth: int
    name: str
    address: int = 0
    instructions: int = -1
    cycles: int = -1
    flags: SliceFlags = SliceFlags.NONE
    icache_lines: int = -1


@dataclass(slots=True)
class Instant:
    """A zero-length marker on a thread (for example ``[decode error: ...]``)."""

    time: int
    name: str
    args: dict[str, int | str] = field(default_factory=dict)


@dataclass(slots=True)
class CounterSample:
    """One value of a named counter on a thread's process (for example CPU frequency)."""

    time: int
    name: str
    value: int


def _empty_i64() -> Int64Array:
    return np.zeros(0, dtype=np.int64)


@dataclass
class ThreadTimeline:
    """Everything one thread did, as slice columns sorted by (start, depth).

    Times are perf time in nanoseconds. ``name_id`` indexes :attr:`Timeline.names`.
    ``address`` is the function's entry address (0 when unknown); ``instructions``,
    ``cycles`` and ``icache_lines`` (distinct 64-byte code lines executed, callees
    included) are -1 when unknown.
    """

    pid: int
    tid: int
    name: str = ""
    start: Int64Array = field(default_factory=_empty_i64)
    end: Int64Array = field(default_factory=_empty_i64)
    depth: Int32Array = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    name_id: Int32Array = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    address: UInt64Array = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    instructions: Int64Array = field(default_factory=_empty_i64)
    cycles: Int64Array = field(default_factory=_empty_i64)
    flags: UInt8Array = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    instants: list[Instant] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)
    icache_lines: Int64Array | None = None
    """None: unknown for every slice."""
    perf_start: Int64Array | None = None
    """Perf time of each slice's start and end as the events said, whatever the time axis
    (what a slice's ``drill`` command selects by); None: not kept (the Python engine)."""
    perf_end: Int64Array | None = None
    anchor_ip: UInt64Array | None = None
    """Where each slice's ``drill`` command finds its call in perf's instruction listing:
    the address of the call (or tail-call jump) instruction that started it, executed
    right before its first instruction; :attr:`SliceBatch.anchor_ip` says more."""
    anchor_occurrence: Int64Array | None = None
    """Which execution of :attr:`anchor_ip` at :attr:`perf_start` it was (1-based; 0: no
    anchor: an inferred or synthetic slice, or one started otherwise)."""

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def slices(self, names: Sequence[str]) -> Iterator[Slice]:
        """The slices as rows (slow; for tests, ``dump`` and small traces)."""
        for i in range(len(self)):
            yield Slice(
                int(self.start[i]),
                int(self.end[i]),
                int(self.depth[i]),
                names[int(self.name_id[i])],
                int(self.address[i]),
                int(self.instructions[i]),
                int(self.cycles[i]),
                SliceFlags(int(self.flags[i])),
                int(self.icache_lines[i]) if self.icache_lines is not None else -1,
            )

    def time_range(self) -> tuple[int, int] | None:
        """(first, last) time of anything on this thread, or None if it is empty."""
        times: list[int] = [i.time for i in self.instants] + [c.time for c in self.counters]
        if len(self):
            times += [int(self.start.min()), int(self.end.max())]
        return (min(times), max(times)) if times else None


@dataclass
class Timeline:
    """A whole reconstructed trace.

    ``names`` is the shared name table for slices; ``processes`` maps a pid to its command
    line (or comm); ``threads`` are in a stable order (pid, tid).
    """

    names: list[str] = field(default_factory=list)
    threads: list[ThreadTimeline] = field(default_factory=list)
    processes: dict[int, str] = field(default_factory=dict)

    def slice_count(self) -> int:
        return sum(len(t) for t in self.threads)

    def time_range(self) -> tuple[int, int] | None:
        ranges = [r for t in self.threads if (r := t.time_range()) is not None]
        if not ranges:
            return None
        return min(r[0] for r in ranges), max(r[1] for r in ranges)


@dataclass
class SliceBatch:
    """What a streaming engine wrote since its last batch: slices of any threads as columns
    (in the order they were finished, not by start), instants and counter samples.

    ``names`` is the engine's name table (``name_id`` indexes it; it only grows, so a
    later batch's table is valid for earlier batches too). ``start_slot``/``end_slot``
    are the slices' slots when the engine keeps them (transcript tests), else None.
    """

    names: list[str]
    call_sites: dict[int, str] | None = None
    """Where each name id that stands for an inlined body was inlined (``file:line``): its
    slices' ``call_site`` arg. Like :attr:`names`, it only grows."""
    pid: Int64Array = field(default_factory=_empty_i64)
    tid: Int64Array = field(default_factory=_empty_i64)
    start: Int64Array = field(default_factory=_empty_i64)
    end: Int64Array = field(default_factory=_empty_i64)
    name_id: Int32Array = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    address: UInt64Array = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    instructions: Int64Array = field(default_factory=_empty_i64)
    cycles: Int64Array = field(default_factory=_empty_i64)
    flags: UInt8Array = field(default_factory=lambda: np.zeros(0, dtype=np.uint8))
    start_slot: Int64Array | None = None
    end_slot: Int64Array | None = None
    perf_start: Int64Array | None = None
    """Perf time of each slice's start and end as the events said (what ``perf script
    --time`` selects by), whatever the time axis of ``start``/``end``."""
    perf_end: Int64Array | None = None
    anchor_ip: UInt64Array | None = None
    """The address of the call or tail-call jump instruction that started each slice (the
    instruction right before its first). perf's instruction listing has each executed
    instruction once, in order, and dates a call or jump with its branch's time, so the
    slice's instructions are the ``instructions`` that follow the
    :attr:`anchor_occurrence`-th instruction at this address dated :attr:`perf_start`."""
    anchor_occurrence: Int64Array | None = None
    """Which execution of :attr:`anchor_ip` at :attr:`perf_start` started the slice
    (1-based; 0: no anchor: inferred, synthetic, or started by anything but a call or a
    tail call). None with :attr:`anchor_ip`: not kept (the Python engine)."""
    icache_lines: Int64Array | None = None
    """Distinct 64-byte code lines each slice executed (-1 unknown); None: all unknown."""
    instants: list[tuple[int, int, Instant]] = field(default_factory=list)
    """(pid, tid, instant)"""
    counters: list[tuple[int, int, CounterSample]] = field(default_factory=list)
    """(pid, tid, sample)"""

    def __len__(self) -> int:
        return int(self.start.shape[0])


def parents_from_depth(depth: npt.NDArray[np.integer]) -> npt.NDArray[np.int64]:
    """The parent row of every row of one thread's slices in (start, depth) order: the
    latest earlier row one level up (-1 at depth 0). Vectorised per depth level; rows at
    a depth with no row one level up before them get -1 too."""
    n = len(depth)
    parent = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return parent
    levels = int(depth.max()) + 1
    if int(depth.min()) < 0:
        raise ValueError("negative depth")
    # A stable sort groups the rows by depth, each group in row order (radix sort when
    # the depths fit 16 bits).
    key = depth.astype(np.uint16) if levels <= 1 << 16 else depth
    by_depth = np.argsort(key, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(depth, minlength=levels))))
    for d in range(1, levels):
        rows = by_depth[bounds[d] : bounds[d + 1]]
        above = by_depth[bounds[d - 1] : bounds[d]]
        if not rows.size or not above.size:
            continue
        at = np.searchsorted(above, rows) - 1
        found = at >= 0
        parent[rows[found]] = above[at[found]]
    return parent


class NestingError(AssertionError):
    """A thread's slices do not form a properly nested tree."""


def check_nesting(thread: ThreadTimeline) -> None:
    """Verify that the slices of one thread form a properly nested forest.

    Rules (the ones a viewer relies on): rows are sorted by (start, depth); no slice ends
    before it starts; a slice with children lasts at least 1 ns; a slice at depth d > 0 lies
    inside its parent (the latest earlier row at depth d - 1) and starts strictly before the
    parent ends (unless both start together); siblings do not overlap. Raises
    :class:`NestingError` naming the first violation.
    """
    n = len(thread)
    if n == 0:
        return
    start, end, depth = thread.start, thread.end, thread.depth
    bad = np.flatnonzero(end < start)
    if bad.size:
        i = int(bad[0])
        raise NestingError(f"slice {i} ends before it starts ({start[i]} > {end[i]})")
    if np.any(depth < 0):
        raise NestingError("negative depth")
    order = np.lexsort((depth, start))
    if not np.array_equal(order, np.arange(n)):
        raise NestingError("slices are not sorted by (start, depth)")
    last_at_depth: list[int] = []  # index of the latest row seen at each depth
    s_list, e_list, d_list = start.tolist(), end.tolist(), depth.tolist()
    for i in range(n):
        s, e, d = s_list[i], e_list[i], d_list[i]
        if d > len(last_at_depth):
            raise NestingError(f"slice {i} at depth {d} has no parent at depth {d - 1}")
        parent = last_at_depth[d - 1] if d > 0 else -1
        if parent >= 0:
            ps, pe = s_list[parent], e_list[parent]
            if ps == pe:
                # Viewers cannot tell a zero-length parent's children from its siblings.
                raise NestingError(f"slice {parent} has children but no duration (t={ps})")
            if s < ps or e > pe or (s >= pe and s != ps):
                raise NestingError(
                    f"slice {i} [{s}, {e}] at depth {d} is not inside its parent "
                    f"{parent} [{ps}, {pe}]"
                )
        if d < len(last_at_depth):
            sibling = last_at_depth[d]
            if sibling > parent and e_list[sibling] > s:
                raise NestingError(
                    f"slice {i} [{s}, {e}] overlaps its sibling {sibling} "
                    f"[{s_list[sibling]}, {e_list[sibling]}] at depth {d}"
                )
            del last_at_depth[d:]
        last_at_depth.append(i)
