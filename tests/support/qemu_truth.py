"""Ground truth computed straight from QEMU's raw log: no perf, no ptscope tracer or engine.

This module re-derives, with its own simple (slow) parser and capstone for instruction
classification, what a program did according to QEMU's ``-d exec,nochain,in_asm,page,strace``
log (``EmulationOptions(raw_log=...)`` keeps a copy of it):

* :func:`load` → per thread, the exact sequence of executed instructions, where signals were
  delivered, and the load addresses of every ELF image;
* :func:`expected_branches` → the branch list ``perf script --itrace=b`` must print;
* :func:`expected_call_tree` → the call tree (slices) the final trace must contain.

Conventions shared with real user-only Intel PT (and therefore with the recording):

* a ``rep`` string instruction repeated by QEMU is one instruction;
* a system call ends tracing (``tr end syscall PC => 0``) and tracing restarts where the
  thread goes next (``tr strt 0 => PC``): its next instruction, a signal handler, or where a
  signal handler returns to;
* a signal delivered between two instructions is ``tr end async R => 0`` where R is where
  the program resumes after the handler (found from the handler's ``rt_sigreturn``), then
  ``tr strt 0 => HANDLER``;
* QEMU logs a block before running it, so whether the last block of a thread ran (and how
  far) is unknown: the thread's trace ends with ``tr end async START => 0`` at that block's
  first instruction, unless the thread ended with a system call (``exit``/``exit_group``).

Call tree semantics (:func:`expected_call_tree`), per thread, on that instruction sequence:

* a ``call`` pushes a frame for the callee, keyed by its return address (call end);
* a ``ret`` pops to the frame whose return address equals the target, closing every frame
  above it; a ``ret`` that matches no frame replaces the leaf frame by the function returned
  into (its caller was never seen being called);
* a ``jmp`` to the first byte of a different function is a tail call: the leaf frame is
  replaced; a ``jmp`` into the middle of a function that is on the stack further up unwinds
  to that frame (``longjmp``, exception landing pads); a ``jmp`` into the middle of another
  function that is not on the stack also replaces the leaf (``mempcpy`` jumping into
  ``memmove``'s body); jumps inside a function are not calls. A function is identified by
  its name, as in ptscope's model (``f`` and ``f.cold`` are one; libc's ``_dl_find_object``
  jumping to ld.so's is not a tail call);
* a ``syscall`` is a ``[syscall]`` child of the current frame from the syscall instruction to
  the next instruction of the thread;
* a signal delivery nests the handler as a new frame on top of the interrupted frame; the
  ``rt_sigreturn`` back to the interrupted point closes it (and everything above it); a
  ``jmp`` from a handler into the middle of a function of the interrupted stack
  (``siglongjmp``) closes the handler and every frame above the one jumped into;
* frames whose call was never seen (``_start``; callers returned into) start at the thread's
  first instruction.

Times are instruction indices within the thread (the instruction that starts a frame and the
first instruction after it ended); :class:`Timing` converts them with the cycle model.
Threads: QEMU's CPU index identifies a thread; tids come from ``clone`` results in order
(CPU index reuse by later threads is not handled: the corpus does not need it).
"""

from __future__ import annotations

import bisect
import functools
import os
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import capstone
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

_EXEC_RE = re.compile(r"^Trace (\d+): \S+ \[[0-9a-f]+/([0-9a-f]+)/[0-9a-f]+/([0-9a-f]+)\]")
_ASM_RE = re.compile(r"^0x([0-9a-f]+):  ((?:[0-9a-f]{2} )*[0-9a-f]{2})\s*(.*)$")
_STRACE_RE = re.compile(r"^(\d+) (\w+)\((.*?)\)(?: = (-?\w+))?")
_MD = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_MD.detail = True

STRING_OPS = {"movs", "stos", "lods", "cmps", "scas", "ins", "outs"}


class AmbiguousLog(ValueError):
    """QEMU's strace lines of several threads interleaved so that a thread's id cannot be
    told (a clone's result lost among other threads' output): record the run again."""


@dataclass(frozen=True)
class Insn:
    pc: int
    size: int
    kind: str
    """call, ret, jmp, jcc, syscall, other (a capstone-based classification)."""
    rep: bool

    @property
    def end(self) -> int:
        return self.pc + self.size


@functools.cache
def decode(pc: int, code: bytes) -> Insn:
    insns = list(_MD.disasm(code, pc))
    assert len(insns) == 1 and insns[0].size == len(code), (hex(pc), code.hex())
    i = insns[0]
    groups = set(i.groups)
    m = i.mnemonic
    if m in ("syscall", "sysenter"):
        kind = "syscall"
    elif capstone.x86.X86_GRP_CALL in groups:
        kind = "call"
    elif capstone.x86.X86_GRP_RET in groups:
        kind = "ret"
    elif capstone.x86.X86_GRP_JUMP in groups:
        kind = "jmp" if "jmp" in m else "jcc"
    elif capstone.x86.X86_GRP_INT in groups or capstone.x86.X86_GRP_IRET in groups:
        kind = "int"
    else:
        kind = "other"
    base = m.split()[-1].rstrip("bwdq") if m.startswith("rep") else ""
    rep = m.startswith("rep") and any(base.startswith(op) for op in STRING_OPS)
    return Insn(pc, i.size, kind, rep)


@dataclass
class ThreadRun:
    """One thread's execution, as QEMU logged it."""

    cpu: int
    tid: int = 0
    insns: list[Insn] = field(default_factory=list)
    deliveries: set[int] = field(default_factory=set)
    faults: dict[int, int] = field(default_factory=dict)
    """Index of the handler's first instruction -> the faulting instruction's address, for
    signals raised by a fault (the instruction did not complete; it runs again if the
    handler returns)."""
    """Indices into ``insns`` of signal handlers' first instructions."""
    syscall_names: dict[int, str] = field(default_factory=dict)
    """Index of a syscall instruction -> the system call QEMU logged for it."""
    final_resume: int | None = None
    """First PC of the dropped last block (the point the trace ends at), if dropped."""
    ended_in_syscall: bool = False


@dataclass
class Truth:
    pid: int
    threads: list[ThreadRun]
    images: list[tuple[int, str]]
    """(load bias, path) of every ELF image mapped executable."""
    blocks: dict[tuple[int, int], list[tuple[int, bytes]]] = field(default_factory=dict)
    """QEMU's translations: (pc, cflags) -> listing (what a forked child inherits)."""

    def thread(self, tid: int) -> ThreadRun:
        return next(t for t in self.threads if t.tid == tid)


def load(log: Path, program: Path, *, parent_log: Path | None = None, pid: int = 0) -> Truth:
    """Parse a raw QEMU log of one run of ``program``.

    A forked child's log (``parent_log`` and the child's ``pid`` given) starts with the
    parent's translations and memory map, as the child itself does."""
    listings: dict[int, list[tuple[int, bytes]]] = {}
    blocks: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
    parent = load(parent_log, program) if parent_log is not None else None
    if parent is not None:
        blocks.update(parent.blocks)
    asm: list[tuple[int, bytes]] | None = None
    per_cpu: dict[int, list[tuple[str, object]]] = {}
    order: list[int] = []
    pending_signal = False
    fault = False
    clone_tids: list[int] = []
    page: dict[str, int] = {}
    fds: dict[int, str] = {}
    images: list[tuple[int, str]] = []
    pending_mmap: str | None = None
    slots: dict[int, int] = {}  # QEMU CPU index -> thread number (a new one after `exit`)
    in_syscall: dict[int, int] = {}  # CPU index -> log line of its last block, a syscall
    pending_clone = False
    last_block: tuple[int, list[tuple[int, bytes]]] | None = None
    with open(log, errors="replace") as f:
        lines = deque(f)
    lineno = 0
    if True:
        while lines:
            line = lines.popleft().rstrip("\n")
            lineno += 1
            if asm is not None:
                m = _ASM_RE.match(line)
                if m:
                    code = bytes.fromhex(m.group(2))
                    pc = int(m.group(1), 16)
                    if not m.group(3) and asm and asm[-1][0] + len(asm[-1][1]) == pc:
                        asm[-1] = (asm[-1][0], asm[-1][1] + code)
                    else:
                        asm.append((pc, code))
                    continue
                if asm:
                    listings[asm[0][0]] = asm
                asm = None
            if line.startswith("IN:"):
                asm = []
                continue
            m = _EXEC_RE.match(line)
            if m:
                cpu, pc, cflags = int(m.group(1)), int(m.group(2), 16), int(m.group(3), 16)
                key = (pc, cflags)
                if pc in listings:
                    blocks[key] = listings.pop(pc)
                elif key not in blocks:
                    blocks[key] = next(v for (p, _), v in blocks.items() if p == pc)
                slot = slots.get(cpu)
                if slot is None:
                    slot = slots[cpu] = len(order)
                    per_cpu[slot] = []
                    order.append(slot)
                if pending_signal:
                    per_cpu[slot].append(("sig", "fault" if fault else None))
                    pending_signal = False
                per_cpu[slot].append(("tb", blocks[key]))
                last_block = (slot, blocks[key])
                last_code = blocks[key][-1][1]
                if last_code.endswith(b"\x0f\x05"):
                    in_syscall[cpu] = lineno
                else:
                    in_syscall.pop(cpu, None)
                continue
            if line.startswith("--- SIG"):
                pending_signal = True
                fault = _FAULT_RE.match(line) is not None
                continue
            if line.startswith("Stopped execution of TB chain before"):
                # QEMU logged that block but did not run it.
                pc = int(line.split("[")[1].split("]")[0], 16)
                if last_block is not None and last_block[1][0][0] == pc:
                    events = per_cpu[last_block[0]]
                    if events and events[-1] == ("tb", last_block[1]):
                        events.pop()
                last_block = None
                continue
            for name in ("start_code", "entry"):
                if line.startswith(name + " "):
                    page.setdefault(name, int(line.split()[1], 16))
            if pending_mmap is not None and line.startswith(" = "):
                _add_mmap(pending_mmap, line[3:].split()[0], fds, images)
                pending_mmap = None
            if pending_clone and line.startswith(" = "):
                # Results are printed when calls return, other threads' among them: a
                # clone's result is a new tid, above the process id (" = 0" is a futex's).
                value = int(line[3:].split()[0], 0)
                if value > pid:
                    clone_tids.append(value)
                    pending_clone = False
            m = _STRACE_RE.match(line)
            if m and m.group(4) is None and ")" in line[m.end(3) :]:
                # The call's result comes later; other output may share its line.
                tail = line[m.end(3) + 1 :]
                if tail:
                    lines.appendleft(tail)
            if m:
                if not pid:
                    pid = int(m.group(1))
                if int(m.group(1)) != pid:
                    continue
                name, args, result = m.group(2), m.group(3), m.group(4)
                if last_block is not None and last_block[1][-1][1].endswith(b"\x0f\x05"):
                    events = per_cpu[last_block[0]]
                    if events and events[-1][0] == "tb":
                        events.append(("syscall", name))
                if name == "exit" and in_syscall:
                    # The thread that just entered a system call is the one leaving.
                    cpu = max(in_syscall, key=in_syscall.__getitem__)
                    del in_syscall[cpu], slots[cpu]
                elif name == "clone" and "CLONE_THREAD" in args:
                    # A result on the call's own line may be another thread's (QEMU prints
                    # a result when a call returns: " = 0" from a new thread's first call).
                    if result and int(result, 0) > pid:
                        clone_tids.append(int(result, 0))
                    else:
                        pending_clone = True
                elif name == "openat" and result and int(result, 0) >= 0:
                    path = re.search(r'"(.*)"', args)
                    if path:
                        fds[int(result, 0)] = os.path.abspath(path.group(1))
                elif name == "mmap":
                    if result is None:
                        pending_mmap = args
                    else:
                        _add_mmap(args, result, fds, images)
    images = (parent.images if parent else _startup_images(program, page)) + images
    threads = []
    if len(clone_tids) < len(order) - 1:
        raise AmbiguousLog(f"{log}: {len(order)} threads ran, {len(clone_tids)} clone results read")
    for n, slot in enumerate(order):
        run = ThreadRun(cpu=slot, tid=pid if n == 0 else clone_tids[n - 1])
        _expand(run, per_cpu[slot])
        threads.append(run)
    return Truth(pid=pid, threads=threads, images=images, blocks=blocks)


def _add_mmap(args: str, result: str, fds: dict[int, str], images: list[tuple[int, str]]) -> None:
    parts = args.split(",")
    if len(parts) != 6 or "PROT_EXEC" not in parts[2]:
        return
    fd = int(parts[4], 0)
    if fd < 0 or fd not in fds:
        return
    addr, offset = int(result, 0), int(parts[5], 0)
    path = os.path.realpath(fds[fd])
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for seg in elf.iter_segments():
            executable = seg["p_type"] == "PT_LOAD" and seg["p_flags"] & 1
            if executable and seg["p_offset"] & ~0xFFF == offset & ~0xFFF:
                images.append((addr - (seg["p_vaddr"] & ~0xFFF), path))
                return


def _startup_images(program: Path, page: dict[str, int]) -> list[tuple[int, str]]:
    out = []
    with open(program, "rb") as f:
        elf = ELFFile(f)
        pie = elf["e_type"] == "ET_DYN"
        lowest = min(
            s["p_vaddr"]
            for s in elf.iter_segments()
            if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
        )
        interp = next(
            (s.get_interp_name() for s in elf.iter_segments() if s["p_type"] == "PT_INTERP"),
            None,
        )
    out.append((page["start_code"] - lowest if pie else 0, os.path.realpath(program)))
    if interp:
        real = os.path.realpath(interp)
        with open(real, "rb") as f:
            out.append((page["entry"] - ELFFile(f)["e_entry"], real))
    return out


def _successors(i: Insn) -> tuple[int, ...] | None:
    """Where execution may continue after ``i`` without an interruption (None: anywhere)."""
    if i.kind in ("other", "syscall"):
        return (i.end,)
    if i.kind in ("ret", "int") or (i.kind in ("call", "jmp") and _direct_target(i) is None):
        return None
    target = _direct_target(i)
    assert target is not None
    return (target,) if i.kind in ("call", "jmp") else (target, i.end)


_TARGETS: dict[int, int | None] = {}
_FAULT_RE = re.compile(r"--- SIG(?:SEGV|BUS|ILL|FPE) \{si_signo=\w+, si_code=[1-9]")


def _direct_target(i: Insn) -> int | None:
    return _TARGETS.get(i.pc)


def _expand(run: ThreadRun, events: list[tuple[str, object]]) -> None:
    """Blocks → instructions (rep repeats collapsed, early-ended blocks cut)."""
    insns = run.insns
    sig_next = False
    last_block_start = 0
    for what, value in events:
        if what == "sig":
            sig_next = True
            if value == "fault" and insns:
                # The instruction that faulted did not complete: taken to be its block's
                # last (the log cannot tell how far a block ran; corpus programs fault on
                # an indirect call, which ends its block).
                faulted = insns.pop()
                run.faults[len(insns)] = faulted.pc
            continue
        if what == "syscall":
            if insns and insns[-1].kind == "syscall":
                run.syscall_names[len(insns) - 1] = str(value)
            continue
        listing = list(value)  # type: ignore[call-overload]
        code_all = b"".join(c for _, c in listing)
        block = [
            (a, code_all[a - listing[0][0] : a - listing[0][0] + n])
            for a, n, _, _ in _MD.disasm_lite(code_all, listing[0][0])
        ]
        decoded = []
        for pc, code in block:
            ins = decode(pc, code)
            if ins.kind in ("call", "jmp", "jcc"):
                ops = next(iter(_MD.disasm(code, pc))).operands
                _TARGETS[pc] = (
                    ops[0].imm if ops and ops[0].type == capstone.x86.X86_OP_IMM else None
                )
            decoded.append(ins)
        first = decoded[0]
        if insns and not sig_next:
            prev = insns[-1]
            if prev.rep and first.pc == prev.pc and len(decoded) == 1:
                continue  # another iteration of the same rep instruction
            succ = _successors(prev)
            if succ is not None and first.pc not in succ:
                # A block that stopped early: the new one starts inside it.
                starts = [i.pc for i in insns[last_block_start:]]
                if first.pc in starts[1:]:
                    del insns[last_block_start + starts.index(first.pc) :]
        if sig_next:
            run.deliveries.add(len(insns))
            sig_next = False
        last_block_start = len(insns)
        insns.extend(decoded)
    if insns and insns[-1].kind != "syscall":
        run.final_resume = insns[last_block_start].pc
        del insns[last_block_start:]
    run.ended_in_syscall = bool(insns) and insns[-1].kind == "syscall"


# -- branches ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Branch:
    kind: str
    """call, return, jmp, jcc, syscall (``tr end syscall``), async (``tr end async``),
    start (``tr strt``)."""
    src: int
    dst: int
    at: int = field(default=-1, compare=False)
    """Index (in the thread's instructions) of the instruction after which it happened."""

    def __str__(self) -> str:
        return f"{self.kind:8} {self.src:#x} => {self.dst:#x}"


def _resume_after(run: ThreadRun, handler: int) -> int | None:
    """Where the program went on after the handler starting at ``run.insns[handler]``.

    ``rt_sigreturn`` goes back to the interrupted point, unless another pending signal is
    delivered right then: that handler interrupts the same point."""
    depth = 0
    insns = run.insns
    for k in range(handler, len(insns) - 1):
        if k in run.deliveries and not _redelivery(run, k):
            depth += 1
        i = insns[k]
        if i.kind == "syscall" and run.syscall_names.get(k) == "rt_sigreturn":
            if k + 1 in run.deliveries:
                continue  # the next handler is for the same interrupted point
            depth -= 1
            if depth == 0:
                return insns[k + 1].pc
    return None


def _redelivery(run: ThreadRun, k: int) -> bool:
    """Is the handler at index ``k`` delivered as ``rt_sigreturn`` returned?"""
    return k > 0 and run.syscall_names.get(k - 1) == "rt_sigreturn"


def expected_branches(run: ThreadRun) -> list[Branch]:
    """The taken branches ``perf script --itrace=b`` prints for this thread, in order."""
    out: list[Branch] = []
    insns = run.insns
    if not insns:
        return out
    out.append(Branch("start", 0, insns[0].pc, 0))
    for k, i in enumerate(insns):
        nxt = insns[k + 1].pc if k + 1 < len(insns) else run.final_resume
        if i.kind == "syscall":
            out.append(Branch("syscall", i.pc, 0, k))
            if nxt is not None:
                out.append(Branch("start", 0, nxt, k + 1))
            continue
        if nxt is None:
            continue
        if k + 1 in run.deliveries:
            resume = _resume_after(run, k + 1)
            succ = _successors(i)
            if succ is not None and len(succ) == 1:
                resume = succ[0]
            if resume is None:
                # Never resumed: where it was interrupted (the faulting instruction, or the
                # branch, shown as not executed).
                resume = run.faults.get(k + 1, i.pc)
            else:
                out.extend(_taken(i, resume, k))
            out.append(Branch("async", resume, 0, k))
            out.append(Branch("start", 0, nxt, k + 1))
            continue
        out.extend(_taken(i, nxt, k))
    if run.final_resume is not None:
        out.append(Branch("async", run.final_resume, 0, len(insns) - 1))
    return out


def _taken(i: Insn, dst: int, k: int) -> list[Branch]:
    if i.kind == "call":
        return [Branch("call", i.pc, dst, k)]
    if i.kind == "ret":
        return [Branch("return", i.pc, dst, k)]
    if i.kind == "jmp":
        return [Branch("jmp", i.pc, dst, k)]
    if i.kind == "jcc" and dst != i.end:
        return [Branch("jcc", i.pc, dst, k)]
    return []


# -- symbols and the call tree ------------------------------------------------------------


class Symbols:
    """Function symbols of every image (pyelftools), by run-time address."""

    def __init__(self, images: Iterable[tuple[int, str]]) -> None:
        entries: list[tuple[int, int, str, bool]] = []
        for bias, path in images:
            entries += [
                (bias + lo, bias + hi, name, sized) for lo, hi, name, sized in _functions(path)
            ]
        entries.sort()
        self._images = sorted(
            (bias + lo, bias + hi, path) for bias, path in images for lo, hi in _extent(path)
        )
        self._starts = [e[0] for e in entries]
        self._entries: list[tuple[int, int, str, bool]] = entries
        self._cache: dict[int, tuple[int, str] | None] = {}

    def image(self, addr: int) -> str:
        """The file whose executable code contains ``addr`` ("" if none)."""
        for lo, hi, path in self._images:
            if lo <= addr < hi:
                return path
        return ""

    def is_real(self, entry: int) -> bool:
        """Is ``entry`` the start of a function with a size (not a PLT stub or an address
        only covered by a stretched size-0 symbol)?"""
        k = bisect.bisect_right(self._starts, entry) - 1
        while k >= 0 and self._starts[k] == entry:
            if self._entries[k][3]:
                return True
            k -= 1
        return False

    def lookup(self, addr: int) -> tuple[int, str] | None:
        """(function start, name) of the function containing ``addr``."""
        if addr in self._cache:
            return self._cache[addr]
        found = self._cache[addr] = self._lookup(addr)
        return found

    def _lookup(self, addr: int) -> tuple[int, str] | None:
        k = bisect.bisect_right(self._starts, addr) - 1
        best = None
        while k >= 0:
            lo, hi, name, _ = self._entries[k]
            if lo <= addr < hi and (best is None or lo > best[0]):
                best = (lo, name)
            if addr - lo > 1 << 20:
                break
            k -= 1
        return best


@functools.cache
def _extent(path: str) -> list[tuple[int, int]]:
    with open(path, "rb") as f:
        return [
            (seg["p_vaddr"], seg["p_vaddr"] + seg["p_memsz"])
            for seg in ELFFile(f).iter_segments()
            if seg["p_type"] == "PT_LOAD" and seg["p_flags"] & 1
        ]


def _elf_functions(elf: ELFFile) -> list[tuple[int, int, str]]:
    out = []
    for sec in elf.iter_sections():
        if isinstance(sec, SymbolTableSection):
            for s in sec.iter_symbols():
                if s["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") and s["st_value"]:
                    out.append((s["st_value"], s["st_value"] + s["st_size"], s.name))
    return out


def _debug_file(elf: ELFFile) -> str | None:
    for sec in elf.iter_sections():
        if sec["sh_type"] == "SHT_NOTE":
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                    bid = note["n_desc"]
                    path = f"/usr/lib/debug/.build-id/{bid[:2]}/{bid[2:]}.debug"
                    return path if os.path.exists(path) else None
    return None


@functools.cache
def _functions(path: str) -> list[tuple[int, int, str, bool]]:
    """Function symbols like perf 6.1 sees them: ELF symbols, or those of the detached debug
    file, a size-0 one extending to the next symbol (perf's ``symbols__fixup_end``: so PLT
    stubs after ``_init`` belong to ``_init``)."""
    out: list[tuple[int, int, str]] = []
    with open(path, "rb") as f:
        elf = ELFFile(f)
        out += _elf_functions(elf)
        debug = _debug_file(elf)
    if debug is not None:
        # Like perf, read the symbols of a stripped library from its detached debug file.
        with open(debug, "rb") as f:
            out += _elf_functions(ELFFile(f))
    out = sorted(set(out))
    fixed = []
    for k, (lo, hi, name) in enumerate(out):
        sized = hi > lo
        if not sized:
            hi = next((o[0] for o in out[k + 1 :] if o[0] > lo), lo + 1)
        fixed.append((lo, hi, name, sized))
    return fixed


@dataclass
class Slice:
    """One expected frame: function entry, name, depth, [start, end) in instruction indices."""

    entry: int
    name: str
    depth: int
    start: int
    end: int
    parent: Slice | None = field(default=None, repr=False, compare=False)
    children: list[Slice] = field(default_factory=list, repr=False, compare=False)
    ret: int | None = field(default=None, repr=False, compare=False)
    """Return address that closes this frame (None: its call was never seen)."""
    resumes: set[int] = field(default_factory=set, repr=False, compare=False)
    """Where the setjmp-family calls this frame made returned to: a longjmp to one of
    them resumes this frame."""


SYSCALL_NAME = "[syscall]"


class _Tree:
    """The call-tree builder of :func:`expected_call_tree`."""

    def __init__(self, symbols: Symbols) -> None:
        self.symbols = symbols
        self.roots: list[Slice] = []
        # contexts[-1] is the running one; a signal handler opens a new context.
        self.contexts: list[list[Slice]] = [[]]
        self.all: list[Slice] = []
        self.ambiguous: list[str] = []

    def function(self, addr: int) -> tuple[int, str]:
        found = self.symbols.lookup(addr)
        if found is not None:
            return found
        # Code without a symbol is one function per file, as in ptscope's model.
        return addr, f"[unknown] ({self.symbols.image(addr)})"

    def open(self, addr: int, start: int, ret: int | None, *, name: str | None = None) -> Slice:
        entry, fname = self.function(addr)
        stack = self.contexts[-1]
        parent = stack[-1] if stack else self._below()
        s = Slice(entry, name or fname, 0, start, -1, parent, ret=ret)
        (parent.children if parent else self.roots).append(s)
        stack.append(s)
        self.all.append(s)
        return s

    def _below(self) -> Slice | None:
        for stack in reversed(self.contexts[:-1]):
            if stack:
                return stack[-1]
        return None

    def close_to(self, keep: int, end: int) -> None:
        stack = self.contexts[-1]
        while len(stack) > keep:
            stack.pop().end = end

    def caller_found(self, addr: int, now: int) -> None:
        """A return to ``addr`` that matches no open frame: the caller was never seen."""
        stack = self.contexts[-1]
        if len(self.contexts) > 1:
            # Inside a signal handler: the function returned into replaces the leaf.
            self.close_to(0, now)
            self.open(addr, now, None)
            return
        self.close_to(0, now)
        entry, fname = self.function(addr)
        outer = Slice(entry, fname, 0, 0, -1, None, ret=None)
        for r in self.roots:
            r.parent = outer
        outer.children, self.roots = self.roots, [outer]
        self.all.append(outer)
        stack.append(outer)


def expected_call_tree(
    run: ThreadRun, symbols: Symbols, ambiguous: list[str] | None = None
) -> list[Slice]:
    """The expected slices of one thread (semantics in the module docstring), in the order
    of their start (parents before children).

    The log has no stack pointer: a jump into the middle of a function that is on the stack
    more than once (a longjmp or a C++ catch inside recursion) lands in the nearest one here,
    which may be wrong. Each such jump is described in ``ambiguous`` (when given): a caller
    that needs an exact tree must not use this one then."""
    tree = _Tree(symbols)
    insns = run.insns
    if not insns:
        return []
    tree.open(insns[0].pc, 0, None)
    n = len(insns)
    for k, i in enumerate(insns):
        nxt = insns[k + 1].pc if k + 1 < n else run.final_resume
        now = k + 1  # index of the next instruction: when this one's effect starts
        if k + 1 in run.deliveries and _redelivery(run, k + 1) and nxt is not None:
            # rt_sigreturn, and at once the next handler: close the context, open another.
            tree.open(i.pc, k, None, name=SYSCALL_NAME)
            tree.close_to(len(tree.contexts[-1]) - 1, now)
            tree.close_to(0, now)
            tree.contexts[-1] = []
            tree.open(nxt, now, None)
            continue
        if k + 1 in run.deliveries and nxt is not None:
            resume = _resume_after(run, k + 1)
            if i.kind not in ("other", "syscall") and resume is not None:
                _flow(tree, i, resume, now)
            elif i.kind == "syscall":
                tree.open(i.pc, k, None, name=SYSCALL_NAME)
                tree.close_to(len(tree.contexts[-1]) - 1, now)
            tree.contexts.append([])
            tree.open(nxt, now, None)
            continue
        if i.kind == "syscall":
            tree.open(i.pc, k, None, name=SYSCALL_NAME)
            tree.close_to(len(tree.contexts[-1]) - 1, now)
            if run.syscall_names.get(k) == "rt_sigreturn" and len(tree.contexts) > 1:
                tree.close_to(0, now)  # rt_sigreturn: back to the interrupted context
                tree.contexts.pop()
            continue
        if nxt is None:
            continue
        _flow(tree, i, nxt, now)
    end = n
    for stack in tree.contexts:
        for s in stack:
            s.end = end
    _assign_depths(tree.roots, 0)
    if ambiguous is not None:
        ambiguous += tree.ambiguous
    out = sorted(tree.all, key=lambda s: (s.start, s.depth))
    return out


def _flow(tree: _Tree, i: Insn, dst: int, now: int) -> None:
    stack = tree.contexts[-1]
    if i.kind == "call":
        if dst != i.end:  # `call +0` (get the PC) is not a call
            tree.open(dst, now, i.end)
        return
    if i.kind == "ret":
        for depth in range(len(stack) - 1, -1, -1):
            if stack[depth].ret == dst:
                if depth and ("setjmp" in stack[depth].name or "sigjmp_save" in stack[depth].name):
                    stack[depth - 1].resumes.add(dst)  # where a longjmp may come back to
                tree.close_to(depth, now)
                return
        tree.caller_found(dst, now)
        return
    if i.kind != "jmp":
        return
    entry, name = tree.function(dst)
    leaf = stack[-1] if stack else None
    if leaf is None:
        return
    if _key(name) == _key(leaf.name) and entry != dst:
        return  # a jump inside the function
    if entry != dst:
        found = _resumed(stack, len(stack) - 2, name, dst)
        if found:
            if len(found) > 1:
                tree.ambiguous.append(f"{name}: {len(found)} activations at instruction {now}")
            tree.close_to(found[0] + 1, now)  # longjmp / exception landing pad
            return
        if _jump_out_of_handler(tree, name, dst, now):
            return
    if _key(name) != _key(leaf.name):
        # A tail call: the leaf is replaced, the new function returns to the same place.
        ret = leaf.ret
        tree.close_to(len(stack) - 1, now)
        tree.open(dst, now, ret)


def _resumed(stack: list[Slice], top: int, name: str, dst: int) -> list[int]:
    """Depths at or below ``top`` of the activations of ``name`` that a jump to ``dst``
    may resume, nearest first: those whose setjmp returned to ``dst`` if any, otherwise
    every activation."""
    found = [d for d in range(top, -1, -1) if _key(stack[d].name) == _key(name)]
    armed = [d for d in found if dst in stack[d].resumes]
    return armed or found


def _jump_out_of_handler(tree: _Tree, name: str, dst: int, now: int) -> bool:
    """A jump from a signal handler into the middle of a function of an interrupted
    context (``siglongjmp``): the handlers' contexts end, and so does every frame above the
    one jumped into."""
    for c in range(len(tree.contexts) - 2, -1, -1):
        stack = tree.contexts[c]
        found = _resumed(stack, len(stack) - 1, name, dst)
        if not found:
            continue
        if len(found) > 1:
            tree.ambiguous.append(f"{name}: {len(found)} activations at instruction {now}")
        while len(tree.contexts) > c + 1:
            tree.close_to(0, now)
            tree.contexts.pop()
        tree.close_to(found[0] + 1, now)
        return True
    return False


def _key(name: str) -> str:
    return name[:-5] if name.endswith(".cold") else name


def _assign_depths(nodes: list[Slice], depth: int) -> None:
    for s in nodes:
        s.depth = depth
        _assign_depths(s.children, depth + 1)


class Timing:
    """Instruction index -> time under the default cycle model, for a single-threaded run,
    and where the packets that carry time to perf are.

    ``ns(i)``: time (ns after the thread's first instruction) before instruction ``i`` runs;
    every instruction costs one cycle, every system call and every signal interrupting user
    code ``syscall_cycles``, at ``tsc_hz``."""

    def __init__(
        self,
        run: ThreadRun,
        cycles_per_insn: int = 1,
        syscall_cycles: int = 100,
        tsc_hz: int = 2_000_000_000,
    ) -> None:
        insns = run.insns
        n = len(insns)
        kernel = [0] * (n + 1)  # kernel entries completed before instruction i
        count = 0
        for i in range(n + 1):
            kernel[i] = count
            if i < n and insns[i].kind == "syscall":
                count += 1
            if i + 1 in run.deliveries and i < n and insns[i].kind != "syscall":
                count += 1
        self._kernel = kernel
        self._cpi, self._sys, self._hz = cycles_per_insn, syscall_cycles, tsc_hz
        # Instructions that make Intel PT write a packet (with the CYC that dates it).
        packet = [
            i.kind in ("jcc", "ret", "syscall", "int")
            or (i.kind in ("call", "jmp") and _direct_target(i) is None)
            for i in insns
        ]
        self._next = [n - 1] * (n + 1)
        following = n - 1
        for i in range(n - 1, -1, -1):
            if packet[i]:
                following = i
            self._next[i] = following
        self._prev = [-1] * (n + 1)
        preceding = -1
        for i in range(n):
            self._prev[i] = preceding
            if packet[i]:
                preceding = i
        self._prev[n] = preceding

    def ns(self, index: int) -> float:
        index = max(0, min(index, len(self._kernel) - 1))
        cycles = index * self._cpi + self._kernel[index] * self._sys
        return cycles * 1e9 / self._hz

    def window(self, index: int) -> tuple[float, float]:
        """When perf (and a trace built from its branches) may date an event that takes
        effect before instruction ``index``: between the packets around the instruction
        that caused it (direct calls and jumps write no packet of their own)."""
        if index <= 0:
            return 0.0, self.ns(1)
        k = index - 1
        return self.ns(self._prev[k] + 1), self.ns(self._next[k] + 1)
