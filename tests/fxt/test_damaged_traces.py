"""Damaged traces: both readers refuse them with an FxtFormatError (which the commands
turn into one line), whatever the damage, and never hold more than the file could."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import tempfile
import tracemalloc
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ptscope.cli import main
from ptscope.fxt import FxtFormatError, FxtWriter, read_trace, write_timeline
from ptscope.fxt import records as rec
from ptscope.fxt.columns import read_columns, timeline_from_trace
from ptscope.fxt.reader import MAX_INFLATION, MAX_LARGE_RECORD_WORDS
from ptscope.fxt.writer import ArgValue, UInt64
from ptscope.timeline import ThreadTimeline, Timeline

READERS: list[Callable[[Path], Any]] = [read_trace, read_columns]
COMMANDS = [["dump"], ["stats"], ["flame"], ["flame", "--chart"]]


def _trace(path: Path) -> Path:
    n = 200
    start = np.arange(n, dtype=np.int64) * 10 + 1_000_000
    thread = ThreadTimeline(
        pid=1, tid=1, start=start, end=start + 5, depth=np.zeros(n, dtype=np.int32),
        name_id=(np.arange(n) % 7).astype(np.int32), address=np.zeros(n, dtype=np.uint64),
        instructions=np.full(n, -1), cycles=np.full(n, -1), flags=np.zeros(n, dtype=np.uint8),
    )  # fmt: skip
    write_timeline(Timeline(names=[f"f{i}" for i in range(7)], threads=[thread]), path)
    return path


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


def _refused_by_every_command(path: Path, tmp_path: Path, message: str) -> None:
    for command in COMMANDS:
        out = ["-o", str(tmp_path / "f.svg")] if command[0] == "flame" else []
        code, err = _run(*command, str(path), *out)
        assert code == 3, err
        [line] = [ln for ln in err.splitlines() if ln.startswith("ptscope:")]
        assert line.startswith(f"ptscope: error: cannot read {path}: {message}"), err


def test_a_damaged_gzip_stream_is_one_line_for_every_command(tmp_path: Path) -> None:
    """ISA-L (the columnar reader's inflater) raises its own error, not zlib's."""
    data = bytearray(_trace(tmp_path / "t.fxt.gz").read_bytes())
    for i in range(40, 60):
        data[i] ^= 0x55
    path = tmp_path / "damaged.fxt.gz"
    path.write_bytes(data)
    for reader in READERS:
        with pytest.raises(FxtFormatError, match="cannot decompress"):
            reader(path)
    _refused_by_every_command(path, tmp_path, "cannot decompress")


@pytest.mark.parametrize("reader", READERS, ids=["strict", "columnar"])
@pytest.mark.parametrize("words", [0xFFFFFFFF, 1 << 28, MAX_LARGE_RECORD_WORDS])
def test_a_record_announcing_gigabytes_holds_no_more_than_the_file(
    tmp_path: Path, reader: Callable[[Path], Any], words: int
) -> None:
    """A large record past the readers' limit is refused at its header; one within it
    that the file does not hold, once the file ends."""
    data = bytearray(_trace(tmp_path / "t.fxt").read_bytes())
    data[64:72] = (rec.RecordType.LARGE | (words << 4)).to_bytes(8, "little")
    path = tmp_path / "huge.fxt"
    path.write_bytes(data)
    message = (
        f"truncated record: {words} words announced"
        if words <= MAX_LARGE_RECORD_WORDS
        else f"a large record of {words:,} words, more than the {MAX_LARGE_RECORD_WORDS:,}"
    )
    tracemalloc.start()
    try:
        with pytest.raises(FxtFormatError, match=message):
            reader(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes held to read a file of {len(data):,}"


def test_a_record_announcing_gigabytes_is_one_line_for_every_command(tmp_path: Path) -> None:
    data = bytearray(_trace(tmp_path / "t.fxt").read_bytes())
    data[64:72] = (rec.RecordType.LARGE | (0xFFFFFFFF << 4)).to_bytes(8, "little")
    path = tmp_path / "huge.fxt"
    path.write_bytes(data)
    _refused_by_every_command(path, tmp_path, "a large record of 4,294,967,295 words")


def _gzip_bomb(path: Path, head: bytes, piece: bytes, size: int) -> Path:
    """``head``, then ``piece`` repeated to ``size`` bytes, gzip-compressed (small)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = piece * ((1 << 20) // len(piece))
    with open(path, "wb") as f:
        f.write(packer.compress(head))
        for _ in range(size // len(block)):
            f.write(packer.compress(block))
        f.write(packer.flush())
    return path


# The command's own peak RSS, as its exit handlers see it: VmHWM belongs to the process's
# memory since its exec. (A child's ru_maxrss counts the parent's pages it shared before its
# exec, so it grew with the test worker's own size: 650 MB late in a suite run.)
_WITH_HWM = """
import atexit, sys
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write(f"\\nptscope-test-hwm {int(line.split()[1]) * 1024}\\n")
atexit.register(_hwm)
sys.argv[0] = "ptscope"
from ptscope.cli import run
run()
"""


def _peak_rss(*argv: str) -> tuple[int, str, int]:
    """``ptscope ARGV`` in a process of its own: exit code, stderr, peak RSS in bytes."""
    with tempfile.TemporaryFile() as err:
        child = subprocess.run([sys.executable, "-c", _WITH_HWM, *argv],
                               stdout=subprocess.DEVNULL, stderr=err, check=False)  # fmt: skip
        err.seek(0)
        text = err.read().decode()
    lines = text.splitlines()
    hwm = [int(x.split()[1]) for x in lines if x.startswith("ptscope-test-hwm ")]
    assert hwm, text
    rest = "\n".join(x for x in lines if not x.startswith("ptscope-test-hwm ")).strip("\n")
    return child.returncode, rest + "\n", hwm[-1]


_BOMBS = [
    "a large record claiming 32 GiB",
    "valid records inflating 1,000 times",
    "valid records changing a string, inflating 800 times",
]


@pytest.fixture(scope="module", params=_BOMBS)
def bomb(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small .fxt.gz that inflates to 256 MiB: one record claiming 2^32 words (then
    zeros), one string record repeated, or two setting the same index in turn (each
    valid)."""
    tmp = tmp_path_factory.mktemp("bomb")
    plain = _trace(tmp / "t.fxt").read_bytes()
    if request.param == _BOMBS[0]:
        head = plain[:64] + (rec.RecordType.LARGE | (0xFFFFFFFF << 4)).to_bytes(8, "little")
        path = _gzip_bomb(tmp / "large.fxt.gz", head, bytes(8), 256 << 20)
    elif request.param == _BOMBS[1]:
        path = _gzip_bomb(
            tmp / "strings.fxt.gz", plain[:64], rec.string_record(1, b"f0"), 256 << 20
        )
    else:
        piece = rec.string_record(1, b"f0") + rec.string_record(1, b"f1")
        path = _gzip_bomb(tmp / "changing-strings.fxt.gz", plain[:64], piece, 256 << 20)
    assert path.stat().st_size < 1 << 20
    return path


_STOPPED = (
    "(a large record of 4,294,967,295 words|"
    f"it decompresses to more than {MAX_INFLATION} times its size)"
)


def test_both_readers_stop_a_gzip_bomb(bomb: Path) -> None:
    """At the record's claim or at the inflation limit, whichever comes first."""
    for reader in READERS:
        with pytest.raises(FxtFormatError, match=_STOPPED):
            reader(bomb)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_gzip_bomb_is_one_line_in_little_memory(
    bomb: Path, tmp_path: Path, command: list[str]
) -> None:
    """Every command stops a gzip bomb in one line, under 200 MB."""
    out = ["-o", str(tmp_path / "f.svg")] if command[0] == "flame" else []
    code, err, peak = _peak_rss(*command, str(bomb), *out)
    assert code == 3 and re.search(f"cannot read {bomb}: {_STOPPED}", err), err
    assert len(err.strip().splitlines()) == 1, err
    assert peak < 200 << 20, f"{command}: {peak:,} bytes"


def _written(path: Path, draw: Callable[[FxtWriter], None], time_base: int = 0) -> Path:
    with FxtWriter.open(path, time_base=time_base) as writer:
        draw(writer)
    return path


@pytest.mark.parametrize(
    ("time_base", "start", "end"),
    [
        (UInt64((1 << 64) - 1), 0, 10),  # a time base past 63 bits
        (0, (1 << 63) + 5, (1 << 64) - 1),  # times past 63 bits
        ((1 << 62), (1 << 62), (1 << 62) + 10),  # fine apart, not added up
    ],
)
def test_times_out_of_range_are_a_damaged_trace(
    tmp_path: Path, time_base: int, start: int, end: int
) -> None:
    def draw(writer: FxtWriter) -> None:
        writer.process(1, "p", {rec.ARG_TIME_BASE: time_base})
        writer.complete(1, 1, start, end, "f")

    path = _written(tmp_path / "t.fxt", draw)
    for reader in READERS:
        with pytest.raises(FxtFormatError, match="is out of range"):
            reader(path)
    _refused_by_every_command(path, tmp_path, "a time of")


def test_counts_and_addresses_out_of_range_read_as_unknown_by_both_readers(
    tmp_path: Path,
) -> None:
    """Arguments that do not fit the columns: an instruction count past 63 bits, a
    negative address. On our own complete events and on begin/end pairs (which the
    columnar reader hands to the strict one)."""
    args: dict[str, ArgValue] = {
        rec.ARG_INSTRUCTIONS: UInt64((1 << 64) - 1),
        rec.ARG_CYCLES: -7,
        rec.ARG_ADDRESS: -5,
    }

    def draw(writer: FxtWriter) -> None:
        writer.complete(1, 1, 0, 10, "f", args)
        writer.begin(1, 2, 0, "g", args)
        writer.end(1, 2, 10, "g")

    path = _written(tmp_path / "t.fxt", draw)
    strict = timeline_from_trace(read_trace(path))
    for timeline in (strict, read_columns(path).to_timeline()):
        for thread in timeline.threads:
            assert thread.instructions.tolist() == [-1]
            assert thread.cycles.tolist() == [-1]
            assert thread.address.tolist() == [0]


def test_a_trace_whose_sums_would_not_fit_64_bits_is_one_line_for_stats_and_flame(
    tmp_path: Path,
) -> None:
    """Calls as long as 2^61 ns on four threads: the statistics would add up past 2^63 (and
    numpy would warn about casts, or wrap around)."""

    def draw(writer: FxtWriter) -> None:
        for tid in range(4):
            writer.complete(1, tid, 0, 1 << 61, "main")
            writer.complete(1, tid, 5, 10, "leaf")

    path = _written(tmp_path / "t.fxt", draw)
    for command in COMMANDS[1:]:
        out = ["-o", str(tmp_path / "f.svg")] if command[0] == "flame" else []
        code, err = _run(*command, str(path), *out)
        assert code == 3, err
        [line] = err.splitlines()
        assert "more time than the statistics can add up" in line


def test_string_indexes_reused_across_blocks_resolve_as_the_strict_reader_does(
    tmp_path: Path,
) -> None:
    """The chunk reader keeps only each string index's last record once a block's slices
    are resolved (the gzip bombs above): a trace of more names than the string table holds
    (its indexes reused), over several of the reader's blocks, reads as the strict reader
    reads it, and an index set again to the text it holds changes nothing."""
    from ptscope.fxt.chunks import BLOCK_BYTES, ChunkReader

    n = 200_000
    names = [f"function_{k:06d}_" + "x" * 60 for k in range(n)]
    start = np.arange(n, dtype=np.int64) * 10 + 1_000_000
    thread = ThreadTimeline(
        pid=1, tid=1, start=start, end=start + 5, depth=np.zeros(n, dtype=np.int32),
        name_id=np.arange(n, dtype=np.int32)[::-1].copy(), address=np.zeros(n, dtype=np.uint64),
        instructions=np.full(n, -1), cycles=np.full(n, -1), flags=np.zeros(n, dtype=np.uint8),
    )  # fmt: skip
    path = tmp_path / "t.fxt"
    write_timeline(Timeline(names=names, threads=[thread]), path)
    assert path.stat().st_size > 2 * BLOCK_BYTES
    reader = ChunkReader([path])
    texts = [reader.meta.texts[int(t)] for c in reader.chunks() for t in c.text]
    strict = read_trace(path)
    assert texts == [s.name for s in strict.slices[(1, 1)]]
