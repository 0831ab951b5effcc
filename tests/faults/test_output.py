"""Where the output or the recording cannot be written (issue 20, bug 8): a full device,
a file size limit (``RLIMIT_FSIZE``, which needs no privilege), a full disk (a small tmpfs,
root only). One line says what failed; the recording is kept (or a line says it could not
be written); no partial or empty trace is left."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ptscope.pipeline import decode_recording
from ptscope.recording import Recording
from support import programs
from support.emulated_corpus import needs_tools
from support.faults import environment, leftovers, one_line_error, run

pytestmark = pytest.mark.slow


def _run_args(rec: Path, out: Path, *program: str) -> list[str]:
    args = ["run", "--backend", "emulated", "--keep-recording", str(rec), "-o", str(out)]
    return [*args, "--", *program]


def test_run_into_a_full_device(tmp_path: Path) -> None:
    """The trace goes to a device that is always full (/dev/full, through a link), and
    fails while slices are streamed into it (more than a batch of them): one line, the
    recording kept and decodable."""
    needs_tools()
    exe = programs.build("many_calls", static=True)
    rec, out = tmp_path / "rec", tmp_path / "t.fxt.gz"
    out.symlink_to("/dev/full")
    done = run(_run_args(rec, out, str(exe), "6000"), environment(tmp_path), tmp_path)
    line = one_line_error(done, 1)
    assert "cannot write" in line and "No space left on device" in line, line
    assert f"recording kept at {rec}" in done.stderr
    assert leftovers(tmp_path, tmp_path) == []
    assert out.is_symlink()
    assert decode_recording(Recording.load(rec), tmp_path / "again.fxt.gz").slices > 0


def test_decode_past_the_file_size_limit(recordings: Callable[[str], Path], tmp_path: Path) -> None:
    """The trace grows past RLIMIT_FSIZE (writes fail with EFBIG): one line, and neither
    the trace nor its temporary file is left."""
    rec = recordings("many_calls")
    out = tmp_path / "t.fxt"
    done = run(
        ["decode", str(rec), "-o", str(out)],
        environment(tmp_path),
        tmp_path,
        file_size_limit=64 * 1024,
    )
    line = one_line_error(done, 1)
    assert f"cannot write {out}: File too large" in line, line
    assert not out.exists()
    assert leftovers(tmp_path, tmp_path) == []


def test_a_filtered_decode_past_the_file_size_limit(
    recordings: Callable[[str], Path], tmp_path: Path
) -> None:
    """--filter keeps the calls in a file beside the trace until the regions are known;
    when that file grows past RLIMIT_FSIZE: one line, and nothing is left."""
    rec = recordings("many_calls")
    out = tmp_path / "t.fxt"
    done = run(
        ["decode", str(rec), "-o", str(out), "--filter", "main,exit"],
        environment(tmp_path),
        tmp_path,
        file_size_limit=64 * 1024,
    )
    line = one_line_error(done, 1)
    assert f"--filter: cannot keep the calls in {tmp_path}" in line, line
    assert "File too large" in line, line
    assert not out.exists()
    assert leftovers(tmp_path, tmp_path) == []


def test_decode_over_an_existing_trace_keeps_it_when_writing_fails(
    recordings: Callable[[str], Path], tmp_path: Path
) -> None:
    """A trace is replaced only by a whole one."""
    rec = recordings("many_calls")
    out = tmp_path / "t.fxt"
    out.write_bytes(b"the previous trace")
    done = run(
        ["decode", str(rec), "-o", str(out)],
        environment(tmp_path),
        tmp_path,
        file_size_limit=64 * 1024,
    )
    one_line_error(done, 1)
    assert out.read_bytes() == b"the previous trace"
    assert leftovers(tmp_path, tmp_path) == []


def test_run_when_the_recording_cannot_be_written(tmp_path: Path) -> None:
    """The recording itself cannot be written (the file size limit stops the recorder
    before it starts): one line says so, and nothing is left to decode."""
    needs_tools()
    exe = programs.build("basics", static=True)
    rec, out = tmp_path / "rec", tmp_path / "t.fxt.gz"
    done = run(
        _run_args(rec, out, str(exe), "3"),
        environment(tmp_path),
        tmp_path,
        file_size_limit=1 << 20,
    )
    line = one_line_error(done, 5)
    assert "could not start the recording" in line and "file size limit" in line, line
    assert not out.exists()
    assert leftovers(tmp_path, tmp_path) == []
    again = run(
        ["decode", str(rec), "-o", str(tmp_path / "again.fxt.gz")], environment(tmp_path), tmp_path
    )
    assert "never started" in one_line_error(again, 3)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_run_into_a_read_only_directory(tmp_path: Path) -> None:
    needs_tools()
    exe = programs.build("basics", static=True)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        done = run(
            _run_args(tmp_path / "rec", locked / "t.fxt.gz", str(exe), "3"),
            environment(tmp_path),
            tmp_path,
        )
        assert "cannot write" in one_line_error(done, 2)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o755)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_keep_recording_on_a_disk_that_fills_up(small_disk: Path, tmp_path: Path) -> None:
    """The recording and the trace on one small disk: the recording fills it (the program
    is stopped), the trace cannot be written: one line, the recording kept and decodable,
    no partial trace."""
    needs_tools()
    exe = programs.build("spin")
    rec, out = small_disk / "rec", small_disk / "t.fxt.gz"
    args = _run_args(rec, out, str(exe))
    args[args.index("--") : args.index("--")] = ["--max-instructions", "500000000"]
    done = run(args, environment(tmp_path), tmp_path)
    line = one_line_error(done, 1)
    assert "No space left on device" in line, line
    assert "the disk is full" in done.stderr and f"recording kept at {rec}" in done.stderr
    assert sorted(p.name for p in small_disk.iterdir()) == ["rec"]
    assert leftovers(tmp_path, tmp_path) == []
    assert decode_recording(Recording.load(rec), tmp_path / "again.fxt.gz").slices > 0


def test_keep_recording_on_a_full_disk(small_disk: Path, tmp_path: Path) -> None:
    """Nothing can be written at all: one line saying the recording cannot be written,
    and no empty temporary metadata left."""
    needs_tools()
    exe = programs.build("basics", static=True)
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    rec = small_disk / "rec"
    done = run(
        _run_args(rec, tmp_path / "t.fxt.gz", str(exe), "3"), environment(tmp_path), tmp_path
    )
    line = one_line_error(done, 5)
    assert f"cannot write the recording in {rec}" in line, line
    assert list(rec.iterdir()) == []
    assert leftovers(tmp_path, tmp_path) == []


def test_a_cache_entry_that_cannot_be_written_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What perf says about itself is cached on disk; a failed write leaves no half file."""
    from ptscope import perftool

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    perf = str(Path(os.__file__))  # any existing file stands for the binary here
    entry = perftool._cache_file(perf, ("--version",))
    assert entry is not None
    (entry / "in-the-way").mkdir(parents=True)  # the entry's name is taken: replace fails
    perftool._cache_put(perf, ("--version",), 0, "perf version 6.1", "")
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]


def _wide_trace(path: Path) -> Path:
    """A trace whose flame graph is about 100 KiB of SVG: 300 functions called by main."""
    from ptscope.fxt import write_timeline
    from ptscope.timeline import Timeline
    from support.timeline_strategies import thread_of_rows

    rows = [(0, 10 * 301, 0, 0)] + [(10 * k, 10 * k + 9, 1, k) for k in range(1, 301)]
    names = ["main", *(f"function_number_{k}" for k in range(1, 301))]
    write_timeline(Timeline(names=names, threads=[thread_of_rows(1, 1, rows)]), path)
    return path


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_a_flame_graph_past_the_file_size_limit(tmp_path: Path, existing: bool) -> None:
    """``flame -o`` whose SVG grows past RLIMIT_FSIZE (a full disk): one line, and no
    truncated SVG: an older one at that name is kept, none is left in its place."""
    trace = _wide_trace(tmp_path / "t.fxt")
    out = tmp_path / "f.svg"
    whole = run(["flame", str(trace), "-o", str(out)], environment(tmp_path), tmp_path)
    assert whole.code == 0, whole.stderr
    size = out.stat().st_size
    assert size > 64 * 1024
    if existing:
        out.write_text("<svg>the previous graph</svg>\n")
    else:
        out.unlink()
    done = run(
        ["flame", str(trace), "-o", str(out)],
        environment(tmp_path),
        tmp_path,
        file_size_limit=size // 2,
    )
    line = one_line_error(done, 1)
    assert f"cannot write {out}: File too large" in line, line
    if existing:
        assert out.read_text() == "<svg>the previous graph</svg>\n"
    else:
        assert not out.exists()
    assert leftovers(tmp_path, tmp_path) == []


def test_a_full_tmpdir_during_a_windowed_decode(
    recordings: Callable[[str], Path], tmp_path: Path
) -> None:
    """``--jobs 2``: the second window's perf writes its records into TMPDIR, which fills
    (RLIMIT_FSIZE: perf's writes there fail first; the trace is split into parts smaller
    than the limit). One line names TMPDIR as the cause, not perf; no half trace is left."""
    rec = recordings("many_calls_long")
    out = tmp_path / "t.fxt.gz"
    done = run(
        ["decode", str(rec), "--decoder", "dlfilter", "--jobs", "2", "--split-size", "100K",
         "-o", str(out)],
        environment(tmp_path),
        tmp_path,
        file_size_limit=1_500_000,
    )  # fmt: skip
    line = one_line_error(done, 1)
    assert "TMPDIR" in line and "File too large" in line, line
    assert "perf script" not in line, line
    assert not [p.name for p in tmp_path.iterdir() if ".fxt" in p.name]
    assert leftovers(tmp_path, tmp_path) == []
