"""The own decoder: a recording's Intel PT decoded by ptscope itself, no perf process.

perf's decoder walks the code with a map search and a hash lookup per step and builds a
full sample for every taken branch; that cost, the *floor*, is what every perf-based tool
waits for. This decoder reads the perf.data itself (:mod:`ptscope.decode.perf_data`),
decodes the AUX queues in C (``_native/pt_*.c``: packets, the flow with its block cache,
the session's order of queues and sideband, the dlfilter's rules) and hands the engine
the same columns and events the dlfilter path gives (``decode/dlfilter_stream.py``), a
batch at a time. What Python does is per file and per location: finding each DSO where
perf finds it (:mod:`ptscope.decode.perf_dsos`), reading its symbols as perf reads them
(:mod:`ptscope.decode.perf_symbols`) the first time an address in it is met, and making a
:class:`~ptscope.model.Location` of each location once.

:func:`native_support` says whether a recording is one it decodes (and why not: perf
then decodes it); :func:`decode_native_columnar` is the decoder, yielding what
:func:`~ptscope.decode.dlfilter_stream.decode_with_dlfilter_columnar` yields.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from ptscope.decode import perf_data as pd
from ptscope.decode.inline_runs import dwarf_file, inline_runs
from ptscope.decode.native_support import native_support, read_cached
from ptscope.decode.perf_dsos import Dso, DsoLocator, DsoTable, classify_mapping
from ptscope.decode.perf_symbols import dso_symbols
from ptscope.decode.perf_text import TextStats, make_location, parse_error_line
from ptscope.decode.snapshot_overlap import buffer_uses
from ptscope.errors import BadInputError
from ptscope.model import (
    COUNT_BUDGET,
    DAMAGED_DATA,
    TIME_LIMIT,
    UNKNOWN_SYMBOL,
    BranchBatch,
    CommEvent,
    DecodeError,
    Event,
    InlineNodes,
    LocationTable,
    PowerEvent,
    function_key,
)

__all__ = [
    "NativeRun",
    "decode_native",
    "decode_native_columnar",
    "is_available",
    "native_support",
]

log = logging.getLogger("ptscope")

try:
    from ptscope.decode import _ptdecode  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover (built where a C compiler is found)
    _ptdecode = None

BATCH_ROWS: Final = 1 << 16
"""Rows per batch handed to the engine: big enough that the per-batch Python (slicing
around events, remapping locations) is a small share, small enough to bound memory."""

_KERNEL_START: Final = 1 << 63

# struct pt_sb kinds (_native/pt_session.h)
_SB_MMAP, _SB_COMM, _SB_FORK, _SB_EXIT, _SB_ITRACE_START, _SB_AUX, _SB_SWITCH = range(7)
_SB_SWITCH_CPU_WIDE, _SB_LOST = 7, 8
_SB_COMM_EXEC, _SB_SWITCH_OUT, _SB_FORK_EXEC = 1, 2, 4
_NO_FILE: Final = 0xFFFFFFFF
_MISC_FORK_EXEC: Final = 1 << 13
_EV_ERROR, _EV_POWER, _EV_COMM, _EV_DAMAGED = 0, 1, 2, 3
_DAMAGED_TIME, _DAMAGED_GAP, _DAMAGED_COUNTS = 0, 1, 2  # (3: a power event's time)
_CFG_PASS_THRU: Final = 1 << 0
_CFG_BRANCH_EN: Final = 1 << 13


def is_available() -> bool:
    """Whether the own decoder was built (``pip install`` with a C compiler)."""
    return _ptdecode is not None


def _layout(spec: tuple[int, list[tuple[str, int, int]]], kinds: dict[str, str]) -> np.dtype[Any]:
    size, fields = spec
    return np.dtype(
        {
            "names": [f[0] for f in fields],
            "formats": [
                kinds.get(f[0], {8: "<u8", 4: "<u4", 2: "<u2", 1: "u1"}[f[2]]) for f in fields
            ],
            "offsets": [f[1] for f in fields],
            "itemsize": size,
        }
    )


def _dtypes() -> tuple[np.dtype[Any], np.dtype[Any], np.dtype[Any]]:
    assert _ptdecode is not None
    signed = {
        k: "<i4" for k in ("pid", "tid", "ppid", "ptid", "sample_pid", "sample_tid", "cpu", "code")
    }
    sb = _layout(_ptdecode.sideband_layout(), signed)
    ev = _layout(_ptdecode.event_layout(), signed)
    loc = _layout(_ptdecode.location_layout(), {"offset": "<i8", "pid": "<i4", "node": "<i4"})
    return sb, ev, loc


class _Strings:
    """Python's string table for the C side (id 0: none)."""

    def __init__(self) -> None:
        self.values: list[str] = [""]
        self._ids: dict[str, int] = {}

    def id(self, s: str) -> int:
        found = self._ids.get(s)
        if found is None:
            found = self._ids[s] = len(self.values)
            self.values.append(s)
        return found


@dataclass
class NativeStats:
    """What a decode by the own decoder held: the events by type (as the dlfilter
    stream's text stats count them), and the feed's counters (the dlfilter's trailer)."""

    text: TextStats = field(default_factory=TextStats)
    trailer: dict[str, int] | None = None


@dataclass
class NativeRun:
    """One finished decode by the own decoder (the dlfilter run's counterpart)."""

    perf_data: Path
    stats: NativeStats


def _config(data: pd.PerfData) -> dict[str, int]:
    info = data.intel_pt
    assert info is not None
    pt_attrs = [a for a in data.attrs if a.type == info.pmu_type]
    config = next(a for a in pt_attrs if a.ids).config
    mult, shift = info.time_mult, info.time_shift
    ns = 1_000_000_000
    tsc_freq = ((ns // mult) << shift) + (((ns % mult) << shift) // mult) if mult else 0
    ratio = info.max_non_turbo_ratio or (tsc_freq + 50_000_000) // 100_000_000
    cbr2khz = tsc_freq // ratio // 1000 if mult and ratio else 0
    mtc_bits = info.mtc_freq_bits
    mtc_period = (config & mtc_bits) >> ((mtc_bits & -mtc_bits).bit_length() - 1) if mtc_bits else 0
    noretcomp = info.noretcomp_bit and any(a.config & info.noretcomp_bit for a in pt_attrs)
    pass_thru_only = any(
        a.config & _CFG_PASS_THRU and not a.config & _CFG_BRANCH_EN for a in pt_attrs
    )
    return {
        "time_shift": shift,
        "time_mult": mult,
        "time_zero": info.time_zero,
        "per_cpu": info.per_cpu_mmaps,
        "have_sched_switch": info.have_sched_switch,
        "max_non_turbo_ratio": ratio,
        "cbr2khz": cbr2khz,
        "return_compression": 0 if noretcomp else 1,
        "branch_enable": 0 if pass_thru_only else 1,
        "ctl": config,
        "mtc_period": mtc_period,
        "tsc_ctc_ratio_n": info.tsc_ctc_ratio_n,
        "tsc_ctc_ratio_d": info.tsc_ctc_ratio_d,
        "fup_with_nlip": 1 if data.cpuid.startswith("GenuineIntel,6,92,") else 0,
    }


def _queues(
    data: pd.PerfData, trace: mmap.mmap
) -> list[tuple[int, int, list[tuple[int, int, int, bool]]]]:
    """The AUX queues (by mmap index, as perf numbers them): tid and cpu of each from its
    first buffer, and what of each buffer is decoded: all of it, one continuous stream, in
    a full-trace recording; in a snapshot recording what a snapshot adds to the one
    before (:mod:`~ptscope.decode.snapshot_overlap`)."""
    by_idx: dict[int, list[pd.AuxBuffer]] = {}
    for b in data.buffers:
        by_idx.setdefault(b.idx, []).append(b)
    info = data.intel_pt
    snapshots = info is not None and bool(info.snapshot_mode)
    out = []
    for idx in sorted(by_idx):
        bufs = by_idx[idx]
        first = bufs[0]
        if snapshots:
            uses = buffer_uses(trace, [(b.data_offset, b.size) for b in bufs], have_tsc=True)
            pieces = [
                (u.offset, u.size, b.reference, u.consecutive)
                for u, b in zip(uses, bufs, strict=True)
            ]
        else:
            pieces = [(b.data_offset, b.size, b.reference, k > 0) for k, b in enumerate(bufs)]
        out.append((first.tid, first.cpu, pieces))
    return out


def _sideband_order(records: Sequence[pd.SidebandRecord]) -> list[pd.SidebandRecord]:
    """perf's order: records without a time when read (first, here), the others by time,
    in file order where times are equal (its ordered events)."""
    untimed = [r for r in records if r.time in (0, -1) or r.time >= (1 << 64) - 1]
    timed = [r for r in records if not (r.time in (0, -1) or r.time >= (1 << 64) - 1)]
    timed.sort(key=lambda r: r.time)
    return untimed + timed


class _Image:
    """The DSOs met in the sideband, their files for the C image, and their symbols."""

    def __init__(
        self,
        data: pd.PerfData,
        locator: DsoLocator,
        strings: _Strings,
        inline: InlineNodes | None = None,
    ) -> None:
        self.inline = inline  # None: inlined bodies are not read
        self.table = DsoTable(data.build_ids)
        self.locator = locator
        self.strings = strings
        self.files: list[tuple[Any, int, int, bool]] = []
        self.dsos: list[Dso] = []
        self._maps: list[mmap.mmap] = []
        self.fn_ids: dict[str, int] = {}

    def fn_id(self, key: str) -> int:
        found = self.fn_ids.get(key)
        if found is None:
            found = self.fn_ids[key] = len(self.fn_ids)
        return found

    def file_of(self, rec: pd.SidebandRecord) -> int:
        """The C file index of a mapping (its DSO's file, made the first time)."""
        _addr, _length, _pgoff, prot, flags = rec.fields
        if rec.misc & pd.MISC_CPUMODE_MASK == pd.MISC_KERNEL:
            return _NO_FILE  # kernel maps: user-space traces do not need them
        if rec.type == pd.REC_MMAP:
            prot = 0 if rec.misc & (1 << 13) else 4  # PERF_RECORD_MISC_MMAP_DATA
        name, kind, identity = classify_mapping(rec.name, rec.pid, prot, flags)
        inode = (0, 0, 0, 0)
        dso = self.table.find(name, kind, identity, inode, rec.build_id)
        if dso.index < 0:
            dso.data_path = self.locator.data_path(dso)
            data = None
            if dso.data_path is not None:
                try:
                    with open(dso.data_path, "rb") as f:
                        if os.fstat(f.fileno()).st_size:
                            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                            self._maps.append(m)
                            data = m
                except OSError:
                    data = None
            dso.index = len(self.files)
            unknown = self.fn_id(function_key(UNKNOWN_SYMBOL, name))
            self.files.append((data, self.strings.id(name), unknown, identity))
            self.dsos.append(dso)
        return dso.index

    def symbols(self, index: int) -> tuple[bytes, ...] | None:
        """The columns of a file's symbols for the C image (asked once per file)."""
        dso = self.dsos[index]
        syms = dso_symbols(dso, self.locator)
        runs = None
        if self.inline is not None and dso.data_path is not None:
            dwarf = dwarf_file(dso, self.locator, dso.data_path)
            runs = inline_runs(dwarf, self.inline, index, str(dso.data_path))
        if not len(syms) and runs is None:
            return None
        names = np.array([self.strings.id(n) for n in syms.name], dtype=np.uint32)
        fns = np.array([self.fn_id(function_key(n, dso.name)) for n in syms.name], dtype=np.uint32)
        columns = (
            syms.start.astype(np.uint64).tobytes(),
            syms.end.astype(np.uint64).tobytes(),
            syms.sym_start.astype(np.uint64).tobytes(),
            syms.sym_end.astype(np.uint64).tobytes(),
            names.tobytes(),
            fns.tobytes(),
        )
        if runs is None:
            return columns
        return (*columns, runs.start.tobytes(), runs.end.tobytes(), runs.node.tobytes())

    def close(self) -> None:
        for m in self._maps:
            with contextlib.suppress(BufferError):  # still exported: being collected
                m.close()
        self._maps.clear()


def _sideband(
    records: list[pd.SidebandRecord], image: _Image, strings: _Strings, dtype: np.dtype[Any]
) -> np.ndarray[Any, Any]:
    kinds = {
        pd.REC_MMAP: _SB_MMAP,
        pd.REC_MMAP2: _SB_MMAP,
        pd.REC_COMM: _SB_COMM,
        pd.REC_FORK: _SB_FORK,
        pd.REC_EXIT: _SB_EXIT,
        pd.REC_ITRACE_START: _SB_ITRACE_START,
        pd.REC_AUX: _SB_AUX,
        pd.REC_SWITCH: _SB_SWITCH,
        pd.REC_SWITCH_CPU_WIDE: _SB_SWITCH_CPU_WIDE,
        pd.REC_LOST: _SB_LOST,
    }
    out = np.zeros(len(records), dtype=dtype)
    for i, r in enumerate(records):
        row = out[i]
        row["time"] = r.time if r.time >= 0 else (1 << 64) - 1
        row["kind"] = kinds[r.type]
        row["pid"], row["tid"] = r.pid, r.tid
        row["sample_pid"], row["sample_tid"] = r.pid, r.tid
        row["cpu"] = r.cpu
        row["file"] = _NO_FILE
        if r.type in (pd.REC_MMAP, pd.REC_MMAP2):
            row["start"], row["len"], row["pgoff"] = r.fields[0], r.fields[1], r.fields[2]
            row["file"] = image.file_of(r)
        elif r.type == pd.REC_COMM:
            row["name"] = strings.id(r.name)
            if r.misc & pd.MISC_COMM_EXEC:
                row["flags"] = _SB_COMM_EXEC
        elif r.type in (pd.REC_FORK, pd.REC_EXIT):
            row["ppid"], row["ptid"] = r.fields
            if r.misc & _MISC_FORK_EXEC:
                row["flags"] = _SB_FORK_EXEC
        elif r.type == pd.REC_AUX:
            row["aux_flags"] = r.fields[2]
        elif r.type in (pd.REC_SWITCH, pd.REC_SWITCH_CPU_WIDE):
            if r.misc & pd.MISC_SWITCH_OUT:
                row["flags"] = _SB_SWITCH_OUT
            if r.type == pd.REC_SWITCH_CPU_WIDE:
                row["ppid"], row["ptid"] = r.fields
    return out


def _error_line(ev: Any, time: int) -> str:
    """The line perf prints for a decode error (``perf_event__fprintf_auxtrace_error``):
    parsed as the dlfilter path parses it, so that both make the same event."""
    assert _ptdecode is not None
    when = f"{time // 1_000_000_000}.{time % 1_000_000_000:09d}" if time else "0"
    ip = int(ev["ip"])
    code = int(ev["code"])
    return (
        f" instruction trace error type 1 time {when} cpu {int(ev['cpu'])}"
        f" pid {int(ev['pid'])} tid {int(ev['tid'])} ip {ip:#x}".replace(" ip 0x0", " ip 0")
        + f" code {code}: {_ptdecode.error_message(code)}"
    )


class NativeDecoder:
    """One perf.data decoded by the own decoder, batch by batch."""

    def __init__(
        self,
        perf_data: Path,
        *,
        locations: LocationTable | None = None,
        pids: Sequence[int] = (),
        tids: Sequence[int] = (),
        symfs: Path | None = None,
        insns: bool = False,
        keep_all: bool = False,
        to_end: bool = True,
        inline: bool = False,
    ) -> None:
        if _ptdecode is None:
            raise BadInputError("the own decoder is not built")
        self.perf_data = perf_data
        try:
            data = read_cached(perf_data)
        except pd.Unsupported as e:
            raise NativeUnsupported(f"it does not read {e}") from None
        why = native_support(data)
        if why is not None:
            raise NativeUnsupported(why)
        self.data = data
        self.locations = locations if locations is not None else LocationTable()
        if inline and self.locations.inline is None:
            self.locations.inline = InlineNodes()
        self.strings = _Strings()
        self.image = _Image(
            data, DsoLocator(symfs), self.strings, self.locations.inline if inline else None
        )
        sb_dtype, self._ev_dtype, self._loc_dtype = _dtypes()
        self._sideband = _sideband(
            _sideband_order(data.sideband), self.image, self.strings, sb_dtype
        )
        config = _config(data)
        config["unknown_fn"] = self.image.fn_id(function_key(UNKNOWN_SYMBOL, ""))
        config["release_input"] = 1  # (the trace is a mapping of the file: see pt_decoder.c)
        self._file = open(data.path if not data.path.is_dir() else data.path / "data", "rb")  # noqa: SIM115
        self._trace = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._decoder = _ptdecode.Decoder(
            self._trace,
            config,
            _queues(data, self._trace),
            self.image.files,
            self._sideband.tobytes(),
            self.image.symbols,
            {
                "insns": int(insns),
                "keep_all": int(keep_all),
                "to_end": int(to_end),
                "pids": list(pids),
                "tids": list(tids),
                "time_limit": TIME_LIMIT,
                "count_budget": COUNT_BUDGET,
            },
        )
        self.insns = insns
        self.stats = NativeStats()
        self._table_ids = array("i", [-1])  # C location id -> id in `locations`
        self._table_array = np.zeros(0, dtype=np.int32)
        self._done = False

    def batches(self) -> Iterator[list[Event | BranchBatch]]:
        """The events, batch by batch, as the dlfilter stream's columnar reader gives them."""
        try:
            while not self._done:
                self._done = bool(self._decoder.run(BATCH_ROWS))
                items = self._take()
                if items:
                    yield items
            self.stats.trailer = dict(self._decoder.counters())
        finally:
            self.close()

    def close(self) -> None:
        if self._decoder is not None:
            self._decoder = None
            self.image.close()
            self._trace.close()
            self._file.close()

    def _new_locations(self, raw: bytes) -> None:
        locs = np.frombuffer(raw, dtype=self._loc_dtype)
        names = self.strings.values
        for ip, offset, name, dso, node in zip(
            locs["ip"].tolist(), locs["offset"].tolist(), locs["name"].tolist(),
            locs["dso"].tolist(), locs["node"].tolist(), strict=True,
        ):  # fmt: skip
            loc = make_location(
                ip, names[name] if name else None, offset, names[dso] if dso else None
            )
            self._table_ids.append(self.locations.add(loc, node))

    def _take(self) -> list[Event | BranchBatch]:
        assert self._decoder is not None
        cols, events, new_locs = self._decoder.take()
        if new_locs:
            self._new_locations(new_locs)
        if len(self._table_array) != len(self._table_ids):
            self._table_array = np.array(self._table_ids, dtype=np.int32)
        pid = np.frombuffer(cols[0], dtype=np.int32)
        n = len(pid)
        tid = np.frombuffer(cols[1], dtype=np.int32)
        time = np.frombuffer(cols[2], dtype=np.int64)
        flags = np.frombuffer(cols[3], dtype=np.uint32)
        src = self._table_array[np.frombuffer(cols[4], dtype=np.int32)]
        dst = self._table_array[np.frombuffer(cols[5], dtype=np.int32)]
        insn = np.frombuffer(cols[6], dtype=np.uint64)
        cyc = np.frombuffer(cols[7], dtype=np.uint64)
        gap_delta = np.frombuffer(cols[8], dtype=np.uint32)
        gap_insns = np.frombuffer(cols[9], dtype=np.uint16)
        offsets = np.frombuffer(cols[10], dtype=np.int32)
        lines = np.frombuffer(cols[11], dtype=np.uint64)
        evs = np.frombuffer(events, dtype=self._ev_dtype)
        items: list[Event | BranchBatch] = []
        self.stats.text.branches += n

        def batch(a: int, b: int) -> None:
            if b <= a:
                return
            lo, hi = int(offsets[a]), int(offsets[b])
            items.append(
                BranchBatch(
                    self.locations,
                    pid=pid[a:b],
                    tid=tid[a:b],
                    time=time[a:b],
                    flags=flags[a:b],
                    src=src[a:b],
                    dst=dst[a:b],
                    insn_count=insn[a:b],
                    cycle_count=cyc[a:b],
                    gap_delta=gap_delta[a:b],
                    line_offsets=(offsets[a : b + 1] - lo) if self.insns else None,
                    lines=lines[lo:hi] if self.insns else None,
                    gap_insns=gap_insns[a:b],
                )
            )

        at = 0
        for ev in evs:
            row = int(ev["row"])
            batch(at, row)
            at = max(at, row)
            items.append(self._event(ev))
        batch(at, n)
        return items

    def _event(self, ev: Any) -> Event:
        kind = int(ev["kind"])
        pid, tid, time = int(ev["pid"]), int(ev["tid"]), int(ev["time"])
        if kind == _EV_POWER:
            value = int(ev["value"])
            self.stats.text.power += 1
            return PowerEvent(pid, tid, time, value & 0xFF, value >> 32)
        if kind == _EV_COMM:
            self.stats.text.comms += 1
            return CommEvent(
                pid, tid, time or None, self.strings.values[int(ev["value"])], bool(ev["code"])
            )
        self.stats.text.decode_errors += 1
        if kind == _EV_DAMAGED:
            return DecodeError(pid, tid, time or None, None, f"{DAMAGED_DATA}: {_damage(ev)}")
        err = parse_error_line(_error_line(ev, time))
        assert err is not None
        return err


def _damage(ev: Any) -> str:
    """What of a record was out of range (the words the dlfilter stream's check uses)."""
    code, value = int(ev["code"]), int(ev["value"])
    if code == _DAMAGED_TIME:
        return f"branch record's time {value}"
    if code == _DAMAGED_GAP:
        return f"branch record's gap_delta {value} (before time 0)"
    if code == _DAMAGED_COUNTS:
        return f"branch record's counts {value}/{int(ev['ip'])}"
    return f"power record's time {value}"


class NativeUnsupported(Exception):
    """A recording the own decoder does not decode (the reason is the message)."""


def decode_native_columnar(
    perf_data: Path,
    *,
    locations: LocationTable | None = None,
    pids: Sequence[int] = (),
    tids: Sequence[int] = (),
    symfs: Path | None = None,
    insns: bool = False,
    keep_all: bool = False,
    to_end: bool = True,
    inline: bool = False,
    run_info: list[NativeRun] | None = None,
) -> Iterator[list[Event | BranchBatch]]:
    """Decode ``perf_data`` with the own decoder, yielding batches as the dlfilter
    path's columnar reader does; ``run_info`` receives a :class:`NativeRun` at the end.
    Raises :class:`NativeUnsupported` before anything for a recording it does not take."""
    decoder = NativeDecoder(
        perf_data, locations=locations, pids=pids, tids=tids, symfs=symfs, insns=insns,
        keep_all=keep_all, to_end=to_end, inline=inline,
    )  # fmt: skip
    yield from decoder.batches()
    if run_info is not None:
        run_info.append(NativeRun(perf_data, decoder.stats))


def decode_native(perf_data: Path, **kwargs: Any) -> Iterator[list[Event]]:
    """:func:`decode_native_columnar` with every branch an event object (tests)."""
    for items in decode_native_columnar(perf_data, **kwargs):
        out: list[Event] = []
        for item in items:
            if isinstance(item, BranchBatch):
                out.extend(item.events())
            else:
                out.append(item)
        yield out
