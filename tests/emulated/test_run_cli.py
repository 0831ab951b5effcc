"""`ptscope run --backend emulated` as a user runs it: the real CLI in a subprocess, QEMU,
perf and programs compiled by the suite (issue 14: what a new user hits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from support import programs
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
    assert command.endswith(f"{exe} 5") and " -d exec,nochain" in command


def test_attach_help_offers_only_the_backends_attach_has() -> None:
    done = ptscope("attach", "--help")
    assert done.returncode == 0
    assert "emulated" not in done.stdout and "QEMU" not in done.stdout
    assert "sampling" in done.stdout and "intel-pt" in done.stdout
    assert "emulated" in ptscope("run", "--help").stdout
