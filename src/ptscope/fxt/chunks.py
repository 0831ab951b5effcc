"""A trace (or the parts of a split trace, as one) read a block at a time: its slices as
columns in file order, never all of them at once.

The columnar reader (:mod:`ptscope.fxt.columns`) keeps every slice to sort and nest them;
this one hands each block's slices over as soon as their string and thread refs are
resolved (a ref resolves against the table as it was at its record, and every record it
can refer to came before it), so memory stays that of a block. What is done with them
(sorting by time, nesting, accumulating) is :mod:`ptscope.analyze.stream`'s business.

Parts (``OUT-000.fxt.gz``, ``OUT-001.fxt.gz``, ... of ``--split-*``) are read in order;
a call cut at a part's boundary is written in every part it overlaps, each piece marked
with the arg ``continued``. The pieces are joined here: a piece that goes on ("in next
part") waits until the piece that continues it ("from previous part", same thread and
name, starting where it ended) comes, and one call is handed over. Instruction and cycle
counts stay unknown on a joined call (the pieces carry none).

Traces outside the subset ptscope writes are read whole by the strict reader (as the
columnar reader does); their memory then grows with them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from ptscope.fxt import records as rec
from ptscope.fxt.columns import (
    _MAGIC_BYTES,
    _ArgNames,
    _BadRecord,
    _Blocks,
    _ColumnReader,
    _columns_from_trace,
    _frame,
    _NotOurSubset,
    _open,
    _resolve,
    _size_of,
    _SliceChunk,
)
from ptscope.fxt.reader import TIME_END, FxtFormatError, read_trace
from ptscope.timeline import CounterSample, Instant

__all__ = ["ChunkReader", "NotStreamable", "SliceChunk", "TraceMeta"]

I64 = npt.NDArray[np.int64]
U8 = npt.NDArray[np.uint8]

BLOCK_BYTES: Final = 8 << 20
"""Decompressed bytes per block: a few hundred thousand slices."""

FROM_PREVIOUS: Final = 1
IN_NEXT: Final = 2
_CONTINUED_OF_TEXT: Final = {text: value for value, text in rec.CONTINUED_TEXT.items()}


@dataclass
class SliceChunk:
    """Slices in file order. Times are perf ns; ``thread`` indexes
    :attr:`TraceMeta.thread_keys`, ``text`` :attr:`TraceMeta.texts`; ``instructions`` and
    ``cycles`` are -1 where unknown."""

    thread: I64
    start: I64
    end: I64
    text: I64
    instructions: I64
    cycles: I64
    flags: U8

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def take(self, rows: npt.NDArray[np.intp] | npt.NDArray[np.bool_]) -> SliceChunk:
        return SliceChunk(
            self.thread[rows],
            self.start[rows],
            self.end[rows],
            self.text[rows],
            self.instructions[rows],
            self.cycles[rows],
            self.flags[rows],
        )


@dataclass
class TraceMeta:
    """Everything but the slices; complete once every chunk was read."""

    texts: list[str] = field(default_factory=list)
    thread_keys: list[tuple[int, int]] = field(default_factory=list)
    """(pid, tid) of each thread, in the order the trace introduced them."""
    processes: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    instants: dict[tuple[int, int], list[Instant]] = field(default_factory=dict)
    counters: dict[tuple[int, int], list[CounterSample]] = field(default_factory=dict)
    slices: int = 0
    first_time: int | None = None
    """The earliest time of anything in the trace (slices, instants, counters)."""
    last_time: int | None = None

    def see_times(self, low: int, high: int) -> None:
        self.first_time = low if self.first_time is None else min(self.first_time, low)
        self.last_time = high if self.last_time is None else max(self.last_time, high)


class _PartReader(_ColumnReader):
    """One file's records; slices resolved block by block into the shared meta."""

    def __init__(
        self, meta: TraceMeta, ids: dict[str, int], *, with_args: bool, joining: bool = True
    ) -> None:
        super().__init__(with_args=with_args)
        self.joining = joining
        # One table of texts and threads for all parts: their ids are the meta's.
        self.texts = meta.texts
        self._ids = ids
        self.meta_out = meta
        self.thread_index: dict[tuple[int, int], int] = {
            key: i for i, key in enumerate(meta.thread_keys)
        }

    def take(self) -> list[tuple[SliceChunk, I64]]:
        """The slices of the blocks read since the last call (times in ticks since the
        time base; the file's time base is only known at its end), each with the
        ``continued`` value of every slice."""
        out = []
        strings = self.strings.resolver()
        threads = self.threads.resolver()
        keys = list(self.thread_keys)
        for chunk, args in zip(self.chunks, self.args, strict=True):
            out.append(self._resolved(chunk, args, strings, threads, keys))
        self.chunks.clear()
        self.args.clear()
        # Every slice read so far is resolved; the ones to come lie after every table
        # record kept: each index's last one is all they can refer to.
        self.strings.compact()
        self.threads.compact()
        return out

    def _resolved(
        self,
        chunk: _SliceChunk,
        args: _ArgNames,
        strings: tuple[I64, I64],
        threads: tuple[I64, I64],
        keys: list[tuple[int, int]],
    ) -> tuple[SliceChunk, I64]:
        if np.any(chunk.end < chunk.start):
            raise _NotOurSubset("a slice ends before it starts")
        n = len(chunk.position)
        text = np.full(n, self._text_id(""), dtype=np.int64)
        named = chunk.name_ref != 0
        text[named] = _resolve(strings, chunk.name_ref[named], chunk.position[named], "string")
        local = _resolve(threads, chunk.thread_ref, chunk.position, "thread")
        # The part's thread numbers -> the meta's (in order of first appearance).
        mapping = np.empty(len(keys), dtype=np.int64)
        for i, key in enumerate(keys):
            found = self.thread_index.get(key)
            if found is None:
                found = self.thread_index[key] = len(self.meta_out.thread_keys)
                self.meta_out.thread_keys.append(key)
            mapping[i] = found
        flag_of_text: dict[int, int] = {}
        continued = np.zeros(n, dtype=np.int64)
        instructions = np.full(n, -1, dtype=np.int64)
        cycles = np.full(n, -1, dtype=np.int64)
        flags = np.zeros(n, dtype=np.uint8)
        if self.with_args:
            _, insns_, cycles_, flags_, _ = self._arg_columns(n, args, strings, flag_of_text)
            instructions[:] = insns_
            cycles[:] = cycles_
            flags[:] = flags_
            if self.joining:  # (one file alone: its pieces stay calls of their own)
                continued = self._continued(n, args, strings)
        return (
            SliceChunk(
                mapping[local],
                chunk.start.view(np.int64),
                chunk.end.view(np.int64),
                text,
                instructions,
                cycles,
                flags,
            ),
            continued,
        )

    def _continued(self, n: int, args: _ArgNames, strings: tuple[I64, I64]) -> I64:
        out = np.zeros(n, dtype=np.int64)
        text_id = self._ids.get(rec.ARG_CONTINUED)
        if text_id is None or not len(args.position):
            return out
        named = args.name_ref != 0
        arg_text = np.full(len(args.position), -1, dtype=np.int64)
        arg_text[named] = _resolve(strings, args.name_ref[named], args.position[named], "string")
        hit = (arg_text == text_id) & (args.arg_type == rec.ArgType.STRING)
        refs = (args.value[hit] & np.uint64(0xFFFF)).astype(np.int64)
        if np.any(refs & 0x8000):
            raise _NotOurSubset("inline continued text")
        texted = refs != 0
        texts = _resolve(strings, refs[texted], args.position[hit][texted], "string")
        out[args.slice_index[hit][texted]] = [
            _CONTINUED_OF_TEXT.get(self.texts[t], 0) for t in texts.tolist()
        ]
        return out


@dataclass
class _Piece:
    """A piece of a call that goes on in the next part."""

    start: int
    end: int
    flags: int


class NotStreamable(Exception):
    """A trace outside ptscope's subset found so only after slices were handed over:
    read it again with ``strict=True`` (everything through the strict reader)."""


class ChunkReader:
    """``for chunk in ChunkReader(paths).chunks(): ...``; :attr:`meta` is complete when
    the loop is done. Raises :class:`FxtFormatError` (and OSError) as the readers do, and
    :class:`NotStreamable`."""

    def __init__(
        self, sources: Sequence[Path], *, with_args: bool = True, strict: bool = False
    ) -> None:
        self.sources = list(sources)
        self.strict = strict
        self.with_args = with_args or len(self.sources) > 1  # joining needs `continued`
        self.meta = TraceMeta()
        self._ids: dict[str, int] = {}
        # (thread, text) -> pieces waiting for their continuation, outermost first.
        self._waiting: dict[tuple[int, int], list[_Piece]] = {}

    def chunks(self) -> Iterator[SliceChunk]:
        for source in self.sources:
            yield from self._part(source)
        if self._waiting:  # a part is missing: the pieces are calls of their own
            yield self._leftover_pieces()

    def _part(self, source: Path) -> Iterator[SliceChunk]:
        if self.strict:
            yield from self._strict(source)
            return
        reader = _PartReader(
            self.meta, self._ids, with_args=self.with_args, joining=len(self.sources) > 1
        )
        handed_over = False
        used_base = 0
        try:
            base = 0
            stream, capacity = _open(source)
            with stream:
                blocks = _Blocks(stream, capacity, BLOCK_BYTES)
                while (block := blocks.next()) is not None:
                    if base == 0 and len(block) >= 8 and block[:8].tobytes() != _MAGIC_BYTES:
                        raise FxtFormatError(
                            "not a Fuchsia trace (no FXT magic record at the start)"
                        )
                    usable = len(block) // 8
                    words = block[: usable * 8].view("<u8")
                    try:
                        starts, stop = _frame(words, usable)
                    except _BadRecord as e:
                        raise FxtFormatError(e.message, (base + e.word) * 8) from None
                    reader.block(words, starts, base)
                    base += stop
                    blocks.consumed(stop * 8)
                    for chunk, continued in reader.take():
                        # The writer puts a process record (with the time base) before
                        # the process's first slice; checked again at the end.
                        bases = reader.meta.time_bases
                        used_base = next(iter(bases)) if len(bases) == 1 else used_base
                        handed_over = True
                        yield from self._handed_over(chunk, continued, used_base)
                carry = blocks.leftover()
                if carry:
                    where = base * 8
                    if len(carry) < 8:
                        raise FxtFormatError(f"truncated record header ({len(carry)} bytes)", where)
                    raise FxtFormatError(
                        f"truncated record: {_size_of(carry)} words announced, "
                        f"{len(carry)} bytes left",
                        where,
                    )
                if base == 0:
                    raise FxtFormatError("empty file: not a Fuchsia trace")
            trace = reader.meta.finish()
            if handed_over and trace.time_base != used_base:
                raise _NotOurSubset("the time base changed after the first slice")
        except _NotOurSubset as e:
            if handed_over:
                raise NotStreamable(str(e)) from None
            yield from self._strict(source)
            return
        self._add_meta(trace)

    def _strict(self, source: Path) -> Iterator[SliceChunk]:
        """A trace outside our subset, read whole by the strict reader."""
        trace = read_trace(source)
        columns = _columns_from_trace(trace)
        ids = [self._text(name) for name in columns.names]
        thread = np.empty(len(columns), dtype=np.int64)
        for t in columns.threads:
            thread[t.first : t.stop] = self._thread(t.pid, t.tid)
        chunk = SliceChunk(
            thread,
            columns.start,
            columns.end,
            np.asarray(ids, dtype=np.int64)[columns.name_id] if ids else columns.start * 0,
            np.asarray(columns.instructions, dtype=np.int64).copy(),
            np.asarray(columns.cycles, dtype=np.int64).copy(),
            np.asarray(columns.flags, dtype=np.uint8).copy(),
        )
        self._add_meta(trace)
        if len(chunk):
            self.meta.slices += len(chunk)
            self.meta.see_times(int(chunk.start.min()), int(chunk.end.max()))
            yield chunk

    def _text(self, text: str) -> int:
        found = self._ids.get(text)
        if found is None:
            found = self._ids[text] = len(self.meta.texts)
            self.meta.texts.append(text)
        return found

    def _thread(self, pid: int, tid: int) -> int:
        key = (pid, tid)
        if key not in self.meta.thread_keys:
            self.meta.thread_keys.append(key)
        return self.meta.thread_keys.index(key)

    @staticmethod
    def _time_base(reader: _PartReader) -> int | None:
        bases = reader.meta.time_bases
        if len(bases) > 1:
            raise FxtFormatError(f"process records disagree on the time base: {bases}")
        return next(iter(bases)) if bases else None

    def _handed_over(
        self, chunk: SliceChunk, continued: I64, time_base: int
    ) -> Iterator[SliceChunk]:
        if len(chunk) and (
            int(chunk.start.min()) + time_base < 0 or int(chunk.end.max()) + time_base >= TIME_END
        ):
            raise _NotOurSubset("times out of range")  # the strict reader says which
        if time_base:
            chunk.start = chunk.start + time_base
            chunk.end = chunk.end + time_base
        if len(chunk):
            self.meta.see_times(int(chunk.start.min()), int(chunk.end.max()))
        pieces = np.flatnonzero(continued)
        if pieces.size:
            whole = continued == 0
            joined = self._join(chunk, continued, pieces)
            chunk = chunk.take(whole)
            if joined is not None:
                chunk = _concat([chunk, joined])
        self.meta.slices += len(chunk)
        if len(chunk):
            yield chunk

    def _join(
        self, chunk: SliceChunk, continued: I64, pieces: npt.NDArray[np.intp]
    ) -> SliceChunk | None:
        """Pieces of calls cut at part boundaries: those that end here become calls."""
        done: list[tuple[int, int, int, int, int]] = []
        for i in pieces.tolist():
            key = (int(chunk.thread[i]), int(chunk.text[i]))
            value = int(continued[i])
            start, end, flags = int(chunk.start[i]), int(chunk.end[i]), int(chunk.flags[i])
            if value & FROM_PREVIOUS:
                waiting = self._waiting.get(key)
                match = None
                if waiting:
                    # Continuations come outermost first (the longest first, all starting
                    # at the boundary): the outermost piece that reached the boundary.
                    reached = [k for k, p in enumerate(waiting) if p.end == start]
                    if reached:
                        match = waiting.pop(min(reached, key=lambda k: waiting[k].start))
                    if not waiting:
                        del self._waiting[key]
                if match is not None:
                    start, flags = match.start, match.flags | flags
            if value & IN_NEXT:
                self._waiting.setdefault(key, []).append(_Piece(start, end, flags))
                continue
            done.append((key[0], start, end, key[1], flags))
        if not done:
            return None
        thread, start_, end_, text, flags_ = (
            np.asarray(c, dtype=np.int64) for c in zip(*done, strict=True)
        )
        minus = np.full(len(done), -1, dtype=np.int64)
        return SliceChunk(thread, start_, end_, text, minus, minus.copy(), flags_.astype(np.uint8))

    def _leftover_pieces(self) -> SliceChunk:
        rows = [
            (thread, p.start, p.end, text, p.flags)
            for (thread, text), pieces in self._waiting.items()
            for p in pieces
        ]
        self._waiting.clear()
        thread, start, end, text, flags = (
            np.asarray(c, dtype=np.int64) for c in zip(*rows, strict=True)
        )
        minus = np.full(len(rows), -1, dtype=np.int64)
        self.meta.slices += len(rows)
        return SliceChunk(thread, start, end, text, minus, minus.copy(), flags.astype(np.uint8))

    def _add_meta(self, trace: object) -> None:
        from ptscope.fxt.reader import FxtTrace

        assert isinstance(trace, FxtTrace)
        meta = self.meta
        meta.processes.update(trace.processes)
        meta.thread_names.update(trace.threads)
        for key, instants in trace.instants.items():
            meta.instants.setdefault(key, []).extend(
                Instant(
                    i.time, i.name, {k: v for k, v in i.args.items() if isinstance(v, int | str)}
                )
                for i in instants
            )
            if instants:
                meta.see_times(instants[0].time, instants[-1].time)
        for key, counters in trace.counters.items():
            meta.counters.setdefault(key, []).extend(
                CounterSample(c.time, c.name if k == rec.ARG_COUNTER_VALUE else f"{c.name}:{k}", v)
                for c in counters
                for k, v in c.values.items()
                if isinstance(v, int)
            )
            if counters:
                meta.see_times(counters[0].time, counters[-1].time)
        for key in (*trace.instants, *trace.counters):
            if key not in meta.thread_keys:
                meta.thread_keys.append(key)


def _concat(chunks: list[SliceChunk]) -> SliceChunk:
    return SliceChunk(
        *(
            np.concatenate([getattr(c, name) for c in chunks])
            for name in ("thread", "start", "end", "text", "instructions", "cycles", "flags")
        )
    )
