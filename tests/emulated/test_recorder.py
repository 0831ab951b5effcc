"""The recorder plugin where it had to be right: resume points a signal handler rewrites,
thread names, and recordings that outlive whatever kills them (ptscope, QEMU, a full disk).

Other corpus programs (non-PIE builds included) are compared with QEMU's own instruction
log in ``test_branches.py``; here each program is its own truth.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from ptscope.pipeline import decode_recording
from ptscope.record.emulated import record
from ptscope.record.emulated.state import read_state
from ptscope.recording import Recording
from support import programs
from support.emulated_corpus import needs_tools, perf_branch_stream, perf_branches
from support.qemu_truth import Branch

pytestmark = pytest.mark.slow

PTSCOPE = [sys.executable, "-m", "ptscope"]


def _symbol(exe: Path, name: str) -> int:
    out = subprocess.run(["nm", str(exe)], capture_output=True, text=True, check=True).stdout
    [address] = [int(line.split()[0], 16) for line in out.splitlines() if line.endswith(f" {name}")]
    return address


def test_non_pie_program_decodes_every_call(tmp_path: Path) -> None:
    """A dynamically linked program at its link-time addresses (gcc -no-pie): perf decodes
    all of it (the old recorder gave it the PIE load address: 2,970 of 3,000 calls lost)."""
    needs_tools()
    exe = programs.build("calls3000", link="nopie")
    result = record([str(exe)], tmp_path / "rec")
    got = perf_branches(tmp_path / "rec" / "perf.data")
    assert not got.errors, got.errors[:3]
    leaf = _symbol(exe, "leaf")
    assert leaf < 1 << 32  # really at its link-time address
    (branches,) = got.by_tid.values()
    calls = [b for b in branches if b.kind == "call" and b.dst == leaf]
    assert len(calls) == 3000
    assert result.exit_code == 0


def test_a_handler_that_moves_the_resume_point(tmp_path: Path) -> None:
    """A signal handler rewrites the saved RIP (Go's asynchronous preemption): the trace
    says where each signal really interrupted the program (the program logs it), and perf
    decodes every preemption without an error. The old recorder took the point after
    rt_sigreturn for the interrupted one: about 50 "Trace doesn't match" per 3,800."""
    needs_tools()
    exe = programs.build("preempt", extra=["-mno-red-zone"])
    truth = tmp_path / "interrupted.txt"
    result = record([str(exe), "400", str(truth)], tmp_path / "rec")
    assert result.exit_code == 0
    handler = _symbol(exe, "on_urg") + 0x4000000000  # the PIE's load address
    stub = _symbol(exe, "preempt_stub") + 0x4000000000
    # Read as perf prints it, keeping only what is checked (the trace holds millions of
    # branches).
    errors: list[str] = []
    previous: dict[int, Branch] = {}  # per thread (the main one is the first, by tid)
    deliveries: dict[int, list[Branch]] = defaultdict(list)
    resumed: Counter[int] = Counter()
    for item in perf_branch_stream(tmp_path / "rec" / "perf.data"):
        if isinstance(item, str):
            errors.append(item)
            continue
        tid, branch = item
        # Each delivery: the handler starts right after the interruption (FUP: where the
        # program was), or right after a system call (no interruption in the trace, as
        # on Intel PT: tracing was off, in the kernel).
        if branch.kind == "start" and branch.dst == handler and tid in previous:
            deliveries[tid].append(previous[tid])
        # and each handler's rt_sigreturn resumes the program in the stub
        resumed[tid] += branch.kind == "start" and branch.dst == stub
        previous[tid] = branch
    assert not errors, errors[:3]
    main = min(previous)
    logged = [int(x, 16) for x in truth.read_text().split()]
    assert len(deliveries[main]) == len(logged) >= 400
    interrupted = [
        (b.src, r) for b, r in zip(deliveries[main], logged, strict=True) if b.kind == "async"
    ]
    assert len(interrupted) > 380
    assert all(src == r for src, r in interrupted), interrupted[:5]
    assert resumed[main] == len(deliveries[main])


def test_thread_names_are_in_the_recording_and_the_trace(tmp_path: Path) -> None:
    """prctl(PR_SET_NAME), pthread_setname_np on itself and on another thread (a write to
    /proc/self/task/TID/comm): each thread ends with its name, in the recording's
    metadata, in perf's view and in the trace."""
    needs_tools()
    exe = programs.build("thread_names")
    truth = tmp_path / "names.txt"
    result = record([str(exe), str(truth)], tmp_path / "rec")
    assert result.exit_code == 0
    expected = {
        int(tid): name for tid, name in (line.split() for line in truth.read_text().splitlines())
    }
    assert result.recording.threads == expected
    out = tmp_path / "t.fxt.gz"
    decode_recording(Recording.load(tmp_path / "rec"), out)
    trace = read_trace(out)
    names = {tid: name for (_pid, tid), name in trace.threads.items()}
    assert names == expected


def _run_ptscope_until(args: list[str], line: bytes, cwd: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [*PTSCOPE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd
    )
    assert process.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while line not in seen and time.monotonic() < deadline:
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            break
        seen += chunk
    assert line in seen, seen
    return process


def _gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_killed_ptscope_stops_the_program_and_leaves_a_recording(tmp_path: Path) -> None:
    """SIGKILL ptscope while it records: the program does not go on untraced, and
    `ptscope decode` makes a trace of what ran (the metadata was there from the start)."""
    needs_tools()
    exe = str(programs.build("spin"))
    rec = tmp_path / "rec"
    process = _run_ptscope_until(
        ["run", "--backend", "emulated", "--keep-recording", str(rec), "--", exe, "spinning", "1"],
        b"spinning",
        tmp_path,
    )
    time.sleep(0.5)
    state = read_state(rec, details=False)
    process.kill()
    process.wait()
    for pid in state.pids:
        assert _gone(pid, within=5), f"QEMU {pid} still runs after ptscope was killed"
    assert json.loads((rec / "ptscope-recording.json").read_text())["notes"]["state"] == "recording"
    out = tmp_path / "t.fxt.gz"
    done = subprocess.run(
        [*PTSCOPE, "decode", str(rec), "-o", str(out)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "not finished" in done.stderr
    names = {s.name for rows in read_trace(out).slices.values() for s in rows}
    assert {"main", "step"} <= names
    recording = Recording.load(rec)
    assert recording.notes.get("recovered") and recording.processes and recording.threads


def test_qemu_killed_outright_leaves_a_decodable_recording(tmp_path: Path) -> None:
    """QEMU itself is SIGKILLed: every thread's stream already ends where it was."""
    needs_tools()
    exe = programs.build("spin")
    rec = tmp_path / "rec"

    def progress(n: int) -> None:
        if n > 200_000:
            for pid in read_state(rec, details=False).pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    result = record([str(exe), "spinning", "paced"], rec, progress=progress)
    assert result.signal == signal.SIGKILL and not result.crashed
    got = perf_branches(rec / "perf.data")
    # The stream ends where the thread was (a provisional FUP + TIP.PGD after every block),
    # unless the kill came while a block's packets were half written: then perf's last
    # word is an error about those bytes.
    assert len(got.errors) <= 1, got.errors
    (branches,) = got.by_tid.values()
    assert len(branches) > 20_000
    assert got.errors or branches[-1].kind in ("async", "syscall", "return", "call", "jcc", "jmp")


def test_a_torn_checkpoint_is_finished_when_decoded(tmp_path: Path) -> None:
    """QEMU killed while it rewrote the header and the feature sections: `decode` writes
    them again from the recorder's state (the Python twin of the plugin's checkpoint)."""
    needs_tools()
    exe = programs.build("basics", static=True)
    rec = tmp_path / "rec"
    record([str(exe)], rec)
    good = (rec / "perf.data").read_bytes()
    torn = bytearray(good)
    state = read_state(rec)
    torn[48:56] = (1).to_bytes(8, "little")  # the header's data size, half-updated
    torn[state.data_end : state.data_end + 64] = b"\xff" * 64  # the feature table, cut
    (rec / "perf.data").write_bytes(bytes(torn))
    metadata = json.loads((rec / "ptscope-recording.json").read_text())
    metadata["notes"]["state"] = "recording"  # as if ptscope died too
    (rec / "ptscope-recording.json").write_text(json.dumps(metadata))
    decode_recording(Recording.load(rec), tmp_path / "t.fxt.gz")
    assert (rec / "perf.data").read_bytes() == good


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
def test_a_full_disk_keeps_what_was_written(tmp_path: Path) -> None:
    """The disk fills up: the program is stopped, the recording holds everything written
    until then, and the result says so in one line."""
    needs_tools()
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        exe = programs.build("spin")
        result = record([str(exe)], disk / "rec", max_instructions=500_000_000)
        assert result.disk_full and not result.stopped_at_limit
        assert "disk is full" in result.summary and "\n" not in result.summary
        got = perf_branches(disk / "rec" / "perf.data")
        assert not got.errors, got.errors[:3]
        assert sum(len(b) for b in got.by_tid.values()) > 50_000
        trace = tmp_path / "t.fxt.gz"
        decode_recording(result.recording, trace)
        names = {s.name for rows in read_trace(trace).slices.values() for s in rows}
        assert {"main", "step"} <= names
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _peak_rss_of_recording(tmp_path: Path, instructions: int) -> int:
    """Peak RSS (bytes) of the QEMU that records ``instructions`` of a loop of calls."""
    exe = programs.build("spin")
    script = (
        "import resource, sys\n"
        "from pathlib import Path\n"
        "from ptscope.record.emulated import record\n"
        f"record([{str(exe)!r}], Path({str(tmp_path / f'rec{instructions}')!r}),"
        f" max_instructions={instructions})\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    return int(out.split()[-1]) * 1024


def test_recorder_memory_does_not_grow_with_the_trace(tmp_path: Path) -> None:
    needs_tools()
    small = _peak_rss_of_recording(tmp_path, 5_000_000)
    large = _peak_rss_of_recording(tmp_path, 100_000_000)
    assert large < 200 << 20
    assert large < small + (24 << 20), (small, large)


def test_execve_ends_the_trace_of_that_process(tmp_path: Path) -> None:
    """What a process execs runs natively (QEMU user mode): its trace ends at execve,
    complete, and the new program's output still comes."""
    needs_tools()
    exe = programs.build("exec_true")
    result = record([str(exe), shutil.which("true") or "/bin/true"], tmp_path / "rec")
    assert result.exit_code == 0
    got = perf_branches(tmp_path / "rec" / "perf.data")
    assert not got.errors
    (branches,) = got.by_tid.values()
    assert branches[-1].kind == "syscall"
    names = {b.dst for b in branches if b.kind == "call"}
    assert _symbol(exe, "before_exec") + 0x4000000000 in names


def test_a_recording_directory_with_commas_and_equals(tmp_path: Path) -> None:
    """The directory reaches the plugin inside QEMU's option list (commas doubled)."""
    needs_tools()
    exe = programs.build("basics", static=True)
    rec = tmp_path / "a,b=c d" / "rec"
    result = record([str(exe)], rec)
    assert result.exit_code == 0 and (rec / "perf.data").is_file()
    assert not perf_branches(rec / "perf.data").errors
