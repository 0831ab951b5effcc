"""Where recordings live and that they survive failures (cli/run.py RecordingPlace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.cli.run import RecordingPlace, kept_message
from ptscope.errors import RecordingError, UsageError


def with_data(place: RecordingPlace) -> None:
    (place.directory / "perf.data").write_bytes(b"PERFILE2")


def test_temporary_recording_deleted_after_a_good_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    place = RecordingPlace(None)
    with_data(place)
    with place.decoding():
        pass
    assert not place.directory.exists()


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RecordingError("decode failed")])
def test_recording_kept_when_decode_fails_or_is_interrupted(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: BaseException,
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    place = RecordingPlace(None)
    with_data(place)
    with pytest.raises(type(error)), place.decoding():
        raise error
    assert (place.directory / "perf.data").exists()
    message = kept_message(place.directory)
    assert f"ptscope decode {place.directory}" in message
    if isinstance(error, RecordingError):
        assert error.hint == message  # printed right after the error's one line
    else:
        assert message in capsys.readouterr().err


def test_failed_recording_without_data_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    place = RecordingPlace(None)
    with pytest.raises(RecordingError), place.recording():
        raise RecordingError("perf could not start")
    assert not place.directory.exists()


def test_failed_recording_with_data_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    place = RecordingPlace(None)
    with_data(place)
    with pytest.raises(RecordingError) as err, place.recording():
        raise RecordingError("perf died", hint="run as root")
    assert place.directory.exists()
    assert err.value.hint is not None
    assert err.value.hint.startswith("run as root\n") and "recording kept at" in err.value.hint


def test_keep_recording_directory_rules(tmp_path: Path) -> None:
    kept = RecordingPlace(tmp_path / "new" / "rec")
    assert kept.directory.is_dir() and kept.keep
    with_data(kept)
    with kept.decoding():
        pass
    assert kept.directory.exists()  # the user's directory is never deleted
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        RecordingPlace(busy)
