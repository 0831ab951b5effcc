"""Reading a perf.data file ourselves: its attributes, feature sections, sideband records and
AUX area (Intel PT) buffers, for the own decoder (:mod:`ptscope.decode.native`).

Only what a decode needs is read, and nothing of the trace itself: the AUXTRACE records'
payloads are located (file offset and size), never copied. The layout is perf's own
(``tools/perf/Documentation/perf.data-file-format.txt``): a 104-byte header, the
attributes with their ids, a data section of records (each an 8-byte header, then its
body; most end with a *sample id* trailer whose fields the attribute's ``sample_type``
says), and feature sections after the data.

What this reader does not take (pipe mode, compressed records from ``perf record -z``,
the directory format of ``--threads``) raises :class:`Unsupported`, with the reason: such
a recording is decoded by perf instead. Damage (sizes that run past the file, a record
shorter than its header) raises :class:`~ptscope.errors.BadInputError`.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ptscope.errors import BadInputError

__all__ = [
    "AuxBuffer",
    "EventAttr",
    "IntelPtInfo",
    "PerfData",
    "SidebandRecord",
    "Unsupported",
    "read_perf_data",
]

MAGIC: Final = b"PERFILE2"
_HEADER = struct.Struct("<8sQQ QQ QQ QQ 4Q")
_EV_HEADER = struct.Struct("<IHH")
_ATTR_HEAD = struct.Struct(
    "<IIQQQQQ"
)  # type, size, config, period, sample_type, read_format, flags

# Record types (linux/perf_event.h, perf's util/event.h).
REC_MMAP: Final = 1
REC_LOST: Final = 2
REC_COMM: Final = 3
REC_EXIT: Final = 4
REC_FORK: Final = 7
REC_SAMPLE: Final = 9
REC_MMAP2: Final = 10
REC_AUX: Final = 11
REC_ITRACE_START: Final = 12
REC_LOST_SAMPLES: Final = 13
REC_SWITCH: Final = 14
REC_SWITCH_CPU_WIDE: Final = 15
REC_HEADER_ATTR: Final = 64
REC_FINISHED_ROUND: Final = 68
REC_ID_INDEX: Final = 69
REC_AUXTRACE_INFO: Final = 70
REC_AUXTRACE: Final = 71
REC_AUXTRACE_ERROR: Final = 72
REC_TIME_CONV: Final = 79
REC_HEADER_FEATURE: Final = 80
REC_COMPRESSED: Final = 81

MISC_CPUMODE_MASK: Final = 7
MISC_KERNEL: Final = 1
MISC_USER: Final = 2
MISC_COMM_EXEC: Final = 1 << 13
MISC_SWITCH_OUT: Final = 1 << 13
MISC_MMAP_BUILD_ID: Final = 1 << 14

# perf_event_attr.sample_type bits that make up a record's sample id trailer.
SAMPLE_TID: Final = 1 << 1
SAMPLE_TIME: Final = 1 << 2
SAMPLE_CALLCHAIN: Final = 1 << 5
SAMPLE_ID: Final = 1 << 6
SAMPLE_CPU: Final = 1 << 7
SAMPLE_STREAM_ID: Final = 1 << 9
SAMPLE_IDENTIFIER: Final = 1 << 16
ATTR_SAMPLE_ID_ALL: Final = 1 << 18
ATTR_EXCLUDE_USER: Final = 1 << 4
ATTR_EXCLUDE_KERNEL: Final = 1 << 5

# Feature bits (perf's util/header.h).
FEAT_BUILD_ID: Final = 2
FEAT_CPUID: Final = 9
FEAT_EVENT_DESC: Final = 12
FEAT_AUXTRACE: Final = 18
FEAT_DIR_FORMAT: Final = 24
FEAT_COMPRESSED: Final = 27

AUXTRACE_INTEL_PT: Final = 1
PMU_TYPE_DUMMY_SOFTWARE: Final = 1

# AUX record flags.
AUX_FLAG_TRUNCATED: Final = 1
AUX_FLAG_OVERWRITE: Final = 2
AUX_FLAG_PARTIAL: Final = 4
AUX_FLAG_COLLISION: Final = 8

_INTEL_PT_FIELDS: Final = (
    "pmu_type",
    "time_shift",
    "time_mult",
    "time_zero",
    "cap_user_time_zero",
    "tsc_bit",
    "noretcomp_bit",
    "have_sched_switch",
    "snapshot_mode",
    "per_cpu_mmaps",
    "mtc_bit",
    "mtc_freq_bits",
    "tsc_ctc_ratio_n",
    "tsc_ctc_ratio_d",
    "cyc_bit",
    "max_non_turbo_ratio",
    "filter_str_len",
)


class Unsupported(Exception):
    """A perf.data this reader does not take (the reason is the message): perf decodes it."""


@dataclass(frozen=True)
class EventAttr:
    """One ``perf_event_attr`` of the file, with its ids and its name (EVENT_DESC)."""

    type: int
    config: int
    sample_type: int
    flags: int
    ids: tuple[int, ...]
    name: str = ""

    @property
    def sample_id_all(self) -> bool:
        return bool(self.flags & ATTR_SAMPLE_ID_ALL)

    @property
    def exclude_user(self) -> bool:
        return bool(self.flags & ATTR_EXCLUDE_USER)

    @property
    def exclude_kernel(self) -> bool:
        return bool(self.flags & ATTR_EXCLUDE_KERNEL)

    def id_trailer_size(self) -> int:
        """Bytes of the sample id trailer of this attribute's non-sample records."""
        if not self.sample_id_all:
            return 0
        st = self.sample_type
        size = 0
        for bit in (SAMPLE_TID, SAMPLE_TIME, SAMPLE_ID, SAMPLE_STREAM_ID, SAMPLE_CPU):
            if st & bit:
                size += 8
        if st & SAMPLE_IDENTIFIER:
            size += 8
        return size


@dataclass(frozen=True)
class IntelPtInfo:
    """The Intel PT AUXTRACE_INFO record: how perf recorded (its priv[] words)."""

    pmu_type: int
    time_shift: int
    time_mult: int
    time_zero: int
    cap_user_time_zero: int
    tsc_bit: int
    noretcomp_bit: int
    have_sched_switch: int
    snapshot_mode: int
    per_cpu_mmaps: int
    mtc_bit: int
    mtc_freq_bits: int
    tsc_ctc_ratio_n: int
    tsc_ctc_ratio_d: int
    cyc_bit: int
    max_non_turbo_ratio: int
    filter_str_len: int
    filter: str = ""

    def tsc_to_perf_time(self, tsc: int) -> int:
        """perf's conversion of a TSC value to perf time (ns)."""
        shift = self.time_shift
        quot = tsc >> shift
        rem = tsc & ((1 << shift) - 1)
        return (self.time_zero + quot * self.time_mult + ((rem * self.time_mult) >> shift)) & (
            (1 << 64) - 1
        )


@dataclass(frozen=True)
class AuxBuffer:
    """One PERF_RECORD_AUXTRACE: a piece of one queue's trace, where it lies in the file."""

    data_offset: int
    """File offset of its first byte of trace."""
    size: int
    aux_offset: int
    """Its offset in the AUX area (consecutive buffers of a queue continue each other)."""
    reference: int
    """A TSC perf read when it copied the buffer out (perf's decoder starts from it)."""
    idx: int
    tid: int
    cpu: int
    record_offset: int


@dataclass(frozen=True)
class SidebandRecord:
    """A record a decode needs besides the trace: its type, the sample id trailer's
    pid/tid/time/cpu (-1: not there) and its own fields."""

    type: int
    misc: int
    time: int
    """perf time (ns) from the trailer, -1 without one."""
    pid: int
    tid: int
    cpu: int
    fields: tuple[int, ...] = ()
    """MMAP/MMAP2: (addr, len, pgoff, prot, flags); COMM: (); FORK/EXIT: (ppid, ptid);
    AUX: (offset, size, flags); LOST: (lost,); SWITCH_CPU_WIDE: (next_prev_pid,
    next_prev_tid)."""
    name: str = ""
    """MMAP/MMAP2: the file name; COMM: the command."""
    build_id: bytes = b""
    """MMAP2 with a build id (PERF_RECORD_MISC_MMAP_BUILD_ID)."""
    record_offset: int = 0


@dataclass
class PerfData:
    """What :func:`read_perf_data` found in a perf.data file."""

    path: Path
    attrs: list[EventAttr]
    intel_pt: IntelPtInfo | None
    buffers: list[AuxBuffer]
    sideband: list[SidebandRecord]
    build_ids: dict[str, bytes] = field(default_factory=dict)
    """File name -> build id (the BUILD_ID feature)."""
    cpuid: str = ""
    size: int = 0

    def intel_pt_attr(self) -> EventAttr | None:
        if self.intel_pt is None:
            return None
        return next((a for a in self.attrs if a.type == self.intel_pt.pmu_type), None)


def _cstring(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _data_path(path: Path) -> Path:
    if path.is_dir():
        if any(path.glob("data.*")):
            raise Unsupported("the directory format of `perf record --threads`")
        return path / "data"
    return path


def read_perf_data(path: Path) -> PerfData:
    """Read ``path``'s header, attributes, features, sideband and AUX buffers."""
    data_path = _data_path(path)
    try:
        with open(data_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _HEADER.size:
                raise BadInputError(f"{path}: not a perf.data file (too short)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return _read(path, m, size)
    except OSError as e:
        raise BadInputError(f"cannot read {path}: {e.strerror or e}") from None


def _read(path: Path, m: mmap.mmap, size: int) -> PerfData:
    fields = _HEADER.unpack_from(m, 0)
    magic, header_size, attr_size, attrs_off, attrs_size = fields[:5]
    data_off, data_size = fields[5], fields[6]
    bitmap = fields[9:13]
    if magic != MAGIC:
        if magic == b"PERFILE2"[::-1] or magic[:4] == b"PERF":
            raise Unsupported("a perf.data in pipe mode or of another byte order")
        raise BadInputError(f"{path}: not a perf.data file (bad magic)")
    if header_size != _HEADER.size:
        raise Unsupported(f"a perf.data header of {header_size} bytes")
    if data_off + data_size > size or attrs_off + attrs_size > size:
        raise BadInputError(f"{path}: damaged perf.data (sections past the end of the file)")

    def has_feature(bit: int) -> bool:
        return bool(bitmap[bit // 64] >> (bit % 64) & 1)

    if has_feature(FEAT_COMPRESSED):
        raise Unsupported("compressed records (`perf record -z`)")
    features = _feature_sections(m, data_off + data_size, bitmap, size)
    attrs = _attrs(m, attrs_off, attrs_size, attr_size, size)
    names = _event_names(m, features.get(FEAT_EVENT_DESC))
    attrs = [
        EventAttr(a.type, a.config, a.sample_type, a.flags, a.ids, names.get(a.ids, ""))
        for a in attrs
    ]
    out = PerfData(path, attrs, None, [], [], size=size)
    if FEAT_BUILD_ID in features:
        out.build_ids = _build_ids(m, *features[FEAT_BUILD_ID])
    if FEAT_CPUID in features:
        off, n = features[FEAT_CPUID]
        out.cpuid = _feature_string(m, off, n)
    _records(m, data_off, data_off + data_size, out)
    return out


def _feature_sections(
    m: mmap.mmap, table: int, bitmap: tuple[int, ...], size: int
) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    pos = table
    for bit in range(256):
        if not bitmap[bit // 64] >> (bit % 64) & 1:
            continue
        if pos + 16 > size:
            break
        off, n = struct.unpack_from("<QQ", m, pos)
        pos += 16
        if off + n <= size:
            out[bit] = (off, n)
    return out


def _attrs(m: mmap.mmap, off: int, total: int, entry: int, size: int) -> list[EventAttr]:
    if entry < 16 + _ATTR_HEAD.size:
        raise BadInputError("damaged perf.data (attribute entries too small)")
    out = []
    for pos in range(off, off + total - entry + 1, entry):
        ptype, _asize, config, _period, sample_type, _rf, flags = _ATTR_HEAD.unpack_from(m, pos)
        ids_off, ids_size = struct.unpack_from("<QQ", m, pos + entry - 16)
        ids: tuple[int, ...] = ()
        if ids_off + ids_size <= size and ids_size % 8 == 0:
            ids = struct.unpack_from(f"<{ids_size // 8}Q", m, ids_off)
        out.append(EventAttr(ptype, config, sample_type, flags, ids))
    return out


def _feature_string(m: mmap.mmap, off: int, n: int) -> str:
    if n < 4:
        return ""
    (length,) = struct.unpack_from("<I", m, off)
    return _cstring(m[off + 4 : off + 4 + min(length, n - 4)])


def _event_names(m: mmap.mmap, section: tuple[int, int] | None) -> dict[tuple[int, ...], str]:
    if section is None:
        return {}
    off, n = section
    end = off + n
    out: dict[tuple[int, ...], str] = {}
    try:
        count, attr_size = struct.unpack_from("<II", m, off)
        pos = off + 8
        for _ in range(count):
            pos += attr_size
            (nr_ids,) = struct.unpack_from("<I", m, pos)
            pos += 4
            (length,) = struct.unpack_from("<I", m, pos)
            name = _cstring(m[pos + 4 : pos + 4 + length])
            pos += 4 + length
            ids = struct.unpack_from(f"<{nr_ids}Q", m, pos)
            pos += 8 * nr_ids
            if pos > end:
                break
            out[ids] = name
    except struct.error:
        pass
    return out


def _build_ids(m: mmap.mmap, off: int, n: int) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    pos, end = off, off + n
    while pos + 8 <= end:
        _type, misc, rsize = _EV_HEADER.unpack_from(m, pos)
        if rsize < 36 or pos + rsize > end:
            break
        raw = m[pos + 12 : pos + 32]
        # With PERF_RECORD_MISC_BUILD_ID_SIZE the length is the byte after the id.
        length = m[pos + 32] if misc & (1 << 15) else 20
        name = _cstring(m[pos + 36 : pos + rsize])
        out[name] = raw[: min(length, 20)]
        pos += rsize
    return out


def _records(m: mmap.mmap, start: int, end: int, out: PerfData) -> None:
    attrs = out.attrs
    by_id = {i: a for a in attrs for i in a.ids}
    first = attrs[0] if attrs else None
    uniform = len({(a.sample_type, a.sample_id_all) for a in attrs}) <= 1
    pos = start
    while pos + 8 <= end:
        rtype, misc, rsize = _EV_HEADER.unpack_from(m, pos)
        if rsize < 8 or pos + rsize > end:
            raise BadInputError(
                f"{out.path}: damaged perf.data (a record of {rsize} bytes at {pos:#x})"
            )
        if rtype == REC_COMPRESSED:
            raise Unsupported("compressed records (`perf record -z`)")
        if rtype in (REC_HEADER_FEATURE, REC_HEADER_ATTR):
            raise Unsupported("a perf.data in pipe mode")
        if rtype == REC_AUXTRACE:
            if rsize < 48:
                raise BadInputError(f"{out.path}: damaged perf.data (AUXTRACE at {pos:#x})")
            n, aux_off, ref, idx, tid, cpu = struct.unpack_from("<QQQIIi", m, pos + 8)
            if pos + rsize + n > end:
                raise BadInputError(
                    f"{out.path}: damaged perf.data (AUXTRACE data past the end at {pos:#x})"
                )
            out.buffers.append(AuxBuffer(pos + rsize, n, aux_off, ref, idx, _s32(tid), cpu, pos))
            pos += rsize + n
            continue
        if rtype == REC_AUXTRACE_INFO:
            out.intel_pt = _intel_pt_info(m, pos, rsize)
        elif rtype in _SIDEBAND_TYPES:
            attr = first if uniform else _attr_of(m, pos, rsize, by_id, first)
            rec = _sideband(m, pos, rtype, misc, rsize, attr)
            if rec is not None:
                out.sideband.append(rec)
        pos += rsize


def _s32(v: int) -> int:
    return v - (1 << 32) if v >= 1 << 31 else v


_SIDEBAND_TYPES: Final = frozenset(
    {
        REC_MMAP,
        REC_LOST,
        REC_COMM,
        REC_EXIT,
        REC_FORK,
        REC_MMAP2,
        REC_AUX,
        REC_ITRACE_START,
        REC_SWITCH,
        REC_SWITCH_CPU_WIDE,
    }
)


def _intel_pt_info(m: mmap.mmap, pos: int, rsize: int) -> IntelPtInfo | None:
    (kind,) = struct.unpack_from("<I", m, pos + 8)
    n = (rsize - 16) // 8
    if kind != AUXTRACE_INTEL_PT or n < len(_INTEL_PT_FIELDS):
        return None
    priv = struct.unpack_from(f"<{n}Q", m, pos + 16)
    values = dict(zip(_INTEL_PT_FIELDS, priv, strict=False))
    info = IntelPtInfo(**values)
    flen = info.filter_str_len
    if flen:
        at = pos + 16 + 8 * len(_INTEL_PT_FIELDS)
        text = _cstring(m[at : min(at + flen, pos + rsize)])
        info = IntelPtInfo(**values, filter=text)
    return info


def _attr_of(
    m: mmap.mmap, pos: int, rsize: int, by_id: dict[int, EventAttr], first: EventAttr | None
) -> EventAttr | None:
    """The attribute of a non-sample record: by its IDENTIFIER (the trailer's last word)."""
    if first is None or not first.sample_type & SAMPLE_IDENTIFIER:
        return first
    (ident,) = struct.unpack_from("<Q", m, pos + rsize - 8)
    return by_id.get(ident, first)


def _trailer(
    m: mmap.mmap, pos: int, rsize: int, attr: EventAttr | None
) -> tuple[int, int, int, int]:
    """(pid, tid, time, cpu) of a record's sample id trailer, -1 where absent."""
    if attr is None or not attr.sample_id_all:
        return -1, -1, -1, -1
    size = attr.id_trailer_size()
    at = pos + rsize - size
    if at < pos + 8:
        return -1, -1, -1, -1
    st = attr.sample_type
    pid = tid = time = cpu = -1
    if st & SAMPLE_TID:
        pid, tid = struct.unpack_from("<ii", m, at)
        at += 8
    if st & SAMPLE_TIME:
        (time,) = struct.unpack_from("<Q", m, at)
        at += 8
    if st & SAMPLE_ID:
        at += 8
    if st & SAMPLE_STREAM_ID:
        at += 8
    if st & SAMPLE_CPU:
        (cpu,) = struct.unpack_from("<i", m, at)
    return pid, tid, time, cpu


def _sideband(
    m: mmap.mmap, pos: int, rtype: int, misc: int, rsize: int, attr: EventAttr | None
) -> SidebandRecord | None:
    _pid, _tid, time, cpu = _trailer(m, pos, rsize, attr)
    body = pos + 8
    tail = attr.id_trailer_size() if attr is not None else 0
    limit = pos + rsize - tail
    try:
        if rtype == REC_MMAP:
            pid, tid, addr, length, pgoff = struct.unpack_from("<iiQQQ", m, body)
            name = _cstring(m[body + 32 : limit])
            return SidebandRecord(
                rtype, misc, time, pid, tid, cpu, (addr, length, pgoff, 5, 0), name, b"", pos
            )
        if rtype == REC_MMAP2:
            pid, tid, addr, length, pgoff = struct.unpack_from("<iiQQQ", m, body)
            build_id = b""
            if misc & MISC_MMAP_BUILD_ID:
                n = m[body + 32]
                build_id = m[body + 36 : body + 36 + min(n, 20)]
            prot, flags = struct.unpack_from("<II", m, body + 56)
            name = _cstring(m[body + 64 : limit])
            return SidebandRecord(
                rtype, misc, time, pid, tid, cpu, (addr, length, pgoff, prot, flags), name,
                build_id, pos,
            )  # fmt: skip
        if rtype == REC_COMM:
            pid, tid = struct.unpack_from("<ii", m, body)
            return SidebandRecord(
                rtype, misc, time, pid, tid, cpu, (), _cstring(m[body + 8 : limit]), b"", pos
            )
        if rtype in (REC_FORK, REC_EXIT):
            pid, ppid, tid, ptid, ftime = struct.unpack_from("<iiiiQ", m, body)
            if time < 0:
                time = ftime
            return SidebandRecord(rtype, misc, time, pid, tid, cpu, (ppid, ptid), "", b"", pos)
        if rtype == REC_AUX:
            off, n, flags = struct.unpack_from("<QQQ", m, body)
            return SidebandRecord(rtype, misc, time, _pid, _tid, cpu, (off, n, flags), "", b"", pos)
        if rtype == REC_ITRACE_START:
            pid, tid = struct.unpack_from("<ii", m, body)
            return SidebandRecord(rtype, misc, time, pid, tid, cpu, (), "", b"", pos)
        if rtype == REC_LOST:
            _ident, lost = struct.unpack_from("<QQ", m, body)
            return SidebandRecord(rtype, misc, time, _pid, _tid, cpu, (lost,), "", b"", pos)
        if rtype == REC_SWITCH:
            return SidebandRecord(rtype, misc, time, _pid, _tid, cpu, (), "", b"", pos)
        if rtype == REC_SWITCH_CPU_WIDE:
            npid, ntid = struct.unpack_from("<ii", m, body)
            return SidebandRecord(rtype, misc, time, _pid, _tid, cpu, (npid, ntid), "", b"", pos)
    except (struct.error, ValueError):
        raise BadInputError(f"damaged perf.data (a record cut short at {pos:#x})") from None
    return None
