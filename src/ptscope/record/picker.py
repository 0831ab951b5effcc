"""Interactive fuzzy pickers (iterfzf) for a process to attach to and a trigger function.

The candidate lists are plain functions (tested); only :func:`_fzf` talks to the terminal.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from ptscope.errors import UsageError
from ptscope.record.symbols import ElfImage, Selection, parse_selection

__all__ = [
    "function_choices",
    "line_choices",
    "pick_function",
    "pick_processes",
    "process_choices",
]


def _has_command_line(pid: int) -> bool:
    # Kernel threads (and zombies) have an empty command line: nothing to attach to.
    try:
        return bool(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def process_choices(*, exclude: Iterable[int] = ()) -> list[tuple[int, str]]:
    """(pid, command line) of every user process but ptscope itself, by PID."""
    from ptscope.record.launch import process_command_line

    skip = {os.getpid(), os.getppid(), *exclude}
    out: list[tuple[int, str]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid in skip or not _has_command_line(pid):
            continue
        command = process_command_line(pid)
        if command:
            out.append((pid, command))
    return sorted(out)


def function_choices(executable: str) -> list[str]:
    """Every function, C++ ones demangled with their parameters (one line per overload)."""
    return sorted(ElfImage(Path(executable)).display_names())


def line_choices(executable: str) -> list[str]:
    """Every ``FILE:LINE`` of the executable's line table (needs -g)."""
    from elftools.elf.elffile import ELFFile

    from ptscope.record.symbols import _line_program_files

    seen: set[str] = set()
    with open(executable, "rb") as f:
        elf = ELFFile(f)
        if not elf.has_dwarf_info():
            return []
        dwarf = elf.get_dwarf_info()
        for cu in dwarf.iter_CUs():
            program = dwarf.line_program_for_CU(cu)
            if program is None:
                continue
            names = _line_program_files(program)
            for entry in program.get_entries():
                state = entry.state
                if state is not None and state.is_stmt and not state.end_sequence:
                    name = names.get(state.file, "")
                    if name:
                        seen.add(f"{name}:{state.line}")
    return sorted(seen)


def _require_terminal(what: str) -> None:
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        raise UsageError(f"{what}: no terminal to pick from", hint="give it on the command line")


def _fzf(choices: list[str], prompt: str, *, multi: bool) -> list[str]:
    from iterfzf import iterfzf

    picked = iterfzf(choices, prompt=prompt, multi=multi)
    if not picked:
        raise UsageError("nothing picked")
    return list(picked) if multi else [str(picked)]


def pick_processes() -> list[int]:
    """Ask for one or more processes (Tab selects several)."""
    _require_terminal("no -p PID given")
    rows = [f"{pid:>7}  {command}" for pid, command in process_choices()]
    return [int(row.split()[0]) for row in _fzf(rows, "attach to> ", multi=True)]


def pick_function(executable: str, selection: Selection) -> Selection:
    """Turn a ``?`` selection into a concrete one by asking."""
    _require_terminal("--trigger ?")
    if selection.pick == "line":
        choices = line_choices(executable)
    elif selection.pick == "symbol":
        choices = function_choices(executable)
    else:
        choices = function_choices(executable) + line_choices(executable)
    if not choices:
        raise UsageError(f"{executable} has nothing to pick from (no symbols or line table)")
    return parse_selection(_fzf(choices, "trigger on> ", multi=False)[0])
