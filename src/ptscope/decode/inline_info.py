"""Inlined functions from DWARF: which inlined body, if any, each code address is in.

:func:`read_inline_table` reads a binary's ``DW_TAG_inlined_subroutine`` entries (their
``DW_AT_low_pc``/``DW_AT_high_pc`` or ``DW_AT_ranges``, ``DW_AT_abstract_origin`` for the
name, ``DW_AT_call_file``/``DW_AT_call_line`` for the call site) and flattens them into
sorted, disjoint address runs, each mapped to its innermost inlined scope; a scope knows
the inlined scope it is inlined into (``parent``), so the chain of a run is its inline
stack, innermost first, up to the physical (out-of-line) function.

The reader is our own (chosen by measurement, ``bench/inline_dwarf.py``: pyelftools builds
an object per DIE and attribute, and elfutils' libdw, called through ctypes, pays a call
per DIE): it walks ``.debug_info`` with each abbreviation compiled into a plan to skip its
attributes, jumps over subtrees that cannot hold code (types, variables, parameters, call
sites) by their ``DW_AT_sibling``, decodes only the inlined subroutines and, at the end,
the names of the scopes that have code, following ``DW_AT_abstract_origin`` and
``DW_AT_specification`` (the linkage name preferred, demangled as perf does).

DWARF 2 to 5 (``.debug_ranges`` and ``.debug_rnglists``, ``DW_FORM_addrx``/``strx``/
``rnglistx`` with their bases), 32- and 64-bit DWARF, zlib-compressed sections
(``SHF_COMPRESSED``), a dwz ``.gnu_debugaltlink`` file for names. A binary without
``.debug_info`` is looked up in the system's separate debug files (by build-id, then by
``.gnu_debuglink``). Not read: split DWARF (``.dwo`` files), ``.debug_types``, zstd and
``.zdebug`` sections, 32-bit and big-endian ELF files (``ElfImage`` reads 64-bit
little-endian ones only). Ranges are cut to the executable sections: the DWARF of code the
linker dropped points at address 0 or a tombstone.

Results are cached on disk (``$XDG_CACHE_HOME/ptscope/inline/``, keyed by the build-id, or
by path, size and modification time without one); ``PTSCOPE_NO_INLINE_CACHE=1`` turns the
cache off.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import os
import struct
import tempfile
import zlib
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ptscope.decode.perf_symbols import SHT_NOBITS, ElfImage
from ptscope.demangle import perf_symbol_names

__all__ = ["InlineScope", "InlineTable", "read_inline_table"]

log = logging.getLogger("ptscope")

CACHE_VERSION: Final = 2
DEBUG_ROOT: Final = Path("/usr/lib/debug")
_SHF_COMPRESSED: Final = 0x800
_SHF_ALLOC_EXEC: Final = 0x2 | 0x4
_ADDR_MAX: Final = (1 << 64) - 1
_ELFCOMPRESS_ZLIB: Final = 1


@dataclass(frozen=True, slots=True)
class InlineScope:
    """One inlined instance (one ``DW_TAG_inlined_subroutine``)."""

    name: str
    """The inlined function's name, demangled (without parameters, as perf shows names)."""
    call_site: str
    """Where it is inlined: ``file:line`` (the file's base name)."""
    parent: int
    """The enclosing inlined scope's index, -1 when inlined into the physical function."""


@dataclass(frozen=True, slots=True, eq=False)
class InlineTable:
    """Sorted, disjoint runs ``[starts[i], ends[i])`` of link-time addresses, each in the
    inlined scope ``scopes[scope[i]]`` (its innermost one)."""

    scopes: tuple[InlineScope, ...]
    starts: npt.NDArray[np.uint64]
    ends: npt.NDArray[np.uint64]
    scope: npt.NDArray[np.int32]

    def scope_at(self, vaddr: int) -> int:
        """The innermost inlined scope at ``vaddr``, -1 where no inlined code is."""
        if not 0 <= vaddr <= _ADDR_MAX:
            return -1
        i = int(np.searchsorted(self.starts, np.uint64(vaddr), side="right")) - 1
        if i >= 0 and vaddr < int(self.ends[i]):
            return int(self.scope[i])
        return -1

    def chain(self, index: int) -> list[InlineScope]:
        """Scope ``index`` and the scopes it is inlined into, innermost first."""
        out = []
        while index >= 0:
            out.append(self.scopes[index])
            index = self.scopes[index].parent
        return out


def read_inline_table(path: str | os.PathLike[str]) -> InlineTable | None:
    """The inline table of the ELF file at ``path`` (cached on disk), None when it has no
    DWARF or no inlined code, or cannot be read (logged at debug level)."""
    try:
        return _read(Path(path))
    except Exception as e:  # a damaged file: the reader checks bounds only by raising
        log.debug("inline information of %s: %s", path, e)
        return None


# ------------------------------------------------------------------- the ELF side


class _Sections:
    """The DWARF sections of one ELF file, decompressed (read, not mapped: the reader
    holds each once, and the mapped pages would count twice)."""

    def __init__(self, image: ElfImage) -> None:
        self.image = image

    def get(self, name: str) -> bytes:
        s = self.image.section(name)
        if s is None or s.type == SHT_NOBITS:
            return b""
        with open(self.image.path, "rb") as f:
            raw = os.pread(f.fileno(), s.size, s.offset)
        if len(raw) != s.size:
            raise ValueError(f"{name}: past the end of the file")
        if s.flags & _SHF_COMPRESSED:
            if len(raw) < 24:
                raise ValueError(f"{name}: damaged compression header")
            kind, _, size = struct.unpack_from("<IIQ", raw)
            if kind != _ELFCOMPRESS_ZLIB:
                raise ValueError(f"{name}: compression {kind} is not zlib")
            raw = zlib.decompressobj().decompress(raw[24:], size + 1)  # (no more than said)
            if len(raw) != size:
                raise ValueError(f"{name}: decompressed to {len(raw)} bytes, not {size}")
        return raw

    def has(self, name: str) -> bool:
        s = self.image.section(name)
        return s is not None and s.type != SHT_NOBITS and s.size > 0


def _debug_image(image: ElfImage, path: Path) -> ElfImage | None:
    """The separate debug file of ``image`` (by build-id, then by ``.gnu_debuglink``)."""
    build_id = image.build_id()
    candidates: list[Path] = []
    if build_id and len(build_id) >= 2:
        hexid = build_id.hex()
        candidates.append(DEBUG_ROOT / ".build-id" / hexid[:2] / f"{hexid[2:]}.debug")
    link = image.section(".gnu_debuglink")
    crc: int | None = None
    if link is not None:
        raw = image.section_bytes(link)
        end = raw.find(b"\0")
        if end > 0:
            name = os.fsdecode(raw[:end])
            at = (end + 4) // 4 * 4
            if at + 4 <= len(raw):
                crc = int.from_bytes(raw[at : at + 4], "little")
            real = path.resolve().parent
            candidates += [
                real / name,
                real / ".debug" / name,
                DEBUG_ROOT / real.relative_to(real.anchor) / name,
            ]
    for i, candidate in enumerate(candidates):
        try:
            if not candidate.is_file() or candidate.resolve() == path.resolve():
                continue
        except OSError:
            continue
        other = ElfImage.open(str(candidate))
        if other is None:
            continue
        is_debuglink = i > 0 or not build_id
        if build_id and other.build_id() not in (None, build_id):
            other.close()
            continue
        if is_debuglink and crc is not None and not other.build_id() and _crc(candidate) != crc:
            other.close()
            continue
        if _Sections(other).has(".debug_info"):
            return other
        other.close()
    return None


def _crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _alt_image(image: ElfImage, path: Path) -> ElfImage | None:
    """The dwz common file a ``.gnu_debugaltlink`` names (for names in it); ``path``: the
    file ``image`` is (a relative name is relative to it)."""
    link = image.section(".gnu_debugaltlink")
    if link is None:
        return None
    raw = image.section_bytes(link)
    end = raw.find(b"\0")
    if end <= 0:
        return None
    name = Path(os.fsdecode(raw[:end]))
    build_id = raw[end + 1 :]
    candidates = [name] if name.is_absolute() else [path.resolve().parent / name]
    if build_id:
        hexid = build_id.hex()
        candidates.append(DEBUG_ROOT / ".build-id" / hexid[:2] / f"{hexid[2:]}.debug")
    for candidate in candidates:
        if candidate.is_file():
            other = ElfImage.open(str(candidate))
            if other is None:
                continue
            if build_id and other.build_id() not in (None, build_id):
                other.close()  # (another build's common file)
                continue
            return other
    return None


# ------------------------------------------------------------------- DWARF constants

# Tags
_TAG_INLINED: Final = 0x1D
_TAG_STRUCTURE: Final = 0x13
_TAG_CLASS: Final = 0x02
_TAG_UNION: Final = 0x17
_TYPE_TAGS: Final = frozenset({_TAG_STRUCTURE, _TAG_CLASS, _TAG_UNION})
_NO_CODE_TAGS: Final = frozenset(
    {
        0x01, 0x04, 0x05, 0x08, 0x0A, 0x0D, 0x0F, 0x10, 0x12, 0x15, 0x16, 0x18, 0x1C, 0x1F,
        0x20, 0x21, 0x24, 0x26, 0x27, 0x28, 0x2F, 0x30, 0x34, 0x35, 0x36, 0x37, 0x3A, 0x3B,
        0x42, 0x47, 0x48, 0x49, 0x4107, 0x4108, 0x4109, 0x410A,
    }
)  # fmt: skip
"""Tags whose subtrees hold no code: array, enumeration, formal parameter, imported
declaration, label, member, pointer, reference, string, subroutine type, typedef,
unspecified parameters, inheritance, pointer to member, set, subrange, base type, const,
constant, enumerator, template parameters, variable, volatile, DWARF procedure, restrict,
imported module, unspecified type, rvalue reference, atomic, call sites and their
parameters, GNU parameter packs."""
_C_LANGUAGES: Final = frozenset(
    {0x01, 0x02, 0x04, 0x0C, 0x10, 0x11, 0x19, 0x1A, 0x1D, 0x21, 0x2A, 0x2B, 0x2C}
)
"""C, C++ and Objective-C: their compilers never put code in a structure's subtree."""
_CXX_LANGUAGES: Final = frozenset({0x04, 0x11, 0x19, 0x1A, 0x21, 0x2A, 0x2B})

# Attributes
_AT_SIBLING: Final = 0x01
_AT_NAME: Final = 0x03
_AT_STMT_LIST: Final = 0x10
_AT_LOW_PC: Final = 0x11
_AT_HIGH_PC: Final = 0x12
_AT_LANGUAGE: Final = 0x13
_AT_ABSTRACT_ORIGIN: Final = 0x31
_AT_SPECIFICATION: Final = 0x47
_AT_RANGES: Final = 0x55
_AT_CALL_FILE: Final = 0x58
_AT_CALL_LINE: Final = 0x59
_AT_LINKAGE_NAME: Final = 0x6E
_AT_STR_OFFSETS_BASE: Final = 0x72
_AT_ADDR_BASE: Final = 0x73
_AT_RNGLISTS_BASE: Final = 0x74
_AT_MIPS_LINKAGE_NAME: Final = 0x2007
_AT_GNU_ADDR_BASE: Final = 0x2133
_AT_GNU_RANGES_BASE: Final = 0x2132

# Forms
_F_ADDR: Final = 0x01
_F_BLOCK2: Final = 0x03
_F_BLOCK4: Final = 0x04
_F_DATA2: Final = 0x05
_F_DATA4: Final = 0x06
_F_DATA8: Final = 0x07
_F_STRING: Final = 0x08
_F_BLOCK: Final = 0x09
_F_BLOCK1: Final = 0x0A
_F_DATA1: Final = 0x0B
_F_FLAG: Final = 0x0C
_F_SDATA: Final = 0x0D
_F_STRP: Final = 0x0E
_F_UDATA: Final = 0x0F
_F_REF_ADDR: Final = 0x10
_F_REF1: Final = 0x11
_F_REF2: Final = 0x12
_F_REF4: Final = 0x13
_F_REF8: Final = 0x14
_F_REF_UDATA: Final = 0x15
_F_INDIRECT: Final = 0x16
_F_SEC_OFFSET: Final = 0x17
_F_EXPRLOC: Final = 0x18
_F_FLAG_PRESENT: Final = 0x19
_F_STRX: Final = 0x1A
_F_ADDRX: Final = 0x1B
_F_REF_SUP4: Final = 0x1C
_F_STRP_SUP: Final = 0x1D
_F_DATA16: Final = 0x1E
_F_LINE_STRP: Final = 0x1F
_F_REF_SIG8: Final = 0x20
_F_IMPLICIT_CONST: Final = 0x21
_F_LOCLISTX: Final = 0x22
_F_RNGLISTX: Final = 0x23
_F_REF_SUP8: Final = 0x24
_F_STRX1: Final = 0x25
_F_STRX4: Final = 0x28
_F_ADDRX1: Final = 0x29
_F_ADDRX4: Final = 0x2C
_F_GNU_ADDR_INDEX: Final = 0x1F01
_F_GNU_STR_INDEX: Final = 0x1F02
_F_GNU_REF_ALT: Final = 0x1F20
_F_GNU_STRP_ALT: Final = 0x1F21

_FIXED_SIZE: Final = {
    _F_DATA1: 1, _F_DATA2: 2, _F_DATA4: 4, _F_DATA8: 8, _F_FLAG: 1, _F_REF1: 1, _F_REF2: 2,
    _F_REF4: 4, _F_REF8: 8, _F_FLAG_PRESENT: 0, _F_REF_SUP4: 4, _F_DATA16: 16,
    _F_REF_SIG8: 8, _F_IMPLICIT_CONST: 0, _F_REF_SUP8: 8, 0x25: 1, 0x26: 2, 0x27: 3, 0x28: 4,
    0x29: 1, 0x2A: 2, 0x2B: 3, 0x2C: 4,
}  # fmt: skip
_OFFSET_FORMS: Final = frozenset(
    {_F_STRP, _F_SEC_OFFSET, _F_STRP_SUP, _F_LINE_STRP, _F_GNU_REF_ALT, _F_GNU_STRP_ALT}
)
_LEB_FORMS: Final = frozenset(
    {_F_SDATA, _F_UDATA, _F_REF_UDATA, _F_STRX, _F_ADDRX, _F_LOCLISTX, _F_RNGLISTX,
     _F_GNU_ADDR_INDEX, _F_GNU_STR_INDEX}
)  # fmt: skip
_CU_REF_FORMS: Final = frozenset({_F_REF1, _F_REF2, _F_REF4, _F_REF8, _F_REF_UDATA})
_ADDRX_FORMS: Final = frozenset({_F_ADDRX, _F_GNU_ADDR_INDEX, 0x29, 0x2A, 0x2B, 0x2C})
_STRX_FORMS: Final = frozenset({_F_STRX, _F_GNU_STR_INDEX, 0x25, 0x26, 0x27, 0x28})
_CONST_FORMS: Final = frozenset(
    {_F_DATA1, _F_DATA2, _F_DATA4, _F_DATA8, _F_UDATA, _F_SDATA, _F_IMPLICIT_CONST}
)

# Skip-plan steps (a non-negative step skips that many bytes)
_S_LEB: Final = -1
_S_STRING: Final = -2
_S_BLOCK1: Final = -3
_S_BLOCK2: Final = -4
_S_BLOCK4: Final = -5
_S_BLOCK: Final = -6
_S_INDIRECT: Final = -7

_INLINE_ATTRS: Final = frozenset(
    {_AT_ABSTRACT_ORIGIN, _AT_LOW_PC, _AT_HIGH_PC, _AT_RANGES, _AT_CALL_FILE, _AT_CALL_LINE}
)
"""What the reader needs of an inlined subroutine."""

# What the walker does with a DIE
_DO_WALK: Final = 0  # skip its attributes, walk its children
_DO_JUMP: Final = 1  # no code below: jump over its subtree
_DO_INLINE: Final = 2  # an inlined subroutine: decode it


def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    b = data[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    shift = 7
    pos += 1
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _sleb(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            if b & 0x40:
                result -= 1 << shift
            return result, pos


def _skip_leb(data: bytes, pos: int) -> int:
    while data[pos] & 0x80:
        pos += 1
    return pos + 1


# ------------------------------------------------------------------- abbreviations


@dataclass(slots=True)
class _Abbrev:
    tag: int
    children: bool
    attrs: list[tuple[int, int, int]]
    """(attribute, form, implicit constant)."""
    plan: tuple[int, ...]
    """Steps that skip the attributes."""
    fixed: int
    """The attributes' size when every step is fixed, else -1."""
    action: int = _DO_WALK
    sibling_at: int = -1
    """Where DW_AT_sibling's value is (from the attributes' start), when known."""
    sibling_form: int = 0
    picks: tuple[tuple[int, int, int, int], ...] | None = None
    """For an inlined subroutine: (attribute, form, constant, offset) of the attributes
    the reader needs, when their offsets are known (else None: decode them all)."""
    fast: _Fast | None = None
    """For an inlined subroutine whose needed attributes have the common forms: how to
    read them all with one ``struct`` call."""
    offsets: tuple[int, ...] | None = None
    """Each attribute's offset from the attributes' start (-1 past a variable-size one),
    made when first asked for (``_Dwarf.pick``)."""


@dataclass(frozen=True, slots=True)
class _Fast:
    """The needed attributes of an inlined subroutine read by ``layout`` (their values
    followed by ``consts``, the implicit constants); ``slots``: where the abstract origin,
    low pc, high pc, ranges, call file and call line are in that (-1: absent)."""

    layout: struct.Struct
    consts: tuple[int, ...]
    slots: tuple[int, int, int, int, int, int]
    origin_in_unit: bool
    """The origin is a reference within the unit (else an offset in .debug_info)."""
    high_is_size: bool


_STRUCT_CODES: Final = {1: "B", 2: "H", 4: "I", 8: "Q"}
_FAST_FORMS: Final = (
    frozenset({_F_REF1, _F_REF2, _F_REF4, _F_REF8, _F_REF_ADDR}),  # abstract origin
    frozenset({_F_ADDR}),  # low pc
    frozenset({_F_ADDR, _F_DATA1, _F_DATA2, _F_DATA4, _F_DATA8, _F_IMPLICIT_CONST}),
    frozenset({_F_SEC_OFFSET, _F_DATA4}),  # ranges
    frozenset({_F_DATA1, _F_DATA2, _F_DATA4, _F_DATA8, _F_IMPLICIT_CONST}),  # call file
    frozenset({_F_DATA1, _F_DATA2, _F_DATA4, _F_DATA8, _F_IMPLICIT_CONST}),  # call line
)
_FAST_ATTRS: Final = (
    _AT_ABSTRACT_ORIGIN, _AT_LOW_PC, _AT_HIGH_PC, _AT_RANGES, _AT_CALL_FILE, _AT_CALL_LINE
)  # fmt: skip


def _fast_layout(
    picks: tuple[tuple[int, int, int, int], ...] | None,
    version: int,
    offset_size: int,
    addr_size: int,
) -> _Fast | None:
    if picks is None:
        return None
    by_attr = {attr: (form, const, at) for attr, form, const, at in picks}
    fmt = ["<"]
    at = 0
    count = 0
    consts: list[int] = []
    slots = [-1] * 6
    fields = []
    for k, attr in enumerate(_FAST_ATTRS):
        if attr not in by_attr:
            continue
        form, const, offset = by_attr[attr]
        if form not in _FAST_FORMS[k]:
            return None
        if form == _F_IMPLICIT_CONST:
            slots[k] = -2 - len(consts)
            consts.append(const)
            continue
        size = _form_size(form, version, offset_size, addr_size)
        if size not in _STRUCT_CODES:
            return None
        fields.append((offset, size, k))
    for offset, size, k in sorted(fields):
        if offset < at:
            return None
        fmt.append("x" * (offset - at) + _STRUCT_CODES[size])
        at = offset + size
        slots[k] = count
        count += 1
    slots = [count + (-2 - v) if v <= -2 else v for v in slots]
    origin = by_attr.get(_AT_ABSTRACT_ORIGIN)
    high = by_attr.get(_AT_HIGH_PC)
    return _Fast(
        struct.Struct("".join(fmt)),
        tuple(consts),
        (slots[0], slots[1], slots[2], slots[3], slots[4], slots[5]),
        origin is None or origin[0] != _F_REF_ADDR,
        high is not None and high[0] != _F_ADDR,
    )


def _form_size(form: int, version: int, offset_size: int, addr_size: int) -> int:
    """The size of a form's value, or a skip step (negative) for a variable one."""
    fixed = _FIXED_SIZE.get(form)
    if fixed is not None:
        return fixed
    if form == _F_ADDR:
        return addr_size
    if form in _OFFSET_FORMS:
        return offset_size
    if form == _F_REF_ADDR:
        return addr_size if version <= 2 else offset_size
    if form in _LEB_FORMS:
        return _S_LEB
    return {
        _F_STRING: _S_STRING, _F_BLOCK1: _S_BLOCK1, _F_BLOCK2: _S_BLOCK2,
        _F_BLOCK4: _S_BLOCK4, _F_BLOCK: _S_BLOCK, _F_EXPRLOC: _S_BLOCK,
        _F_INDIRECT: _S_INDIRECT,
    }[form]  # fmt: skip


def _parse_abbrevs(
    data: bytes,
    offset: int,
    version: int,
    offset_size: int,
    addr_size: int,
    c_like: bool,
    shared: dict[tuple[bytes, int, int, int, bool], _Abbrev],
) -> dict[int, _Abbrev]:
    """The abbreviation table at ``offset``. Units compiled apart have tables of their own
    that mostly repeat each other's entries: an entry's bytes seen before (``shared``) give
    the abbreviation made for them then."""
    table: dict[int, _Abbrev] = {}
    pos = offset
    while True:
        code, pos = _uleb(data, pos)
        if code == 0:
            return table
        start = pos
        while data[pos] & 0x80:  # the tag
            pos += 1
        pos += 2  # and the children flag
        end = data.find(b"\0\0", pos)  # the (0, 0) pair that closes the attributes...
        if end < 0:
            raise ValueError("unterminated abbreviation")
        if _F_IMPLICIT_CONST in data[pos:end]:  # ...unless a constant's zero byte is first
            end = _abbrev_end(data, pos)
        key = (data[start : end + 2], version, offset_size, addr_size, c_like)
        ab = shared.get(key)
        if ab is None:
            ab = shared[key] = _make_abbrev(data, start, version, offset_size, addr_size, c_like)
        table[code] = ab
        pos = end + 2


def _one_abbrev(data: bytes, unit: _Unit, code: int) -> _Abbrev:
    """Abbreviation ``code`` of the unit's table (for its unit DIE, before the table is
    read: which way the table is read depends on the unit's language)."""
    pos = unit.abbrev_offset
    while True:
        at, pos = _uleb(data, pos)
        if at == 0:
            raise ValueError(f"unit at {unit.offset:#x}: no abbreviation {code}")
        if at == code:
            return _make_abbrev(data, pos, unit.version, unit.offset_size, unit.addr_size, False)
        while data[pos] & 0x80:
            pos += 1
        pos = _abbrev_end(data, pos + 2) + 2


def _abbrev_end(data: bytes, pos: int) -> int:
    """Where the (0, 0) pair closing an abbreviation's attributes is (``pos``: the first)."""
    while True:
        at = pos
        attr, pos = _uleb(data, pos)
        form, pos = _uleb(data, pos)
        if attr == 0 and form == 0:
            return at
        if form == _F_IMPLICIT_CONST:
            _, pos = _sleb(data, pos)


def _make_abbrev(
    data: bytes, pos: int, version: int, offset_size: int, addr_size: int, c_like: bool
) -> _Abbrev:
    tag, pos = _uleb(data, pos)
    children = data[pos] != 0
    pos += 1
    attrs: list[tuple[int, int, int]] = []
    while True:
        attr, pos = _uleb(data, pos)
        form, pos = _uleb(data, pos)
        if attr == 0 and form == 0:
            break
        const = 0
        if form == _F_IMPLICIT_CONST:
            const, pos = _sleb(data, pos)
        attrs.append((attr, form, const))
    plan: list[int] = []
    at = 0  # known offset of the next attribute, -1 once unknown
    sibling_at = -1
    sibling_form = 0
    picks: list[tuple[int, int, int, int]] | None = []
    for attr, form, const in attrs:
        step = _form_size(form, version, offset_size, addr_size)
        if attr == _AT_SIBLING and at >= 0 and form in _CU_REF_FORMS | {_F_REF_ADDR}:
            sibling_at, sibling_form = at, form
        if attr in _INLINE_ATTRS and picks is not None:
            picks = [*picks, (attr, form, const, at)] if at >= 0 else None
        if step >= 0:
            if plan and plan[-1] >= 0:
                plan[-1] += step
            else:
                plan.append(step)
            if at >= 0:
                at += step
        else:
            plan.append(step)
            at = -1
    if _S_INDIRECT in plan:  # a form named in the DIE: decode it all
        plan = [_S_INDIRECT]
    fixed = plan[0] if len(plan) == 1 and plan[0] >= 0 else (0 if not plan else -1)
    ab = _Abbrev(tag, children, attrs, tuple(plan), fixed, _DO_WALK, sibling_at, sibling_form)
    if tag == _TAG_INLINED:
        ab.action = _DO_INLINE
        ab.picks = tuple(picks) if picks is not None else None
        ab.fast = _fast_layout(ab.picks, version, offset_size, addr_size)
    elif children and (tag in _NO_CODE_TAGS or (c_like and tag in _TYPE_TAGS)):
        ab.action = _DO_JUMP
    return ab


# ------------------------------------------------------------------- units


@dataclass(slots=True)
class _Unit:
    offset: int
    """The unit header's offset in .debug_info."""
    end: int
    die_offset: int
    version: int
    offset_size: int
    addr_size: int
    abbrev_offset: int
    abbrevs: dict[int, _Abbrev] = field(default_factory=dict)
    base: int = 0
    addr_base: int = 8
    str_offsets_base: int = 8
    rnglists_base: int = -1
    stmt_list: int = -1
    c_like: bool = False
    cxx: bool = False
    files: list[str] | None = None


_Attrs = dict[int, tuple[int, Any]]
"""attribute -> (form, value) of one DIE."""


class _Dwarf:
    """The DWARF of one file: its sections, its units, and the decoding of values."""

    def __init__(self, sections: _Sections, alt: _Dwarf | None = None) -> None:
        self.info = sections.get(".debug_info")
        self.abbrev = sections.get(".debug_abbrev")
        self.str = sections.get(".debug_str")
        self.line_str = sections.get(".debug_line_str")
        self._sections = sections
        self._lazy: dict[str, bytes] = {}
        self.alt = alt
        self.units: list[_Unit] = []
        self._unit_starts: list[int] = []
        self.names: dict[int, _Name] = {}
        """DIE offset -> the name found there (``_die_name``)."""
        self._abbrev_cache: dict[tuple[int, int, int, int, bool], dict[int, _Abbrev]] = {}
        self._shared_abbrevs: dict[tuple[bytes, int, int, int, bool], _Abbrev] = {}
        self._read_units()

    def section(self, name: str) -> bytes:
        data = self._lazy.get(name)
        if data is None:
            data = self._lazy[name] = self._sections.get(name)
        return data

    def _read_units(self) -> None:
        data = self.info
        pos = 0
        while pos + 11 <= len(data):
            start = pos
            length = int.from_bytes(data[pos : pos + 4], "little")
            pos += 4
            offset_size = 4
            if length == 0xFFFFFFFF:
                length = int.from_bytes(data[pos : pos + 8], "little")
                pos += 8
                offset_size = 8
            elif length >= 0xFFFFFFF0:
                raise ValueError(f"unit at {start:#x}: reserved length {length:#x}")
            end = pos + length
            if end > len(data):
                raise ValueError(f"unit at {start:#x} runs past .debug_info")
            version = int.from_bytes(data[pos : pos + 2], "little")
            pos += 2
            unit_type = 1
            if version >= 5:
                unit_type = data[pos]
                addr_size = data[pos + 1]
                abbrev_offset = int.from_bytes(data[pos + 2 : pos + 2 + offset_size], "little")
                pos += 2 + offset_size
                if unit_type in (2, 6):  # type units: a signature and a type offset
                    pos += 8 + offset_size
                elif unit_type in (4, 5):  # skeleton and split units: a DWO id
                    pos += 8
            elif version >= 2:
                abbrev_offset = int.from_bytes(data[pos : pos + offset_size], "little")
                addr_size = data[pos + offset_size]
                pos += offset_size + 1
            else:
                raise ValueError(f"unit at {start:#x}: DWARF version {version}")
            unit = _Unit(start, end, pos, version, offset_size, addr_size, abbrev_offset)
            if unit_type in (1, 3):  # compile and partial units (others hold no code)
                self.units.append(unit)
                self._unit_starts.append(start)
            pos = end

    def abbrevs_for(self, unit: _Unit) -> dict[int, _Abbrev]:
        key = (unit.abbrev_offset, unit.version, unit.offset_size, unit.addr_size, unit.c_like)
        table = self._abbrev_cache.get(key)
        if table is None:
            table = _parse_abbrevs(self.abbrev, *key, self._shared_abbrevs)
            self._abbrev_cache[key] = table
        return table

    def unit_at(self, offset: int) -> _Unit:
        i = bisect_right(self._unit_starts, offset) - 1
        if i < 0 or offset >= self.units[i].end:
            raise ValueError(f"no unit holds DIE {offset:#x}")
        return self.units[i]

    # ---------------------------------------------------------------- values

    def value(self, unit: _Unit, form: int, const: int, pos: int) -> tuple[Any, int]:
        """The value of an attribute of ``form`` at ``pos`` and the position after it: an
        int for constants, references (made absolute in .debug_info), offsets and
        indexes, bytes for strings found in place, None for blocks."""
        data = self.info
        if form in _FIXED_SIZE:
            size = _FIXED_SIZE[form]
            raw = int.from_bytes(data[pos : pos + size], "little")
            if form in _CU_REF_FORMS:
                raw += unit.offset
            elif form == _F_IMPLICIT_CONST:
                raw = const
            return raw, pos + size
        if form in _OFFSET_FORMS:
            size = unit.offset_size
            return int.from_bytes(data[pos : pos + size], "little"), pos + size
        if form == _F_ADDR:
            size = unit.addr_size
            return int.from_bytes(data[pos : pos + size], "little"), pos + size
        if form == _F_REF_ADDR:
            size = unit.addr_size if unit.version <= 2 else unit.offset_size
            return int.from_bytes(data[pos : pos + size], "little"), pos + size
        if form == _F_SDATA:
            return _sleb(data, pos)
        if form in _LEB_FORMS:
            raw, pos = _uleb(data, pos)
            return (raw + unit.offset if form == _F_REF_UDATA else raw), pos
        if form == _F_STRING:
            end = data.index(0, pos)
            return data[pos:end], end + 1
        if form == _F_INDIRECT:
            real, pos = _uleb(data, pos)
            return self.value(unit, real, 0, pos)
        if form == _F_BLOCK1:
            return None, pos + 1 + data[pos]
        if form == _F_BLOCK2:
            return None, pos + 2 + int.from_bytes(data[pos : pos + 2], "little")
        if form == _F_BLOCK4:
            return None, pos + 4 + int.from_bytes(data[pos : pos + 4], "little")
        if form in (_F_BLOCK, _F_EXPRLOC):
            n, pos = _uleb(data, pos)
            return None, pos + n
        raise ValueError(f"unknown form {form:#x}")

    def skip(self, unit: _Unit, ab: _Abbrev, pos: int) -> int:
        """The position past a DIE's attributes (``pos``: where they start)."""
        if ab.fixed >= 0:
            return pos + ab.fixed
        data = self.info
        for step in ab.plan:
            if step >= 0:
                pos += step
            elif step == _S_LEB:
                pos = _skip_leb(data, pos)
            elif step == _S_STRING:
                pos = data.index(0, pos) + 1
            elif step == _S_BLOCK:
                n, pos = _uleb(data, pos)
                pos += n
            elif step == _S_BLOCK1:
                pos += 1 + data[pos]
            elif step == _S_BLOCK2:
                pos += 2 + int.from_bytes(data[pos : pos + 2], "little")
            elif step == _S_BLOCK4:
                pos += 4 + int.from_bytes(data[pos : pos + 4], "little")
            else:  # forms named in the DIE (the plan's only step)
                _, pos = self.attrs(unit, ab, pos)
        return pos

    def pick(self, unit: _Unit, ab: _Abbrev, pos: int, wanted: frozenset[int]) -> _Attrs:
        """The attributes in ``wanted`` of the DIE whose attributes start at ``pos``."""
        offsets = ab.offsets
        if offsets is None:
            at = 0
            found = []
            for _, form, _ in ab.attrs:
                found.append(at)
                step = _form_size(form, unit.version, unit.offset_size, unit.addr_size)
                at = at + step if at >= 0 and step >= 0 else -1
            offsets = ab.offsets = tuple(found)
        out: _Attrs = {}
        for (attr, form, const), at in zip(ab.attrs, offsets, strict=True):
            if attr in wanted:
                if at < 0:
                    attrs, _ = self.attrs(unit, ab, pos)
                    return {k: v for k, v in attrs.items() if k in wanted}
                out[attr] = (form, self.value(unit, form, const, pos + at)[0])
        return out

    def attrs(self, unit: _Unit, ab: _Abbrev, pos: int) -> tuple[_Attrs, int]:
        out: _Attrs = {}
        for attr, form, const in ab.attrs:
            if form == _F_INDIRECT:
                form, pos = _uleb(self.info, pos)
            val, pos = self.value(unit, form, const, pos)
            out[attr] = (form, val)
        return out, pos

    def string(self, unit: _Unit, form: int, val: Any) -> bytes | None:
        if form == _F_STRING:
            return bytes(val)
        if form == _F_STRP:
            return _cstring(self.str, val)
        if form == _F_LINE_STRP:
            return _cstring(self.line_str, val)
        if form in _STRX_FORMS:
            table = self.section(".debug_str_offsets")
            at = unit.str_offsets_base + val * unit.offset_size
            off = int.from_bytes(table[at : at + unit.offset_size], "little")
            return _cstring(self.str, off)
        if form in (_F_GNU_STRP_ALT, _F_STRP_SUP) and self.alt is not None:
            return _cstring(self.alt.str, val)
        return None

    def address(self, unit: _Unit, form: int, val: int) -> int:
        if form in _ADDRX_FORMS:
            table = self.section(".debug_addr")
            at = unit.addr_base + val * unit.addr_size
            if at + unit.addr_size > len(table):
                raise ValueError(f"address index {val} past .debug_addr")
            return int.from_bytes(table[at : at + unit.addr_size], "little")
        return val

    def ranges(self, unit: _Unit, form: int, val: int) -> list[tuple[int, int]]:
        """The address ranges a DW_AT_ranges value names."""
        if unit.version >= 5:
            table = self.section(".debug_rnglists")
            if form == _F_RNGLISTX:
                # without DW_AT_rnglists_base: the first table's, past its header
                base = unit.rnglists_base
                if base < 0:
                    base = 12 if unit.offset_size == 4 else 20
                at = base + val * unit.offset_size
                val = base + int.from_bytes(table[at : at + unit.offset_size], "little")
            return _rnglist(self, unit, table, val)
        return _debug_ranges(self.section(".debug_ranges"), val, unit.base, unit.addr_size)

    def files(self, unit: _Unit) -> list[str]:
        """The base names of the unit's line-program files, by DW_AT_call_file index."""
        if unit.files is None:
            unit.files = []
            if unit.stmt_list >= 0:
                try:
                    unit.files = _line_files(
                        self, unit, self.section(".debug_line"), unit.stmt_list
                    )
                except (ValueError, IndexError, KeyError) as e:
                    log.debug("line program at %#x: %s", unit.stmt_list, e)
        return unit.files


def _cstring(data: bytes, at: int) -> bytes:
    end = data.index(0, at)
    return data[at:end]


def _debug_ranges(table: bytes, at: int, base: int, addr_size: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    top = (1 << (8 * addr_size)) - 1
    while True:
        if at + 2 * addr_size > len(table):
            raise ValueError("range list past .debug_ranges")
        lo = int.from_bytes(table[at : at + addr_size], "little")
        hi = int.from_bytes(table[at + addr_size : at + 2 * addr_size], "little")
        at += 2 * addr_size
        if lo == 0 and hi == 0:
            return out
        if lo == top:
            base = hi
            continue
        out.append((base + lo, base + hi))


def _rnglist(dw: _Dwarf, unit: _Unit, table: bytes, at: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    base = unit.base
    size = unit.addr_size
    while True:
        kind = table[at]
        at += 1
        if kind == 0:  # DW_RLE_end_of_list
            return out
        if kind == 1:  # base_addressx
            i, at = _uleb(table, at)
            base = dw.address(unit, _F_ADDRX, i)
        elif kind == 2:  # startx_endx
            i, at = _uleb(table, at)
            j, at = _uleb(table, at)
            out.append((dw.address(unit, _F_ADDRX, i), dw.address(unit, _F_ADDRX, j)))
        elif kind == 3:  # startx_length
            i, at = _uleb(table, at)
            n, at = _uleb(table, at)
            lo = dw.address(unit, _F_ADDRX, i)
            out.append((lo, lo + n))
        elif kind == 4:  # offset_pair
            lo, at = _uleb(table, at)
            hi, at = _uleb(table, at)
            out.append((base + lo, base + hi))
        elif kind == 5:  # base_address
            base = int.from_bytes(table[at : at + size], "little")
            at += size
        elif kind == 6:  # start_end
            lo = int.from_bytes(table[at : at + size], "little")
            hi = int.from_bytes(table[at + size : at + 2 * size], "little")
            at += 2 * size
            out.append((lo, hi))
        elif kind == 7:  # start_length
            lo = int.from_bytes(table[at : at + size], "little")
            n, at = _uleb(table, at + size)
            out.append((lo, lo + n))
        else:
            raise ValueError(f"range list entry kind {kind}")


def _base_name(raw: bytes) -> str:
    name = raw.decode("utf-8", "replace")
    return name.rsplit("/", 1)[-1] or name


def _line_files(dw: _Dwarf, unit: _Unit, data: bytes, at: int) -> list[str]:
    """The line program header's file names (base names), in DW_AT_call_file order:
    DWARF 5 numbers them from 0, earlier versions from 1 (index 0 is then unused)."""
    length = int.from_bytes(data[at : at + 4], "little")
    offset_size = 4
    pos = at + 4
    if length == 0xFFFFFFFF:
        pos += 8
        offset_size = 8
    version = int.from_bytes(data[pos : pos + 2], "little")
    pos += 2
    if version >= 5:
        pos += 2  # address size, segment selector size
    header_length = int.from_bytes(data[pos : pos + offset_size], "little")
    pos += offset_size
    program = pos + header_length
    pos += 1  # minimum_instruction_length
    if version >= 4:
        pos += 1  # maximum_operations_per_instruction
    pos += 3  # default_is_stmt, line_base, line_range
    opcode_base = data[pos]
    pos += 1 + max(opcode_base - 1, 0)
    if version < 5:
        while data[pos] != 0:  # include_directories
            pos = data.index(0, pos) + 1
        pos += 1
        files = ["?"]
        while data[pos] != 0 and pos < program:
            end = data.index(0, pos)
            files.append(_base_name(data[pos:end]))
            pos = end + 1
            for _ in range(3):  # directory index, modification time, length
                pos = _skip_leb(data, pos)
        return files
    # DWARF 5: directories then files, each described by (content type, form) pairs
    lines_unit = _Unit(unit.offset, unit.end, 0, version, offset_size, unit.addr_size, 0)
    lines_unit.str_offsets_base = unit.str_offsets_base
    names: list[str] = []
    for is_files in (False, True):
        count = data[pos]
        pos += 1
        formats = []
        for _ in range(count):
            kind, pos = _uleb(data, pos)
            form, pos = _uleb(data, pos)
            formats.append((kind, form))
        entries, pos = _uleb(data, pos)
        if entries > len(data) - pos:
            raise ValueError(f"line header at {at:#x}: {entries} entries")
        for _ in range(entries):
            name = b"?"
            for kind, form in formats:
                val, pos = _line_value(dw, lines_unit, data, form, pos)
                if kind == 1 and is_files:  # DW_LNCT_path
                    s = dw.string(lines_unit, form, val) if not isinstance(val, bytes) else val
                    name = s if s is not None else b"?"
            if is_files:
                names.append(_base_name(name))
    return names


def _line_value(dw: _Dwarf, unit: _Unit, data: bytes, form: int, pos: int) -> tuple[Any, int]:
    """A value of a line-program header entry (its own section, not .debug_info)."""
    if form == _F_STRING:
        end = data.index(0, pos)
        return data[pos:end], end + 1
    if form in (_F_STRP, _F_LINE_STRP, _F_SEC_OFFSET, _F_STRP_SUP):
        n = unit.offset_size
        return int.from_bytes(data[pos : pos + n], "little"), pos + n
    if form in _FIXED_SIZE:
        n = _FIXED_SIZE[form]
        return int.from_bytes(data[pos : pos + n], "little"), pos + n
    if form in (_F_UDATA, _F_STRX):
        return _uleb(data, pos)
    if form in (_F_BLOCK, _F_EXPRLOC):
        n, pos = _uleb(data, pos)
        return None, pos + n
    raise ValueError(f"line header form {form:#x}")


# ------------------------------------------------------------------- the walk


@dataclass
class RawInlines:
    """What a reader finds, before flattening: per inlined DIE (in DIE order) its
    enclosing inlined DIE, name (raw, and whether a linkage name to demangle) and call
    site; per address range its owner DIE. The names and call sites may be left to
    ``late``, asked for the DIEs that are kept only."""

    parents: array[int] = field(default_factory=lambda: array("q"))
    names: list[bytes] = field(default_factory=list)
    linkage: list[bool] = field(default_factory=list)
    sites: list[str] = field(default_factory=list)
    lo: array[int] = field(default_factory=lambda: array("Q"))
    hi: array[int] = field(default_factory=lambda: array("Q"))
    owner: array[int] = field(default_factory=lambda: array("q"))
    late: Callable[[Sequence[int]], list[tuple[bytes, bool, str]]] | None = None
    """When set: DIE indexes -> their (name, is it a linkage name, call site)."""


def _unit_attrs(dw: _Dwarf, unit: _Unit) -> None:
    """The unit DIE's bases, line program and language."""
    data = dw.info
    code, pos = _uleb(data, unit.die_offset)
    ab = _one_abbrev(dw.abbrev, unit, code)
    attrs, _ = dw.attrs(unit, ab, pos)
    for attr, dest in (
        (_AT_ADDR_BASE, "addr_base"),
        (_AT_GNU_ADDR_BASE, "addr_base"),
        (_AT_STR_OFFSETS_BASE, "str_offsets_base"),
        (_AT_RNGLISTS_BASE, "rnglists_base"),
        (_AT_GNU_RANGES_BASE, "rnglists_base"),
        (_AT_STMT_LIST, "stmt_list"),
    ):
        if attr in attrs:
            setattr(unit, dest, attrs[attr][1])
    if _AT_LOW_PC in attrs:
        form, val = attrs[_AT_LOW_PC]
        unit.base = dw.address(unit, form, val)
    if _AT_LANGUAGE in attrs:
        unit.c_like = attrs[_AT_LANGUAGE][1] in _C_LANGUAGES
        unit.cxx = attrs[_AT_LANGUAGE][1] in _CXX_LANGUAGES


class _Found:
    """Per inlined DIE: what names it and its call site, decoded later for the kept ones."""

    def __init__(self) -> None:
        self.origins = array("q")
        self.units = array("l")
        self.files = array("q")
        self.lines = array("q")

    def columns(self) -> tuple[array[int], ...]:
        return self.origins, self.units, self.files, self.lines


def walk(dw: _Dwarf, raw: RawInlines, *, jump: bool = True) -> None:
    """Every inlined subroutine of every unit, into ``raw`` (names and call sites left
    to ``raw.late``). ``jump=False`` walks every DIE (to check the jumps against)."""
    found = _Found()
    for index, unit in enumerate(dw.units):
        marks = [len(a) for a in (raw.parents, raw.lo, raw.hi, raw.owner, *found.columns())]
        try:
            _walk_one(dw, unit, index, raw, found, jump)
        except (ValueError, IndexError, KeyError, OverflowError, struct.error) as e:
            # A unit that cannot be read is left out (what it added taken back).
            log.debug("unit at %#x of .debug_info: %s", unit.offset, e)
            for column, mark in zip(
                (raw.parents, raw.lo, raw.hi, raw.owner, *found.columns()), marks, strict=True
            ):
                del column[mark:]

    def late(indexes: Sequence[int]) -> list[tuple[bytes, bool, str]]:
        names = _names(dw, [found.origins[i] for i in indexes])
        sites: dict[tuple[int, int, int], str] = {}  # (one string per call site)
        out = []
        for i, (name, linkage) in zip(indexes, names, strict=True):
            key = (found.units[i], found.files[i], found.lines[i])
            site = sites.get(key)
            if site is None:
                table = dw.files(dw.units[key[0]])
                file = table[key[1]] if 0 <= key[1] < len(table) else "?"
                # (line 0: DWARF's "no line"; addr2line shows `file:?`)
                site = sites[key] = f"{file}:{key[2]}" if key[2] else file
            out.append((name, linkage, site))
        return out

    raw.late = late


def _walk_one(
    dw: _Dwarf, unit: _Unit, index: int, raw: RawInlines, found: _Found, jump: bool
) -> None:
    _unit_attrs(dw, unit)
    abbrevs = dw.abbrevs_for(unit)
    if not jump:
        abbrevs = {
            code: _Abbrev(
                ab.tag, ab.children, ab.attrs, ab.plan, ab.fixed,
                _DO_INLINE if ab.action == _DO_INLINE else _DO_WALK, picks=ab.picks,
                fast=ab.fast,
            )
            for code, ab in abbrevs.items()
        }  # fmt: skip
    unit.abbrevs = abbrevs
    _walk_unit(dw, unit, index, abbrevs, raw, found)


def _walk_unit(
    dw: _Dwarf,
    unit: _Unit,
    unit_index: int,
    abbrevs: dict[int, _Abbrev],
    raw: RawInlines,
    found: _Found,
) -> None:
    data = dw.info
    pos = unit.die_offset
    end = unit.end
    scope = -1  # the innermost inlined DIE enclosing the walk
    stack: list[int] = []  # the enclosing scope of each open DIE with children
    get = abbrevs.get
    parents = raw.parents
    value = dw.value
    while pos < end:
        code = data[pos]
        pos += 1
        if code >= 0x80:
            code, pos = _uleb(data, pos - 1)
        if code == 0:
            if not stack:
                break  # (padding after the unit DIE's children)
            scope = stack.pop()
            continue
        ab = get(code)
        if ab is None:
            raise ValueError(f"DIE at {pos - 1:#x}: no abbreviation {code}")
        action = ab.action
        if action == _DO_JUMP and ab.sibling_at >= 0:
            at = pos + ab.sibling_at
            form = ab.sibling_form
            if form == _F_REF4:
                target = unit.offset + int.from_bytes(data[at : at + 4], "little")
            else:
                target, _ = value(unit, form, 0, at)
            if target <= pos or target > end:
                raise ValueError(f"DIE at {pos:#x}: sibling {target:#x} out of its unit")
            pos = target
            continue
        if action == _DO_INLINE:
            index = len(parents)
            fast = ab.fast
            if fast is not None:
                vals = fast.layout.unpack_from(data, pos) + fast.consts
                pos = pos + ab.fixed if ab.fixed >= 0 else dw.skip(unit, ab, pos)
                parents.append(scope)
                _add_fast(dw, unit, unit_index, vals, fast, index, raw, found)
                if ab.children:
                    stack.append(scope)
                    scope = index
                continue
            picks = ab.picks
            if picks is not None:
                attrs = {a: (f, value(unit, f, c, pos + off)[0]) for a, f, c, off in picks}
                pos = dw.skip(unit, ab, pos)
            else:
                attrs, pos = dw.attrs(unit, ab, pos)
            parents.append(scope)
            _add_inline(dw, unit, unit_index, attrs, index, raw, found)
            if ab.children:
                stack.append(scope)
                scope = index
            continue
        fixed = ab.fixed
        if fixed >= 0:
            pos += fixed
        else:
            # _Dwarf.skip's plan, written out here: this loop visits every DIE of the
            # file, and a method call there would be paid for each of them.
            for step in ab.plan:
                if step >= 0:
                    pos += step
                elif step == _S_LEB:
                    while data[pos] & 0x80:
                        pos += 1
                    pos += 1
                elif step == _S_STRING:
                    pos = data.index(0, pos) + 1
                elif step == _S_BLOCK:
                    n, pos = _uleb(data, pos)
                    pos += n
                elif step == _S_BLOCK1:
                    pos += 1 + data[pos]
                elif step == _S_BLOCK2:
                    pos += 2 + int.from_bytes(data[pos : pos + 2], "little")
                elif step == _S_BLOCK4:
                    pos += 4 + int.from_bytes(data[pos : pos + 4], "little")
                else:  # forms named in the DIE (the plan's only step)
                    _, pos = dw.attrs(unit, ab, pos)
        if ab.children:
            stack.append(scope)


def _add_fast(
    dw: _Dwarf,
    unit: _Unit,
    unit_index: int,
    vals: tuple[int, ...],
    fast: _Fast,
    index: int,
    raw: RawInlines,
    found: _Found,
) -> None:
    """``_add_inline`` for the values ``fast`` reads."""
    o, low, high, ranges, file, line = fast.slots
    if o < 0:
        found.origins.append(-1)
    else:
        found.origins.append(vals[o] + unit.offset if fast.origin_in_unit else vals[o])
    found.units.append(unit_index)
    found.files.append(vals[file] if file >= 0 else -1)
    found.lines.append(vals[line] if line >= 0 else 0)
    if low >= 0:
        if high < 0:
            return
        lo = vals[low]
        hi = lo + vals[high] if fast.high_is_size else vals[high]
        if lo < hi <= _ADDR_MAX:
            raw.lo.append(lo)
            raw.hi.append(hi)
            raw.owner.append(index)
    elif ranges >= 0:
        for lo, hi in dw.ranges(unit, _F_SEC_OFFSET, vals[ranges]):
            if lo < hi <= _ADDR_MAX:
                raw.lo.append(lo)
                raw.hi.append(hi)
                raw.owner.append(index)


def _add_inline(
    dw: _Dwarf,
    unit: _Unit,
    unit_index: int,
    attrs: _Attrs,
    index: int,
    raw: RawInlines,
    found: _Found,
) -> None:
    origin = attrs.get(_AT_ABSTRACT_ORIGIN)
    if origin is None:
        found.origins.append(-1)
    elif origin[0] == _F_GNU_REF_ALT:
        found.origins.append(-2 - origin[1])  # in the dwz common file
    else:
        found.origins.append(origin[1])
    call_file = attrs.get(_AT_CALL_FILE)
    call_line = attrs.get(_AT_CALL_LINE)
    found.units.append(unit_index)
    found.files.append(
        call_file[1] if call_file is not None and call_file[0] in _CONST_FORMS else -1
    )
    found.lines.append(call_line[1] if call_line is not None else 0)
    low = attrs.get(_AT_LOW_PC)
    if low is not None:
        high = attrs.get(_AT_HIGH_PC)
        if high is None:
            return
        lo = dw.address(unit, *low)
        form, val = high
        hi = val + lo if form in _CONST_FORMS else dw.address(unit, form, val)
        ranges = [(lo, hi)]
    elif _AT_RANGES in attrs:
        ranges = dw.ranges(unit, *attrs[_AT_RANGES])
    else:
        return
    for lo, hi in ranges:
        if lo < hi <= _ADDR_MAX:  # (a range from a tombstone address may wrap)
            raw.lo.append(lo)
            raw.hi.append(hi)
            raw.owner.append(index)


_Name = tuple[bytes, bool, "_Dwarf | None", int]


def _die_name(dw: _Dwarf, offset: int) -> _Name:
    """The name of the function at DIE ``offset`` (following abstract origins and
    specifications): (its linkage name, True) if one is found, else (its name, False), and
    where a plain name was found (the file and the DIE) when its unit is C++."""
    known = dw.names.get(offset)
    if known is None:
        try:
            known = _find_name(dw, offset)
        except (ValueError, IndexError, KeyError) as e:
            log.debug("name of the DIE at %#x: %s", offset, e)
            known = (b"?", False, None, -1)
        dw.names[offset] = known
    return known


_SIBLING_ATTR: Final = frozenset({_AT_SIBLING})
_NAME_ATTR: Final = frozenset({_AT_NAME})
_NAME_ATTRS: Final = frozenset(
    {_AT_LINKAGE_NAME, _AT_MIPS_LINKAGE_NAME, _AT_NAME, _AT_ABSTRACT_ORIGIN, _AT_SPECIFICATION}
)


def _find_name(dw: _Dwarf, offset: int) -> _Name:
    name: bytes | None = None
    where: tuple[_Dwarf | None, int] = (None, -1)
    seen = 0
    while offset != -1 and seen < 16:
        seen += 1
        if offset <= -2:  # in the dwz common file
            if dw.alt is None:
                break
            dw, offset = dw.alt, -2 - offset
        unit = dw.unit_at(offset)
        if not unit.abbrevs:
            _unit_attrs(dw, unit)
            unit.abbrevs = dw.abbrevs_for(unit)
        code, pos = _uleb(dw.info, offset)
        ab = unit.abbrevs.get(code)
        if ab is None:
            break
        attrs = dw.pick(unit, ab, pos, _NAME_ATTRS)
        for key in (_AT_LINKAGE_NAME, _AT_MIPS_LINKAGE_NAME):
            if key in attrs:
                s = dw.string(unit, *attrs[key])
                if s is not None:
                    return s, True, None, -1
        if name is None and _AT_NAME in attrs:
            name = dw.string(unit, *attrs[_AT_NAME])
            if name is not None and unit.cxx:
                where = (dw, offset)
        nxt = attrs.get(_AT_ABSTRACT_ORIGIN) or attrs.get(_AT_SPECIFICATION)
        if nxt is None:
            break
        offset = -2 - nxt[1] if nxt[0] == _F_GNU_REF_ALT else nxt[1]
    if name is None:
        return b"?", False, None, -1
    return name, False, *where


def _names(dw: _Dwarf, origins: Sequence[int]) -> list[tuple[bytes, bool]]:
    """The names of the functions at the DIEs ``origins``: C++ names without a linkage
    name (functions of internal linkage: templates of a lambda's type, say) qualified by
    the namespaces and classes around the DIE that names them (``std::__push_heap<...>``)."""
    found = [_die_name(dw, o) for o in origins]
    wanted: dict[tuple[int, int], set[int]] = {}
    files: dict[int, _Dwarf] = {}
    for _, _, where, at in found:
        if where is not None:
            files[id(where)] = where
            unit = where.unit_at(at)
            wanted.setdefault((id(where), unit.offset), set()).add(at)
    prefixes: dict[tuple[int, int], bytes] = {}
    for (file_id, unit_offset), targets in wanted.items():
        file = files[file_id]
        unit = file.unit_at(unit_offset)
        try:
            found_prefixes = _qualifiers(file, unit, sorted(targets))
        except (ValueError, IndexError, KeyError) as e:
            log.debug("scopes of names in the unit at %#x: %s", unit.offset, e)
            continue
        for at, prefix in found_prefixes.items():
            prefixes[(file_id, at)] = prefix
    out = []
    for name, linkage, where, at in found:
        prefix = prefixes.get((id(where), at), b"") if where is not None else b""
        out.append((prefix + b"::" + name if prefix else name, linkage))
    return out


_TAG_NAMESPACE: Final = 0x39
_TAG_SUBPROGRAM: Final = 0x2E
_SCOPE_TAGS: Final = frozenset(
    {_TAG_NAMESPACE, _TAG_CLASS, _TAG_STRUCTURE, _TAG_UNION, 0x38, _TAG_SUBPROGRAM}
)
"""Namespace, class, structure, union, interface, and the function a local class is in:
the scopes of a qualified C++ name."""


def _qualifiers(dw: _Dwarf, unit: _Unit, targets: Sequence[int]) -> dict[int, bytes]:
    """For each DIE offset in ``targets`` (sorted), the names of the namespaces, classes
    and functions it is in, joined by ``::``; one walk of the unit, over the subtrees that
    hold no target by their DW_AT_sibling."""
    data = dw.info
    out: dict[int, bytes] = {}
    path: list[bytes] = []
    opened: list[int] = []  # per open DIE with children: 0, or 1 (a scope), 2 (a function)
    in_function = 0  # how many of the open DIEs are functions
    ti = 0
    pos = unit.die_offset
    while pos < unit.end and ti < len(targets):
        start = pos
        code, pos = _uleb(data, pos)
        if code == 0:
            if not opened:
                break
            kind = opened.pop()
            if kind:
                path.pop()
                in_function -= kind == 2
            continue
        ab = unit.abbrevs.get(code)
        if ab is None:
            raise ValueError(f"DIE at {start:#x}: no abbreviation {code}")
        while ti < len(targets) and targets[ti] < start:
            ti += 1  # (not a DIE of this unit's tree)
        if ti < len(targets) and targets[ti] == start:
            out[start] = b"::".join(path)
            ti += 1
        if not ab.children:
            pos = dw.skip(unit, ab, pos)
            continue
        if ab.sibling_at >= 0:
            sibling, _ = dw.value(unit, ab.sibling_form, 0, pos + ab.sibling_at)
        else:
            sib = dw.pick(unit, ab, pos, _SIBLING_ATTR).get(_AT_SIBLING)
            sibling = sib[1] if sib is not None else -1
        if sibling > start and (ti >= len(targets) or targets[ti] >= sibling):
            pos = sibling
            continue
        if ab.tag not in _SCOPE_TAGS:
            pos = dw.skip(unit, ab, pos)
            opened.append(0)
            continue
        named = dw.pick(unit, ab, pos, _NAME_ATTR).get(_AT_NAME)
        pos = dw.skip(unit, ab, pos)
        text = dw.string(unit, *named) if named is not None else None
        if ab.tag == _TAG_SUBPROGRAM:
            if text is None:
                text = _function_name(dw, start)
            in_function += 1
            opened.append(2)
        else:
            if text is None and ab.tag == _TAG_NAMESPACE:
                text = b"(anonymous namespace)"
            elif text is None:  # a type with no name in a function: a lambda's, mostly
                text = b"{lambda}" if in_function else b"{unnamed type}"
            opened.append(1)
        path.append(text)
    return out


def _function_name(dw: _Dwarf, offset: int) -> bytes:
    """A function's name as a scope of a local name (demangled, without parameters)."""
    name, linkage, _, _ = _die_name(dw, offset)
    if linkage:
        return perf_symbol_names([name])[0].encode("utf-8", "surrogateescape")
    return name


# ------------------------------------------------------------------- flattening


def build_table(
    raw: RawInlines, code: Sequence[tuple[int, int]] | None = None
) -> InlineTable | None:
    """Flatten ``raw`` into disjoint runs (each address to its innermost scope), keeping
    the scopes that have a run and the scopes they are inlined into. ``code``: the
    binary's executable sections (start, end); ranges are cut to them (the DWARF of code
    the linker dropped, a discarded COMDAT copy or a section gc'd away, is left at
    address 0 or a tombstone such as -1)."""
    n = len(raw.parents)
    lo = np.frombuffer(raw.lo, dtype=np.uint64)
    hi = np.frombuffer(raw.hi, dtype=np.uint64)
    owner = np.frombuffer(raw.owner, dtype=np.int64)
    if code is not None:
        lo, hi, owner = _clip(lo, hi, owner, code)
    if not len(owner):
        return None
    parents = np.frombuffer(raw.parents, dtype=np.int64)
    depth = np.ones(n, dtype=np.int64)  # how many inlined scopes deep
    up = parents.copy()
    while True:
        inner = up >= 0
        if not bool(inner.any()):
            break
        depth[inner] += 1
        up[inner] = parents[up[inner]]
    starts, ends, run_scope = _paint(lo, hi, owner, depth)
    if not len(starts):
        return None
    # The scopes that have a run, and the scopes those are inlined into.
    used = np.zeros(n, dtype=bool)
    used[run_scope] = True
    while True:
        up = parents[used & (parents >= 0)]
        if bool(np.all(used[up])):
            break
        used[up] = True
    keep = np.flatnonzero(used)
    remap = np.full(n, -1, dtype=np.int64)
    remap[keep] = np.arange(len(keep))
    kept_parents = parents[keep]
    new_parents = np.where(kept_parents >= 0, remap[np.maximum(kept_parents, 0)], -1).tolist()
    names, sites = _scope_names(raw, keep.tolist())
    scopes = tuple(
        InlineScope(name, site, parent)
        for name, site, parent in zip(names, sites, new_parents, strict=True)
    )
    return InlineTable(scopes, starts, ends, remap[run_scope].astype(np.int32))


def _clip(
    lo: npt.NDArray[np.uint64],
    hi: npt.NDArray[np.uint64],
    owner: npt.NDArray[np.int64],
    code: Sequence[tuple[int, int]],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """The parts of the ranges inside the ``code`` spans (empty parts dropped)."""
    parts_lo, parts_hi, parts_owner = [], [], []
    for start, end in code:
        a = np.maximum(lo, np.uint64(start))
        b = np.minimum(hi, np.uint64(end))
        inside = a < b
        parts_lo.append(a[inside])
        parts_hi.append(b[inside])
        parts_owner.append(owner[inside])
    if not parts_lo:
        return lo[:0], hi[:0], owner[:0]
    return np.concatenate(parts_lo), np.concatenate(parts_hi), np.concatenate(parts_owner)


def _scope_names(raw: RawInlines, keep: Sequence[int]) -> tuple[list[str], list[str]]:
    """The kept scopes' names (demangled) and call sites."""
    if raw.late is not None:
        found = raw.late(keep)
    else:
        found = [(raw.names[i], raw.linkage[i], raw.sites[i]) for i in keep]
    mangled = sorted({n for n, linkage, _ in found if linkage})
    readable = dict(zip(mangled, perf_symbol_names(mangled), strict=True))
    names = [
        readable[n] if linkage else n.decode("utf-8", "surrogateescape") for n, linkage, _ in found
    ]
    return names, [site for _, _, site in found]


def _paint(
    lo: npt.NDArray[np.uint64],
    hi: npt.NDArray[np.uint64],
    owner: npt.NDArray[np.int64],
    depth: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """Disjoint runs: each elementary interval of the ranges' boundaries goes to the
    deepest range over it (the later one in DIE order among equals)."""
    bounds = np.unique(np.concatenate([lo, hi]))
    i0 = np.searchsorted(bounds, lo)
    i1 = np.searchsorted(bounds, hi)
    paint = np.full(max(len(bounds) - 1, 0), -1, dtype=np.int64)
    order = np.lexsort((owner, depth[owner]))
    # Ranges of one depth rarely overlap: paint depth by depth, each in one go when its
    # ranges are disjoint (a sweep otherwise).
    d_sorted = depth[owner][order]
    cuts = np.flatnonzero(np.diff(d_sorted)) + 1
    for group in np.split(order, cuts):
        a, b, o = i0[group], i1[group], owner[group]
        # Ranges of one depth that are the same range: the last in DIE order wins (bfd's
        # ld points the DWARF of a discarded COMDAT copy at the kept copy's code).
        by_range = np.lexsort((o, b, a))
        a, b, o = a[by_range], b[by_range], o[by_range]
        last = np.ones(len(a), dtype=bool)
        last[:-1] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
        a, b, o = a[last], b[last], o[last]
        if len(a) < 2 or bool(np.all(a[1:] >= b[:-1])):
            lengths = b - a
            idx = np.repeat(a - np.cumsum(lengths) + lengths, lengths) + np.arange(
                int(lengths.sum())
            )
            paint[idx] = np.repeat(o, lengths)
        else:
            _paint_overlapping(paint, a, b, o)
    if len(paint) == 0:
        z = np.zeros(0, dtype=np.uint64)
        return z, z.copy(), np.zeros(0, dtype=np.int64)
    change = np.flatnonzero(np.concatenate([[True], paint[1:] != paint[:-1]]))
    run_scope = paint[change]
    run_start = bounds[change]
    run_end = bounds[np.append(change[1:], len(paint))]
    keep = run_scope >= 0
    return (
        np.ascontiguousarray(run_start[keep]),
        np.ascontiguousarray(run_end[keep]),
        np.ascontiguousarray(run_scope[keep]),
    )


def _paint_overlapping(
    paint: npt.NDArray[np.int64],
    a: npt.NDArray[np.int64],
    b: npt.NDArray[np.int64],
    owner: npt.NDArray[np.int64],
) -> None:
    """Paint ranges of one depth that overlap (broken DWARF): where several cover an
    interval, the last in DIE order wins. A sweep over the boundaries with a heap of the
    open ranges (the latest on top, ended ones dropped when they surface)."""
    order = np.argsort(a, kind="stable")
    starts, ends, owners = a[order].tolist(), b[order].tolist(), owner[order].tolist()
    open_: list[tuple[int, int]] = []  # (-owner, end)
    i = 0
    n = len(starts)
    k = starts[0] if n else 0
    while i < n or open_:
        if not open_ and i < n:
            k = max(k, starts[i])
        while i < n and starts[i] <= k:
            heapq.heappush(open_, (-owners[i], ends[i]))
            i += 1
        while open_ and open_[0][1] <= k:
            heapq.heappop(open_)
        if not open_:
            continue
        top, end = open_[0]
        stop = min(end, starts[i] if i < n else end)
        paint[k:stop] = -top
        k = stop


# ------------------------------------------------------------------- reading, caching


def _read(path: Path) -> InlineTable | None:
    image = ElfImage.open(str(path))
    if image is None:
        log.debug("inline information of %s: not an ELF file", path)
        return None
    opened = [image]
    try:
        key = _cache_key(path, image)
        cached = _cache_load(key)
        if cached is not None:
            return cached[0]
        sections = _Sections(image)
        if not sections.has(".debug_info"):
            debug = _debug_image(image, path)
            if debug is None:
                return None
            opened.append(debug)
            sections = _Sections(debug)
        alt_image = _alt_image(sections.image, Path(sections.image.path))
        alt = None
        if alt_image is not None:
            opened.append(alt_image)
            alt = _Dwarf(_Sections(alt_image))
        dw = _Dwarf(sections, alt)
        raw = RawInlines()
        walk(dw, raw)
        table = build_table(raw, _code_spans(image) or _code_spans(sections.image) or None)
        _cache_store(key, table)
        return table
    finally:
        for im in opened:
            im.close()


def _code_spans(image: ElfImage) -> list[tuple[int, int]]:
    """The address spans of the executable sections (a debug file keeps their headers)."""
    return [
        (s.addr, s.addr + s.size)
        for s in image.sections
        if s.flags & _SHF_ALLOC_EXEC == _SHF_ALLOC_EXEC and s.size
    ]


def _cache_dir() -> Path | None:
    if os.environ.get("PTSCOPE_NO_INLINE_CACHE", "") not in ("", "0"):
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ptscope" / "inline"


def _cache_key(path: Path, image: ElfImage) -> str:
    build_id = image.build_id()
    if build_id:
        return f"v{CACHE_VERSION}-{build_id.hex()}"
    st = path.stat()
    ident = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return f"v{CACHE_VERSION}-p{hashlib.sha256(ident).hexdigest()[:32]}"


def _cache_load(key: str) -> tuple[InlineTable | None] | None:
    """(the cached table,) or None when nothing usable is cached."""
    folder = _cache_dir()
    if folder is None:
        return None
    meta_path = folder / f"{key}.json"
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("key") != key:
            return None
        if meta.get("scopes") is None:
            return (None,)
        with np.load(folder / f"{key}.npz") as arrays:
            if str(arrays["token"]) != meta["token"]:
                return None  # the two files are from different writers
            starts = arrays["starts"].astype(np.uint64)
            ends = arrays["ends"].astype(np.uint64)
            scope = arrays["scope"].astype(np.int32)
            parents = arrays["parents"].astype(np.int64).tolist()
            name_of = arrays["name"].astype(np.int64).tolist()
            site_of = arrays["call_site"].astype(np.int64).tolist()
        names, sites = meta["scopes"]["names"], meta["scopes"]["call_sites"]
        count = len(parents)
        if not (len(name_of) == len(site_of) == count) or not (
            len(starts) == len(ends) == len(scope)
        ):
            return None
        if len(scope) and (int(scope.min()) < 0 or int(scope.max()) >= count):
            return None
        if any(not -1 <= p < i for i, p in enumerate(parents)):
            return None
        scopes = tuple(
            InlineScope(str(names[n]), str(sites[c]), int(p))
            for n, c, p in zip(name_of, site_of, parents, strict=True)
        )
        return (InlineTable(scopes, starts, ends, scope),)
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            log.debug("inline cache %s: %s", meta_path, e)
        return None


def _cache_store(key: str, table: InlineTable | None) -> None:
    folder = _cache_dir()
    if folder is None:
        return
    token = os.urandom(8).hex()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {"key": key, "token": token, "scopes": None}
        if table is not None:
            # Names and call sites repeat (each instance of a function): each once in the
            # json, and per scope its index in the arrays.
            names: dict[str, int] = {}
            sites: dict[str, int] = {}
            name_of = [names.setdefault(s.name, len(names)) for s in table.scopes]
            site_of = [sites.setdefault(s.call_site, len(sites)) for s in table.scopes]
            meta["scopes"] = {"names": list(names), "call_sites": list(sites)}
            _atomic_write(
                folder / f"{key}.npz",
                lambda f: np.savez(
                    f,
                    starts=table.starts,
                    ends=table.ends,
                    scope=table.scope,
                    parents=np.array([s.parent for s in table.scopes], dtype=np.int32),
                    name=np.array(name_of, dtype=np.int32),
                    call_site=np.array(site_of, dtype=np.int32),
                    token=np.array(token),
                ),
            )
        # The json last: a reader that finds it finds the arrays it names (same token).
        _atomic_write(folder / f"{key}.json", lambda f: json.dump(meta, f), text=True)
    except OSError as e:
        log.debug("inline cache %s: %s", folder, e)


def _atomic_write(dest: Path, write: Callable[[Any], object], *, text: bool = False) -> None:
    """``write(file)`` into a new file renamed to ``dest`` once complete."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") if text else os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
