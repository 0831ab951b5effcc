"""`ptscope archive` and `ptscope decode ARCHIVE`: a recording made here decodes the
same elsewhere, with the program it ran gone, from the binaries the archive carries
(found by build-id, laid out as perf's build-id cache) — and bad archives are refused in
one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from ptscope.perftool import find_perf
from ptscope.record.build_id import file_build_id
from ptscope.record.emulated import record
from support.cli import one_line_error, ptscope
from support.programs import build

pytestmark = pytest.mark.slow


def dump(trace: Path) -> list[str]:
    done = ptscope("dump", str(trace), "--instants")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.fixture
def private_program(tmp_path: Path) -> Path:
    """A private copy of a dynamic PIE (libc and ld.so come from the system)."""
    copy = tmp_path / "bin" / "basics"
    copy.parent.mkdir()
    shutil.copy2(build("basics"), copy)
    return copy


def test_archive_decodes_elsewhere_without_the_program(
    private_program: Path, tmp_path: Path
) -> None:
    program = private_program
    recording = tmp_path / "rec"
    record([str(program), "7"], recording)
    original = tmp_path / "original.fxt.gz"
    assert ptscope("decode", str(recording), "-o", str(original)).returncode == 0
    want = dump(original)
    assert any(line.endswith(" fib") for line in want)

    archive = tmp_path / "rec.tar.gz"
    done = ptscope("archive", str(recording), "-o", str(archive))
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert f"wrote {archive}: the recording and " in done.stderr
    build_id = file_build_id(program)
    assert build_id is not None
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("ptscope-archive.json"))  # type: ignore[arg-type]
    hexid = build_id.hex()
    # perf's build-id cache layout: the binary under its path and id, and the id's link.
    assert f".debug{program}/{hexid}/elf" in names
    assert f".debug/.build-id/{hexid[:2]}/{hexid[2:]}" in names
    assert "recording/perf.data" in names and "recording/ptscope-recording.json" in names
    archived = {o["path"] for o in manifest["objects"]}
    assert str(program) in archived and any("libc.so" in p for p in archived)
    assert manifest["missing"] == []

    # Elsewhere: the archive alone, the program gone.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / "rec.tar.gz"
    archive.rename(moved)
    program.rename(program.with_name("hidden"))
    # (Without the archive, the program's functions are lost: the comparison below can
    # fail, and it is the archive that brings them back.)
    lost = tmp_path / "lost.fxt.gz"
    assert ptscope("decode", str(recording), "-o", str(lost)).returncode == 0
    assert not any(line.endswith(" fib") for line in dump(lost))
    shutil.rmtree(recording)
    done = ptscope("decode", "rec.tar.gz", "-o", "again.fxt.gz", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert dump(elsewhere / "again.fxt.gz") == want


def test_kernel_symbols_travel_with_a_kernel_recording(
    program: Callable[..., Path], tmp_path: Path
) -> None:
    """Sampling with --kernel (root): the archive carries kallsyms, and the decode
    elsewhere names the kernel functions as here (with a symfs perf reads no kallsyms of
    its own: without the archived one they would be [unknown])."""
    if os.geteuid() != 0:
        pytest.skip("kernel tracing needs root")
    recording = tmp_path / "rec"
    # The highest sampling rate: a process that only starts and exits still gets
    # hundreds of samples, most in the kernel (exec, page faults, mmap).
    done = ptscope("run", "--backend", "sampling", "--kernel", "--timer-resolution", "high",
                   "--keep-recording", str(recording), "-o", str(tmp_path / "here.fxt.gz"),
                   "--", str(program("quick")))  # fmt: skip
    if done.returncode != 3:  # (quick's own status)
        pytest.skip(f"no kernel sampling here: {done.stderr.splitlines()[:1]}")
    want = dump(tmp_path / "here.fxt.gz")
    archive = tmp_path / "k.tar.gz"
    assert ptscope("archive", str(recording), "-o", str(archive)).returncode == 0
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("ptscope-archive.json"))  # type: ignore[arg-type]
    kernel = [o for o in manifest["objects"] if o["path"] == "[kernel.kallsyms]"]
    assert kernel and kernel[0]["files"][0].endswith("/kallsyms")
    # Every file the samples' call chains pass through is there, not only the objects
    # of the sampled addresses (what perf buildid-list --with-hits names).
    script = subprocess.run([find_perf().path, "script", "-i", str(recording / "perf.data"), "-F",
                             "ip,dso"], capture_output=True, text=True, check=True)  # fmt: skip
    in_chains = set(re.findall(r"\((/[^()]+)\)\s*$", script.stdout, re.MULTILINE))
    assert in_chains and in_chains <= {o["path"] for o in manifest["objects"]}
    assert "[kernel.kallsyms]" in script.stdout  # so kernel names are in `want`
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = ptscope("decode", str(archive), "-o", "there.fxt.gz", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    assert dump(elsewhere / "there.fxt.gz") == want


def test_a_changed_binary_is_reported_not_archived(private_program: Path, tmp_path: Path) -> None:
    program = private_program
    recording = tmp_path / "rec"
    record([str(program), "3"], recording)
    shutil.copy2(build("basics", opt="-O2"), program)  # another build, another build-id
    done = ptscope("archive", str(recording), "-o", str(tmp_path / "a.tar.gz"))
    assert done.returncode == 0, done.stderr
    assert f"not archived: {program}" in done.stderr and "changed" in done.stderr


def test_bad_archive_input_is_one_line(tmp_path: Path) -> None:
    out = str(tmp_path / "x.tar.gz")
    line = one_line_error(ptscope("archive", str(tmp_path / "none"), "-o", out), 3)
    assert "no such file" in line
    (tmp_path / "empty").mkdir()
    line = one_line_error(ptscope("archive", str(tmp_path / "empty"), "-o", out), 3)
    assert "holds no perf.data" in line
    (tmp_path / "text.data").write_text("not a perf.data\n")
    line = one_line_error(ptscope("archive", str(tmp_path / "text.data"), "-o", out), 3)
    assert "perf cannot read" in line
    assert not list(tmp_path.glob("*x.tar.gz*"))
    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        tar.add(__file__, arcname="hello.py")
    line = one_line_error(ptscope("decode", str(plain), "-o", str(tmp_path / "t.fxt")), 3)
    assert "not a ptscope archive" in line
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        info = tarfile.TarInfo("../outside")
        tar.addfile(info)
    line = one_line_error(ptscope("decode", str(evil), "-o", str(tmp_path / "t.fxt")), 3)
    assert "outside the archive" in line
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(plain.read_bytes()[:40])
    one_line_error(ptscope("decode", str(cut), "-o", str(tmp_path / "t.fxt")))


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ptscope archive`` of a small recording, made once."""
    base = tmp_path_factory.mktemp("archive")
    record([str(build("basics")), "3"], base / "rec")
    archive = base / "rec.tar.gz"
    done = ptscope("archive", str(base / "rec"), "-o", str(archive))
    assert done.returncode == 0, done.stderr
    return archive


def _repacked(archive: Path, out: Path, *extra: tarfile.TarInfo) -> Path:
    """``archive``'s members, then ``extra`` (without data), as a new .tar.gz."""
    with tarfile.open(archive) as source, tarfile.open(out, "w:gz") as tar:
        for member in source:
            tar.addfile(member, source.extractfile(member) if member.isfile() else None)
        for info in extra:
            tar.addfile(info)
    return out


def _hard_link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE
    info.linkname = target
    return info


def test_a_hard_link_unpacks_only_to_a_file_before_it(small_archive: Path, tmp_path: Path) -> None:
    """A hard link to a member the archive holds earlier is unpacked; one to a member it
    does not hold (yet) is one line (it was an internal KeyError)."""
    good = _repacked(
        small_archive, tmp_path / "good.tar.gz", _hard_link("copy", "recording/perf.data")
    )
    done = ptscope("decode", str(good), "-o", str(tmp_path / "t.fxt.gz"))
    assert done.returncode == 0, done.stderr
    bad = _repacked(small_archive, tmp_path / "bad.tar.gz", _hard_link("copy", "recording/absent"))
    line = one_line_error(ptscope("decode", str(bad), "-o", str(tmp_path / "u.fxt.gz")), 3)
    assert "'copy' is a hard link to 'recording/absent'" in line, line
    assert "internal error" not in line and not (tmp_path / "u.fxt.gz").exists()


def test_unpacking_stops_at_its_size_limit(small_archive: Path, tmp_path: Path) -> None:
    """An archive's files may hold at most 4 GiB in all, unpacked (a member that claims
    more is refused before a byte of it is written), or what PTSCOPE_UNPACK_LIMIT says."""
    huge = tarfile.TarInfo("recording/huge")
    huge.size = 5 << 30  # no data follows: a small file that would unpack to 5 GiB
    bomb = _repacked(small_archive, tmp_path / "bomb.tar.gz", huge)
    line = one_line_error(ptscope("decode", str(bomb), "-o", str(tmp_path / "t.fxt.gz")), 3)
    assert "its files hold more than 4G, the most ptscope unpacks (PTSCOPE_UNPACK_LIMIT)" in line
    small = {"PTSCOPE_UNPACK_LIMIT": "16K"}
    done = ptscope("decode", str(small_archive), "-o", str(tmp_path / "t.fxt.gz"), env=small)
    assert "more than 16K" in one_line_error(done, 3)
    done = ptscope("decode", str(small_archive), "-o", str(tmp_path / "t.fxt.gz"),
                   env={"PTSCOPE_UNPACK_LIMIT": "lots"})  # fmt: skip
    assert "PTSCOPE_UNPACK_LIMIT='lots': give a size" in one_line_error(done, 2)
    done = ptscope("decode", str(small_archive), "-o", str(tmp_path / "t.fxt.gz"),
                   env={"PTSCOPE_UNPACK_LIMIT": "1G"})  # fmt: skip
    assert done.returncode == 0, done.stderr
