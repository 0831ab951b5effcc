"""A recording directory someone else prepared (issue 46): an unfinished emulated recording
makes ``ptscope decode`` repair its perf.data from the recorder's state, and that must
never write outside the directory (a link, a hard link, a FIFO where a file should be),
never hang, and never damage a perf.data that the state does not describe. Every refusal
is one line; the files are left as they were."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from ptscope.errors import PtscopeError
from ptscope.pipeline import decode_recording
from ptscope.record.emulated import record
from ptscope.record.emulated.state import STATE_NAME, read_state
from ptscope.recording import METADATA_NAME, Recording
from support import programs
from support.emulated_corpus import needs_tools
from support.faults import environment, one_line_error, run

_STATE_HEADER = 168  # the state's fields before its error text (docs/file-formats.md)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small emulated recording, with its state file, made once."""
    needs_tools()
    rec = tmp_path_factory.mktemp("prepared") / "rec"
    record([str(programs.build("basics", static=True)), "3"], rec)
    return rec


@pytest.fixture
def unfinished(finished: Path, tmp_path: Path) -> Callable[..., Path]:
    """``unfinished(**metadata)``: this test's copy of the recording, its metadata saying it
    is still being recorded (as if ptscope was killed), with ``metadata``'s fields set."""

    def make(**fields: object) -> Path:
        rec = tmp_path / "rec"
        shutil.copytree(finished, rec)
        metadata = json.loads((rec / METADATA_NAME).read_text())
        metadata["notes"]["state"] = "recording"
        metadata.update(fields)
        (rec / METADATA_NAME).write_text(json.dumps(metadata))
        return rec

    return make


def _tear(perf_data: Path) -> bytes:
    """What QEMU killed inside a checkpoint leaves: the header's data size half-updated."""
    raw = bytearray(perf_data.read_bytes())
    raw[48:56] = (1).to_bytes(8, "little")
    perf_data.write_bytes(bytes(raw))
    return bytes(raw)


def _decode(rec: Path, tmp_path: Path) -> str:
    """``ptscope decode REC``: its one error line (it must fail)."""
    done = run(
        ["decode", str(rec), "-o", str(tmp_path / "t.fxt.gz")],
        environment(tmp_path),
        tmp_path,
        timeout=60,
    )
    return one_line_error(done, 3)


def test_a_perf_data_that_is_a_link_is_not_written_through(
    unfinished: Callable[..., Path], tmp_path: Path
) -> None:
    """The repair's perf.data is a link to another file (the metadata names a real
    perf.data elsewhere, and chosen text as the command): refused, the target untouched."""
    rec = unfinished(perf_data=["other.data"], command=["chosen text"])
    (rec / "perf.data").rename(rec / "other.data")
    victim = tmp_path / "passwd"
    victim.write_text("root:x:0:0:root:/root:/bin/sh\n")
    (rec / "perf.data").symlink_to(victim)
    line = _decode(rec, tmp_path)
    assert "perf.data is a symbolic link" in line, line
    assert victim.read_text() == "root:x:0:0:root:/root:/bin/sh\n"


def test_a_perf_data_with_another_hard_link_is_not_written(
    unfinished: Callable[..., Path], tmp_path: Path
) -> None:
    """A perf.data that is also another name of a file outside the directory."""
    rec = unfinished()
    outside = tmp_path / "outside.data"
    torn = _tear(rec / "perf.data")
    (rec / "perf.data").rename(outside)
    os.link(outside, rec / "perf.data")
    line = _decode(rec, tmp_path)
    assert "2 hard links" in line, line
    assert outside.read_bytes() == torn


def test_the_files_recovery_writes_are_never_written_through_links(
    unfinished: Callable[..., Path], tmp_path: Path
) -> None:
    """Recovery rewrites the metadata (through ``ptscope-recording.tmp``) and keeps the
    processes' JIT maps (``perf-PID.map``): links at those names are replaced, never
    written through."""
    rec = unfinished()
    pid = next(iter(Recording.load(rec).processes))
    jit_map = Path(f"/tmp/perf-{pid}.map")
    if jit_map.exists():
        pytest.skip(f"{jit_map} exists")
    victims = [tmp_path / "victim1", tmp_path / "victim2"]
    for victim in victims:
        victim.write_text("precious\n")
    (rec / "ptscope-recording.tmp").symlink_to(victims[0])
    (rec / f"perf-{pid}.map").symlink_to(victims[1])
    jit_map.write_text("1000 10 jitted\n")
    try:
        decode_recording(Recording.load(rec), tmp_path / "t.fxt.gz")
    finally:
        jit_map.unlink()
    assert [v.read_text() for v in victims] == ["precious\n", "precious\n"]
    assert (rec / f"perf-{pid}.map").read_text() == "1000 10 jitted\n"
    assert not (rec / "ptscope-recording.tmp").exists()
    assert Recording.load(rec).notes.get("recovered")


@pytest.mark.parametrize("name", [METADATA_NAME, STATE_NAME, "perf.data"])
def test_a_fifo_where_a_file_should_be_is_refused_at_once(
    unfinished: Callable[..., Path], tmp_path: Path, name: str
) -> None:
    """The metadata, the state or the perf.data is a FIFO: one line, no hang."""
    rec = unfinished()
    (rec / name).unlink()
    os.mkfifo(rec / name)
    line = _decode(rec, tmp_path)
    assert f"{name} is a FIFO, not a regular file" in line, line


def test_a_state_whose_data_end_is_past_the_file_leaves_perf_data_alone(
    unfinished: Callable[..., Path], tmp_path: Path
) -> None:
    """The state's data end (offset 64) damaged to 0xffffffff and a torn header: the
    repair would have made a 4 GiB file; it is refused, the perf.data as it was."""
    rec = unfinished()
    torn = _tear(rec / "perf.data")
    with open(rec / STATE_NAME, "r+b") as f:
        f.seek(64)
        f.write(b"\xff\xff\xff\xff")
    line = _decode(rec, tmp_path)
    assert "past the end of the file" in line and "left as it was" in line, line
    assert (rec / "perf.data").read_bytes() == torn


def test_a_state_whose_data_end_is_not_a_record_boundary(
    unfinished: Callable[..., Path], tmp_path: Path
) -> None:
    """A data end inside the file but in the middle of a record: refused, not written."""
    rec = unfinished()
    torn = _tear(rec / "perf.data")
    end = read_state(rec).data_end
    with open(rec / STATE_NAME, "r+b") as f:
        f.seek(64)
        f.write(struct.pack("<Q", end - 8))
    line = _decode(rec, tmp_path)
    assert "records do not end" in line, line
    assert (rec / "perf.data").read_bytes() == torn


@pytest.mark.parametrize("torn", [False, True], ids=["valid", "torn"])
def test_any_damaged_word_of_the_state(
    unfinished: Callable[..., Path], tmp_path: Path, torn: bool
) -> None:
    """Each 32-bit word of the state's fields set to 0xffffffff in turn: the decode works
    or fails with a ptscope error (never an internal one), and a perf.data that failed to
    be finished is left as it was; a valid one is never changed."""
    rec = unfinished()
    good = (rec / "perf.data").read_bytes()
    before = _tear(rec / "perf.data") if torn else good
    state = (rec / STATE_NAME).read_bytes()[:_STATE_HEADER]
    metadata = (rec / METADATA_NAME).read_bytes()
    for at in range(8, _STATE_HEADER, 4):
        (rec / "perf.data").write_bytes(before)
        (rec / METADATA_NAME).write_bytes(metadata)
        damaged = state[:at] + b"\xff\xff\xff\xff" + state[at + 4 :]
        with open(rec / STATE_NAME, "r+b") as f:
            f.write(damaged)
        try:
            decode_recording(Recording.load(rec), tmp_path / "t.fxt.gz")
        except PtscopeError as e:
            assert "\n" not in e.message, (at, e.message)
            assert (rec / "perf.data").read_bytes() == before, at
        else:
            if not torn:
                assert (rec / "perf.data").read_bytes() == good, at
        size = (rec / "perf.data").stat().st_size
        assert size <= len(good) + 4096, (at, size)


def test_a_repair_that_cannot_be_written_is_undone(
    unfinished: Callable[..., Path], tmp_path: Path
) -> None:
    """The repair's writes fail part way (the feature sections past the file size limit):
    what was written is undone, the perf.data exactly as it was."""
    rec = unfinished()
    end = read_state(rec).data_end
    _tear(rec / "perf.data")
    with open(rec / "perf.data", "r+b") as f:
        f.truncate(end)  # killed before the feature sections were written
        f.seek(0)
        f.write(b"\0" * 104)  # and the header, torn
    before = (rec / "perf.data").read_bytes()
    done = run(
        ["decode", str(rec), "-o", str(tmp_path / "t.fxt.gz")],
        environment(tmp_path),
        tmp_path,
        file_size_limit=end + 100,
    )
    line = one_line_error(done, 3)
    assert "cannot finish the recording" in line and "File too large" in line, line
    assert (rec / "perf.data").read_bytes() == before
