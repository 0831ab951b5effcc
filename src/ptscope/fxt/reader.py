"""Strict reader of Fuchsia traces: checks every record we write and returns its contents.

Strict means that anything a viewer could misread is an error (:class:`FxtFormatError`,
with the byte offset of the record): a record whose size field is 0 or does not match
its contents, a truncated tail, a string or thread ref to an entry never set, an argument
whose size does not match its type, invalid UTF-8, a complete event that ends before it
starts, an end without a begin, slices of one thread that overlap without nesting.
Records it does not interpret but can frame (blobs, logs, scheduling, large records, ...)
are counted and skipped.

It reads like Perfetto: a complete event's last word is its end time, an end event closes
the innermost open begin of its thread whatever its name, times are ``ticks * 1e9 /
ticks_per_second`` (1 tick = 1 ns without an initialization record), slices nest as in
Perfetto's slice tracker (see :func:`_nest`). Times are returned
as perf nanoseconds: the ``time_base_ns`` argument of the process records is added back.
"""

from __future__ import annotations

import gzip
import io
import struct
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Final, cast

from ptscope.fxt import records as rec
from ptscope.timeline import Slice, SliceFlags

__all__ = [
    "INFLATION_FLOOR",
    "MAX_INFLATION",
    "MAX_LARGE_RECORD_WORDS",
    "BoundedInflate",
    "FxtFormatError",
    "FxtTrace",
    "TraceCounter",
    "TraceInstant",
    "TraceSlice",
    "bounded",
    "check_trace_start",
    "read_trace",
]

ReadArg = int | float | str | bool | None
"""An argument value as read (integers of every width, pointers and koids are ``int``)."""

_GZIP_MAGIC: Final = b"\x1f\x8b"
TIME_END: Final = 1 << 63
"""Times (ns, the time base added) are below this and not negative: what an int64 column
of a Timeline holds. A trace with a time outside is damaged."""
_U64_MAX: Final = (1 << 64) - 1
_DECOMPRESS_ERRORS: Final = (OSError, EOFError, zlib.error)
"""What gzip (zlib underneath) raises on a damaged stream."""
_BLOCK: Final = 1 << 20
MAX_LARGE_RECORD_WORDS: Final = 1 << 20
"""The most words a large record (32-bit size: up to 32 GiB) may hold, 8 MiB: more is
refused before it is read, so a record's claim cannot make a reader hold gigabytes.
ptscope writes none (its records are at most 4095 words); others' blobs are skipped."""
MAX_INFLATION: Final = 100
"""A compressed trace may decompress to at most this many times its size (beyond
:data:`INFLATION_FLOOR`): ptscope's own traces inflate 8 to 14 times, a gzip bomb up to
1,032 times."""
INFLATION_FLOOR: Final = 16 << 20
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


class FxtFormatError(ValueError):
    """The data is not a well-formed Fuchsia trace; ``offset`` is the byte offset (in the
    uncompressed stream) of the record at fault, when there is one."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte {offset})")
        self.offset = offset


@dataclass(slots=True)
class TraceSlice:
    """A slice as read: times in perf ns, depth from how it nests on its thread."""

    start: int
    end: int
    depth: int
    name: str
    category: str = ""
    args: dict[str, ReadArg] = field(default_factory=dict)

    def to_slice(self) -> Slice:
        """As a :class:`ptscope.timeline.Slice` (ptscope's own args become fields, and a
        shortened name is whole again). An address past 64 bits or a count that is
        negative or past 63 bits (damage: they do not fit the columns) is unknown."""
        address = self.args.get(rec.ARG_ADDRESS, 0)
        flags = self.args.get(rec.ARG_FLAGS, "")
        return Slice(
            self.start,
            self.end,
            self.depth,
            rec.full_name(self.name, self.args),
            address if type(address) is int and 0 <= address <= _U64_MAX else 0,
            self._count(rec.ARG_INSTRUCTIONS),
            self._count(rec.ARG_CYCLES),
            SliceFlags(rec.parse_flags_text(flags))
            if isinstance(flags, str) and flags
            else SliceFlags.NONE,
            self._count(rec.ARG_ICACHE_LINES),
        )

    def _count(self, name: str) -> int:
        value = self.args.get(name, -1)
        return value if type(value) is int and 0 <= value < TIME_END else -1


@dataclass(slots=True)
class TraceInstant:
    time: int
    name: str
    category: str = ""
    args: dict[str, ReadArg] = field(default_factory=dict)


@dataclass(slots=True)
class TraceCounter:
    time: int
    name: str
    values: dict[str, ReadArg] = field(default_factory=dict)
    counter_id: int = 0


@dataclass
class FxtTrace:
    """Everything read from one trace. Per-thread lists are keyed by (pid, tid); slices are
    sorted by (start, depth), instants and counters by time (stable)."""

    ticks_per_second: int = rec.TICKS_PER_SECOND
    time_base: int = 0
    providers: dict[int, str] = field(default_factory=dict)
    processes: dict[int, str] = field(default_factory=dict)
    threads: dict[tuple[int, int], str] = field(default_factory=dict)
    slices: dict[tuple[int, int], list[TraceSlice]] = field(default_factory=dict)
    instants: dict[tuple[int, int], list[TraceInstant]] = field(default_factory=dict)
    counters: dict[tuple[int, int], list[TraceCounter]] = field(default_factory=dict)
    record_counts: Counter[str] = field(default_factory=Counter)
    """Records seen, by kind (``string``, ``complete``, ``skipped:blob``, ...)."""
    max_record_words: int = 0

    def thread_keys(self) -> list[tuple[int, int]]:
        """Every (pid, tid) with slices, instants or counters, sorted."""
        return sorted(set(self.slices) | set(self.instants) | set(self.counters))


# -- framing ---------------------------------------------------------------------------


class BoundedInflate:
    """A decompressed stream that ends in :class:`FxtFormatError` once it has given more
    than :data:`MAX_INFLATION` times its ``compressed`` size (and more than
    :data:`INFLATION_FLOOR`): a small file cannot keep a reader busy on gigabytes."""

    def __init__(self, stream: BinaryIO, compressed: int) -> None:
        self._stream = stream
        self.compressed = compressed
        self.limit = max(INFLATION_FLOOR, compressed * MAX_INFLATION)
        self.given = 0

    def _count(self, n: int) -> None:
        self.given += n
        if self.given > self.limit:
            raise FxtFormatError(
                f"it decompresses to more than {MAX_INFLATION} times its size "
                f"({self.compressed:,} bytes): not a trace ptscope wrote (a gzip bomb?)"
            )

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n if n >= 0 else self.limit - self.given + 1)
        self._count(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        n: int = self._stream.readinto(buffer)  # type: ignore[attr-defined]
        self._count(n)
        return n

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> BoundedInflate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def bounded(stream: BinaryIO, compressed: int) -> BinaryIO:
    """``stream`` (decompressed) as a :class:`BoundedInflate`, typed as the stream."""
    return cast(BinaryIO, BoundedInflate(stream, compressed))


def _open_stream(path: Path) -> BinaryIO:
    with open(path, "rb") as f:
        head = f.read(2)
        size = f.seek(0, io.SEEK_END)
    if head == _GZIP_MAGIC:
        return bounded(gzip.open(path, "rb"), size)  # type: ignore[arg-type]
    return open(path, "rb")


class _Framer:
    """Cuts a byte stream into records, framed by the 12-bit size field (the 32-bit one
    for large records), reading a block at a time."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self._buf = b""
        self._origin = 0  # stream offset of _buf[0]
        self._at = 0  # next record, in _buf
        self._eof = False

    def _fill(self, need: int) -> None:
        """Make at least ``need`` bytes available after the next record's start (unless
        the stream ends first).

        Read a block at a time, however many bytes a record announces (up to 32 GiB for a
        large record): what is held is never more than what the stream really has.
        """
        if self._eof or len(self._buf) - self._at >= need:
            return
        chunks = [self._buf[self._at :]]
        have = len(chunks[0])
        self._origin += self._at
        self._at = 0
        while have < need:
            try:
                more = self._stream.read(_BLOCK)
            except _DECOMPRESS_ERRORS as e:
                raise FxtFormatError(f"cannot decompress: {e}", self._origin + have) from e
            if not more:
                self._eof = True
                break
            chunks.append(more)
            have += len(more)
        self._buf = b"".join(chunks)

    def __iter__(self) -> Iterator[tuple[int, int, memoryview]]:
        """(offset, header, record bytes) for every record."""
        while True:
            self._fill(8)
            remaining = len(self._buf) - self._at
            offset = self._origin + self._at
            if remaining == 0:
                return
            if remaining < 8:
                raise FxtFormatError(f"truncated record header ({remaining} bytes)", offset)
            header: int = _U64.unpack_from(self._buf, self._at)[0]
            if offset == 0 and header != rec.MAGIC:
                raise FxtFormatError("not a Fuchsia trace (no FXT magic record at the start)")
            if header & 0xF == rec.RecordType.LARGE:
                words = (header >> 4) & 0xFFFFFFFF
                if words > MAX_LARGE_RECORD_WORDS:
                    raise FxtFormatError(
                        f"a large record of {words:,} words, more than the "
                        f"{MAX_LARGE_RECORD_WORDS:,} a reader takes",
                        offset,
                    )
            else:
                words = (header >> 4) & 0xFFF
            if words == 0:
                raise FxtFormatError("record of size 0", offset)
            size = words * 8
            if remaining < size:
                self._fill(size)
                remaining = len(self._buf) - self._at
                if remaining < size:
                    raise FxtFormatError(
                        f"truncated record: {words} words announced, {remaining} bytes left",
                        offset,
                    )
            yield offset, header, memoryview(self._buf)[self._at : self._at + size]
            self._at += size


# -- interpretation ------------------------------------------------------------------

_STRUCTS: dict[int, struct.Struct] = {}


def _words(raw: memoryview) -> tuple[int, ...]:
    n = len(raw) // 8
    unpacker = _STRUCTS.get(n)
    if unpacker is None:
        unpacker = _STRUCTS[n] = struct.Struct(f"<{n}Q")
    return unpacker.unpack(raw)


class _Cursor:
    """Reads the words of one record in order, checking that nothing runs past its end."""

    __slots__ = ("offset", "pos", "raw", "words")

    def __init__(self, raw: memoryview, offset: int) -> None:
        self.raw = raw
        self.words = _words(raw)
        self.offset = offset
        self.pos = 1

    def short(self) -> FxtFormatError:
        return FxtFormatError(
            f"record is shorter ({len(self.words)} words) than its contents", self.offset
        )

    def u64(self) -> int:
        p = self.pos
        if p >= len(self.words):
            raise self.short()
        self.pos = p + 1
        return self.words[p]

    def stream(self, length: int) -> bytes:
        p = self.pos
        n = (length + 7) >> 3
        if p + n > len(self.words):
            raise self.short()
        self.pos = p + n
        return bytes(self.raw[p * 8 : p * 8 + length])

    def done(self) -> None:
        if self.pos != len(self.words):
            raise FxtFormatError(
                f"record size field says {len(self.words)} words, contents take {self.pos}",
                self.offset,
            )


def _decode(data: bytes, offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FxtFormatError(f"string is not valid UTF-8 ({e.reason})", offset) from e


def _signed(word: int) -> int:
    return word - (1 << 64) if word >> 63 else word


@dataclass
class _Open:
    """A begin event waiting for its end."""

    time: int
    name: str
    category: str
    args: dict[str, ReadArg]
    order: int


_Interval = tuple[int, int, int, str, str, dict[str, ReadArg]]
"""(start, end, record number, name, category, args); times in ns since the time base."""
_BeginEnd = tuple[int, int, bool, str, str, dict[str, ReadArg], int]
"""(time, record number, is begin, name, category, args, byte offset)."""


@dataclass
class _Provider:
    """What the format keeps per provider: its string and thread tables, its tick rate."""

    strings: dict[int, str] = field(default_factory=dict)
    threads: dict[int, tuple[int, int]] = field(default_factory=dict)
    ticks_per_second: int = rec.TICKS_PER_SECOND


class _Reader:
    def __init__(self) -> None:
        self.trace = FxtTrace()
        # Provider 0 is there from the start (as in Perfetto): traces need no metadata.
        self.providers: dict[int, _Provider] = {0: _Provider()}
        self.provider = self.providers[0]
        self.strings = self.provider.strings
        self.thread_table = self.provider.threads
        self.intervals: dict[tuple[int, int], list[_Interval]] = {}
        self.begin_end: dict[tuple[int, int], list[_BeginEnd]] = {}
        self.order = 0
        self.time_bases: set[int] = set()

    # -- refs --

    def string(self, ref: int, cur: _Cursor) -> str:
        if ref == 0:
            return ""
        if ref & 0x8000:
            return _decode(cur.stream(ref & 0x7FFF), cur.offset)
        text = self.strings.get(ref)
        if text is None:
            raise FxtFormatError(f"string ref {ref} was never set", cur.offset)
        return text

    def thread(self, ref: int, cur: _Cursor) -> tuple[int, int]:
        if ref == 0:
            return _signed(cur.u64()), _signed(cur.u64())
        key = self.thread_table.get(ref)
        if key is None:
            raise FxtFormatError(f"thread ref {ref} was never set", cur.offset)
        return key

    def args(self, count: int, cur: _Cursor) -> dict[str, ReadArg]:
        out: dict[str, ReadArg] = {}
        words = cur.words
        for _ in range(count):
            start = cur.pos
            header = cur.u64()
            arg_type = header & 0xF
            size = (header >> 4) & 0xFFF
            name = self.string((header >> 16) & 0xFFFF, cur)
            payload = header >> 32
            value: ReadArg
            if arg_type == rec.ArgType.I64:
                value = _signed(cur.u64())
            elif arg_type in (rec.ArgType.U64, rec.ArgType.POINTER, rec.ArgType.KOID):
                value = cur.u64()
            elif arg_type == rec.ArgType.STRING:
                value = self.string(payload & 0xFFFF, cur)
            elif arg_type == rec.ArgType.I32:
                value = payload - (1 << 32) if payload & 0x80000000 else payload
            elif arg_type == rec.ArgType.U32:
                value = payload
            elif arg_type == rec.ArgType.DOUBLE:
                value = _F64.unpack(_U64.pack(cur.u64()))[0]
            elif arg_type == rec.ArgType.NULL:
                value = None
            elif arg_type == rec.ArgType.BOOL:
                value = bool(payload & 1)
            else:  # blob or a newer type: framed by its size field
                if size == 0 or start + size > len(words):
                    raise FxtFormatError(f"argument {name!r} has a bad size", cur.offset)
                value = None
                cur.pos = start + size
            if cur.pos - start != size:
                raise FxtFormatError(
                    f"argument {name!r} of type {arg_type} says {size} words, "
                    f"takes {cur.pos - start}",
                    cur.offset,
                )
            out[name] = value
        return out

    # -- records --

    def record(self, offset: int, header: int, raw: memoryview) -> None:
        kind = header & 0xF
        counts = self.trace.record_counts
        if kind == rec.RecordType.LARGE:
            counts["skipped:large"] += 1
            return
        self.trace.max_record_words = max(self.trace.max_record_words, len(raw) // 8)
        if kind == rec.RecordType.EVENT:
            cur = _Cursor(raw, offset)
            self.event(header, cur)
            cur.done()
        elif kind == rec.RecordType.STRING:
            cur = _Cursor(raw, offset)
            index = (header >> 16) & 0x7FFF
            if index == 0:
                raise FxtFormatError("string record for index 0", offset)
            self.strings[index] = _decode(cur.stream((header >> 32) & 0x7FFF), offset)
            counts["string"] += 1
            cur.done()
        elif kind == rec.RecordType.THREAD:
            cur = _Cursor(raw, offset)
            index = (header >> 16) & 0xFF
            if index == 0:
                raise FxtFormatError("thread record for index 0", offset)
            self.thread_table[index] = (_signed(cur.u64()), _signed(cur.u64()))
            counts["thread"] += 1
            cur.done()
        elif kind == rec.RecordType.METADATA:
            self.metadata(header, _Cursor(raw, offset))
        elif kind == rec.RecordType.INITIALIZATION:
            cur = _Cursor(raw, offset)
            tps = cur.u64()
            if tps == 0:
                raise FxtFormatError("zero ticks per second", offset)
            self.provider.ticks_per_second = self.trace.ticks_per_second = tps
            counts["initialization"] += 1
            cur.done()
        elif kind == rec.RecordType.KERNEL_OBJECT:
            cur = _Cursor(raw, offset)
            self.kernel_object(header, cur)
            cur.done()
        else:
            counts[f"skipped:{_kind_name(kind)}"] += 1

    def metadata(self, header: int, cur: _Cursor) -> None:
        mtype = (header >> 16) & 0xF
        counts = self.trace.record_counts
        if mtype == rec.MetadataType.TRACE_INFO:
            if (header >> 20) & 0xF == 0 and header != rec.MAGIC:
                raise FxtFormatError(f"bad magic record {header:#018x}", cur.offset)
            counts["magic" if header == rec.MAGIC else "skipped:trace-info"] += 1
        elif mtype == rec.MetadataType.PROVIDER_INFO:
            provider = (header >> 20) & 0xFFFFFFFF
            name = _decode(cur.stream((header >> 52) & 0xFF), cur.offset)
            self.trace.providers[provider] = name
            self.switch_provider(_Provider(), provider)
            counts["provider-info"] += 1
            cur.done()
        elif mtype == rec.MetadataType.PROVIDER_SECTION:
            provider = (header >> 20) & 0xFFFFFFFF
            state = self.providers.get(provider)
            if state is None:
                raise FxtFormatError(f"section of provider {provider} before its info", cur.offset)
            self.switch_provider(state, provider)
            counts["provider-section"] += 1
            cur.done()
        else:
            counts[f"skipped:metadata-{mtype}"] += 1

    def switch_provider(self, state: _Provider, provider: int) -> None:
        self.providers[provider] = self.provider = state
        self.strings = state.strings
        self.thread_table = state.threads

    def ns(self, ticks: int) -> int:
        """Ticks of the current provider as ns since the time base."""
        tps = self.provider.ticks_per_second
        return ticks if tps == rec.TICKS_PER_SECOND else ticks * 1_000_000_000 // tps

    def kernel_object(self, header: int, cur: _Cursor) -> None:
        otype = (header >> 16) & 0xFF
        koid = _signed(cur.u64())
        name = self.string((header >> 24) & 0xFFFF, cur)
        args = self.args((header >> 40) & 0xF, cur)
        counts = self.trace.record_counts
        if otype == rec.KernelObjectType.PROCESS:
            self.trace.processes[koid] = name
            base = args.get(rec.ARG_TIME_BASE)
            if isinstance(base, int):
                self.time_bases.add(base)
            counts["process"] += 1
        elif otype == rec.KernelObjectType.THREAD:
            pid = args.get(rec.ARG_PROCESS)
            if not isinstance(pid, int):
                raise FxtFormatError(f"thread {koid} has no '{rec.ARG_PROCESS}' koid", cur.offset)
            self.trace.threads[(_signed(pid), koid)] = name
            counts["thread-name"] += 1
        else:
            counts[f"skipped:kernel-object-{otype}"] += 1

    def event(self, header: int, cur: _Cursor) -> None:
        etype = (header >> 16) & 0xF
        nargs = (header >> 20) & 0xF
        time = self.ns(cur.u64())
        key = self.thread((header >> 24) & 0xFF, cur)
        category = self.string((header >> 32) & 0xFFFF, cur)
        name = self.string(header >> 48, cur)
        args = self.args(nargs, cur) if nargs else {}
        counts = self.trace.record_counts
        self.order += 1
        if etype == rec.EventType.DURATION_COMPLETE:
            end = self.ns(cur.u64())
            if end < time:
                raise FxtFormatError(f"slice {name!r} ends before it starts", cur.offset)
            intervals = self.intervals.get(key)
            if intervals is None:
                intervals = self.intervals[key] = []
            intervals.append((time, end, self.order, name, category, args))
            counts["complete"] += 1
        elif etype in (rec.EventType.DURATION_BEGIN, rec.EventType.DURATION_END):
            is_begin = etype == rec.EventType.DURATION_BEGIN
            self.begin_end.setdefault(key, []).append(
                (time, self.order, is_begin, name, category, args, cur.offset)
            )
            counts["begin" if is_begin else "end"] += 1
        elif etype == rec.EventType.INSTANT:
            self.trace.instants.setdefault(key, []).append(TraceInstant(time, name, category, args))
            counts["instant"] += 1
        elif etype == rec.EventType.COUNTER:
            counter_id = cur.u64()
            self.trace.counters.setdefault(key, []).append(
                TraceCounter(time, name, args, counter_id)
            )
            counts["counter"] += 1
        elif etype <= rec.EventType.FLOW_END:  # async and flow events: one more word
            cur.u64()
            counts[f"skipped:event-{etype}"] += 1
        else:  # a newer event type: framed by the record size
            cur.pos = len(cur.words)
            counts[f"skipped:event-{etype}"] += 1

    # -- the end --

    def finish(self) -> FxtTrace:
        trace = self.trace
        if len(self.time_bases) > 1:
            raise FxtFormatError(f"process records disagree on the time base: {self.time_bases}")
        trace.time_base = next(iter(self.time_bases), 0)
        base = trace.time_base

        def ns(time: int) -> int:
            time += base
            if not 0 <= time < TIME_END:
                raise FxtFormatError(f"a time of {time} ns is out of range (0 to 2^63)")
            return time

        for key, events in self.begin_end.items():
            intervals = self.intervals.setdefault(key, [])
            events.sort(key=lambda e: (e[0], e[1]))
            stack: list[_Open] = []
            for time, order, is_begin, name, category, args, offset in events:
                if is_begin:
                    stack.append(_Open(time, name, category, args, order))
                    continue
                if not stack:
                    raise FxtFormatError(f"end of {name!r} on thread {key} without a begin", offset)
                began = stack.pop()
                if name and name != began.name:
                    raise FxtFormatError(
                        f"end of {name!r} closes {began.name!r} on thread {key}", offset
                    )
                intervals.append(
                    (
                        began.time,
                        time,
                        began.order,
                        began.name,
                        began.category,
                        {**began.args, **args},
                    )
                )
            if stack:
                raise FxtFormatError(
                    f"{len(stack)} slice(s) on thread {key} never end (first: {stack[0].name!r})"
                )
        for key, intervals in self.intervals.items():
            trace.slices[key] = _nest(key, intervals, ns)
            intervals.clear()  # one thread's raw tuples alive at a time
        for instants in trace.instants.values():
            instants.sort(key=lambda i: i.time)
            for instant in instants:
                instant.time = ns(instant.time)
        for counters in trace.counters.values():
            counters.sort(key=lambda c: c.time)
            for counter in counters:
                counter.time = ns(counter.time)
        return trace


def _nest(
    key: tuple[int, int],
    intervals: list[tuple[int, int, int, str, str, dict[str, ReadArg]]],
    ns: Callable[[int], int],
) -> list[TraceSlice]:
    """Slices with their depth, nested as Perfetto nests them: in time order (ties in
    record order), a slice starts by closing every open slice that ends at or before its
    start, and is the child of the innermost one still open (so a slice of length 0 never
    has children). A slice that ends after the one it starts in is an error."""
    intervals.sort(key=lambda s: (s[0], s[2]))
    out: list[TraceSlice] = []
    stack: list[tuple[int, int]] = []  # (start, end) of the open ancestors
    for start, end, _, name, category, args in intervals:
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack and end > stack[-1][1]:
            ps, pe = stack[-1]
            raise FxtFormatError(
                f"slice {name!r} [{ns(start)}, {ns(end)}] on thread {key} overlaps "
                f"[{ns(ps)}, {ns(pe)}] without nesting in it"
            )
        out.append(TraceSlice(ns(start), ns(end), len(stack), name, category, args))
        stack.append((start, end))
    return out


def _kind_name(kind: int) -> str:
    try:
        return rec.RecordType(kind).name.lower().replace("_", "-")
    except ValueError:
        return f"type-{kind}"


def read_trace(source: str | Path | bytes) -> FxtTrace:
    """Read a trace from a file (``.fxt`` or gzip, told apart by content) or from bytes.

    Raises :class:`FxtFormatError` when it is not a well-formed Fuchsia trace (the first
    record must be the magic record) and OSError when the file cannot be read.
    """
    if isinstance(source, bytes):
        if source[:2] == _GZIP_MAGIC:
            inflated = bounded(gzip.GzipFile(fileobj=io.BytesIO(source)), len(source))  # type: ignore[arg-type]
            try:
                source = inflated.read()
            except _DECOMPRESS_ERRORS as e:
                raise FxtFormatError(f"cannot decompress: {e}") from e
        stream: BinaryIO = io.BytesIO(source)
    else:
        stream = _open_stream(Path(source))
    reader = _Reader()
    with stream:
        for offset, header, data in _Framer(stream):
            reader.record(offset, header, data)
        if not reader.trace.record_counts:
            raise FxtFormatError("empty file: not a Fuchsia trace")
    return reader.finish()


def check_trace_start(path: str | Path) -> None:
    """Raise :class:`FxtFormatError` unless ``path`` (plain or gzip) starts with the FXT
    magic record; reads only the first bytes. OSError when it cannot be read."""
    with _open_stream(Path(path)) as stream:
        try:
            head = stream.read(8)
        except _DECOMPRESS_ERRORS as e:
            raise FxtFormatError(f"cannot decompress: {e}") from e
    if not head:
        raise FxtFormatError("empty file: not a Fuchsia trace")
    if len(head) < 8 or _U64.unpack(head)[0] != rec.MAGIC:
        raise FxtFormatError("not a Fuchsia trace (no FXT magic record at the start)")
