"""Read the perf.data the recorder plugin writes, and finish one whose recorder died mid-write.

The plugin (``plugin/perf_file.c``) appends records and, after each append, rewrites the
feature sections right after the data and the file header: a *checkpoint*. A QEMU process
killed inside a checkpoint leaves a file whose header no longer matches its data;
:func:`finish_perf_data` writes the checkpoint again from the shared state
(:mod:`.state`), which says where the data ends and holds the AUXTRACE index and the
build-ids. It is the Python twin of the C checkpoint: on a healthy recording both write the
same bytes (``tests/emulated/test_recorder_units.py``). The state is checked against the
file first (:func:`checked_state`: the data it gives must lie in the file and be a run of
whole records, its index must name AUXTRACE records of that data), else
:class:`RepairRefused` and nothing is written; a write that fails is undone, so a repair
leaves the perf.data either finished or as it was.

:func:`scan_sideband` lists the processes and threads a recording holds (COMM, FORK, EXIT
records), for the recording's metadata.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Final

from ptscope.record.emulated.state import EmulationState

__all__ = [
    "RepairRefused",
    "Sideband",
    "checked_state",
    "checkpoint_bytes",
    "finish_perf_data",
    "header_matches",
    "scan_sideband",
]

_HEADER_SIZE: Final = 104
_ATTR_SIZE: Final = 128
_FILE_ATTR_SIZE: Final = _ATTR_SIZE + 16
_ATTRS_OFFSET: Final = _HEADER_SIZE + 16
_DATA_OFFSET: Final = _ATTRS_OFFSET + 2 * _FILE_ATTR_SIZE
_EV_HEADER = struct.Struct("<IHH")
_NAME_ALIGN: Final = 64

_PMU_TYPE_INTEL_PT: Final = 8
_ID_PT, _ID_SIDEBAND = 7, 8
_SAMPLE_TYPE: Final = 0x1 | 0x2 | 0x4 | 0x10000
_PT_CONFIG: Final = 0x1 | 0x2 | 0x400 | 0x2000
_PT_FLAGS: Final = (1 << 0) | (1 << 1) | (1 << 5) | (1 << 6) | (1 << 12) | (1 << 18) | (1 << 20)
_DUMMY_FLAGS: Final = _PT_FLAGS | (1 << 8) | (1 << 9) | (1 << 13) | (1 << 23) | (1 << 24)

_COMM, _EXIT, _FORK, _AUXTRACE = 3, 4, 7, 71
_MISC_USER: Final = 2
_MISC_COMM_EXEC: Final = 1 << 13
_MISC_BUILD_ID_SIZE: Final = 1 << 15
_F_BUILD_ID, _F_OSRELEASE, _F_VERSION, _F_ARCH, _F_NRCPUS = 2, 4, 5, 6, 7
_F_CPUID, _F_CMDLINE, _F_EVENT_DESC, _F_AUXTRACE = 9, 11, 12, 18
_AUXTRACE_SIZE: Final = 48
_WINDOW: Final = 1 << 20


class RepairRefused(ValueError):
    """The recorder's state does not describe this perf.data: a repair from it would
    damage the file, so none is made (the message says what disagrees)."""


def _feature_string(text: str) -> bytes:
    raw = text.encode(errors="surrogateescape") + b"\0"
    raw += b"\0" * (-len(raw) % _NAME_ALIGN)
    return struct.pack("<I", len(raw)) + raw


def _attr(ptype: int, config: int, flags: int) -> bytes:
    head = struct.pack("<IIQQQQQ", ptype, _ATTR_SIZE, config, 1, _SAMPLE_TYPE, 0, flags)
    return head.ljust(_ATTR_SIZE, b"\0")


def _features(state: EmulationState, command: list[str], os_release: str) -> dict[int, bytes]:
    build_ids = b""
    for path, raw in state.build_ids:
        filename = path.encode(errors="surrogateescape") + b"\0"
        filename += b"\0" * (-len(filename) % _NAME_ALIGN)
        body = struct.pack("<i", -1) + raw.ljust(20, b"\0") + struct.pack("<BBH", len(raw), 0, 0)
        size = 8 + len(body) + len(filename)
        build_ids += _EV_HEADER.pack(0, _MISC_USER | _MISC_BUILD_ID_SIZE, size) + body + filename
    event_desc = struct.pack("<II", 2, _ATTR_SIZE)
    for attr, name, ident in (
        (_attr(_PMU_TYPE_INTEL_PT, _PT_CONFIG, _PT_FLAGS), "intel_pt//u", _ID_PT),
        (_attr(1, 9, _DUMMY_FLAGS), "dummy:u", _ID_SIDEBAND),
    ):
        event_desc += attr + struct.pack("<I", 1) + _feature_string(name) + struct.pack("<Q", ident)
    index = struct.pack("<Q", len(state.index)) + b"".join(
        struct.pack("<QQ", off, size) for off, size in state.index
    )
    cmdline = struct.pack("<I", len(command) + 1) + b"".join(
        _feature_string(a) for a in ["ptscope", *command]
    )
    return {
        _F_BUILD_ID: build_ids,
        _F_OSRELEASE: _feature_string(os_release),
        _F_VERSION: _feature_string("6.1.0-ptscope-emulated"),
        _F_ARCH: _feature_string("x86_64"),
        _F_NRCPUS: struct.pack("<II", 1, 1),
        _F_CPUID: _feature_string("GenuineIntel,6,142,10"),
        _F_CMDLINE: cmdline,
        _F_EVENT_DESC: event_desc,
        _F_AUXTRACE: index,
    }


def checkpoint_bytes(
    state: EmulationState, command: list[str], os_release: str | None = None
) -> tuple[bytes, bytes]:
    """The file header and the feature sections (table and contents) for ``state``'s data,
    exactly as the plugin writes them."""
    features = _features(state, command, os_release or os.uname().release)
    at = state.data_end
    table = b""
    blobs = b""
    bitmap = [0, 0, 0, 0]
    for bit in sorted(features):
        blob = features[bit]
        table += struct.pack("<QQ", at + 16 * len(features) + len(blobs), len(blob))
        blobs += blob
        bitmap[bit // 64] |= 1 << (bit % 64)
    header = b"PERFILE2" + struct.pack(
        "<QQ QQ QQ QQ 4Q",
        _HEADER_SIZE,
        _FILE_ATTR_SIZE,
        _ATTRS_OFFSET,
        2 * _FILE_ATTR_SIZE,
        state.data_offset,
        state.data_end - state.data_offset,
        0,
        0,
        *bitmap,
    )
    return header, table + blobs


def header_matches(fd: int, state: EmulationState) -> bool:
    """Whether the file's header says its data ends where the state says it does."""
    head = os.pread(fd, _HEADER_SIZE, 0)
    if len(head) < _HEADER_SIZE or head[:8] != b"PERFILE2":
        return False
    offset, size = struct.unpack_from("<QQ", head, 40)
    return bool(offset == state.data_offset and offset + size == state.data_end)


def _records(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(offset, type) of every record from ``start`` to ``end`` (an AUXTRACE record with
    its payload); :class:`RepairRefused` unless they end exactly at ``end``."""
    buf, base, pos = b"", start, start
    while pos < end:
        if pos - base + 16 > len(buf):
            buf, base = os.pread(fd, _WINDOW, pos), pos
        head = buf[pos - base : pos - base + 16]
        if pos + 8 > end or len(head) < 8:
            break
        rtype, _misc, step = _EV_HEADER.unpack_from(head)
        if step < 8:
            raise RepairRefused(f"the record at offset {pos} has a size of {step} bytes")
        if rtype == _AUXTRACE:
            if step < 16 or len(head) < 16:
                break
            step += struct.unpack_from("<Q", head, 8)[0]
        yield pos, rtype
        pos += step
    if pos != end:
        raise RepairRefused(
            f"its records do not end where the recorder's state says its data ends ({end})"
        )


def checked_state(fd: int, state: EmulationState) -> EmulationState:
    """``state``, checked against the perf.data open on ``fd`` before a repair writes from
    it: its data section starts where the recorder's does and ends inside the file, on a
    record boundary; its AUXTRACE index names AUXTRACE records of that data (an entry at
    or past its end, a reservation the recorder died in, is dropped). Else
    :class:`RepairRefused`."""
    size = os.fstat(fd).st_size
    if state.data_offset != _DATA_OFFSET:
        raise RepairRefused(
            f"the recorder's state says its data starts at {state.data_offset}, not {_DATA_OFFSET}"
        )
    if state.data_end > size:
        raise RepairRefused(
            f"the recorder's state says its data ends at {state.data_end}, "
            f"past the end of the file ({size} bytes)"
        )
    auxtrace = {at for at, rtype in _records(fd, state.data_offset, state.data_end)
                if rtype == _AUXTRACE}  # fmt: skip
    index = []
    for offset, length in state.index:
        if offset >= state.data_end:
            continue
        if offset not in auxtrace or length != _AUXTRACE_SIZE:
            raise RepairRefused(
                f"the recorder's state lists an AUXTRACE record at offset {offset} "
                "where the file has none"
            )
        index.append((offset, length))
    return dataclasses.replace(state, index=index)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def finish_perf_data(fd: int, state: EmulationState, command: list[str]) -> None:
    """Write the checkpoint for ``state``'s data again (the recorder died during one), on
    the perf.data open for writing on ``fd``. The state is checked first
    (:func:`checked_state`, :class:`RepairRefused`: nothing written); a write that fails
    (a full disk) or is interrupted is undone: the bytes it replaced are put back and the
    file cut to its old size."""
    state = checked_state(fd, state)
    header, features = checkpoint_bytes(state, command)
    size = os.fstat(fd).st_size
    old_header = os.pread(fd, _HEADER_SIZE, 0)
    old_tail = os.pread(fd, len(features), state.data_end)
    try:
        _write_all(fd, features, state.data_end)
        _write_all(fd, header, 0)
    except BaseException:
        with contextlib.suppress(OSError):
            _write_all(fd, old_tail, state.data_end)
            _write_all(fd, old_header, 0)
            os.ftruncate(fd, size)
        raise


@dataclass
class Sideband:
    """Processes and threads a perf.data names, with each thread's last name."""

    processes: list[int] = field(default_factory=list)
    threads: dict[int, str] = field(default_factory=dict)
    parents: dict[int, int] = field(default_factory=dict)
    """Forked processes: child pid -> parent pid."""


def scan_sideband(f: BinaryIO, data_end: int | None = None) -> Sideband:
    """Walk the data section of the perf.data open as ``f`` (to ``data_end`` when given:
    the state's word, else the header's) and collect COMM and FORK records. A record cut
    short ends the walk."""
    out = Sideband()
    f.seek(0)
    head = f.read(_HEADER_SIZE)
    if len(head) < _HEADER_SIZE or head[:8] != b"PERFILE2":
        return out
    offset, size = struct.unpack_from("<QQ", head, 40)
    end = data_end if data_end is not None else offset + size
    pos = offset
    while pos + 8 <= end:
        f.seek(pos)
        raw = f.read(16)
        if len(raw) < 8:
            break
        rtype, _misc, rsize = _EV_HEADER.unpack_from(raw)
        if rsize < 8:
            break
        if rtype == _AUXTRACE:
            if len(raw) < 16:
                break
            pos += rsize + struct.unpack_from("<Q", raw, 8)[0]
            continue
        if rtype in (_COMM, _FORK):
            f.seek(pos + 8)
            body = f.read(rsize - 8)
            if rtype == _COMM and len(body) >= 8:
                pid, tid = struct.unpack_from("<II", body)
                name = body[8:].split(b"\0", 1)[0].decode(errors="replace")
                if pid not in out.processes:
                    out.processes.append(pid)
                out.threads[tid] = name
            elif rtype == _FORK and len(body) >= 16:
                pid, ppid, tid, _ptid = struct.unpack_from("<IIII", body)
                if pid != ppid and pid == tid:
                    out.parents[pid] = ppid
                if pid not in out.processes:
                    out.processes.append(pid)
        pos += rsize
    return out
