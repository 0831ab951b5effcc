"""The dlfilter decoder with the real perf: failures are one clear line, never a traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ptscope import _native
from ptscope.decode.dlfilter_stream import DlfilterProcess, decode_with_dlfilter
from ptscope.errors import BadInputError
from ptscope.perftool import find_perf

pytestmark = pytest.mark.skipif(
    not _native.is_available(), reason="the dlfilter is not built (pip install -e .)"
)


def _decode(path: Path) -> list[object]:
    return [e for batch in decode_with_dlfilter(path) for e in batch]


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no such file"):
        _decode(tmp_path / "perf.data")


def test_not_a_perf_data(tmp_path: Path) -> None:
    bogus = tmp_path / "perf.data"
    bogus.write_bytes(b"this is not a perf.data file\n" * 100)
    with pytest.raises(BadInputError) as exc:
        _decode(bogus)
    assert "\n" not in exc.value.message
    assert exc.value.details  # perf's own words, for -v


def test_a_recording_without_branches_gives_no_events(tmp_path: Path) -> None:
    """A cpu-clock recording: perf runs the filter, which sees no branch samples."""
    data = tmp_path / "perf.data"
    rec = subprocess.run(
        [find_perf().path, "record", "-q", "-e", "cpu-clock", "-o", str(data), "--", "true"],
        capture_output=True,
    )
    if rec.returncode != 0 or not data.exists():
        pytest.skip("perf record -e cpu-clock does not work here")
    proc = DlfilterProcess(data)
    assert [e for batch in proc.batches() for e in batch] == []
    trailer = proc.run_info().stats.trailer
    assert trailer is not None and trailer["branches_kept"] == 0


def test_stopping_early_stops_perf(tmp_path: Path) -> None:
    data = tmp_path / "perf.data"
    rec = subprocess.run(
        [find_perf().path, "record", "-q", "-e", "cpu-clock", "-o", str(data), "--", "true"],
        capture_output=True,
    )
    if rec.returncode != 0 or not data.exists():
        pytest.skip("perf record -e cpu-clock does not work here")
    proc = DlfilterProcess(data)
    gen = proc.batches()
    gen.close()  # the consumer went away before reading anything
    assert proc.kill() is not None
