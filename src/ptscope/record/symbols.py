"""Resolving a trigger selection (``SYMBOL``, ``0xADDR``, ``FILE:LINE``) to run-time addresses.

Symbols and line tables come from the ELF files themselves (pyelftools): ``.symtab`` then
``.dynsym`` for functions, ``.debug_line`` for ``FILE:LINE``. Where a file is loaded comes
from ``/proc/PID/maps``: a position-independent executable or a shared library is mapped
at a bias from its link-time addresses, computed from its first mapping and its first
``PT_LOAD`` segment. A plain symbol is looked up in the executable first, then in every
shared library the process has mapped. Prefixes force one kind: ``symbol:NAME``,
``addr:0x…`` (an address in the executable, link-time for PIE), ``line:FILE:LINE[:COL]``.

C++ (and Rust) functions are named as the trace shows them: demangled without parameters
(``outer::inner::catcher``, perf's spelling), demangled with parameters to pick one overload
(``outer::inner::twice(double)``), or mangled. Demangling is binutils' ``c++filt``
(``ptscope.demangle``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from elftools.common.exceptions import ELFError
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from ptscope.demangle import demangle
from ptscope.errors import BadInputError, UsageError
from ptscope.record.breakpoints import Breakpoint

__all__ = [
    "ElfImage",
    "InstructionLength",
    "Mapping",
    "Selection",
    "check_selection",
    "load_bias",
    "parse_selection",
    "read_maps",
    "resolve_selection",
]

SelectionKind = Literal["symbol", "address", "line", "pick"]
_LINE_RE: Final = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::(?P<col>\d+))?$")
_FUNC_TYPES: Final = ("STT_FUNC", "STT_GNU_IFUNC")

InstructionLength = Callable[[bytes], "int | None"]
"""The length of the x86-64 instruction at the start of some bytes (None: no instruction):
the decode stage's, handed in by the command line (this stage imports no other)."""


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
                self.loads = [
                    (int(s["p_vaddr"]), int(s["p_offset"]), int(s["p_filesz"])) for s in loads
                ]
                self.functions = _functions(elf)
                self.function_extents = _function_extents(elf)
                self.has_symtab = isinstance(elf.get_section_by_name(".symtab"), SymbolTableSection)
                self.code_extents = [
                    (int(sec["sh_addr"]), int(sec["sh_size"]), sec.name)
                    for sec in elf.iter_sections()
                    if sec["sh_flags"] & SH_FLAGS.SHF_EXECINSTR and sec["sh_addr"]
                ]
                self._has_dwarf = elf.has_dwarf_info()
        except (OSError, ELFError) as e:
            raise BadInputError(f"{path}: cannot read it as an ELF file ({e})") from e

    @property
    def position_independent(self) -> bool:
        return self.type == "ET_DYN"

    def lookup(self, name: str) -> list[int]:
        return sorted(set(self.functions.get(name, ())))

    def matches(self, name: str) -> dict[str, list[int]]:
        """The functions ``name`` designates, by their full name (with parameters for C++):
        an exact symbol name, else a demangled name with parameters, else one without
        (which is ambiguous when it names several overloads)."""
        exact = self.lookup(name)
        if exact:
            return {name: exact}
        wanted = _squeezed(name)
        demangled = self._demangled
        for form in (0, 1):
            found: dict[str, list[int]] = {}
            for mangled, names in demangled.items():
                if _squeezed(names[form]) == wanted:
                    found.setdefault(names[0], []).extend(self.functions[mangled])
            if found:
                return {full: sorted(set(addresses)) for full, addresses in found.items()}
        return {}

    def display_names(self) -> set[str]:
        """Each function's name as :meth:`matches` takes it, C++ ones demangled with their
        parameters."""
        demangled = self._demangled
        return {demangled[n][0] if n in demangled else n for n in self.functions}

    @functools.cached_property
    def _demangled(self) -> dict[str, tuple[str, str]]:
        return demangle([n for n in self.functions if n.startswith(("_Z", "_R"))])

    def function_at(self, address: int) -> str | None:
        for name, values in self.functions.items():
            if address in values:
                return name
        return None

    def function_containing(self, address: int) -> str | None:
        """The function whose code holds link-time ``address`` (its first instruction,
        for a symbol without a size), or None: data, padding, or no code at all."""
        for start, size, name in self.function_extents:
            if start <= address < start + max(size, 1):
                return name
        return None

    def is_trigger_address(self, address: int) -> bool:
        """Whether link-time ``address`` can be a trigger: inside a function, or, in a
        file stripped of its symbol table (where most functions have no symbol), inside
        its code."""
        if self.function_containing(address) is not None:
            return True
        return not self.has_symtab and any(
            start <= address < start + size for start, size, _ in self.code_extents
        )

    def read(self, address: int, size: int) -> bytes:
        """Up to ``size`` bytes of the file at link-time ``address`` (fewer where its
        segment ends; none outside the file's segments)."""
        for vaddr, offset, filesz in self.loads:
            if vaddr <= address < vaddr + filesz:
                size = min(size, vaddr + filesz - address)
                try:
                    with open(self.path, "rb") as f:
                        f.seek(offset + address - vaddr)
                        return f.read(size)
                except OSError:
                    return b""
        return b""

    def instruction_containing(self, address: int, length: InstructionLength) -> int | None:
        """The start of the instruction that link-time ``address`` lies inside, when it is
        not itself an instruction's start: the function's instructions walked from its
        first one (None: it is a start, or it cannot be told: no sized function holds it,
        or bytes on the way decode as no instruction)."""
        holders = [(s, n) for s, n, _ in self.function_extents if s <= address < s + n]
        if not holders:
            return None
        start = max(s for s, _ in holders)
        code = self.read(start, address - start + 16)
        at = 0
        while start + at < address:
            size = length(code[at : at + 16])
            if not size:
                return None
            if start + at + size > address:
                return start + at
            at += size
        return None

    def code_span(self) -> tuple[int, int] | None:
        """The lowest and highest link-time address of its code (for messages)."""
        extents = [(start, max(size, 1)) for start, size, _ in self.code_extents]
        if not extents:
            return None
        return min(start for start, _ in extents), max(start + size for start, size in extents)

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


def _function_symbols(elf: ELFFile) -> Iterator[tuple[str, int, int]]:
    """(name, link-time start, size) of every function symbol; a versioned dynamic name
    (memcpy@@GLIBC_2.14) is its base name, by which it is found."""
    for name in (".symtab", ".dynsym"):
        section = elf.get_section_by_name(name)
        if not isinstance(section, SymbolTableSection):
            continue
        for sym in section.iter_symbols():
            if sym["st_info"]["type"] in _FUNC_TYPES and sym["st_value"] and sym.name:
                yield sym.name.split("@")[0], int(sym["st_value"]), int(sym["st_size"])


def _functions(elf: ELFFile) -> dict[str, list[int]]:
    functions: dict[str, list[int]] = {}
    for name, start, _ in _function_symbols(elf):
        functions.setdefault(name, []).append(start)
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


def _squeezed(name: str) -> str:
    return "".join(name.split())


def _function_extents(elf: ELFFile) -> list[tuple[int, int, str]]:
    """(link-time start, size, name) of every function symbol."""
    return sorted({(start, size, name) for name, start, size in _function_symbols(elf)})


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
        if not image.is_trigger_address(selection.address):
            raise _no_code_at(selection, image, executable)
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
        lib_bias = load_bias(lib, maps)
        if lib_bias is None:
            continue
        addresses = _one_function(name, lib)
        if addresses:
            return [Breakpoint(a + lib_bias, name) for a in addresses[:4]]
    raise _no_function(name, executable)


def _one_function(name: str, image: ElfImage) -> list[int]:
    """The addresses of the one function ``name`` designates in ``image`` (none: []);
    several overloads are a one-line error that lists them."""
    found = image.matches(name)
    if len(found) > 1:
        overloads = sorted(found)
        raise BadInputError(
            f"trigger {name}: {len(overloads)} functions have that name: {', '.join(overloads)}",
            hint=f"give one with its parameters, e.g. --trigger '{overloads[0]}'",
        )
    return next(iter(found.values()), [])


def _no_function(name: str, executable: str) -> BadInputError:
    return BadInputError(
        f"trigger {name}: no function of that name in {executable} or its libraries",
        hint="check the spelling (names as the trace shows them, e.g. ns::f, or mangled), "
        "or use ? to pick one",
    )


def check_selection(
    selection: Selection,
    executable: str,
    maps: Sequence[Mapping] | None = None,
    length: InstructionLength | None = None,
) -> None:
    """Fail now, before anything is recorded, if the selection cannot be resolved: a
    symbol no file defines (the executable, then the libraries of ``maps`` or, before the
    program runs, the ones it is linked with), an ambiguous one, a line without code, or
    (with ``length``, to walk instructions) an address inside an instruction, which would
    never be hit."""
    image = _image(os.path.realpath(executable))
    if selection.kind == "line":
        if not image.line_addresses(selection.file, selection.line, selection.column):
            raise BadInputError(
                f"trigger {selection.text}: no code for that line in {executable}",
                hint="build with -g, and check the file name and line number",
            )
        return
    if selection.kind == "address":
        if not image.is_trigger_address(selection.address):
            raise _no_code_at(selection, image, executable)
        inside = None if length is None else image.instruction_containing(selection.address, length)
        if inside is not None:
            start, name = max(
                (s, n) for s, size, n in image.function_extents if s <= inside < s + size
            )
            offset = f" ({name}+{inside - start:#x})"
            raise BadInputError(
                f"trigger {selection.text}: not the start of an instruction, so it would never "
                f"be hit: it is inside the one at {inside:#x}{offset}",
                hint="give an instruction's address as objdump -d shows it, e.g. "
                f"--trigger {inside:#x}",
            )
        return
    if selection.kind != "symbol":
        return
    libraries = _libraries(maps, executable) if maps is not None else linked_libraries(executable)
    for path in [image.path, *(libraries or [])]:
        if _one_function(selection.text, _image(str(path))):
            return
    if libraries is not None:  # else it may be in a library ldd could not list
        raise _no_function(selection.text, executable)


def _no_code_at(selection: Selection, image: ElfImage, executable: str) -> BadInputError:
    span = image.code_span()
    where = f" (its code lies in {span[0]:#x}-{span[1]:#x})" if span else ""
    return BadInputError(
        f"trigger {selection.text}: no function of {executable} contains that address{where}",
        hint="give a link-time address inside a function (as nm or objdump -d show it), "
        "or the function's name",
    )


def linked_libraries(executable: str) -> list[str] | None:
    """The shared libraries ``executable`` is linked with, as the dynamic loader finds
    them (``ldd``); [] for a static program, None when ``ldd`` cannot tell."""
    tool = shutil.which("ldd")
    if tool is None:
        return None
    try:
        done = subprocess.run(
            [tool, executable], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if "not a dynamic executable" in done.stdout + done.stderr:
        return []
    if done.returncode != 0:
        return None
    found = []
    for line in done.stdout.splitlines():
        _name, arrow, rest = line.partition("=>")
        path = rest.split("(")[0].strip() if arrow else line.split("(")[0].strip()
        if path.startswith("/") and ".so" in os.path.basename(path):
            found.append(os.path.realpath(path))
    return found


def needs_libraries(selection: Selection, executable: str) -> bool:
    """Whether the selection is a symbol the executable itself does not define."""
    if selection.kind != "symbol":
        return False
    return not _image(os.path.realpath(executable)).matches(selection.text)
