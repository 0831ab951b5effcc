"""The run/attach session with the real perf: nothing missed at start, triggers taking
snapshots (single and multi), the shell gate, and held programs.

Intel PT is not available here, so the snapshot logic is driven through a perf-based test
backend that behaves like the PT one towards the session (it "takes snapshots": perf acks
the control command, and with --switch-output=signal each snapshot starts a new file).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ptscope.errors import BadInputError, UsageError
from ptscope.perftool import PerfTool, find_perf, perf_env
from ptscope.record.breakpoints import BreakpointSet
from ptscope.record.launch import StoppedProgram
from ptscope.record.perf_commands import Control, Targets
from ptscope.record.session import (
    HitSource,
    SessionOptions,
    attach_processes,
    run_program,
)
from ptscope.record.symbols import parse_selection, read_maps, resolve_selection

pytestmark = pytest.mark.slow

Build = Callable[..., Path]


@dataclass(frozen=True)
class PerfEventBackend:
    """A perf-based backend recording any software/breakpoint event (test stand-in)."""

    event: str = "cpu-clock"
    takes_snapshots: bool = True
    switch_output: bool = False
    name: str = "test"

    def record_argv(
        self, perf: PerfTool, output: Path, targets: Targets, control: Control | None
    ) -> list[str]:
        argv = [perf.path, "record", "-o", str(output), "-e", self.event, "-c", "1"]
        if self.switch_output:
            argv.append("--switch-output=signal")
        return argv + targets.argv() + (control.argv() if control else [])

    def describe(self) -> dict[str, object]:
        return {"scope": "user", "event": self.event}

    def needs_snapshot_before_stop(self, perf: PerfTool) -> bool:
        return False


def nm_address(path: Path, name: str) -> int:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    return next(int(ln.split()[0], 16) for ln in out.splitlines() if ln.endswith(f" {name}"))


def script_ips(perf_data: Path) -> list[int]:
    out = subprocess.run(
        [find_perf().path, "script", "-i", str(perf_data), "-F", "ip"],
        capture_output=True,
        text=True,
        env=perf_env(),
        timeout=60,
    ).stdout
    return [int(x, 16) for x in out.split()]


def trigger_factory(path: Path, symbol: str) -> Callable[..., HitSource | None]:
    def make(pids: list[int]) -> HitSource:
        bps = resolve_selection(parse_selection(symbol), str(path), read_maps(pids[0]))
        source = BreakpointSet(bps)
        source.arm(pids)
        return source

    return make


@pytest.mark.parametrize("use_ptrace", [True, False], ids=["ptrace", "shell-gate"])
def test_run_misses_nothing_at_start(program: Build, tmp_path: Path, use_ptrace: bool) -> None:
    """perf's own breakpoint on main fires: perf was recording before main ran."""
    path = program("threads", pie=False)
    main = nm_address(path, "main")
    backend = PerfEventBackend(event=f"mem:{main:#x}:x", takes_snapshots=False)
    options = SessionOptions(directory=tmp_path)
    result = run_program([str(path), "0"], find_perf(), backend, options, use_ptrace=use_ptrace)
    assert result.reason == "exited" and result.exit_code == 0
    assert result.recording.notes["held_by"] == ("ptrace" if use_ptrace else "gate")
    assert script_ips(tmp_path / "perf.data") == [main]
    assert result.startup_seconds > 0


def test_attach_single_trigger_snapshots_once_and_detaches(program: Build, tmp_path: Path) -> None:
    path = program("spin")
    spin = subprocess.Popen([str(path), "30"], stdout=subprocess.PIPE)
    assert spin.stdout is not None
    spin.stdout.readline()
    try:
        options = SessionOptions(directory=tmp_path, make_hit_source=trigger_factory(path, "tick"))
        started = time.monotonic()
        result = attach_processes([spin.pid], find_perf(), PerfEventBackend(), options)
        assert time.monotonic() - started < 30
        assert result.reason == "trigger"
        assert result.snapshots == 1
        assert result.perf_status == 0
        assert len(result.hits) >= 1 and result.hits[0].label == "tick"
        assert [h.symbol for h in result.recording.hits][:1] == ["tick"]
        assert spin.poll() is None  # the process keeps running after ptscope detached
    finally:
        spin.kill()
        spin.wait()


def test_run_multi_snapshot_one_file_per_hit(program: Build, tmp_path: Path) -> None:
    path = program("threads")
    backend = PerfEventBackend(switch_output=True)
    options = SessionOptions(
        directory=tmp_path,
        multi_snapshot=True,
        make_hit_source=trigger_factory(path, "trigger_target"),
    )
    result = run_program([str(path), "20", "300"], find_perf(), backend, options)
    assert result.exit_code == 0
    assert len(result.hits) == 2 and result.snapshots == 2
    files = result.recording.perf_data
    # Two switches at the hits, then the last file when perf stops.
    assert len(files) == 3 and all(f.startswith("perf.data.") for f in files)
    assert files == sorted(files)
    assert {h.tid for h in result.hits} == {result.hits[0].pid, result.hits[1].tid}


def test_run_multi_snapshot_keeps_the_hits_made_just_before_the_exit(
    program: Build, tmp_path: Path
) -> None:
    """The second call comes right after the first and the program exits at once, while
    ptscope waits for perf to take the first snapshot (issue 46, item 7: under contention
    the second hit was left unread in the breakpoints' ring, and a snapshot perf took but
    could not acknowledge before it exited was not counted). Every hit is in the result,
    and the snapshot count is what perf wrote: one file per snapshot, then the last; a
    warning names each hit whose snapshot perf did not take."""
    path = program("threads")
    for attempt in range(3):  # the race went wrong in most runs: three make it near sure
        directory = tmp_path / str(attempt)
        directory.mkdir()
        options = SessionOptions(
            directory=directory,
            multi_snapshot=True,
            make_hit_source=trigger_factory(path, "trigger_target"),
        )
        backend = PerfEventBackend(switch_output=True)
        result = run_program([str(path), "20", "0"], find_perf(), backend, options)
        assert result.exit_code == 0
        assert len(result.hits) == 2, (attempt, result.hits, result.warnings)
        files = result.recording.perf_data
        assert result.snapshots == len(files) - 1 >= 1, (attempt, files, result.warnings)
        assert result.recording.notes["snapshots"] == result.snapshots
        # A hit without its snapshot (perf exited first) is named; none other is.
        assert len(result.warnings) == len(result.hits) - result.snapshots, result.warnings


def test_run_single_trigger_stops_perf_but_lets_the_program_finish(
    program: Build, tmp_path: Path
) -> None:
    path = program("threads")
    options = SessionOptions(
        directory=tmp_path, make_hit_source=trigger_factory(path, "trigger_target")
    )
    # It lingers 500 ms after its calls: the snapshot of the first hit is asked for while
    # it runs (with no linger, a loaded machine let it end first: no snapshot, a warning).
    result = run_program([str(path), "20", "500"], find_perf(), PerfEventBackend(), options)
    assert result.exit_code == 0  # it ran to its end: both calls happened
    assert result.snapshots == 1
    assert len(result.hits) >= 1


def test_stopped_program_errors_and_kill(program: Build, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no such file"):
        StoppedProgram.spawn([str(tmp_path / "missing")])
    (tmp_path / "notexec").write_text("x")
    with pytest.raises(BadInputError, match="not an executable"):
        StoppedProgram.spawn([str(tmp_path / "notexec")])
    with pytest.raises(UsageError):
        StoppedProgram.spawn([])
    held = StoppedProgram.spawn([str(program("quick"))])
    held.kill()  # never released: it never ran
    assert held.process.returncode is not None
    gate = StoppedProgram.spawn([str(program("quick"))], use_ptrace=False)
    gate.release()
    assert gate.process.wait(timeout=30) == 3  # the gate execs the program in place
    assert gate.method == "gate"


def test_attach_refuses_missing_and_duplicate_pids(tmp_path: Path) -> None:
    options = SessionOptions(directory=tmp_path)
    with pytest.raises(BadInputError, match="no process with PID"):
        attach_processes([4194000], find_perf(), PerfEventBackend(), options)
    with pytest.raises(UsageError):
        attach_processes([1, 1], find_perf(), PerfEventBackend(), options)
