"""Every number, size, time and path a command takes has limits, and a value past them is
one line and a non-zero exit, never a traceback, a hang or thousands of files (issue 20,
item 9): ``--split-time 1e400s``, ``--split-time 1ns`` on a trace of microseconds,
``stats --time 9999999999s,``, ``decode -o`` a file that cannot be written as one.

Run as a user runs ptscope (a subprocess), on a real recording (the emulated backend on
/bin/true) and its trace."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from ptscope.errors import PtscopeError
from ptscope.fxt.stream import MAX_PARTS, TooManyParts, TraceStream, part_path
from ptscope.timeline import SliceBatch
from support.cli import one_line_error, ptscope


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ptscope.record.emulated import record

    directory = tmp_path_factory.mktemp("limits") / "rec"
    record(["/bin/true"], directory)
    return directory


@pytest.fixture(scope="module")
def trace(recording: Path) -> Path:
    out = recording.parent / "true.fxt.gz"
    done = ptscope("decode", str(recording), "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


def refused(*args: str, code: int | None = None, cwd: Path | None = None) -> str:
    """The command failed with one error line: ptscope's own, or argparse's (``ptscope
    CMD: error: argument ...``, also one line)."""
    done = ptscope(*args, cwd=cwd, timeout=60)
    if done.stderr.startswith(f"ptscope {args[0]}: error: argument "):
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        return done.stderr.strip()
    return one_line_error(done, code)


# -- split: no overflow, and a bounded number of parts ------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--split-time", "1e400s", "too large a duration"),
        ("--split-time", "9e18s", "too large a duration"),
        ("--split-time", "nans", "is not a duration"),
        ("--split-time", "infms", "too large a duration"),
        ("--split-size", "inf", "too large a size"),
        ("--split-size", "1e400", "too large a size"),
        ("--split-size", "nan", "is not a size"),
        ("--split-size", "99999999999T", "too large a size"),
    ],
)
def test_split_values_past_every_limit_are_one_line(
    recording: Path, tmp_path: Path, option: str, value: str, message: str
) -> None:
    done = ptscope("decode", str(recording), "-o", str(tmp_path / "t.fxt.gz"), option, value)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and message in done.stderr, done.stderr


@pytest.mark.parametrize("every", ["1ns", "10ns"])
def test_a_split_into_too_many_parts_is_refused_and_leaves_nothing(
    recording: Path, tmp_path: Path, every: str
) -> None:
    out = tmp_path / "parts"
    out.mkdir()
    line = refused("decode", str(recording), "-o", str(out / "t.fxt.gz"), "--split-time", every)
    assert f"would cut this trace into more than {MAX_PARTS:,} parts" in line
    assert "choose a longer DURATION" in line
    assert list(out.iterdir()) == []


def batch(time: int) -> SliceBatch:
    """One call of 10 ns at ``time``."""
    one = np.ones(1, dtype=np.int64)
    return SliceBatch(
        names=["f"],
        pid=one * 7,
        tid=one * 7,
        start=one * time,
        end=one * (time + 10),
        name_id=np.zeros(1, dtype=np.int32),
        address=np.ones(1, dtype=np.uint64),
        instructions=one,
        cycles=one,
        flags=np.zeros(1, dtype=np.uint8),
    )


def test_a_size_split_stops_at_the_most_parts(tmp_path: Path) -> None:
    """Each batch outgrows a 1-byte part: part 1,001 is refused, the others removed."""
    stream = TraceStream(tmp_path / "t.fxt", 0, split_size=1)
    with pytest.raises(TooManyParts) as error:
        for i in range(MAX_PARTS + 1):
            stream.write(batch(100 * i))
    assert error.value.message == (
        f"--split-size 1 bytes would cut this trace into more than {MAX_PARTS:,} parts: "
        "choose a bigger SIZE"
    )
    assert error.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []


def test_a_refused_split_keeps_the_parts_that_were_there(tmp_path: Path) -> None:
    """A refused split removes only what it wrote: a part's earlier file (a trace of a
    decode before) stays as it was, and so does a part that is a FIFO."""
    first = part_path(tmp_path / "t.fxt", 0)
    first.write_bytes(b"an earlier trace")
    os.mkfifo(part_path(tmp_path / "t.fxt", 2))
    reader = os.open(part_path(tmp_path / "t.fxt", 2), os.O_RDONLY | os.O_NONBLOCK)
    try:
        stream = TraceStream(tmp_path / "t.fxt", 0, split_time=1)
        with pytest.raises(TooManyParts):
            for i in range(MAX_PARTS + 1):
                stream.write(batch(100 * i))
    finally:
        os.close(reader)
    assert first.read_bytes() == b"an earlier trace"
    assert part_path(tmp_path / "t.fxt", 2).is_fifo()
    assert len(list(tmp_path.iterdir())) == 2


def test_a_split_within_the_limit_still_writes_its_parts(tmp_path: Path) -> None:
    stream = TraceStream(tmp_path / "t.fxt", 0, split_time=100)
    for i in range(MAX_PARTS):
        stream.write(batch(100 * i))
    parts, _ = stream.close({7: "p"}, {(7, 7): "t"})
    assert len(parts) == MAX_PARTS == len(list(tmp_path.iterdir()))


# -- --time windows past the end ----------------------------------------------------------


@pytest.mark.parametrize("command", ["stats", "flame"])
@pytest.mark.parametrize(
    "window", ["9999999999s,", "99999999999999999999999999,", "1" * 400 + "s,", "100s,200s"]
)
def test_a_window_past_the_end_is_one_line(
    trace: Path, tmp_path: Path, command: str, window: str
) -> None:
    extra = ["-o", str(tmp_path / "f.svg")] if command == "flame" else []
    line = refused(command, str(trace), "--time", window, *extra, code=3)
    assert "no calls in that time window" in line


def test_an_end_past_the_end_takes_the_whole_trace(trace: Path) -> None:
    whole = ptscope("stats", str(trace), "--json")
    assert whole.returncode == 0, whole.stderr
    huge = ptscope("stats", str(trace), "--json", "--time", "0," + "9" * 400 + "s")
    assert huge.returncode == 0, huge.stderr
    assert huge.stdout.split('"calls"')[1] == whole.stdout.split('"calls"')[1]


# -- outputs that cannot be written as a regular file -------------------------------------


def test_outputs_that_cannot_be_written_are_one_line(
    recording: Path, trace: Path, tmp_path: Path
) -> None:
    # (A device or a pipe is written in place: tests/faults write through /dev/full and
    # a fifo.)
    done = ptscope("flame", str(trace), "-o", "/dev/null")
    assert done.returncode == 0, done.stderr
    for args in (
        ["decode", str(recording), "-o", str(tmp_path / "missing" / "t.fxt")],
        ["decode", str(recording), "-o", str(tmp_path / ("x" * 300 + ".fxt"))],
        ["decode", str(recording), "-o", str(tmp_path)],
        ["flame", str(trace), "-o", str(tmp_path)],
    ):
        refused(*args, code=2)
    for name in ("", ".", "..", "/"):  # found by the cli fuzz target: -o '' was a ValueError
        for args in (
            ["decode", str(recording), "-o", name],
            ["run", "-o", name, "--", "/bin/true"],
            ["attach", "-o", name, "-p", "1"],
            ["flame", str(trace), "-o", name],
            ["archive", str(recording), "-o", name],
            ["demo", "-o", name],
        ):
            assert "give a file name" in refused(*args, code=2), args


def test_an_output_that_fails_while_written_is_one_line(recording: Path, tmp_path: Path) -> None:
    """/proc/version is a regular file that takes no bytes (EIO): behind a link named
    like a trace, the failure comes while the trace is written."""
    link = tmp_path / "version.fxt"
    link.symlink_to("/proc/version")
    line = refused("decode", str(recording), "-o", str(link), code=1)
    # (the trace is written beside the link's target, then renamed: /proc takes no file)
    assert f"cannot write {link}: " in line
    line = refused("decode", str(recording), "-o", "/proc/version", code=2)
    assert "writes only Fuchsia traces" in line


def test_inputs_that_are_not_regular_files_are_one_line(recording: Path, tmp_path: Path) -> None:
    """A fifo would hold the command until something writes to it; a device never ends."""
    fifo = tmp_path / "pipe.fxt"
    os.mkfifo(fifo)
    for source in (str(fifo), "/dev/zero"):
        for args in (
            ["dump", source],
            ["stats", source],
            ["flame", source, "-o", str(tmp_path / "f.svg")],
            ["serve", source, "--no-browser", "--port", "0"],
            ["decode", source, "-o", str(tmp_path / "t.fxt")],
            ["archive", source, "-o", str(tmp_path / "a.tar.gz")],
            ["insns", source, "--tid", "1", "--time", "1,2"],
        ):
            line = refused(*args, code=3)
            assert line.endswith(f"{source} is not a regular file (a device, a pipe or a socket)")


# -- every other number -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tid", "99999999999999999999999"], "is not a process or thread ID"),
        (["--pid", "-5"], "--pid: -5 is not a process or thread ID (0 to 2147483647)"),
        (["--pid", ","], "give at least one number"),
        (["--jobs", "99999999999"], "must be at most 256"),
        (["--jobs", "0"], "must be at least 1"),
    ],
)
def test_decode_numbers_are_checked(
    recording: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    line = refused("decode", str(recording), "-o", str(tmp_path / "t.fxt.gz"), *args, code=2)
    assert message in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--max-instructions", "0", "--", "/bin/true"], "must be at least 1"),
        (["run", "--max-instructions", "9" * 30, "--", "/bin/true"], "must be at most"),
        (["run", "--frequency", "-1", "--", "/bin/true"], "must be at least 1"),
        (["run", "--frequency", "1e9", "--", "/bin/true"], "not a whole number"),
        (["demo", "--rounds", "0"], "must be at least 1"),
        (["demo", "--rounds", "99999999999999999999"], "must be at most 1,000"),
        (["serve", "x.fxt", "--port", "70000"], "not a TCP port"),
    ],
)
def test_recording_numbers_are_checked(tmp_path: Path, args: list[str], message: str) -> None:
    line = refused(*args, code=2, cwd=tmp_path)
    assert message in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--time", "0,99999999999999999999"], "is past any perf time"),
        (["--time", "0,9999999999"], "is past any perf time"),
        (["--time", "0," + "9" * 5000], "--time takes START,END"),
        (["--time", "1,2", "--after", "0x10:" + "9" * 5000, "--count", "1"], "--after takes"),
        (["--time", "1,2", "--after", "0x" + "f" * 17 + ":1", "--count", "1"], "--after takes"),
    ],
)
def test_insns_numbers_are_checked(recording: Path, args: list[str], message: str) -> None:
    """(perf itself never returns from ``--time 0,9999999999``: its parser overflows.)"""
    line = refused("insns", str(recording), "--tid", "1", *args, code=2)
    assert message in line


def test_options_in_process_never_leak_an_exception() -> None:
    """An option's parser failing in an unforeseen way is still one line (main catches
    what argparse lets through)."""
    from ptscope.cli.base import byte_size, duration_ns

    for parse, text in [(byte_size, "1e400"), (duration_ns, "1e400s"), (byte_size, "-inf")]:
        with pytest.raises(__import__("argparse").ArgumentTypeError):
            parse(text)
    assert issubclass(TooManyParts, PtscopeError)
