"""Decoding with the C dlfilter: run ``perf script`` with it and turn its stream into events.

The dlfilter (``ptscope/_native/dlfilter.c``) writes fixed-size binary records into perf's
own ``stdout`` (``--dlarg -``). perf prints its decode errors to that same stdio buffer, so
error lines arrive between the records exactly where they happened, and the reader merges
them in order (see "dlfilter record stream" in ``docs/file-formats.md``). By default the
records themselves cross in shared memory and stdout carries only small chunk records and
perf's text (ring mode, :mod:`ptscope.decode.record_ring`), which gives the reader the same
stream in the same order.

The reader works on big chunks: runs of branch records are found with one vectorised check
of their tag column and decoded with numpy; only string/location records and text lines are
handled one at a time. perf and Python run concurrently (perf writes into a pipe while
Python builds events from what it has read). The *columnar* variants
(:meth:`RecordStreamParser.feed_columnar`, :func:`decode_with_dlfilter_columnar`) yield each
run of branch records as one :class:`~ptscope.model.BranchBatch` (columns over a shared
:class:`~ptscope.model.LocationTable`, no object per event) between the other events, in
stream order: what the C engine consumes.

Numbers are range-checked as records are read: a branch or power record whose time is at
or past :data:`~ptscope.model.TIME_LIMIT`, whose ``gap_delta`` reaches back before time 0,
or whose counts overrun the decode's :data:`~ptscope.model.COUNT_BUDGET` is damaged data,
and becomes a :class:`~ptscope.model.DecodeError` in its place (``StreamStats.damaged``),
never an event. What breaks the stream's structure (an unknown tag, ids out of sequence, a
truncated record) is a :class:`~ptscope.errors.BadInputError`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import logging
import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from time import sleep
from typing import Any, Final, NamedTuple, NoReturn

import numpy as np
import numpy.typing as npt

from ptscope.decode import record_format as rf
from ptscope.decode.perf_launch import (
    DEFAULT_ITRACE,
    DecoderChoice,
    check_dlfilter_prerequisites,
    choose_decoder,
    dlfilter_command,
    launch_spec,
    selection_arguments,
    take_launch,
)
from ptscope.decode.perf_script import perf_failure, perf_stalled
from ptscope.decode.perf_text import PerfTextParser, TextStats, make_location
from ptscope.decode.record_ring import RingReader
from ptscope.errors import BadInputError, ScratchSpaceError
from ptscope.model import (
    COUNT_BUDGET,
    DAMAGED_DATA,
    NOWHERE,
    TIME_LIMIT,
    BranchBatch,
    BranchEvent,
    BranchFlags,
    DecodeError,
    Event,
    Location,
    LocationTable,
    PowerEvent,
    classify_flags,
)
from ptscope.perftool import PerfTool, PerfWatch, find_perf

log = logging.getLogger("ptscope")

__all__ = [
    "DEFAULT_ITRACE",
    "CountFix",
    "DecoderChoice",
    "DlfilterProcess",
    "DlfilterRun",
    "RecordStreamParser",
    "StreamStats",
    "choose_decoder",
    "decode_with_dlfilter",
    "decode_with_dlfilter_columnar",
    "dlfilter_command",
    "make_location",
    "read_record_stream",
    "selection_arguments",
]

CHUNK_SIZE: Final = 1 << 20
_LOOKAHEAD: Final = 16384  # branch records checked per vectorised run search
_TAGS: Final = frozenset(range(0xF8, 0x100))
_MAX_LINES: Final = 1 << 24  # code lines of one run of records: 1 GiB of code at most
_IN_TX: Final = int(BranchFlags.IN_TX)
_SMALL_COUNT: Final = 1 << 40
"""Counts below this add up without wrapping around in a run of records (at most
:data:`_LOOKAHEAD`, each with two counts)."""

try:  # the common case of a run of branch records, read in C (decode/_crecords.c)
    from ptscope.decode import _crecords  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover (built where a C compiler is found)
    _crecords = None


# --------------------------------------------------------------------- locations


# ------------------------------------------------------------------------ parser

# Turns the run of `n` branch records at `pos` of a buffer into events or a batch.
_Buffer = bytes | memoryview
"""What the parser reads: bytes, or a ring chunk where it lies (decode/record_ring.py)."""
_BranchHandler = Callable[[_Buffer, int, int, list[Any]], None]


@dataclass
class StreamStats:
    """What a record stream held; the trailer's counters are checked against it."""

    branches: int = 0
    power: int = 0
    decode_errors: int = 0
    """Decode errors given out: perf's error lines, and the damaged records."""
    damaged: int = 0
    """Records with a number out of range (each became a decode error)."""
    outside_window: int = 0
    """Events dropped because their time is outside the parser's ``time_window``."""
    locations: int = 0
    strings: int = 0
    text_lines: int = 0
    """Lines of perf's text between the records (errors, task events, anything else)."""
    text: TextStats = field(default_factory=TextStats)
    """The text decoder's account of those lines (``unknown_lines``, examples...)."""
    bytes: int = 0
    trailer: dict[str, int] | None = None
    """The dlfilter's own counters (samples, dropped branches...), once the stream ended."""
    insns: bool = False
    """The stream has instruction detail (``--dlarg insns``): exact counts and lines."""
    lines_records: int = 0
    runs_in_c: int = 0
    """Runs of branch records read by the C reader (``decode/_crecords.c``); the others
    went through the numpy reader (lines records, damage, a window's edges)."""


class CountFix(NamedTuple):
    """A branch's instruction/cycle counts as one decode saw them (see parallel decode)."""

    time: int
    ip: int
    addr: int
    insn_count: int
    cycle_count: int
    exact: bool
    """The decode had seen an earlier branch of the thread, so the counts are complete."""
    gap_delta: int = 0
    """Its ``gap_delta`` as that decode saw it (complete under the same condition)."""
    lines: tuple[int, ...] | None = None
    """Its code lines (instruction detail), likewise."""
    gap_insns: int = 0
    """Its ``gap_insns``, likewise."""


class _Rows(NamedTuple):
    """A run's branch records, with their code lines as CSR columns (instruction detail)."""

    recs: np.ndarray[Any, np.dtype[np.void]]
    line_offsets: np.ndarray[Any, np.dtype[np.int64]] | None
    lines: np.ndarray[Any, np.dtype[np.uint64]] | None

    def lines_of(self, i: int) -> tuple[int, ...] | None:
        if self.line_offsets is None or self.lines is None:
            return None
        return tuple(self.lines[self.line_offsets[i] : self.line_offsets[i + 1]].tolist())

    def part(self, first: int, stop: int) -> _Rows:
        """Rows ``first`` to ``stop`` (excluded), their lines with them."""
        if self.line_offsets is None or self.lines is None:
            return _Rows(self.recs[first:stop], None, None)
        lo, hi = int(self.line_offsets[first]), int(self.line_offsets[stop])
        return _Rows(
            self.recs[first:stop],
            self.line_offsets[first : stop + 1] - lo,
            self.lines[lo:hi],
        )


class RecordStreamParser:
    """Incremental parser of one dlfilter record stream: bytes in, events out.

    :meth:`feed` takes chunks of any size (records may straddle chunks) and returns the
    events completed so far (:meth:`feed_columnar`: the same, with each run of branches as
    one :class:`~ptscope.model.BranchBatch` numbering its locations in ``locations``,
    which several parsers may share); :meth:`close` checks that the stream ended
    properly. Any malformed input raises :class:`~ptscope.errors.BadInputError` naming
    ``source``.
    """

    def __init__(
        self,
        source: str = "dlfilter record stream",
        *,
        time_window: tuple[int | None, int | None] | None = None,
        locations: LocationTable | None = None,
    ) -> None:
        self.source = source
        # Events outside this inclusive (start, end) perf-time range are dropped (None: open).
        self._lo = time_window[0] if time_window is not None else None
        self._hi = time_window[1] if time_window is not None else None
        self.first_after_end: dict[tuple[int, int], CountFix] = {}
        """Each thread's first kept branch after the window's end, when perf decoded past
        it: the next window's first branch of the thread, with this decode's counts."""
        self._threads_seen: set[int] = set()
        # perf's own lines (decode errors, task events) are the text decoder's business.
        self._text = PerfTextParser(keep_all=True)
        self.stats = StreamStats(text=self._text.stats)
        self._buf = b""
        self._offset = 0  # stream offset of _buf[0], for error messages
        self._header_seen = False
        self._ended = False
        self._strings: list[str | None] = [None]  # id 0: no name
        self._locations: list[Location] = [NOWHERE]  # id 0 is never used
        self._loc_array: np.ndarray[Any, np.dtype[np.object_]] = np.empty(0, dtype=object)
        self._loc_dedup: dict[tuple[int, str, int, str], Location] = {}
        self.locations = locations if locations is not None else LocationTable()
        self._table_ids = array("i", [-1])  # stream location id -> id in `locations`
        # Branch records grow a line range with instruction detail (see the header).
        self._branch_dtype: np.dtype[np.void] = rf.BRANCH_DTYPE
        self._branch_size = rf.BRANCH.size
        self._run_has_lines = False  # the current run of rows holds lines records
        self._table_id_array = np.zeros(0, dtype=np.int32)
        # Instructions plus cycles the records may still carry (model.COUNT_BUDGET).
        self._count_budget = COUNT_BUDGET

    # ---------------------------------------------------------------- public

    def feed(self, data: _Buffer) -> list[Event]:
        """Parse ``data`` (appended to any incomplete record left over) into events."""
        events: list[Event] = []
        self._feed(data, events, self._branches)
        return events

    def feed_columnar(self, data: _Buffer) -> list[Event | BranchBatch]:
        """Like :meth:`feed`, but each run of branch records is one :class:`BranchBatch`."""
        items: list[Event | BranchBatch] = []
        self._feed(data, items, self._branch_batch)
        return items

    def _feed(self, data: _Buffer, out: list[Any], branches: _BranchHandler) -> None:
        self.stats.bytes += len(data)
        was_enabled = gc.isenabled()
        gc.disable()  # events hold no cycles; collecting while building them is wasted
        try:
            start = 0
            if self._buf:
                # The record left over from the last chunk is finished with the start of
                # this one, and the rest is read in place: joining whole chunks copied
                # every byte of the stream once more (a third of this parser's time).
                pending = self._buf
                used = self._parse(pending + data[:_JOIN], out, branches)
                if used >= len(pending):
                    start = used - len(pending)
                    self._offset += len(pending)
                else:  # a record (a long string, a run of lines) longer than _JOIN bytes
                    data = pending[used:] + data
                    self._offset += used
            pos = self._parse(data, out, branches, start)
        finally:
            if was_enabled:
                gc.enable()
        self._offset += pos
        # A copy: ``data`` may be a view of a ring chunk, which goes back to perf.
        self._buf = bytes(data[pos:])

    def close(self) -> None:
        """The stream ended: fail if it stopped inside a record or before the trailer."""
        if self._buf:
            if self._buf[0] in _TAGS:
                self._fail(f"ends inside a record ({len(self._buf)} bytes left over)")
            self._fail("ends inside a line of text")
        if not self._header_seen:
            self._fail("holds no records (the dlfilter did not run?)")
        if not self._ended:
            self._fail("is truncated (no trailer record)")

    @property
    def ended(self) -> bool:
        """Whether the trailer record has been read."""
        return self._ended

    # --------------------------------------------------------------- parsing

    def _fail(self, what: str, at: int | None = None) -> NoReturn:
        where = f" at byte {self._offset + at}" if at is not None else ""
        raise BadInputError(f"{self.source} {what}{where}")

    def _parse(
        self, buf: _Buffer, events: list[Any], branches: _BranchHandler, start: int = 0
    ) -> int:
        """Parse the records of ``buf`` from ``start``; returns where the first one that
        is not whole (or the end) is."""
        pos = start
        end = len(buf)
        while pos < end:
            tag = buf[pos]
            if tag == rf.TAG_BRANCH or tag == rf.TAG_LINES:
                if not self._header_seen:
                    self._fail("does not start with a header record", pos)
                insns = self.stats.insns
                if tag == rf.TAG_LINES and not insns:
                    self._fail("has a lines record but no instruction detail", pos)
                size = self._branch_size
                n = min((end - pos) // size, _LOOKAHEAD)
                if n == 0:
                    break
                n = self._run_length(buf, pos, n, insns=insns)
                if n == 0:
                    break
                branches(buf, pos, n, events)
                pos += n * size
            elif tag not in _TAGS:
                if not isinstance(buf, bytes):
                    # Text amid a ring chunk's records (perf's own text comes through
                    # stdout, so this is damage): read the rest as the pipe's bytes.
                    buf = bytes(buf)
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if end - pos > 65536:
                        self._fail("holds a line of text too long to be perf's", pos)
                    break
                try:
                    line = buf[pos:nl].decode("utf-8")
                except UnicodeDecodeError:
                    self._fail("is corrupted (bytes that are neither a record nor text)", pos)
                self._text_line(line, events)
                pos = nl + 1
            else:
                used = self._record(buf, pos, tag, events)
                if used == 0:
                    break
                pos += used
        return pos

    def _run_length(self, buf: _Buffer, pos: int, n: int, *, insns: bool) -> int:
        """How many of the ``n`` record-sized rows at ``pos`` make a run of branch records
        (0: wait for more data). Without instruction detail the run stops at the first
        other record; with it, lines records belong to the branch after them, so the run
        stops before a record of another kind and ends with a branch. Notes whether the
        run holds lines records."""
        size = self._branch_size
        scan = _crecords.scan_tags if _crecords is not None else scan_tags
        stop, first_lines, last_branch = scan(buf, pos, n, size)
        if not insns:
            return stop if first_lines < 0 else first_lines
        ended = stop < n
        n = stop
        if last_branch != n - 1:  # lines records at the end: their branch is not here yet
            if ended or (n == _LOOKAHEAD and last_branch < 0):
                self._fail("has a lines record not followed by a branch record", pos)
            n = last_branch + 1
        self._run_has_lines = 0 <= first_lines < n
        return n

    def _record(self, buf: _Buffer, pos: int, tag: int, events: list[Any]) -> int:
        """Parse one non-branch record at ``pos``; return its size, 0 if incomplete."""
        avail = len(buf) - pos
        if tag == rf.TAG_HEADER:
            if avail < rf.HEADER.size:
                return 0
            self._header(rf.HEADER.unpack_from(buf, pos), pos)
            return rf.HEADER.size
        if not self._header_seen:
            self._fail("does not start with a header record", pos)
        if self._ended:
            self._fail("holds records after its trailer", pos)
        if tag == rf.TAG_STRING:
            if avail < rf.STRING.size:
                return 0
            sid: int
            length: int
            _, sid, length = rf.STRING.unpack_from(buf, pos)
            if length > 1 << 20:
                self._fail(f"holds a string record of {length} bytes (corrupted)", pos)
            size = rf.STRING.size + length
            if avail < size:
                return 0
            if sid != len(self._strings):
                self._fail(f"has string id {sid} out of sequence", pos)
            self._strings.append(str(buf[pos + rf.STRING.size : pos + size], "utf-8", "replace"))
            self.stats.strings += 1
            return size
        if tag == rf.TAG_LOCATION:
            if avail < rf.LOCATION.size:
                return 0
            _, lid, ip, offset, sym, dso, _pid, node = rf.LOCATION.unpack_from(buf, pos)
            if lid != len(self._locations):
                self._fail(f"has location id {lid} out of sequence", pos)
            if sym >= len(self._strings) or dso >= len(self._strings):
                self._fail("has a location naming an unknown string", pos)
            if node and (
                self.locations.inline is None or not 0 < node < len(self.locations.inline)
            ):
                self._fail("has a location in an unknown inlined body", pos)
            self._add_location(ip, self._strings[sym], offset, self._strings[dso], node)
            self.stats.locations += 1
            return rf.LOCATION.size
        if tag == rf.TAG_POWER:
            if avail < rf.POWER.size:
                return 0
            _, pid, tid, _cpu, time, cbr, freq = rf.POWER.unpack_from(buf, pos)
            self.stats.power += 1
            if time >= TIME_LIMIT:
                events.append(self._damage(pid, tid, None, f"power record's time {time}"))
            elif self._outside(time):
                self.stats.outside_window += 1
            else:
                events.append(PowerEvent(pid, tid, time, cbr, freq))
            return rf.POWER.size
        if tag == rf.TAG_TRAILER:
            if avail < rf.TRAILER.size:
                return 0
            values = rf.TRAILER.unpack_from(buf, pos)[1:]
            self._trailer(dict(zip(rf.TRAILER_FIELDS, values, strict=True)), pos)
            return rf.TRAILER.size
        self._fail(f"is corrupted (unknown record tag {tag:#04x})", pos)

    def _header(self, fields: tuple[Any, ...], pos: int) -> None:
        _, magic, version, branch, location, string, power, trailer, options, lines = fields
        if magic != rf.MAGIC:
            self._fail("is corrupted (bad header magic)", pos)
        if self._header_seen:
            self._fail("holds a second header record", pos)
        if version != rf.STREAM_VERSION:
            raise BadInputError(
                f"{self.source} has format version {version}, this ptscope reads "
                f"{rf.STREAM_VERSION}",
                hint="the dlfilter and the Python package come from different ptscope "
                "versions: reinstall ptscope",
            )
        insns = bool(options & rf.OPT_INSNS)
        sizes = (branch, location, string, power, trailer, lines)
        expected = (
            rf.INSNS_BRANCH.size if insns else rf.BRANCH.size,
            rf.LOCATION.size,
            rf.STRING.size,
            rf.POWER.size,
            rf.TRAILER.size,
            rf.LINES.size,
        )
        if sizes != expected:
            self._fail(f"declares record sizes {sizes}, expected {expected}")
        self.stats.insns = insns
        if insns:
            self._branch_dtype, self._branch_size = rf.INSNS_BRANCH_DTYPE, rf.INSNS_BRANCH.size
        self._header_seen = True

    def _trailer(self, counters: dict[str, int], pos: int) -> None:
        st = self.stats
        seen = {
            "branches_kept": st.branches,
            "power": st.power,
            "locations": st.locations,
            "strings": st.strings,
            "lines": st.lines_records,
        }
        for name, count in seen.items():
            if counters[name] != count:
                self._fail(
                    f"is corrupted: the dlfilter wrote {counters[name]} {name} records, "
                    f"{count} were read",
                    pos,
                )
        st.trailer = counters
        self._ended = True

    def _add_location(
        self, ip: int, symbol: str | None, offset: int, dso: str | None, node: int = 0
    ) -> None:
        loc = make_location(ip, symbol, offset, dso)
        # Share one object per distinct location (the same address resolved again after a
        # cache flush, or in another process with the same mapping).
        key = (loc.ip, loc.symbol, loc.offset, loc.dso)
        loc = self._loc_dedup.setdefault(key, loc)
        self._locations.append(loc)
        self._table_ids.append(self.locations.add(loc, node))

    def _location_array(self) -> np.ndarray[Any, np.dtype[np.object_]]:
        if len(self._loc_array) != len(self._locations):
            arr = np.empty(len(self._locations), dtype=object)
            arr[:] = self._locations
            self._loc_array = arr
        return self._loc_array

    def _branches(self, buf: _Buffer, pos: int, n: int, events: list[Event]) -> None:
        for rows in self._branch_records(buf, pos, n):
            if isinstance(rows, DecodeError):
                events.append(rows)
            else:
                self._branch_events(rows, events)

    def _branch_events(self, rows: _Rows, events: list[Event]) -> None:
        recs = rows.recs
        locs = self._location_array()
        flags = recs["flags"]
        uniq, inverse = np.unique(flags, return_inverse=True)
        kinds = np.empty(len(uniq), dtype=object)
        states = np.empty(len(uniq), dtype=object)
        for i, fl in enumerate(uniq.tolist()):
            kinds[i], states[i] = classify_flags(fl)
        in_tx = (flags & _IN_TX) != 0
        times = recs["time"]
        delta = recs["gap_delta"]
        gap_time = np.where(delta != 0, times - delta, 0)
        lines: list[tuple[int, ...] | None] = [None] * len(recs)
        if rows.line_offsets is not None and rows.lines is not None:
            every = rows.lines.tolist()
            lines = [tuple(every[a:b]) for a, b in pairwise(rows.line_offsets.tolist())]
        events.extend(
            map(
                BranchEvent,
                recs["pid"].tolist(),
                recs["tid"].tolist(),
                times.tolist(),
                kinds[inverse].tolist(),
                states[inverse].tolist(),
                locs[recs["ip_loc"]].tolist(),
                locs[recs["addr_loc"]].tolist(),
                in_tx.tolist(),
                recs["insn_cnt"].tolist(),
                recs["cyc_cnt"].tolist(),
                gap_time.tolist(),
                lines,
                np.where(delta != 0, recs["gap_insns"], 0).tolist(),
            )
        )

    def _branch_batch(self, buf: _Buffer, pos: int, n: int, items: list[Any]) -> None:
        if (
            _crecords is not None
            and not self._run_has_lines
            and not self._ended
            and self._inside_window(buf, pos, n)
        ):
            batch = self._fast_batch(buf, pos, n)
            if batch is not None:
                if self._hi is not None:
                    self._note_thread_columns(batch.pid, batch.tid)
                self.stats.runs_in_c += 1
                items.append(batch)
                return
        for rows in self._branch_records(buf, pos, n):
            if isinstance(rows, DecodeError):
                items.append(rows)
            else:
                self._batch(rows, items)

    def _inside_window(self, buf: _Buffer, pos: int, n: int) -> bool:
        """Whether every one of the ``n`` branch records at ``pos`` is inside the time
        window (a window's runs are, but for those at its edges: the lead-in before its
        start, what perf decodes past its end)."""
        if self._lo is None and self._hi is None:
            return True
        times = np.frombuffer(buf, dtype=self._branch_dtype, count=n, offset=pos)["time"]
        return (self._lo is None or int(times.min()) >= self._lo) and (
            self._hi is None or int(times.max()) <= self._hi
        )

    def _table_id_column(self) -> np.ndarray[Any, np.dtype[np.int32]]:
        """Stream location id -> id in ``locations``, as an array (rebuilt when it grew)."""
        if len(self._table_id_array) != len(self._table_ids):
            self._table_id_array = np.array(self._table_ids, dtype=np.int32)
        return self._table_id_array

    def _fast_batch(self, buf: _Buffer, pos: int, n: int) -> BranchBatch | None:
        """The run of ``n`` branch records at ``pos`` read in C (``decode/_crecords.c``),
        as :meth:`_branch_records` and :meth:`_batch` would read it when nothing in it is
        damaged (the only case the C reader takes: None otherwise)."""
        assert _crecords is not None
        size = self._branch_size
        checked = _crecords.check_run(buf, pos, n, size, len(self._locations), self._count_budget)
        if checked is None:
            return None
        spent, nlines = checked
        self._count_budget -= spent
        self.stats.branches += n
        pid, tid, src, dst = (np.empty(n, dtype=np.int32) for _ in range(4))
        time = np.empty(n, dtype=np.int64)
        flags, gap_delta = np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.uint32)
        insns, cycles = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.uint64)
        gap_insns = np.empty(n, dtype=np.uint16)
        offsets = np.empty(n + 1, dtype=np.int32)
        lines = np.empty(nlines, dtype=np.uint64)
        _crecords.fill_run(
            buf, pos, n, size, self._table_id_column(), pid, tid, time, flags, src, dst,
            insns, cycles, gap_delta, gap_insns, offsets, lines,
        )  # fmt: skip
        detail = self.stats.insns
        return BranchBatch(
            self.locations,
            pid=pid,
            tid=tid,
            time=time,
            flags=flags,
            src=src,
            dst=dst,
            insn_count=insns,
            cycle_count=cycles,
            gap_delta=gap_delta,
            line_offsets=offsets if detail else None,
            lines=lines if detail else None,
            gap_insns=gap_insns,
        )

    def _batch(self, rows: _Rows, items: list[Any]) -> None:
        recs = rows.recs
        ids = self._table_id_column()
        # Columns are views of the records where the type allows (no copy).
        items.append(
            BranchBatch(
                self.locations,
                pid=recs["pid"],
                tid=recs["tid"],
                time=recs["time"].view(np.int64),
                flags=recs["flags"],
                src=ids[recs["ip_loc"]],
                dst=ids[recs["addr_loc"]],
                insn_count=recs["insn_cnt"],
                cycle_count=recs["cyc_cnt"],
                gap_delta=recs["gap_delta"],
                line_offsets=(
                    rows.line_offsets.astype(np.int32) if rows.line_offsets is not None else None
                ),
                lines=rows.lines,
                gap_insns=recs["gap_insns"],
            )
        )

    def _branch_records(self, buf: _Buffer, pos: int, n: int) -> list[_Rows | DecodeError]:
        """The branch records of the ``n`` rows at ``pos`` (branch and lines records) with
        their lines, checked, without those outside the window: runs of good records, and
        a decode error in place of each damaged one."""
        if self._ended:
            self._fail("holds records after its trailer", pos)
        recs = np.frombuffer(buf, dtype=self._branch_dtype, count=n, offset=pos)
        if not isinstance(buf, bytes):
            # A view of a ring chunk, which goes back to perf once parsed: the batches
            # made from these rows keep views of them (rare runs: lines, damage, windows).
            recs = recs.copy()
        offsets = lines = None
        if self.stats.insns:
            recs, offsets, lines = self._lines(buf, pos, recs)
            n = len(recs)
        self.stats.branches += n
        ip_loc = recs["ip_loc"]
        addr_loc = recs["addr_loc"]
        nloc = len(self._locations)
        if int(ip_loc.max()) >= nloc or int(addr_loc.max()) >= nloc:
            self._fail("is corrupted (a branch names an unknown location)", pos)
        if int(ip_loc.min()) == 0 or int(addr_loc.min()) == 0:
            self._fail("is corrupted (a branch names location 0)", pos)
        rows = _Rows(recs, offsets, lines)
        damaged = self._damaged_rows(recs)
        if not damaged:
            window = self._window(rows)
            return [] if window is None else [window]
        out: list[_Rows | DecodeError] = []
        first = 0
        for index, error in damaged:
            if index > first:
                window = self._window(rows.part(first, index))
                if window is not None:
                    out.append(window)
            if error.time is not None and self._outside(error.time):
                self.stats.outside_window += 1
            else:
                out.append(error)
            first = index + 1
        if first < n:
            window = self._window(rows.part(first, n))
            if window is not None:
                out.append(window)
        return out

    def _damaged_rows(
        self, recs: np.ndarray[Any, np.dtype[np.void]]
    ) -> list[tuple[int, DecodeError]]:
        """The records whose numbers are out of range, each with the decode error that
        stands for it; spends the count budget on the others."""
        time = recs["time"]
        insn = recs["insn_cnt"]
        cycles = recs["cyc_cnt"]
        bad = (time >= TIME_LIMIT) | (recs["gap_delta"] > time)
        if not bad.any() and max(int(insn.max()), int(cycles.max())) < _SMALL_COUNT:
            # The usual case: sums of counts this small cannot wrap around.
            spent = int(insn.sum()) + int(cycles.sum())
            if spent <= self._count_budget:
                self._count_budget -= spent
                return []
        bad |= (insn > COUNT_BUDGET) | (cycles > COUNT_BUDGET)
        good = ~bad
        # Every count left is at most 2**52: a float sum (rounding is far below the
        # margin) tells whether the run fits the budget, and then the integer sums
        # cannot wrap around.
        approx = float(insn.sum(where=good, dtype=np.float64))
        approx += float(cycles.sum(where=good, dtype=np.float64))
        over_budget: set[int] = set()
        if approx * 1.000001 < self._count_budget:
            self._count_budget -= int(insn.sum(where=good)) + int(cycles.sum(where=good))
        else:
            for i in np.flatnonzero(good).tolist():
                spent = int(insn[i]) + int(cycles[i])
                if spent > self._count_budget:
                    over_budget.add(i)
                else:
                    self._count_budget -= spent
        if not bad.any() and not over_budget:
            return []
        damaged = []
        for i in sorted({*np.flatnonzero(bad).tolist(), *over_budget}):
            rec = recs[i]
            t, d = int(rec["time"]), int(rec["gap_delta"])
            if t >= TIME_LIMIT:
                what = f"branch record's time {t}"
            elif d > t:
                what = f"branch record's gap_delta {d} (before time 0)"
            else:
                what = f"branch record's counts {int(rec['insn_cnt'])}/{int(rec['cyc_cnt'])}"
            error = self._damage(int(rec["pid"]), int(rec["tid"]), t if t < TIME_LIMIT else None,
                                 what)  # fmt: skip
            damaged.append((i, error))
        return damaged

    def _damage(self, pid: int, tid: int, time: int | None, what: str) -> DecodeError:
        """The decode error that stands for a damaged record (``what`` is out of range)."""
        self.stats.damaged += 1
        self.stats.decode_errors += 1
        return DecodeError(pid, tid, time or None, None, f"{DAMAGED_DATA}: {what}")

    def _window(self, rows: _Rows) -> _Rows | None:
        """``rows`` without those outside the time window (None: no row is left)."""
        recs, offsets, lines = rows
        n = len(recs)
        if self._lo is not None or self._hi is not None:
            times = recs["time"]
            keep = np.ones(n, dtype=bool)
            if self._lo is not None:
                keep &= times >= self._lo
            if self._hi is not None:
                late = times > self._hi
                keep &= ~late
                if late.any():
                    self._note_threads(recs[~late])
                    self._note_first_after_end(rows, np.flatnonzero(late))
                else:
                    self._note_threads(recs)
            if not keep.all():
                self.stats.outside_window += n - int(keep.sum())
                recs, offsets, lines = _select(_Rows(recs, offsets, lines), keep)
                if not len(recs):
                    return None
        return _Rows(recs, offsets, lines)

    def _lines(self, buf: _Buffer, pos: int, rows: np.ndarray[Any, np.dtype[np.void]]) -> _Rows:
        """The branch records among ``rows`` (at ``pos``) and their code lines as CSR
        columns: each branch's own (last) range, after the ranges of the lines records
        right before it (a run of rows ends with a branch)."""
        if not self._run_has_lines:  # the common case: one range per branch, in the branch
            self._check_lines(rows["line_count"], rows["insn_cnt"], pos)
            offsets, lines = self._expand(rows["line_first"], rows["line_count"], pos)
            return _Rows(rows, offsets, lines)
        n = len(rows)
        is_lines = rows["tag"] == rf.TAG_LINES
        self.stats.lines_records += int(is_lines.sum())
        is_branch = ~is_lines
        recs = rows[is_branch]
        extra = np.frombuffer(buf, dtype=rf.LINES_DTYPE, count=n, offset=pos)
        used = extra["ranges"][is_lines].astype(np.int64)
        if int(used.min()) < 1 or int(used.max()) > rf.LINES_PER_RECORD:
            self._fail("is corrupted (a lines record with a bad range count)", pos)
        # Every row's ranges in stream order: a lines record's, then a branch's own in the
        # last column; the branch a range belongs to is the first one at or after its row.
        k = rf.LINES_PER_RECORD
        first = np.zeros((n, k + 1), dtype=np.uint64)
        count = np.zeros((n, k + 1), dtype=np.uint64)
        valid = np.arange(k) < used[:, None]
        first[is_lines, :k] = np.where(valid, extra["range"][is_lines, :, 0], 0)
        count[is_lines, :k] = np.where(valid, extra["range"][is_lines, :, 1], 0)
        first[is_branch, k] = recs["line_first"]
        count[is_branch, k] = recs["line_count"]
        owner = np.repeat(np.cumsum(is_branch) - is_branch, k + 1)
        first_all, count_all = first.ravel(), count.ravel()
        present = count_all > 0
        first_all, count_all, owner = first_all[present], count_all[present], owner[present]
        if int(count_all.max(initial=0)) > _MAX_LINES:
            self._fail("is corrupted (a branch with a bad line count)", pos)
        per_branch = np.bincount(owner, weights=count_all, minlength=len(recs))
        self._check_lines(per_branch, recs["insn_cnt"], pos)
        offsets = np.zeros(len(recs) + 1, dtype=np.int64)
        np.cumsum(per_branch.astype(np.int64), out=offsets[1:])
        return _Rows(recs, offsets, self._expand(first_all, count_all, pos)[1])

    def _check_lines(
        self, lines: np.ndarray[Any, np.dtype[Any]], insns: np.ndarray[Any, np.dtype[Any]], pos: int
    ) -> None:
        """A branch's code lines are those its ``insn_cnt`` instructions touched: a block
        of c instructions spans at most 15c bytes, so at most c + 1 lines, and a branch
        at most twice its count. More is damage (and would cost time: every line is
        kept in the slices' sets)."""
        limit = 2 * np.minimum(insns, np.uint64(1 << 60)).astype(np.float64)
        if np.any(lines.astype(np.float64) > limit):
            self._fail("is corrupted (a branch with more code lines than its instructions)", pos)

    def _expand(
        self,
        first: np.ndarray[Any, np.dtype[np.uint64]],
        count: np.ndarray[Any, np.dtype[np.uint64]],
        pos: int,
    ) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.uint64]]]:
        """The lines of consecutive ranges (``first``, ``count``), one after the other, and
        where each range's lines start (``len + 1`` offsets)."""
        if len(count) and int(count.max()) > _MAX_LINES:
            self._fail("is corrupted (a branch with a bad line count)", pos)
        offsets = np.zeros(len(count) + 1, dtype=np.int64)
        np.cumsum(count, out=offsets[1:])
        total = int(offsets[-1])
        if total > _MAX_LINES:
            self._fail("is corrupted (a branch with a bad line count)", pos)
        # Line k of range i is first[i] + (k - offsets[i]): one repeat, then the index.
        base = first - offsets[:-1].astype(np.uint64)  # wraps around, and back below
        lines: np.ndarray[Any, np.dtype[np.uint64]] = np.repeat(base, count.astype(np.int64))
        lines += np.arange(total, dtype=np.uint64)
        return offsets, lines

    def _note_threads(self, recs: np.ndarray[Any, np.dtype[np.void]]) -> None:
        self._note_thread_columns(recs["pid"], recs["tid"])

    def _note_thread_columns(self, pid: npt.NDArray[Any], tid: npt.NDArray[Any]) -> None:
        """Remember the threads of these rows (this decode saw a branch of each)."""
        if not len(pid):
            return
        if (pid == pid[0]).all() and (tid == tid[0]).all():
            # One thread (the usual run): no need to sort.
            self._threads_seen.add(_thread_key(int(pid[0]), int(tid[0])))
            return
        self._threads_seen.update(np.unique(_thread_keys(pid, tid)).tolist())

    def _note_first_after_end(self, rows: _Rows, late: npt.NDArray[np.intp]) -> None:
        """Remember each thread's first kept branch after the window (see ``first_after_end``)
        among ``rows[late]``. Only the first per thread matters: the filter writes no other
        (``until``), but a stream without that holds every branch perf decodes past the
        window's end, tens of thousands of them."""
        seen = self.first_after_end
        decoded = self._threads_seen
        recs = rows.recs
        _, first = np.unique(_thread_keys(recs["pid"][late], recs["tid"][late]), return_index=True)
        for i in np.sort(late[first]).tolist():
            rec = recs[i]
            pid, tid = int(rec["pid"]), int(rec["tid"])
            if (pid, tid) in seen:
                continue
            # Exact only if this decode saw an earlier branch of the thread (perf's and the
            # filter's counts start from there).
            exact = _thread_key(pid, tid) in decoded
            gap = int(rec["gap_delta"])
            seen[(pid, tid)] = CountFix(
                int(rec["time"]),
                int(rec["ip"]),
                int(rec["addr"]),
                int(rec["insn_cnt"]),
                int(rec["cyc_cnt"]),
                exact,
                gap,
                rows.lines_of(i),
                int(rec["gap_insns"]) if gap else 0,
            )

    def _text_line(self, line: str, events: list[Any]) -> None:
        """A line perf printed between our records: parsed as the text decoder does."""
        self.stats.text_lines += 1
        if any(c < " " and c != "\t" for c in line.rstrip("\r")):
            self._fail("is corrupted (control bytes in a text line)")
        for ev in self._text.feed([line]):
            time = getattr(ev, "time", None)
            if time is not None and self._outside(time):
                self.stats.outside_window += 1
                continue
            if type(ev) is DecodeError:
                self.stats.decode_errors += 1
            events.append(ev)

    def _outside(self, time: int) -> bool:
        return (self._lo is not None and time < self._lo) or (
            self._hi is not None and time > self._hi
        )


def _thread_key(pid: int, tid: int) -> int:
    """One int for a thread (``_threads_seen``'s keys)."""
    return (pid << 32) | (tid & 0xFFFFFFFF)


def _thread_keys(pid: npt.NDArray[Any], tid: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """:func:`_thread_key` of every row."""
    keys: npt.NDArray[np.int64] = (pid.astype(np.int64) << 32) | tid.astype(np.uint32)
    return keys


def scan_tags(buf: _Buffer, pos: int, n: int, size: int) -> tuple[int, int, int]:
    """The first byte of the ``n`` rows of ``size`` bytes at ``pos``, where a run of branch
    records (and the lines records before some of them, of the same size) may be: the
    first row that is neither (``n``: none), the first lines record and the last branch
    record before it (-1: none). ``decode/_crecords.c``'s scan_tags in numpy (its
    reference, and the reader where the C module is not built)."""
    tags = np.frombuffer(buf, dtype=np.uint8, count=n * size, offset=pos)[::size]
    other = np.flatnonzero((tags != rf.TAG_BRANCH) & (tags != rf.TAG_LINES))
    stop = int(other[0]) if other.size else n
    lines = np.flatnonzero(tags[:stop] == rf.TAG_LINES)
    branches = np.flatnonzero(tags[:stop] == rf.TAG_BRANCH)
    return (stop, int(lines[0]) if lines.size else -1, int(branches[-1]) if branches.size else -1)


def _select(rows: _Rows, keep: np.ndarray[Any, np.dtype[np.bool_]]) -> _Rows:
    """The rows where ``keep`` is true, their lines with them."""
    if rows.line_offsets is None or rows.lines is None:
        return _Rows(rows.recs[keep], None, None)
    counts = np.diff(rows.line_offsets)
    kept = counts[keep]
    offsets = np.zeros(len(kept) + 1, dtype=np.int64)
    np.cumsum(kept, out=offsets[1:])
    return _Rows(rows.recs[keep], offsets, rows.lines[np.repeat(keep, counts)])


def read_record_stream(
    chunks: Iterator[bytes] | Sequence[bytes], source: str = "dlfilter record stream"
) -> Iterator[list[Event]]:
    """Parse a whole stream given as chunks (a file's contents, a pipe's reads)."""
    parser = RecordStreamParser(source)
    for chunk in chunks:
        events = parser.feed(chunk)
        if events:
            yield events
    parser.close()


# ---------------------------------------------------------------------- running perf


@dataclass
class DlfilterRun:
    """One finished ``perf script --dlfilter`` run: its stream's stats and perf's stderr."""

    argv: list[str]
    stats: StreamStats
    stderr: str = ""


class DlfilterProcess:
    """One ``perf script --dlfilter`` process, started at construction.

    perf writes into a pipe read by :meth:`batches` while it decodes; with ``stdout_path``
    it writes into that file instead, which :meth:`batches` reads once perf is done
    (parallel decode runs the windows it is not consuming yet this way). Events with a
    time outside ``time_window`` (inclusive; None = open) are dropped. ``task_events``
    adds perf's thread names (``CommEvent``), as the text decoder's option does.
    perf is watched (:class:`~ptscope.perftool.PerfWatch`): one that makes no progress
    is stopped, and reading it then raises that one-line error. perf dies with ptscope.
    :meth:`columnar_batches` is :meth:`batches` with each run of branches as one
    :class:`~ptscope.model.BranchBatch` over ``locations`` (a new table if None).
    ``insns``: instruction detail (see :func:`dlfilter_command`).
    """

    def __init__(
        self,
        perf_data: Path,
        *,
        itrace: str = DEFAULT_ITRACE,
        keep_all: bool = False,
        insns: bool = False,
        extra: Sequence[str] = (),
        perf: PerfTool | None = None,
        stdout_path: Path | None = None,
        time_window: tuple[int | None, int | None] | None = None,
        task_events: bool = False,
        locations: LocationTable | None = None,
    ) -> None:
        tool = perf if perf is not None else find_perf()
        check_dlfilter_prerequisites(tool, perf_data)
        self.perf_data = perf_data
        # perf may have been started early (decode/perf_launch.py) for this very spec.
        launch = take_launch(
            launch_spec(
                perf_data,
                tool.path,
                itrace=itrace,
                keep_all=keep_all,
                time_window=time_window,
                insns=insns,
                task_events=task_events,
                extra=extra,
                stdout_path=stdout_path,
            )
        )
        self._launch = launch
        self.argv = launch.argv
        self.parser = RecordStreamParser(
            f"dlfilter record stream of {perf_data}",
            time_window=time_window,
            locations=locations,
        )

    def batches(self) -> Iterator[list[Event]]:
        """The decoded events, batch by batch; raises a PtscopeError if decoding failed."""
        return self._read(self.parser.feed)

    def columnar_batches(self) -> Iterator[list[Event | BranchBatch]]:
        """Like :meth:`batches`, with each run of branches as one :class:`BranchBatch`."""
        return self._read(self.parser.feed_columnar)

    @property
    def stderr(self) -> str:
        """What perf wrote into stderr (once it has been read)."""
        return self._launch.stderr

    def _read(self, feed: Callable[[_Buffer], list[Any]]) -> Iterator[list[Any]]:
        parser = self.parser
        launch = self._launch
        proc, watch, stdout_path = launch.proc, launch.watch, launch.spec.stdout_path
        done = False
        try:
            if stdout_path is not None:
                watch.wait(stdout_path)
                with open(stdout_path, "rb") as f:
                    while chunk := f.read(CHUNK_SIZE):
                        events = feed(chunk)
                        if events:
                            yield events
            else:
                assert proc.stdout is not None
                stdout = _pipe_chunks(proc.stdout.fileno(), watch, pause=launch.ring is None)
                for piece in self._stream(stdout):
                    events = feed(piece)
                    if events:
                        yield events
            done = True
        finally:
            # perf closed its stdout: it is exiting. Otherwise we stopped early (an error,
            # or the consumer went away): stop perf rather than wait for it.
            rc = proc.wait() if done else launch.kill()
            launch.close()
        if watch.stalled is not None:
            raise perf_stalled(self.argv, watch.stalled, self.stderr, str(self.perf_data))
        if rc != 0:
            full = None if stdout_path is None else unwritable(stdout_path)
            if full is not None and stdout_path is not None:
                raise ScratchSpaceError(
                    f"cannot decode {self.perf_data}: perf's records of a --jobs window "
                    f"could not be written to TMPDIR ({stdout_path.parent.parent}): "
                    f"{full.strerror or full}",
                    details=" ".join(self.argv) + "\n" + self.stderr,
                    hint="free some space there, set TMPDIR to a directory with room, or "
                    "decode with --jobs 1",
                )
            raise perf_failure(self.argv, rc, self.stderr, str(self.perf_data))
        try:
            parser.close()
        except BadInputError as e:
            e.details = self.stderr
            raise

    def _stream(self, stdout: Iterator[bytes]) -> Iterator[_Buffer]:
        """The record stream from what perf writes into stdout: in ring mode, the chunks
        and perf's text in order (:class:`~ptscope.decode.record_ring.RingReader`)."""
        ring = self._launch.ring
        if ring is None:
            yield from stdout
            return
        reader = RingReader(ring, self.parser.source)
        for piece in stdout:
            yield from reader.split(piece)
        yield from reader.finish()

    def kill(self) -> int:
        """Stop perf (if still running) and return its exit status."""
        rc = self.stop()
        self._launch.close()
        return rc

    def stop(self) -> int:
        """Stop perf (if still running) and return its exit status, leaving what it was
        given to the reader, which may be reading it on another thread (it then sees the
        end, and closes it)."""
        return self._launch.kill()

    def run_info(self) -> DlfilterRun:
        return DlfilterRun(self.argv, self.parser.stats, self.stderr)


def decode_with_dlfilter(
    perf_data: Path,
    *,
    itrace: str = DEFAULT_ITRACE,
    keep_all: bool = False,
    insns: bool = False,
    extra: Sequence[str] = (),
    perf: PerfTool | None = None,
    run_info: list[DlfilterRun] | None = None,
    task_events: bool = False,
    locations: LocationTable | None = None,
) -> Iterator[list[Event]]:
    """Run perf with the dlfilter on ``perf_data`` and yield its events in batches.

    ``extra`` is added to perf's argv (``--time``, ``--symfs``...). ``run_info``, when given,
    receives a :class:`DlfilterRun` at the end. ``task_events``, ``insns``: see
    :class:`DlfilterProcess`. ``locations``: the table the locations are numbered in (its
    ``inline``: the nodes of ``--dlarg inline=``'s runs file).
    """
    proc = DlfilterProcess(
        perf_data,
        itrace=itrace,
        keep_all=keep_all,
        insns=insns,
        extra=extra,
        perf=perf,
        task_events=task_events,
        locations=locations,
    )
    yield from proc.batches()
    if run_info is not None:
        run_info.append(proc.run_info())


def decode_with_dlfilter_columnar(
    perf_data: Path,
    *,
    itrace: str = DEFAULT_ITRACE,
    keep_all: bool = False,
    insns: bool = False,
    extra: Sequence[str] = (),
    perf: PerfTool | None = None,
    run_info: list[DlfilterRun] | None = None,
    task_events: bool = False,
    locations: LocationTable | None = None,
) -> Iterator[list[Event | BranchBatch]]:
    """:func:`decode_with_dlfilter` with each run of branches as one :class:`BranchBatch`.

    The batches number their locations in ``locations`` (a new table if None).
    """
    proc = DlfilterProcess(
        perf_data,
        itrace=itrace,
        keep_all=keep_all,
        insns=insns,
        extra=extra,
        perf=perf,
        task_events=task_events,
        locations=locations,
    )
    yield from proc.columnar_batches()
    if run_info is not None:
        run_info.append(proc.run_info())


def _grow_pipe(fd: int) -> int:
    """Ask for a 1 MiB pipe: fewer, bigger reads (and numpy batches) than the 64 KiB default.

    Returns the pipe's size (0 if unknown).
    """
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, CHUNK_SIZE)
    try:
        return int(fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ))
    except (OSError, AttributeError):
        return 0


_JOIN: Final = 1 << 14
"""Bytes of a chunk joined to the record left over from the last (see ``_feed``)."""

_FILL_PAUSE: Final = 0.001  # seconds; perf writes ~250 MB/s at most: a quarter of the pipe


_FULL_ERRNOS: Final = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_PROBE_BYTES: Final = 1 << 16


def unwritable(path: Path) -> OSError | None:
    """Why perf could not write on into its output file ``path`` (a full disk, a quota, the
    file size limit: its own error says nothing of it, or it was killed by SIGXFSZ), if
    that is why: ``_PROBE_BYTES`` more cannot be given to the file now. None otherwise;
    the file is left as it was."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        try:
            os.posix_fallocate(fd, size, _PROBE_BYTES)
        except OSError as e:
            return e if e.errno in _FULL_ERRNOS else None
        os.ftruncate(fd, size)
        return None
    finally:
        os.close(fd)


def _pipe_chunks(fd: int, watch: PerfWatch | None = None, *, pause: bool = True) -> Iterator[bytes]:
    """What perf writes into the pipe ``fd``, in chunks of up to :data:`CHUNK_SIZE`.

    perf flushes its stdio buffer every few KiB, and a reader that keeps up gets each flush
    on its own: one parse and one engine call per hundred records, which costs more than
    the records. So after a small read the pipe (1 MiB) is left to fill for a moment.
    ``watch`` is asked to wait for each read (it stops a perf that makes no progress).
    ``pause=False``: never wait for more (ring mode: stdout carries 16-byte chunk records,
    each the news of a chunk of records, and perf's few lines).
    """
    pause = _grow_pipe(fd) >= CHUNK_SIZE and pause
    while True:
        if watch is not None:
            watch.wait_readable(fd)
        chunk = os.read(fd, CHUNK_SIZE)
        if not chunk:
            return
        yield chunk
        if pause and len(chunk) < CHUNK_SIZE // 4:
            sleep(_FILL_PAUSE)
