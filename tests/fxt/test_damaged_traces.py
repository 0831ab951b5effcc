"""Damaged traces: both readers refuse them with an FxtFormatError (which the commands
turn into one line), whatever the damage, and never hold more than the file could."""

from __future__ import annotations

import contextlib
import io
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ptscope.cli import main
from ptscope.fxt import FxtFormatError, read_trace, write_timeline
from ptscope.fxt import records as rec
from ptscope.fxt.columns import read_columns
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
@pytest.mark.parametrize("words", [0xFFFFFFFF, 1 << 28])
def test_a_record_announcing_gigabytes_holds_no_more_than_the_file(
    tmp_path: Path, reader: Callable[[Path], Any], words: int
) -> None:
    data = bytearray(_trace(tmp_path / "t.fxt").read_bytes())
    data[64:72] = (rec.RecordType.LARGE | (words << 4)).to_bytes(8, "little")
    path = tmp_path / "huge.fxt"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(FxtFormatError, match=f"truncated record: {words} words announced"):
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
    _refused_by_every_command(path, tmp_path, "truncated record")
