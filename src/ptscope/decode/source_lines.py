"""Source file:line of a code address, from the DWARF line tables of the binary (pyelftools).

Each binary's line table is read once, the first time one of its addresses is asked about,
and kept as sorted address columns (a lookup is a bisection). A binary without
``.debug_line`` is looked up in the system's separate debug files
(``/usr/lib/debug/.build-id/xx/rest.debug``); run-time addresses become the binary's own
(ELF virtual) addresses through the file offset they map (see :class:`SourceLines.line`).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Final

from elftools.common.exceptions import DWARFError, ELFError
from elftools.dwarf.compileunit import CompileUnit
from elftools.dwarf.dwarfinfo import DWARFInfo
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection

__all__ = ["SourceLines"]

log = logging.getLogger("ptscope")

DEBUG_DIR: Final = Path("/usr/lib/debug/.build-id")


class _Table:
    """A line table: ``file:line`` from each address on (None past a sequence's end)."""

    def __init__(self, rows: list[tuple[int, str | None]]) -> None:
        # Where one sequence ends and another starts at the same address, the start wins.
        rows.sort(key=lambda r: (r[0], r[1] is not None))
        self.addresses = [r[0] for r in rows]
        self.places = [r[1] for r in rows]

    def place(self, vaddr: int) -> str | None:
        i = bisect.bisect_right(self.addresses, vaddr) - 1
        return self.places[i] if i >= 0 else None


class _Binary:
    """One binary: its PT_LOAD segments and its DWARF line tables, read per compilation
    unit as addresses are asked about (``.debug_aranges`` says which unit holds one; a
    binary without it has its whole table read at once)."""

    def __init__(self, path: Path) -> None:
        self._files: list[BinaryIO] = []
        elf = self._open(path)
        self.segments = [
            (seg["p_offset"], seg["p_filesz"], seg["p_vaddr"])
            for seg in elf.iter_segments()
            if seg["p_type"] == "PT_LOAD"
        ]
        if not _has_lines(elf):
            debug = _separate_debug_file(elf)
            elf = self._open(debug) if debug is not None else elf
        self._dwarf = elf.get_dwarf_info() if _has_lines(elf) else None
        self._aranges = self._dwarf.get_aranges() if self._dwarf is not None else None
        self._units: dict[int, _Table] = {}
        self._whole: _Table | None = None

    def _open(self, path: Path) -> ELFFile:
        f = open(path, "rb")  # noqa: SIM115 (pyelftools reads lazily: kept open until close)
        self._files.append(f)
        return ELFFile(f)

    def close(self) -> None:
        for f in self._files:
            f.close()

    def vaddr(self, offset: int) -> int | None:
        for start, size, vaddr in self.segments:
            if start <= offset < start + size:
                return vaddr + offset - start
        return None

    def place(self, vaddr: int) -> str | None:
        dwarf = self._dwarf
        if dwarf is None:
            return None
        if self._aranges is not None:
            unit = self._aranges.cu_offset_at_addr(vaddr)
            if unit is None:
                return None
            table = self._units.get(unit)
            if table is None:
                table = self._units[unit] = _Table(_unit_rows(dwarf, dwarf.get_CU_at(unit)))
            return table.place(vaddr)
        if self._whole is None:
            rows = [row for cu in dwarf.iter_CUs() for row in _unit_rows(dwarf, cu)]
            self._whole = _Table(rows)
        return self._whole.place(vaddr)


class SourceLines:
    """``file:line`` lookups for the binaries perf names (read with ``resolve``: perf's
    path → a readable file, None if there is none)."""

    def __init__(self, resolve: Callable[[str], Path | None]) -> None:
        self._resolve = resolve
        self._binaries: dict[str, _Binary | None] = {}

    def line(self, path: str, offset: int) -> str | None:
        """The source place of the code at file ``offset`` of binary ``path``, if known."""
        binary = self._binary(path)
        if binary is None:
            return None
        vaddr = binary.vaddr(offset)
        if vaddr is None:
            return None
        try:
            return binary.place(vaddr)
        except (ELFError, DWARFError, ValueError, KeyError, IndexError, AttributeError) as e:
            log.debug("line table of %s: %s", path, e)
            return None

    def close(self) -> None:
        for binary in self._binaries.values():
            if binary is not None:
                binary.close()

    def _binary(self, path: str) -> _Binary | None:
        if path not in self._binaries:
            found = self._resolve(path)
            binary = None
            if found is not None:
                try:
                    binary = _Binary(found)
                except (OSError, ELFError, DWARFError, ValueError, KeyError) as e:
                    log.debug("line table of %s: %s", found, e)
            self._binaries[path] = binary
        return self._binaries[path]


def _has_lines(elf: ELFFile) -> bool:
    return bool(elf.has_dwarf_info()) and elf.get_section_by_name(".debug_line") is not None


def _unit_rows(dwarf: DWARFInfo, cu: CompileUnit) -> list[tuple[int, str | None]]:
    program = dwarf.line_program_for_CU(cu)
    if program is None:
        return []
    files = program["file_entry"]
    # DWARF 5 numbers files from 0, earlier versions from 1.
    base = 0 if program.header["version"] >= 5 else 1
    rows: list[tuple[int, str | None]] = []
    for entry in program.get_entries():
        state = entry.state
        if state is None:
            continue
        if state.end_sequence:
            rows.append((state.address, None))
            continue
        index = state.file - base
        name = files[index].name if 0 <= index < len(files) else b"?"
        text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
        rows.append((state.address, f"{PurePosixPath(text).name}:{state.line}"))
    return rows


def _separate_debug_file(elf: ELFFile) -> Path | None:
    """The system's separate debug file for ``elf`` (by its GNU build id), if installed."""
    for section in elf.iter_sections():
        if not isinstance(section, NoteSection):
            continue
        for note in section.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                build_id = str(note["n_desc"])
                path = DEBUG_DIR / build_id[:2] / f"{build_id[2:]}.debug"
                return path if path.is_file() else None
    return None
