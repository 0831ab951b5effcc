"""A DSO's symbols as perf 6.1 resolves addresses in it, for the own decoder.

perf (``dso__load``, ``dso__load_sym``, ``dso__synthesize_plt_symbols``,
``dso__load_perf_map``) reads a DSO's ``.symtab`` from the first candidate file that has
one and its ``.dynsym`` (and PLT) from the first that has that, keeps functions, objects
and text/data labels, moves their values into file offsets, names them as it demangles
them, stretches the ones of size zero and drops duplicates by its preference, adds a
``NAME@plt`` per PLT relocation, and looks addresses up in a red-black tree. This module
does each of those steps as perf does, on the ELF tables read in bulk (pyelftools for the
headers, numpy for the symbol and relocation tables: pyelftools builds an object per
symbol, seconds for a big C++ binary), and hands the symbols to the C helper
(``_native/pt_symtree.c``) that builds perf's tree and flattens every lookup into sorted
intervals. docs/architecture.md ("The own decoder: images and symbols") lists the rules.

:func:`dso_symbols` returns :class:`DsoSymbols`: intervals in the DSO's address space
(file offsets; absolute addresses for JIT maps) and, for each, the symbol perf finds,
with the symbol's own start and end.
"""

from __future__ import annotations

import logging
import mmap
import os
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from ptscope.decode.perf_dsos import Dso, DsoLocator
from ptscope.demangle import perf_symbol_names

__all__ = ["DsoSymbols", "ElfImage", "dso_symbols", "perf_map_symbols"]

log = logging.getLogger("ptscope")

try:
    from ptscope.decode import _ptdecode  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover (the native decoder is not built)
    _ptdecode = None

SHT_SYMTAB: Final = 2
SHT_RELA: Final = 4
SHT_NOTE: Final = 7
SHT_NOBITS: Final = 8
SHT_REL: Final = 9
SHT_DYNSYM: Final = 11
SHT_PROGBITS: Final = 1
SHF_ALLOC: Final = 2
SHN_UNDEF: Final = 0
SHN_ABS: Final = 0xFFF1
PT_LOAD: Final = 1
STT_NOTYPE, STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 0, 1, 2, 10
STV_INTERNAL, STV_HIDDEN = 1, 2
PASS_SYMTAB, PASS_DYNSYM, PASS_PLAIN = 0, 1, 2

_SYM64: Final = np.dtype(
    [("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
     ("size", "<u8")]
)  # fmt: skip
_RELA64: Final = np.dtype([("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")])
_REL64: Final = np.dtype([("offset", "<u8"), ("info", "<u8")])
_SHDR64: Final = np.dtype(
    [("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"),
     ("size", "<u8"), ("link", "<u4"), ("info", "<u4"), ("align", "<u8"), ("entsize", "<u8")]
)  # fmt: skip
_PHDR64: Final = np.dtype(
    [("type", "<u4"), ("flags", "<u4"), ("offset", "<u8"), ("vaddr", "<u8"), ("paddr", "<u8"),
     ("filesz", "<u8"), ("memsz", "<u8"), ("align", "<u8")]
)  # fmt: skip


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


class ElfImage:
    """The headers of a 64-bit little-endian ELF file, read once, its bytes mapped.

    Read by hand with numpy rather than pyelftools: a DSO's headers are a few hundred
    bytes, and perf's rules need them as they are in the file (sections by name, in
    index order; program headers), which numpy gives in one read."""

    def __init__(self, path: str, data: mmap.mmap) -> None:
        self.path = path
        self.data = data
        e = data
        if len(e) < 64 or e[:4] != b"\x7fELF" or e[4] != 2 or e[5] != 1:
            raise ValueError("not a 64-bit little-endian ELF file")
        self.type = int.from_bytes(e[16:18], "little")
        shoff = int.from_bytes(e[40:48], "little")
        phoff = int.from_bytes(e[32:40], "little")
        phnum = int.from_bytes(e[56:58], "little")
        shnum = int.from_bytes(e[60:62], "little")
        shstrndx = int.from_bytes(e[62:64], "little")
        if shoff + shnum * _SHDR64.itemsize > len(e) or phoff + phnum * _PHDR64.itemsize > len(e):
            raise ValueError("ELF headers past the end of the file")
        sh = np.frombuffer(e, dtype=_SHDR64, count=shnum, offset=shoff) if shnum else None
        ph = np.frombuffer(e, dtype=_PHDR64, count=phnum, offset=phoff) if phnum else None
        self.sections: list[Section] = []
        names_at = 0
        names_end = 0
        if sh is not None and shstrndx < shnum:
            names_at = int(sh[shstrndx]["offset"])
            names_end = names_at + int(sh[shstrndx]["size"])
        if sh is not None:
            for i, s in enumerate(sh.tolist()):
                name = self.string(names_at, names_end, s[0]) if names_end else ""
                self.sections.append(Section(i, name, s[1], s[2], s[3], s[4], s[5], s[6], s[9]))
        self.loads: list[tuple[int, int, int]] = []
        """PT_LOAD program headers: (vaddr, offset, size as perf measures it)."""
        if ph is not None:
            for p in ph.tolist():
                if p[0] == PT_LOAD:
                    size = max(p[5], p[6])
                    if size:
                        self.loads.append((p[3], p[2], size))
        del sh, ph

    def string(self, start: int, end: int, offset: int) -> str:
        at = start + offset
        if at >= end or at >= len(self.data):
            return ""
        stop = self.data.find(b"\0", at, min(end, len(self.data)))
        if stop < 0:
            stop = min(end, len(self.data))
        return self.data[at:stop].decode("utf-8", "surrogateescape")

    @classmethod
    def open(cls, path: str) -> ElfImage | None:
        """The file as an ELF image, None if it cannot be read or is not one."""
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < 64:
                    return None
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        try:
            return cls(path, data)
        except (ValueError, IndexError):
            data.close()
            return None

    def section(self, name: str) -> Section | None:
        """The first section of that name (perf's ``elf_section_by_name``)."""
        return next((s for s in self.sections if s.name == name), None)

    def section_bytes(self, s: Section) -> bytes:
        if s.type == SHT_NOBITS or s.offset + s.size > len(self.data):
            return b""
        return self.data[s.offset : s.offset + s.size]

    def build_id(self) -> bytes | None:
        """The GNU build-id note (perf's ``elf_read_build_id``: the first of the sections
        ``.note.gnu.build-id``, ``.notes``, ``.note`` that exists)."""
        for name in (".note.gnu.build-id", ".notes", ".note"):
            s = self.section(name)
            if s is not None:
                return _gnu_build_id(self.section_bytes(s))
        return None

    def symtab(self) -> Section | None:
        s = self.section(".symtab")
        return s if s is not None and s.type == SHT_SYMTAB else None

    def dynsym(self) -> Section | None:
        s = self.section(".dynsym")
        return s if s is not None and s.type == SHT_DYNSYM else None

    def close(self) -> None:
        self.data.close()


def _gnu_build_id(notes: bytes) -> bytes | None:
    at = 0
    while at + 12 <= len(notes):
        namesz, descsz, kind = (
            int.from_bytes(notes[at + k : at + k + 4], "little") for k in (0, 4, 8)
        )
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if kind == 3 and notes[name_at : name_at + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc_at : desc_at + descsz]
        at = desc_at + (descsz + 3) // 4 * 4
    return None


@dataclass
class DsoSymbols:
    """What perf finds in a DSO: in [start[i], end[i]) the symbol ``names[sym[i]]``, which
    spans [sym_start[i], sym_end[i])."""

    start: npt.NDArray[np.uint64]
    end: npt.NDArray[np.uint64]
    sym_start: npt.NDArray[np.uint64]
    sym_end: npt.NDArray[np.uint64]
    name: list[str]
    """The name of each interval's symbol."""

    @classmethod
    def empty(cls) -> DsoSymbols:
        z = np.zeros(0, dtype=np.uint64)
        return cls(z, z, z, z, [])

    def __len__(self) -> int:
        return len(self.start)


@dataclass
class _Pass:
    start: npt.NDArray[np.uint64]
    end: npt.NDArray[np.uint64]
    binding: npt.NDArray[np.uint8]
    names: list[str]
    kind: int
    failed: bool = False


def _symbol_pass(syms: ElfImage, runtime: ElfImage, table: Section, kind: int) -> _Pass:
    """One of ``dso__load_sym_internal``'s passes over a symbol table."""
    raw = syms.section_bytes(table)
    n = len(raw) // _SYM64.itemsize if table.entsize else 0
    s = np.frombuffer(raw, dtype=_SYM64, count=n)
    stype = s["info"] & 0xF
    name_ok = s["name"] != 0
    defined = s["shndx"] != SHN_UNDEF
    vis = s["other"] & 3
    func = ((stype == STT_FUNC) | (stype == STT_GNU_IFUNC)) & name_ok & defined
    obj = (stype == STT_OBJECT) & name_ok & defined
    label = (
        (stype == STT_NOTYPE) & name_ok & defined & (s["shndx"] != SHN_ABS)
        & (vis != STV_HIDDEN) & (vis != STV_INTERNAL)
    )  # fmt: skip
    keep = (func | obj | label) & (s["shndx"] != SHN_ABS)
    idx = np.flatnonzero(keep)
    nsec = len(syms.sections)
    bad = idx[s["shndx"][idx] >= nsec]
    failed = False
    if len(bad):
        # perf's pass stops (fails) at a symbol whose section it cannot get
        idx = idx[idx < bad[0]]
        failed = True
    strtab = syms.sections[table.link] if table.link < nsec else None
    str_start = strtab.offset if strtab is not None else 0
    str_end = str_start + (strtab.size if strtab is not None else 0)
    starts: list[int] = []
    ends: list[int] = []
    binds: list[int] = []
    names: list[bytes] = []
    rsections = runtime.sections
    data = syms.data
    for i in idx.tolist():
        shndx = int(s["shndx"][i])
        sec = syms.sections[shndx]
        if not sec.flags & SHF_ALLOC:
            continue
        if sec.type == SHT_NOBITS:
            if shndx >= len(rsections):
                failed = True
                break
            sec = rsections[shndx]
        if bool(label[i]) and "text" not in sec.name and "data" not in sec.name:
            continue
        value = int(s["value"][i])
        for vaddr, offset, size in runtime.loads:
            if vaddr <= value < vaddr + size:
                value -= vaddr - offset
                break
        else:
            value -= sec.addr - sec.offset
        value &= (1 << 64) - 1
        at = str_start + int(s["name"][i])
        stop = data.find(b"\0", at, str_end) if at < str_end else at
        names.append(data[at : stop if stop >= 0 else str_end])
        size = int(s["size"][i])
        starts.append(value)
        ends.append((value + size) & ((1 << 64) - 1) if size else value)
        binds.append(int(s["info"][i]) >> 4)
    return _Pass(
        np.array(starts, dtype=np.uint64),
        np.array(ends, dtype=np.uint64),
        np.array(binds, dtype=np.uint8),
        perf_symbol_names(names),
        kind,
        failed,
    )


def _plt_pass(runtime: ElfImage) -> _Pass | None:
    """``dso__synthesize_plt_symbols``: a ``NAME@plt`` per PLT relocation."""
    dynsym = runtime.dynsym()
    if dynsym is None:
        return None
    rel = runtime.section(".rela.plt") or runtime.section(".rel.plt")
    plt = runtime.section(".plt")
    if rel is None or rel.link != dynsym.index or plt is None:
        return None
    if not rel.entsize or dynsym.link >= len(runtime.sections):
        return None
    strtab = runtime.sections[dynsym.link]
    if not strtab.size:
        return None
    dtype = _RELA64 if rel.type == SHT_RELA else _REL64
    raw = runtime.section_bytes(rel)
    n = rel.size // rel.entsize
    relocs = np.frombuffer(raw, dtype=dtype, count=min(n, len(raw) // dtype.itemsize))
    symraw = runtime.section_bytes(dynsym)
    dsyms = np.frombuffer(symraw, dtype=_SYM64, count=len(symraw) // _SYM64.itemsize)
    entry = plt.entsize
    off = plt.offset + entry
    starts, ends, raw_names = [], [], []
    str_start, str_end = strtab.offset, strtab.offset + strtab.size
    data = runtime.data
    for info in relocs["info"].tolist():
        symidx = info >> 32
        name = b""
        if symidx < len(dsyms):
            at = str_start + int(dsyms["name"][symidx])
            stop = data.find(b"\0", at, str_end) if at < str_end else at
            name = data[at : stop if stop >= 0 else str_end]
        raw_names.append(name)
        starts.append(off)
        ends.append(off + entry)
        off += entry
    names = [f"{n}@plt" for n in perf_symbol_names(raw_names)]
    return _Pass(
        np.array(starts, dtype=np.uint64),
        np.array(ends, dtype=np.uint64),
        np.full(len(starts), 1, dtype=np.uint8),
        names,
        PASS_PLAIN,
    )


def _flatten(passes: list[_Pass]) -> DsoSymbols:
    """The tree perf builds of these passes, as intervals (``_native/pt_symtree.c``)."""
    if not passes or _ptdecode is None:
        return DsoSymbols.empty()
    names = [n for p in passes for n in p.names]
    if not names:
        return DsoSymbols.empty()
    start = np.concatenate([p.start for p in passes])
    end = np.concatenate([p.end for p in passes])
    binding = np.concatenate([p.binding for p in passes])
    kinds = np.concatenate([np.full(len(p.names), p.kind, dtype=np.uint8) for p in passes])
    encoded = [n.encode("utf-8", "surrogateescape") for n in names]
    name_len = np.array([len(b) for b in encoded], dtype=np.uint32)
    underscores = np.array([min(len(b) - len(b.lstrip(b"_")), 255) for b in encoded], np.uint8)
    sys_prefix = np.array([b.startswith((b"SyS", b"compat_SyS")) for b in encoded], np.uint8)
    out = _ptdecode.flatten_symbols(start, end, name_len, binding, underscores, sys_prefix, kinds)
    i_start = np.frombuffer(out[0], dtype=np.uint64)
    i_end = np.frombuffer(out[1], dtype=np.uint64)
    i_sym = np.frombuffer(out[2], dtype=np.uint32)
    sym_end = np.frombuffer(out[3], dtype=np.uint64)
    return DsoSymbols(
        i_start.copy(),
        i_end.copy(),
        start[i_sym],
        sym_end[i_sym],
        [names[i] for i in i_sym.tolist()],
    )


def _elf_symbols(dso: Dso, locator: DsoLocator) -> DsoSymbols:
    build_id = dso.build_id
    if not build_id and os.path.isfile(dso.name):
        image = ElfImage.open(locator.join(dso.name))
        if image is not None:
            build_id = image.build_id()
            image.close()
    syms: ElfImage | None = None
    runtime: ElfImage | None = None
    opened: list[ElfImage] = []
    probe = Dso(dso.name, dso.kind, dso.identity, build_id)
    try:
        for path in locator.symbol_candidates(probe):
            if not os.path.isfile(path):
                continue
            image = ElfImage.open(path)
            if image is None:
                continue
            opened.append(image)
            if build_id and image.build_id() != build_id:
                continue  # perf rejects a file whose build-id is not the recorded one
            used = False
            if syms is None and image.symtab() is not None:
                syms = image
                used = True
            if runtime is None and image.dynsym() is not None:
                runtime = image
                used = True
            if used and syms is not None and runtime is not None:
                break
        if syms is None and runtime is None:
            return DsoSymbols.empty()
        if syms is None:
            syms = runtime
        if runtime is None:
            runtime = syms
        assert syms is not None and runtime is not None
        passes: list[_Pass] = []
        count = 0
        failed = False
        table = syms.symtab()
        if table is not None:
            p = _symbol_pass(syms, runtime, table, PASS_SYMTAB)
            passes.append(p)
            count += len(p.names)
            failed = p.failed
        table = syms.dynsym()
        if table is not None and not failed:
            p = _symbol_pass(syms, runtime, table, PASS_DYNSYM)
            passes.append(p)
            count += len(p.names)
            failed = p.failed
        if count > 0 and not failed:
            plt = _plt_pass(runtime)
            if plt is not None:
                passes.append(plt)
        return _flatten(passes)
    finally:
        for image in opened:
            image.close()


def perf_map_symbols(path: str) -> DsoSymbols:
    """``dso__load_perf_map``: a JIT map's ``START SIZE NAME`` lines, as perf reads them
    (each line loses its last character, its newline; the numbers are read as
    ``strtoull`` reads them, each followed by one separator; the name is the rest)."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError:
        return DsoSymbols.empty()
    starts, ends, names = [], [], []
    lines = text.split(b"\n")
    for k, raw in enumerate(lines):
        if k == len(lines) - 1:
            if not raw:
                break
            raw = raw[:-1]  # no newline: perf drops its last character anyway
        n = len(raw)
        start, used = _strtoull16(raw, 0)
        pos = used + 1
        if pos + 2 >= n:
            continue
        size, used = _strtoull16(raw, pos)
        pos += used + 1
        if pos + 2 >= n:
            continue
        starts.append(start)
        ends.append((start + size) & _MASK64 if size else start)
        names.append(raw[pos:].decode("utf-8", "surrogateescape"))
    p = _Pass(
        np.array(starts, dtype=np.uint64),
        np.array(ends, dtype=np.uint64),
        np.full(len(starts), 1, dtype=np.uint8),
        names,
        PASS_PLAIN,
    )
    return _flatten([p])


_MASK64: Final = (1 << 64) - 1
_SPACE: Final = frozenset(b" \t\n\v\f\r")


def _hex_digit(c: int) -> int:
    if 48 <= c <= 57:
        return c - 48
    c |= 32
    return c - 87 if 97 <= c <= 102 else -1


def _strtoull16(line: bytes, at: int) -> tuple[int, int]:
    """C's ``strtoull(line + at, &end, 16)``: the value and how many bytes it read."""
    n = len(line)
    pos = at
    while pos < n and line[pos] in _SPACE:
        pos += 1
    negative = False
    if pos < n and line[pos] in b"+-":
        negative = line[pos] == 45
        pos += 1
    hex_prefix = pos + 1 < n and line[pos] == 48 and line[pos + 1] | 32 == 120
    if hex_prefix and pos + 2 < n and _hex_digit(line[pos + 2]) >= 0:
        pos += 2
    first = pos
    value = 0
    while pos < n and _hex_digit(line[pos]) >= 0:
        value = (value * 16 + _hex_digit(line[pos])) & _MASK64
        pos += 1
    if pos == first:
        return 0, 0  # no digits: nothing read
    return ((-value) & _MASK64 if negative else value), pos - at


def dso_symbols(dso: Dso, locator: DsoLocator) -> DsoSymbols:
    """The symbols perf finds in ``dso`` (none for memory that is not code)."""
    if dso.kind == "none":
        return DsoSymbols.empty()
    if dso.name.startswith("/tmp/perf-"):
        return perf_map_symbols(dso.name)
    try:
        return _elf_symbols(dso, locator)
    except (OSError, ValueError, IndexError) as e:
        log.debug("symbols of %s: %s", dso.name, e)
        return DsoSymbols.empty()
