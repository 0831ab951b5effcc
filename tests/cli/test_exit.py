"""How the ``ptscope`` command leaves (``ptscope.cli.run``): once its output is flushed and
the exit handlers have run, at once, without tearing the interpreter down; as Python
usually does while another thread still runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from ptscope.fxt import write_timeline
from ptscope.timeline import Timeline
from support.timeline_strategies import thread_of_rows

_PROGRAM = """
import atexit, sys, threading, time
from pathlib import Path
from ptscope.cli import run

mark = Path(sys.argv[1])
atexit.register(lambda: mark.write_text(mark.read_text() + "atexit;"))
# Teardown frees objects one by one: a __del__ that runs then shows the normal exit.
class Witness:
    def __del__(self) -> None:
        mark.write_text(mark.read_text() + "teardown;")
witness = Witness()
if sys.argv[2] == "thread":
    def late() -> None:
        time.sleep(0.5)
        mark.write_text(mark.read_text() + "thread;")
    threading.Thread(target=late).start()
sys.argv = ["ptscope", *sys.argv[3:]]
run()
"""


def _run(tmp_path: Path, mode: str, *argv: str) -> tuple[subprocess.CompletedProcess[str], str]:
    mark = tmp_path / f"mark-{mode}"
    mark.write_text("")
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, str(mark), mode, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, mark.read_text()


def _trace(tmp_path: Path) -> Path:
    rows = [(0, 100, 0, 0), (10, 40, 1, 1), (50, 90, 1, 1)]
    timeline = Timeline(names=["main", "work"], threads=[thread_of_rows(1, 1, rows)])
    timeline.threads[0].instructions = np.array([100, 30, 40], dtype=np.int64)
    path = tmp_path / "t.fxt.gz"
    write_timeline(timeline, path)
    return path


def test_it_leaves_at_once_with_its_output_and_exit_handlers(tmp_path: Path) -> None:
    done, mark = _run(tmp_path, "alone", "dump", str(_trace(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].endswith("work")  # every line, flushed
    assert mark == "atexit;"  # the handlers ran; the interpreter was not torn down


def test_an_error_keeps_its_exit_code(tmp_path: Path) -> None:
    done, mark = _run(tmp_path, "alone", "dump", str(tmp_path / "missing.fxt.gz"))
    assert done.returncode != 0
    assert done.stderr.startswith("ptscope: error:")
    assert mark == "atexit;"


def test_with_another_thread_alive_it_exits_as_python_does(tmp_path: Path) -> None:
    done, mark = _run(tmp_path, "thread", "dump", str(_trace(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert mark.startswith("thread;")  # waited for
    assert "atexit;" in mark


def test_a_command_restores_the_allocator_unless_the_process_leaves(tmp_path: Path) -> None:
    """In a process that runs more commands (a test session, a library user) a command's
    allocator settings are undone after it; the ``ptscope`` command, which ends with its
    command, skips that work (``main(leaving=True)``)."""
    from ptscope.cli import base, main

    trace = _trace(tmp_path)
    assert main(["stats", str(trace)]) == 0
    assert not base._malloc_tuned
    with base.malloc_restored():  # (undone here, for the rest of this session)
        assert main(["stats", str(trace)], leaving=True) == 0
        assert base._malloc_tuned
    assert not base._malloc_tuned


def test_each_command_is_in_the_module_of_its_name() -> None:
    """The CLI imports only the command a command line names, by the table's module name:
    each command's name is that name, and the parser a command line builds parses it as
    the parser of every command does."""
    from ptscope import cli

    every = cli._commands()
    assert [c.name for c in every] == [name for name, _ in cli._COMMANDS]
    for name, _ in cli._COMMANDS:
        assert [c.name for c in cli._commands(name)] == [name]
    argv = ["-v", "decode", "x.perf.data", "-o", "y.fxt.gz", "--jobs", "2"]
    assert cli._command_named(argv) == "decode"
    assert cli._command_named(["--help"]) is None
    alone = vars(cli._build_parser(cli._commands("decode")).parse_args(argv))
    whole = vars(cli._build_parser(every).parse_args(argv))
    assert alone.pop("_command").name == whole.pop("_command").name == "decode"
    assert alone == whole
