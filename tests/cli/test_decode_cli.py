"""`ptscope decode` through the real CLI: good input, bad input, both decoders."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ptscope.fxt import read_trace
from ptscope.record.emulated import record
from support.cli import one_line_error, ptscope
from support.programs import build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rec")
    record([str(build("basics"))], directory)
    return directory


def dump(trace: Path) -> list[str]:
    result = ptscope("dump", str(trace))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_decode_recording_with_both_decoders_gives_the_same_trace(
    recording: Path, tmp_path: Path
) -> None:
    fast, text = tmp_path / "fast.fxt.gz", tmp_path / "text.fxt"
    r1 = ptscope("decode", str(recording), "-o", str(fast), "--decoder", "dlfilter")
    r2 = ptscope("decode", str(recording), "-o", str(text), "--decoder", "text")
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert "wrote" in r1.stdout and "ui.perfetto.dev" in r1.stdout
    lines = dump(fast)
    assert lines == dump(text)
    names = {line.split(maxsplit=5)[5] for line in lines}
    assert {"main", "_start"} <= names


def test_decode_a_bare_perf_data_and_the_default_output(recording: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ptscope", "decode", str(recording / "perf.data")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    trace = read_trace(tmp_path / "trace.fxt.gz")
    assert sum(len(v) for v in trace.slices.values()) > 10


def test_decode_perf_script_text_from_stdin(tmp_path: Path) -> None:
    text = (
        "  7/7  1.000000100:  1  branches:uH:  call  401000 main+0x10 (/a.out) =>"
        "  402000 work+0x0 (/a.out)\n"
        "  7/7  1.000000200:  1  branches:uH:  return  402010 work+0x10 (/a.out) =>"
        "  401015 main+0x15 (/a.out)\n"
    )
    out = tmp_path / "t.fxt"
    result = ptscope("decode", "--perf-script", "-", "-o", str(out), stdin=text)
    assert result.returncode == 0, result.stderr
    assert dump(out) == [
        "7 7 1000000100 1000000200 0 main",
        "7 7 1000000101 1000000200 1 work",
    ]


def test_missing_file(tmp_path: Path) -> None:
    line = one_line_error(ptscope("decode", str(tmp_path / "nope.data")), code=3)
    assert "no such file" in line


def test_not_a_perf_data(tmp_path: Path) -> None:
    junk = tmp_path / "junk.data"
    junk.write_text("this is not a perf.data file\n" * 10)
    for decoder in ("dlfilter", "text"):
        line = one_line_error(ptscope("decode", str(junk), "--decoder", decoder))
        assert "junk.data" in line


def test_empty_perf_data(tmp_path: Path) -> None:
    empty = tmp_path / "empty.data"
    empty.write_bytes(b"")
    for decoder in ("dlfilter", "text"):
        line = one_line_error(ptscope("decode", str(empty), "--decoder", decoder))
        assert f"{empty} is empty" in line


def test_perf_missing(recording: Path, tmp_path: Path) -> None:
    result = ptscope(
        "decode",
        str(recording),
        "-o",
        str(tmp_path / "t.fxt"),
        env={"PTSCOPE_PERF": "/nonexistent/perf"},
    )
    line = one_line_error(result, code=4)
    assert "perf not found" in line
    assert "apt-get install linux-perf" in result.stderr


def test_unwritable_output(recording: Path, tmp_path: Path) -> None:
    line = one_line_error(
        ptscope("decode", str(recording), "-o", str(tmp_path / "no" / "such" / "dir" / "t.fxt"))
    )
    assert "cannot write" in line


def test_usage_errors(recording: Path) -> None:
    one_line_error(ptscope("decode"), code=2)
    one_line_error(ptscope("decode", str(recording), "--perf-script", "-"), code=2)
    one_line_error(ptscope("decode", str(recording), "--pid", "abc"), code=2)


def test_verbose_shows_details(tmp_path: Path) -> None:
    junk = tmp_path / "junk.data"
    junk.write_text("junk\n")
    quiet = ptscope("decode", str(junk), "--decoder", "text")
    loud = ptscope("decode", str(junk), "--decoder", "text", "-v")
    assert "run with -v" in quiet.stderr
    assert len(loud.stderr.splitlines()) > len(quiet.stderr.splitlines())
    # -v before the command works too.
    assert ptscope("-v", "decode", str(junk), "--decoder", "text").stderr == loud.stderr
