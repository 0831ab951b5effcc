"""What the recovery fuzz targets share (``emulation-state``, ``recovery-metadata``): an
emulated recording of ``/bin/true`` made once per process, copied for each input with its
metadata saying it was never finished (as when ptscope is killed while it records), so
that ``ptscope decode DIR`` repairs its perf.data from the recorder's state file
(``record.emulated.recover``) before decoding it.

The check (:func:`decode_prepared`) runs ``ptscope decode`` through the command line's
entry point, in this process, and asks for what issue 46 asks of a directory someone else
prepared: no internal error, one error line, and a perf.data that is never changed when
the repair is refused (the metadata still says "recording" afterwards), never changed at
all when it was whole, never grown past the checkpoint a repair writes, with nothing left
in the directory but its files.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fuzz.target import changed_environment
from ptscope.perftool import STALL_ENV
from ptscope.record.emulated.state import STATE_NAME
from ptscope.recording import METADATA_NAME

__all__ = [
    "STALL_SECONDS",
    "STATE_REGIONS",
    "TEARS",
    "Workspace",
    "decode_prepared",
    "prepare",
    "workspace",
]

TEARS = ("whole", "data-size", "truncated")
"""How the perf.data is left: ``whole`` (its last checkpoint written: a repair must not
change it), ``data-size`` (the header's data size half-updated, as QEMU killed inside a
checkpoint leaves it), ``truncated`` (cut at the state's data end, before the feature
sections, its header zeroed)."""

STATE_REGIONS = ("header", "slots", "index", "build-ids")
"""The parts of the state file that hold anything: its header (``struct emu_state`` up to
its error text), the thread slots, the AUXTRACE index and the build-id table."""

STALL_SECONDS = "2"
"""``PTSCOPE_PERF_STALL_TIMEOUT`` while a target decodes: a perf kept busy by a damaged
perf.data, without output, is stopped well within the campaign's time limit."""

_HEADER_BYTES = 424  # the header the reader unpacks, its error text included


@dataclass(frozen=True)
class Workspace:
    recording: Path
    """The finished recording (read-only: every input works on a copy)."""
    perf_data: bytes
    metadata: dict[str, Any]
    state_size: int
    state_extents: list[tuple[int, bytes]]
    """The state file's data (it is sparse: 36 MiB, a few KiB of them written)."""
    regions: dict[str, tuple[int, bytes]]
    """Each of :data:`STATE_REGIONS`: its offset and bytes."""
    data_end: int


def _extents(path: Path) -> list[tuple[int, bytes]]:
    """The parts of a sparse file that hold data (SEEK_DATA / SEEK_HOLE)."""
    found = []
    with open(path, "rb") as f:
        fd, at, size = f.fileno(), 0, os.fstat(f.fileno()).st_size
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past ``at``
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            found.append((start, os.pread(fd, end - start, start)))
            at = end
    return found


@functools.cache
def workspace() -> Workspace:
    """The recording, made once per process."""
    from ptscope.record.emulated import record
    from ptscope.record.emulated.state import _HEADER, read_state

    root = Path(tempfile.mkdtemp(prefix="ptscope-fuzz-recovery-"))
    atexit.register(shutil.rmtree, root, True)
    rec = root / "rec"
    record(["/bin/true"], rec)
    state_path = rec / STATE_NAME
    with open(state_path, "rb") as f:
        head = f.read(_HEADER_BYTES)
        fields = _HEADER.unpack_from(head, 0)
        slots_offset, slot_size, slot_count = fields[3], fields[4], fields[6]
        index_offset, index_count = fields[14], fields[16]
        ids_offset, ids_count = fields[17], fields[19]

        def region(offset: int, size: int) -> tuple[int, bytes]:
            return offset, os.pread(f.fileno(), max(size, 16), offset)

        regions = {
            "header": (0, head),
            "slots": region(slots_offset, slot_count * slot_size),
            "index": region(index_offset, index_count * 16),
            "build-ids": region(ids_offset, min(ids_count, 2) * 4096),
        }
    return Workspace(
        recording=rec,
        perf_data=(rec / "perf.data").read_bytes(),
        metadata=json.loads((rec / METADATA_NAME).read_text()),
        state_size=state_path.stat().st_size,
        state_extents=_extents(state_path),
        regions=regions,
        data_end=read_state(rec).data_end,
    )


def prepare(
    directory: Path,
    *,
    metadata: bytes | None = None,
    state_edits: list[tuple[int, bytes]] = (),  # type: ignore[assignment]
    state_cut: int | None = None,
    tear: str = "data-size",
) -> bytes:
    """Make ``directory`` a copy of the recording, unfinished (or with ``metadata``'s
    bytes as its metadata), its state with ``state_edits`` (offset, bytes) written over
    it and cut at ``state_cut``, its perf.data left as ``tear`` says (:data:`TEARS`).
    Returns the perf.data's bytes."""
    ws = workspace()
    directory.mkdir()
    if metadata is None:
        data = json.loads(json.dumps(ws.metadata))
        data["notes"]["state"] = "recording"
        metadata = json.dumps(data).encode()
    (directory / METADATA_NAME).write_bytes(metadata)
    with open(directory / STATE_NAME, "wb") as f:
        f.truncate(ws.state_size)
        for offset, chunk in [*ws.state_extents, *state_edits]:
            os.pwrite(f.fileno(), chunk, offset)
        if state_cut is not None:
            f.truncate(state_cut)
    perf_data = bytearray(ws.perf_data)
    if tear == "data-size":
        perf_data[48:56] = (1).to_bytes(8, "little")
    elif tear == "truncated":
        del perf_data[ws.data_end :]
        perf_data[:104] = bytes(104)
    (directory / "perf.data").write_bytes(perf_data)
    return bytes(perf_data)


def decode_prepared(directory: Path, before: bytes, *, tear: str) -> None:
    """``ptscope decode DIRECTORY`` on a directory :func:`prepare` made (``before``: its
    perf.data as prepared); raises AssertionError when it misbehaved (see the module)."""
    from ptscope.cli import main

    output = directory.parent / "out.fxt.gz"
    out, err = io.StringIO(), io.StringIO()
    names_before = {p.name for p in directory.iterdir()}
    metadata_before = (directory / METADATA_NAME).read_bytes()
    # A perf.data left torn (the metadata no longer says it is unfinished, so nothing
    # repairs it) can keep perf busy with no output: its watchdog stops it, sooner than
    # the campaign's time limit.
    with (
        changed_environment(**{STALL_ENV: STALL_SECONDS}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code: Any = main(["decode", str(directory), "-o", str(output)])
        except SystemExit as e:
            code = e.code
    stderr = err.getvalue()
    assert code != 70 and "internal error" not in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert isinstance(code, int) and code >= 0, code
    if code:
        errors = [line for line in stderr.splitlines() if ": error: " in line]
        assert len(errors) == 1, stderr
    after = (directory / "perf.data").read_bytes()
    if tear == "whole":
        assert after == before, "a whole perf.data was changed"
    # A repair that was made saved the metadata again (no longer "recording").
    if (directory / METADATA_NAME).read_bytes() == metadata_before:
        assert after == before, "the perf.data was changed by a refused repair"
    assert len(after) <= len(workspace().perf_data) + 4096, len(after)
    left = {p.name for p in directory.iterdir()} - names_before
    assert all(re.fullmatch(r"perf-\d+\.map", name) for name in left), left
