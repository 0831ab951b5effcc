"""Every call of a trace, thread by thread in start order, in batches, in bounded memory.

A trace's slices are written as calls return (and split over parts), so nesting them needs
them in start order: an external sort. **Pass 1** reads the trace a block at a time
(:class:`ptscope.fxt.chunks.ChunkReader`) and cuts it into *runs* of at most
:data:`RUN_ROWS` slices, each sorted by (thread, start, file order) and, when there is more
than one, written to a temporary directory. **Pass 2** takes the threads in (pid, tid)
order and merges each thread's rows from every run (a window of each run in memory; rows
before the earliest window end are safe to hand over), then nests each batch: the calls
still open at the end of a batch (the chain from its last call to the top level, at most
the stack depth) are carried to the next one, so every call's parent is in its batch.

Memory is a run while it is sorted, then the merge windows: it does not grow with the
trace (``bench/stats.py --sizes`` measures it). A trace that fits in one run is never
written out.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ptscope.fxt.chunks import ChunkReader, NotStreamable, SliceChunk, TraceMeta
from ptscope.fxt.columns import _depths, _NotOurSubset

__all__ = ["RUN_ROWS", "CallBatch", "CallStream", "StreamThread"]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]

RUN_ROWS: Final = 1 << 19
"""Slices per sorted run (about 23 MB)."""
WINDOW_ROWS: Final = 1 << 16
"""Rows of each run in memory while merging."""

_TYPES: Final[dict[str, type[np.generic]]] = {
    "thread": np.int32,
    "text": np.int32,
    "start": np.int64,
    "end": np.int64,
    "instructions": np.int64,
    "cycles": np.int64,
    "flags": np.uint8,
}
"""The columns of a run (perf ns; ``thread`` and ``text`` index the trace's meta); the
last three only when the arguments are read."""
_ARGS: Final = ("instructions", "cycles", "flags")


class _Rows:
    """Slices as columns (a run, a window of one, a batch)."""

    __slots__ = ("columns",)

    def __init__(self, columns: dict[str, npt.NDArray[Any]]) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return int(self.columns["start"].shape[0])

    def __getitem__(self, name: str) -> npt.NDArray[Any]:
        return self.columns[name]

    def take(self, rows: npt.NDArray[np.intp] | slice) -> _Rows:
        return _Rows({k: v[rows] for k, v in self.columns.items()})

    @staticmethod
    def join(parts: Sequence[_Rows]) -> _Rows:
        if len(parts) == 1:
            return parts[0]
        return _Rows({k: np.concatenate([p.columns[k] for p in parts]) for k in parts[0].columns})

    @staticmethod
    def empty(names: Sequence[str]) -> _Rows:
        return _Rows({k: np.zeros(0, dtype=_TYPES[k]) for k in names})


@dataclass
class StreamThread:
    pid: int
    tid: int
    name: str
    process: str
    index: int
    """The thread's number in the meta (what runs store)."""


@dataclass
class CallBatch:
    """Consecutive calls of one thread in start order, after the calls carried from its
    previous batch. Rows ``[0, carried)`` are those carried calls (already handed over);
    ``parent`` is a row of this batch (-1: a top-level call); ``next_carry`` are the rows
    the thread's next batch begins with, in order. Times are ns from the trace's first
    event, clipped to the window; ``name`` indexes :attr:`CallStream.names`."""

    thread: int
    carried: int
    start: I64
    end: I64
    depth: I32
    parent: I64
    name: I32
    instructions: I64
    cycles: I64
    flags: npt.NDArray[np.uint8]
    next_carry: I64

    def __len__(self) -> int:
        return int(self.start.shape[0])

    @property
    def duration(self) -> I64:
        return self.end - self.start


@dataclass
class _Run:
    rows: _Rows | None = None  # in memory
    path: Path | None = None  # or on disk: a file per column, PATH.<column>
    names: tuple[str, ...] = ()
    length: int = 0
    stored: dict[str, np.dtype[Any]] = field(default_factory=dict)
    """Columns written narrower than their type (see :meth:`write`)."""
    bounds: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Row ranges by thread: thread t is rows [bounds[t], bounds[t + 1])."""

    def read(self, first: int, count: int) -> _Rows:
        if self.rows is not None:
            return self.rows.take(slice(first, first + count))
        assert self.path is not None
        count = max(0, min(count, self.length - first))
        columns = {}
        for k in self.names:
            stored = self.stored.get(k, np.dtype(_TYPES[k]))
            column = np.fromfile(
                self.path.with_suffix(f".{k}"),
                dtype=stored,
                count=count,
                offset=first * stored.itemsize,
            )
            columns[k] = column if stored == _TYPES[k] else column.astype(_TYPES[k])
        return _Rows(columns)

    def write(self, path: Path) -> None:
        """To disk, a file per column; a 64-bit column whose values all fit 32 bits is
        written as 32 (counts, and times in traces under 2 s: less to write and read)."""
        assert self.rows is not None
        for k in self.names:
            column = self.rows[k]
            if column.dtype == np.int64 and len(column):
                low, high = int(column.min()), int(column.max())
                if low >= -(1 << 31) and high < 1 << 31:
                    column = column.astype(np.int32)
                    self.stored[k] = column.dtype
            column.tofile(path.with_suffix(f".{k}"))
        self.path = path
        self.rows = None


class CallStream:
    """``with CallStream(paths) as calls: for batch in calls.batches(): ...``.

    ``tids``: only these threads; ``window`` (ns from the first event, end None: to the
    end): only calls that overlap it, clipped. Raises what the readers raise
    (:class:`ptscope.fxt.FxtFormatError`, OSError).
    """

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        with_args: bool = False,
        run_rows: int = RUN_ROWS,
        window_rows: int = WINDOW_ROWS,
    ) -> None:
        self.paths = list(paths)
        self.with_args = with_args
        self.run_rows = run_rows
        self.window_rows = window_rows
        self._tmp: Path | None = None
        self.runs: list[_Run] = []
        self.meta = TraceMeta()

    def __enter__(self) -> CallStream:
        try:
            self._read()
        except NotStreamable:
            self._discard()
            self._read(strict=True)
        except BaseException:
            self._discard()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._discard()

    def _discard(self) -> None:
        self.runs = []
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    # -- pass 1 ----------------------------------------------------------------------

    def _read(self, *, strict: bool = False) -> None:
        reader = ChunkReader(self.paths, with_args=self.with_args, strict=strict)
        names = ("thread", "text", "start", "end", *(_ARGS if self.with_args else ()))
        pending: list[_Rows] = []
        count = 0
        for chunk in reader.chunks():
            rows = _as_rows(chunk, names)
            while len(rows):
                room = self.run_rows - count
                pending.append(rows.take(slice(0, room)))
                count += len(pending[-1])
                rows = rows.take(slice(room, None))
                if count >= self.run_rows:
                    self._cut(pending, names, on_disk=True)
                    pending, count = [], 0
        if pending or not self.runs:
            self._cut(pending, names, on_disk=bool(self.runs))
        self.meta = reader.meta
        n_threads = len(self.meta.thread_keys)
        for run in self.runs:
            run.bounds = _bounds(run, n_threads)

    def _cut(self, pending: list[_Rows], names: tuple[str, ...], *, on_disk: bool) -> None:
        rows = _Rows.join(pending) if pending else _Rows.empty(names)
        pending.clear()
        order = _run_order(rows["start"], rows["thread"])
        rows = rows.take(order)
        del order
        run = _Run(rows=rows, names=names, length=len(rows))
        self.runs.append(run)
        if not on_disk:
            return
        if self._tmp is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="ptscope-analyze-"))
        for k, old in enumerate(self.runs):  # (the first went to memory)
            if old.rows is not None:
                old.write(self._tmp / f"run-{k:05d}")

    # -- what pass 1 learnt ----------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return self.meta.texts

    @property
    def origin(self) -> int:
        """perf ns of the trace's first event (slices, instants, counters)."""
        return self.meta.first_time or 0

    @property
    def span(self) -> int:
        """ns from the first event to the last."""
        return (self.meta.last_time or 0) - self.origin

    def threads(self) -> list[StreamThread]:
        """Threads with calls, in (pid, tid) order."""
        with_calls = np.zeros(len(self.meta.thread_keys), dtype=bool)
        for run in self.runs:
            with_calls |= np.diff(run.bounds) > 0
        keys = self.meta.thread_keys
        return [
            StreamThread(
                pid,
                tid,
                self.meta.thread_names.get((pid, tid), ""),
                self.meta.processes.get(pid, ""),
                i,
            )
            for i, (pid, tid) in sorted(enumerate(keys), key=lambda item: item[1])
            if with_calls[i]
        ]

    # -- pass 2 ----------------------------------------------------------------------

    def batches(
        self,
        threads: Sequence[StreamThread] | None = None,
        *,
        window: tuple[int, int | None] | None = None,
    ) -> Iterator[CallBatch]:
        """The calls of ``threads`` (all with calls when None), thread after thread.
        ``window`` is (start, end) in ns from the first event; each batch's ``thread`` is
        the position of its thread in ``threads``."""
        chosen = self.threads() if threads is None else list(threads)
        origin = self.origin
        for position, thread in enumerate(chosen):
            carry: _Rows | None = None
            for rows in self._merged(thread.index):
                rows = _Rows.join((carry, rows)) if carry is not None and len(carry) else rows
                start = rows["start"]
                end = rows["end"]
                try:
                    depth, parent = _depths(start, end)
                except _NotOurSubset:
                    from ptscope.fxt.reader import FxtFormatError

                    raise FxtFormatError(
                        f"slices of thread {thread.tid} do not nest (around ns "
                        f"{int(start[0]) - origin})"
                    ) from None
                chain = _chain(parent)
                carried = 0 if carry is None else len(carry)
                batch = _batch(position, rows, carried, depth, parent, chain, origin, window)
                carry = rows.take(chain)
                yield batch  # (even with no new call: the carried calls changed)

    def _merged(self, thread: int) -> Iterator[_Rows]:
        """Thread ``thread``'s rows of every run, in (start, run, row) order, in pieces."""
        ranges = [
            (run, int(run.bounds[thread]), int(run.bounds[thread + 1]))
            for run in self.runs
            if run.bounds[thread + 1] > run.bounds[thread]
        ]
        if len(ranges) == 1:
            run, lo, hi = ranges[0]
            step = max(self.window_rows, 1) * 4
            for first in range(lo, hi, step):
                yield run.read(first, min(step, hi - first))
            return
        cursor = [lo for _, lo, _ in ranges]
        size = [self.window_rows] * len(ranges)
        window = [
            run.read(lo, min(s, hi - lo)) for (run, lo, hi), s in zip(ranges, size, strict=True)
        ]
        while True:
            live = [k for k in range(len(ranges)) if len(window[k])]
            if not live:
                return
            # Rows before the earliest end of a window that does not reach its run's end
            # are all here; rows at that very time may go on past the window.
            limits = [
                (int(window[k]["start"][-1]), k)
                for k in live
                if cursor[k] + len(window[k]) < ranges[k][2]
            ]
            horizon = min(limits)[0] if limits else None
            taken = []
            for k in live:
                w = window[k]
                n = len(w) if horizon is None else int(np.searchsorted(w["start"], horizon))
                if n:
                    taken.append(w.take(slice(0, n)))
                    window[k] = w.take(slice(n, None))
                    cursor[k] += n
            if not taken:
                k = min(limits)[1]  # one time fills a whole window: read more of it
                size[k] *= 2
            else:
                rows = _Rows.join(taken)
                if len(taken) > 1:
                    rows = rows.take(np.argsort(rows["start"], kind="stable"))
                yield rows
            for k in live:
                run, _, hi = ranges[k]
                have = len(window[k])
                if have < size[k] and cursor[k] + have < hi:
                    more = run.read(cursor[k] + have, min(size[k] - have, hi - cursor[k] - have))
                    window[k] = _Rows.join((window[k], more))


def _run_order(start: I64, thread: npt.NDArray[np.int32]) -> npt.NDArray[np.intp]:
    """The order of rows by (thread, start), file order in ties: one stable sort of one
    key where it fits in 63 bits (timsort: fast on the nearly sorted starts of calls
    written as they return)."""
    if not len(start):
        return np.zeros(0, dtype=np.intp)
    low = int(start.min())
    width = int(start.max()) - low + 1
    threads = int(thread.max()) + 1
    if threads == 1:
        order: npt.NDArray[np.intp] = np.argsort(start, kind="stable")
        return order
    if width < (1 << 62) // threads:
        key = thread.astype(np.int64) * width + (start - low)
        order = np.argsort(key, kind="stable")
        return order
    return np.lexsort((start, thread))


def _as_rows(chunk: SliceChunk, names: tuple[str, ...]) -> _Rows:
    return _Rows({k: np.asarray(getattr(chunk, k), dtype=_TYPES[k]) for k in names})


def _bounds(run: _Run, n_threads: int) -> I64:
    """Row ranges of every thread in a run (rows sorted by thread)."""
    counts = np.zeros(n_threads, dtype=np.int64)
    step = 1 << 20
    for first in range(0, run.length, step):
        counts += np.bincount(run.read(first, step)["thread"], minlength=n_threads)
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


def _chain(parent: I64) -> I64:
    """The last row and its ancestors, outermost first: the calls that can still be open
    for rows that start later."""
    out = []
    i = len(parent) - 1
    while i >= 0:
        out.append(i)
        i = int(parent[i])
    return np.asarray(out[::-1], dtype=np.int64)


def _batch(
    position: int,
    rows: _Rows,
    carried: int,
    depth: I32,
    parent: I64,
    chain: I64,
    origin: int,
    window: tuple[int, int | None] | None,
) -> CallBatch:
    start = rows["start"] - origin
    end = rows["end"] - origin
    keep = None
    if window is not None:
        most = int(np.iinfo(np.int64).max)
        lo = min(window[0], most)
        hi = most if window[1] is None else min(window[1], most)
        inside = (end > lo) & (start < hi)
        inside |= (start == end) & (start >= lo) & (start < hi)
        if not inside.all():
            keep = np.flatnonzero(inside)
        np.maximum(start, lo, out=start)
        np.minimum(end, hi, out=end)
    if keep is not None:
        renumber = np.full(len(rows), -1, dtype=np.int64)
        renumber[keep] = np.arange(len(keep))
        up = parent[keep]
        parent = np.where(up >= 0, renumber[np.maximum(up, 0)], -1)
        carried = int(np.searchsorted(keep, carried))
        chain = renumber[chain]
        chain = chain[chain >= 0]
        rows, start, end, depth = rows.take(keep), start[keep], end[keep], depth[keep]
    n = len(rows)
    args = "flags" in rows.columns
    return CallBatch(
        position,
        carried,
        start,
        end,
        depth,
        parent,
        rows["text"],
        rows["instructions"] if args else np.full(n, -1, dtype=np.int64),
        rows["cycles"] if args else np.full(n, -1, dtype=np.int64),
        rows["flags"] if args else np.zeros(n, dtype=np.uint8),
        chain,
    )
