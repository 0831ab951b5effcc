"""`ptscope run --backend emulated` as a user runs it: the real CLI in a subprocess, QEMU,
perf and programs compiled by the suite (issue 14: what a new user hits)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from ptscope.recording import Recording
from support import programs
from support.decoder_parity import perf_decodes_the_same
from support.emulated_corpus import needs_tools

pytestmark = pytest.mark.slow

PTSCOPE = [sys.executable, "-m", "ptscope"]


def ptscope(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PTSCOPE, *args], capture_output=True, text=True, timeout=300, cwd=cwd, check=False
    )


def one_line_error(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ptscope: error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def test_our_options_after_the_program_need_a_double_dash(tmp_path: Path) -> None:
    """`ptscope run ./prog 3 -o x.fxt.gz` would give `-o x.fxt.gz` to the program and write
    trace.fxt.gz: refused, saying what to write instead; with `--` they are the program's."""
    needs_tools()
    exe = str(programs.build("basics", static=True))
    for misplaced in (["-o", "x.fxt.gz"], ["--output=x.fxt.gz"], ["--keep-recording", "r"]):
        done = ptscope("run", "--backend", "emulated", exe, "3", *misplaced, cwd=tmp_path)
        line = one_line_error(done, 2)
        assert misplaced[0].partition("=")[0] in line and "--" in done.stderr
        assert list(tmp_path.iterdir()) == [], "nothing may be recorded or written"
    # With `--`, everything after it is the program's (basics ignores what it does not use).
    emulated = ("run", "--backend", "emulated")
    done = ptscope(*emulated, "-o", "y.fxt.gz", "--", exe, "3", "-o", "x.fxt.gz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert read_trace(tmp_path / "y.fxt.gz").slices
    assert not (tmp_path / "x.fxt.gz").exists() and not (tmp_path / "trace.fxt.gz").exists()
    # Options before the program and no `--`: as before.
    done = ptscope(*emulated, "-o", "z.fxt.gz", exe, "3", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "z.fxt.gz").exists()


@pytest.mark.parametrize(
    "option",
    [
        ["--multi-thread"],
        ["--timer-resolution", "normal"],
        ["--timer-resolution", "cyc=1"],
        ["--full-execution"],
        ["--snapshot-size", "4M"],
        ["--trigger", "main"],
        ["--multi-snapshot"],
        ["--kernel"],
        ["--no-kcore"],
        ["--callgraph", "fp"],
        ["--frequency", "99"],
    ],
    ids=lambda option: option[0].lstrip("-"),
)
def test_options_that_mean_nothing_under_emulation_are_refused(
    option: list[str], tmp_path: Path
) -> None:
    """Each is one line naming the option and why, before anything is recorded."""
    exe = str(programs.build("basics", static=True))
    done = ptscope("run", "--backend", "emulated", *option, "--", exe, cwd=tmp_path)
    line = one_line_error(done, 2)
    assert f"{option[0]}: " in line and "emulated backend" in line, line
    assert list(tmp_path.iterdir()) == []


def test_print_perf_commands_shows_the_emulator_command(tmp_path: Path) -> None:
    needs_tools()
    exe = str(programs.build("basics", static=True))
    done = ptscope(
        "run", "--backend", "emulated", "--print-perf-commands", "--", exe, "5", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    [command] = [line for line in done.stderr.splitlines() if "qemu-x86_64" in line]
    assert command.endswith(f"{exe} 5") and " -plugin file=" in command
    assert "recorder.so,dir=" in command and " -d " not in command  # no log: the plugin records


def test_attach_help_offers_only_the_backends_attach_has() -> None:
    done = ptscope("attach", "--help")
    assert done.returncode == 0
    assert "emulated" not in done.stdout and "QEMU" not in done.stdout
    assert "sampling" in done.stdout and "intel-pt" in done.stdout
    assert "emulated" in ptscope("run", "--help").stdout


def _read_until(fd: int, wanted: bytes, deadline: float) -> bytes:
    """What ``fd`` gives until ``wanted`` shows up (or it ends, or the deadline passes)."""
    seen = b""
    while wanted not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the pty's other side is gone
            break
        if not chunk:
            break
        seen += chunk
    return seen


def _interruptible() -> None:
    """SIGINT as a terminal's program gets it: a suite started in the background by a
    shell without job control runs with SIGINT ignored, which ptscope and the program would
    inherit (and Ctrl-C would then stop nothing, as it would stop nothing natively)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupted_run(args: list[str], how: str, cwd: Path) -> tuple[int, str]:
    """``ptscope ARGS`` interrupted the way a user does: Ctrl-C typed in its terminal (a
    pty: the terminal signals ptscope and the program, its foreground group), or SIGINT
    sent to its process group by a shell or a supervisor. Returns (exit status, output)."""
    command = [*PTSCOPE, *args]
    deadline = time.monotonic() + 120
    if how == "terminal":
        pid, fd = pty.fork()
        if pid == 0:  # the child: ptscope, with the pty as its controlling terminal
            os.chdir(cwd)
            _interruptible()
            os.execv(command[0], command)
        output = _read_until(fd, b"spinning", deadline)
        time.sleep(0.5)
        os.write(fd, b"\x03")  # Ctrl-C
        output += _read_until(fd, b"\x00never", deadline)
        os.close(fd)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), output.decode(errors="replace")
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        start_new_session=True,
        preexec_fn=_interruptible,
    )
    assert process.stdout is not None
    try:
        output = _read_until(process.stdout.fileno(), b"spinning", deadline)
        time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)
        output += process.stdout.read()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    return process.returncode, output.decode(errors="replace")


@pytest.mark.parametrize("how", ["terminal", "group"])
def test_ctrl_c_keeps_and_decodes_what_was_recorded(how: str, tmp_path: Path) -> None:
    """Ctrl-C stops the program; everything recorded so far is a valid perf.data, decoded
    into the trace, and ptscope says so (issue 14: the recording used to be deleted)."""
    needs_tools()
    exe = str(programs.build("spin"))
    rec, out = tmp_path / "rec", tmp_path / "t.fxt.gz"
    options = ["--backend", "emulated", "--keep-recording", str(rec), "-o", str(out)]
    code, output = _interrupted_run(
        ["run", *options, "--", exe, "spinning", "paced"], how, tmp_path
    )
    assert code == 0, output
    assert "Traceback" not in output and "interrupted" not in output, output
    assert "stopped; decoding what was recorded" in output, output
    assert "recording kept at" in output and "wrote" in output, output
    recording = Recording.load(rec)
    assert recording.notes["signal"] == "SIGINT"
    names = {s.name for rows in read_trace(out).slices.values() for s in rows}
    assert {"main", "step"} <= names
    # The kept recording decodes again, as ptscope said.
    again = ptscope("decode", str(rec), "-o", str(tmp_path / "again.fxt.gz"))
    assert again.returncode == 0, again.stderr


def test_jit_code_is_traced_named_and_never_costs_the_rest(tmp_path: Path) -> None:
    """A program that writes machine code at run time and names it in /tmp/perf-PID.map:
    the map is kept in the recording (a later decode still names the code, /tmp gone), the
    code itself is decoded by perf, and even when perf cannot decode it (its bytes gone)
    everything the program did afterwards is still in the trace."""
    needs_tools()
    exe = str(programs.build("jit"))
    rec = tmp_path / "rec"
    done = ptscope(
        *("run", "--backend", "emulated", "--keep-recording", str(rec)),
        *("-o", str(tmp_path / "t.fxt.gz"), "--", exe, "40"),
    )
    recording = Recording.load(rec)
    [pid] = recording.processes
    Path(f"/tmp/perf-{pid}.map").unlink()  # written by the program; gone, as /tmp goes
    assert done.returncode == 0, done.stderr
    assert "decode error" not in done.stderr, done.stderr
    assert (rec / f"perf-{pid}.map").is_file()

    def calls(trace: Path) -> dict[str, list[int]]:
        depths: dict[str, list[int]] = {}
        for rows in read_trace(trace).slices.values():
            for s in rows:
                depths.setdefault(s.name, []).append(s.depth)
        return depths

    again = ptscope("decode", str(rec), "-o", str(tmp_path / "again.fxt.gz"))
    assert again.returncode == 0, again.stderr
    perf_decodes_the_same(rec, tmp_path / "again.fxt.gz")  # (the own decoder wrote it)
    names = calls(tmp_path / "again.fxt.gz")
    [main_depth] = names["main"]
    assert names["jitted_sum"] == [main_depth + 1] * 40
    assert names["after_jit"] == [main_depth + 1] * 40
    # perf cannot decode the JIT code without its bytes: the rest is still there.
    (rec / "jitted-code.bin").unlink()
    blind = ptscope("decode", str(rec), "-o", str(tmp_path / "blind.fxt.gz"))
    assert blind.returncode == 0, blind.stderr
    assert "decode error" in blind.stderr
    perf_decodes_the_same(rec, tmp_path / "blind.fxt.gz")
    names = calls(tmp_path / "blind.fxt.gz")
    assert names["after_jit"] == [main_depth + 1] * 40
    assert "exit" in names
