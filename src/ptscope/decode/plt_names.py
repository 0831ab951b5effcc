"""Names for PLT stubs that perf names after the symbol before them.

A call to a shared library's function goes through a stub in the caller's PLT (``.plt``,
``.plt.sec`` with IBT, ``.plt.got``): ``jmp *GOT_SLOT``. perf synthesizes ``name@plt``
symbols for them, but some versions (6.1 among them) extend the symbol before the PLT over
it, so every stub, and the lazy-binding header PLT0 (``push GOT+8; jmp *GOT+16``) that a
first call jumps to, are ``_init+0x30``, ``_init+0x20``...: one function, so the call of
``strlen@plt`` shows as a call of ``_init``, on both decoders.

Here the stub's own name comes from the binary: each entry's ``jmp *disp(%rip)`` names its
GOT slot, and the slot's relocation (``R_X86_64_JUMP_SLOT`` in ``.rela.plt``,
``R_X86_64_GLOB_DAT`` for ``.plt.got``) names the function; an entry of ``.plt`` that holds
no such jump (the IBT layout: ``endbr64; push N; jmp PLT0``) is the N-th ``.rela.plt``
relocation's. PLT0 is named ``.plt``, as newer perf names it. Addresses come from perf's
``SYMBOL+OFFSET`` and the symbol's link-time value, so no load address is needed (the same
way for both decoders). Only x86-64 ELF files are read; anything else keeps perf's names.
"""

from __future__ import annotations

import bisect
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import numpy as np

from ptscope.decode.binary_files import local_binary

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import Section

__all__ = ["PLT_HEADER_NAME", "PltEntries", "plt_entries", "plt_stub"]

log = logging.getLogger("ptscope")

PLT_HEADER_NAME: Final = ".plt"
"""The name of PLT0, the lazy-binding header (perf >= 6.2 names it so too)."""

_PLT_SECTIONS: Final = (".plt", ".plt.sec", ".plt.got")
_JMP_GOT: Final = b"\xff\x25"  # jmp *disp32(%rip)
_PUSH_IMM32: Final = 0x68
_NEAR: Final = 1 << 20
"""How far before the PLT a symbol may start and still be the one perf extended over it."""
_ELF64_SYM: Final = np.dtype(
    [
        ("name", "<u4"),
        ("info", "u1"),
        ("other", "u1"),
        ("shndx", "<u2"),
        ("value", "<u8"),
        ("size", "<u8"),
    ]
)


@dataclass
class PltEntries:
    """A binary's PLT entries by link-time address, and the symbols just before them."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    symbols_before: dict[str, int] = field(default_factory=dict)
    """Symbol name -> link-time value, for the symbols perf may have extended over them."""

    def name_at(self, address: int) -> tuple[str, int] | None:
        """The entry holding ``address`` and the offset into it, or None."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i < 0 or address >= self.ends[i]:
            return None
        return self.names[i], address - self.starts[i]


def plt_stub(symbol: str, offset: int, dso: str) -> tuple[str, int] | None:
    """The PLT entry perf printed as ``symbol+offset`` in ``dso`` (``strlen@plt``, or
    ``.plt`` for PLT0) with the offset into it; None when that address is no PLT entry,
    perf named it already, or the binary cannot be read."""
    if offset < 0 or symbol.endswith("@plt") or symbol == PLT_HEADER_NAME:
        return None
    entries = plt_entries(dso)
    base = entries.symbols_before.get(symbol)
    if base is None:
        return None
    return entries.name_at(base + offset)


def plt_entries(dso: str) -> PltEntries:
    """The PLT entries of ``dso`` (a path as perf prints it, read where the decode reads
    binaries: ``binary_files``; empty if it has none or cannot be read)."""
    path = local_binary(dso)
    return PltEntries() if path is None else _entries_in(str(path))


@functools.lru_cache(maxsize=256)
def _entries_in(path: str) -> PltEntries:
    # pyelftools is imported on first use: most decodes never name a PLT entry, and it
    # costs 40 ms of every decode's start-up.
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            if elf.elfclass != 64 or elf["e_machine"] != "EM_X86_64" or not elf.little_endian:
                return PltEntries()
            sections = [s for s in map(elf.get_section_by_name, _PLT_SECTIONS) if s is not None]
            sections = [s for s in sections if s["sh_type"] == "SHT_PROGBITS" and s["sh_size"]]
            if not sections:
                return PltEntries()
            return _read_entries(elf, sections)
    except (OSError, ELFError, ValueError) as e:
        log.debug("PLT of %s: %s", path, e)
        return PltEntries()


def _read_entries(elf: ELFFile, sections: list[Section]) -> PltEntries:
    jump_slots = _slot_names(elf.get_section_by_name(".rela.plt"))
    by_index = list(jump_slots.values())
    glob_dat = _slot_names(elf.get_section_by_name(".rela.dyn"))
    found: list[tuple[int, int, str]] = []
    for section in sections:
        start = int(section["sh_addr"])
        data = section.data()
        size = int(section["sh_entsize"]) or 16
        for at in range(0, len(data) - size + 1, size):
            entry = data[at : at + size]
            address = start + at
            if section.name == ".plt" and at == 0:
                found.append((address, address + size, PLT_HEADER_NAME))
                continue
            name = _entry_name(entry, address, jump_slots, glob_dat, by_index)
            if name is not None:
                found.append((address, address + size, f"{name}@plt"))
    found.sort()
    entries = PltEntries(
        starts=[s for s, _, _ in found],
        ends=[e for _, e, _ in found],
        names=[n for _, _, n in found],
    )
    if found:
        entries.symbols_before = _symbols_before(elf, found[0][0], found[-1][1])
    return entries


def _entry_name(
    entry: bytes,
    address: int,
    jump_slots: dict[int, str],
    glob_dat: dict[int, str],
    by_index: list[str],
) -> str | None:
    """The function a PLT entry jumps to: through the GOT slot its ``jmp *disp(%rip)``
    reads, or (an IBT ``.plt`` entry) the relocation its ``push N`` names."""
    at = entry.find(_JMP_GOT)
    if at >= 0 and at + 6 <= len(entry):
        disp = int.from_bytes(entry[at + 2 : at + 6], "little", signed=True)
        slot = address + at + 6 + disp
        name = jump_slots.get(slot) or glob_dat.get(slot)
        if name:
            return name
    push = entry.find(bytes([_PUSH_IMM32]))
    if push >= 0 and push + 5 <= len(entry):
        index = int.from_bytes(entry[push + 1 : push + 5], "little")
        if index < len(by_index) and by_index[index]:
            return by_index[index]
    return None


def _slot_names(section: Section | None) -> dict[int, str]:
    """GOT slot -> function name, from a relocation section (relocations without a
    symbol, such as IRELATIVE, are left out)."""
    from elftools.elf.relocation import RelocationSection
    from elftools.elf.sections import SymbolTableSection

    if not isinstance(section, RelocationSection):
        return {}
    symbols = section.elffile.get_section(section["sh_link"])
    if not isinstance(symbols, SymbolTableSection):
        return {}
    names: dict[int, str] = {}
    for reloc in section.iter_relocations():
        index = reloc["r_info_sym"]
        name = symbols.get_symbol(index).name if index else ""
        if name:
            names[int(reloc["r_offset"])] = name
    return names


def _symbols_before(elf: ELFFile, low: int, high: int) -> dict[str, int]:
    """Name -> value of the symbols that start within :data:`_NEAR` before ``low`` (or
    inside [low, high)): the ones perf can have stretched over the PLT."""
    from elftools.elf.sections import SymbolTableSection

    found: dict[str, int] = {}
    for name in (".dynsym", ".symtab"):
        section = elf.get_section_by_name(name)
        if not isinstance(section, SymbolTableSection) or not section["sh_size"]:
            continue
        table = np.frombuffer(section.data(), dtype=_ELF64_SYM)
        near = table[(table["value"] >= max(low - _NEAR, 1)) & (table["value"] < high)]
        strings = section.stringtable
        for offset, value in zip(near["name"].tolist(), near["value"].tolist(), strict=True):
            name = strings.get_string(offset) if offset else ""
            if name and value > found.get(name, -1):
                found[name] = value
    return found
