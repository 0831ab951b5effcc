"""`ptscope dump` through the real CLI (a subprocess), and its errors on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ptscope.fxt import FxtWriter, write_timeline
from ptscope.timeline import Instant, ThreadTimeline, Timeline


def ptscope(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ptscope", *args], capture_output=True, text=True, timeout=60
    )


def thread(
    pid: int, tid: int, rows: list[tuple[int, int, int, int]], **kw: object
) -> ThreadTimeline:
    start, end, depth, name_id = (np.array(c) for c in zip(*rows, strict=True))
    n = len(rows)
    return ThreadTimeline(
        pid=pid, tid=tid, start=start.astype(np.int64), end=end.astype(np.int64),
        depth=depth.astype(np.int32), name_id=name_id.astype(np.int32),
        address=np.zeros(n, dtype=np.uint64), instructions=np.full(n, -1),
        cycles=np.full(n, -1), flags=np.zeros(n, dtype=np.uint8), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_dump_prints_sorted_slices_with_computed_depths(tmp_path: Path) -> None:
    names = ["main", "parse(char const*, int)", "memcpy", "weird\nname"]
    base = 1_700_000_000_123_456_789
    timeline = Timeline(
        names=names,
        threads=[
            thread(20, 21, [(base + 5, base + 9, 0, 0)]),
            thread(7, 8, [(base, base + 100, 0, 0), (base + 10, base + 40, 1, 1),
                          (base + 10, base + 20, 2, 2), (base + 50, base + 60, 1, 3)],
                   instants=[Instant(base + 45, "[decode error: overflow packet]")]),
        ],
        processes={7: "./prog"},
    )  # fmt: skip
    path = tmp_path / "trace.fxt.gz"
    write_timeline(timeline, path)
    result = ptscope("dump", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"7 8 {base} {base + 100} 0 main",
        f"7 8 {base + 10} {base + 40} 1 parse(char const*, int)",
        f"7 8 {base + 10} {base + 20} 2 memcpy",
        f"7 8 {base + 50} {base + 60} 1 weird\\nname",
        f"20 21 {base + 5} {base + 9} 0 main",
    ]
    with_instants = ptscope("dump", "--instants", str(path)).stdout.splitlines()
    assert with_instants[3] == f"7 8 {base + 45} instant [decode error: overflow packet]"
    assert len(with_instants) == 6


def test_dump_depth_comes_from_nesting_not_from_the_writer(tmp_path: Path) -> None:
    """A trace from another writer (begin/end pairs, written out of order): the depth is
    computed from how the slices nest."""
    path = tmp_path / "other.fxt"
    with FxtWriter.open(path, time_base=0) as w:
        w.complete(1, 2, 30, 35, "late")
        w.begin(1, 2, 0, "outer")
        w.complete(1, 2, 10, 20, "inner")
        w.end(1, 2, 40, "outer")
    assert ptscope("dump", str(path)).stdout.splitlines() == [
        "1 2 0 40 0 outer",
        "1 2 10 20 1 inner",
        "1 2 30 35 1 late",
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"", "empty file"),
        (b"#!/bin/sh\necho not a trace\n", "not a Fuchsia trace"),
        (b"\x1f\x8b\x08\x00garbage", "cannot decompress"),
        (b"\x10\x00\x04\x46\x78\x54\x16\x00\x21\x00", "truncated record header"),
    ],
)
def test_dump_bad_input_is_one_line_and_exit_3(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    path = tmp_path / "input.fxt"
    if content is not None:
        path.write_bytes(content)
    result = ptscope("dump", str(path))
    assert result.returncode == 3
    assert result.stdout == ""
    first, *rest = result.stderr.splitlines()
    assert first.startswith("ptscope: error: ") and message in first, result.stderr
    assert "Traceback" not in result.stderr
    assert len(rest) <= 1  # at most the hint


def test_dump_of_a_directory(tmp_path: Path) -> None:
    result = ptscope("dump", str(tmp_path))
    assert result.returncode == 3 and "is a directory" in result.stderr
