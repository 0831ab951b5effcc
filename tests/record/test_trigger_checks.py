"""Triggers that cannot fire are said (issue 44): an address inside an instruction is
refused before anything runs, a function that never ran gives a "trigger never hit" line
at the end. The sampling backend records (triggers are the same on Intel PT); objdump is
the oracle for where instructions start."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ptscope.record.symbols import ElfImage
from support.cli import one_line_error, ptscope
from support.programs import build

pytestmark = pytest.mark.slow


def instruction_starts(program: Path, function: str) -> list[int]:
    """The addresses of ``function``'s instructions, as objdump -d shows them."""
    if shutil.which("objdump") is None:
        pytest.skip("objdump is not installed (binutils)")
    text = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", f"--disassemble={function}", str(program)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    starts = [int(m, 16) for m in re.findall(r"^\s+([0-9a-f]+):\s", text, re.MULTILINE)]
    assert len(starts) > 2, text
    return starts


def test_an_address_inside_an_instruction_is_refused(tmp_path: Path) -> None:
    program = build("exit_status")
    starts = instruction_starts(program, "main")
    # The first instruction of more than one byte, and an address inside it.
    start = next(a for a, b in itertools.pairwise(starts) if b - a > 1)
    out = tmp_path / "t.fxt.gz"
    run = ["run", "--backend", "sampling", "-o", str(out)]
    done = ptscope(*run, "--trigger", f"{start + 1:#x}", "--", str(program), "0", "0")
    line = one_line_error(done, code=3)
    assert f"trigger {start + 1:#x}: not the start of an instruction" in line, line
    assert f"inside the one at {start:#x} (main+{start - starts[0]:#x})" in line, line
    assert done.stdout == "" and not out.exists()  # refused before the program ran
    # The instruction's own start is taken, and hit.
    done = ptscope(*run, "--trigger", f"{start:#x}", "--", str(program), "0", "0")
    assert done.returncode == 0, done.stderr
    assert "ptscope: trigger hit 1 time(s)" in done.stderr and "never hit" not in done.stderr
    # So is every other instruction start of the function (the walk the check makes).
    from ptscope.cli.run import _instruction_length

    image = ElfImage(program)
    assert [image.instruction_containing(a, _instruction_length) for a in starts] == [None] * len(
        starts
    )


def test_a_trigger_that_never_runs_says_so_at_the_end(tmp_path: Path) -> None:
    out = tmp_path / "t.fxt.gz"
    done = ptscope(
        "run", "--backend", "sampling", "--trigger", "never_called", "-o", str(out),
        "--", str(build("exit_status")), "0", "300",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert (
        lines[-1] == "ptscope: warning: trigger never hit: never_called did not run while recorded"
    )
    assert out.exists() and "trigger hit" not in done.stderr
