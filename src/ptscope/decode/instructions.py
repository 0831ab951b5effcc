"""Every instruction one thread executed in a time range (``ptscope insns``, the drill-down).

perf makes the instruction stream itself: ``perf script --itrace=i0nse`` synthesizes one
sample per instruction (and the decode errors), restricted with ``--tid`` and ``--time``,
with ``-F ...,insn`` printing each instruction's bytes (perf builds without libxed print no
disassembly, so capstone disassembles them here). perf also prints its mmap and task lines
(``--show-mmap-events --show-task-events``, never time-filtered): they say which file and
offset each address comes from (:class:`~ptscope.decode.blocks.CodeMap`), for the source
lines (:class:`~ptscope.decode.source_lines.SourceLines`), and whether the thread exists.

The call depth is counted from the first instruction of the range: +1 after a ``call``,
-1 after a ``return`` (system calls and interrupts come back where they left); the listing
is shifted so that its shallowest instruction has depth 0.

One call exactly (``--after``, :class:`CallPicker`): perf's listing shows each executed
instruction once, in order, and dates a call or jump instruction with the time of that
branch's sample; a slice's drill command names the instruction that started its call
(the call, or the tail call's jump), which of its executions at the call's perf time it
was (the engine counts them), and how many instructions the call ran. The call is the
instructions right after that one, so many, whatever else perf dates in the same range.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import capstone

from ptscope.decode.blocks import CodeMap
from ptscope.decode.perf_script import binary_resolver, format_time, stream_perf_script
from ptscope.decode.perf_text import function_of, parse_error_line, parse_flags
from ptscope.decode.source_lines import SourceLines
from ptscope.model import BranchFlags

__all__ = [
    "INSN_FIELDS",
    "CallPicker",
    "Instruction",
    "InstructionListing",
    "format_instruction",
    "instructions_argv",
    "list_instructions",
    "pick_call",
]

INSN_FIELDS: Final = "pid,tid,time,ip,sym,symoff,dso,insn,flags"
"""``-F`` of the instruction samples (``insn``: the instruction's bytes)."""

# "PID/TID TIME: FLAGS IP SYM+OFF (DSO) insn: BYTES"
_LINE_RE: Final = re.compile(
    r"^\s*(-?\d+)/(-?\d+)\s+(\d+\.\d+):(.*?)\s+([0-9a-f]{1,16}) (.*?)"
    r"\s*insn:((?: [0-9a-f]{2})*)\s*$"
)
_TASK_RE: Final = re.compile(r"PERF_RECORD_(?:COMM|FORK|EXIT|MMAP2?)\b.*?(-?\d+)/(-?\d+)")
_NEST: Final = int(BranchFlags.SYSCALLRET | BranchFlags.INTERRUPT | BranchFlags.ASYNC)
_DISASM: Final = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


@dataclass(slots=True)
class Instruction:
    """One executed instruction (or, with ``error`` set, a decode error at that point)."""

    time: int
    ip: int
    where: str
    """``symbol+0xoffset`` as perf prints it (``[unknown]`` without a symbol)."""
    code: bytes
    text: str
    """Its disassembly (capstone), empty if perf could not read its bytes."""
    source: str | None = None
    """``file:line`` from the binary's debug information, when it has some."""
    depth: int = 0
    error: str | None = None
    function: str = ""
    """Its function as the engine names functions (``model.function_key``)."""
    is_call: bool = False


def instructions_argv(
    perf_data: Path | str,
    *,
    perf: str,
    tid: int,
    window: tuple[int, int | None],
    symfs: Path | str | None = None,
) -> list[str]:
    """The ``perf script`` argv printing every instruction of ``tid`` in ``window`` (ns;
    an end of None: to the end of the recording)."""
    end = "" if window[1] is None else format_time(window[1])
    argv = [perf, "script", "-i", str(perf_data), "--ns", "--itrace=i0nse", "-F", INSN_FIELDS]
    argv += [f"--tid={tid}", f"--time={format_time(window[0])},{end}"]
    argv += ["--show-mmap-events", "--show-task-events"]
    if symfs is not None:
        argv.append(f"--symfs={symfs}")
    return argv


class InstructionListing:
    """Turns perf's lines into :class:`Instruction` s of thread ``tid``, in order."""

    def __init__(self, tid: int, resolve: Callable[[str], Path | None]) -> None:
        self.tid = tid
        self.code = CodeMap(resolve)
        self.sources = SourceLines(resolve)
        self.thread_seen = False
        """perf printed a task or mmap line of the thread: it is in the recording."""
        self.unparsed = 0
        self._depth = 0
        self._disassembly: dict[tuple[int, bytes], str] = {}
        self._functions: dict[str, str] = {}

    def close(self) -> None:
        """Release the binaries read for source lines."""
        self.sources.close()
        self.code.close()

    def feed(self, lines: Iterable[str]) -> list[Instruction]:
        out: list[Instruction] = []
        for line in lines:
            insn = self._line(line)
            if insn is not None:
                out.append(insn)
        return out

    def _line(self, line: str) -> Instruction | None:
        if "PERF_RECORD_" in line:
            self.code.task_line(line)
            m = _TASK_RE.search(line)
            if m is not None and int(m.group(2)) == self.tid:
                self.thread_seen = True
            return None
        m = _LINE_RE.match(line)
        if m is None:
            err = parse_error_line(line)
            if err is not None and (err.tid is None or err.tid == self.tid):
                return Instruction(
                    err.time or 0, err.ip or 0, "", b"", "", depth=self._depth, error=err.message
                )
            if line.strip():
                self.unparsed += 1
            return None
        pid, time_text = int(m.group(1)), m.group(3)
        sec, _, frac = time_text.partition(".")
        time = int(sec) * 1_000_000_000 + int((frac + "000000000")[:9])
        ip = int(m.group(5), 16)
        where = m.group(6)
        if where.endswith(")") and " (" in where:
            where = where[: where.rindex(" (")]
        code = bytes.fromhex(m.group(7))
        insn = Instruction(time, ip, where or "[unknown]", code, self._disassemble(ip, code))
        insn.depth = self._depth
        located = m.group(6)
        function = self._functions.get(located)
        if function is None:
            function = self._functions[located] = function_of(f"{ip:x} {located}") or ""
        insn.function = function
        found = self.code.locate(pid, ip)
        if found is not None:
            insn.source = self.sources.line(found[0], found[1])
        flags, _ = parse_flags(m.group(4))
        insn.is_call = bool(flags & BranchFlags.CALL) and not flags & _NEST
        if not flags & _NEST:
            if flags & BranchFlags.CALL:
                self._depth += 1
            elif flags & BranchFlags.RETURN:
                self._depth -= 1
        return insn

    def _disassemble(self, ip: int, code: bytes) -> str:
        key = (ip, code)
        text = self._disassembly.get(key)
        if text is None:
            text = ""
            for _, _, mnemonic, operands in _DISASM.disasm_lite(code, ip, 1):
                text = f"{mnemonic} {operands}".strip()
            if not text and code:
                text = f"(bytes {code.hex(' ')})"
            self._disassembly[key] = text
        return text


class CallPicker:
    """One call out of a listing: the ``count`` instructions that follow the
    ``occurrence``-th instruction at address ``anchor`` dated ``time`` (the call or jump
    that began the call). Decode errors among them are kept and not counted.

    Occurrences are counted as the engine counts branches (``_native/engine_anchors.c``):
    a call at that address, or an instruction there followed by one in another function
    (a jump out); not one followed by an instruction of its own function (a jump inside
    it, a conditional jump not taken, which the engine never sees from there)."""

    def __init__(self, anchor: int, occurrence: int, time: int, count: int) -> None:
        if occurrence < 1 or count < 1:
            raise ValueError("occurrence and count start at 1")
        self.anchor = anchor
        self.occurrence = occurrence
        self.time = time
        self.count = count
        self.anchors_seen = 0
        self.passed = False
        """The thread ran past ``time`` without the anchor: the call is not there (the
        engine counts a time's executions while that time lasts, and so does this)."""
        self._jump: Instruction | None = None  # at the anchor: counts if control leaves
        self.picked: list[Instruction] = []
        self.taken = 0
        """Instructions picked (``picked`` less its decode errors)."""

    def instructions(self) -> list[Instruction]:
        """What was picked, depths shifted so that the shallowest is 0."""
        _shift_depths(self.picked)
        return self.picked

    @property
    def found(self) -> bool:
        return self.anchors_seen >= self.occurrence

    @property
    def complete(self) -> bool:
        return self.taken >= self.count

    @property
    def done(self) -> bool:
        """Nothing that follows can change what was picked."""
        return self.complete or self.passed

    def feed(self, instructions: Iterable[Instruction]) -> None:
        for insn in instructions:
            if self.done:
                return
            if not self.found:
                jump, self._jump = self._jump, None
                if jump is not None and insn.error is None and insn.function != jump.function:
                    self.anchors_seen += 1
                    if self.found:
                        self._take(insn)
                    continue
                if insn.error is None and insn.time > self.time:
                    self.passed = True
                    return
                if insn.error is None and insn.ip == self.anchor and insn.time == self.time:
                    if insn.is_call:
                        self.anchors_seen += 1
                    else:
                        self._jump = insn
                continue
            self._take(insn)

    def _take(self, insn: Instruction) -> None:
        self.picked.append(insn)
        if insn.error is None:
            self.taken += 1


def list_instructions(
    perf_data: Path,
    *,
    perf: str,
    tid: int,
    window: tuple[int, int],
    symfs: Path | str | None = None,
    listing: InstructionListing | None = None,
) -> list[Instruction]:
    """Every instruction of ``tid`` between ``window`` (perf ns, inclusive), depths
    shifted so that the shallowest is 0. ``listing`` (made here if None) tells afterwards
    whether the thread was seen at all."""
    own = listing is None
    if listing is None:
        listing = InstructionListing(tid, binary_resolver(symfs))
    argv = instructions_argv(perf_data, perf=perf, tid=tid, window=window, symfs=symfs)
    out: list[Instruction] = []
    try:
        # Unwatched: perf prints nothing while it decodes up to the range and the thread.
        for batch in stream_perf_script(argv, perf_data=perf_data, watch=False):
            out += listing.feed(batch)
    finally:
        if own:
            listing.close()
    _shift_depths(out)
    return out


def pick_call(
    perf_data: Path,
    call: CallPicker,
    *,
    perf: str,
    tid: int,
    window: tuple[int, int | None],
    symfs: Path | str | None = None,
    listing: InstructionListing,
) -> None:
    """Feed ``call`` the instructions of ``tid`` in ``window`` until it is done (perf
    is stopped then: the rest of the range is not wanted)."""
    if call.done:
        return
    argv = instructions_argv(perf_data, perf=perf, tid=tid, window=window, symfs=symfs)
    for batch in stream_perf_script(argv, perf_data=perf_data, watch=False):
        call.feed(listing.feed(batch))
        if call.done:
            break


def _shift_depths(instructions: list[Instruction]) -> None:
    if instructions:
        low = min(i.depth for i in instructions)
        for i in instructions:
            i.depth -= low


def format_instruction(insn: Instruction) -> str:
    """``TIME  ADDRESS  <indent>SYMBOL+OFF  DISASSEMBLY  [FILE:LINE]`` (one line)."""
    indent = "  " * insn.depth
    time = format_time(insn.time)
    if insn.error is not None:
        return f"{time} {insn.ip:>16x} {indent}[decode error: {insn.error}]"
    text = f"{time} {insn.ip:>16x} {indent}{insn.where:<24} {insn.text}"
    if insn.source:
        text = f"{text:<{80 + len(indent)}} {insn.source}"
    return text
