"""`ptscope insns`: every instruction one thread executed in a time range (the drill-down).

One line per instruction: perf time, address, symbol+offset indented by call depth,
disassembly, and source file:line where the binary has debug information
(``ptscope.decode.instructions``).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ptscope.cli.base import add_recording_argument
from ptscope.errors import BadInputError, UsageError

if TYPE_CHECKING:
    from ptscope.recording import Recording

__all__ = ["InsnsCommand", "parse_time_range"]

_TIME_RE = re.compile(r"^\s*(\d+)(?:\.(\d{1,9}))?\s*$")


def _perf_time(text: str, whole: str) -> int:
    m = _TIME_RE.match(text)
    if m is None:
        raise UsageError(
            f"--time takes START,END in perf's seconds (e.g. 1.000050000,1.000060000), "
            f"not {whole!r}"
        )
    return int(m.group(1)) * 1_000_000_000 + int((m.group(2) or "").ljust(9, "0"))


def parse_time_range(text: str) -> tuple[int, int]:
    """``START,END`` (perf's ``SEC.NSEC``, as ``perf script --time`` takes) in ns."""
    start, comma, end = text.partition(",")
    if not comma:
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
            "(e.g. 1.000050000,1.000060000; the `drill` arg of a slice gives the command)",
        )
        parser.add_argument("--symfs", type=Path, help="look for binaries under this directory")

    def run(self, args: argparse.Namespace) -> int:
        from ptscope.record.archive import is_archive, unpack_archive
        from ptscope.recording import Recording

        window = parse_time_range(args.time)
        path = Path(args.recording)
        if not path.exists():
            raise BadInputError(f"{path}: no such file or directory")
        if not is_archive(path):
            return _print(Recording.find(path), args.tid, window, args.symfs, path)
        if args.symfs is not None:
            raise UsageError("--symfs does not apply to an archive (it brings its own binaries)")
        with tempfile.TemporaryDirectory(prefix="ptscope-archive-") as tmp:
            unpacked = unpack_archive(path, Path(tmp))
            return _print(unpacked.recording, args.tid, window, unpacked.symfs, path)


def _print(
    recording: Recording, tid: int, window: tuple[int, int], symfs: Path | None, shown: Path
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
    count = 0
    out = sys.stdout
    try:
        for perf_data in recording.perf_data_paths():
            instructions = list_instructions(
                perf_data, perf=perf.path, tid=tid, window=window, symfs=symfs, listing=listing
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
        f"thread {tid} executed no traced instruction between {format_time(window[0])} "
        f"and {format_time(window[1])}"
    )
