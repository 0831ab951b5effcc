"""Resolving a trigger selection (``SYMBOL``, ``0xADDR``, ``FILE:LINE``) to run-time addresses.

Symbols and line tables come from the ELF files themselves (pyelftools): ``.symtab`` then
``.dynsym`` for functions, ``.debug_line`` for ``FILE:LINE``. Where a file is loaded comes
from ``/proc/PID/maps``: a position-independent executable or a shared library is mapped
at a bias from its link-time addresses, computed from its first mapping and its first
``PT_LOAD`` segment. A plain symbol is looked up in the executable first, then in every
shared library the process has mapped. Prefixes force one kind: ``symbol:NAME``,
``addr:0x…`` (an address in the executable, link-time for PIE), ``line:FILE:LINE[:COL]``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ptscope.errors import BadInputError, UsageError
from ptscope.record.breakpoints import Breakpoint

__all__ = [
    "ElfImage",
    "Mapping",
    "Selection",
    "load_bias",
    "parse_selection",
    "read_maps",
    "resolve_selection",
]

SelectionKind = Literal["symbol", "address", "line", "pick"]
_LINE_RE: Final = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<col>\d+))?$")
_FUNC_TYPES: Final = ("STT_FUNC", "STT_GNU_IFUNC")


@dataclass(frozen=True)
class Selection:
    """What the user asked to trigger on."""

    kind: SelectionKind
    text: str
    file: str = ""
    line: int = 0
    column: int | None = None
    address: int = 0
    pick: str = "all"

    def __str__(self) -> str:
        return self.text


def parse_selection(text: str) -> Selection:
    """``?``/``symbol:?``/``line:?`` (pickers), ``symbol:NAME``, ``addr:0x…``/``0x…``,
    ``line:FILE:LINE[:COL]`` / ``FILE:LINE[:COL]``, or a symbol name."""
    text = text.strip()
    if not text:
        raise UsageError("empty trigger selection")
    if text in ("?", "symbol:?", "line:?"):
        return Selection("pick", text, pick={"?": "all", "symbol:?": "symbol"}.get(text, "line"))
    prefix, colon, rest = text.partition(":")
    if colon and prefix == "symbol":
        return Selection("symbol", rest)
    if colon and prefix == "addr":
        return _address(rest, text)
    if colon and prefix == "line":
        return _line(rest, text)
    if text.lower().startswith("0x"):
        return _address(text, text)
    m = _LINE_RE.match(text)
    if m and not text.startswith(":"):
        return _line(text, text)
    return Selection("symbol", text)


def _address(value: str, text: str) -> Selection:
    try:
        address = int(value, 16)
    except ValueError:
        raise UsageError(f"trigger {text!r}: not a hexadecimal address") from None
    return Selection("address", text, address=address)


def _line(value: str, text: str) -> Selection:
    m = _LINE_RE.match(value)
    if not m:
        raise UsageError(f"trigger {text!r}: expected FILE:LINE[:COLUMN]")
    col = m.group("col")
    return Selection(
        "line",
        text,
        file=m.group("file"),
        line=int(m.group("line")),
        column=int(col) if col else None,
    )


@dataclass(frozen=True)
class Mapping:
    """One line of ``/proc/PID/maps``."""

    start: int
    end: int
    perms: str
    offset: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError as e:
        raise BadInputError(f"cannot read the memory map of process {pid}: {e.strerror}") from e
    maps: list[Mapping] = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        start, _, end = parts[0].partition("-")
        path = parts[5].strip() if len(parts) > 5 else ""
        maps.append(Mapping(int(start, 16), int(end, 16), parts[1], int(parts[2], 16), path))
    return maps


class ElfImage:
    """The parts of one ELF file that trigger resolution needs (read once, cached)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                elf = ELFFile(f)
                self.type = str(elf.header["e_type"])
                loads = [s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
                first = min(loads, key=lambda s: s["p_vaddr"]) if loads else None
                self.first_load = (
                    (int(first["p_vaddr"]), int(first["p_offset"])) if first is not None else (0, 0)
                )
                self.functions = _functions(elf)
                self._has_dwarf = elf.has_dwarf_info()
        except (OSError, ELFError) as e:
            raise BadInputError(f"{path}: cannot read it as an ELF file ({e})") from e

    @property
    def position_independent(self) -> bool:
        return self.type == "ET_DYN"

    def lookup(self, name: str) -> list[int]:
        return sorted(set(self.functions.get(name, ())))

    def function_at(self, address: int) -> str | None:
        for name, values in self.functions.items():
            if address in values:
                return name
        return None

    def line_addresses(self, file: str, line: int, column: int | None) -> list[int]:
        """Lowest address of each line-table sequence for FILE:LINE (is_stmt rows)."""
        if not self._has_dwarf:
            return []
        found: dict[str, int] = {}
        with open(self.path, "rb") as f:
            dwarf = ELFFile(f).get_dwarf_info()
            for cu in dwarf.iter_CUs():
                program = dwarf.line_program_for_CU(cu)
                if program is None:
                    continue
                names = _line_program_files(program)
                for entry in program.get_entries():
                    state = entry.state
                    if state is None or state.end_sequence or not state.is_stmt:
                        continue
                    if state.line != line or (column is not None and state.column != column):
                        continue
                    source = names.get(state.file, "")
                    if not _same_file(source, file):
                        continue
                    best = found.get(source)
                    if best is None or state.address < best:
                        found[source] = state.address
        return sorted(set(found.values()))


def _functions(elf: ELFFile) -> dict[str, list[int]]:
    functions: dict[str, list[int]] = {}
    for name in (".symtab", ".dynsym"):
        section = elf.get_section_by_name(name)
        if not isinstance(section, SymbolTableSection):
            continue
        for sym in section.iter_symbols():
            if sym["st_info"]["type"] in _FUNC_TYPES and sym["st_value"] and sym.name:
                # Versioned dynamic names (memcpy@@GLIBC_2.14) are found by their base name.
                functions.setdefault(sym.name.split("@")[0], []).append(int(sym["st_value"]))
    return functions


def _line_program_files(program: object) -> dict[int, str]:
    header = program.header  # type: ignore[attr-defined]
    dirs = [
        d.decode(errors="replace") if isinstance(d, bytes) else str(d)
        for d in header["include_directory"]
    ]
    version = int(header["version"])
    out: dict[int, str] = {}
    for i, entry in enumerate(header["file_entry"]):
        name = (
            entry.name.decode(errors="replace")
            if isinstance(entry.name, bytes)
            else str(entry.name)
        )
        dir_index = int(entry.dir_index)
        if version >= 5:
            directory = dirs[dir_index] if dir_index < len(dirs) else ""
            index = i
        else:
            directory = dirs[dir_index - 1] if 0 < dir_index <= len(dirs) else ""
            index = i + 1
        out[index] = os.path.join(directory, name) if directory else name
    return out


def _same_file(source: str, wanted: str) -> bool:
    """``wanted`` names ``source`` if it is the same path or a trailing part of it."""
    if not source:
        return False
    source = os.path.normpath(source)
    wanted = os.path.normpath(wanted)
    return source == wanted or source.endswith(os.sep + wanted)


@functools.lru_cache(maxsize=64)
def _image(path: str) -> ElfImage:
    return ElfImage(Path(path))


def load_bias(image: ElfImage, maps: Sequence[Mapping]) -> int | None:
    """How far ``image`` is loaded from its link-time addresses; None if not mapped."""
    if not image.position_independent:
        return 0
    real = os.path.realpath(image.path)
    mine = [m for m in maps if m.path and os.path.realpath(m.path) == real]
    if not mine:
        return None
    first = min(mine, key=lambda m: m.start)
    vaddr, offset = image.first_load
    return first.start - first.offset - (vaddr - offset)


def _libraries(maps: Sequence[Mapping], executable: str) -> list[str]:
    real_exe = os.path.realpath(executable)
    seen: list[str] = []
    for m in maps:
        if not m.path.startswith("/") or m.offset != 0:
            continue
        real = os.path.realpath(m.path)
        if real != real_exe and real not in seen and ".so" in os.path.basename(real):
            seen.append(real)
    return seen


def resolve_selection(
    selection: Selection,
    executable: str,
    maps: Sequence[Mapping],
) -> list[Breakpoint]:
    """Run-time breakpoint addresses for a selection in a process with ``maps``.

    Raises a one-line :class:`BadInputError` when nothing matches.
    """
    image = _image(os.path.realpath(executable))
    if selection.kind == "address":
        bias = load_bias(image, maps) or 0
        name = image.function_at(selection.address)
        return [Breakpoint(selection.address + bias, name or selection.text)]
    if selection.kind == "line":
        addresses = image.line_addresses(selection.file, selection.line, selection.column)
        if not addresses:
            raise BadInputError(
                f"trigger {selection.text}: no code for that line in {executable}",
                hint="build with -g, and check the file name and line number",
            )
        bias = load_bias(image, maps) or 0
        return [Breakpoint(a + bias, selection.text) for a in addresses[:4]]
    if selection.kind != "symbol":
        raise UsageError(f"trigger {selection.text}: pick a function first")
    name = selection.text
    for path in [os.path.realpath(executable), *_libraries(maps, executable)]:
        lib = _image(path)
        addresses = lib.lookup(name)
        if not addresses:
            continue
        lib_bias = load_bias(lib, maps)
        if lib_bias is None:
            continue
        return [Breakpoint(a + lib_bias, name) for a in addresses[:4]]
    raise BadInputError(
        f"trigger {name}: no function of that name in {executable} or its loaded libraries",
        hint="check the spelling (C++ names are matched mangled), or use ? to pick one",
    )


def needs_libraries(selection: Selection, executable: str) -> bool:
    """Whether the selection is a symbol the executable itself does not define."""
    if selection.kind != "symbol":
        return False
    return not _image(os.path.realpath(executable)).lookup(selection.text)
