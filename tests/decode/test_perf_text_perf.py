"""The perf script runner: argv, streaming, perf's failures, and a real sampled recording."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from ptscope.decode import perf_script
from ptscope.decode.perf_script import (
    branch_script_argv,
    decode_perf_data_text,
    decode_text_file,
    perf_failure,
    read_text_lines,
    sampling_script_argv,
    stream_perf_script,
)
from ptscope.decode.perf_text import TextStats, parse_text
from ptscope.errors import BadInputError, PtscopeError
from ptscope.model import BranchEvent, CommEvent, Event, StackSample
from ptscope.perftool import find_perf

LINE = (
    "  1234/1234  12345.678901234:          1  branches:uH:   call                  "
    "   401136 main+0x26 (/tmp/a.out) =>           401106 f+0x0 (/tmp/a.out)"
)


# ------------------------------------------------------------------------- argv


def test_branch_argv_default() -> None:
    assert branch_script_argv("rec/perf.data") == [
        "perf",
        "script",
        "-i",
        "rec/perf.data",
        "--ns",
        "--itrace=bep",
        "-F",
        "pid,tid,time,flags,ip,addr,sym,symoff,synth,dso,event,period",
    ]


def test_branch_argv_options() -> None:
    argv = branch_script_argv(
        Path("p.data"),
        perf="/usr/bin/perf",
        time_window=(1_500_000_000, 2_000_000_001),
        pids=[10, 11],
        tids=[12],
        itrace_extra="i100ns",
        symfs="/sysroot",
        demangle=False,
        ipc=True,
        task_events=True,
        extra=["--cpu", "0"],
    )
    assert argv == [
        "/usr/bin/perf",
        "script",
        "-i",
        "p.data",
        "--ns",
        "--itrace=bepi100ns",
        "-F",
        "pid,tid,time,flags,ip,addr,sym,symoff,synth,dso,event,period,ipc",
        "--time=1.500000000,2.000000001",
        "--pid=10,11",
        "--tid=12",
        "--symfs=/sysroot",
        "--no-demangle",
        "--show-task-events",
        "--cpu",
        "0",
    ]


def test_open_time_windows_and_bad_windows() -> None:
    assert "--time=,0.000000005" in branch_script_argv("p", time_window=(None, 5))
    assert "--time=3.000000000," in sampling_script_argv("p", time_window=(3 * 10**9, None))
    with pytest.raises(ValueError, match="ends before it starts"):
        branch_script_argv("p", time_window=(5, 4))


def test_sampling_argv() -> None:
    assert sampling_script_argv("perf.data", stitch_lbr=True, tids=[7]) == [
        "perf",
        "script",
        "-i",
        "perf.data",
        "--ns",
        "-F",
        "pid,tid,time,ip,sym,symoff,dso,event,period",
        "--tid=7",
        "--stitch-lbr",
    ]


# ------------------------------------------------------------------ saved text


def test_read_text_lines_across_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(perf_script, "CHUNK_SIZE", 7)  # lines straddle every read
    path = tmp_path / "out.txt"
    lines = [LINE, "", "\tx ünïcode", "last line without newline"]
    path.write_bytes(("\n".join(lines)).encode() + b"\xff")
    got = [line for batch in read_text_lines(path) for line in batch]
    assert got == [*lines[:-1], lines[-1] + "\ufffd"]


def test_decode_text_file_and_stdin(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text(LINE + "\nnonsense\n" + LINE + "\n")
    stats: list[TextStats] = []
    events = [e for b in decode_text_file(path, on_stats=stats.append) for e in b]
    assert len(events) == 2 and all(isinstance(e, BranchEvent) for e in events)
    assert stats[0].unknown_lines == 1 and stats[0].lines == 3
    code = (
        "from ptscope.decode.perf_script import decode_text_file\n"
        "print(sum(len(b) for b in decode_text_file('-')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=path.read_text(), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "2"


def test_missing_or_unreadable_text_file(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no such file"):
        list(read_text_lines(tmp_path / "absent.txt"))
    with pytest.raises(BadInputError, match="is a directory"):
        list(read_text_lines(tmp_path))
    binary = tmp_path / "core"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\0\0\0\n" * 10)
    with pytest.raises(BadInputError) as info:
        list(read_text_lines(binary))
    assert _one_line(info.value) == f"{binary} is not perf script text (it holds binary data)"


def test_a_perf_data_given_as_text(sampled: tuple[Path, Path]) -> None:
    _, data = sampled
    with pytest.raises(BadInputError) as info:
        list(decode_text_file(data))
    assert _one_line(info.value) == f"{data} is a perf.data file, not perf script text"
    assert info.value.hint == f"decode it as a recording: ptscope decode {data}"


# ---------------------------------------------------------------- perf failures


def _one_line(error: PtscopeError) -> str:
    assert "\n" not in error.message and "Traceback" not in error.message
    return error.message


@pytest.fixture(scope="module")
def perf() -> str:
    try:
        return find_perf().path
    except PtscopeError as e:
        pytest.skip(f"perf not available: {e.message}")


def test_missing_perf_data(tmp_path: Path, perf: str) -> None:
    with pytest.raises(BadInputError) as info:
        list(decode_perf_data_text(tmp_path / "nope.data"))
    assert _one_line(info.value) == f"{tmp_path / 'nope.data'}: no such file"
    # perf's own message for it, when perf gets to see the missing file.
    path = tmp_path / "gone.data"
    with pytest.raises(BadInputError) as info:
        list(stream_perf_script(branch_script_argv(path, perf=perf), perf_data=path))
    assert _one_line(info.value) == f"{path}: no such file"
    assert info.value.details and "No such file" in info.value.details


def test_not_a_perf_data_file(tmp_path: Path, perf: str) -> None:
    path = tmp_path / "perf.data"
    path.write_text(LINE + "\n")
    with pytest.raises(BadInputError) as info:
        list(decode_perf_data_text(path, perf=find_perf()))
    assert _one_line(info.value) == (
        f"{path} is not a perf.data file (or was written by an incompatible perf)"
    )
    assert info.value.details and perf in info.value.details  # the command, for -v


def test_permission_messages() -> None:
    err = perf_failure(
        ["perf", "script"],
        255,
        "File perf.data not owned by current user or root (use -f to override)\n",
        "perf.data",
    )
    assert err.message == "perf.data: permission denied" and err.hint
    err = perf_failure(["perf"], 255, "failed to open perf.data: Permission denied\n", "x")
    assert err.message == "x: permission denied"
    err = perf_failure(["perf"], 3, "Warning: something\nreal problem here\n", "x")
    assert err.message == "perf script failed on x (exit 3): real problem here"


def _fake_perf(tmp_path: Path, script: str) -> str:
    path = tmp_path / "fake-perf"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_perf_crashing_with_a_signal(tmp_path: Path) -> None:
    # perf itself cannot be made to crash on demand here; a stand-in dies the same way.
    fake = _fake_perf(tmp_path, f"echo '{LINE}'\necho 'intel_pt: oops' >&2\nkill -SEGV $$\n")
    batches = stream_perf_script([fake, "script"], perf_data="rec/perf.data")
    events: list[Event] = []
    with pytest.raises(BadInputError) as info:
        for batch in parse_text(batches):
            events += batch
    assert _one_line(info.value) == "perf script crashed (SIGSEGV) while decoding rec/perf.data"
    assert info.value.details and "intel_pt: oops" in info.value.details
    assert len(events) == 1  # what perf printed before dying was decoded


def test_stopping_early_stops_perf(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    fake = _fake_perf(tmp_path, f"echo $$ > {pid_file}\nexec yes '{LINE}'\n")
    batches = stream_perf_script([fake])
    assert next(batches)
    t0 = time.monotonic()
    batches.close()
    assert time.monotonic() - t0 < 5
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped


# ------------------------------------------------------- a real sampled recording

PROGRAM = r"""
#include <stdio.h>
volatile unsigned long sink;
__attribute__((noinline)) unsigned long spin_inner(unsigned long n) {
    unsigned long s = 0;
    for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3);
    return s;
}
__attribute__((noinline)) void spin_outer(int rounds) {
    for (int r = 0; r < rounds; r++) sink += spin_inner(100000 + (unsigned long)r);
}
int main(void) {
    spin_outer(800);
    printf("%lu\n", sink);
    return 0;
}
"""


@pytest.fixture(scope="module")
def sampled(perf: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A ``perf record -e cpu-clock -g`` recording of a small compiled program.

    Made in a directory of the test process's own: with ``-n 2`` each worker that runs a
    test of this module makes its own, and one shared path had one worker read the
    perf.data that the other was writing."""
    where = tmp_path_factory.mktemp("sampled")
    src = where / "spin.c"
    prog = where / "spin"
    src.write_text(PROGRAM)
    subprocess.run(
        # -O0: every function keeps its frame, so frame-pointer unwinding sees them all.
        ["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-no-pie", "-o", str(prog), str(src)],
        check=True,
    )
    data = where / "spin.perf.data"
    rec = subprocess.run(
        [perf, "record", "-q", "-e", "cpu-clock", "-c", "200000", "-g", "-o", str(data), str(prog)],
        capture_output=True,
        text=True,
    )
    if rec.returncode != 0:
        pytest.skip(f"perf record does not work here: {rec.stderr.strip()[:200]}")
    return prog, data


def test_real_sampled_recording(sampled: tuple[Path, Path]) -> None:
    prog, data = sampled
    stats: list[TextStats] = []
    events = [
        e
        for batch in decode_perf_data_text(
            data, sampling=True, task_events=True, on_stats=stats.append
        )
        for e in batch
    ]
    assert stats[0].unknown_lines == 0, stats[0].unknown_examples
    samples = [e for e in events if isinstance(e, StackSample)]
    assert len(samples) > 50
    assert all(s.event == "cpu-clock" and s.period == 200000 for s in samples)
    comms = [e for e in events if isinstance(e, CommEvent)]
    assert any(c.comm == "spin" and c.exec for c in comms)

    # Stacks run root -> leaf: main, then spin_outer, then spin_inner.
    ours = [[f.symbol for f in s.frames if f.dso == str(prog)] for s in samples]
    deep = [names for names in ours if names[-1:] == ["spin_inner"]]
    assert len(deep) > len(samples) // 2
    for names in deep:
        assert names[:3] == ["main", "spin_outer", "spin_inner"] or names == ["spin_inner"]

    # Every frame of the program resolves as its ELF symbol table says (pyelftools). perf
    # 6.1 prints callchain addresses relative to the mapping (file offsets), newer ones may
    # print them absolute: either is right.
    with open(prog, "rb") as f:
        elf = ELFFile(f)
        starts = {s.name: s["st_value"] for s in elf.get_section_by_name(".symtab").iter_symbols()}
        loads = [seg.header for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
    checked = 0
    for s in samples:
        for frame in s.frames:
            if frame.dso == str(prog):
                address = starts[frame.symbol] + frame.offset
                seg = next(h for h in loads if h.p_vaddr <= address < h.p_vaddr + h.p_memsz)
                assert frame.ip in (address, address - seg.p_vaddr + seg.p_offset), frame
                checked += 1
    assert checked > 100


def test_real_recording_without_branch_trace(sampled: tuple[Path, Path]) -> None:
    _, data = sampled
    with pytest.raises(BadInputError) as info:
        list(decode_perf_data_text(data))
    assert _one_line(info.value) == f"{data} holds no branch trace (no Intel PT data)"
    assert info.value.hint


def test_signal_names_for_messages() -> None:
    err = perf_failure(["perf"], -signal.SIGKILL, "", "x")
    assert err.message == "perf script crashed (SIGKILL) while decoding x"
