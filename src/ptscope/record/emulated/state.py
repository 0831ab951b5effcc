"""The shared state the recorder plugin keeps beside its perf.data (``ptscope-emulation.state``).

The plugin (``plugin/perf_file.h``, ``struct emu_state``) maps this file into every QEMU
process of a recording and updates it as the program runs: one slot per traced thread
(instructions traced, clock), the AUXTRACE index and build-ids perf.data's feature
sections are made from, flags saying how the recording ended. It lives on disk, so what
it says survives QEMU being killed; ptscope reads it for progress while the program runs,
for the result afterwards, and to finish a perf.data whose recorder died in the middle of
a checkpoint (:mod:`.perf_data`). The layout is in ``docs/file-formats.md``.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ptscope.errors import BadInputError
from ptscope.recording import open_regular

__all__ = [
    "STATE_NAME",
    "EmulationState",
    "NotStarted",
    "StateError",
    "ThreadSlot",
    "read_state",
]

STATE_NAME: Final = "ptscope-emulation.state"
_MAGIC: Final = b"PTSCEMU\0"
_VERSION: Final = 1

LIMIT_REACHED: Final = 0x1
DISK_FULL: Final = 0x2
NO_REGISTERS: Final = 0x4
FAILED: Final = 0x8
EXITED: Final = 0x10

SLOT_LIVE: Final = 0x1
SLOT_EXITED: Final = 0x2

# struct emu_state, up to the error text (the mutex after it is the plugin's business).
_HEADER = struct.Struct("<8sII Q III I Q q QQ QQ Q II Q II iI Q 4Q 256s")
_SLOT = struct.Struct("<IIII QQ I")
_INDEX = struct.Struct("<QQ")
_BUILD_ID = struct.Struct("<20sB3xI8x")
_BUILD_ID_SIZE: Final = 4096
_PATH_MAX: Final = _BUILD_ID_SIZE - _BUILD_ID.size
_LIMIT: Final = 1 << 63
"""Offsets and sizes past this are damage (the file, and perf.data, are far smaller)."""


class StateError(ValueError):
    """The file is not a (complete) emulation state."""


class NotStarted(StateError):
    """There is no state, or the recorder never finished writing its header."""


@dataclass(frozen=True)
class ThreadSlot:
    """One traced thread, as the recorder last left it."""

    pid: int
    tid: int
    ptid: int
    queue: int
    insns: int
    now: int
    """The thread's clock (cycles since the start TSC)."""
    flags: int

    @property
    def exited(self) -> bool:
        return bool(self.flags & SLOT_EXITED)


@dataclass
class EmulationState:
    """What the state file says (a snapshot)."""

    flags: int
    limit: int
    data_offset: int
    data_end: int
    """The end of perf.data's data section: everything before it was written whole."""
    jit_size: int
    exit_code: int
    error: str
    threads: list[ThreadSlot] = field(default_factory=list)
    index: list[tuple[int, int]] = field(default_factory=list)
    """File offset and size of every AUXTRACE record (the AUXTRACE feature)."""
    build_ids: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def instructions(self) -> int:
        return sum(t.insns for t in self.threads)

    @property
    def pids(self) -> list[int]:
        """The processes, in the order their first thread started."""
        return list(dict.fromkeys(t.pid for t in self.threads))

    def has(self, flag: int) -> bool:
        return bool(self.flags & flag)


def read_state(directory: Path, *, details: bool = True) -> EmulationState:
    """Read ``directory``'s state file; ``details=False`` skips the index and build-ids
    (progress reports need only the slots)."""
    path = directory / STATE_NAME
    try:
        fd = open_regular(path)  # never a link, a FIFO (no hang) or a device
    except OSError as e:
        raise NotStarted(f"{path}: {e.strerror or e}") from e
    except BadInputError as e:
        raise StateError(e.message) from e
    try:
        size = os.fstat(fd).st_size
        if size < _HEADER.size:
            raise NotStarted(f"{path}: too short")
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as m:
            return _parse(path, m, details)
    finally:
        os.close(fd)


def _table(
    path: Path, what: str, offset: int, count: int, capacity: int, entry: int, size: int
) -> None:
    """Refuse a table of the state (``count`` entries of ``entry`` bytes at ``offset``,
    room for ``capacity``) that holds more than it has room for or does not lie inside the
    file's ``size`` bytes."""
    if count > capacity:
        raise StateError(f"{path} is damaged: its {what} holds {count} entries of {capacity}")
    if count and (offset >= _LIMIT or offset + count * entry > size):
        raise StateError(
            f"{path} is damaged: its {what} ({count} entries at offset {offset}) "
            f"runs past the end of the file ({size} bytes)"
        )


def _parse(path: Path, m: mmap.mmap, details: bool) -> EmulationState:
    (
        magic,
        version,
        _header_size,
        slots_offset,
        slot_size,
        slot_capacity,
        slot_count,
        flags,
        limit,
        _budget_left,
        data_offset,
        data_end,
        _queues,
        jit_size,
        index_offset,
        index_capacity,
        index_count,
        ids_offset,
        ids_capacity,
        ids_count,
        exit_code,
        _reserved0,
        _written_end,
        *_reserved,
        error,
    ) = _HEADER.unpack_from(m, 0)
    if magic != _MAGIC:
        raise NotStarted(f"{path} is not a ptscope emulation state (or the recorder never started)")
    if version > _VERSION:
        raise StateError(f"{path} was written by a newer ptscope (state version {version})")
    size = len(m)
    if not data_offset <= data_end < _LIMIT:
        raise StateError(
            f"{path} is damaged: the perf.data data section it gives "
            f"({data_offset} to {data_end}) is impossible"
        )
    if slot_size < _SLOT.size:
        raise StateError(f"{path} is damaged: its thread slots are {slot_size} bytes")
    slot_count = min(slot_count, slot_capacity)
    threads = []
    for k in range(slot_count):
        at = slots_offset + k * slot_size
        if at + _SLOT.size > size:
            break
        pid, tid, ptid, queue, insns, now, slot_flags = _SLOT.unpack_from(m, at)
        if not slot_flags & SLOT_LIVE:
            continue  # handed out, not filled in yet (or the recorder died in between)
        threads.append(ThreadSlot(pid, tid, ptid, queue, insns, now, slot_flags))
    state = EmulationState(
        flags=flags,
        limit=limit,
        data_offset=data_offset,
        data_end=data_end,
        jit_size=jit_size,
        exit_code=exit_code,
        error=error.split(b"\0", 1)[0].decode(errors="replace"),
        threads=threads,
    )
    if details:
        _table(path, "AUXTRACE index", index_offset, index_count, index_capacity, _INDEX.size, size)
        for k in range(index_count):
            state.index.append(_INDEX.unpack_from(m, index_offset + k * _INDEX.size))
        _table(path, "build-id table", ids_offset, ids_count, ids_capacity, _BUILD_ID_SIZE, size)
        for k in range(ids_count):
            at = ids_offset + k * _BUILD_ID_SIZE
            raw, length, path_len = _BUILD_ID.unpack_from(m, at)
            if not (0 < length <= len(raw) and 0 < path_len <= _PATH_MAX):
                raise StateError(
                    f"{path} is damaged: build-id {k} has {length} bytes and a path of "
                    f"{path_len} bytes (1 to {len(raw)} and 1 to {_PATH_MAX})"
                )
            name = m[at + _BUILD_ID.size : at + _BUILD_ID.size + path_len]
            state.build_ids.append((name.decode(errors="surrogateescape"), raw[:length]))
    return state
