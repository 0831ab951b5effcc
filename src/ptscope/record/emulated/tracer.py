"""Turn QEMU's block log into per-thread PT streams and perf sideband (the emulation state machine).

Input, in log order: runs of executed blocks (CPU slot, PC, cflags) and raw lines (``in_asm``
block listings, the ``page`` dump, ``strace`` lines, signal notes). Output: calls on a
:class:`~.perf_data.PerfDataWriter` — COMM / FORK / MMAP2 / ITRACE_START / EXIT records and
per-thread AUXTRACE buffers produced by one :class:`~.pt_encoder.PtEncoder` per thread.

How control reached each block is derived from the previous block of the same thread:

* the previous block's last instruction decides what was expected (fall-through, the
  direct target, either for a conditional jump, anything after an indirect branch);
* a ``rep`` string instruction repeats as the same one-instruction block: counted once;
* a block starting inside the previous one (at an instruction boundary) means the previous
  block stopped early (QEMU leaves a block before an exclusive atomic instruction);
* a signal is delivered where QEMU logged ``--- SIGxxx`` and the thread's next block is not
  where the program was going: FUP(interrupted IP) + TIP.PGD, then TIP.PGE at the handler.
  When the interrupted branch's outcome is unknown (a conditional or indirect branch ended
  the block), the thread's blocks are held back until ``rt_sigreturn`` reveals where the
  program resumed;
* after a system call the trace restarts where the thread continues (its next instruction,
  a signal handler, or the point a signal handler returns to).

Threads: QEMU numbers the CPUs of live guest threads (``Trace N``). With the thread plugin
(``qemu_thread_plugin.c``) each thread names its slot and tid itself at its first system
call and says when it exits; without it, a slot is bound to the tid returned by the
``clone`` that created it, and freed by the thread's ``exit``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

import numpy as np

from ptscope.errors import RecordingError
from ptscope.record.emulated.cycle_model import CycleModel
from ptscope.record.emulated.elf_image import ElfImage, load_bias, read_elf
from ptscope.record.emulated.jit_code import JIT_CODE_FILE, JitCodeFile, JitPages
from ptscope.record.emulated.perf_data import BuildId, PerfDataWriter
from ptscope.record.emulated.pt_encoder import PtEncoder
from ptscope.record.emulated.qemu import BlockRun, LogFormatError, LogSplitter
from ptscope.record.emulated.x86 import InsnKind, classify, split_block

__all__ = ["EmulationState", "Ending", "ThreadInfo"]

log = logging.getLogger(__name__)

# Plain ints: IntEnum comparisons cost several times more in the hot loop.
_OTHER, _COND, _JUMP, _CALL = (
    int(k) for k in (InsnKind.OTHER, InsnKind.COND, InsnKind.JUMP, InsnKind.CALL)
)
_JUMP_IND, _CALL_IND, _RET = (
    int(k) for k in (InsnKind.JUMP_INDIRECT, InsnKind.CALL_INDIRECT, InsnKind.RET)
)
_SYSCALL, _OTHER_IND = int(InsnKind.SYSCALL), int(InsnKind.OTHER_INDIRECT)
_REP, _ZERO_CALL = 1, 2
_ANON = 4
"""The block is in memory no file backs (JIT code): its bytes go to the JIT code file."""
_SLOW = 8
"""Arriving at the block leaves the fast loop (a system call, or anonymous code)."""
_AUX_CHUNK: Final = 1 << 20
_PROGRESS_STEP: Final = 1_000_000
_MASK48: Final = (1 << 48) - 1
_STASH_LIMIT: Final = 1 << 20
_SIDEBAND_LEAD_NS: Final = 10_000
_FAULT_SIGNALS: Final = frozenset({"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGTRAP", "SIGSYS"})

_STRACE_RE: Final = re.compile(rb"^(\d+) (\w+)\(")
_RESULT_RE: Final = re.compile(rb"^ = (-?\w+)")
_SIGNAL_RE: Final = re.compile(rb"^--- (SIG\w+) \{(.*)\} ---")
_RESULT_WANTED: Final = frozenset({b"clone", b"mmap", b"openat", b"open", b"fork", b"vfork"})
_STOPPED_RE: Final = re.compile(rb"\[([0-9a-f]+)\]")
_PATH_ARG_RE: Final = re.compile(rb'"((?:[^"\\]|\\.)*)"')


def _put_cyc(out: bytearray, cycles: int) -> None:
    """A CYC packet of 32 cycles or more (the short form is written inline)."""
    out.append(((cycles & 0x1F) << 3) | 0x07)
    cycles >>= 5
    while True:
        more = cycles >> 7
        out.append(((cycles & 0x7F) << 1) | (1 if more else 0))
        if not more:
            return
        cycles = more


def _tip(ip: int, last: int) -> bytes:
    """A TIP packet for ``ip``, compressed against the last IP."""
    x = ip ^ last
    if x >> 32 == 0:
        return bytes((0x4D,)) + (ip & 0xFFFFFFFF).to_bytes(4, "little")
    if x >> 48 == 0:
        return bytes((0x8D,)) + (ip & _MASK48).to_bytes(6, "little")
    if ip < 1 << 47:
        return bytes((0x6D,)) + ip.to_bytes(6, "little")
    return bytes((0xCD,)) + ip.to_bytes(8, "little")


def _closing_paren(text: bytes) -> int:
    """Index of the ``)`` that closes a strace argument list (quotes and nesting skipped)."""
    depth = 0
    quoted = False
    i = 0
    n = len(text)
    while i < n:
        c = text[i]
        if quoted:
            if c == 0x5C:  # backslash
                i += 1
            elif c == 0x22:
                quoted = False
        elif c == 0x22:
            quoted = True
        elif c == 0x28:
            depth += 1
        elif c == 0x29:
            if depth == 0:
                return i
            depth -= 1
        i += 1
    return n


class Arrival(IntEnum):
    """How control reached a block (see the module docstring)."""

    NORMAL = 0
    DELIVERY = 1
    """A signal handler starts here."""
    RESUME = 2
    """After a system call (``rt_sigreturn`` or a plain return elsewhere)."""
    DISCONTINUITY = 3
    """Unexplained jump with no branch: encoded like an interrupt."""
    REDELIVERY = 4
    """A handler starts right as ``rt_sigreturn`` returns (the next pending signal)."""


@dataclass
class ThreadInfo:
    """One traced guest thread: its identity, PT stream and bookkeeping."""

    pid: int
    tid: int
    ptid: int
    name: str
    queue: int
    enc: PtEncoder
    start_ns: int
    prev: int = -1
    in_syscall: bool = False
    syscall_seq: int = 0
    exited: bool = False
    sig_depth: int = 0
    aux_offset: int = 0
    stash: list[tuple[int, Arrival]] | None = None
    deferred: tuple[int, int] | None = None
    stash_depth: int = 0
    end_ns: int = 0
    last_arrival: int = 0
    syscall_undo: tuple[int, ...] | None = None


@dataclass
class Ending:
    """How the traced program ended, as far as the log tells."""

    exit_code: int | None = None
    fatal_signal: str | None = None
    fault: bool = False
    signals_seen: list[str] = field(default_factory=list)


@dataclass
class Session:
    """What every traced process of one recording shares: the output and the budget."""

    writer: PerfDataWriter
    model: CycleModel
    psb_period: int = 4096
    max_instructions: int | None = None
    progress: Callable[[int], None] | None = None
    insns: int = 0
    """Instructions traced in all processes."""
    queues: int = 0
    stopped_at_limit: bool = False
    images: dict[str, ElfImage] = field(default_factory=dict)
    processes: list[EmulationState] = field(default_factory=list)
    jit_file: JitCodeFile | None = None

    def jit_code_file(self) -> JitCodeFile:
        """The recording's file of anonymous code (made when some first runs)."""
        if self.jit_file is None:
            self.jit_file = JitCodeFile(self.writer.path.with_name(JIT_CODE_FILE))
        return self.jit_file

    def writer_flush(self) -> None:
        """Move full PT buffers of every thread to the file (bounded memory)."""
        for process in self.processes:
            process.flush_buffers()

    def next_queue(self) -> int:
        self.queues += 1
        return self.queues - 1


@dataclass(frozen=True)
class Fork:
    """A process the traced program forked: who, when, from which thread."""

    pid: int
    ptid: int
    now: int


class EmulationState:
    """Consumes the split QEMU log of one process and writes its perf.data records."""

    def __init__(
        self,
        session: Session,
        *,
        pid: int,
        program: ElfImage,
        comm: str,
        cwd: str,
        parent: EmulationState | None = None,
        fork: Fork | None = None,
    ) -> None:
        self.session = session
        session.processes.append(self)
        self.writer = session.writer
        model = self.model = session.model
        self.pid = pid
        self.program = program
        self.comm = comm
        self.cwd = cwd
        self.psb_period = session.psb_period
        self.cpi = model.cycles_per_insn
        self.t0_ns = model.tsc_to_ns(model.start_tsc)
        # blocks
        self.tb_index: dict[tuple[int, int], int] = {}
        self.tb_pc: list[int] = []
        self.tb_n: list[int] = []
        self.tb_kind: list[int] = []
        self.tb_last: list[int] = []
        self.tb_end: list[int] = []
        self.tb_target: list[int] = []
        self.tb_flags: list[int] = []
        self.tb_insns: list[tuple[int, ...]] = []
        self._pending_tb: dict[int, list[tuple[int, bytes]]] = {}
        self._asm: list[tuple[int, bytes]] | None = None
        # threads
        self.threads: list[ThreadInfo] = []
        self.by_cpu: dict[int, ThreadInfo] = {}
        self._clone_tids: deque[int] = deque()
        self._unnamed: deque[ThreadInfo] = deque()
        self._next_placeholder = -1
        self._plugin_names_threads = False
        """The thread plugin's lines were seen: they, not clone results, name threads."""
        # process sideband
        self._page: dict[str, int] = {}
        self._started = False
        self._fds: dict[int, str] = {}
        self._pending_calls: list[tuple[bytes, bytes]] = []
        self._signal_hint: str | None = None
        self._sigreturn_hint = False
        self.handler_entries: set[int] = set()
        self.mappings: list[tuple[int, int, int, str]] = []
        self.images = session.images
        self.insns = 0
        self.ending = Ending()
        self._syscall_seq = 0
        self._arrivals = 0
        self._next_progress = 0
        self._cflags_class: dict[int, int] = {}
        self._sorted_keys = np.empty(0, dtype=np.uint64)
        self._sorted_ids = np.empty(0, dtype=np.int64)
        self._recent: dict[int, int] = {}
        self._keys_of_pc: dict[int, list[tuple[int, int]]] = {}
        self._empty: dict[int, int] = {}
        self.forks: list[Fork] = []
        self.parent = parent
        self.fork = fork
        self.jit: JitPages | None = None
        if parent is not None:
            # A forked child starts with its parent's code, descriptors and translations.
            self._started = True
            for name in ("tb_pc", "tb_n", "tb_kind", "tb_last", "tb_end", "tb_target"):
                setattr(self, name, list(getattr(parent, name)))
            self.tb_flags = list(parent.tb_flags)
            self.tb_insns = list(parent.tb_insns)
            self.tb_index = dict(parent.tb_index)
            self._cflags_class = dict(parent._cflags_class)
            self._sorted_keys = parent._sorted_keys.copy()
            self._sorted_ids = parent._sorted_ids.copy()
            self._recent = dict(parent._recent)
            self._keys_of_pc = {pc: list(keys) for pc, keys in parent._keys_of_pc.items()}
            self._pending_tb = dict(parent._pending_tb)
            self._fds = dict(parent._fds)
            self.handler_entries = set(parent.handler_entries)
            self.mappings = list(parent.mappings)
            self._plugin_names_threads = parent._plugin_names_threads
            self.jit = parent.jit.copy() if parent.jit is not None else None

    # -- blocks ------------------------------------------------------------------------

    def _listed(self, asm: list[tuple[int, bytes]]) -> None:
        """QEMU translated (again) the block at ``asm[0]``: the next execution of that PC
        under new flags, or of a block that was invalidated, is this listing."""
        pc = asm[0][0]
        self._pending_tb[pc] = asm
        for key in self._keys_of_pc.pop(pc, ()):
            # Forget the old translation: the code at pc may have changed (dlclose/dlopen).
            self.tb_index.pop(key, None)
            packed = (self._cflags_class.get(key[1], -1) << 56) | (pc & ((1 << 56) - 1))
            self._recent.pop(packed, None)
            pos = int(np.searchsorted(self._sorted_keys, np.uint64(packed)))
            if pos < len(self._sorted_keys) and int(self._sorted_keys[pos]) == packed:
                self._sorted_ids[pos] = -1

    def _define(self, key: tuple[int, int], asm: list[tuple[int, bytes]]) -> int:
        self._keys_of_pc.setdefault(key[0], []).append(key)
        tb = len(self.tb_pc)
        insns = [classify(pc, code) for pc, code in split_block(asm)]
        last = insns[-1]
        flags = (_REP if last.rep else 0) | (_ZERO_CALL if last.zero_call else 0)
        if last.kind == InsnKind.SYSCALL:
            flags |= _SLOW
        if not self._file_backed(insns[0].pc):
            flags |= _ANON | _SLOW
            self._jit_code(asm)
        self.tb_index[key] = tb
        self.tb_pc.append(insns[0].pc)
        self.tb_n.append(len(insns))
        self.tb_kind.append(int(last.kind))
        self.tb_last.append(last.pc)
        self.tb_end.append(last.end)
        self.tb_target.append(-1 if last.target is None else last.target)
        self.tb_flags.append(flags)
        self.tb_insns.append(tuple(i.pc for i in insns))
        return tb

    def _file_backed(self, pc: int) -> bool:
        return any(start <= pc < start + size for start, size, _, _ in self.mappings)

    def _jit_code(self, asm: list[tuple[int, bytes]]) -> None:
        """Code no file holds: into the JIT code file, its pages mapped for perf."""
        if self.jit is None:
            self.jit = JitPages(self.session.jit_code_file())
        path = str(self.jit.file.path)

        def map_page(address: int, offset: int) -> None:
            tid = self.threads[0].tid if self.threads else self.pid
            self.writer.mmap2(self.pid, tid, address, 4096, offset, path, self._mmap_time())

        self.jit.add(asm, map_page)

    def _lookup_missing(self, pc: int, cflags: int) -> int:
        asm = self._pending_tb.pop(pc, None)
        if asm is not None:
            return self._define((pc, cflags), asm)
        # No listing: QEMU ran a known block under other flags; the code is the same.
        for key in self._keys_of_pc.get(pc, ()):
            tb = self.tb_index[key]
            self.tb_index[(pc, cflags)] = tb
            self._keys_of_pc[pc].append((pc, cflags))
            return tb
        raise LogFormatError(f"QEMU executed a block at {pc:#x} that its in_asm log never listed")

    # -- raw lines -----------------------------------------------------------------------

    def line(self, raw: bytes) -> None:
        plugin = raw.find(b"ptscope-qemu-")
        if plugin >= 0:
            # The thread plugin's line, written whole but maybe after part of another line.
            self._plugin_line(raw[plugin:])
            raw = raw[:plugin]
            if not raw:
                return
        asm = self._asm
        if asm is not None:
            if raw.startswith(b"0x"):
                colon = raw.find(b":")
                pc = int(raw[2:colon], 16)
                field_ = raw[colon + 3 : colon + 26]
                text = raw[colon + 28 :].strip()
                code = bytes.fromhex(field_.decode())
                if not text and asm and asm[-1][0] + len(asm[-1][1]) == pc:
                    asm[-1] = (asm[-1][0], asm[-1][1] + code)  # a long instruction, wrapped
                else:
                    if not code:
                        raise LogFormatError(
                            "QEMU's in_asm log shows no instruction bytes "
                            f"(line {raw[:60]!r}); a QEMU built with capstone is needed"
                        )
                    asm.append((pc, code))
                return
            if not raw.strip():
                if asm:
                    self._listed(asm)
                self._asm = None
                return
            # Anything else ends the listing (defensive: QEMU always ends it with a blank line).
            if asm:
                self._listed(asm)
            self._asm = None
        if raw.startswith(b"IN:"):
            self._asm = []
            return
        if raw.startswith(b"Trace "):  # a block line that shared a line with a strace call
            for item in LogSplitter().feed(raw + b"\n"):
                if isinstance(item, BlockRun):
                    self.blocks(item)
            return
        c = raw[:1]
        if c.isdigit():
            self._strace(raw)
        elif raw.startswith(b" = "):
            self._strace_result(raw)
        elif raw.startswith(b"--- SIG"):
            self._signal(raw)
        elif raw.startswith(b"Stopped execution of TB chain before"):
            m = _STOPPED_RE.search(raw)
            if m:
                self._cancel(int(m.group(1), 16))
        elif not self._started and (raw.startswith(b"start_code") or raw.startswith(b"entry")):
            name, _, value = raw.partition(b" ")
            self._page[name.decode()] = int(value.strip(), 16)

    def _signal(self, raw: bytes) -> None:
        m = _SIGNAL_RE.match(raw)
        if not m:
            return
        name = m.group(1).decode()
        self._signal_hint = name
        self.ending.signals_seen.append(name)
        info = m.group(2)
        code = re.search(rb"si_code=(-?\w+)", info)
        # si_code > 0 (or a SEGV_/BUS_/FPE_/ILL_ name): a fault raised by an instruction.
        if name in _FAULT_SIGNALS and code is not None and not code.group(1).startswith(b"SI_"):
            try:
                fault = int(code.group(1)) > 0
            except ValueError:
                fault = True
            if fault:
                self.ending.fault = True
                self.ending.fatal_signal = name

    def _strace(self, raw: bytes) -> None:
        m = _STRACE_RE.match(raw)
        if not m:
            return
        name = m.group(2)
        rest = raw[m.end() :]
        close = _closing_paren(rest)
        args = rest[:close]
        result: bytes | None = None
        if rest.startswith(b" = ", close + 1):
            result = rest[close + 4 :].split(b" ", 1)[0]
        elif close + 1 < len(rest):
            # QEMU prints the result when the call returns; other output (another thread's
            # blocks, the page dump) may land on the same line in between.
            self.line(rest[close + 1 :])
        if int(m.group(1)) != self.pid:
            return  # a forked child's system call
        if result is None:
            if name in _RESULT_WANTED:
                self._pending_calls.append((name, args))
                del self._pending_calls[:-64]  # results that never came are forgotten
            if name in (b"exit", b"exit_group"):
                self._thread_exit(name == b"exit_group", args)
            elif name == b"rt_sigreturn":
                self._sigreturn_hint = True
            return
        self._syscall_done(name, args, result)

    def _strace_result(self, raw: bytes) -> None:
        m = _RESULT_RE.match(raw)
        pending = self._pending_calls
        if not m or not pending:
            return
        # Results arrive in completion order, not call order (threads). The calls whose
        # results matter are short, so the most recent one is the best guess -- among those
        # the value fits: an address for mmap, a small descriptor for open, a tid for clone.
        try:
            value = int(m.group(1), 0)
        except ValueError:
            value = -1
        fits = {b"mmap": value >= 1 << 16, b"openat": 0 <= value < 1 << 16}
        fits[b"open"] = fits[b"openat"]
        for k in range(len(pending) - 1, -1, -1):
            if fits.get(pending[k][0], True) or value < 0:
                name, args = pending.pop(k)
                self._syscall_done(name, args, m.group(1))
                return

    def _syscall_done(self, name: bytes, args: bytes, result: bytes) -> None:
        if name == b"rt_sigreturn":
            self._sigreturn_hint = True
            return
        try:
            value = int(result, 0)
        except ValueError:
            return
        if name in (b"openat", b"open"):
            m = _PATH_ARG_RE.search(args)
            if m and value >= 0:
                path = m.group(1).decode(errors="surrogateescape")
                self._fds[value] = os.path.normpath(os.path.join(self.cwd, path))
        elif name == b"close":
            with contextlib.suppress(ValueError):
                self._fds.pop(int(args, 0), None)
        elif name == b"mmap" and value >= 0:
            parts = args.split(b",")
            if len(parts) == 6 and b"PROT_EXEC" in parts[2]:
                try:
                    fd, offset, length = int(parts[4], 0), int(parts[5], 0), int(parts[1], 0)
                except ValueError:
                    return
                path = self._fds.get(fd)
                if fd >= 0 and path:
                    self._map_file(value, length, offset, path)
        elif name == b"clone" and value > 0 and b"CLONE_THREAD" in args:
            self._clone_tids.append(value)
            while self._unnamed and self._clone_tids and not self._plugin_names_threads:
                self._name_thread(self._unnamed.popleft(), self._clone_tids.popleft())
        elif name in (b"clone", b"fork", b"vfork") and value > 0:
            forker = self._last_in_syscall()
            if forker is not None:
                self.forks.append(Fork(value, forker.tid, forker.enc.now))
        elif name == b"exit_group" or name == b"exit":
            pass

    # -- mappings --------------------------------------------------------------------------

    def _image(self, path: str) -> ElfImage | None:
        image = self.images.get(path)
        if image is None:
            try:
                image = read_elf(path)
            except Exception as e:
                log.debug("cannot read %s: %s", path, e)
                return None
            self.images[path] = image
        return image

    def _mmap_time(self) -> int:
        live = [t.enc.now for t in self.threads if not t.exited]
        now = min(live) if live else 0
        return self.model.tsc_to_ns(self.model.start_tsc + now) - 1

    def _map_file(self, addr: int, length: int, offset: int, path: str) -> None:
        if self._image(path) is None:
            return
        start = addr & ~4095
        end = -(-(addr + length) // 4096) * 4096
        self.mappings.append((start, end - start, offset & ~4095, path))
        tid = self.threads[0].tid if self.threads else self.pid
        self.writer.mmap2(
            self.pid, tid, start, end - start, offset & ~4095, path, self._mmap_time()
        )

    def _map_image(self, image: ElfImage, bias: int, time_ns: int) -> None:
        self.images[image.path] = image
        for seg in image.exec_segments:
            start = seg.vaddr + bias
            self.mappings.append((start, seg.size, seg.offset, image.path))
            self.writer.mmap2(self.pid, self.pid, start, seg.size, seg.offset, image.path, time_ns)

    def _start_process(self) -> None:
        if "start_code" not in self._page or "entry" not in self._page:
            raise LogFormatError(
                "QEMU's page log did not show start_code and entry before the first block"
            )
        self._started = True
        t = self.t0_ns - _SIDEBAND_LEAD_NS
        self.writer.comm(self.pid, self.pid, self.comm, t, exec_=True)
        exe = self.program
        bias = load_bias(self._page["start_code"], exe) if exe.pie else 0
        self._map_image(exe, bias, t)
        if exe.interpreter:
            interp = self._image(exe.interpreter)
            if interp is not None:
                self._map_image(interp, self._page["entry"] - interp.entry, t)

    # -- threads ---------------------------------------------------------------------------

    def _new_thread(self, cpu: int, creator: ThreadInfo | None) -> ThreadInfo:
        now = max((t.enc.now for t in self.threads if not t.exited), default=0)
        if creator is None and not self.threads:
            tid, ptid = self.pid, self.pid
        elif self._clone_tids and not self._plugin_names_threads:
            tid, ptid = self._clone_tids.popleft(), self.pid
        else:
            tid, ptid = self._next_placeholder, self.pid
            self._next_placeholder -= 1
        enc = PtEncoder(self.model, psb_period=self.psb_period)
        enc.now = now
        start_ns = self.model.tsc_to_ns(self.model.start_tsc + now)
        if self.fork is not None and not self.threads:
            enc.now = now = self.fork.now
            start_ns = self.model.tsc_to_ns(self.model.start_tsc + now)
            ptid = self.fork.ptid
        t = ThreadInfo(self.pid, tid, ptid, self.comm, self.session.next_queue(), enc, start_ns)
        self.threads.append(t)
        self.by_cpu[cpu] = t
        if tid < 0:
            self._unnamed.append(t)
        else:
            self._announce(t)
        return t

    def _announce(self, t: ThreadInfo) -> None:
        w = self.writer
        if t is not self.threads[0]:
            w.fork(t.pid, t.pid, t.tid, t.ptid, t.start_ns - 2)
            w.comm(t.pid, t.tid, t.name, t.start_ns - 1, exec_=False)
        elif self.parent is not None:
            w.fork(t.pid, self.parent.pid, t.tid, t.ptid, t.start_ns - 2)
            w.comm(t.pid, t.tid, t.name, t.start_ns - 1, exec_=False)
        w.itrace_start(t.pid, t.tid, t.start_ns - 1)

    def _name_thread(self, t: ThreadInfo, tid: int) -> None:
        t.tid = tid
        self._announce(t)

    def _last_in_syscall(self) -> ThreadInfo | None:
        """The thread that made the system call QEMU just logged: the latest to enter one."""
        candidates = [t for t in self.threads if t.in_syscall and not t.exited]
        return max(candidates, key=lambda t: t.syscall_seq) if candidates else None

    def _plugin_line(self, text: bytes) -> None:
        """``ptscope-qemu-thread VCPU TID`` (a thread's first system call) or
        ``ptscope-qemu-exit VCPU TID`` (its exit), from the thread plugin."""
        words = text.split()
        try:
            what, cpu, tid = words[0], int(words[1]), int(words[2])
        except (IndexError, ValueError):
            return
        self._plugin_names_threads = True
        t = self.by_cpu.get(cpu)
        if t is None:
            return
        if what == b"ptscope-qemu-thread" and t.tid != tid:
            if t.tid >= 0:
                log.debug("vCPU %d: thread %d says it is %d", cpu, t.tid, tid)
                return
            self._unnamed.remove(t)
            with contextlib.suppress(ValueError):
                self._clone_tids.remove(tid)
            self._name_thread(t, tid)
        elif what == b"ptscope-qemu-exit" and t.tid == tid:
            self._free_cpu(t)

    def _thread_exit(self, group: bool, args: bytes) -> None:
        if group:
            with contextlib.suppress(ValueError):
                self.ending.exit_code = int(args, 0)
            return
        if self._plugin_names_threads:
            return  # the plugin said which thread it was, before this line
        t = self._last_in_syscall()
        if t is not None:
            self._free_cpu(t)

    def _free_cpu(self, t: ThreadInfo) -> None:
        """Thread ``t`` exited: its vCPU index may run a new thread from now on."""
        t.exited = True
        for cpu, other in list(self.by_cpu.items()):
            if other is t:
                del self.by_cpu[cpu]

    # -- the main loop ---------------------------------------------------------------------

    def blocks(self, run: BlockRun) -> bool:
        """Process executed blocks; returns False once ``max_instructions`` is reached."""
        if not self._started:
            self._start_process()
        ids = self._tb_ids(run)
        cpus = run.cpu
        bounds = [0, *(np.flatnonzero(np.diff(cpus)) + 1).tolist(), len(ids)]
        by_cpu = self.by_cpu
        session = self.session
        for lo, hi in itertools.pairwise(bounds):
            cpu = int(cpus[lo])
            t = by_cpu.get(cpu)
            if t is None:
                t = self._new_thread(cpu, None)
            if not self._run(t, ids, lo, hi):
                session.stopped_at_limit = True
                return False
        if session.progress is not None and session.insns >= self._next_progress:
            self._next_progress = session.insns + _PROGRESS_STEP
            session.progress(session.insns)
        return True

    def _tb_ids(self, run: BlockRun) -> list[int]:
        """Block ids of a run's (pc, cflags) pairs, binding new translations to listings.

        Known blocks are found in bulk (a sorted array of ``cflags class << 56 | pc`` keys);
        the few others, in order, through the dictionary and the pending listings."""
        cflags = run.cflags
        classes = np.empty(len(cflags), dtype=np.uint64)
        for value in np.unique(cflags).tolist():
            cid = self._cflags_class.setdefault(value, len(self._cflags_class))
            classes[cflags == value] = cid
        keys = (classes << np.uint64(56)) | (run.pc & np.uint64((1 << 56) - 1))
        sorted_keys, sorted_ids = self._sorted_keys, self._sorted_ids
        if len(sorted_keys):
            pos = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
            ids = sorted_ids[pos]
            found = (sorted_keys[pos] == keys) & (ids >= 0)
        else:
            found = np.zeros(len(keys), dtype=bool)
            ids = np.full(len(keys), -1, dtype=np.int64)
        out: list[int] = ids.tolist()
        if not found.all():
            tb_index = self.tb_index
            pcs = run.pc
            for i in np.flatnonzero(~found).tolist():
                pc, cf = int(pcs[i]), int(cflags[i])
                tb = tb_index.get((pc, cf))
                if tb is None:
                    tb = self._lookup_missing(pc, cf)
                self._recent[int(keys[i])] = tb
                out[i] = tb
            if len(self._recent) > 16 + len(sorted_keys) // 8:
                self._merge_recent()
        return out

    def _merge_recent(self) -> None:
        recent = self._recent
        keys = np.concatenate([self._sorted_keys, np.fromiter(recent, np.uint64, len(recent))])
        ids = np.concatenate(
            [self._sorted_ids, np.fromiter(recent.values(), np.int64, len(recent))]
        )
        order = np.argsort(keys, kind="stable")
        self._sorted_keys, self._sorted_ids = keys[order], ids[order]
        recent.clear()

    def _run(self, t: ThreadInfo, ids: list[int], lo: int, hi: int) -> bool:
        """Thread ``t`` executed blocks ``ids[lo:hi]``; False once the budget is used up."""
        session = self.session
        limit = session.max_instructions
        budget = (limit - session.insns) if limit is not None else 1 << 62
        count = 0
        k = lo
        fast_ok = self.model.cyc_threshold == 1
        while k < hi and count < budget:
            t_ok = (
                t.prev >= 0
                and t.stash is None
                and t.enc.enabled
                and not self.tb_flags[t.prev] & _ANON
            )
            if fast_ok and t_ok and self._signal_hint is None:
                k, count = self._fast(t, ids, k, hi, count, budget)
            else:
                count += self._arrive(t, ids[k])
                k += 1
        self._account(t, count, k - lo)
        return count < budget

    def _fast(
        self, t: ThreadInfo, ids: list[int], k: int, hi: int, count: int, budget: int
    ) -> tuple[int, int]:
        """The hot loop: common transitions (a branch going where its kind allows) write
        their packets inline. Returns at the first block that needs :meth:`_arrive` (after
        handing it over) or at ``hi``."""
        tb_pc, tb_n, tb_kind = self.tb_pc, self.tb_n, self.tb_kind
        tb_end, tb_target, tb_flags = self.tb_end, self.tb_target, self.tb_flags
        cpi = self.cpi
        enc = t.enc
        enc._flush_tnt()
        out = enc.out
        stack = enc._stack
        now, last_timing, last_ip = enc.now, enc._last_timing, enc._last_ip
        psb_at = enc._next_psb - enc.flushed
        prev = t.prev
        while k < hi and count < budget:
            tb = ids[k]
            k += 1
            pc = tb_pc[tb]
            kind = tb_kind[prev]
            ok = True
            if kind == _COND:
                end = tb_end[prev]
                e = now - last_timing
                if e < 1 or (pc != end and pc != tb_target[prev]):
                    ok = False
                else:
                    if e < 32:
                        out.append((e << 3) | 3)
                    else:
                        _put_cyc(out, e)
                    out.append(0x04 if pc == end else 0x06)
                    last_timing = now
            elif kind == _CALL:
                if pc != tb_target[prev]:
                    ok = False
                elif not tb_flags[prev] & _ZERO_CALL:
                    stack.append(tb_end[prev])
                    if len(stack) > 64:
                        del stack[0]
            elif kind in (_RET, _JUMP_IND, _CALL_IND, _OTHER_IND):
                e = now - last_timing
                if e < 1:
                    ok = False
                else:
                    if e < 32:
                        out.append((e << 3) | 3)
                    else:
                        _put_cyc(out, e)
                    last_timing = now
                    if kind == _RET and stack and stack.pop() == pc:
                        out.append(0x06)  # a compressed return: one taken TNT bit
                    else:
                        if (pc ^ last_ip) >> 16 == 0:
                            out += bytes((0x2D, pc & 0xFF, (pc >> 8) & 0xFF))
                        else:
                            out += _tip(pc, last_ip)
                        last_ip = pc
                    if kind == _CALL_IND:
                        stack.append(tb_end[prev])
                        if len(stack) > 64:
                            del stack[0]
            elif kind == _JUMP:
                ok = pc == tb_target[prev]
            elif kind == _OTHER:
                ok = pc == tb_end[prev]
            else:
                ok = False
            if ok and len(out) < psb_at and not tb_flags[tb] & _SLOW:
                n = tb_n[tb]
                now += n * cpi
                prev = tb
                count += n
                continue
            # Hand the state back and let the general path do the rest of this block.
            enc.now, enc._last_timing, enc._last_ip = now, last_timing, last_ip
            if ok:  # the transition is written; a PSB or a system call is left
                t.prev = tb
                enc.maybe_psb(pc)
                count += self._execute(t, tb)
            else:
                t.prev = prev
                count += self._arrive(t, tb)
            return k, count
        enc.now, enc._last_timing, enc._last_ip = now, last_timing, last_ip
        t.prev = prev
        return k, count

    def _account(self, t: ThreadInfo, insns: int, blocks: int) -> None:
        self.insns += insns
        self.session.insns += insns
        self._arrivals += blocks
        t.last_arrival = self._arrivals

    def _classify_arrival(self, t: ThreadInfo, tb: int) -> Arrival | None:
        """How control reached ``tb`` from the thread's previous block (None: a rep repeat)."""
        p = t.prev
        pc = self.tb_pc[tb]
        kind = self.tb_kind[p]
        end = self.tb_end[p]
        if kind == _OTHER:
            consistent = pc == end
            if not consistent and self.tb_flags[p] & _REP and pc == self.tb_last[p]:
                return None
        elif kind == _COND:
            consistent = pc == end or pc == self.tb_target[p]
        elif kind in (_JUMP, _CALL):
            consistent = pc == self.tb_target[p]
        elif kind == _SYSCALL:
            consistent = pc == end
        else:
            consistent = True
        hint = self._signal_hint
        if hint is not None and (
            not consistent or len(self.by_cpu) == 1 or pc in self.handler_entries
        ):
            self._signal_hint = None
            self.handler_entries.add(pc)
            if kind == _SYSCALL and self._sigreturn_hint:
                # rt_sigreturn restored the interrupted context and the kernel delivered the
                # next pending signal right away: a new handler for the same interruption.
                self._sigreturn_hint = False
                return Arrival.REDELIVERY
            t.sig_depth += 1
            return Arrival.DELIVERY
        if consistent:
            return Arrival.NORMAL
        if kind == _SYSCALL:
            if self._sigreturn_hint or t.sig_depth:
                self._sigreturn_hint = False
                t.sig_depth = max(0, t.sig_depth - 1)
            return Arrival.RESUME
        return Arrival.DISCONTINUITY

    def _arrive(self, t: ThreadInfo, tb: int) -> int:
        """Account for thread ``t`` executing block ``tb``; returns instructions counted."""
        if t.prev < 0:
            pc = self.tb_pc[tb]
            t.enc.start(pc)
        else:
            how = self._classify_arrival(t, tb)
            if how is None:  # another iteration of a rep string instruction
                t.prev = tb
                return 0
            if t.stash is not None:
                self._stash(t, tb, how)
                return self.tb_n[tb]
            if not self._transfer(t, tb, how):
                return self.tb_n[tb]
        return self._execute(t, tb)

    def _execute(self, t: ThreadInfo, tb: int) -> int:
        n = self.tb_n[tb]
        t.prev = tb
        t.enc.now += n * self.cpi
        self._arrivals += 1
        t.last_arrival = self._arrivals
        if self.tb_kind[tb] == _SYSCALL:
            t.syscall_undo = t.enc.checkpoint()
            t.enc.disable()
            t.in_syscall = True
            self._syscall_seq += 1
            t.syscall_seq = self._syscall_seq
        return n

    def _empty_block(self, pc: int) -> int:
        """A block of no instructions ending at ``pc``: "about to execute ``pc``"."""
        tb = self._empty.get(pc)
        if tb is None:
            tb = self._empty[pc] = len(self.tb_pc)
            for column, value in (
                (self.tb_pc, pc),
                (self.tb_n, 0),
                (self.tb_kind, int(_OTHER)),
                (self.tb_last, pc),
                (self.tb_end, pc),
                (self.tb_target, -1),
                (self.tb_flags, 0),
            ):
                column.append(value)
            self.tb_insns.append(())
        return tb

    def _cancel(self, pc: int) -> None:
        """QEMU logged block ``pc`` but stopped before running it (``Stopped execution``)."""
        threads = [
            t
            for t in self.threads
            if not t.exited and t.prev >= 0 and self.tb_pc[t.prev] == pc and self.tb_n[t.prev]
        ]
        if not threads:
            return  # the stopped block was entered without being logged: nothing ran
        t = max(threads, key=lambda t: t.last_arrival)
        tb = t.prev
        n = self.tb_n[tb]
        self.insns -= n
        self.session.insns -= n
        empty = self._empty_block(pc)
        if t.stash is not None and t.stash and t.stash[-1][0] == tb:
            t.stash[-1] = (empty, t.stash[-1][1])
            t.prev = empty
            return
        if t.stash is not None:
            t.prev = empty
            return
        t.enc.now -= n * self.cpi
        if self.tb_kind[tb] == _SYSCALL and t.syscall_undo is not None:
            t.enc.restore(t.syscall_undo)
            t.in_syscall = False
        t.prev = empty

    def _truncate_prev(self, t: ThreadInfo, pc: int) -> bool:
        """Did the previous block stop before ``pc``, one of its instructions? Un-count the rest."""
        p = t.prev
        insns = self.tb_insns[p]
        if not insns or pc == insns[0] or pc not in insns:
            return False
        dropped = len(insns) - insns.index(pc)
        t.enc.now -= dropped * self.cpi
        self.insns -= dropped
        self.session.insns -= dropped
        return True

    def _transfer(self, t: ThreadInfo, tb: int, how: Arrival) -> bool:
        """Write the packets for the previous block's exit to ``tb``; False if held back."""
        enc = t.enc
        p = t.prev
        pc = self.tb_pc[tb]
        kind = self.tb_kind[p]
        if kind == _SYSCALL:
            t.in_syscall = False
            enc.now += self.model.syscall_cycles
            others = max(
                (o.enc.now for o in self.threads if o is not t and not o.exited), default=0
            )
            enc.now = max(enc.now, others)
            enc.start(pc)
            return True
        if how == Arrival.NORMAL:
            self._branch(t, p, pc)
            if self.tb_flags[p] & _ANON and not self.tb_flags[tb] & _ANON:
                # Back from JIT code: a PSB here lets perf carry on even if it could not
                # decode that code (its bytes missing, or changed under it).
                enc.request_psb()
        elif how == Arrival.DISCONTINUITY and self._truncate_prev(t, pc):
            pass  # the block simply ended early; control falls through to pc
        else:
            resume = self._known_resume(p)
            if resume is None and how == Arrival.DELIVERY:
                t.stash = []
                t.deferred = (p, tb)
                t.stash_depth = 1
                t.prev = tb
                return False
            if resume is None:
                resume = self.tb_last[p]
            else:
                self._branch(t, p, resume)
            enc.interrupt(resume)
            enc.now += self.model.syscall_cycles
            enc.start(pc)
            return True
        if enc.enabled:
            enc.maybe_psb(pc)
        return True

    def _known_resume(self, p: int) -> int | None:
        kind = self.tb_kind[p]
        if kind == _OTHER:
            return self.tb_end[p]
        if kind in (_JUMP, _CALL):
            return self.tb_target[p]
        return None

    def _branch(self, t: ThreadInfo, p: int, dest: int) -> None:
        enc = t.enc
        kind = self.tb_kind[p]
        if kind == _COND:
            enc.cond(dest == self.tb_target[p] and dest != self.tb_end[p])
        elif kind == _CALL:
            if not self.tb_flags[p] & _ZERO_CALL:
                enc.call(self.tb_end[p])
        elif kind == _RET:
            enc.ret(dest)
        elif kind == _CALL_IND:
            enc.indirect(dest)
            enc.call(self.tb_end[p])
        elif kind in (_JUMP_IND, _OTHER_IND):
            enc.indirect(dest)

    # -- held back: a signal came right after a branch whose outcome is not known yet ------

    def _stash(self, t: ThreadInfo, tb: int, how: Arrival) -> None:
        assert t.stash is not None and t.deferred is not None
        if how == Arrival.DELIVERY:
            t.stash_depth += 1
        elif how == Arrival.RESUME and self.tb_kind[t.prev] == _SYSCALL:
            t.stash_depth -= 1
            if t.stash_depth == 0:
                self._release(t, self.tb_pc[tb], tb, how)
                return
        t.stash.append((tb, how))
        t.prev = tb
        if len(t.stash) >= _STASH_LIMIT:
            self._release(t, None, -1, how)

    def _release(self, t: ThreadInfo, resume: int | None, tb: int, how: Arrival) -> None:
        """Write the held-back interruption now that the resume point is known (or given up)."""
        assert t.stash is not None and t.deferred is not None
        stash, (p, handler) = t.stash, t.deferred
        t.stash, t.deferred = None, None
        enc = t.enc
        if resume is None:
            resume = self.tb_last[p]
        else:
            self._branch(t, p, resume)
        enc.interrupt(resume)
        enc.now += self.model.syscall_cycles
        enc.start(self.tb_pc[handler])
        t.prev = -2  # replaying: the handler block is entered directly
        self._execute(t, handler)
        for s_tb, s_how in stash:
            if t.stash is not None:
                self._stash(t, s_tb, s_how)
                continue
            if s_how is not None and self._transfer(t, s_tb, s_how):
                self._execute(t, s_tb)
        if tb >= 0:
            if t.stash is not None:
                self._stash(t, tb, how)
            elif self._transfer(t, tb, how):
                self._execute(t, tb)

    # -- the end ---------------------------------------------------------------------------

    def _end_thread(self, t: ThreadInfo) -> None:
        if t.stash is not None:
            self._release(t, None, -1, Arrival.NORMAL)
        enc = t.enc
        if enc.enabled and t.prev >= 0:
            # The last block was logged before it ran; where (or whether) it stopped is
            # unknown, so the trace ends at its first instruction.
            p = t.prev
            n = self.tb_n[p]
            self.insns -= n
            self.session.insns -= n
            enc.now -= n * self.cpi
            enc.interrupt(self.tb_pc[p])
        self._flush(t, final=True)
        t.end_ns = self.model.tsc_to_ns(self.model.start_tsc + enc.now) + 1
        t.exited = True

    def _flush(self, t: ThreadInfo, *, final: bool = False) -> None:
        enc = t.enc
        data = enc.finish() if final else enc.take()
        if not data:
            return
        tsc = self.model.start_tsc + enc.now
        time_ns = self.model.tsc_to_ns(tsc)
        self.writer.aux(t.pid, t.tid, time_ns, t.aux_offset, len(data))
        t.aux_offset += self.writer.auxtrace(t.queue, t.tid, t.aux_offset, data, tsc)

    def flush_buffers(self) -> None:
        """Move full PT buffers to the file (keeps memory bounded during long runs)."""
        for t in self.threads:
            if len(t.enc.out) >= _AUX_CHUNK and t.tid >= 0:  # named: its records can say
                self._flush(t)

    def finish(self) -> None:
        """End every thread's stream and write the EXIT records."""
        named = {t.tid for t in self.threads}
        spare = deque(tid for tid in self._clone_tids if tid not in named)
        for t in list(self._unnamed):
            # A thread that never named itself (no system call) takes a clone result no
            # thread claimed; if none is left (or none showed up), a name after its slot.
            self._name_thread(t, spare.popleft() if spare else abs(t.tid) + (1 << 22))
        self._unnamed.clear()
        for t in self.threads:
            self._end_thread(t)
        for t in self.threads:
            ppid = t.pid if t is not self.threads[0] else self.parent.pid if self.parent else 0
            self.writer.exit(t.pid, ppid, t.tid, t.ptid, t.end_ns)

    def build_ids(self) -> list[BuildId]:
        """Build-ids of every image any process mapped (for the BUILD_ID feature)."""
        return [BuildId(p, i.build_id) for p, i in sorted(self.images.items()) if i.build_id]


def no_blocks_error(command: str) -> RecordingError:
    return RecordingError(f"QEMU ran {command} but logged no executed instructions")
