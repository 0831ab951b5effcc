"""`ptscope run` / `attach` end to end with the real perf (sampling backend on this VM), real
compiled programs, and the trace read back with the strict FXT reader.

Also the failures a user meets: a PID that does not exist, a program that does not exist,
permissions, Intel PT missing, Ctrl-C, perf dying. Each must be one line and an exit code,
never a traceback, and never lose a recording.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ptscope.fxt.reader import FxtTrace, TraceSlice, read_trace
from support import programs

pytestmark = pytest.mark.slow

Build = Callable[..., Path]
PTSCOPE = [sys.executable, "-m", "ptscope"]


def ptscope(*args: str, timeout: float = 120, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PTSCOPE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,  # type: ignore[call-overload]
    )


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr
    assert "internal error" not in stderr, stderr


def slices_of(trace: FxtTrace, pid: int) -> list[TraceSlice]:
    return [s for (p, _t), rows in trace.slices.items() if p == pid for s in rows]


def chain_exists(rows: list[TraceSlice], names: list[str]) -> bool:
    """Some slice of names[-1] lies inside a names[-2] one, ... one depth apart each."""

    def inside(child: TraceSlice, name: str) -> TraceSlice | None:
        for parent in rows:
            if (
                parent.name == name
                and parent.depth == child.depth - 1
                and parent.start <= child.start
                and child.end <= parent.end
            ):
                return parent
        return None

    for leaf in (s for s in rows if s.name == names[-1]):
        current: TraceSlice | None = leaf
        for name in reversed(names[:-1]):
            assert current is not None
            current = inside(current, name)
            if current is None:
                break
        if current is not None:
            return True
    return False


def test_run_sampling_nests_main_to_the_hot_leaf(program: Build, tmp_path: Path) -> None:
    calls = program("calls")
    out = tmp_path / "calls.fxt.gz"
    rec = tmp_path / "rec"
    done = ptscope(
        "run",
        "--backend",
        "sampling",
        "--print-perf-commands",
        "--keep-recording",
        str(rec),
        "-o",
        str(out),
        "--",
        str(calls),
        "400",
    )
    assert done.returncode == 0, done.stderr
    no_traceback(done.stderr)
    assert "perf record" in done.stderr and "--control=fifo:" in done.stderr
    trace = read_trace(out)
    meta = json.loads((rec / "ptscope-recording.json").read_text())
    [pid] = [int(p) for p in meta["processes"]]
    rows = slices_of(trace, pid)
    assert chain_exists(rows, ["main", "run_for", "compute", "hot_leaf"])
    assert chain_exists(rows, ["run_for", "compute", "warm_leaf", "hot_leaf"])
    # compute spends 8x longer in hot_leaf(n) than in warm_leaf (hot_leaf(n / 8)).
    total: dict[str, int] = {}
    for s in rows:
        total[s.name] = total.get(s.name, 0) + s.end - s.start
    assert total["hot_leaf"] > 2 * total.get("warm_leaf", 0)
    assert meta["backend"] == "sampling" and meta["notes"]["exit_code"] == 0
    assert "recording kept at" in done.stderr
    # "decode again with: ptscope decode DIR" works as printed.
    again = ptscope("decode", str(rec), "-o", str(tmp_path / "again.fxt.gz"))
    assert again.returncode == 0, again.stderr
    assert sum(len(v) for v in read_trace(tmp_path / "again.fxt.gz").slices.values()) == sum(
        len(v) for v in trace.slices.values()
    )


def test_temporary_recording_is_removed_after_success(program: Build, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = ptscope(
        "run",
        "--backend",
        "sampling",
        "-o",
        str(tmp_path / "t.fxt.gz"),
        "--",
        str(program("calls")),
        "50",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ptscope-")]


def test_run_trigger_hits_on_both_threads_are_recorded(program: Build, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    out = tmp_path / "t.fxt.gz"
    done = ptscope(
        "run",
        "--backend",
        "sampling",
        "--trigger",
        "trigger_target",
        "--keep-recording",
        str(rec),
        "-o",
        str(out),
        "--",
        str(program("threads")),
        "30",
    )
    assert done.returncode == 0, done.stderr
    no_traceback(done.stderr)
    meta = json.loads((rec / "ptscope-recording.json").read_text())
    hits = meta["hits"]
    [pid] = [int(p) for p in meta["processes"]]
    assert len(hits) == 2
    assert {h["symbol"] for h in hits} == {"trigger_target"}
    assert hits[0]["tid"] == pid and hits[1]["tid"] != pid
    trace = read_trace(out)
    hit_marks = [i for rows in trace.instants.values() for i in rows if i.name.startswith("hit")]
    assert len(hit_marks) == 2
    # Hits are on the trace's clock: inside the program's recorded time span.
    rows = slices_of(trace, pid)
    first, last = min(s.start for s in rows), max(s.end for s in rows)
    assert all(first <= h["time"] <= last + 50_000_000 for h in hits)


@pytest.fixture
def spin(program: Build) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([str(program("spin")), "60", "1"], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline().startswith(b"ready")
    yield process
    process.kill()
    process.wait()


def wait_for_line(process: subprocess.Popen[str], text: str, timeout: float = 60) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        seen += line
        if text in line:
            return seen
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"{text!r} never printed; stderr so far:\n{seen}")


def _attach_in_background(pids: str, output: Path, *extra: str) -> subprocess.Popen[str]:
    """``ptscope attach`` with the sampling backend, running; its output is piped."""
    return subprocess.Popen(
        [*PTSCOPE, "attach", "-p", pids, "--backend", "sampling", *extra, "-o", str(output)],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_attach_then_detach_with_sigint(spin: subprocess.Popen[bytes], tmp_path: Path) -> None:
    out = tmp_path / "attach.fxt.gz"
    process = _attach_in_background(str(spin.pid), out, "--multi-thread")
    try:
        wait_for_line(process, "attached to")
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    no_traceback(stderr)
    assert spin.poll() is None, "detaching must leave the process running"
    trace = read_trace(out)
    rows = slices_of(trace, spin.pid)
    assert chain_exists(rows, ["busy_loop", "spin_leaf"])
    assert len({tid for (pid, tid) in trace.slices if pid == spin.pid}) == 2  # both threads


def test_ctrl_c_during_run_stops_and_decodes(program: Build, tmp_path: Path) -> None:
    out = tmp_path / "r.fxt.gz"
    process = subprocess.Popen(
        [
            *PTSCOPE,
            "run",
            "--backend",
            "sampling",
            "-o",
            str(out),
            "--",
            str(program("spin")),
            "60",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(process, "recording")
        time.sleep(0.3)
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert time.monotonic() - started < 60
    no_traceback(stderr)
    assert "stopped; decoding what was recorded" in stderr
    assert any(s.name == "spin_leaf" for rows in read_trace(out).slices.values() for s in rows)


def test_run_program_that_exits_immediately(program: Build, tmp_path: Path) -> None:
    out = tmp_path / "q.fxt.gz"
    done = ptscope("run", "--backend", "sampling", "-o", str(out), "--", str(program("quick")))
    no_traceback(done.stderr)
    assert done.returncode == 3, done.stderr  # the program's status
    assert "ptscope: the program exited with status 3" in done.stderr
    read_trace(out)  # a valid (possibly empty) trace


def test_nonexistent_pid(tmp_path: Path) -> None:
    done = ptscope(
        "attach", "-p", "4194000", "--backend", "sampling", "-o", str(tmp_path / "x.fxt.gz")
    )
    assert done.returncode == 3
    assert done.stderr.splitlines()[0] == "ptscope: error: no process with PID 4194000"
    no_traceback(done.stderr)


@pytest.mark.parametrize("pids", ["12,12", "1,x", ","])
def test_bad_pid_lists(pids: str, tmp_path: Path) -> None:
    done = ptscope("attach", "-p", pids, "--backend", "sampling", "-o", str(tmp_path / "x.fxt.gz"))
    assert done.returncode == 2
    no_traceback(done.stderr)


def test_nonexistent_program(tmp_path: Path) -> None:
    done = ptscope(
        "run", "--backend", "sampling", "-o", str(tmp_path / "x.fxt.gz"), "--", "/no/such/prog"
    )
    assert done.returncode == 3
    assert "/no/such/prog: no such file" in done.stderr
    no_traceback(done.stderr)
    done = ptscope("run", "--backend", "sampling", "--", "no-such-command-xyz")
    assert done.returncode == 3 and "command not found" in done.stderr


def test_missing_intel_pt_is_refused_with_advice(program: Build, tmp_path: Path) -> None:
    if Path("/sys/bus/event_source/devices/intel_pt").exists():
        pytest.skip("this machine has Intel PT")
    done = ptscope(
        "run",
        "--backend",
        "intel-pt",
        "-o",
        str(tmp_path / "x.fxt.gz"),
        "--",
        str(program("quick")),
    )
    assert done.returncode == 5
    lines = done.stderr.splitlines()
    assert lines[0] == "ptscope: error: no Intel PT on this machine"
    assert "--backend emulated" in lines[1]
    no_traceback(done.stderr)


def test_doctor_exit_status_and_report() -> None:
    done = ptscope("doctor")
    assert done.returncode == 0, done.stdout  # this machine can record (QEMU / sampling)
    assert "perf_event_paranoid" in done.stdout and "intel_pt" in done.stdout


def as_nobody() -> list[str]:
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv to run as another user")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can write (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="ptscope-test-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_permission_denied_attaching_to_another_users_process(
    spin: subprocess.Popen[bytes], shared_dir: Path
) -> None:
    tmp_path = shared_dir
    done = subprocess.run(
        [
            *as_nobody(),
            *PTSCOPE,
            "attach",
            "-p",
            str(spin.pid),
            "--backend",
            "sampling",
            "-o",
            str(tmp_path / "x.fxt.gz"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 5, done.stderr
    first = done.stderr.splitlines()[0]
    assert first.startswith("ptscope: error: perf could not start recording")
    assert "root" in done.stderr  # the hint says what to do
    no_traceback(done.stderr)
    assert spin.poll() is None


def test_kernel_tracing_refused_for_users(program: Build, shared_dir: Path) -> None:
    if int(Path("/proc/sys/kernel/perf_event_paranoid").read_text()) <= 1:
        pytest.skip("perf_event_paranoid allows kernel tracing to users here")
    tmp_path = shared_dir
    done = subprocess.run(
        [
            *as_nobody(),
            *PTSCOPE,
            "run",
            "--backend",
            "sampling",
            "--kernel",
            "-o",
            str(tmp_path / "x.fxt.gz"),
            "--",
            str(program("quick")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 5
    assert "need root" in done.stderr.splitlines()[0]
    no_traceback(done.stderr)


def test_perf_dying_mid_attach_is_reported(spin: subprocess.Popen[bytes], tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    process = _attach_in_background(
        str(spin.pid), tmp_path / "x.fxt.gz", "--keep-recording", str(rec)
    )
    try:
        wait_for_line(process, "attached to")
        perf_pids = [
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit()
            and (p / "stat").exists()
            and _ppid(p) == process.pid
            and (p / "comm").read_text().strip() == "perf"
        ]
        assert len(perf_pids) == 1
        os.kill(perf_pids[0], signal.SIGKILL)
        _stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 5, stderr
    assert stderr.splitlines()[0].startswith("ptscope: error: perf stopped recording")
    no_traceback(stderr)
    assert spin.poll() is None
    if any(p.name.startswith("perf.data") for p in rec.iterdir()):
        assert "recording kept at" in stderr


def _ppid(proc_dir: Path) -> int:
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def test_bad_options_are_usage_errors(program: Build, tmp_path: Path) -> None:
    quick = str(program("quick"))
    cases = [
        ["run", "--backend", "sampling", "--multi-snapshot", "--", quick],
        ["run", "--backend", "sampling", "--timer-resolution", "bogus", "--", quick],
        ["run", "--backend", "sampling", "--max-instructions", "5", "--", quick],
        ["run", "--backend", "sampling", "--filter", "onlyone", "--", quick],
        ["run", "--backend", "emulated", "--trigger", "main", "--", quick],
        ["run", "--backend", "sampling"],
        ["run", "--backend", "sampling", "-o", str(tmp_path / "no" / "dir.fxt"), "--", quick],
    ]
    for argv in cases:
        done = ptscope(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        no_traceback(done.stderr)


def test_attach_two_processes_trigger_in_each(program: Build, tmp_path: Path) -> None:
    """Each process gets the trigger at its own address (PIE: different load biases)."""
    path = program("spin")
    spins = [subprocess.Popen([str(path), "30"], stdout=subprocess.PIPE) for _ in range(2)]
    try:
        for s in spins:
            assert s.stdout is not None and s.stdout.readline().startswith(b"ready")
        rec = tmp_path / "rec"
        process = _attach_in_background(
            f"{spins[0].pid},{spins[1].pid}",
            tmp_path / "two.fxt.gz",
            *("--trigger", "tick", "--keep-recording", str(rec)),
        )
        wait_for_line(process, "attached to")
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _out, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        hits = json.loads((rec / "ptscope-recording.json").read_text())["hits"]
        by_pid: dict[int, set[int]] = {}
        for h in hits:
            by_pid.setdefault(h["pid"], set()).add(h["ip"])
        assert set(by_pid) == {s.pid for s in spins}
        for s in spins:
            maps = Path(f"/proc/{s.pid}/maps").read_text().splitlines()
            text = [ln for ln in maps if str(path) in ln and " r-xp " in ln]
            lo, hi = (int(x, 16) for x in text[0].split()[0].split("-"))
            assert all(lo <= ip < hi for ip in by_pid[s.pid])
    finally:
        for s in spins:
            s.kill()
            s.wait()


def test_trigger_picker_needs_a_terminal(program: Build, tmp_path: Path) -> None:
    done = ptscope(
        "run",
        "--backend",
        "sampling",
        "--trigger",
        "?",
        "-o",
        str(tmp_path / "x.fxt.gz"),
        "--",
        str(program("quick")),
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert "no terminal to pick from" in done.stderr
    no_traceback(done.stderr)


def test_filter_keeps_only_the_regions(program: Build, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    done = ptscope(
        "run",
        "--backend",
        "sampling",
        "--keep-recording",
        str(rec),
        "--filter",
        "compute,warm_leaf",
        "-o",
        str(tmp_path / "f.fxt.gz"),
        "--",
        str(program("calls")),
        "200",
    )
    assert done.returncode == 0, done.stderr
    whole = ptscope("decode", str(rec), "-o", str(tmp_path / "all.fxt.gz"))
    assert whole.returncode == 0, whole.stderr
    everything = [s for rows in read_trace(tmp_path / "all.fxt.gz").slices.values() for s in rows]
    starts = sorted(s.start for s in everything if s.name == "compute")
    stops = sorted(s.start for s in everything if s.name == "warm_leaf")
    regions = []
    i = 0
    while i < len(starts):
        after = [t for t in stops if t > starts[i]]
        if not after:
            break
        regions.append((starts[i], after[0]))
        i = next((j for j, t in enumerate(starts) if t >= after[0]), len(starts))
    assert regions
    kept = [s for rows in read_trace(tmp_path / "f.fxt.gz").slices.values() for s in rows]
    assert kept
    assert all(any(b <= s.start and s.end <= e for b, e in regions) for s in kept)
    assert len(kept) < len(everything)


def test_crashing_program_is_still_traced(program: Build, tmp_path: Path) -> None:
    out = tmp_path / "crash.fxt.gz"
    done = ptscope(
        "run", "--backend", "sampling", "-o", str(out), "--", str(program("crash")), "150"
    )
    assert done.returncode == 128 + signal.SIGSEGV, done.stderr
    assert "the program was killed by SIGSEGV" in done.stderr
    no_traceback(done.stderr)
    names = {s.name for rows in read_trace(out).slices.values() for s in rows}
    assert {"main", "doomed"} <= names


def test_attached_process_exiting_ends_the_recording(program: Build, tmp_path: Path) -> None:
    spin = subprocess.Popen([str(program("spin")), "3.0"], stdout=subprocess.PIPE)
    assert spin.stdout is not None and spin.stdout.readline().startswith(b"ready")
    try:
        done = ptscope(
            "attach",
            "-p",
            str(spin.pid),
            "--backend",
            "sampling",
            "-o",
            str(tmp_path / "a.fxt.gz"),
        )
    finally:
        spin.kill()
        spin.wait()
    assert done.returncode == 0, done.stderr
    no_traceback(done.stderr)
    assert any(
        s.name == "spin_leaf"
        for rows in read_trace(tmp_path / "a.fxt.gz").slices.values()
        for s in rows
    )


def test_recording_survives_ptscope_being_killed(
    spin: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    """kill -9 of ptscope: perf is told to finish (SIGINT), the directory decodes later."""
    rec = tmp_path / "rec"
    process = _attach_in_background(
        str(spin.pid), tmp_path / "never.fxt.gz", "--keep-recording", str(rec)
    )
    try:
        wait_for_line(process, "attached to")
        time.sleep(0.3)
        perf = next(
            int(p.name)
            for p in Path("/proc").iterdir()
            if p.name.isdigit() and _ppid(p) == process.pid
        )
        process.kill()
        process.wait()
        deadline = time.monotonic() + 60
        while Path(f"/proc/{perf}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            process.kill()
    assert spin.poll() is None
    meta = json.loads((rec / "ptscope-recording.json").read_text())
    assert meta["backend"] == "sampling" and meta["notes"]["complete"] is False
    done = ptscope("decode", str(rec), "-o", str(tmp_path / "later.fxt.gz"))
    assert done.returncode == 0, done.stderr
    rows = slices_of(read_trace(tmp_path / "later.fxt.gz"), spin.pid)
    assert any(s.name == "spin_leaf" for s in rows)


def test_trigger_names_as_the_trace_shows_them_checked_before_recording(tmp_path: Path) -> None:
    """C++ functions are named demangled, as in the trace (`outer::inner::catcher`), or
    with their parameters to pick one overload; an ambiguous or unknown name is one line
    (listing the overloads) before perf starts, leaving no recording directory behind."""
    exe = str(programs.build("namespaces"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}

    def run(trigger: str, rec: Path) -> subprocess.CompletedProcess[str]:
        return ptscope(
            *("run", "--backend", "sampling", "--trigger", trigger),
            *("--keep-recording", str(rec), "-o", str(tmp_path / "t.fxt.gz")),
            *("--", exe, "3"),
            env=env,
        )

    for trigger in ("outer::inner::catcher", "outer::inner::twice(double)"):
        rec = tmp_path / trigger.replace(":", "_")
        done = run(trigger, rec)
        assert done.returncode == 0, done.stderr
        no_traceback(done.stderr)
        hits = json.loads((rec / "ptscope-recording.json").read_text())["hits"]
        assert [h["symbol"] for h in hits] == [trigger] * 3

    for trigger, expected in (
        ("outer::inner::twice", ["outer::inner::twice(int)", "outer::inner::twice(double)"]),
        ("outer::inner::catchr", ["no function of that name"]),
    ):
        rec = tmp_path / "never"
        done = run(trigger, rec)
        assert done.returncode == 3, done.stderr
        no_traceback(done.stderr)
        [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("ptscope: error:")]
        assert all(text in line for text in expected), line
        assert not rec.exists(), "a trigger that cannot be armed must not leave a recording"
        assert list(scratch.iterdir()) == []


def test_an_address_trigger_in_no_function_fails_before_recording(tmp_path: Path) -> None:
    """`--trigger 0x10` (no code there) would record and never fire: it is refused in one
    line, as an unknown name is, before perf starts and without a recording left behind."""
    exe = str(programs.build("basics"))
    rec = tmp_path / "rec"
    done = ptscope(
        *("run", "--backend", "sampling", "--trigger", "0x10", "--keep-recording", str(rec)),
        *("-o", str(tmp_path / "t.fxt.gz"), "--", exe),
    )
    assert done.returncode == 3, done.stderr
    no_traceback(done.stderr)
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("ptscope: error:")]
    assert f"trigger 0x10: no function of {exe} contains that address" in line
    assert not (tmp_path / "t.fxt.gz").exists()
    assert not rec.exists(), "a trigger that cannot fire must not leave a recording"


def test_print_perf_commands_prints_them_even_where_intel_pt_cannot_record(
    tmp_path: Path,
) -> None:
    """`--print-perf-commands` is for seeing the perf command: with `--backend intel-pt` it
    is printed also where Intel PT cannot record (PID standing for the program's process
    ID), before the one-line error; the default timing has cycle-accurate packets."""
    exe = str(programs.build("basics"))
    rec = tmp_path / "rec"
    done = ptscope(
        *("run", "--backend", "intel-pt", "--print-perf-commands"),
        *("--keep-recording", str(rec), "-o", str(tmp_path / "t.fxt.gz"), "--", exe),
    )
    no_traceback(done.stderr)
    [command] = [ln for ln in done.stderr.splitlines() if "--event=intel_pt/" in ln]
    argv = shlex.split(command)
    assert argv[1] == "record"
    assert argv[argv.index("-o") + 1] == str(rec / "perf.data")
    [event] = [a for a in argv if a.startswith("--event=")]
    assert "cyc=1" in event.split("/")[1].split(",")
    if Path("/sys/bus/event_source/devices/intel_pt").exists():
        assert done.returncode == 0, done.stderr
        return
    assert argv[argv.index("-t") + 1] == "PID"
    assert done.returncode != 0
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("ptscope: error:")]
    assert errors == ["ptscope: error: no Intel PT on this machine"]
    assert done.stderr.index(command) < done.stderr.index(errors[0])
    assert not rec.exists()
