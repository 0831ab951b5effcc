"""Write a file-mode perf.data holding per-thread Intel PT AUX data and its sideband, streamed.

No library writes perf.data, so this module lays it out by hand (``docs/emulated-pt.md``
has the byte-level description). The data section is written as records arrive, so trace
data never has to fit in memory; the header, the attribute table and the feature sections
(EVENT_DESC, AUXTRACE index, BUILD_ID, OSRELEASE, ARCH, NRCPUS, CPUID) are written by
:meth:`PerfDataWriter.close`, which then patches the file header at offset 0.

Two events are described: ``intel_pt//u`` (PMU type 8, id 7) owns the trace, and ``dummy:u``
(id 8) the sideband (COMM, MMAP2, FORK, EXIT). Every kernel-type record carries the
``sample_id_all`` trailer ``{pid, tid, time, id}``.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from ptscope.record.emulated.cycle_model import CycleModel

__all__ = ["BuildId", "PerfDataWriter"]

# perf_event_attr (perf 6.1 = PERF_ATTR_SIZE_VER7) and the file header.
_ATTR = struct.Struct("<IIQQQQQIIQQQQIiQIHHIIQ")
_ATTR_SIZE: Final = 128
_FILE_ATTR_SIZE: Final = _ATTR_SIZE + 16
_HEADER = struct.Struct("<8sQQ QQ QQ QQ 4Q")
_HEADER_SIZE: Final = 104
_EV_HEADER = struct.Struct("<IHH")
_SAMPLE_ID = struct.Struct("<IIQQ")

PMU_TYPE_INTEL_PT: Final = 8
_PERF_TYPE_SOFTWARE: Final = 1
_PERF_COUNT_SW_DUMMY: Final = 9
ID_PT: Final = 7
ID_SIDEBAND: Final = 8

# sample_type: IP | TID | TIME | IDENTIFIER
_SAMPLE_TYPE: Final = 0x1 | 0x2 | 0x4 | 0x10000
# attr flag bits
_DISABLED, _INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 0, 1 << 1, 1 << 5, 1 << 6
_MMAP, _COMM, _ENABLE_ON_EXEC, _TASK = 1 << 8, 1 << 9, 1 << 12, 1 << 13
_SAMPLE_ID_ALL, _EXCLUDE_GUEST, _MMAP2, _COMM_EXEC = 1 << 18, 1 << 20, 1 << 23, 1 << 24
_PT_FLAGS: Final = (
    _DISABLED
    | _INHERIT
    | _EXCLUDE_KERNEL
    | _EXCLUDE_HV
    | _ENABLE_ON_EXEC
    | _SAMPLE_ID_ALL
    | _EXCLUDE_GUEST
)
_DUMMY_FLAGS: Final = _PT_FLAGS | _MMAP | _COMM | _TASK | _MMAP2 | _COMM_EXEC

# Intel PT config bits (the ones perf's decoder reads back through AUXTRACE_INFO).
PT_CONFIG_PT: Final = 1 << 0
PT_CONFIG_CYC: Final = 1 << 1
PT_CONFIG_MTC: Final = 1 << 9
PT_CONFIG_TSC: Final = 1 << 10
PT_CONFIG_NORETCOMP: Final = 1 << 11
PT_CONFIG_BRANCH: Final = 1 << 13
_MTC_FREQ_BITS: Final = 0x3C000

# record types
_COMM_T, _EXIT_T, _FORK_T, _MMAP2_T, _AUX_T, _ITRACE_START_T = 3, 4, 7, 10, 11, 12
_FINISHED_ROUND_T, _AUXTRACE_INFO_T, _AUXTRACE_T = 68, 70, 71
_MISC_USER: Final = 2
_MISC_COMM_EXEC: Final = 1 << 13
_MISC_BUILD_ID_SIZE: Final = 1 << 15
_PERF_AUXTRACE_INTEL_PT: Final = 1

# feature bits
_F_BUILD_ID, _F_OSRELEASE, _F_VERSION, _F_ARCH, _F_NRCPUS = 2, 4, 5, 6, 7
_F_CPUID, _F_CMDLINE, _F_EVENT_DESC, _F_AUXTRACE = 9, 11, 12, 18
_NAME_ALIGN: Final = 64
_PROT_READ_EXEC: Final = 5
_MAP_PRIVATE: Final = 2


@dataclass(frozen=True)
class BuildId:
    """A file's GNU build-id, for the BUILD_ID feature (``perf buildid-list`` / archive)."""

    path: str
    build_id: bytes


def _pad8(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 8)


def _cstring8(text: str) -> bytes:
    """A NUL-terminated string padded to a multiple of 8 bytes (COMM, MMAP2 file names)."""
    return _pad8(text.encode(errors="surrogateescape") + b"\0")


def _feature_string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    raw += b"\0" * (-len(raw) % _NAME_ALIGN)
    return struct.pack("<I", len(raw)) + raw


class PerfDataWriter:
    """Streams records into ``path``; call :meth:`close` to make the file valid."""

    def __init__(
        self,
        path: Path,
        model: CycleModel,
        *,
        cyc: bool = True,
        command: list[str] | None = None,
        os_release: str | None = None,
    ) -> None:
        self.path = path
        self.model = model
        self.config = (
            PT_CONFIG_PT | PT_CONFIG_BRANCH | PT_CONFIG_TSC | (PT_CONFIG_CYC if cyc else 0)
        )
        self.command = command or []
        self.os_release = os_release or os.uname().release
        self._file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._index: list[tuple[int, int]] = []
        self._file.write(b"\0" * _HEADER_SIZE)
        # ids, then the attr table, then the data section.
        self._ids_offset = _HEADER_SIZE
        self._file.write(struct.pack("<QQ", ID_PT, ID_SIDEBAND))
        self._attrs_offset = self._ids_offset + 16
        self._file.write(b"\0" * (2 * _FILE_ATTR_SIZE))
        self._data_offset = self._attrs_offset + 2 * _FILE_ATTR_SIZE
        self._pos = self._data_offset
        self._write_auxtrace_info()

    # -- plumbing ------------------------------------------------------------------------

    def _emit(self, data: bytes) -> None:
        self._file.write(data)
        self._pos += len(data)

    def _record(
        self, rtype: int, misc: int, body: bytes, pid: int, tid: int, time: int, ident: int
    ) -> None:
        size = 8 + len(body) + _SAMPLE_ID.size
        self._emit(
            _EV_HEADER.pack(rtype, misc, size) + body + _SAMPLE_ID.pack(pid, tid, time, ident)
        )

    def _attr(self, ptype: int, config: int, flags: int) -> bytes:
        return _ATTR.pack(
            ptype,
            _ATTR_SIZE,
            config,
            1,
            _SAMPLE_TYPE,
            0,
            flags,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        )

    def _write_auxtrace_info(self) -> None:
        m = self.model
        priv = [
            PMU_TYPE_INTEL_PT,
            m.time_shift,
            m.time_mult,
            0,  # time_zero
            1,  # cap_user_time_zero: timed decoding
            PT_CONFIG_TSC,
            PT_CONFIG_NORETCOMP,
            0,  # have_sched_switch
            0,  # snapshot mode
            0,  # per-cpu mmaps: no, one queue per thread
            PT_CONFIG_MTC,
            _MTC_FREQ_BITS,
            0,  # tsc_ctc_ratio_n
            0,  # tsc_ctc_ratio_d
            PT_CONFIG_CYC,
            m.ratio,  # max_non_turbo_ratio
            0,  # filter string length
        ]
        body = struct.pack("<II", _PERF_AUXTRACE_INTEL_PT, 0) + struct.pack(f"<{len(priv)}Q", *priv)
        self._emit(_EV_HEADER.pack(_AUXTRACE_INFO_T, 0, 8 + len(body)) + body)

    # -- records ---------------------------------------------------------------------------

    def comm(self, pid: int, tid: int, name: str, time: int, *, exec_: bool = True) -> None:
        misc = _MISC_USER | (_MISC_COMM_EXEC if exec_ else 0)
        body = struct.pack("<II", pid, tid) + _cstring8(name[:15])
        self._record(_COMM_T, misc, body, pid, tid, time, ID_SIDEBAND)

    def fork(self, pid: int, ppid: int, tid: int, ptid: int, time: int) -> None:
        body = struct.pack("<IIIIQ", pid, ppid, tid, ptid, time)
        self._record(_FORK_T, 0, body, pid, tid, time, ID_SIDEBAND)

    def exit(self, pid: int, ppid: int, tid: int, ptid: int, time: int) -> None:
        body = struct.pack("<IIIIQ", pid, ppid, tid, ptid, time)
        self._record(_EXIT_T, 0, body, pid, tid, time, ID_SIDEBAND)

    def mmap2(
        self, pid: int, tid: int, start: int, length: int, pgoff: int, path: str, time: int
    ) -> None:
        try:
            st = os.stat(path)
            maj, mnr, ino = os.major(st.st_dev), os.minor(st.st_dev), st.st_ino
        except OSError:
            maj = mnr = ino = 0
        body = struct.pack(
            "<IIQQQIIQQII",
            pid,
            tid,
            start,
            length,
            pgoff,
            maj,
            mnr,
            ino,
            0,
            _PROT_READ_EXEC,
            _MAP_PRIVATE,
        ) + _cstring8(path)
        self._record(_MMAP2_T, _MISC_USER, body, pid, tid, time, ID_SIDEBAND)

    def itrace_start(self, pid: int, tid: int, time: int) -> None:
        self._record(_ITRACE_START_T, 0, struct.pack("<II", pid, tid), pid, tid, time, ID_PT)

    def aux(self, pid: int, tid: int, time: int, offset: int, size: int) -> None:
        self._record(_AUX_T, 0, struct.pack("<QQQ", offset, size, 0), pid, tid, time, ID_PT)

    def auxtrace(self, idx: int, tid: int, offset: int, data: bytes, reference: int) -> int:
        """One buffer of queue ``idx``; returns its padded size (the next offset advance)."""
        data = _pad8(data)  # zero bytes are PAD packets
        header = _EV_HEADER.pack(_AUXTRACE_T, 0, 48) + struct.pack(
            "<QQQIIiI", len(data), offset, reference, idx, tid, -1, 0
        )
        self._index.append((self._pos, 48))
        self._emit(header)
        self._emit(data)
        return len(data)

    def finished_round(self) -> None:
        self._emit(_EV_HEADER.pack(_FINISHED_ROUND_T, 0, 8))

    # -- header and features -------------------------------------------------------------------

    def _event_desc(self) -> bytes:
        out = struct.pack("<II", 2, _ATTR_SIZE)
        for attr, name, ident in (
            (self._attr(PMU_TYPE_INTEL_PT, self.config, _PT_FLAGS), "intel_pt//u", ID_PT),
            (
                self._attr(_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_DUMMY, _DUMMY_FLAGS),
                "dummy:u",
                ID_SIDEBAND,
            ),
        ):
            out += attr + struct.pack("<I", 1) + _feature_string(name) + struct.pack("<Q", ident)
        return out

    def _build_ids(self, build_ids: list[BuildId]) -> bytes:
        out = b""
        for b in build_ids:
            name = b.path.encode() + b"\0"
            name += b"\0" * (-len(name) % _NAME_ALIGN)
            raw = b.build_id[:20]
            body = (
                struct.pack("<i", -1) + raw.ljust(20, b"\0") + struct.pack("<BBH", len(raw), 0, 0)
            )
            out += _EV_HEADER.pack(0, _MISC_USER | _MISC_BUILD_ID_SIZE, 8 + len(body) + len(name))
            out += body + name
        return out

    def close(self, build_ids: list[BuildId]) -> None:
        f = self._file
        data_size = self._pos - self._data_offset
        cpuid = "GenuineIntel,6,142,10"
        cmdline = struct.pack("<I", len(self.command) + 1) + b"".join(
            _feature_string(a) for a in ["ptscope", *self.command]
        )
        features = {
            _F_BUILD_ID: self._build_ids(build_ids),
            _F_OSRELEASE: _feature_string(self.os_release),
            _F_VERSION: _feature_string("6.1.0-ptscope-emulated"),
            _F_ARCH: _feature_string("x86_64"),
            _F_NRCPUS: struct.pack("<II", 1, 1),
            _F_CPUID: _feature_string(cpuid),
            _F_CMDLINE: cmdline,
            _F_EVENT_DESC: self._event_desc(),
            _F_AUXTRACE: struct.pack("<Q", len(self._index))
            + b"".join(struct.pack("<QQ", off, size) for off, size in self._index),
        }
        table_offset = self._pos
        contents_offset = table_offset + 16 * len(features)
        table = b""
        blobs = b""
        for bit in sorted(features):
            blob = features[bit]
            table += struct.pack("<QQ", contents_offset + len(blobs), len(blob))
            blobs += blob
        f.write(table + blobs)
        bitmap = [0, 0, 0, 0]
        for bit in features:
            bitmap[bit // 64] |= 1 << (bit % 64)
        # attrs: attr + {ids offset, ids size}
        f.seek(self._attrs_offset)
        f.write(self._attr(PMU_TYPE_INTEL_PT, self.config, _PT_FLAGS))
        f.write(struct.pack("<QQ", self._ids_offset, 8))
        f.write(self._attr(_PERF_TYPE_SOFTWARE, _PERF_COUNT_SW_DUMMY, _DUMMY_FLAGS))
        f.write(struct.pack("<QQ", self._ids_offset + 8, 8))
        f.seek(0)
        f.write(
            _HEADER.pack(
                b"PERFILE2",
                _HEADER_SIZE,
                _FILE_ATTR_SIZE,
                self._attrs_offset,
                2 * _FILE_ATTR_SIZE,
                self._data_offset,
                data_size,
                0,
                0,
                *bitmap,
            )
        )
        f.close()

    def abort(self) -> None:
        """Close the file without making it valid (the caller removes it)."""
        self._file.close()
