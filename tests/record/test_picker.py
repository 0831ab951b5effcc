"""What the fuzzy pickers offer (the interactive part is iterfzf's)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from ptscope.record.picker import function_choices, line_choices, process_choices


def test_processes_offered_with_command_lines(program: Callable[..., Path]) -> None:
    spin = subprocess.Popen([str(program("spin")), "10"], stdout=subprocess.PIPE)
    try:
        assert spin.stdout is not None
        spin.stdout.readline()
        choices = dict(process_choices())
        assert str(program("spin")) in choices[spin.pid]
        assert os.getpid() not in choices  # not ptscope itself
        assert 2 not in choices  # kthreadd and kernel threads have no command line
    finally:
        spin.kill()
        spin.wait()


def test_functions_and_lines_offered_from_the_executable(program: Callable[..., Path]) -> None:
    path = program("threads")
    nm = subprocess.run(["nm", str(path)], capture_output=True, text=True).stdout
    defined = {
        ln.split()[2] for ln in nm.splitlines() if len(ln.split()) == 3 and ln.split()[1] in "tT"
    }
    functions = function_choices(str(path))
    assert "trigger_target" in functions and "main" in functions
    assert {"trigger_target", "main", "second"} <= defined & set(functions)
    source = (Path(__file__).parent / "programs" / "threads.c").read_text().splitlines()
    line = next(i for i, t in enumerate(source, 1) if "counter += x" in t)
    assert any(c.endswith(f"threads.c:{line}") for c in line_choices(str(path)))
