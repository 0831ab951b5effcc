"""The perf.data the emulated backend writes: what perf's other tools see in it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from ptscope.perftool import find_perf, perf_env
from support import qemu_truth
from support.emulated_corpus import Case, recorded

pytestmark = pytest.mark.slow


def _perf(*args: str) -> str:
    out = subprocess.run(
        [find_perf().path, *args], capture_output=True, text=True, env=perf_env(), check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


def _build_id(path: Path) -> str:
    with open(path, "rb") as f:
        for sec in ELFFile(f).iter_sections():
            if sec["sh_type"] == "SHT_NOTE":
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                        return str(note["n_desc"])
    raise AssertionError(f"{path} has no build-id")


def test_header_only_describes_the_recording(corpus_dir: Path) -> None:
    rec = recorded(Case("basics"), corpus_dir)
    text = _perf("report", "-i", str(rec.directory / "perf.data"), "--header-only")
    assert "name = intel_pt//u" in text and "name = dummy:u" in text
    assert "contains AUX area data" in text
    for line in ("arch : x86_64", "cpuid : GenuineIntel", "nrcpus online : 1"):
        assert line in text
    assert re.search(r"cmdline : .*basics", text)


def test_build_ids_of_every_binary_are_recorded(corpus_dir: Path) -> None:
    rec = recorded(Case("dlopen"), corpus_dir)
    text = _perf("buildid-list", "-i", str(rec.directory / "perf.data"))
    listed = dict(line.split(maxsplit=1)[::-1] for line in text.splitlines() if line.strip())
    plugin = Path(rec.result.recording.command[1]).resolve()
    for path in (rec.exe.resolve(), plugin):
        assert listed.get(str(path)) == _build_id(path), text
    assert any("libc.so" in p for p in listed)


def test_sideband_names_threads_and_maps_the_files(corpus_dir: Path) -> None:
    rec = recorded(Case("threads"), corpus_dir)
    text = _perf(
        "script",
        "-i",
        str(rec.directory / "perf.data"),
        "--show-task-events",
        "--show-mmap-events",
        "--itrace=",
    )
    tids = {t.tid for t in rec.truth.threads}
    assert {int(t) for t in re.findall(r"PERF_RECORD_EXIT\(\d+:(\d+)\)", text)} == tids
    assert len(re.findall(r"PERF_RECORD_FORK", text)) == len(tids) - 1
    # One MMAP2 per executable segment, at the file offset perf reads code from.
    maps = re.findall(
        r"PERF_RECORD_MMAP2 \d+/\d+: \[(0x[0-9a-f]+)\((0x[0-9a-f]+)\) @ (0x[0-9a-f]+) .*?\]: "
        r"r-xp (\S+)",
        text,
    )
    files = {m[3] for m in maps}
    assert str(rec.exe.resolve()) in files and any("libc.so" in f for f in files)
    for _start, _size, pgoff, path in maps:
        with open(path, "rb") as f:
            segs = [
                s
                for s in ELFFile(f).iter_segments()
                if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1
            ]
        assert any(int(pgoff, 16) == s["p_offset"] & ~0xFFF for s in segs)


_TIME_RE = re.compile(r"^\s*\d+\s+(\d+)\.(\d{9}):\s+(.*?)\s+([0-9a-f]+) =>\s+([0-9a-f]+)")


def test_packet_times_follow_the_cycle_model(corpus_dir: Path) -> None:
    """Every branch that has a packet of its own is dated exactly by the cycle model:
    one cycle per instruction and 100 per system call at 2 GHz, from 1.000000000 s."""
    rec = recorded(Case("basics", static=True), corpus_dir)
    text = _perf(
        "script",
        "-i",
        str(rec.directory / "perf.data"),
        "--itrace=b",
        "--ns",
        "-F",
        "tid,time,flags,ip,addr",
    )
    perf_times = []
    for line in text.splitlines():
        m = _TIME_RE.match(line)
        assert m, line
        perf_times.append((m.group(3).strip(), int(m.group(1)) * 10**9 + int(m.group(2))))
    run = rec.truth.threads[0]
    timing = qemu_truth.Timing(run)
    expected = qemu_truth.expected_branches(run)
    assert len(perf_times) == len(expected)
    checked = 0
    for (flags, ns), branch in zip(perf_times, expected, strict=True):
        k = branch.at
        if branch.kind in ("jcc", "return"):
            want = timing.ns(k + 1)
        elif branch.kind == "syscall":
            want = timing.ns(k) + 0.5  # the system call's cost comes after `tr end`
        elif branch.kind == "start" and k > 0:
            want = timing.ns(k)
        else:
            continue  # direct calls and jumps carry no time of their own
        assert abs((ns - 10**9) - want) <= 1, (flags, hex(branch.src), ns, want)
        checked += 1
    assert checked > 0.5 * len(expected)
