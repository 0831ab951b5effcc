"""`ptscope decode` through the real CLI: good input, bad input, both decoders."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ptscope.decode.perf_script import BRANCH_FIELDS
from ptscope.fxt import read_trace
from ptscope.perftool import find_perf, perf_env
from ptscope.record.emulated import record
from support.cli import one_line_error, ptscope
from support.emulated_corpus import perf_text
from support.perf_text_format import cut_inside_a_loop
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
    assert "wrote" in r1.stderr and "ui.perfetto.dev" in r1.stderr and r1.stdout == ""
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


def test_perf_script_text_as_documented_with_a_garbled_line(
    recording: Path, tmp_path: Path
) -> None:
    """The README's `perf script` command on a real recording, plus one line of terminal
    garbage: exactly that line is "not understood" (perf's own cbr lines are understood),
    counted in good English, and shown escaped, never raw, on the terminal."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    documented = re.search(r"`perf script (--ns --itrace=bep -F \S+)`", readme)
    assert documented, "the README documents the perf script command"
    assert documented[1].split()[-1] == BRANCH_FIELDS
    # Also without `synth`, as older notes had it: perf then prints cbr lines bare.
    for fields in (BRANCH_FIELDS, BRANCH_FIELDS.replace(",synth", "")):
        text = perf_text(recording / "perf.data", fields)
        assert " cbr: " in text
        garbage = "\x1b[2J\x1b]0;pwned\x07 not perf \x9boutput\x08\x7f"
        lines = text.splitlines(keepends=True)
        text = "".join([*lines[:5], garbage + "\n", *lines[5:]])
        out = tmp_path / "t.fxt"
        result = ptscope("decode", "--perf-script", "-", "-o", str(out), stdin=text)
        assert result.returncode == 0, result.stderr
        assert "  1 line of perf output not understood, e.g.:" in result.stderr, result.stderr
        assert not any(c in result.stderr for c in "\x1b\x07\x9b\x08\x7f"), repr(result.stderr)
        assert "\\x1b[2J\\x1b]0;pwned\\x07 not perf \\x9boutput\\x08\\x7f" in result.stderr


def test_cut_off_text_ends_open_frames_at_the_threads_last_time(
    recording: Path, tmp_path: Path
) -> None:
    """perf script text cut off in the middle of a loop (no call or return for a while):
    the frames still open end where the thread's input ends, not at its last call."""
    lines = perf_text(recording / "perf.data", BRANCH_FIELDS).splitlines(keepends=True)
    cut = cut_inside_a_loop(lines)
    (tmp_path / "cut.txt").write_text("".join(lines[: cut.index]))
    out = tmp_path / "cut.fxt"
    result = ptscope("decode", "--perf-script", str(tmp_path / "cut.txt"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    rows = read_trace(out).slices[(cut.pid, cut.tid)]
    assert max(s.end for s in rows) == cut.time_ns
    [looping] = [s for s in rows if s.name == cut.function and s.end == cut.time_ns]
    assert all(
        s.end == cut.time_ns
        for s in rows
        if s.depth < looping.depth and s.start <= looping.start <= s.end
    )


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
    no_perf = {"PTSCOPE_PERF": "/nonexistent/perf"}
    out = tmp_path / "t.fxt"
    result = ptscope("decode", "--decoder", "dlfilter", str(recording), "-o", str(out), env=no_perf)
    line = one_line_error(result, code=4)
    assert "perf not found" in line
    assert "apt-get install linux-perf" in result.stderr
    # The own decoder needs no perf.
    result = ptscope("decode", str(recording), "-o", str(out), env=no_perf)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 0


def test_unwritable_output(recording: Path, tmp_path: Path) -> None:
    # Checked before decoding (as run, attach and flame do): exit 2, the directory named.
    missing = tmp_path / "no" / "such" / "dir"
    line = one_line_error(ptscope("decode", str(recording), "-o", str(missing / "t.fxt")), 2)
    assert f"directory {missing} does not exist" in line


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


@pytest.mark.parametrize("name", ["trace.pftrace", "trace.json", "trace", "trace.fxt.zst"])
def test_an_output_named_for_another_format_is_refused(
    recording: Path, tmp_path: Path, name: str
) -> None:
    """ptscope writes only FXT: a name that promises another format (Perfetto's protobuf
    .pftrace, JSON...) is refused before anything is decoded, and nothing is written."""
    out = tmp_path / name
    line = one_line_error(ptscope("decode", str(recording), "-o", str(out)), code=2)
    assert f"-o {out}: ptscope writes only Fuchsia traces" in line
    assert ".fxt.gz" in line
    assert not any(tmp_path.iterdir())


def test_decode_into_dev_null(recording: Path) -> None:
    """An output that is a device (``/dev/null``) names no file: it is taken whatever its
    name, written in place, and stays what it was."""
    result = ptscope("decode", str(recording), "-o", "/dev/null")
    assert result.returncode == 0, result.stderr
    assert "wrote /dev/null" in result.stderr
    assert Path("/dev/null").is_char_device()


def test_run_refuses_an_output_named_for_another_format(tmp_path: Path) -> None:
    out = tmp_path / "trace.pftrace"
    result = ptscope(
        "run", "--backend", "emulated", "-o", str(out), "--", str(build("basics")), cwd=tmp_path
    )
    line = one_line_error(result, code=2)
    assert "ptscope writes only Fuchsia traces" in line
    assert "basics " not in result.stdout  # the program did not run
    assert not any(tmp_path.iterdir())


def _perf_script(perf_data: Path, *options: str) -> str:
    done = subprocess.run(
        [find_perf().path, "script", "-i", str(perf_data), *options],
        capture_output=True,
        text=True,
        env=perf_env(),
        check=True,
    )
    return done.stdout


WITHOUT = {
    "synth,event,period": ",".join(
        f for f in BRANCH_FIELDS.split(",") if f not in ("synth", "event", "period")
    ),
    "symoff": BRANCH_FIELDS.replace(",symoff", ""),
    "pid": BRANCH_FIELDS.replace("pid,tid,", "tid,"),
}


@pytest.mark.parametrize(
    ("fields", "lacks"),
    [
        ("comm," + BRANCH_FIELDS, None),
        (WITHOUT["synth,event,period"], "-F synth,event (CPU frequency changes)"),
        (WITHOUT["symoff"], "-F symoff (function entries"),
        (WITHOUT["pid"], "-F pid,tid (one id per line"),
    ],
    ids=["with-comm", "without-synth-event-period", "without-symoff", "without-pid"],
)
def test_perf_script_text_with_other_fields_is_decoded_and_what_it_lacks_said(
    recording: Path, tmp_path: Path, fields: str, lacks: str | None
) -> None:
    """Text with more or fewer -F fields than the README's is decoded as far as it can
    be, and one line says which fields it lacks for what (none when nothing is lost)."""
    perf_data = recording / "perf.data"
    documented = tmp_path / "documented.fxt"
    done = ptscope(
        "decode", "--perf-script", "-", "-o", str(documented),
        stdin=perf_text(perf_data, BRANCH_FIELDS),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = tmp_path / "t.fxt"
    done = ptscope(
        "decode", "--perf-script", "-", "-o", str(out), stdin=perf_text(perf_data, fields)
    )
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "lacks" in line]
    if lacks is None:
        assert said == []
    else:
        [line] = said
        assert lacks in line and BRANCH_FIELDS in line, line
    if fields != WITHOUT["symoff"]:  # nothing a call needs is lost: the same trace
        assert dump(out) == dump(documented)
    else:
        assert {"main", "_start"} <= {row.split(maxsplit=5)[5] for row in dump(out)}


@pytest.mark.parametrize(
    ("options", "lacks"),
    [
        ((), "-F flags (which branches are calls, returns or jumps)"),
        (("--ns", "--itrace=bep", "-F", BRANCH_FIELDS.replace("time,", "")), "-F time"),
        (("--ns", "--itrace=bep", "-F", BRANCH_FIELDS.replace("addr,", "")), "branches"),
    ],
    ids=["plain-perf-script", "without-time", "without-addr"],
)
def test_perf_script_text_from_which_no_call_can_be_rebuilt_is_one_error(
    recording: Path, tmp_path: Path, options: tuple[str, ...], lacks: str
) -> None:
    """Plain `perf script` (no flags) or text without times or targets: one line naming
    what is missing, the documented command as the hint, and no trace written."""
    text = tmp_path / "script.txt"
    text.write_text(_perf_script(recording / "perf.data", *options))
    out = tmp_path / "t.fxt"
    result = ptscope("decode", "--perf-script", str(text), "-o", str(out))
    line = one_line_error(result, code=3)
    assert f"{text}: no call can be rebuilt from this perf script text" in line
    assert lacks in line, line
    assert BRANCH_FIELDS in result.stderr
    assert not out.exists()
