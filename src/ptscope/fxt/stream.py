"""Writing a trace as it is decoded: streamed slice batches in, one or several FXT files out.

A streaming engine hands over slices as they finish (:class:`~ptscope.timeline.SliceBatch`),
not in start order: Perfetto sorts a Fuchsia trace by time before it nests slices (the
whole file, see docs/file-formats.md), and the engine writes an outer slice before an inner
one that starts at the same time, so close order loads correctly.

Split output (``--split-size``, ``--split-time``): the trace is cut at time boundaries into
``OUT-000.fxt.gz``, ``OUT-001.fxt.gz``, ... each a valid trace of its own. A call that
crosses a boundary appears in every part it overlaps, cut at the boundaries and marked with
the arg ``continued`` ("from previous part", "in next part"); its instruction and cycle
counts are those of the whole call, so they are left off the pieces. With ``--split-time``
the boundaries are every DURATION from the trace's start; with ``--split-size`` a boundary
is placed where the newest part has grown past SIZE (at the end of the latest slice written
so far, or just after the latest time written when an empty slice or an instant is there).
Every part stays open until the end, since a call written late (it returned late) still
belongs to the parts it overlaps.

A split makes at most :data:`MAX_PARTS` parts: one that would make more (``--split-time
1ns`` on a trace of milliseconds, a size far below the trace's) is refused with one line
as soon as the decode shows it, before the parts past the limit are opened, and the parts
already written are removed.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final, NoReturn, cast

import numpy as np
import numpy.typing as npt

from ptscope.errors import PtscopeError
from ptscope.fxt import records as rec
from ptscope.fxt.totals import FunctionTotals
from ptscope.fxt.writer import Drill, FxtWriter, WriteStats
from ptscope.timeline import CounterSample, Instant, SliceBatch

__all__ = ["MAX_PARTS", "PartInfo", "TooManyParts", "TraceStream", "part_path"]

FROM_PREVIOUS: Final = 1
IN_NEXT: Final = 2
MAX_PARTS: Final = 1000
"""The most parts a split trace has (each stays open until the end: one file each)."""


class TooManyParts(PtscopeError):
    """A split would make more than :data:`MAX_PARTS` parts."""

    exit_code = 2


def _ns(ns: int) -> str:
    for unit, scale in (("s", 10**9), ("ms", 10**6), ("us", 10**3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns} ns"


def _bytes(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n} bytes"


def part_path(output: Path, index: int) -> Path:
    """``trace.fxt.gz`` → ``trace-003.fxt.gz`` (the part's number before the suffixes)."""
    name = output.name
    stem, dot, rest = name.partition(".")
    suffix = f"{dot}{rest}" if dot else ""
    return output.with_name(f"{stem}-{index:03d}{suffix}")


@dataclass
class PartInfo:
    """One file of a (split) trace."""

    path: Path
    start: int
    """The part's time range in perf ns: [start, end)."""
    end: int
    slices: int = 0
    file_bytes: int = 0


@dataclass
class _Part:
    info: PartInfo
    writer: FxtWriter
    processes: set[int] = field(default_factory=set)
    carried: list[tuple[SliceBatch, npt.NDArray[np.intp], npt.NDArray[np.uint8]]] = field(
        default_factory=list
    )
    """Pieces of calls begun in an earlier part, and calls that begin right at this part's
    start: they all start at the part's start, so they are written at the end, outermost
    first (Perfetto nests equal starts in file order, and drops a parent written after its
    child); held back, they are as many as the calls open at the boundary and those begun
    in its nanosecond."""


class TraceStream:
    """Writes slice batches to ``output`` (or to numbered parts of it).

    ``time_base`` is the trace's earliest time (every time written must be at or after it).
    ``processes`` names the processes known upfront; others are named when first seen and
    renamed by :meth:`close`.
    """

    def __init__(
        self,
        output: Path,
        time_base: int,
        *,
        split_size: int | None = None,
        split_time: int | None = None,
        compress: bool | None = None,
        gzip_level: int | None = None,
        processes: dict[int, str] | None = None,
        time_axis: str = "time",
        drill: Path | None = None,
    ) -> None:
        """``drill``: the recording that ``ptscope insns`` can drill into (each slice then
        carries the command, when its batch has perf times)."""
        if split_size is not None and split_time is not None:
            raise ValueError("split by size or by time, not both")
        self.output = output
        self.time_base = time_base
        self._split_size = split_size
        self._split_time = split_time
        self._compress = compress
        self._gzip_level = gzip_level
        self._names: dict[int, str] = dict(processes or {})
        self.time_axis = time_axis
        self._drill = None if drill is None else shlex.quote(str(drill))
        self._parts: list[_Part] = []
        self._bounds: list[int] = []  # start of parts 1, 2, ... (part 0 starts at the base)
        self._latest_end = time_base
        self._latest_time = time_base - 1
        """The latest time anything written so far begins at (a slice, an instant, a
        counter sample): a size split's boundary is after it, so that nothing of an earlier
        part lies at or past its end."""
        self.slices = 0
        self.threads: set[tuple[int, int]] = set()
        self.totals = FunctionTotals()
        self.names: list[str] = []
        self.call_sites: dict[int, str] | None = None
        self._open_part()

    @property
    def split(self) -> bool:
        return self._split_size is not None or self._split_time is not None

    # ------------------------------------------------------------------ parts

    def _open_part(self) -> None:
        index = len(self._parts)
        path = part_path(self.output, index) if self.split else self.output
        start = self._bounds[index - 1] if index else self.time_base
        writer = FxtWriter.open(
            path, compress=self._compress, time_base=self.time_base, gzip_level=self._gzip_level
        )
        part = _Part(PartInfo(path, start, start), writer)
        self._parts.append(part)
        for pid, name in sorted(self._names.items()):
            self._process(part, pid, name)

    def _process(self, part: _Part, pid: int, name: str) -> None:
        part.processes.add(pid)
        # On another time axis a tick is an instruction or a cycle: the records say so.
        extra = {rec.ARG_TIME_AXIS: self.time_axis} if self.time_axis != "time" else None
        part.writer.process(pid, name, extra)

    def _part_of(self, time: int) -> int:
        """The part a point in time falls into, opening parts as time goes on (time split)."""
        if self._split_time is not None:
            needed = (time - self.time_base) // self._split_time + 1
            if needed > MAX_PARTS:
                self._refuse(
                    f"--split-time {_ns(self._split_time)} would cut this trace into more "
                    f"than {MAX_PARTS:,} parts (it runs for {_ns(time - self.time_base)} at "
                    "least): choose a longer DURATION"
                )
            while time >= self.time_base + len(self._parts) * self._split_time:
                self._bounds.append(self.time_base + len(self._parts) * self._split_time)
                self._open_part()
        return int(np.searchsorted(np.asarray(self._bounds, dtype=np.int64), time, "right"))

    def _maybe_cut(self) -> None:
        """Size split: a new part once the newest one is big enough."""
        if self._split_size is None:
            return
        newest = self._parts[-1]
        if _written(newest.writer) < self._split_size:
            return
        bound = max(self._latest_end, self._latest_time + 1)
        if bound <= (self._bounds[-1] if self._bounds else self.time_base):
            return  # nothing finished since the last cut: wait
        if len(self._parts) >= MAX_PARTS:
            self._refuse(
                f"--split-size {_bytes(self._split_size)} would cut this trace into more than "
                f"{MAX_PARTS:,} parts: choose a bigger SIZE"
            )
        self._bounds.append(bound)
        self._open_part()

    def _refuse(self, message: str) -> NoReturn:
        """Stop a split that makes too many parts: remove the parts written so far."""
        self.abort()
        raise TooManyParts(message)

    # ---------------------------------------------------------------- writing

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A failed write (a full disk, an output perf's /proc says is a file but that
        takes no bytes) is one line."""
        try:
            yield
        except OSError as e:
            raise self._cannot_write(e) from e

    def write(self, batch: SliceBatch) -> None:
        """Write a batch (any threads, any order)."""
        with self._writing():
            self._write(batch)

    def _cannot_write(self, error: OSError) -> PtscopeError:
        return PtscopeError(
            f"cannot write {self.output}: {error.strerror or error}",
            hint="check the free space and the path",
        )

    def _write(self, batch: SliceBatch) -> None:
        self._account(batch)
        if len(batch):
            self._write_slices(batch)
        for pid, tid, instant in batch.instants:
            self._instant(pid, tid, instant)
        for pid, tid, sample in batch.counters:
            self.counter(pid, tid, sample)
        self._maybe_cut()

    def _account(self, batch: SliceBatch) -> None:
        n = len(batch)
        self.slices += n
        self.names = batch.names
        self.call_sites = batch.call_sites
        if not n:
            return
        if (
            batch.pid[0] == batch.pid[-1]
            and batch.tid[0] == batch.tid[-1]
            and (np.all(batch.tid == batch.tid[0]) and np.all(batch.pid == batch.pid[0]))
        ):
            self.threads.add((int(batch.pid[0]), int(batch.tid[0])))
        else:
            pairs = np.unique((batch.pid << 32) | (batch.tid & 0xFFFFFFFF))
            self.threads.update((int(k >> 32), int(k & 0xFFFFFFFF)) for k in pairs.tolist())
        self.totals.add(batch.name_id, batch.start, batch.end, len(batch.names))
        self._latest_end = max(self._latest_end, int(batch.end.max()))
        self._latest_time = max(self._latest_time, int(batch.start.max()))

    def _write_slices(self, batch: SliceBatch) -> None:
        start = np.maximum(batch.start, self.time_base)
        end = np.maximum(batch.end, start)
        if not self.split:
            self._write_rows(self._parts[0], batch, None, start, end, None)
            return
        self._part_of(int(end.max()))  # time split: every part up to the latest end exists
        bounds = np.asarray(self._bounds, dtype=np.int64)
        first = np.searchsorted(bounds, start, "right")
        # A slice ending exactly on a boundary does not reach into the next part.
        last = np.maximum(np.searchsorted(bounds, end, "left"), first)
        for p in range(int(first.min()), int(last.max()) + 1):
            rows = np.flatnonzero((first <= p) & (last >= p))
            if not len(rows):
                continue
            lo = self._parts[p].info.start
            hi = self._bounds[p] if p < len(self._bounds) else None
            s = np.maximum(start[rows], lo)
            e = end[rows] if hi is None else np.minimum(end[rows], hi)
            continued = ((first[rows] < p) * FROM_PREVIOUS + (last[rows] > p) * IN_NEXT).astype(
                np.uint8
            )
            # Held to the end: the pieces of calls begun in an earlier part, and the calls
            # that begin right at this part's start, inside them (after its parent, in the
            # file, a call that starts when its parent does: else Perfetto drops the parent).
            carried = s == lo if p else np.zeros(len(rows), dtype=bool)
            if carried.any():
                self._parts[p].carried.append((batch, rows[carried], continued[carried]))
            here = ~carried
            if here.any():
                self._write_rows(
                    self._parts[p], batch, rows[here], s[here], e[here], continued[here]
                )

    def _write_rows(
        self,
        part: _Part,
        batch: SliceBatch,
        rows: npt.NDArray[np.intp] | None,
        start: npt.NDArray[np.int64],
        end: npt.NDArray[np.int64],
        continued: npt.NDArray[np.uint8] | None,
    ) -> None:
        """Write the ``rows`` of ``batch`` (None: all of them, in order, and the batch's
        columns are then written as they are, not copied) from ``start`` to ``end``."""

        def pick(column: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return column if rows is None else column[rows]

        pid, tid = pick(batch.pid), pick(batch.tid)
        one_thread = bool(np.all(pid == pid[0]) and np.all(tid == tid[0]))
        if one_thread:  # the common case: no sort, one group
            order = cuts = np.zeros(0, dtype=np.intp)
        else:
            order = np.lexsort((np.arange(len(pid)), tid, pid))  # stable: keeps close order
            keys = (pid[order] << 32) | (tid[order] & 0xFFFFFFFF)
            cuts = np.flatnonzero(np.diff(keys)) + 1
        whole_insns = insns = pick(batch.instructions)
        cycles = pick(batch.cycles)
        lines = None if batch.icache_lines is None else pick(batch.icache_lines)
        if continued is not None:
            # (a piece of a call has none of its counts: they are the whole call's)
            whole = continued == 0
            insns = np.where(whole, insns, -1)
            cycles = np.where(whole, cycles, -1)
            lines = None if lines is None else np.where(whole, lines, -1)
        groups: list[npt.NDArray[np.intp] | None] = (
            [None] if one_thread else list(np.split(order, cuts))
        )
        for group in groups:

            def of(
                column: npt.NDArray[Any], group: npt.NDArray[np.intp] | None = group
            ) -> npt.NDArray[Any]:
                return column if group is None else column[group]

            first = 0 if group is None else int(group[0])
            p, t = int(pid[first]), int(tid[first])
            if p not in part.processes:
                self._process(part, p, self._names.get(p, ""))
            part.writer.slices(
                p,
                t,
                batch.names,
                of(start),
                of(end),
                of(pick(batch.name_id)),
                address=of(pick(batch.address)),
                instructions=of(insns),
                cycles=of(cycles),
                flags=of(pick(batch.flags)),
                continued=None if continued is None else of(continued),
                icache_lines=None if lines is None else of(lines),
                call_sites=batch.call_sites,
                drill=None
                if self._drill is None or batch.perf_start is None or batch.perf_end is None
                else Drill(
                    f"ptscope insns {self._drill} --tid {t} --time ",
                    of(pick(batch.perf_start)),
                    of(pick(batch.perf_end)),
                    None if batch.anchor_ip is None else of(pick(batch.anchor_ip)),
                    None if batch.anchor_occurrence is None else of(pick(batch.anchor_occurrence)),
                    # a piece of a call drills into the whole call
                    of(whole_insns),
                ),
            )
            part.info.slices += len(of(start))
            part.info.end = max(part.info.end, int(of(end).max()))

    def instant(self, pid: int, tid: int, instant: Instant) -> None:
        with self._writing():
            self._instant(pid, tid, instant)

    def _instant(self, pid: int, tid: int, instant: Instant) -> None:
        self._latest_time = max(self._latest_time, instant.time)
        part = self._parts[self._part_of(max(instant.time, self.time_base))]
        if pid not in part.processes:
            self._process(part, pid, self._names.get(pid, ""))
        part.writer.instant(pid, tid, max(instant.time, self.time_base), instant.name, instant.args)

    def counter(self, pid: int, tid: int, sample: CounterSample) -> None:
        self._latest_time = max(self._latest_time, sample.time)
        part = self._parts[self._part_of(max(sample.time, self.time_base))]
        if pid not in part.processes:
            self._process(part, pid, self._names.get(pid, ""))
        values = {rec.ARG_COUNTER_VALUE: sample.value}
        part.writer.counter(pid, tid, max(sample.time, self.time_base), sample.name, values)

    # ----------------------------------------------------------------- closing

    def close(
        self, processes: dict[int, str], threads: dict[tuple[int, int], str]
    ) -> tuple[list[PartInfo], WriteStats]:
        """Name every process and thread in every part, close the files; then, only if
        every part is complete, give them their names (none is left on a failure)."""
        stats = WriteStats()
        try:
            for index, part in enumerate(self._parts):
                self._write_carried(index, part)
                for pid, name in sorted(processes.items()):
                    if name and (name != self._names.get(pid) or pid not in part.processes):
                        self._process(part, pid, name)
                for (pid, tid), name in sorted(threads.items()):
                    if name:
                        part.writer.thread_name(pid, tid, name)
                part.writer.close(commit=False)
                if index + 1 < len(self._parts):
                    part.info.end = self._bounds[index]
                _add(stats, part.writer.stats)
            for part in self._parts:
                part.writer.commit()
                part.info.file_bytes = part.info.path.stat().st_size
                stats.file_bytes += part.info.file_bytes
        except OSError as e:
            self.abort()
            raise self._cannot_write(e) from e
        except BaseException:
            self.abort()
            raise
        return [p.info for p in self._parts], stats

    def abort(self) -> None:
        """Stop writing: no part is left (what was written is removed)."""
        for part in self._parts:
            part.writer.discard()

    def _write_carried(self, index: int, part: _Part) -> None:
        """The held pieces of calls begun before this part, and the calls begun at its
        start, outermost first (begun earliest, then ending latest, then in the order they
        were written: the engine writes a parent before a child that starts and ends with
        it)."""
        if not part.carried:
            return
        columns: tuple[str, ...] = ("pid", "tid", "start", "end", "name_id", "address")
        columns += ("instructions", "cycles", "flags")
        batches = [batch for batch, _, _ in part.carried]
        if all(b.perf_start is not None and b.perf_end is not None for b in batches):
            columns += ("perf_start", "perf_end")
        if all(b.anchor_ip is not None and b.anchor_occurrence is not None for b in batches):
            columns += ("anchor_ip", "anchor_occurrence")
        joined = SliceBatch(names=self.names, call_sites=self.call_sites)
        for column in columns:
            parts = [getattr(batch, column)[rows] for batch, rows, _ in part.carried]
            setattr(joined, column, np.concatenate(parts))
        continued = np.concatenate([c for _, _, c in part.carried])
        part.carried.clear()
        order = np.lexsort((np.arange(len(joined)), -joined.end, joined.start))
        lo = part.info.start
        hi = self._bounds[index] if index < len(self._bounds) else None
        s = np.full(len(order), lo, dtype=np.int64)
        e = joined.end[order] if hi is None else np.minimum(joined.end[order], hi)
        self._write_rows(part, joined, order, s, np.maximum(e, s), continued[order])


def _written(writer: FxtWriter) -> int:
    """Bytes a writer has put in its file so far (compressed bytes for gzip)."""
    writer.flush()
    owned = cast(Sequence[BinaryIO], writer._owned)
    raw = owned[-1] if owned else None
    return raw.tell() if raw is not None else 0


def _add(total: WriteStats, more: WriteStats) -> None:
    for name in (
        "records",
        "bytes",
        "slices",
        "instants",
        "counters",
        "string_records",
        "thread_records",
        "kernel_objects",
    ):
        setattr(total, name, getattr(total, name) + getattr(more, name))
