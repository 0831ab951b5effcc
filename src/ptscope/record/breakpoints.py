"""Hardware-breakpoint triggers on every thread of a process, through ``perf_event_open``.

One execute breakpoint (``PERF_TYPE_BREAKPOINT``, ``HW_BREAKPOINT_X``) per address is
opened for each thread and each CPU, with ``inherit`` so that every thread created later
by a traced thread carries it too (magic-trace put its breakpoint on the main thread only:
its issue #274). The kernel refuses to mmap inherited per-task events, but accepts per-CPU
ones, hence one event per (thread, CPU); all events of a CPU write into that CPU's ring
buffer (``PERF_EVENT_IOC_SET_OUTPUT``). Each hit is a ``PERF_RECORD_SAMPLE`` with the
address, pid/tid and perf-clock time, read from the rings by :meth:`BreakpointSet.read_hits`.
The program is not stopped: a hit costs it one debug exception, plus a wake-up of the
reader when hits take snapshots (both measured in ``bench/startup.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import mmap
import os
import resource
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ptscope.errors import RecordingError
from ptscope.record.session import Hit

__all__ = ["Breakpoint", "BreakpointSet", "PerfEventAttr", "online_cpus"]

log = logging.getLogger(__name__)

_NR_PERF_EVENT_OPEN: Final = 298  # x86-64
_PERF_TYPE_BREAKPOINT: Final = 5
_HW_BREAKPOINT_X: Final = 4
_PERF_FLAG_FD_CLOEXEC: Final = 8
_SAMPLE_IP: Final = 1 << 0
_SAMPLE_TID: Final = 1 << 1
_SAMPLE_TIME: Final = 1 << 2
_ATTR_DISABLED: Final = 1 << 0
_ATTR_INHERIT: Final = 1 << 1
_ATTR_EXCLUDE_KERNEL: Final = 1 << 5
_ATTR_EXCLUDE_HV: Final = 1 << 6
_IOC_ENABLE: Final = 0x2400
_IOC_DISABLE: Final = 0x2401
_IOC_SET_OUTPUT: Final = 0x2405
_RECORD_LOST: Final = 2
_RECORD_SAMPLE: Final = 9
_HEAD_OFFSET: Final = 1024  # perf_event_mmap_page.data_head
_TAIL_OFFSET: Final = 1032  # perf_event_mmap_page.data_tail
_HEADER: Final = struct.Struct("<IHH")
_SAMPLE: Final = struct.Struct("<QIIQ")  # ip, pid, tid, time
_U64: Final = struct.Struct("<Q")


class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to ``PERF_ATTR_SIZE_VER5`` (112 bytes)."""

    _fields_ = (
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("bp_addr", ctypes.c_uint64),
        ("bp_len", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
    )


@dataclass(frozen=True)
class Breakpoint:
    """An address to trigger on, with the label hits are reported under."""

    address: int
    label: str


def online_cpus() -> list[int]:
    """CPU numbers from ``/sys/devices/system/cpu/online`` (``0-3,8``)."""
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return list(range(os.cpu_count() or 1))
    cpus: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _thread_ids(pid: int) -> list[int]:
    try:
        return sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def _raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class _Ring:
    """One CPU's ring buffer (the mmap of its first event)."""

    def __init__(self, fd: int, data_pages: int) -> None:
        page = mmap.PAGESIZE
        self.fd = fd
        self.data_size = data_pages * page
        self.map = mmap.mmap(
            fd, (1 + data_pages) * page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE
        )
        self.page = page

    def records(self) -> list[tuple[int, bytes]]:
        m = self.map
        head = _U64.unpack_from(m, _HEAD_OFFSET)[0]
        tail = _U64.unpack_from(m, _TAIL_OFFSET)[0]
        out: list[tuple[int, bytes]] = []
        while tail < head:
            body = self._read(tail, _HEADER.size)
            rtype, _misc, size = _HEADER.unpack(body)
            if size < _HEADER.size:
                tail = head  # corrupt: drop what is there rather than loop forever
                break
            out.append((rtype, self._read(tail + _HEADER.size, size - _HEADER.size)))
            tail += size
        _U64.pack_into(m, _TAIL_OFFSET, tail)
        return out

    def _read(self, position: int, length: int) -> bytes:
        start = self.page + position % self.data_size
        end = start + length
        limit = self.page + self.data_size
        if end <= limit:
            return self.map[start:end]
        return self.map[start:limit] + self.map[self.page : self.page + end - limit]

    def close(self) -> None:
        self.map.close()


class BreakpointSet:
    """Execute breakpoints on every thread of some processes (and of their new threads)."""

    def __init__(
        self,
        breakpoints: Sequence[Breakpoint],
        *,
        data_pages: int = 4,
        wake_each_hit: bool = True,
    ) -> None:
        if not breakpoints:
            raise ValueError("no breakpoint")
        if len(breakpoints) > 4:
            raise RecordingError("at most 4 trigger addresses (x86 has 4 debug registers)")
        self.breakpoints = list(breakpoints)
        self.data_pages = data_pages
        # Waking the reader on every hit gets a snapshot taken soonest, but the wake-up
        # is paid by the traced program on each hit; when hits are only marked (no
        # snapshot), the reader is woken at half a buffer and drains on its own schedule.
        self.wake_each_hit = wake_each_hit
        # Per process: each process has its own address space (and load bias).
        self._per_process: dict[int, list[Breakpoint]] = {}
        self._labels: dict[tuple[int, int], str] = {}
        self._events: list[int] = []
        self._rings: dict[int, _Ring] = {}
        self._armed: set[tuple[int, int]] = set()
        self.lost = 0
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._cpus = online_cpus()

    def _open(self, bp: Breakpoint, tid: int, cpu: int) -> int:
        attr = PerfEventAttr()
        attr.type = _PERF_TYPE_BREAKPOINT
        attr.size = ctypes.sizeof(PerfEventAttr)
        attr.sample_period = 1
        attr.sample_type = _SAMPLE_IP | _SAMPLE_TID | _SAMPLE_TIME
        attr.flags = _ATTR_INHERIT | _ATTR_EXCLUDE_KERNEL | _ATTR_EXCLUDE_HV
        attr.wakeup_events = 1 if self.wake_each_hit else 0
        attr.bp_type = _HW_BREAKPOINT_X
        attr.bp_addr = bp.address
        attr.bp_len = ctypes.sizeof(ctypes.c_long)
        fd: int = self._libc.syscall(
            _NR_PERF_EVENT_OPEN, ctypes.byref(attr), tid, cpu, -1, _PERF_FLAG_FD_CLOEXEC
        )
        if fd < 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:
                return -1  # the thread ended meanwhile
            raise _open_error(err, bp, tid)
        return fd

    def _arm_thread(self, tid: int, breakpoints: Sequence[Breakpoint]) -> None:
        for bp in breakpoints:
            if (tid, bp.address) in self._armed:
                continue
            for cpu in self._cpus:
                fd = self._open(bp, tid, cpu)
                if fd < 0:
                    return
                self._events.append(fd)
                ring = self._rings.get(cpu)
                if ring is None:
                    self._rings[cpu] = _Ring(fd, self.data_pages)
                else:
                    fcntl.ioctl(fd, _IOC_SET_OUTPUT, ring.fd)
            self._armed.add((tid, bp.address))

    def arm(
        self, pids: Sequence[int], per_process: dict[int, list[Breakpoint]] | None = None
    ) -> None:
        """Arm every current thread of ``pids``; threads they create inherit the events.

        ``per_process`` gives a process its own addresses (another executable, another
        load bias); the others get the breakpoints the set was made with.
        """
        _raise_fd_limit()
        for pid in pids:
            breakpoints = (per_process or {}).get(pid, self.breakpoints)
            if len(breakpoints) > 4:
                raise RecordingError("at most 4 trigger addresses (x86 has 4 debug registers)")
            self._per_process[pid] = list(breakpoints)
            for bp in breakpoints:
                self._labels[(pid, bp.address)] = bp.label
            # A thread created while we arm may have been cloned from a thread not yet
            # armed: list again until no new thread shows up.
            for _ in range(100):
                tids = [t for t in _thread_ids(pid) if not self._thread_armed(t, breakpoints)]
                if not tids:
                    break
                for tid in tids:
                    self._arm_thread(tid, breakpoints)
        log.info(
            "%d breakpoint event(s) armed on %d thread(s)", len(self._events), len(self._armed)
        )

    def _thread_armed(self, tid: int, breakpoints: Sequence[Breakpoint]) -> bool:
        return all((tid, bp.address) in self._armed for bp in breakpoints)

    def fds(self) -> list[int]:
        return [ring.fd for ring in self._rings.values()]

    def read_hits(self) -> list[Hit]:
        hits: list[Hit] = []
        for ring in self._rings.values():
            for rtype, body in ring.records():
                if rtype == _RECORD_SAMPLE and len(body) >= _SAMPLE.size:
                    ip, pid, tid, time = _SAMPLE.unpack_from(body)
                    label = self._labels.get((pid, ip), f"{ip:#x}")
                    hits.append(Hit(time, pid, tid, ip, label))
                elif rtype == _RECORD_LOST and len(body) >= 16:
                    self.lost += _U64.unpack_from(body, 8)[0]
        hits.sort(key=lambda h: h.time)
        return hits

    def disable(self) -> None:
        for fd in self._events:
            with contextlib.suppress(OSError):
                fcntl.ioctl(fd, _IOC_DISABLE, 0)

    def enable(self) -> None:
        for fd in self._events:
            with contextlib.suppress(OSError):
                fcntl.ioctl(fd, _IOC_ENABLE, 0)

    def close(self) -> None:
        for ring in self._rings.values():
            ring.close()
        for fd in self._events:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._rings.clear()
        self._events.clear()

    def __enter__(self) -> BreakpointSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_error(err: int, bp: Breakpoint, tid: int) -> RecordingError:
    what = f"cannot set a breakpoint on {bp.label} ({bp.address:#x}) in thread {tid}"
    if err in (errno.EACCES, errno.EPERM):
        return RecordingError(
            f"{what}: permission denied",
            hint="run as root, or trace your own processes (see: ptscope doctor)",
        )
    if err == errno.ENOSPC:
        return RecordingError(
            f"{what}: no free debug register",
            hint="x86 has 4 per thread; a debugger or another tracer may be using them",
        )
    if err == errno.EMFILE:
        return RecordingError(f"{what}: too many open files", hint="raise ulimit -n")
    if err == errno.ENOENT or err == errno.EOPNOTSUPP:
        return RecordingError(f"{what}: this kernel has no hardware breakpoints")
    return RecordingError(f"{what}: {os.strerror(err)}")
