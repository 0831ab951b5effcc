"""Fast columnar reading of a Fuchsia trace into a :class:`ptscope.timeline.Timeline`.

:func:`ptscope.fxt.reader.read_trace` interprets one record at a time in Python (about a
million slices a minute): right for checking traces, too slow for asking questions of a
12-million-slice trace. This path reads the same files into numpy columns:

1. **Framing.** Record boundaries follow from each header's size field, which is
   inherently sequential; but the writer emits long runs of complete events of one size
   (a chunk of slices with the same arguments), so the framer checks a whole run of
   candidate headers at a stride with one numpy comparison and falls back to stepping one
   record at a time only where sizes change.
2. **Complete events** (the slices) are decoded column-wise: timestamps, name and thread
   refs, and the arguments ptscope writes (address, instructions, cycles, flags), walked
   argument by argument over every record at once.
3. **Everything else** (string and thread records, process and thread names, instants,
   counters, metadata) is rare and goes record by record through the strict reader's own
   interpreter, so it is read exactly as :func:`read_trace` reads it. String and thread
   refs of slices resolve against the table *as it was at that record*: the writer
   reuses table entries, so each ref is looked up among the string records for its index
   that came before it (one ``searchsorted``).
4. **Nesting.** A slice's depth is the number of earlier slices of its thread still open
   when it starts (Perfetto's rule, see :func:`ptscope.fxt.reader._nest`), counted with
   sorted end times; every slice is then checked to lie inside its parent.

Anything outside the subset ptscope writes (inline strings or threads in slices, begin/end
pairs, several providers, a tick rate other than 1 GHz) and anything malformed is handed
to :func:`read_trace` instead, so the result (or the error and its message) is the strict
reader's whenever this path cannot vouch for it; the tests compare both on random traces.
"""

from __future__ import annotations

import gzip
import io
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final, cast

import numpy as np
import numpy.typing as npt

from ptscope.fxt import records as rec
from ptscope.fxt.reader import (
    MAX_LARGE_RECORD_WORDS,
    TIME_END,
    FxtFormatError,
    FxtTrace,
    TraceSlice,
    _Reader,
    bounded,
    read_trace,
)
from ptscope.timeline import (
    CounterSample,
    Instant,
    Slice,
    ThreadTimeline,
    Timeline,
    parents_from_depth,
)

__all__ = ["ThreadRows", "TraceColumns", "read_columns", "read_timeline", "timeline_from_trace"]

_DECOMPRESS_ERRORS: tuple[type[Exception], ...] = (OSError, EOFError, zlib.error)
"""What a damaged gzip stream raises (zlib's, and ISA-L's own error below)."""

try:  # ISA-L inflates about three times faster than zlib
    from isal import igzip_threaded as _igzip_threaded
    from isal.isal_zlib import error as _isal_error
except ImportError:  # pragma: no cover (a platform without isal wheels)
    _igzip_threaded = None  # type: ignore[assignment]
else:
    # (isal's stubs declare this class as an instance of Exception.)
    _DECOMPRESS_ERRORS += (cast("type[Exception]", _isal_error),)

_GZIP_MAGIC: Final = b"\x1f\x8b"
_MAGIC_BYTES: Final = rec.magic_record()
_BLOCK_BYTES: Final = 64 << 20
"""Decompressed bytes framed per step: big enough that numpy calls are amortised, small
enough that a block's temporaries stay small next to the columns being built."""
_FIRST_PROBE: Final = 1 << 12
_MAX_PROBE: Final = 1 << 22
"""Words looked ahead for a run of slices (doubling while runs fill the window)."""
_MAX_RECORD: Final = rec.MAX_RECORD_WORDS

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


class _NotOurSubset(Exception):
    """The trace uses something this path does not decode: use the strict reader."""


# -- input ----------------------------------------------------------------------------


_DEFLATE_RATIO: Final = 1032
"""The most bytes deflate can inflate one compressed byte into."""


def _open(source: str | Path | bytes) -> tuple[BinaryIO, int]:
    """The trace's (decompressed) stream, and the most bytes it can hold."""
    if isinstance(source, bytes):
        raw: BinaryIO = io.BytesIO(source)
        head = source[:2]
        size = len(source)
    else:
        raw = open(source, "rb")  # noqa: SIM115 (returned; the caller closes it)
        head = raw.read(2)
        size = raw.seek(0, io.SEEK_END)
        raw.seek(0)
    if head != _GZIP_MAGIC:
        return raw, size
    if _igzip_threaded is not None:
        # Inflates in a thread of its own (ISA-L releases the GIL), overlapping the
        # framing and decoding of the previous block.
        block = min(1 << 22, max(1 << 16, size * _DEFLATE_RATIO))
        opened: BinaryIO = _igzip_threaded.open(  # type: ignore[no-untyped-call]
            raw, "rb", threads=1, block_size=block
        )
    else:
        opened = gzip.GzipFile(fileobj=raw, mode="rb")
    return bounded(opened, size), size * _DEFLATE_RATIO


class _Blocks:
    """The decompressed stream, a block at a time, in one reused buffer: the bytes of
    a record cut by the end of a block are moved to the front before the next read
    (fresh 64 MB objects per block would cost a page fault per 4 KB). The buffer is
    never larger than the stream can be (``capacity``); it grows only when one record
    fills it, so whatever a damaged record announces, it holds only bytes that are
    there."""

    def __init__(
        self, stream: BinaryIO, capacity: int = _BLOCK_BYTES, size: int = _BLOCK_BYTES
    ) -> None:
        self.stream = stream
        size = min(size, max(4096, capacity + 7) & ~7)
        self.buffer = np.empty(size, dtype=np.uint8)
        self.held = 0  # bytes at the front of the buffer not yet consumed
        self.eof = False

    def next(self) -> npt.NDArray[np.uint8] | None:
        """The next block (held bytes first), or None at the end of the stream."""
        if self.eof:
            return None
        if self.held == len(self.buffer):  # one record larger than the buffer
            self.buffer = np.concatenate((self.buffer, np.empty_like(self.buffer)))
        try:
            got = self.stream.readinto(self.buffer.data[self.held :])  # type: ignore[attr-defined]
        except _DECOMPRESS_ERRORS as e:
            raise FxtFormatError(f"cannot decompress: {e}") from e
        if not got:
            self.eof = True
            return None
        self.held += got
        return self.buffer[: self.held]

    def consumed(self, count: int) -> None:
        """The first ``count`` bytes of the last block were used."""
        rest = self.held - count
        if rest:
            self.buffer[:rest] = self.buffer[count : self.held]
        self.held = rest

    def leftover(self) -> bytes:
        return self.buffer[: self.held].tobytes()


# -- framing --------------------------------------------------------------------------


_SLICE_PATTERN: Final = np.uint64(0x0000_FFFF_FF0F_000F)
"""Header bits that a run of one writer's slices share: record and event type, thread
and category refs (size, argument count and name vary)."""


def _frame(words: U64, n: int) -> tuple[I64, int]:
    """Word offsets of the records that lie wholly in ``words[:n]``, and where the first
    one that does not fit starts (``n`` when all fit). Raises on a size of 0.

    From a complete event on, the framer looks ahead for words that look like the same
    thread's complete events and keeps the longest prefix of them that chains: each one
    starts exactly where the one before it ends (``start + size``). A look-alike word
    inside a record breaks the chain there (it cannot be where the previous record ends),
    so every offset kept is a real record boundary; past the break, records are stepped
    through one at a time until the next complete event.
    """
    scalar = words.data.cast("B").cast("Q")  # fast scalar access, no numpy boxing
    pieces: list[I64] = []
    singles: list[int] = []
    p = 0
    window = _FIRST_PROBE
    while p < n:
        header = scalar[p]
        kind = header & 0xF
        size = (header >> 4) & (0xFFFFFFFF if kind == rec.RecordType.LARGE else 0xFFF)
        if size == 0:
            raise _BadRecord("record of size 0", p)
        if size > MAX_LARGE_RECORD_WORDS:
            raise _BadRecord(
                f"a large record of {size:,} words, more than the "
                f"{MAX_LARGE_RECORD_WORDS:,} a reader takes",
                p,
            )
        if p + size > n:
            break
        if kind != rec.RecordType.EVENT or (header >> 16) & 0xF != rec.EventType.DURATION_COMPLETE:
            singles.append(p)
            p += size
            continue
        stop = min(n, p + window)
        look = words[p:stop]
        alike = np.flatnonzero((look & _SLICE_PATTERN) == (np.uint64(header) & _SLICE_PATTERN))
        ends = alike + ((look[alike] >> np.uint64(4)) & np.uint64(0xFFF)).astype(np.int64)
        broken = np.flatnonzero(alike[1:] != ends[:-1])
        kept = int(broken[0]) + 1 if broken.size else len(alike)
        # The last record kept must end inside the block.
        while kept and p + int(ends[kept - 1]) > n:
            kept -= 1
        if kept <= 1:
            singles.append(p)
            p += size
            window = _FIRST_PROBE
            continue
        if singles:
            pieces.append(np.asarray(singles, dtype=np.int64))
            singles = []
        pieces.append(alike[:kept] + p)
        p += int(ends[kept - 1])
        chained_to_end = not broken.size and p >= stop - _MAX_RECORD
        window = min(window * 4, _MAX_PROBE) if chained_to_end else max(_FIRST_PROBE, window // 2)
    if singles:
        pieces.append(np.asarray(singles, dtype=np.int64))
    starts = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    return starts, p


class _BadRecord(Exception):
    def __init__(self, message: str, word: int) -> None:
        super().__init__(message)
        self.message = message
        self.word = word


# -- slices, column-wise --------------------------------------------------------------


@dataclass
class _SliceChunk:
    """The complete events of one block, before refs are resolved."""

    position: I64  # global word offset of the record (orders records, dates table refs)
    start: U64
    end: U64
    name_ref: npt.NDArray[Any]  # 16-bit
    thread_ref: npt.NDArray[Any]
    category_ref: npt.NDArray[Any]


@dataclass
class _ArgNames:
    """Refs of the argument names in one block, for columns filled after resolution."""

    position: I64
    name_ref: I64
    slice_index: I64
    value: U64
    arg_type: I64


class _TableLog:
    """Every string (thread) record that changed its table: where it was, which index it
    set, and to what. A record setting an index to the value it already holds changes no
    ref's meaning and is not kept (a trace of one string record repeated is a gzip bomb
    that would cost 24 bytes a record), and :meth:`compact` forgets what later records
    replaced, once every ref before them is resolved."""

    def __init__(self) -> None:
        self.position = array("q")
        self.index = array("q")
        self.value = array("q")
        self._current: dict[int, int] = {}

    def set(self, position: int, index: int, value: int) -> None:
        if self._current.get(index) == value:
            return
        self._current[index] = value
        self.position.append(position)
        self.index.append(index)
        self.value.append(value)

    def compact(self) -> None:
        """Keep each index's last record only (what every ref after it resolves to)."""
        if len(self.index) <= len(self._current):
            return
        last: dict[int, int] = {}
        for k, index in enumerate(self.index):
            last[index] = k
        keep = sorted(last.values())
        self.position = array("q", (self.position[k] for k in keep))
        self.index = array("q", (self.index[k] for k in keep))
        self.value = array("q", (self.value[k] for k in keep))

    def resolver(self) -> tuple[I64, I64]:
        """(sorted keys ``index << 40 | position``, the value for each key)."""
        keys = (np.frombuffer(self.index, dtype=np.int64) << 40) | np.frombuffer(
            self.position, dtype=np.int64
        )
        order = np.argsort(keys, kind="stable")
        return keys[order], np.frombuffer(self.value, dtype=np.int64)[order]


def _resolve(
    table: tuple[I64, I64], refs: npt.NDArray[Any], positions: I64, what: str
) -> npt.NDArray[np.int64]:
    """The value each ref had in its table when the record at ``positions`` was read."""
    keys, values = table
    if not refs.size:
        return np.zeros(0, dtype=np.int64)
    if not keys.size:
        raise _NotOurSubset(f"{what} ref never set")
    index = keys >> 40
    if index.size == 1 or bool(np.all(index[1:] != index[:-1])):
        # No entry was ever replaced (the usual case): a plain table lookup, checking
        # that each entry was set before the record that refers to it.
        size = int(index[-1]) + 1
        value_of = np.zeros(size, dtype=np.int64)
        set_at = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
        value_of[index] = values
        set_at[index] = keys & ((1 << 40) - 1)
        inside = refs < size
        if not inside.all() or np.any(set_at[refs] > positions):
            raise _NotOurSubset(f"{what} ref never set")
        looked_up: npt.NDArray[np.int64] = value_of[refs]
        return looked_up
    wide = refs.astype(np.int64)
    query = (wide << 40) | positions
    found = np.searchsorted(keys, query, side="right") - 1
    ok = found >= 0
    found = np.maximum(found, 0)
    ok &= (keys[found] >> 40) == wide
    if not ok.all():
        raise _NotOurSubset(f"{what} ref never set")
    return values[found]


def _decode_complete(
    words: U64, starts: I64, headers: U64, base: int, *, with_args: bool
) -> tuple[_SliceChunk, _ArgNames]:
    """Columns of the complete events at ``starts`` (word offsets in ``words``); their
    arguments are walked (the record sizes checked) and kept ``with_args``."""
    # The header's 16-bit fields, read in place: type|size, etype|nargs|thread,
    # category, name. Refs stay 16-bit until they are resolved.
    fields = headers.view("<u2").reshape(-1, 4)
    size = fields[:, 0] >> 4
    nargs = (fields[:, 1] >> 4) & 0xF
    thread_ref = fields[:, 1] >> 8
    category_ref = fields[:, 2].copy()
    name_ref = fields[:, 3].copy()
    if (
        not thread_ref.all()
        or (name_ref >= 0x8000).any()
        or (category_ref >= 0x8000).any()
        or (size < 3).any()
    ):
        raise _NotOurSubset("inline refs or a short complete event")
    last = starts + size - 1  # the end time's word
    start = words[starts + 1]
    end = words[last]
    # Arguments: the k-th argument of every record that has one, all at once.
    arg_pos: list[I64] = []
    arg_slice: list[I64] = []
    arg_header: list[U64] = []
    pos = starts + 2
    every = np.arange(len(starts))
    top = len(words) - 1
    for k in range(int(nargs.max()) if len(nargs) else 0):
        has = every if k == 0 and int(nargs.min()) > 0 else np.flatnonzero(nargs > k)
        at = pos[has]
        # A bad size may send the walk past the block: read safely, fail below.
        h = words[np.minimum(at, top)]
        arg_size = ((h >> np.uint64(4)) & np.uint64(0xFFF)).view(np.int64)
        if not arg_size.all():
            raise _NotOurSubset("argument of size 0")
        if with_args:
            arg_pos.append(at)
            arg_slice.append(has)
            arg_header.append(h)
        pos[has] = at + arg_size
    if np.any(pos != last):
        raise _NotOurSubset("record size does not match its contents")
    chunk = _SliceChunk(starts + base, start, end, name_ref, thread_ref, category_ref)
    if not arg_pos:
        empty = np.zeros(0, dtype=np.int64)
        return chunk, _ArgNames(empty, empty, empty, np.zeros(0, dtype=np.uint64), empty)
    at = np.concatenate(arg_pos)
    h = np.concatenate(arg_header)
    arg_size = ((h >> np.uint64(4)) & np.uint64(0xFFF)).view(np.int64)
    arg_name = ((h >> np.uint64(16)) & np.uint64(0xFFFF)).view(np.int64)
    if np.any(arg_name & 0x8000):
        raise _NotOurSubset("inline argument name")
    # The value: the next word for 2-word scalars, the 32-bit payload otherwise (a
    # string argument's value ref lives there).
    value = np.where(arg_size >= 2, words[np.minimum(at + 1, top)], h >> np.uint64(32))
    arg_type = (h & np.uint64(0xF)).view(np.int64)
    return chunk, _ArgNames(at + base, arg_name, np.concatenate(arg_slice), value, arg_type)


# -- the reader -----------------------------------------------------------------------


class _ColumnReader:
    def __init__(self, *, with_args: bool) -> None:
        self.with_args = with_args
        self.meta = _Reader()  # the strict interpreter, for every record but slices
        self.strings = _TableLog()
        self.threads = _TableLog()
        self.thread_keys: dict[tuple[int, int], int] = {}
        self.chunks: list[_SliceChunk] = []
        self.args: list[_ArgNames] = []
        self.providers_seen = 0
        self.texts: list[str] = []
        """Every distinct string the trace set, once: slice names index this list."""
        self._ids: dict[str, int] = {}

    def block(self, words: U64, starts: I64, base: int) -> None:
        headers = words[starts]
        kind = headers & np.uint64(0xF)
        etype = (headers >> np.uint64(16)) & np.uint64(0xF)
        complete = (kind == rec.RecordType.EVENT) & (etype == rec.EventType.DURATION_COMPLETE)
        others = np.flatnonzero(~complete)
        if others.size:
            raw = words.data.cast("B")
            sizes = _sizes(headers[others])
            for index, size in zip(others.tolist(), sizes.tolist(), strict=True):
                self.other(raw, int(starts[index]), int(headers[index]), size, base)
        if complete.any():
            at = np.flatnonzero(complete)
            chunk, args = _decode_complete(
                words, starts[at], headers[at], base, with_args=self.with_args
            )
            self.chunks.append(chunk)
            self.args.append(args)
            self.meta.trace.record_counts["complete"] += len(at)
            self.meta.trace.max_record_words = max(
                self.meta.trace.max_record_words,
                int((headers[at].view("<u2")[::4] >> 4).max()),
            )

    def other(self, raw: memoryview, start: int, header: int, size: int, base: int) -> None:
        kind = header & 0xF
        data = raw[start * 8 : (start + size) * 8]
        offset = (start + base) * 8
        if kind == rec.RecordType.EVENT:
            etype = (header >> 16) & 0xF
            if etype in (rec.EventType.DURATION_BEGIN, rec.EventType.DURATION_END):
                raise _NotOurSubset("begin/end events")
        elif kind == rec.RecordType.METADATA and (header >> 16) & 0xF in (
            rec.MetadataType.PROVIDER_INFO,
            rec.MetadataType.PROVIDER_SECTION,
        ):
            provider = (header >> 20) & 0xFFFFFFFF
            if provider != 0 or self.providers_seen > 1:
                raise _NotOurSubset("several providers")
            self.providers_seen += 1
        self.meta.record(offset, header, data)
        if kind == rec.RecordType.STRING:
            index = (header >> 16) & 0x7FFF
            self.strings.set(start + base, index, self._text_id(self.meta.strings[index]))
        elif kind == rec.RecordType.THREAD:
            index = (header >> 16) & 0xFF
            key = self.meta.thread_table[index]
            self.threads.set(
                start + base, index, self.thread_keys.setdefault(key, len(self.thread_keys))
            )
        elif kind == rec.RecordType.INITIALIZATION and (
            self.meta.provider.ticks_per_second != rec.TICKS_PER_SECOND
        ):
            raise _NotOurSubset("ticks are not nanoseconds")

    def _text_id(self, text: str) -> int:
        found = self._ids.get(text)
        if found is None:
            found = self._ids[text] = len(self.texts)
            self.texts.append(text)
        return found

    def finish(self) -> TraceColumns:
        trace = self.meta.finish()  # instants, counters, names, the time base
        base = trace.time_base
        if not -TIME_END <= base < TIME_END:
            raise _NotOurSubset("a time base out of range")
        if self.chunks:
            first = min(int(chunk.start.min()) for chunk in self.chunks if len(chunk.start))
            last = max(int(chunk.end.max()) for chunk in self.chunks if len(chunk.end))
            if first + base < 0 or last + base >= TIME_END:
                raise _NotOurSubset("times out of range")  # the strict reader says which
        strings = self.strings.resolver()
        thread_table = self.threads.resolver()
        columns: dict[str, list[npt.NDArray[np.generic]]] = {
            k: [] for k in ("start", "end", "name", "thread", *_ARG_COLUMNS)
        }
        flag_of_text: dict[int, int] = {}
        for chunk, args in zip(self.chunks, self.args, strict=True):
            if np.any(chunk.end < chunk.start):
                raise _NotOurSubset("a slice ends before it starts")
            name = np.full(len(chunk.name_ref), self._text_id(""), dtype=np.int64)
            named = chunk.name_ref != 0  # ref 0 is the empty string
            name[named] = _resolve(strings, chunk.name_ref[named], chunk.position[named], "string")
            nonzero = chunk.category_ref != 0
            _resolve(strings, chunk.category_ref[nonzero], chunk.position[nonzero], "string")
            columns["start"].append(chunk.start.view(np.int64))
            columns["end"].append(chunk.end.view(np.int64))
            columns["name"].append(name)
            columns["thread"].append(
                _resolve(thread_table, chunk.thread_ref, chunk.position, "thread")
            )
            if self.with_args:
                for key, values in zip(
                    _ARG_COLUMNS,
                    self._arg_columns(len(chunk.position), args, strings, flag_of_text),
                    strict=True,
                ):
                    columns[key].append(values)
        return _assemble(trace, list(self.thread_keys), self.texts, columns)

    def _arg_columns(
        self, n: int, args: _ArgNames, strings: tuple[I64, I64], flag_of_text: dict[int, int]
    ) -> tuple[npt.NDArray[np.generic], ...]:
        """address, instructions, cycles, flags and icache_lines of ``n`` slices from their
        arguments."""
        address = np.zeros(n, dtype=np.uint64)
        instructions = np.full(n, -1, dtype=np.int64)
        cycles = np.full(n, -1, dtype=np.int64)
        icache = np.full(n, -1, dtype=np.int64)
        flags = np.zeros(n, dtype=np.uint8)
        if len(args.position):
            named = args.name_ref != 0
            arg_text = np.full(len(args.position), -1, dtype=np.int64)
            arg_text[named] = _resolve(
                strings, args.name_ref[named], args.position[named], "string"
            )
            # Which column each argument fills (-1: none), in one gather: its name's
            # entry in a small table, kept only for integer types (a type is 4 bits).
            targets = (
                rec.ARG_ADDRESS, rec.ARG_INSTRUCTIONS, rec.ARG_CYCLES, rec.ARG_ICACHE_LINES,
            )  # fmt: skip
            ids = [self._ids.get(text) for text in targets]
            known = [i for i in ids if i is not None]
            lut = np.full(max(known, default=0) + 2, -1, dtype=np.int8)
            for k, text_id in enumerate(ids):
                if text_id is not None:
                    lut[text_id] = k
            which = lut[np.minimum(arg_text, len(lut) - 1)]  # -1 texts hit lut[-1] = -1
            which[~_IS_INT_TYPE[args.arg_type & 0xF]] = -1
            for k, column in enumerate((address, instructions, cycles, icache)):
                if ids[k] is not None:
                    hit = which == k
                    values = args.value[hit]
                    # As the strict reader (TraceSlice.to_slice): a count past 63 bits, or
                    # an address that an I64 argument makes negative, is unknown.
                    if column.dtype == np.int64:
                        values = np.where(values >> np.uint64(63) != 0, -1, values.view(np.int64))
                    else:
                        negative = (args.arg_type[hit] == rec.ArgType.I64) & (
                            values >> np.uint64(63) != 0
                        )
                        values = np.where(negative, np.uint64(0), values)
                    column[args.slice_index[hit]] = values
            flags_id = self._ids.get(rec.ARG_FLAGS)
            if flags_id is not None:
                hit = (arg_text == flags_id) & (args.arg_type == rec.ArgType.STRING)
                refs = (args.value[hit] & np.uint64(0xFFFF)).astype(np.int64)
                if np.any(refs & 0x8000):
                    raise _NotOurSubset("inline flags text")
                texted = refs != 0  # an empty flags text: no flags
                texts = _resolve(strings, refs[texted], args.position[hit][texted], "string")
                flags[args.slice_index[hit][texted]] = np.array(
                    [self._flags(t, flag_of_text) for t in texts.tolist()], dtype=np.uint8
                )
        return address, instructions, cycles, flags, icache

    def _flags(self, text_id: int, cache: dict[int, int]) -> int:
        value = cache.get(text_id)
        if value is None:
            try:
                value = cache[text_id] = rec.parse_flags_text(self.texts[text_id])
            except ValueError as e:
                raise _NotOurSubset("unknown flags") from e
        return value


_INT_TYPES: Final = np.array(
    [rec.ArgType.I64, rec.ArgType.U64, rec.ArgType.POINTER, rec.ArgType.KOID], dtype=np.int64
)
_IS_INT_TYPE: Final = np.isin(np.arange(16), _INT_TYPES)
"""Whether each argument type (0..15) holds an integer: a lookup, not an isin per block."""


def _sizes(headers: U64) -> npt.NDArray[np.int64]:
    large = (headers & np.uint64(0xF)) == rec.RecordType.LARGE
    small = (headers >> np.uint64(4)) & np.uint64(0xFFF)
    big = (headers >> np.uint64(4)) & np.uint64(0xFFFFFFFF)
    return np.where(large, big, small).astype(np.int64)


_ARG_COLUMNS: Final = ("address", "instructions", "cycles", "flags", "icache_lines")
_ABSENT: Final = {"address": 0, "instructions": -1, "cycles": -1, "flags": 0, "icache_lines": -1}
_DTYPES: Final[dict[str, type[np.generic]]] = {
    "address": np.uint64,
    "instructions": np.int64,
    "cycles": np.int64,
    "flags": np.uint8,
    "icache_lines": np.int64,
}


@dataclass
class ThreadRows:
    """One thread of a :class:`TraceColumns`: its slices are rows ``[first, stop)``."""

    pid: int
    tid: int
    name: str = ""
    first: int = 0
    stop: int = 0
    instants: list[Instant] = field(default_factory=list)
    counters: list[CounterSample] = field(default_factory=list)

    def __len__(self) -> int:
        return self.stop - self.first


@dataclass
class TraceColumns:
    """A whole trace as flat columns: every slice one row, threads one after another
    (sorted by (pid, tid)), each thread's rows in (start, depth) order.

    Times are perf ns. ``parent`` is the row of the enclosing slice (-1 at depth 0).
    Columns as in :class:`ptscope.timeline.ThreadTimeline`; argument columns not read
    are constant read-only views.
    """

    names: list[str]
    processes: dict[int, str]
    threads: list[ThreadRows]
    start: I64
    end: I64
    depth: npt.NDArray[np.int32]
    parent: I64
    name_id: npt.NDArray[np.int32]
    address: U64
    instructions: I64
    cycles: I64
    flags: npt.NDArray[np.uint8]
    icache_lines: I64

    def __len__(self) -> int:
        return int(self.start.shape[0])

    def to_timeline(self) -> Timeline:
        """The same trace as a Timeline (its columns are views of these)."""
        threads = []
        for t in self.threads:
            rows = slice(t.first, t.stop)
            threads.append(
                ThreadTimeline(
                    pid=t.pid,
                    tid=t.tid,
                    name=t.name,
                    start=self.start[rows],
                    end=self.end[rows],
                    depth=self.depth[rows],
                    name_id=self.name_id[rows],
                    address=self.address[rows],
                    instructions=self.instructions[rows],
                    cycles=self.cycles[rows],
                    flags=self.flags[rows],
                    instants=t.instants,
                    counters=t.counters,
                    icache_lines=self.icache_lines[rows],
                )
            )
        return Timeline(names=self.names, threads=threads, processes=dict(self.processes))


def _assemble(
    trace: FxtTrace,
    keys: list[tuple[int, int]],
    texts: list[str],
    columns: dict[str, list[npt.NDArray[np.generic]]],
) -> TraceColumns:
    """Flat columns sorted by (thread, start, record order), with depths and parents;
    the instants, counters and names the strict interpreter read."""
    # Threads are numbered in the order the trace introduced them; rows go in (pid, tid)
    # order, which is usually the order they were written in (no sort needed).
    rank_of = np.zeros(len(keys), dtype=np.int64)
    rank_of[sorted(range(len(keys)), key=lambda i: keys[i])] = np.arange(len(keys))
    sorted_keys = sorted(keys)
    thread = rank_of[_cat(columns["thread"], np.int64)]
    start = _cat(columns["start"], np.int64)
    n = len(thread)
    ordered = n < 2 or bool(
        np.all(
            (thread[1:] > thread[:-1]) | ((thread[1:] == thread[:-1]) & (start[1:] >= start[:-1]))
        )
    )
    order = None if ordered else np.lexsort((np.arange(n), start, thread))

    def column(values: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return values if order is None else values[order]

    thread, start = column(thread), column(start)
    end = column(_cat(columns["end"], np.int64))
    text_ids = column(_cat(columns["name"], np.int64))
    # Slice names as a dense table of the texts used (a lookup, not a sort).
    used = np.zeros(len(texts), dtype=bool)
    used[text_ids] = True
    name_id = (np.cumsum(used, dtype=np.int32) - 1)[text_ids]
    del text_ids
    args = {
        key: column(_cat(columns[key], _DTYPES[key]))
        if columns[key]
        else np.broadcast_to(np.array(_ABSENT[key], dtype=_DTYPES[key]), (n,))
        for key in _ARG_COLUMNS
    }
    depth = np.zeros(n, dtype=np.int32)
    parent = np.full(n, -1, dtype=np.int64)
    bounds = np.searchsorted(thread, np.arange(len(keys) + 1))
    threads = []
    for rank, key in enumerate(sorted_keys):
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        if lo < hi:
            depth[lo:hi], local = _depths(start[lo:hi], end[lo:hi])
            parent[lo:hi] = np.where(local >= 0, local + lo, -1)
        threads.append(ThreadRows(key[0], key[1], first=lo, stop=hi))
    if trace.time_base:
        start += trace.time_base
        end += trace.time_base
    columns_ = TraceColumns(
        names=[texts[i] for i in np.flatnonzero(used).tolist()],
        processes=dict(trace.processes),
        threads=threads,
        start=start,
        end=end,
        depth=depth,
        parent=parent,
        name_id=name_id,
        **args,
    )
    _add_the_rest(trace, columns_)
    return columns_


def _cat(parts: list[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _depths(start: I64, end: I64) -> tuple[npt.NDArray[np.int32], I64]:
    """Depth and parent row of each slice of one thread (rows sorted by start, then record
    order). The depth is how many earlier slices are still open when it starts: ``i -
    #{j < i: end_j <= start_i}``; every ``j`` with ``end_j <= start_i`` comes before ``i``
    except empty slices at ``start_i`` from ``i`` on, which are subtracted back. Raises
    :class:`_NotOurSubset` if a slice sticks out of its parent (the strict reader then
    reports it)."""
    n = len(start)
    # Ends are nearly sorted already (siblings end in order): timsort is fast on that.
    closed = np.searchsorted(np.sort(end, kind="stable"), start, side="right")
    empty = np.flatnonzero(end == start)
    if empty.size:
        # An empty slice z was counted by every row i <= z that starts when z does: add
        # 1 back over those rows (a range update, by a difference array).
        first = np.searchsorted(start, start[empty], side="left")
        change = np.zeros(n + 1, dtype=np.int64)
        np.add.at(change, first, 1)
        np.add.at(change, empty + 1, -1)
        closed -= np.cumsum(change[:n])
    depth = np.arange(n, dtype=np.int64) - closed
    if n and (depth.min() < 0 or depth[0] != 0 or np.any(depth[1:] > depth[:-1] + 1)):
        raise _NotOurSubset("slices do not nest")
    depth32 = depth.astype(np.int32)
    parent = parents_from_depth(depth32)
    child = parent >= 0
    if np.any(end[child] > end[parent[child]]):
        raise _NotOurSubset("slices do not nest")
    return depth32, parent


def _add_the_rest(trace: FxtTrace, columns: TraceColumns) -> None:
    """Thread names, instants and counters (as the strict reader read them); threads
    with instants or counters but no slices get empty row ranges."""
    by_key = {(t.pid, t.tid): t for t in columns.threads}
    for key in set(trace.instants) | set(trace.counters):
        if key not in by_key:
            at = columns.threads[-1].stop if columns.threads else 0
            by_key[key] = ThreadRows(key[0], key[1], first=at, stop=at)
    for key, thread in by_key.items():
        thread.name = trace.threads.get(key, "")
        thread.instants = [
            Instant(i.time, i.name, {k: v for k, v in i.args.items() if isinstance(v, int | str)})
            for i in trace.instants.get(key, ())
        ]
        thread.counters = [
            CounterSample(c.time, c.name if k == rec.ARG_COUNTER_VALUE else f"{c.name}:{k}", v)
            for c in trace.counters.get(key, ())
            for k, v in c.values.items()
            if isinstance(v, int)
        ]
    kept = [by_key[k] for k in sorted(by_key) if len(by_key[k]) or by_key[k].instants
            or by_key[k].counters]  # fmt: skip
    columns.threads = kept


def _columns_from_trace(trace: FxtTrace) -> TraceColumns:
    """What the strict reader read, as columns (slow; for traces outside our subset)."""
    ids: dict[str, int] = {}
    keys = sorted(trace.slices)
    rows = [_as_slice(r) for key in keys for r in trace.slices[key]]
    counts = [len(trace.slices[key]) for key in keys]
    bounds = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    depth = np.array([r.depth for r in rows], dtype=np.int32)
    parent = np.full(len(rows), -1, dtype=np.int64)
    for i in range(len(keys)):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        local = parents_from_depth(depth[lo:hi])
        parent[lo:hi] = np.where(local >= 0, local + lo, -1)
    columns = TraceColumns(
        names=[],
        processes=dict(trace.processes),
        threads=[
            ThreadRows(k[0], k[1], first=int(bounds[i]), stop=int(bounds[i + 1]))
            for i, k in enumerate(keys)
        ],
        start=np.array([r.start for r in rows], dtype=np.int64),
        end=np.array([r.end for r in rows], dtype=np.int64),
        depth=depth,
        parent=parent,
        name_id=np.array([ids.setdefault(r.name, len(ids)) for r in rows], dtype=np.int32),
        address=np.array([r.address for r in rows], dtype=np.uint64),
        instructions=np.array([r.instructions for r in rows], dtype=np.int64),
        cycles=np.array([r.cycles for r in rows], dtype=np.int64),
        flags=np.array([int(r.flags) for r in rows], dtype=np.uint8),
        icache_lines=np.array([r.icache_lines for r in rows], dtype=np.int64),
    )
    columns.names = list(ids)
    _add_the_rest(trace, columns)
    return columns


def timeline_from_trace(trace: FxtTrace) -> Timeline:
    """A :class:`Timeline` from what the strict reader read (slow; small traces, tests)."""
    return _columns_from_trace(trace).to_timeline()


def _as_slice(row: TraceSlice) -> Slice:
    """``row`` as a Slice; a flags text with words we do not know reads as no flags."""
    try:
        return row.to_slice()
    except ValueError:
        row = TraceSlice(row.start, row.end, row.depth, row.name, row.category, dict(row.args))
        row.args.pop(rec.ARG_FLAGS, None)
        return row.to_slice()


def read_timeline(source: str | Path | bytes, *, with_args: bool = True) -> Timeline:
    """:func:`read_columns`, as a Timeline."""
    return read_columns(source, with_args=with_args).to_timeline()


def read_columns(source: str | Path | bytes, *, with_args: bool = True) -> TraceColumns:
    """Read a trace (``.fxt`` or gzip, by content; a path or bytes) into flat columns.

    ``with_args=False`` skips the address, instructions, cycles and flags columns (they
    read as constant "unknown" views) for callers that only need names and times.

    Raises :class:`FxtFormatError` for anything that is not a well-formed Fuchsia trace
    (the strict reader's message) and OSError when the file cannot be read.
    """
    reader = _ColumnReader(with_args=with_args)
    base = 0
    try:
        stream, capacity = _open(source)
        with stream:
            blocks = _Blocks(stream, capacity)
            while (block := blocks.next()) is not None:
                if base == 0 and len(block) >= 8 and block[:8].tobytes() != _MAGIC_BYTES:
                    raise FxtFormatError("not a Fuchsia trace (no FXT magic record at the start)")
                usable = len(block) // 8
                words = block[: usable * 8].view("<u8")
                starts, stop = _frame(words, usable)
                reader.block(words, starts, base)
                base += stop
                blocks.consumed(stop * 8)
            carry = blocks.leftover()
            if carry:
                where = base * 8
                if len(carry) < 8:
                    raise FxtFormatError(f"truncated record header ({len(carry)} bytes)", where)
                raise FxtFormatError(
                    f"truncated record: {_size_of(carry)} words announced, {len(carry)} bytes left",
                    where,
                )
            if base == 0:
                raise FxtFormatError("empty file: not a Fuchsia trace")
        return reader.finish()
    except _BadRecord as e:
        raise FxtFormatError(e.message, (base + e.word) * 8) from None
    except _NotOurSubset:
        # Not ours to vouch for: the strict reader reads it, or says what is wrong.
        return _columns_from_trace(read_trace(source))


def _size_of(data: bytes) -> int:
    header = int.from_bytes(data[:8], "little")
    if header & 0xF == rec.RecordType.LARGE:
        return (header >> 4) & 0xFFFFFFFF
    return (header >> 4) & 0xFFF
