"""`ptscope insns`: every instruction one thread executed in a time range (the drill-down).

One line per instruction: perf time, address, symbol+offset indented by call depth,
disassembly, and source file:line where the binary has debug information
(``ptscope.decode.instructions``). With ``--after ADDRESS:K --count N`` (what a slice's
``drill`` arg gives) exactly one call: the N instructions after the K-th instruction at
ADDRESS dated START, its first and last lines marked.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, overload

from ptscope.cli.base import add_recording_argument, check_input
from ptscope.errors import BadInputError, UsageError

if TYPE_CHECKING:
    from ptscope.decode.instructions import InstructionListing
    from ptscope.recording import Recording

__all__ = ["InsnsCommand", "parse_anchor", "parse_time_range"]

_TIME_RE = re.compile(r"^\s*(\d{1,30})(?:\.(\d{1,9}))?\s*$")
_ANCHOR_RE = re.compile(r"^\s*(0[xX][0-9a-fA-F]{1,30}):(\d{1,30})\s*$")

MAX_PERF_TIME = 1 << 62
"""The latest time ``--time`` takes, in ns (146 years of uptime): perf's own parser
overflows near 2**63 ns and then never ends."""
MAX_ANCHOR = (1 << 64) - 1
"""The largest address, occurrence and count ``--after``/``--count`` take."""

FIRST_MARK = "> "
"""Marks the first line of a call listed with ``--after`` (``<`` its last, ``<>`` both)."""
LAST_MARK = "< "
ONLY_MARK = "<>"


def _perf_time(text: str, whole: str) -> int:
    m = _TIME_RE.match(text)
    if m is None:
        raise UsageError(
            f"--time takes START,END in perf's seconds (e.g. 1.000050000,1.000060000; "
            f"START alone with --after), not {whole!r}"
        )
    ns = int(m.group(1)) * 1_000_000_000 + int((m.group(2) or "").ljust(9, "0"))
    if ns > MAX_PERF_TIME:
        raise UsageError(
            f"--time {whole}: {text.strip()} is past any perf time "
            f"(at most {MAX_PERF_TIME // 10**9}.{MAX_PERF_TIME % 10**9:09d} s)"
        )
    return ns


def parse_anchor(text: str) -> tuple[int, int]:
    """``0xADDRESS:K`` (K >= 1) -> (address, K)."""
    m = _ANCHOR_RE.match(text)
    if m is None or not 1 <= int(m.group(2)) <= MAX_ANCHOR or int(m.group(1), 16) > MAX_ANCHOR:
        raise UsageError(f"--after takes 0xADDRESS:K (K from 1; e.g. 0x401136:2), not {text!r}")
    return int(m.group(1), 16), int(m.group(2))


@overload
def parse_time_range(text: str) -> tuple[int, int]: ...
@overload
def parse_time_range(text: str, *, open_end: bool) -> tuple[int, int | None]: ...
def parse_time_range(text: str, *, open_end: bool = False) -> tuple[int, int | None]:
    """``START,END`` (perf's ``SEC.NSEC``, as ``perf script --time`` takes) in ns; with
    ``open_end``, ``START`` alone too, whose end is None (the recording's)."""
    start, comma, end = text.partition(",")
    if not comma:
        if open_end:
            return _perf_time(start, text), None
        _perf_time("", text)  # the same one-line error
    first, last = _perf_time(start, text), _perf_time(end, text)
    if last < first:
        raise UsageError(f"--time {text}: the range ends before it starts")
    return first, last


class InsnsCommand:
    name = "insns"
    help = "print every instruction a thread executed in a time range (drill-down)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_recording_argument(parser)
        parser.add_argument("--tid", type=int, required=True, help="the thread")
        parser.add_argument(
            "--time",
            required=True,
            metavar="START,END",
            help="perf times in seconds, as perf script --time takes them "
            "(e.g. 1.000050000,1.000060000; the `drill` arg of a slice gives the command); "
            "with --after, START alone: the call's own end is where its count ends",
        )
        parser.add_argument(
            "--after",
            metavar="0xADDRESS:K",
            help="list one call only: the instructions after the K-th instruction at ADDRESS "
            "dated START (the call or jump that began the call); needs --count. The "
            "call's first line is marked '>', its last '<' ('<>' a call of one instruction)",
        )
        parser.add_argument(
            "--count",
            type=int,
            metavar="N",
            help="with --after: how many instructions the call ran (its slice's "
            "instructions arg); fewer in the range: what there is, and a warning",
        )
        parser.add_argument("--symfs", type=Path, help="look for binaries under this directory")

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.children import temporary_directory
        from ptscope.record.archive import is_archive, unpack_archive
        from ptscope.recording import Recording

        if (args.after is None) != (args.count is None):
            raise UsageError("--after and --count go together (a slice's drill arg has both)")
        window = parse_time_range(args.time, open_end=args.after is not None)
        call = None
        if args.after is not None:
            if args.count < 1:
                raise UsageError(f"--count {args.count}: a call runs at least 1 instruction")
            call = (*parse_anchor(args.after), args.count)
        path = check_input(Path(args.recording))
        if not path.exists():
            raise BadInputError(f"{path}: no such file or directory")
        if not is_archive(path):
            return _print(Recording.find(path), args.tid, window, call, args.symfs, path)
        if args.symfs is not None:
            raise UsageError("--symfs does not apply to an archive (it brings its own binaries)")
        with temporary_directory("ptscope-archive-") as tmp:
            unpacked = unpack_archive(path, tmp)
            return _print(unpacked.recording, args.tid, window, call, unpacked.symfs, path)


def _print(
    recording: Recording,
    tid: int,
    window: tuple[int, int | None],
    call: tuple[int, int, int] | None,
    symfs: Path | None,
    shown: Path,
) -> int:
    from ptscope.decode.instructions import (
        InstructionListing,
        format_instruction,
        list_instructions,
    )
    from ptscope.decode.perf_script import binary_resolver, format_time
    from ptscope.perftool import find_perf

    if recording.threads and tid not in recording.threads:
        known = ", ".join(map(str, sorted(recording.threads)))
        raise BadInputError(f"thread {tid} is not in {shown} (its threads: {known})")
    perf = find_perf()
    listing = InstructionListing(tid, binary_resolver(symfs))
    if call is not None:
        return _print_call(recording, tid, window, call, symfs, shown, listing)
    start, end = window
    assert end is not None  # (only a call's range may be open)
    count = 0
    out = sys.stdout
    try:
        for perf_data in recording.perf_data_paths():
            instructions = list_instructions(
                perf_data,
                perf=perf.path,
                tid=tid,
                window=(start, end),
                symfs=symfs,
                listing=listing,
            )
            for i in range(0, len(instructions), 4096):
                out.write("\n".join(map(format_instruction, instructions[i : i + 4096])) + "\n")
            count += len(instructions)
    finally:
        listing.close()
    out.flush()
    if count:
        return 0
    if not listing.thread_seen:
        raise BadInputError(f"thread {tid} is not in {shown}")
    raise BadInputError(
        f"thread {tid} executed no traced instruction between {format_time(start)} "
        f"and {format_time(end)}"
    )


def _print_call(
    recording: Recording,
    tid: int,
    window: tuple[int, int | None],
    call: tuple[int, int, int],
    symfs: Path | None,
    shown: Path,
    listing: InstructionListing,
) -> int:
    """Exactly one call: the ``count`` instructions after the anchor, first and last
    marked. An anchor not in the range is an error; a call cut short (a decode error, a
    range or a recording that ends early) is printed as far as it goes, with a warning.
    The range may be open (no END, as in a drill arg): perf is stopped once the call is
    complete, or once the thread runs past START without the anchor."""
    from ptscope.decode.instructions import CallPicker, format_instruction, pick_call
    from ptscope.decode.perf_script import format_time
    from ptscope.perftool import find_perf

    anchor, occurrence, count = call
    picker = CallPicker(anchor, occurrence, window[0], count)
    perf = find_perf()
    try:
        for perf_data in recording.perf_data_paths():
            pick_call(
                perf_data, picker, perf=perf.path, tid=tid, window=window, symfs=symfs,
                listing=listing,
            )  # fmt: skip
    finally:
        listing.close()
    if not picker.found:
        if not listing.thread_seen:
            raise BadInputError(f"thread {tid} is not in {shown}")
        raise BadInputError(
            f"thread {tid} executed no instruction {occurrence} at {anchor:#x} at "
            f"{format_time(window[0])}: the call is not there"
        )
    instructions = picker.instructions()
    real = [k for k, insn in enumerate(instructions) if insn.error is None]
    first = real[0] if real else -1
    last = real[-1] if picker.complete else -1
    lines = []
    for k, insn in enumerate(instructions):
        mark = (
            ONLY_MARK
            if k == first == last
            else FIRST_MARK
            if k == first
            else LAST_MARK
            if k == last
            else "  "
        )
        lines.append(mark + format_instruction(insn))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    if not picker.complete:
        where = (
            "before the recording ends"
            if window[1] is None
            else f"in {format_time(window[0])},{format_time(window[1])}"
        )
        print(
            f"ptscope: warning: only {picker.taken} of the call's {count} instructions "
            f"follow its start {where}",
            file=sys.stderr,
        )
    return 0
