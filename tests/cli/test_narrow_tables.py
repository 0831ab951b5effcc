"""``stats`` and ``diff`` tables on an 80-column terminal (issue 44): the function column
keeps a readable width, a long name is shortened in the middle with ``…``, the other
columns give way (and a line says which); ``--wide`` keeps every column and whole names.
The commands run in a real pseudo-terminal of that size."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pytest

from ptscope.fxt import write_timeline
from ptscope.timeline import Timeline
from support.timeline_strategies import thread_of_rows

LONG = (
    "std::vector<std::pair<std::basic_string<char>, std::map<int, std::basic_string<char> > > >"
    "::_M_realloc_insert<std::pair<std::basic_string<char>, int> const&>(iterator, value_type)"
)
NAMES = ["main", LONG, "short_leaf"]


def _trace(path: Path, extra: int) -> Path:
    rows = [(0, 1000, 0, 0), (10, 400, 1, 1), (500, 900, 1, 2), (600, 700, 2, 1)]
    timeline = Timeline(names=list(NAMES), threads=[thread_of_rows(1, 1, rows)])
    thread = timeline.threads[0]
    thread.instructions = np.array([10_000, 3_000 + extra, 4_000, 500], dtype=np.int64)
    thread.cycles = thread.instructions * 2
    write_timeline(timeline, path)
    return path


def _in_terminal(columns: int, *argv: str) -> list[str]:
    """``ptscope ARGV``'s lines, run with a pseudo-terminal of ``columns`` as its output."""
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ptscope", *argv],
        stdin=sub, stdout=sub, stderr=sub, env=env, close_fds=True,
    )  # fmt: skip
    os.close(sub)
    chunks = []
    while select.select([main], [], [], 60)[0]:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the other side is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode())
    return [line.rstrip() for line in text.replace("\r", "").splitlines()]


@pytest.fixture
def traces(tmp_path: Path) -> tuple[Path, Path]:
    return _trace(tmp_path / "a.fxt.gz", 0), _trace(tmp_path / "b.fxt.gz", 700)


def _shortened_row(lines: list[str]) -> str:
    [row] = [line for line in lines if line.startswith("std::vector<")]
    return row


def test_stats_on_80_columns(traces: tuple[Path, Path]) -> None:
    lines = _in_terminal(80, "stats", str(traces[0]))
    header = next(line for line in lines if line.startswith("function"))
    table = lines[lines.index(header) :]  # (the line above names the trace, whole)
    assert all(len(line) <= 80 for line in table), "\n".join(lines)
    assert header.split()[:5] == ["function", "calls", "total", "%", "self"]
    row = _shortened_row(lines)
    name = row.split("  ")[0]
    assert "…" in name and len(name) >= 30  # (cli.table.NAME_MIN)
    head, tail = name.split("…")
    assert LONG.startswith(head) and LONG.endswith(tail)
    assert row.split()[-1].endswith("ns")  # the row goes on with its numbers
    assert any(line.startswith("(left out to fit 80 columns: ") for line in lines)
    wide = _in_terminal(80, "stats", str(traces[0]), "--wide")
    assert any(line.startswith(LONG + " ") for line in wide), "\n".join(wide)
    assert "p90" in next(line for line in wide if line.startswith("function"))


def test_diff_on_80_columns_keeps_the_function_column(traces: tuple[Path, Path]) -> None:
    lines = _in_terminal(80, "diff", str(traces[0]), str(traces[1]))
    table = lines[lines.index(next(line for line in lines if line.startswith("function"))) :]
    assert all(len(line) <= 80 for line in table), "\n".join(lines)
    assert "change" in table[0]
    row = _shortened_row(table)
    assert "…" in row and "+700 (+20.0%)" in row
    assert any(line.startswith("main ") for line in table)
    wide = _in_terminal(80, "diff", str(traces[0]), str(traces[1]), "--wide")
    assert any(line.startswith(LONG + " ") for line in wide), "\n".join(wide)


def test_fitting_rules() -> None:
    from ptscope.cli.table import NAME_MIN, fit, shorten_middle

    assert shorten_middle("abcdefghij", 5) == "ab…ij"
    assert shorten_middle("abc", 5) == "abc"
    headers = ["function", "a", "b", "c"]
    rows = [["x" * 100, "1" * 10, "2" * 10, "3" * 10]]
    # Everything fits: nothing left out, the name whole.
    assert fit(headers, rows, 200, [3, 2, 1]).name_width == 100
    # 80 columns: the name gets what the numbers leave it.
    fitted = fit(headers, rows, 80, [3, 2, 1])
    assert fitted.columns == [0, 1, 2, 3] and fitted.name_width == 80 - 36
    # 54: a column gives way so that the name keeps NAME_MIN.
    fitted = fit(headers, rows, 54, [3, 2, 1])
    assert fitted.columns == [0, 1, 2] and fitted.left_out == ["c"]
    assert fitted.name_width == NAME_MIN
    assert fit(headers, rows, None, [3]).columns == [0, 1, 2, 3]
