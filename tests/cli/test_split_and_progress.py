"""`ptscope decode --split-size/--split-time` (parts that are each a valid trace, calls cut
at the boundaries and marked), and the progress bar (on a terminal only)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from support.emulated_corpus import decode_case_recording
from support.fxt_check import third_party_view
from support.perfetto_import import assert_perfetto_keeps_everything

pytestmark = pytest.mark.slow

PTSCOPE = [sys.executable, "-m", "ptscope"]


@pytest.fixture(scope="module")
def perf_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decode_case_recording("basics-static", tmp_path_factory)


def ptscope(*args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([*PTSCOPE, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out


def _slices(path: Path) -> list[tuple[int, int, str, str]]:
    """(start, end, name, continued) of every slice, read with the third-party reader."""
    view = third_party_view(path)
    rows = []
    for r in view.records:
        if type(r).__name__ == "DurationCompleteEventRecord":
            args = r.args  # type: ignore[attr-defined]
            rows.append(
                (r.timestamp_ns, r.duration_ns, r.name, str(args.get("continued", "")))  # type: ignore[attr-defined]
            )
    return rows


@pytest.mark.parametrize("how", [("--split-time", "20us"), ("--split-size", "2k")])
def test_split_parts_cover_the_whole_trace(
    perf_data: Path, tmp_path: Path, how: tuple[str, str]
) -> None:
    whole = tmp_path / "whole.fxt.gz"
    ptscope("decode", str(perf_data), "-o", str(whole))
    out = ptscope("decode", str(perf_data), "-o", str(tmp_path / "t.fxt.gz"), *how)
    parts = sorted(tmp_path.glob("t-*.fxt.gz"))
    assert len(parts) >= 3, out.stderr
    assert f"split into {len(parts)} parts" in out.stderr
    for part in parts:
        assert str(part.name) in out.stderr
    # Every call of the whole trace is in the parts: whole where it fits in one, else as
    # pieces end to end, the first marked "in next part", the last "from previous part".
    pieces: dict[tuple[int, str], list[tuple[int, int, str]]] = defaultdict(list)
    by_end: dict[tuple[int, str], list[tuple[int, int, str]]] = defaultdict(list)
    for part in parts:
        for start, end, name, continued in _slices(part):
            pieces[(start, name)].append((start, end, continued))
            by_end[(end, name)].append((start, end, continued))
    marked = 0
    for start, end, name, _ in _slices(whole):
        found = pieces.get((start, name), [])
        if any(e == end and not c for _, e, c in found):
            continue  # not cut
        first = next(p for p in found if "in next part" in p[2])
        last = next(p for p in by_end[(end, name)] if "from previous part" in p[2])
        assert first[1] <= last[0], (name, first, last)
        marked += 1
    assert marked >= 2  # main and its callers cross the boundaries


@pytest.mark.parametrize(
    "how",
    [
        ("--split-time", "20us"),
        ("--split-size", "2k"),
        ("--split-time", "30us", "--time-axis", "instructions"),
        ("--split-size", "5k", "--time-axis", "cycles"),
    ],
)
def test_perfetto_keeps_every_slice_of_every_part(
    perf_data: Path, tmp_path: Path, how: tuple[str, ...]
) -> None:
    """Issue 45: Perfetto dropped hundreds of slices from parts split at a time where a
    call begins (its parents' pieces, which begin there too, were written after it)."""
    ptscope("decode", str(perf_data), "-o", str(tmp_path / "t.fxt.gz"), *how)
    parts = sorted(tmp_path.glob("t-*.fxt.gz"))
    assert len(parts) >= 3
    assert_perfetto_keeps_everything(*parts)


@pytest.mark.parametrize("how", [("--split-time", "20us"), ("--split-size", "2k")])
def test_analyses_read_the_parts_as_one_trace(
    perf_data: Path, tmp_path: Path, how: tuple[str, str]
) -> None:
    whole = tmp_path / "whole.fxt.gz"
    ptscope("decode", str(perf_data), "-o", str(whole))
    ptscope("decode", str(perf_data), "-o", str(tmp_path / "t.fxt.gz"), *how)
    parts = [str(p) for p in sorted(tmp_path.glob("t-*.fxt.gz"))]
    assert len(parts) >= 3
    # Calls cut at the boundaries are joined again: the same calls, times and nesting.
    assert ptscope("dump", *parts).stdout == ptscope("dump", str(whole)).stdout

    def table(*paths: str) -> dict[str, tuple[int, int, int, int]]:
        out = json.loads(ptscope("stats", *paths, "--json", "--top", "0", "--exact").stdout)
        return {
            f["name"]: (f["calls"], f["total_ns"], f["self_ns"], f["max_ns"])
            for f in out["functions"]
        }

    assert table(*parts) == table(str(whole))


@pytest.mark.parametrize("every", ["20us", "1000s"])
def test_the_summary_names_only_files_that_were_written(
    perf_data: Path, tmp_path: Path, every: str
) -> None:
    """A split trace is its parts: the summary's "wrote" line names the first and the last
    part (or the only one), never OUT itself, which is not written."""
    out = ptscope("decode", str(perf_data), "-o", str(tmp_path / "t.fxt.gz"), "--split-time", every)
    assert not (tmp_path / "t.fxt.gz").exists()
    parts = sorted(tmp_path.glob("t-*.fxt.gz"))
    (wrote,) = [line for line in out.stderr.splitlines() if line.startswith("wrote ")]
    named = re.findall(r"\S+\.fxt\.gz", wrote)
    assert named == sorted({str(parts[0]), str(parts[-1])}), wrote
    assert f"({len(parts)} part{'s' if len(parts) > 1 else ''})" in wrote
    if every == "1000s":
        assert len(parts) == 1


@pytest.mark.parametrize(
    "bad",
    [
        ("--split-size", "1M", "--split-time", "1ms"),  # one or the other
        ("--split-size=lots",),
        ("--split-time=5",),
        ("--split-time=-1ms",),
    ],
)
def test_bad_split_options_are_one_line(
    perf_data: Path, tmp_path: Path, bad: tuple[str, ...]
) -> None:
    out = subprocess.run(
        [*PTSCOPE, "decode", str(perf_data), *bad],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def _run_in_a_terminal(argv: list[str]) -> str:
    """Run ``argv`` with a pseudo-terminal as stdout and stderr; what it printed."""
    main, sub = pty.openpty()
    proc = subprocess.Popen(argv, stdin=sub, stdout=sub, stderr=sub, close_fds=True)
    os.close(sub)
    chunks = []
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(main, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(main)
    assert proc.returncode == 0
    return b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal_and_quiet_otherwise(perf_data: Path, tmp_path: Path) -> None:
    argv = [*PTSCOPE, "decode", str(perf_data), "-o", str(tmp_path / "t.fxt.gz")]
    shown = _run_in_a_terminal(argv)
    assert "slices" in shown and "decoding" in shown, shown
    quiet = ptscope("decode", str(perf_data), "-o", str(tmp_path / "u.fxt.gz"))
    assert "decoding" not in quiet.stderr and "\x1b" not in quiet.stderr
