"""Parallel decode: cut a recording into time windows and decode them with concurrent perfs.

Cutting: the trace's Intel PT data is read straight from the perf.data (the AUXTRACE
records' payloads, found by walking the data section's record headers). Every PSB packet
(where a decoder can start) carries a TSC packet in its PSB+ group; converted to perf time
with the AUXTRACE_INFO conversion, these give (time, byte offset) points, and windows are cut
at PSB times so that each window holds about the same number of trace bytes (decode work is
proportional to trace bytes). The first window is open at the start and the last one at the
end (``perf script --time ,T`` / ``--time T,``), so nothing can fall outside the windows
even if a time conversion were off. When the layout cannot be read (compressed or
pipe-mode perf.data, timeless traces, too few PSBs), the recording is one window.

Decoding: each window is a ``perf script --time A,B --dlfilter`` process; all run at once.
The first window is read from its pipe while perf runs; the others write into temporary
files that are read in order once the previous windows are consumed. Between windows the
stream carries :data:`SEGMENT_BREAK`: the consumer breaks every thread's segment there
(``TraceSegmentEngine.end_segment()``) and the engine's stitching rejoins the stacks.

What perf does at a window's start (checked on real perf 6.1 output): it decodes from the
PSB at or before the window's start and drops samples outside the window, emitting no
``tr strt`` for the resumed decode, so the first event of a window is an ordinary branch
that lands back in the previous window's stack. Three things would differ from a single
decode, so each window is decoded from a few PSBs *before* its start and the reader drops
every event before the start: perf reports the current cbr again where it starts decoding;
perf's instruction/cycle counts on a sample are "since the previous sample", which a
decoder starting exactly at the cut does not know; and decode *errors* are not
time-filtered by perf at all. With the lead-in, a window's first events are exactly those of
the single decode (unless a thread has no kept branch at all in the lead-in: then its first
branch after the cut lacks the instructions before the lead-in).

A window's perf also decodes a few PSBs *past* its end, and its reader keeps each thread's
first kept branch there (``RecordStreamParser.first_after_end``): the counts the next
window's first branch of that thread takes (:func:`_apply_count_fixes`). The filter is told
the end (``--dlarg until=END``) and writes no later branch of a thread that has its first
one: perf decodes tens of thousands past the end (196,612 branches kept in the 60k trace
cut in four), which went through the window's file and the reader for nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Final, Protocol

import numpy as np

from ptscope.children import temporary_directory
from ptscope.decode.dlfilter_stream import (
    DEFAULT_ITRACE,
    CountFix,
    DlfilterProcess,
    DlfilterRun,
    decode_with_dlfilter,
    decode_with_dlfilter_columnar,
)
from ptscope.decode.perf_launch import MAX_DEFAULT_JOBS, decode_jobs, default_jobs
from ptscope.decode.read_ahead import ReadAhead
from ptscope.model import BranchBatch, BranchEvent, Event, LocationTable
from ptscope.perftool import PerfTool, find_perf

__all__ = [
    "MAX_DEFAULT_JOBS",
    "SEGMENT_BREAK",
    "WINDOWS_TEMP_PREFIX",
    "EventSink",
    "PsbPoint",
    "SegmentBreak",
    "TimeWindow",
    "TraceLayout",
    "decode_parallel",
    "decode_parallel_columnar",
    "default_jobs",
    "feed_sink",
    "plan_windows",
    "read_trace_layout",
]

_PERF_MAGIC: Final = b"PERFILE2"
_HEADER: Final = struct.Struct("<8sQQ2Q2Q2Q4Q")  # magic, size, attr_size, attrs, data, ...
_EVENT_HEADER: Final = struct.Struct("<IHH")
_AUXTRACE: Final = struct.Struct("<QQQIII4x")  # size, offset, reference, idx, tid, cpu
_RECORD_AUXTRACE_INFO: Final = 70
_RECORD_AUXTRACE: Final = 71
_RECORD_COMPRESSED: Final = 81
_AUXTRACE_INTEL_PT: Final = 1
# AUXTRACE_INFO priv[] indexes (perf's intel-pt.h).
_TIME_SHIFT, _TIME_MULT, _TIME_ZERO, _CAP_USER_TIME_ZERO = 1, 2, 3, 4
_PSB: Final = b"\x02\x82" * 8
_RELEASE_BYTES: Final = 16 << 20
"""The PSB scan lets go of the perf.data's pages behind it every 16 MiB: it reads every
byte of the trace, and the mapped pages all counted in ptscope's peak RSS (a 122 MB
perf.data: 158 MB at the start of a ``--jobs 2`` decode, 62 MB at its busiest)."""
_MIN_WINDOW_BYTES: Final = 64 * 1024
WINDOWS_TEMP_PREFIX: Final = "ptscope-decode-"
"""Of the temporary directory the windows' perfs write into."""


class SegmentBreak:
    """Marker between two windows' events: break every thread's segment here."""

    _instance: SegmentBreak | None = None

    def __new__(cls) -> SegmentBreak:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "SEGMENT_BREAK"


SEGMENT_BREAK: Final = SegmentBreak()


class EventSink(Protocol):
    """What consumes decoded events: the reconstruction engine."""

    def feed_all(self, events: Iterable[Event | BranchBatch]) -> None: ...

    def end_segment(self) -> None: ...


def feed_sink(
    sink: EventSink, stream: Iterable[Sequence[Event | BranchBatch] | SegmentBreak]
) -> None:
    """Feed batches to ``sink``, turning window boundaries into segment breaks."""
    for item in stream:
        if isinstance(item, SegmentBreak):
            sink.end_segment()
        else:
            sink.feed_all(item)


# -------------------------------------------------------------- trace layout


@dataclass(frozen=True)
class PsbPoint:
    """A PSB packet: where decoding can start, at which perf time."""

    time: int
    bytes_before: int  # trace bytes of the same buffer before it


@dataclass
class TraceLayout:
    """What the perf.data says about its Intel PT data (enough to cut time windows)."""

    trace_bytes: int
    buffers: int
    psbs: list[PsbPoint]
    spans: list[tuple[int, int]] = field(default_factory=list)
    """(file offset, size) of each buffer's trace bytes in the perf.data."""

    @property
    def time_range(self) -> tuple[int, int] | None:
        """First and last PSB time (perf ns), if there are any."""
        if not self.psbs:
            return None
        times = [p.time for p in self.psbs]
        return min(times), max(times)


def _data_file(path: Path) -> Path:
    # `perf record --kcore` (and others) write a directory holding `data`.
    return path / "data" if path.is_dir() else path


def read_trace_layout(perf_data: Path) -> TraceLayout | None:
    """Scan ``perf_data`` for its Intel PT buffers and their PSB times; None if unreadable."""
    try:
        with (
            open(_data_file(perf_data), "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            return _scan(m)
    except (OSError, ValueError, struct.error):
        return None


def _scan(m: mmap.mmap) -> TraceLayout | None:
    if len(m) < _HEADER.size or m[:8] != _PERF_MAGIC:
        return None
    fields = _HEADER.unpack_from(m, 0)
    data_offset, data_size = fields[5], fields[6]
    end = min(data_offset + data_size, len(m))
    conv: tuple[int, int, int] | None = None
    buffers: list[tuple[int, int]] = []
    pos = data_offset
    while pos + _EVENT_HEADER.size <= end:
        rtype, _misc, size = _EVENT_HEADER.unpack_from(m, pos)
        if size < _EVENT_HEADER.size:
            return None
        if rtype == _RECORD_COMPRESSED:
            return None  # `perf record -z`: the sideband is zstd-compressed
        if rtype == _RECORD_AUXTRACE_INFO:
            kind = struct.unpack_from("<I", m, pos + 8)[0]
            npriv = (size - 16) // 8
            if kind == _AUXTRACE_INTEL_PT and npriv > _CAP_USER_TIME_ZERO:
                priv = struct.unpack_from(f"<{npriv}Q", m, pos + 16)
                if priv[_CAP_USER_TIME_ZERO]:
                    conv = (priv[_TIME_SHIFT], priv[_TIME_MULT], priv[_TIME_ZERO])
        elif rtype == _RECORD_AUXTRACE:
            payload = _AUXTRACE.unpack_from(m, pos + 8)[0]
            buffers.append((pos + size, payload))
            pos += payload
        pos += size
    if conv is None:
        return None  # timeless: perf cannot select time ranges
    psbs: list[PsbPoint] = []
    total = 0
    scanned = _ScannedPages(m)
    for start, size in buffers:
        stop = _used_end(m, start, min(start + size, len(m)))
        at = m.find(_PSB, start, stop)
        while at >= 0:
            tsc = _psb_tsc(m, at + len(_PSB), stop)
            if tsc is not None:
                psbs.append(PsbPoint(_tsc_to_perf_time(tsc, *conv), total + at - start))
            scanned.behind(at)
            at = m.find(_PSB, at + len(_PSB), stop)
        total += stop - start
    return TraceLayout(trace_bytes=total, buffers=len(buffers), psbs=psbs, spans=buffers)


class _ScannedPages:
    """Lets go of the mapped pages a forward scan has left behind (see _RELEASE_BYTES):
    the file's pages stay in the page cache, only this process's RSS shrinks."""

    def __init__(self, m: mmap.mmap) -> None:
        self._m = m
        self._done = 0  # pages before this offset are let go (page-aligned)

    def behind(self, pos: int) -> None:
        end = pos - pos % mmap.PAGESIZE
        if end - self._done >= _RELEASE_BYTES and hasattr(mmap, "MADV_DONTNEED"):
            self._m.madvise(mmap.MADV_DONTNEED, self._done, end - self._done)
            self._done = end


def _used_end(m: mmap.mmap, start: int, stop: int) -> int:
    """Where a buffer's packets end: PAD packets (zeros) after the last one carry no trace.
    A buffer written ahead of its packets (ptscope's emulated recorder reserves chunks and
    fills them as the program runs) ends in many of them; perf's never does."""
    if stop <= start or m[stop - 1] != 0:
        return stop
    # Packets after the last PSB are at most a PSB period long: trim only from there (in
    # numpy: bytes.rstrip looks each zero up in its argument, a call per byte).
    last = max(m.rfind(_PSB, start, stop), start)
    tail = np.frombuffer(m, dtype=np.uint8, count=stop - last, offset=last)
    used = np.flatnonzero(tail)
    del tail  # (a view of the map, which cannot be closed while one exists)
    return last + (int(used[-1]) + 1 if used.size else 0)


def _tsc_to_perf_time(tsc: int, shift: int, mult: int, zero: int) -> int:
    quot = tsc >> shift
    rem = tsc & ((1 << shift) - 1)
    return (zero + quot * mult + ((rem * mult) >> shift)) & 0xFFFFFFFFFFFFFFFF


def _psb_tsc(m: mmap.mmap, pos: int, stop: int) -> int | None:
    """The TSC in the PSB+ group starting at ``pos`` (packets up to PSBEND), if any."""
    limit = min(stop, pos + 128)
    while pos < limit:
        b = m[pos]
        if b == 0x00:  # PAD
            pos += 1
        elif b == 0x19:  # TSC: 7 bytes of timestamp
            if pos + 8 > stop:
                return None
            return int.from_bytes(m[pos + 1 : pos + 8], "little")
        elif b == 0x02:
            if pos + 1 >= stop:
                return None
            ext = m[pos + 1]
            size = {0x23: 0, 0x03: 4, 0x73: 7, 0x43: 8, 0xC8: 7, 0xF3: 2, 0x82: 16}.get(ext)
            if not size:
                return None  # PSBEND (no TSC in this PSB+) or a packet we do not know
            pos += size
        elif b == 0x99 or b == 0x59:  # MODE, MTC
            pos += 2
        elif b & 0x1F == 0x1D:  # FUP
            ip_bytes = {0: 0, 1: 2, 2: 4, 3: 6, 4: 6, 6: 8}.get(b >> 5)
            if ip_bytes is None:
                return None
            pos += 1 + ip_bytes
        elif b & 0x03 == 0x03:  # CYC: continuation bytes while the Exp bit is set
            more = b & 0x04
            pos += 1
            while more and pos < limit:
                more = m[pos] & 0x01
                pos += 1
        else:
            return None
    return None


# ------------------------------------------------------------------ windows


@dataclass(frozen=True)
class TimeWindow:
    """An inclusive perf-time range of events; None = open (the trace's start or end).

    perf decodes from ``decode_from`` to ``decode_to`` (default -1: the same as ``start``,
    ``end``; None: open), a little wider; events outside ``start``..``end`` are dropped (see
    the module docstring).
    """

    start: int | None
    end: int | None
    decode_from: int | None = -1
    decode_to: int | None = -1

    def perf_arg(self) -> str:
        """The ``--time`` value."""
        first = self.start if self.decode_from == -1 else self.decode_from
        last = self.end if self.decode_to == -1 else self.decode_to
        a = _fmt(first) if first is not None else ""
        b = _fmt(last) if last is not None else ""
        return f"{a},{b}"

    def contains(self, time: int) -> bool:
        return (self.start is None or time >= self.start) and (self.end is None or time <= self.end)


def _apply_count_fixes(batch: list[Event], fixes: dict[tuple[int, int], CountFix]) -> None:
    """Give each thread's first branch the counts (and gap time) an earlier window's perf
    saw for it.

    An earlier window's perf decoded past its end without a break, so its counts for that
    branch are the single decode's; this window's perf started decoding later and may lack
    the instructions before its start. Entries are removed once used.
    """
    for ev in batch:
        if type(ev) is BranchEvent:
            fix = fixes.pop((ev.pid, ev.tid), None)
            if fix is not None and (ev.time, ev.src.ip, ev.dst.ip) == fix[:3]:
                ev.insn_count = fix.insn_count
                ev.cycle_count = fix.cycle_count
                ev.gap_time = ev.time - fix.gap_delta if fix.gap_delta else 0
                ev.gap_insns = fix.gap_insns if fix.gap_delta else 0
                if fix.lines is not None:
                    ev.lines = fix.lines
        if not fixes:
            return


def _apply_count_fixes_columnar(
    items: list[Event | BranchBatch], fixes: dict[tuple[int, int], CountFix]
) -> None:
    """:func:`_apply_count_fixes` for a columnar list (branches are in batches)."""
    for item in items:
        if type(item) is not BranchBatch:
            continue
        batch = item
        for key in list(fixes):
            rows = np.flatnonzero((batch.pid == key[0]) & (batch.tid == key[1]))
            if not len(rows):
                continue
            fix = fixes.pop(key)
            i = int(rows[0])
            src = batch.locations[int(batch.src[i])]
            dst = batch.locations[int(batch.dst[i])]
            if (int(batch.time[i]), src.ip, dst.ip) == fix[:3]:
                # The columns may be read-only views of the record stream.
                batch.insn_count = batch.insn_count.copy()
                batch.cycle_count = batch.cycle_count.copy()
                batch.insn_count[i] = fix.insn_count
                batch.cycle_count[i] = fix.cycle_count
                gaps = batch.gap_delta
                batch.gap_delta = (
                    gaps.copy() if gaps is not None else np.zeros(len(batch), dtype=np.uint32)
                )
                batch.gap_delta[i] = fix.gap_delta
                gap_insns = batch.gap_insns
                batch.gap_insns = (
                    gap_insns.copy()
                    if gap_insns is not None
                    else np.zeros(len(batch), dtype=np.uint16)
                )
                batch.gap_insns[i] = fix.gap_insns if fix.gap_delta else 0
                if fix.lines is not None:
                    _replace_lines(batch, i, fix.lines)
        if not fixes:
            return


def _replace_lines(batch: BranchBatch, row: int, lines: tuple[int, ...]) -> None:
    """Give ``row`` of ``batch`` these code lines (its CSR columns are rebuilt)."""
    if batch.line_offsets is None or batch.lines is None:
        return
    a, b = int(batch.line_offsets[row]), int(batch.line_offsets[row + 1])
    new = np.array(lines, dtype=np.uint64)
    batch.lines = np.concatenate([batch.lines[:a], new, batch.lines[b:]])
    offsets = batch.line_offsets.astype(np.int64)
    offsets[row + 1 :] += len(new) - (b - a)
    batch.line_offsets = offsets.astype(np.int32)


def _fmt(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def plan_windows(
    layout: TraceLayout | None,
    jobs: int,
    *,
    min_window_bytes: int = _MIN_WINDOW_BYTES,
    lead_in: int | None = None,
    lead_out: int | None = None,
) -> list[TimeWindow]:
    """Cut the trace into at most ``jobs`` windows holding about equal trace bytes.

    Cuts are PSB times. With one buffer, a cut is the PSB nearest to k/jobs of its bytes;
    with several (one per thread or CPU), the k/jobs-th PSB in time order, which balances
    the bytes as well when PSBs come at a fixed byte period (as they do: ``psb_period``).
    Windows smaller than ``min_window_bytes`` are not worth a perf process. Each window
    is decoded from ``lead_in`` PSBs before its start and to ``lead_out`` PSBs after its
    end (defaults: one and four per buffer), see the module docstring.
    """
    whole = [TimeWindow(None, None)]
    if layout is None or jobs <= 1 or len(layout.psbs) < 2:
        return whole
    n = min(jobs, max(1, layout.trace_bytes // max(min_window_bytes, 1)))
    points = sorted(layout.psbs, key=lambda p: (p.time, p.bytes_before))
    cuts: list[int] = []
    for k in range(1, n):
        if layout.buffers == 1:
            goal = k * layout.trace_bytes / n
            best = min(points, key=lambda p: abs(p.bytes_before - goal))
        else:
            best = points[k * len(points) // n]
        # A cut at the first PSB would leave the first window empty; equal cuts likewise.
        if best.time > points[0].time and (not cuts or best.time > cuts[-1]):
            cuts.append(best.time)
    if not cuts:
        return whole
    back = lead_in if lead_in is not None else max(layout.buffers, 1)
    ahead = lead_out if lead_out is not None else 4 * max(layout.buffers, 1)
    times = [p.time for p in points]

    def decode_from(cut: int) -> int:
        return times[max(0, bisect.bisect_left(times, cut) - back)]

    def decode_to(cut: int) -> int | None:
        i = bisect.bisect_left(times, cut) + ahead
        return times[i] if i < len(times) else None  # None: to the end of the trace

    bounds = [None, *cuts, None]
    return [
        TimeWindow(
            start=a,
            end=b - 1 if b is not None else None,
            decode_from=decode_from(a) if a is not None else None,
            decode_to=decode_to(b) if b is not None else None,
        )
        for a, b in pairwise(bounds)
    ]


# ------------------------------------------------------------------ decoding


def decode_parallel(
    perf_data: Path,
    *,
    jobs: int | None = None,
    itrace: str = DEFAULT_ITRACE,
    extra: Sequence[str] = (),
    perf: PerfTool | None = None,
    windows: Sequence[TimeWindow] | None = None,
    run_info: list[DlfilterRun] | None = None,
    task_events: bool = False,
    insns: bool = False,
) -> Iterator[list[Event] | SegmentBreak]:
    """Decode ``perf_data`` in time windows with concurrent perf processes.

    Yields event batches in time order, with :data:`SEGMENT_BREAK` between windows. With
    one window this is exactly :func:`~ptscope.decode.dlfilter_stream.decode_with_dlfilter`.
    ``windows`` overrides the automatic plan (tests use it); ``task_events`` adds thread
    names, ``insns`` instruction detail (see
    :class:`~ptscope.decode.dlfilter_stream.DlfilterProcess`).
    """
    return _decode_windows(
        perf_data,
        jobs=jobs,
        itrace=itrace,
        extra=extra,
        perf=perf,
        windows=windows,
        run_info=run_info,
        task_events=task_events,
        insns=insns,
        locations=None,
    )


def decode_parallel_columnar(
    perf_data: Path,
    *,
    jobs: int | None = None,
    itrace: str = DEFAULT_ITRACE,
    extra: Sequence[str] = (),
    perf: PerfTool | None = None,
    windows: Sequence[TimeWindow] | None = None,
    run_info: list[DlfilterRun] | None = None,
    task_events: bool = False,
    insns: bool = False,
    locations: LocationTable | None = None,
    read_ahead: bool = False,
) -> Iterator[list[Event | BranchBatch] | SegmentBreak]:
    """:func:`decode_parallel` with each run of branches as one :class:`BranchBatch`.

    Every window's batches number their locations in ``locations`` (one new table for the
    whole decode if None), so one engine sees one table. ``read_ahead``: with windows, the
    records are read on a thread of their own ahead of the caller
    (:class:`~ptscope.decode.read_ahead.ReadAhead`), which must then not add locations to
    ``locations`` while it reads.
    """
    return _decode_windows(
        perf_data,
        jobs=jobs,
        itrace=itrace,
        extra=extra,
        perf=perf,
        windows=windows,
        run_info=run_info,
        task_events=task_events,
        insns=insns,
        locations=locations if locations is not None else LocationTable(),
        read_ahead=read_ahead,
    )


def _windows_in_order(
    procs: Sequence[DlfilterProcess], columnar: bool, run_info: list[DlfilterRun] | None
) -> Iterator[Any]:
    """Every window's items in order, :data:`SEGMENT_BREAK` between two windows, each
    window's first branches given the counts the window before it saw for them."""
    fixes: dict[tuple[int, int], CountFix] = {}
    for i, proc in enumerate(procs):
        if i:
            yield SEGMENT_BREAK
        if columnar:
            for items in proc.columnar_batches():
                if fixes:
                    _apply_count_fixes_columnar(items, fixes)
                yield items
        else:
            for batch in proc.batches():
                if fixes:
                    _apply_count_fixes(batch, fixes)
                yield batch
        # A thread with no branch in this window keeps the fix it had (from a
        # decode that saw it earlier), unless this one is as good.
        for key, fix in proc.parser.first_after_end.items():
            if fix.exact or key not in fixes:
                fixes[key] = fix
        if run_info is not None:
            run_info.append(proc.run_info())


def _decode_windows(
    perf_data: Path,
    *,
    jobs: int | None,
    itrace: str,
    extra: Sequence[str],
    perf: PerfTool | None,
    windows: Sequence[TimeWindow] | None,
    run_info: list[DlfilterRun] | None,
    task_events: bool,
    insns: bool,
    locations: LocationTable | None,
    read_ahead: bool = False,
) -> Iterator[Any]:
    """Both decodes: events (``locations`` None) or columnar batches over ``locations``."""
    tool = perf if perf is not None else find_perf()
    if windows is None:
        n = decode_jobs(jobs, perf_data)
        windows = plan_windows(read_trace_layout(perf_data) if n > 1 else None, n)
    if len(windows) == 1 and windows[0] == TimeWindow(None, None):
        if locations is not None:
            yield from decode_with_dlfilter_columnar(
                perf_data,
                itrace=itrace,
                extra=extra,
                perf=tool,
                run_info=run_info,
                task_events=task_events,
                insns=insns,
                locations=locations,
            )
        else:
            yield from decode_with_dlfilter(
                perf_data,
                itrace=itrace,
                extra=extra,
                perf=tool,
                run_info=run_info,
                task_events=task_events,
                insns=insns,
            )
        return
    with temporary_directory(WINDOWS_TEMP_PREFIX) as tmp:
        procs: list[DlfilterProcess] = []
        try:
            for i, w in enumerate(windows):
                procs.append(
                    DlfilterProcess(
                        perf_data,
                        itrace=itrace,
                        extra=[f"--time={w.perf_arg()}", *extra],
                        perf=tool,
                        # The first window is consumed live; the others wait in files.
                        stdout_path=tmp / f"window-{i}.bin" if i else None,
                        time_window=(w.start, w.end),
                        task_events=task_events,
                        insns=insns,
                        locations=locations,
                    )
                )
            ordered = _windows_in_order(procs, locations is not None, run_info)
            if read_ahead:

                def stop_perfs() -> None:
                    for proc in procs:
                        proc.stop()

                ordered = ReadAhead(ordered, unblock=stop_perfs)
            with contextlib.closing(ordered):  # type: ignore[type-var]
                yield from ordered
        finally:
            for proc in procs:
                proc.kill()
