"""``ptscope-recording.json`` is checked against its schema when a recording is read: a
value of the wrong type, out of range or missing is one line naming the field, and the
perf.data files it names never lead outside the recording directory (issue 20, item 5).

The documents are what the recorder writes (``Recording.metadata_json``), one value
changed; the command-line tests decode, archive and drill into a real recording (the
emulated backend on /bin/true) whose metadata was changed so."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pytest

from ptscope.errors import BadInputError
from ptscope.recording import METADATA_NAME, Recording, TriggerHit
from support.cli import one_line_error, ptscope


def written(directory: Path) -> dict[str, Any]:
    """The metadata a recorder writes, with every field used."""
    recording = Recording(
        directory,
        "emulated",
        perf_data=["perf.data"],
        command=["/bin/true", "x"],
        processes={7120: "/bin/true"},
        threads={7120: "true", 7121: "worker"},
        hits=[TriggerHit(time=10**15, pid=7120, tid=7121, ip=0x401136, symbol="f")],
        perf_version="perf version 6.1",
        scope="user",
        notes={"instructions": 104828, "cycle_model": {"tsc_hz": 2_000_000_000}},
    )
    data: dict[str, Any] = json.loads(recording.metadata_json())
    return data


def load_with(tmp_path: Path, **changes: Any) -> Recording:
    directory = tmp_path / "rec"
    directory.mkdir(exist_ok=True)
    (directory / "perf.data").touch()
    data = written(directory)
    for key, value in changes.items():
        if value is DELETE:
            del data[key]
        else:
            data[key] = value
    (directory / METADATA_NAME).write_text(json.dumps(data))
    return Recording.load(directory)


DELETE = object()


def test_what_the_recorder_writes_loads_back(tmp_path: Path) -> None:
    loaded = load_with(tmp_path)
    assert loaded.processes == {7120: "/bin/true"}
    assert loaded.threads == {7120: "true", 7121: "worker"}
    assert loaded.hits == [TriggerHit(time=10**15, pid=7120, tid=7121, ip=0x401136, symbol="f")]
    assert loaded.notes == {"instructions": 104828, "cycle_model": {"tsc_hz": 2_000_000_000}}
    assert loaded.perf_data_paths() == [tmp_path / "rec" / "perf.data"]
    # Fields a version-1 file may leave out take their defaults.
    bare = load_with(tmp_path, hits=DELETE, notes=DELETE, perf_data=DELETE, scope=DELETE)
    assert (bare.hits, bare.notes, bare.perf_data, bare.scope) == ([], {}, ["perf.data"], "user")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        # The values of the hostile-user campaign.
        ("version", None, "field 'version' must be a whole number from 1, not null"),
        ("processes", None, "field 'processes': input should be an object, not null"),
        ("hits", [{}], "field 'hits[0].time' is missing (and 3 more problems)"),
        ("command", 5, "field 'command': input should be a valid array, not 5"),
        ("perf_data", [1], "field 'perf_data[0]': input should be a valid string, not 1"),
        # And their neighbours.
        ("version", "1", "field 'version' must be a whole number from 1, not \"1\""),
        ("version", 1.5, "field 'version' must be a whole number from 1, not 1.5"),
        ("version", True, "field 'version' must be a whole number from 1, not true"),
        ("version", 0, "field 'version' must be a whole number from 1, not 0"),
        ("version", DELETE, "field 'version' is missing"),
        ("backend", "magic", "field 'backend': input should be '', 'intel-pt', "),
        ("scope", 3, "field 'scope': input should be 'user', 'kernel' or 'user+kernel'"),
        ("threads", {"main": "x"}, "field 'threads' has the key \"main\": "),
        ("threads", {"-1": "x"}, "field 'threads' has the key \"-1\": must be a process or"),
        ("threads", {"01": "x"}, "field 'threads' has the key \"01\": must be a process or"),
        ("threads", {"1.0": "x"}, "field 'threads' has the key \"1.0\": must be a process"),
        ("command", ["\ud800"], "Invalid JSON: "),
        ("processes", {"1": 5}, "field 'processes.1': input should be a valid string, not 5"),
        ("processes", {str(1 << 40): "x"}, "field 'processes' has the key \"1099511627776\""),
        ("hits", [None], "field 'hits[0]': input should be an object, not null"),
        (
            "hits",
            [{"time": 10**30, "pid": 1, "tid": 1, "ip": 1}],
            "field 'hits[0].time': input should be less than or equal to 9223372036854775807",
        ),
        (
            "hits",
            [{"time": 1, "pid": 1, "tid": 1, "ip": "0x10"}],
            "field 'hits[0].ip': input should be a valid integer, not \"0x10\"",
        ),
        ("notes", [], "field 'notes': input should be an object, not []"),
        ("notes", {"recorder_pid": "me"}, "field 'notes.recorder_pid': input should be a valid"),
        ("perf_data", "perf.data", "field 'perf_data': input should be a valid array"),
        ("perf_data", [], "field 'perf_data': list should have at least 1 item"),
        ("perf_version", ["6.1"], "field 'perf_version': input should be a valid string"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field(
    tmp_path: Path, field: str, value: Any, message: str
) -> None:
    with pytest.raises(BadInputError) as error:
        load_with(tmp_path, **{field: value})
    assert error.value.message.startswith(f"{tmp_path / 'rec' / METADATA_NAME}: {message}")
    assert "\n" not in error.value.message


@pytest.mark.parametrize(
    "name", ["/etc/passwd", "../x", "../../../../etc/shadow", "sub/perf.data", ".", "..", ""]
)
def test_perf_data_is_a_name_in_the_directory(tmp_path: Path, name: str) -> None:
    with pytest.raises(BadInputError) as error:
        load_with(tmp_path, perf_data=["perf.data", name])
    assert "field 'perf_data[1]': must be a file name inside the recording directory" in (
        error.value.message
    )


def test_a_perf_data_link_that_leads_out_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "rec"
    directory.mkdir()
    (tmp_path / "elsewhere.data").write_text("not yours")
    os.symlink(tmp_path / "elsewhere.data", directory / "snapshot.data")
    os.symlink("../elsewhere.data", directory / "relative.data")
    for name in ("snapshot.data", "relative.data"):
        with pytest.raises(BadInputError) as error:
            load_with(tmp_path, perf_data=[name])
        assert f"field 'perf_data': {name} is a link to " in error.value.message
        assert "outside the recording directory" in error.value.message
    # A link inside the directory is the directory's own business.
    (directory / "perf.data.1").touch()
    os.symlink("perf.data.1", directory / "latest.data")
    assert load_with(tmp_path, perf_data=["latest.data"]).perf_data == ["latest.data"]


def test_not_json_or_not_ours_is_one_line(tmp_path: Path) -> None:
    directory = tmp_path / "rec"
    directory.mkdir()
    for text, message in [
        (b"{", "not JSON"),
        (b"[1, 2]", "is not ptscope recording metadata"),
        (b"\xff\xfe", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (json.dumps({"format": "ptscope-recording", "version": 2}).encode(), "newer ptscope"),
    ]:
        (directory / METADATA_NAME).write_bytes(text)
        with pytest.raises(BadInputError) as error:
            Recording.load(directory)
        assert message in error.value.message


# -- through the command line, on a real recording ---------------------------------------


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ptscope.record.emulated import record

    directory = tmp_path_factory.mktemp("meta") / "rec"
    record(["/bin/true"], directory)
    return directory


def changed_copy(recording: Path, where: Path, **changes: Any) -> Path:
    copy = where / "changed"
    shutil.copytree(recording, copy)
    data = json.loads((copy / METADATA_NAME).read_text())
    data.update(changes)
    (copy / METADATA_NAME).write_text(json.dumps(data))
    return copy


@pytest.mark.slow
@pytest.mark.parametrize(
    ("field", "value"),
    [("version", None), ("processes", None), ("hits", [{}]), ("command", 5), ("perf_data", [1])],
)
def test_decode_archive_and_insns_refuse_bad_metadata_in_one_line(
    recording: Path, tmp_path: Path, field: str, value: Any
) -> None:
    bad = changed_copy(recording, tmp_path, **{field: value})
    for args in (
        ["decode", str(bad), "-o", str(tmp_path / "t.fxt.gz")],
        ["decode", str(bad / "perf.data"), "-o", str(tmp_path / "t.fxt.gz")],
        ["archive", str(bad), "-o", str(tmp_path / "a.tar.gz")],
        ["insns", str(bad), "--tid", "1", "--time", "0,1"],
    ):
        line = one_line_error(ptscope(*args), 3)
        assert f"{bad / METADATA_NAME}: field '{field}" in line, args
    assert not list(tmp_path.glob("*.fxt.gz")) and not list(tmp_path.glob("*.tar.gz"))


@pytest.mark.slow
def test_archive_never_packs_a_file_from_outside(recording: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.data"
    shutil.copy(recording / "perf.data", secret)  # a perf.data perf would read
    bad = changed_copy(recording, tmp_path, perf_data=[str(secret)])
    line = one_line_error(ptscope("archive", str(bad), "-o", str(tmp_path / "a.tar.gz")), 3)
    assert "field 'perf_data[0]': must be a file name inside the recording directory" in line
    shutil.rmtree(bad)
    bad = changed_copy(recording, tmp_path)
    (bad / "perf.data").unlink()
    os.symlink(secret, bad / "perf.data")
    line = one_line_error(ptscope("archive", str(bad), "-o", str(tmp_path / "a.tar.gz")), 3)
    assert "perf.data is a link to" in line
    line = one_line_error(ptscope("decode", str(bad), "-o", str(tmp_path / "t.fxt.gz")), 3)
    assert "perf.data is a link to" in line
    assert not (tmp_path / "a.tar.gz").exists()


@pytest.mark.slow
def test_an_archive_manifest_never_leads_outside(recording: Path, tmp_path: Path) -> None:
    archive = tmp_path / "rec.tar.gz"
    done = ptscope("archive", str(recording), "-o", str(archive))
    assert done.returncode == 0, done.stderr
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m) for m in tar.getmembers() if m.isfile()}
        contents = {name: f.read() for name, f in members.items() if f is not None}
    manifest = json.loads(contents["ptscope-archive.json"])
    for field, value, message in [
        ("recording", "../../..", "field 'recording': must be a file name inside"),
        ("recording", None, "field 'recording': input should be a valid string, not null"),
        ("objects", [{"path": "[kernel.kallsyms]", "build_id": "00", "files": ["/etc/passwd"]}],
         "field 'objects[0].files[0]': must be a path inside the archive"),
        ("objects", [{"path": "x", "build_id": "00", "files": ["a/../../b"]}],
         "field 'objects[0].files[0]': must be a path inside the archive"),
        ("missing", 5, "field 'missing': input should be a valid array, not 5"),
        ("version", None, "field 'version' must be a whole number from 1, not null"),
    ]:  # fmt: skip
        evil = tmp_path / "evil.tar.gz"
        with tarfile.open(evil, "w:gz") as tar:
            for name, data in {
                **contents,
                "ptscope-archive.json": json.dumps({**manifest, field: value}).encode(),
            }.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        line = one_line_error(ptscope("decode", str(evil), "-o", str(tmp_path / "t.fxt.gz")), 3)
        assert message in line, line
