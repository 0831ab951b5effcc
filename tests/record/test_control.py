"""The --control fifo protocol against the real perf (a software event, a real program):
ping, enable, disable, snapshot-free stop, acks, timeouts, and perf dying mid-way."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ptscope.perftool import find_perf, perf_env
from ptscope.record.control import (
    ControlTimeoutError,
    FifoControl,
    PerfExitedError,
    SignalControl,
    make_control,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def spin(program: Callable[..., Path]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen([str(program("spin")), "30"], stdout=subprocess.PIPE)
    assert process.stdout is not None
    assert process.stdout.readline().startswith(b"ready")
    yield process
    process.kill()
    process.wait()


def start_perf(
    control: FifoControl, target: int, out: Path, *, delay: bool = True
) -> subprocess.Popen[bytes]:
    perf = find_perf()
    argv = [perf.path, "record", "-e", "cpu-clock", "-o", str(out / "perf.data")]
    argv += ["-D", "-1"] if delay else []
    argv += ["-p", str(target), *control.argv()]
    log = open(out / "perf.log", "wb")  # noqa: SIM115 - perf keeps it until it exits
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=perf_env(), process_group=0
    )
    log.close()
    control.bind(process)
    return process


def test_ping_enable_disable_stop_with_acks(
    spin: subprocess.Popen[bytes], tmp_path: Path, perf_path: str
) -> None:
    control = FifoControl(tmp_path)
    perf = start_perf(control, spin.pid, tmp_path)
    try:
        control.wait_ready(timeout=30)
        control.enable()
        time.sleep(0.2)  # let the workload be sampled while enabled
        control.disable()
        control.ping()
        control.stop()
        assert perf.wait(timeout=60) == 0
    finally:
        control.close()
        if perf.poll() is None:
            perf.kill()
    log = (tmp_path / "perf.log").read_text()
    # perf reports each state change it made on our command, in order.
    assert log.index("Events disabled") < log.index("Events enabled")
    assert log.count("Events disabled") >= 2
    samples = subprocess.run(
        [perf_path, "script", "-i", str(tmp_path / "perf.data"), "-F", "pid"],
        capture_output=True,
        text=True,
        env=perf_env(),
        timeout=60,
    ).stdout.split()
    assert samples and set(samples) == {str(spin.pid)}
    assert not (tmp_path / "perf-control.fifo").exists()  # close() cleans the fifos up


def test_ready_only_once_perf_answers(spin: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """wait_ready returns when perf's main loop answers, never before perf runs."""
    control = FifoControl(tmp_path)
    started = time.monotonic()
    perf = start_perf(control, spin.pid, tmp_path, delay=False)
    try:
        control.wait_ready(timeout=30)
        ready = time.monotonic() - started
        assert perf.poll() is None
        # perf has opened its events on the target by then.
        fds = [os.readlink(p) for p in Path(f"/proc/{perf.pid}/fd").iterdir()]
        assert "anon_inode:[perf_event]" in fds
        assert ready < 30
        control.stop()
        assert perf.wait(timeout=60) == 0
    finally:
        control.close()
        if perf.poll() is None:
            perf.kill()


def test_perf_killed_mid_way(spin: subprocess.Popen[bytes], tmp_path: Path) -> None:
    control = FifoControl(tmp_path)
    perf = start_perf(control, spin.pid, tmp_path)
    try:
        control.wait_ready(timeout=30)
        perf.kill()
        perf.wait()
        with pytest.raises(PerfExitedError):
            control.ping(timeout=5)
        control.stop()  # stopping a perf that is gone is not an error
    finally:
        control.close()


def test_perf_dying_at_start_is_reported_not_waited_for(tmp_path: Path) -> None:
    """perf exits at once (no such process): waiting for its ack fails fast."""
    control = FifoControl(tmp_path)
    dead_pid = 2**22 - 3  # above pid_max's default range
    perf = start_perf(control, dead_pid, tmp_path)
    try:
        started = time.monotonic()
        with pytest.raises(PerfExitedError):
            control.wait_ready(timeout=30)
        assert time.monotonic() - started < 20
    finally:
        control.close()
        if perf.poll() is None:
            perf.kill()


def test_ack_timeout_when_nobody_answers(tmp_path: Path) -> None:
    """A process that never reads the control fifo: the command times out, clearly."""
    control = FifoControl(tmp_path)
    silent = subprocess.Popen(["sleep", "30"])
    control.bind(silent)  # type: ignore[arg-type]
    try:
        started = time.monotonic()
        with pytest.raises(ControlTimeoutError, match="did not acknowledge 'ping'"):
            control.wait_ready(timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 5
    finally:
        silent.kill()
        silent.wait()
        control.close()


def test_multi_snapshot_signal_then_ping(spin: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """--switch-output=signal: a SIGUSR2 then a ping ack means perf switched files."""
    control = FifoControl(tmp_path)
    perf_tool = find_perf()
    log = open(tmp_path / "perf.log", "wb")  # noqa: SIM115
    perf = subprocess.Popen(
        [
            perf_tool.path,
            "record",
            "-e",
            "cpu-clock",
            "-o",
            str(tmp_path / "perf.data"),
            "--switch-output=signal",
            "-p",
            str(spin.pid),
            *control.argv(),
        ],
        stdout=log,
        stderr=log,
        env=perf_env(),
        process_group=0,
    )
    log.close()
    control.bind(perf)
    try:
        control.wait_ready(timeout=30)
        control.snapshot(switch_output=True)
        # The ack of the ping that follows the signal means the switch already happened.
        assert any(p.name.startswith("perf.data.") for p in tmp_path.iterdir())
        control.stop()
        perf.wait(timeout=60)
    finally:
        control.close()
        if perf.poll() is None:
            perf.kill()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("perf.data.")]) == 2


def test_signal_control_for_old_perf(spin: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """The pre-5.10 path (no --control): readiness from perf's event fds, SIGINT stops."""
    control = SignalControl()
    perf_tool = find_perf()
    argv = [perf_tool.path, "record", "-e", "cpu-clock", "-o", str(tmp_path / "perf.data")]
    perf = subprocess.Popen(
        [*argv, "-p", str(spin.pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=perf_env(),
        process_group=0,
    )
    control.bind(perf)
    try:
        control.wait_ready(timeout=30)
        control.stop()
        status = control.wait_exit(60)
        assert status in (0, -signal.SIGINT)
    finally:
        if perf.poll() is None:
            perf.kill()


def test_make_control_picks_fifo_for_this_perf(tmp_path: Path) -> None:
    control = make_control(find_perf(), tmp_path)
    try:
        assert isinstance(control, FifoControl)
        assert control.has_ping and control.has_stop  # perf >= 5.12 here
    finally:
        control.close()
