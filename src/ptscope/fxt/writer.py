"""Streams a Fuchsia trace to disk: string and thread interning, events, and Timelines.

Format limits, enforced here so that callers never have to think about them:

- the string table has 32,767 entries and the thread table 255: when either is full, the
  entry written longest ago is replaced by a new string (thread) record. Readers resolve
  refs when they read a record (Perfetto does so in its tokenizer, before sorting), so
  reuse is safe; the entries one record refers to are never replaced while it is written;
- strings longer than 32,000 bytes are cut (at a character boundary); a slice name longer
  than ``records.LONG_NAME`` characters is shortened visibly and written whole in the
  slice's ``full_name`` arg(s) (in pieces of at most 32,000 bytes);
- no record exceeds 4095 words: every string is referred to through the table (never
  inline), events carry at most 15 arguments of at most 2 words each.

Times given to the writer are perf nanoseconds; the trace stores ``time - time_base`` at
1 tick per ns (Perfetto keeps timestamps as doubles in places and loses precision on
large absolute values) and records ``time_base`` on every process kernel object.

A file is written under a temporary name beside it, ``NAME.ptscope-<pid>.tmp``, and renamed
to its name once complete (:meth:`FxtWriter.close`): a failure (a full disk) or a signal
leaves no partial or empty trace, and an existing one is replaced only by a whole one. A
temporary file whose ptscope was killed is removed by the next writer of that name. A
name that is not a regular file (``/dev/null``, a FIFO) is written in place; a symbolic
link stays one (its target is replaced). A trace that must go after all (a decode that
found nothing) is removed only where ptscope created it, a regular file
(:func:`remove_written`): a device or a FIFO stays.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, NamedTuple

import numpy as np
import numpy.typing as npt

from ptscope.errors import PtscopeError
from ptscope.fxt import records as rec
from ptscope.timeline import Timeline

__all__ = [
    "GZIP_LEVEL",
    "ArgValue",
    "Drill",
    "FxtWriter",
    "Koid",
    "Pointer",
    "UInt64",
    "WriteStats",
    "remove_written",
    "write_timeline",
    "write_whole",
    "written_in_place",
]

try:  # ISA-L's gzip: the same format, about 6x faster than zlib at the same ratio
    from isal.igzip import IGzipFile as _FastGzipFile
except ImportError:  # pragma: no cover (a platform without isal wheels)
    _FastGzipFile = None  # type: ignore[assignment,misc]

try:  # the C slice encoder (fxt/_cfxt.c); without it, the numpy twin below encodes
    from ptscope.fxt import _cfxt
except ImportError:  # pragma: no cover (built where a C compiler is found)
    _cfxt = None

GZIP_LEVEL: Final = 1
"""The fast level, ISA-L's or zlib's: our records are regular, so level 1 is nearly as
small as zlib's level 6 at a fraction of the cost (figures: bench/fxt_writer.py)."""

_PINNED_STRINGS: Final = 300
"""Table entries never replaced: the category, arg names and every possible flags text."""
_CHUNK: Final = 1 << 16
"""Slices encoded per numpy pass: big enough to amortise numpy calls, small enough that
memory stays bounded (at most 10 words a slice: 5 MiB)."""
_FLUSH_BYTES: Final = 1 << 20

_U64 = npt.NDArray[np.uint64]
_MAX_I64: Final = (1 << 63) - 1
_MIN_I64: Final = -(1 << 63)


class Pointer(int):
    """An int written as a pointer argument (Perfetto shows it in hex)."""


class Koid(int):
    """An int written as a kernel-object id argument."""


class UInt64(int):
    """An int written as an unsigned 64-bit argument."""


ArgValue = int | float | str
"""An argument value: ``int`` (i64, or u64 above 2**63), ``float`` (double), ``str``; use
:class:`Pointer`, :class:`Koid` or :class:`UInt64` to choose the integer type."""


@dataclass
class WriteStats:
    """What a writer wrote. ``bytes`` is uncompressed; ``file_bytes`` is on disk."""

    records: int = 0
    bytes: int = 0
    file_bytes: int = 0
    slices: int = 0
    instants: int = 0
    counters: int = 0
    string_records: int = 0
    thread_records: int = 0
    kernel_objects: int = 0


def _distinct(values: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """The distinct values of an array of small non-negative ints (name ids, table slots,
    flags), in order: ``np.unique`` by counting, which neither sorts nor hashes, and does
    not import ``numpy.ma`` as np.unique's first call does (30 M instructions)."""
    return np.flatnonzero(np.bincount(values))


class _StringTable:
    """String interning with bounded, reusable table indices.

    Indices 1.._PINNED_STRINGS are given out once and never replaced; the rest are reused
    round-robin. ``clock`` advances once per record (or per chunk of slices); an entry
    stamped with the current clock is in use by the record being written and is never
    chosen for reuse.
    """

    def __init__(self, writer: FxtWriter, pinned: int, dynamic: int) -> None:
        if dynamic < 1 or pinned + dynamic > rec.MAX_STRING_INDEX:
            raise ValueError(f"string table of {pinned} + {dynamic} entries does not fit")
        self._writer = writer
        self._next_pinned = 1
        self._pinned_end = pinned
        self._lo = pinned + 1
        self._hi = pinned + dynamic
        self._cursor = self._lo
        self._free = dynamic
        self._slot: dict[str, int] = {}
        self._text: list[str | None] = [None] * (self._hi + 1)
        self._stamp: list[int] = [-1] * (self._hi + 1)
        self.clock = 0
        # The name table of the Timeline being written: name id -> table index (-1: none),
        # and back (an index can stand for several ids when names repeat).
        self._names: Sequence[str] | None = None
        self._slot_of_name: npt.NDArray[np.int32] = np.zeros(0, dtype=np.int32)
        self._ids_of_slot: dict[int, list[int]] = {}

    @property
    def dynamic_capacity(self) -> int:
        return self._hi - self._lo + 1

    def hold(self, slots: npt.NDArray[np.int32]) -> None:
        """Keep ``slots`` (in use by the records being written) from reuse until the clock
        moves on; :meth:`ref` may then intern more strings for the same records."""
        self.clock += 1
        for slot in _distinct(slots[slots >= self._lo]).tolist():
            self._stamp[slot] = self.clock

    def pin(self, text: str) -> int:
        """A table index for ``text`` that stays valid for the whole trace."""
        if not text:
            return 0
        slot = self._slot.get(text)
        if slot is not None and slot < self._lo:
            return slot
        if self._next_pinned > self._pinned_end:
            raise ValueError("too many permanent strings")
        slot = self._next_pinned
        self._next_pinned += 1
        self._slot[text] = slot
        self._text[slot] = text
        self._writer._string_record(slot, text)
        return slot

    def ref(self, text: str) -> int:
        """A table index for ``text`` valid until the clock moves on."""
        if not text:
            return 0
        slot = self._slot.get(text)
        if slot is None:
            slot = self._victim()
            self._assign(slot, text)
        self._stamp[slot] = self.clock
        return slot

    def _victim(self) -> int:
        stamp, clock, lo, hi = self._stamp, self.clock, self._lo, self._hi
        for _ in range(hi - lo + 1):
            slot = self._cursor
            self._cursor = slot + 1 if slot < hi else lo
            if stamp[slot] != clock:
                return slot
        raise rec.RecordTooLargeError(
            "one record refers to more distinct strings than the string table holds"
        )

    def _assign(self, slot: int, text: str) -> None:
        old = self._text[slot]
        if old is None:
            self._free -= 1
        else:
            if self._slot.get(old) == slot:
                del self._slot[old]
            ids = self._ids_of_slot.pop(slot, None)
            if ids:
                self._slot_of_name[ids] = -1
        self._text[slot] = text
        self._slot[text] = slot
        self._writer._string_record(slot, text)

    def bind(self, names: Sequence[str]) -> None:
        """Use ``names`` as the table that :meth:`slots_for` ids refer to (a streaming
        engine's table grows between calls: its new names are added)."""
        if names is self._names:
            grown = len(names) - len(self._slot_of_name)
            if grown > 0:
                self._slot_of_name = np.concatenate(
                    [self._slot_of_name, np.full(grown, -1, dtype=np.int32)]
                )
            return
        self._names = names
        self._slot_of_name = np.full(len(names), -1, dtype=np.int32)
        self._ids_of_slot = {}

    def slots_for(self, ids: npt.NDArray[np.int32]) -> npt.NDArray[np.int32] | None:
        """Table indices for the bound names ``ids`` (writing string records for the ones
        not in the table), or None when they are more than the table holds at once."""
        slot_of_name = self._slot_of_name
        slots = slot_of_name[ids]
        if not slots.size or int(slots.min()) >= 0:
            return slots
        missing = _distinct(ids[slots < 0])
        self.clock += 1
        clock, stamp = self.clock, self._stamp
        if len(missing) > self._free:
            # Entries will be reused: keep the ones this chunk refers to.
            present = _distinct(slots[slots >= self._lo])
            if len(present) + len(missing) > self.dynamic_capacity:
                return None
            for slot in present.tolist():
                stamp[slot] = clock
        assert self._names is not None
        names = self._names
        for name_id in missing.tolist():
            text = names[name_id]
            if not text:
                slot_of_name[name_id] = 0
                continue
            slot = self._slot.get(text)
            if slot is None:
                slot = self._victim()
                self._assign(slot, text)
            stamp[slot] = clock
            slot_of_name[name_id] = slot
            if slot >= self._lo:
                self._ids_of_slot.setdefault(slot, []).append(name_id)
        return slot_of_name[ids]


class _SliceNames:
    """The names slices show, for a Timeline's (or a streaming engine's growing) name
    table: long names shortened (``records.short_name``), their whole text kept in pieces
    for the ``full_name`` args."""

    def __init__(self) -> None:
        self._source: Sequence[str] | None = None
        self.shown: list[str] = []
        self.pieces: dict[int, list[str]] = {}  # name id -> the whole name, in pieces
        self.piece_count = np.zeros(0, dtype=np.int32)  # by name id (0: not shortened)

    def of(self, names: Sequence[str]) -> list[str]:
        """The shown names for ``names`` (the same list object while ``names`` is the same
        table, so that the string table sees it grow)."""
        if names is not self._source:
            self._source = names
            self.shown = []
            self.pieces = {}
            self.piece_count = np.zeros(0, dtype=np.int32)
        known = len(self.shown)
        if len(names) > known:
            counts = np.zeros(len(names) - known, dtype=np.int32)
            for k, name in enumerate(names[known:], known):
                if len(name) > rec.LONG_NAME:
                    self.pieces[k] = rec.utf8_pieces(name)
                    counts[k - known] = len(self.pieces[k])
                    name = rec.short_name(name)
                self.shown.append(name)
            self.piece_count = np.concatenate([self.piece_count, counts])
        return self.shown


class _ThreadTable:
    """Thread interning with bounded, reusable table indices (round-robin reuse)."""

    def __init__(self, writer: FxtWriter, slots: int) -> None:
        if not 1 <= slots <= rec.MAX_THREAD_INDEX:
            raise ValueError(f"thread table of {slots} entries does not fit")
        self._writer = writer
        self._slots = slots
        self._cursor = 1
        self._slot: dict[tuple[int, int], int] = {}
        self._key: list[tuple[int, int] | None] = [None] * (slots + 1)

    def ref(self, pid: int, tid: int) -> int:
        key = (pid, tid)
        slot = self._slot.get(key)
        if slot is None:
            # An event refers to one thread only, so any entry may be reused.
            slot = self._cursor
            self._cursor = slot + 1 if slot < self._slots else 1
            old = self._key[slot]
            if old is not None:
                del self._slot[old]
            self._key[slot] = key
            self._slot[key] = slot
            self._writer._thread_record(slot, pid, tid)
        return slot


class _SliceColumns(NamedTuple):
    """A chunk's columns as the encoders take them (ticks; args as FxtWriter.slices)."""

    start: _U64
    end: _U64
    address: _U64 | None
    instructions: npt.NDArray[np.int64] | None
    cycles: npt.NDArray[np.int64] | None
    flags: npt.NDArray[np.uint8] | None
    continued: npt.NDArray[np.uint8] | None
    full_name: Sequence[tuple[npt.NDArray[np.bool_], _U64]]
    icache_lines: npt.NDArray[np.int64] | None


@dataclass(frozen=True)
class Drill:
    """What each slice's ``drill`` string is made of (:func:`records.drill_strings`): the
    command up to ``--time``, and per slice its perf times and, where known, its anchor
    and its instruction count (``anchor_ip``/``anchor_occurrence`` as
    :class:`~ptscope.timeline.SliceBatch` has them; ``instructions`` the whole call's,
    even for a piece of it)."""

    prefix: str
    perf_start: npt.ArrayLike
    perf_end: npt.ArrayLike
    anchor_ip: npt.ArrayLike | None = None
    anchor_occurrence: npt.ArrayLike | None = None
    instructions: npt.ArrayLike | None = None

    def columns(self, i: int, j: int) -> _DrillColumns:
        """What the strings of slices [i, j) are made of: the perf times, and the anchor
        and counts (all three, or None where the slices have none)."""
        anchored = (
            self.anchor_ip is not None
            and self.anchor_occurrence is not None
            and self.instructions is not None
        )
        return _DrillColumns(
            np.ascontiguousarray(np.asarray(self.perf_start, dtype=np.int64)[i:j]),
            np.ascontiguousarray(np.asarray(self.perf_end, dtype=np.int64)[i:j]),
            _contiguous(self.anchor_ip, np.uint64, i, j) if anchored else None,
            _contiguous(self.anchor_occurrence, np.int64, i, j) if anchored else None,
            _contiguous(self.instructions, np.int64, i, j) if anchored else None,
        )

    def texts(self, i: int, j: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
        """The strings of slices [i, j): their lengths and bytes."""
        return rec.drill_strings(self.prefix, *self.columns(i, j))


class _DrillColumns(NamedTuple):
    perf_start: npt.NDArray[np.int64]
    perf_end: npt.NDArray[np.int64]
    anchor_ip: npt.NDArray[np.uint64] | None
    anchor_occurrence: npt.NDArray[np.int64] | None
    instructions: npt.NDArray[np.int64] | None


def _contiguous(
    values: npt.ArrayLike | None, dtype: type[np.generic], i: int, j: int
) -> npt.NDArray[Any]:
    return np.ascontiguousarray(np.asarray(values, dtype=dtype)[i:j])


class FxtWriter:
    """Writes one Fuchsia trace to a binary stream, record by record.

    The header (magic, provider info and section, initialization at 1 tick = 1 ns) is
    written at once. All times are absolute perf nanoseconds ≥ ``time_base``. Use
    :meth:`open` to write a file (``.gz`` suffix: gzip); :meth:`close` flushes.

    ``string_slots`` and ``thread_slots`` shrink the tables (tests use this to exercise
    reuse); the defaults are the format's limits.
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        time_base: int = 0,
        provider: str = rec.PROVIDER_NAME,
        category: str = rec.CATEGORY,
        string_slots: int = rec.MAX_STRING_INDEX - _PINNED_STRINGS,
        thread_slots: int = rec.MAX_THREAD_INDEX,
    ) -> None:
        self._out = stream
        self._owned: list[BinaryIO] = []
        self._temporary: Path | None = None  # written there, renamed to _final by close()
        self._final: Path | None = None
        self._buf = bytearray()
        self.stats = WriteStats()
        self.time_base = time_base
        self._strings = _StringTable(self, _PINNED_STRINGS, string_slots)
        self._threads = _ThreadTable(self, thread_slots)
        self._emit(rec.magic_record())
        self._emit(rec.provider_info_record(rec.PROVIDER_ID, provider))
        self._emit(rec.provider_section_record(rec.PROVIDER_ID))
        self._emit(rec.initialization_record(rec.TICKS_PER_SECOND))
        pin = self._strings.pin
        self._category = pin(category)
        self._arg_time_base = pin(rec.ARG_TIME_BASE)
        self._arg_process = pin(rec.ARG_PROCESS)
        self._arg_address = pin(rec.ARG_ADDRESS)
        self._arg_instructions = pin(rec.ARG_INSTRUCTIONS)
        self._arg_cycles = pin(rec.ARG_CYCLES)
        self._arg_icache = pin(rec.ARG_ICACHE_LINES)
        self._arg_drill = pin(rec.ARG_DRILL)
        self._arg_flags = pin(rec.ARG_FLAGS)
        self._arg_value = pin(rec.ARG_COUNTER_VALUE)
        self._arg_continued = pin(rec.ARG_CONTINUED)
        self._slice_names = _SliceNames()
        self._arg_full_name: list[int] = []  # full_name, full_name_2, ... (pinned as needed)
        self._arg_call_site = pin(rec.ARG_CALL_SITE)
        self._continued_lut = np.zeros(4, dtype=np.uint64)  # continued value -> string index
        for value, text in rec.CONTINUED_TEXT.items():
            self._continued_lut[value] = pin(text)
        self._flag_lut = np.zeros(256, dtype=np.uint64)  # flags value -> string index
        self._scratch = np.empty(0, dtype=np.uint64)  # the C encoder's output, reused

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        compress: bool | None = None,
        time_base: int = 0,
        gzip_level: int | None = None,
    ) -> FxtWriter:
        """A writer on a new file; gzip-compressed when ``compress`` says so or, when it
        is None, when the name ends in ``.gz``. ``gzip_level`` None: :data:`GZIP_LEVEL`
        with ISA-L when it is installed; a number: zlib at that level."""
        path = Path(path)
        if compress is None:
            compress = path.suffix == ".gz"
        final = Path(os.path.realpath(path)) if path.is_symlink() else path
        temporary = None if written_in_place(final) else _temporary_name(final)
        try:
            if temporary is not None:
                _sweep_temporaries(final)
            raw: BinaryIO = open(temporary or final, "wb")  # noqa: SIM115 (closed by close())
        except OSError as e:
            raise PtscopeError(
                f"cannot write {path}: {e.strerror or e}",
                hint="choose another output path with -o",
            ) from e
        stream: BinaryIO = raw
        if compress:
            # mtime=0 and no file name: the same trace gives the same bytes.
            gzip_file = gzip.GzipFile
            if gzip_level is None:
                gzip_level = GZIP_LEVEL
                if _FastGzipFile is not None:
                    gzip_file = _FastGzipFile
            stream = gzip_file(  # type: ignore[assignment]
                filename="", mode="wb", fileobj=raw, compresslevel=gzip_level, mtime=0
            )
        try:
            writer = cls(stream, time_base=time_base)
        except BaseException:
            raw.close()
            if temporary is not None:
                temporary.unlink(missing_ok=True)
            raise
        writer._owned = [stream, raw] if compress else [raw]
        writer._temporary = temporary
        writer._final = final
        return writer

    def __enter__(self) -> FxtWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.discard()

    # -- output ---------------------------------------------------------------------

    def _emit(self, record: bytes) -> None:
        self._buf += record
        self.stats.records += 1
        self.stats.bytes += len(record)
        if len(self._buf) >= _FLUSH_BYTES:
            self._flush_buffer()

    def _emit_words(self, words: _U64, records: int) -> None:
        self._flush_buffer()
        self._out.write(words.data.cast("B"))
        self.stats.records += records
        self.stats.bytes += words.nbytes

    def _flush_buffer(self) -> None:
        if self._buf:
            self._out.write(self._buf)
            self._buf.clear()

    def flush(self) -> None:
        self._flush_buffer()
        self._out.flush()

    def close(self, *, commit: bool = True) -> None:
        """Flush and close the files this writer opened (a passed-in stream stays open),
        and give the file its name (``commit``; or later, :meth:`commit`). If that fails,
        the file is removed (:meth:`discard`) and the OSError raised."""
        try:
            self._flush_buffer()
            if self._owned:
                for f in self._owned:
                    f.close()
                self._owned = []
            else:
                self._out.flush()
            if commit:
                self.commit()
        except BaseException:
            self.discard()
            raise

    def commit(self) -> None:
        """The closed file gets its name (replacing what was there)."""
        if self._temporary is not None and self._final is not None:
            os.replace(self._temporary, self._final)
            self._temporary = None

    def discard(self) -> None:
        """Close without a trace: the files are closed (errors ignored) and what was
        written is removed (unless written in place: a device or a FIFO)."""
        self._buf.clear()
        owned, self._owned = self._owned, []
        for f in owned:
            with contextlib.suppress(OSError, ValueError):
                f.close()
        if self._temporary is not None:
            with contextlib.suppress(OSError):
                self._temporary.unlink()
            self._temporary = None

    def _string_record(self, index: int, text: str) -> None:
        self._emit(rec.string_record(index, rec.truncate_utf8(text)))
        self.stats.string_records += 1

    def _thread_record(self, index: int, pid: int, tid: int) -> None:
        self._emit(rec.thread_record(index, pid, tid))
        self.stats.thread_records += 1

    def _ticks(self, time: int) -> int:
        ticks = time - self.time_base
        if ticks < 0:
            raise ValueError(f"time {time} is before the trace's time base {self.time_base}")
        return ticks

    # -- interning --------------------------------------------------------------------

    def string_ref(self, text: str) -> int:
        """Intern ``text`` now (writes a string record if needed) and return its index.

        The index is only guaranteed until the next record is written: records written
        through this class intern their own strings.
        """
        self._strings.clock += 1
        return self._strings.ref(text)

    def thread_ref(self, pid: int, tid: int) -> int:
        """Intern a thread now (writes a thread record if needed) and return its index."""
        return self._threads.ref(pid, tid)

    def _args(self, args: Mapping[str, ArgValue] | None) -> list[bytes]:
        if not args:
            return []
        if len(args) > rec.MAX_ARGS:
            raise ValueError(f"{len(args)} arguments (an event holds at most {rec.MAX_ARGS})")
        ref = self._strings.ref
        out = []
        for key, value in args.items():
            name = ref(key)
            if isinstance(value, str):
                out.append(rec.arg_string(name, ref(value)))
            elif isinstance(value, Pointer):
                out.append(rec.arg_pointer(name, value))
            elif isinstance(value, Koid):
                out.append(rec.arg_koid(name, value))
            elif isinstance(value, UInt64):
                out.append(rec.arg_u64(name, value))
            elif isinstance(value, int):
                if _MIN_I64 <= value <= _MAX_I64:
                    out.append(rec.arg_i64(name, value))
                elif 0 <= value < 1 << 64:
                    out.append(rec.arg_u64(name, value))
                else:
                    raise ValueError(f"argument {key}={value} does not fit in 64 bits")
            elif isinstance(value, float):
                out.append(rec.arg_double(name, value))
            else:
                raise TypeError(f"argument {key} has unsupported type {type(value).__name__}")
        return out

    # -- records ----------------------------------------------------------------------

    def process(self, pid: int, name: str, extra: Mapping[str, ArgValue] | None = None) -> None:
        """Name a process (a kernel-object record that also carries the time base, and the
        ``extra`` args)."""
        self._strings.clock += 1
        name_ref = self._strings.ref(name)
        args = [rec.arg_i64(self._arg_time_base, self.time_base), *self._args(extra)]
        self._emit(rec.kernel_object_record(rec.KernelObjectType.PROCESS, pid, name_ref, args))
        self.stats.kernel_objects += 1

    def thread_name(self, pid: int, tid: int, name: str) -> None:
        """Name a thread of process ``pid``."""
        self._strings.clock += 1
        name_ref = self._strings.ref(name)
        args = [rec.arg_koid(self._arg_process, pid)]
        self._emit(rec.kernel_object_record(rec.KernelObjectType.THREAD, tid, name_ref, args))
        self.stats.kernel_objects += 1

    def _event(
        self,
        event_type: rec.EventType,
        pid: int,
        tid: int,
        time: int,
        name: str,
        args: Mapping[str, ArgValue] | None,
        trailing: Sequence[int] = (),
    ) -> None:
        if len(name) > rec.LONG_NAME:
            args = {**(args or {}), **rec.full_name_args(name)}
            name = rec.short_name(name)
        thread = self._threads.ref(pid, tid)
        self._strings.clock += 1
        name_ref = self._strings.ref(name)
        encoded = self._args(args)
        ticks = self._ticks(time)
        self._emit(
            rec.event_record(event_type, thread, self._category, name_ref, ticks, encoded, trailing)
        )

    def instant(
        self, pid: int, tid: int, time: int, name: str, args: Mapping[str, ArgValue] | None = None
    ) -> None:
        self._event(rec.EventType.INSTANT, pid, tid, time, name, args)
        self.stats.instants += 1

    def counter(
        self,
        pid: int,
        tid: int,
        time: int,
        name: str,
        values: Mapping[str, int | float],
        counter_id: int = 0,
    ) -> None:
        """One sample of counter ``name``: Perfetto makes a process-scoped track
        ``<name>:<key>`` for each of ``values``."""
        self._event(rec.EventType.COUNTER, pid, tid, time, name, values, [counter_id])
        self.stats.counters += 1

    def begin(
        self, pid: int, tid: int, time: int, name: str, args: Mapping[str, ArgValue] | None = None
    ) -> None:
        self._event(rec.EventType.DURATION_BEGIN, pid, tid, time, name, args)

    def end(
        self, pid: int, tid: int, time: int, name: str, args: Mapping[str, ArgValue] | None = None
    ) -> None:
        """End the innermost open slice; ``name`` must repeat the begin's (some readers
        match on it; Perfetto ignores it)."""
        self._event(rec.EventType.DURATION_END, pid, tid, time, name, args)
        self.stats.slices += 1

    def complete(
        self,
        pid: int,
        tid: int,
        start: int,
        end: int,
        name: str,
        args: Mapping[str, ArgValue] | None = None,
    ) -> None:
        if end < start:
            raise ValueError(f"slice {name!r} ends ({end}) before it starts ({start})")
        self._event(
            rec.EventType.DURATION_COMPLETE, pid, tid, start, name, args, [self._ticks(end)]
        )
        self.stats.slices += 1

    def slices(
        self,
        pid: int,
        tid: int,
        names: Sequence[str],
        start: npt.ArrayLike,
        end: npt.ArrayLike,
        name_id: npt.ArrayLike,
        *,
        address: npt.ArrayLike | None = None,
        instructions: npt.ArrayLike | None = None,
        cycles: npt.ArrayLike | None = None,
        flags: npt.ArrayLike | None = None,
        continued: npt.ArrayLike | None = None,
        icache_lines: npt.ArrayLike | None = None,
        call_sites: Mapping[int, str] | None = None,
        drill: Drill | None = None,
    ) -> None:
        """Many complete events of one thread at once, from columns (see
        :class:`ptscope.timeline.ThreadTimeline`): ``names[name_id[i]]`` is slice i's
        name; ``address`` 0, ``instructions``/``cycles``/``icache_lines`` < 0, ``flags`` 0 and
        ``continued`` 0 are not written (``continued``: 1 the slice continues a call of the
        previous part of a split trace, 2 the call goes on in the next part, 3 both).
        ``drill`` gives every slice a ``drill`` string: the prefix, then ``START,END`` in
        perf's seconds, then where the slice has an anchor and a count ``--after
        0xADDRESS:OCCURRENCE --count N``. ``call_sites`` gives the slices of some name ids
        (inlined bodies) a ``call_site`` string. Encoded with numpy, a chunk at a time."""
        start_a = np.asarray(start, dtype=np.int64)
        end_a = np.asarray(end, dtype=np.int64)
        ids = np.asarray(name_id, dtype=np.int32)
        n = int(start_a.shape[0])
        if end_a.shape != (n,) or ids.shape != (n,):
            raise ValueError("slice columns differ in length")
        if n == 0:
            return
        if int(ids.min()) < 0 or int(ids.max()) >= len(names):
            raise ValueError("a slice's name id is outside the name table")
        addr_a = None if address is None else np.asarray(address, dtype=np.uint64)
        ins_a = None if instructions is None else np.asarray(instructions, dtype=np.int64)
        cyc_a = None if cycles is None else np.asarray(cycles, dtype=np.int64)
        lines_a = None if icache_lines is None else np.asarray(icache_lines, dtype=np.int64)
        flags_a = None if flags is None else np.asarray(flags, dtype=np.uint8)
        cont_a = None if continued is None else np.asarray(continued, dtype=np.uint8)
        if cont_a is not None and int(cont_a.max(initial=0)) > 3:
            raise ValueError("continued is 0..3")
        if flags_a is not None and not flags_a.any():
            # No slice has a flag (the usual batch): no arg to write, nor a per-slice look-up
            # of its text (the same words as an all-zero column).
            flags_a = None
        if flags_a is not None:
            for value in _distinct(flags_a).tolist():
                if value and not self._flag_lut[value]:
                    self._flag_lut[value] = self._strings.pin(rec.flags_text(value))

        thread = self._threads.ref(pid, tid)
        header = (
            rec.RecordType.EVENT
            | (rec.EventType.DURATION_COMPLETE << 16)
            | (thread << 24)
            | (self._category << 32)
        )
        self._strings.bind(self._slice_names.of(names))
        base = self.time_base
        i, chunk = 0, _CHUNK
        while i < n:
            j = min(n, i + chunk)
            slots = self._strings.slots_for(ids[i:j])
            if slots is None:  # more distinct names than the table holds: smaller chunks
                chunk = max(1, (j - i) // 2)
                continue
            rel_start = start_a[i:j] - base
            rel_end = end_a[i:j] - base
            if int(rel_start.min()) < 0:
                raise ValueError(f"a slice starts before the trace's time base {base}")
            if np.any(rel_end < rel_start):
                raise ValueError("a slice ends before it starts")
            columns = _SliceColumns(
                rel_start.view(np.uint64),
                rel_end.view(np.uint64),
                None if addr_a is None else addr_a[i:j],
                None if ins_a is None else ins_a[i:j],
                None if cyc_a is None else cyc_a[i:j],
                None if flags_a is None else flags_a[i:j],
                None if cont_a is None else cont_a[i:j],
                [
                    *self._full_name_args(ids[i:j], slots),
                    *self._call_site_args(ids[i:j], slots, call_sites),
                ],
                None if lines_a is None else lines_a[i:j],
            )
            if _cfxt is not None:
                words = self._encode_complete_c(
                    header, slots, columns, None if drill is None else (drill, i, j)
                )
            else:
                words = self._encode_complete(
                    header,
                    slots,
                    *columns,
                    drill=None if drill is None else drill.texts(i, j),
                )
            self._emit_words(words, j - i)
            i = j
        self.stats.slices += n

    def _full_name_args(
        self, ids: npt.NDArray[np.int32], slots: npt.NDArray[np.int32]
    ) -> list[tuple[npt.NDArray[np.bool_], _U64]]:
        """The ``full_name`` string args of a chunk's slices whose names were shortened:
        per piece, where it is present and its arg word."""
        if not self._slice_names.pieces:  # no name shortened: no gather per slice
            return []
        counts = self._slice_names.piece_count[ids]
        if not counts.any():
            return []
        self._strings.hold(slots)
        pieces = self._slice_names.pieces
        out = []
        for k in range(int(counts.max())):
            while len(self._arg_full_name) <= k:
                key = rec.full_name_key(len(self._arg_full_name))
                self._arg_full_name.append(self._strings.pin(key))
            present = counts > k
            lut = np.zeros(int(ids.max()) + 1, dtype=np.uint64)
            for i in _distinct(ids[present]).tolist():
                lut[i] = self._strings.ref(pieces[i][k])
            refs = lut[ids]
            head = rec.arg_header(rec.ArgType.STRING, 1, self._arg_full_name[k])
            out.append((present, np.uint64(head) | (refs << np.uint64(32))))
        return out

    def _call_site_args(
        self,
        ids: npt.NDArray[np.int32],
        slots: npt.NDArray[np.int32],
        call_sites: Mapping[int, str] | None,
    ) -> list[tuple[npt.NDArray[np.bool_], _U64]]:
        """The ``call_site`` string arg of a chunk's inlined slices: where present, its word."""
        if not call_sites:
            return []
        present_ids = [i for i in _distinct(ids).tolist() if call_sites.get(i)]
        if not present_ids:
            return []
        self._strings.hold(slots)
        lut = np.zeros(int(ids.max()) + 1, dtype=np.uint64)
        for i in present_ids:
            lut[i] = self._strings.ref(call_sites[i])
        refs = lut[ids]
        head = rec.arg_header(rec.ArgType.STRING, 1, self._arg_call_site)
        return [(refs != 0, np.uint64(head) | (refs << np.uint64(32)))]

    def _encode_complete_c(
        self,
        header: int,
        name_slots: npt.NDArray[np.int32],
        columns: _SliceColumns,
        drill: tuple[Drill, int, int] | None,
    ) -> _U64:
        """:meth:`_encode_complete` in C (``fxt/_cfxt.c``): the same words, drill strings
        formatted there too. The numpy encoder stays as its reference (the tests compare
        the two word for word)."""
        assert _cfxt is not None
        c = columns
        args: list[tuple[npt.NDArray[np.bool_] | None, int | _U64, _U64 | None]] = []
        for values, arg_type, name, unset in (
            (c.address, rec.ArgType.POINTER, self._arg_address, None),
            (c.instructions, rec.ArgType.U64, self._arg_instructions, -1),
            (c.cycles, rec.ArgType.U64, self._arg_cycles, -1),
            (c.icache_lines, rec.ArgType.U64, self._arg_icache, -1),
        ):
            if values is not None:
                present = values != 0 if unset is None else values >= 0
                h = rec.arg_header(arg_type, 2, name)
                args.append((present, h, np.ascontiguousarray(values).view(np.uint64)))
        for codes, lut, name in (
            (c.flags, self._flag_lut, self._arg_flags),
            (c.continued, self._continued_lut, self._arg_continued),
        ):
            if codes is not None:
                h = rec.arg_header(rec.ArgType.STRING, 1, name)
                args.append((codes != 0, np.uint64(h) | (lut[codes] << np.uint64(32)), None))
        for present, piece_words in c.full_name:
            args.append((present, np.ascontiguousarray(piece_words), None))
        drill_arg = None
        if drill is not None:
            what, i, j = drill
            h = rec.arg_header(rec.ArgType.STRING, 0, self._arg_drill)
            drill_arg = (h, what.prefix.encode(), *what.columns(i, j))
        slots = np.ascontiguousarray(name_slots, dtype=np.int32)
        two = sum(values is not None for _, _, values in args)
        prefix = -1 if drill_arg is None else len(drill_arg[1])
        most = _cfxt.complete_bound(len(slots), len(args) - two, two, prefix)
        if len(self._scratch) < most:
            # Reused: fresh pages for every chunk would cost more than the encoding. Made with
            # room to spare (pages never written are not resident), so that a batch a little
            # larger than the first does not regrow it: the old block stayed resident in
            # the heap beside the new one (peak RSS +10 MB when the second of the 60k
            # trace's batches was 1 % larger than the first). The old one goes first.
            grown = max(most + most // 2, len(self._scratch) * 3 // 2)
            self._scratch = np.empty(0, dtype=np.uint64)
            self._scratch = np.empty(grown, dtype=np.uint64)
        words = _cfxt.encode_complete(header, slots, c.start, c.end, args, drill_arg, self._scratch)
        return self._scratch[:words]

    def _encode_complete(
        self,
        header: int,
        name_slots: npt.NDArray[np.int32],
        start: _U64,
        end: _U64,
        address: _U64 | None,
        instructions: npt.NDArray[np.int64] | None,
        cycles: npt.NDArray[np.int64] | None,
        flags: npt.NDArray[np.uint8] | None,
        continued: npt.NDArray[np.uint8] | None = None,
        full_name: Sequence[tuple[npt.NDArray[np.bool_], _U64]] = (),
        icache_lines: npt.NDArray[np.int64] | None = None,
        drill: tuple[npt.NDArray[np.int64], _U64] | None = None,
    ) -> _U64:
        """Duration-complete records for a chunk, as one word array.

        Layout per slice: header, start, [address arg, value], [instructions arg, value],
        [cycles arg, value], [icache_lines arg, value], [flags arg], [continued arg],
        [full_name args], [drill arg, inline string words], end. When
        every slice has the same args the records all have one size and are filled as the
        columns of a 2-D array; otherwise each word is scattered to its offset. ``drill``:
        each slice's string length and bytes (its words, then zeros).
        """
        n = int(start.shape[0])
        # (present, words (per slice where they differ), arg header word(s), value word(s)
        # or None)
        args: list[tuple[npt.NDArray[np.bool_], int | _U64, int | _U64, _U64 | None]] = []
        if address is not None:
            h = rec.arg_header(rec.ArgType.POINTER, 2, self._arg_address)
            args.append((address != 0, 2, h, address))
        if instructions is not None:
            h = rec.arg_header(rec.ArgType.U64, 2, self._arg_instructions)
            args.append((instructions >= 0, 2, h, instructions.view(np.uint64)))
        if cycles is not None:
            h = rec.arg_header(rec.ArgType.U64, 2, self._arg_cycles)
            args.append((cycles >= 0, 2, h, cycles.view(np.uint64)))
        if icache_lines is not None:
            h = rec.arg_header(rec.ArgType.U64, 2, self._arg_icache)
            args.append((icache_lines >= 0, 2, h, icache_lines.view(np.uint64)))
        if flags is not None:
            h = rec.arg_header(rec.ArgType.STRING, 1, self._arg_flags)
            flag_words: _U64 = np.uint64(h) | (self._flag_lut[flags] << np.uint64(32))
            args.append((flags != 0, 1, flag_words, None))
        if continued is not None:
            h = rec.arg_header(rec.ArgType.STRING, 1, self._arg_continued)
            cont_words: _U64 = np.uint64(h) | (self._continued_lut[continued] << np.uint64(32))
            args.append((continued != 0, 1, cont_words, None))
        for present, piece_words in full_name:
            args.append((present, 1, piece_words, None))
        if drill is not None:
            lengths, text = drill
            h = rec.arg_header(rec.ArgType.STRING, 0, self._arg_drill)
            everyone = np.ones(n, dtype=bool)
            if int(lengths.min()) == int(lengths.max()):
                length = int(lengths[0])
                words = 1 + -(-length // 8)
                h |= (words << 4) | ((0x8000 | length) << 32)
                args.append((everyone, words, h, text[:, : words - 1]))
            else:  # one size per slice: its header says its length
                u64 = lengths.astype(np.uint64)
                row_words = np.uint64(1) + (u64 + np.uint64(7)) // np.uint64(8)
                heads = (
                    np.uint64(h)
                    | (row_words << np.uint64(4))
                    | ((u64 | np.uint64(0x8000)) << np.uint64(32))
                )
                args.append((everyone, row_words, heads, text))
        name_word = name_slots.astype(np.uint64) << np.uint64(48)

        everywhere = [a for a in args if a[0].all()]
        nowhere = [a for a in args if not a[0].any()]
        if len(everywhere) + len(nowhere) == len(args):
            # One row of a 2-D table per record; an arg whose size varies gets the most it
            # needs, and the words a record does not use are dropped at the end.
            widths = [w if isinstance(w, int) else int(w.max()) for _, w, _, _ in everywhere]
            table = np.empty((n, 3 + sum(widths)), dtype=np.uint64)
            used: npt.NDArray[np.bool_] | None = None
            sizes = np.full(n, 3, dtype=np.uint64)
            for _, arg_words, _, _ in everywhere:
                sizes += np.uint64(arg_words) if isinstance(arg_words, int) else arg_words
            head = name_word | np.uint64(header | (len(everywhere) << 20))
            table[:, 0] = head | (sizes << np.uint64(4))
            table[:, 1] = start
            col = 2
            for (_, arg_words, arg_word, value), width in zip(everywhere, widths, strict=True):
                table[:, col] = arg_word
                if value is not None and value.ndim == 2:
                    table[:, col + 1 : col + width] = value[:, : width - 1]
                elif value is not None:
                    table[:, col + 1] = value
                if not isinstance(arg_words, int):
                    if used is None:
                        used = np.ones(table.shape, dtype=bool)
                    used[:, col : col + width] = np.arange(width) < arg_words[:, None]
                col += width
            table[:, col] = end
            return table.reshape(-1) if used is None else table[used]

        nargs = np.zeros(n, dtype=np.uint64)
        size_a = np.full(n, 3, dtype=np.uint64)
        for present, arg_words, _, _ in args:
            nargs += present
            size_a += present * np.uint64(arg_words) if isinstance(arg_words, int) else arg_words
        offsets = np.cumsum(size_a, dtype=np.int64) - size_a.astype(np.int64)
        out = np.empty(int(size_a.sum()), dtype=np.uint64)
        out[offsets] = (
            name_word | (size_a << np.uint64(4)) | (nargs << np.uint64(20)) | np.uint64(header)
        )
        out[offsets + 1] = start
        pos = offsets + 2
        for present, arg_words, arg_word, value in args:
            at = pos[present]
            out[at] = arg_word if isinstance(arg_word, int) else arg_word[present]
            if value is not None and value.ndim == 2 and isinstance(arg_words, int):
                for k in range(arg_words - 1):
                    out[at + 1 + k] = value[present, k]
            elif value is not None and value.ndim == 2:
                assert not isinstance(arg_words, int)
                rows = value[present]
                left = arg_words[present] - np.uint64(1)  # value words each slice has
                for k in range(value.shape[1]):
                    has = left > k
                    out[at[has] + 1 + k] = rows[has, k]
            elif value is not None:
                out[at + 1] = value[present]
            pos += present * (
                arg_words if isinstance(arg_words, int) else arg_words.astype(np.int64)
            )
        out[pos] = end
        return out

    def timeline(
        self, timeline: Timeline, *, time_axis: str = "time", drill: Path | None = None
    ) -> None:
        """Write a whole Timeline: a process record per pid, then per thread its name,
        slices, instants and counters. Its times must not be before ``time_base``.
        ``time_axis`` and ``drill`` as :class:`~ptscope.fxt.stream.TraceStream` takes them
        (the drill command needs the threads' perf times)."""
        pids = sorted(set(timeline.processes) | {t.pid for t in timeline.threads})
        extra = {rec.ARG_TIME_AXIS: time_axis} if time_axis != "time" else None
        for pid in pids:
            self.process(pid, timeline.processes.get(pid, ""), extra)
        recording = None if drill is None else shlex.quote(str(drill))
        for thread in timeline.threads:
            pid, tid = thread.pid, thread.tid
            if thread.name:
                self.thread_name(pid, tid, thread.name)
            drill_args = (
                None
                if recording is None or thread.perf_start is None or thread.perf_end is None
                else Drill(
                    f"ptscope insns {recording} --tid {tid} --time ",
                    thread.perf_start,
                    thread.perf_end,
                    thread.anchor_ip,
                    thread.anchor_occurrence,
                    thread.instructions,
                )
            )
            self.slices(
                pid,
                tid,
                timeline.names,
                thread.start,
                thread.end,
                thread.name_id,
                address=thread.address,
                instructions=thread.instructions,
                cycles=thread.cycles,
                flags=thread.flags,
                icache_lines=thread.icache_lines,
                drill=drill_args,
            )
            for instant in thread.instants:
                self.instant(pid, tid, instant.time, instant.name, instant.args)
            for sample in thread.counters:
                self.counter(
                    pid, tid, sample.time, sample.name, {rec.ARG_COUNTER_VALUE: sample.value}
                )


def written_in_place(path: Path) -> bool:
    """Whether ``path`` is something other than a regular file (or a new one): written
    directly, since it cannot be replaced by renaming (a FIFO, a device), and a write to it
    may wait for as long as its reader does."""
    try:
        return not path.is_file() and path.exists()
    except OSError:
        return False


def remove_written(path: Path) -> None:
    """Remove the trace written at ``path`` (:meth:`FxtWriter.open`'s name for it): the
    file its name leads to when that is a regular file, which ptscope created (renamed into
    place); never a device or a FIFO, which were written in place, nor the link a name may
    be (the file written, its target, goes)."""
    final = Path(os.path.realpath(path)) if path.is_symlink() else path
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.lstat(final).st_mode):
            final.unlink()


def write_whole(path: Path, data: bytes) -> None:
    """Write ``data`` as the file ``path`` the way a trace is written: under a temporary
    name beside it, renamed once whole, removed if a write fails (a full disk), so that
    neither a truncated file nor an empty one is left, and an existing one is replaced
    only by a whole one; a device or a FIFO is written in place, a link's target replaced.
    Raises the OSError."""
    final = Path(os.path.realpath(path)) if path.is_symlink() else path
    if written_in_place(final):
        with open(final, "wb") as f:
            f.write(data)
        return
    temporary = _temporary_name(final)
    _sweep_temporaries(final)
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        os.replace(temporary, final)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def _temporary_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.ptscope-{os.getpid()}.tmp")


def _sweep_temporaries(path: Path) -> None:
    """Remove ``NAME.ptscope-<pid>.tmp`` files beside ``path`` whose ptscope is gone (it
    was killed while writing)."""
    pattern = re.compile(re.escape(path.name) + r"\.ptscope-(\d+)\.tmp")
    with contextlib.suppress(OSError):
        for entry in path.parent.iterdir():
            m = pattern.fullmatch(entry.name)
            if m is not None and not _alive(int(m.group(1))):
                with contextlib.suppress(OSError):
                    entry.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_timeline(
    timeline: Timeline,
    path: str | Path,
    *,
    compress: bool | None = None,
    gzip_level: int | None = None,
    time_axis: str = "time",
    drill: Path | None = None,
) -> WriteStats:
    """Write ``timeline`` to ``path`` (``.fxt``, or gzip for ``.gz`` unless ``compress``
    says otherwise; ``gzip_level`` as in :meth:`FxtWriter.open`), streaming. Times are
    rebased to the timeline's earliest time (counts on another ``time_axis`` start at 0,
    as in a streamed trace); ``drill`` as :meth:`FxtWriter.timeline` takes it."""
    path = Path(path)
    time_range = timeline.time_range()
    base = time_range[0] if time_range is not None and time_axis == "time" else 0
    try:
        with FxtWriter.open(
            path, compress=compress, time_base=base, gzip_level=gzip_level
        ) as writer:
            writer.timeline(timeline, time_axis=time_axis, drill=drill)
        stats = writer.stats
        stats.file_bytes = path.stat().st_size
    except OSError as e:
        raise PtscopeError(
            f"cannot write {path}: {e.strerror or e}", hint="check the free space and the path"
        ) from e
    return stats
