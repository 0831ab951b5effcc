"""Where C++ exceptions land: the call sites whose exception lands at a given address.

When an exception is caught, the unwinder jumps to a *landing pad* in the middle of the
catching function. If that function is on the stack several times (recursion), the branch
trace alone cannot tell which activation catches: the jump looks the same. The binary can:
its exception tables (``.eh_frame`` and the LSDAs in ``.gcc_except_table``) list, for every
call site of a function, the landing pad an exception thrown from that call lands on. The
activation that catches is the one whose pending call lies in a call site that lands there.

:class:`LandingPads` reads those tables (on demand, once per binary) and answers
:meth:`LandingPads.call_sites_landing_at`: the run-time address ranges of the call sites
whose exceptions land at a run-time address. Run-time addresses of a position-independent
binary differ from its file's by a page-aligned load bias, so a landing pad is matched by
its address modulo the page size, and each match gives its own bias.

The tables are read by hand (pyelftools parses every CFI instruction, ~3 s for libstdc++;
we only need the headers: ~20 ms): layouts from the LSB's "Exception Frames" and the Itanium
C++ ABI's LSDA format (also in GCC's ``unwind-pe.h``).

OCaml (``ocamlopt``, amd64) has no such tables: a ``try`` pushes a *trap frame* holding its
handler's address, ``lea HANDLER(%rip),%r11; push %r11`` then ``push``/``mov`` of the trap
pointer (``0xNN(%r14)`` since 4.13's domain state, ``%r14`` itself before), and the body
follows, then the handler: ``[end of that sequence, HANDLER)`` is the try's body. Its calls
are the call sites whose exceptions land at HANDLER, so OCaml handlers answer the same
question; the sequence is found by its bytes in the executable sections (~1 ms per MiB).
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

__all__ = ["LandingPads", "read_landing_pads"]

log = logging.getLogger("ptscope")

_PAGE: Final = 0x1000
_OMIT: Final = 0xFF

Ranges = tuple[tuple[int, int], ...]

# DW_EH_PE value formats of fixed size: absptr, udata2/4/8, sdata2/4/8.
_FIXED: Final = {0x00: "<Q", 0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i", 0x0C: "<q"}

# ocamlopt's pushtrap: lea rel32(%rip),%r11; push %r11; then push 0xNN(%r14); mov
# %rsp,0xNN(%r14) (4.13+, the trap pointer in the domain state) or push %r14; mov %rsp,%r14.
_OCAML_PUSHTRAP: Final = re.compile(
    rb"\x4c\x8d\x1d(....)\x41\x53(?:\x41\xff\x76(.)\x49\x89\x66\2|\x41\x56\x49\x89\xe6)",
    re.DOTALL,
)
_LEA_LENGTH: Final = 7


@dataclass
class _Tables:
    """One binary's call sites by landing pad (file addresses)."""

    fixed: bool
    """An ET_EXEC binary: loaded at its file addresses."""
    by_pad: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    by_page_offset: dict[int, list[int]] = field(default_factory=dict)


class _Reader:
    """DWARF-style encoded values in one section's bytes."""

    def __init__(self, data: bytes, base: int) -> None:
        self.data = data
        self.base = base  # the section's address
        self.pos = 0

    def u8(self) -> int:
        v = self.data[self.pos]
        self.pos += 1
        return v

    def fixed(self, fmt: str) -> int:
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return int(v)

    def uleb(self) -> int:
        result = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return result

    def sleb(self) -> int:
        result = shift = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                if b & 0x40:
                    result -= 1 << shift
                return result

    def cstring(self) -> bytes:
        end = self.data.index(b"\0", self.pos)
        s = self.data[self.pos : end]
        self.pos = end + 1
        return s

    def encoded(self, enc: int, func_base: int = 0) -> int:
        """A pointer in DW_EH_PE encoding ``enc`` (pcrel, datarel... applied)."""
        here = self.base + self.pos
        kind = enc & 0x0F
        if kind == 0x01:
            v = self.uleb()
        elif kind == 0x09:
            v = self.sleb()
        elif kind in _FIXED:
            v = self.fixed(_FIXED[kind])
        else:
            raise ValueError(f"pointer encoding {enc:#x}")
        rel = enc & 0x70
        if rel == 0x10:
            v += here
        elif rel == 0x40:
            v += func_base
        elif rel not in (0x00,):
            raise ValueError(f"pointer encoding {enc:#x}")
        # (indirect 0x80 pointers are only used for personality routines, never read here)
        return v & 0xFFFFFFFFFFFFFFFF


def _add_site(tables: _Tables, pad: int, start: int, end: int) -> None:
    sites = tables.by_pad.setdefault(pad, [])
    if not sites:
        tables.by_page_offset.setdefault(pad % _PAGE, []).append(pad)
    sites.append((start, end))


def _read_ocaml_traps(elf: ELFFile, tables: _Tables) -> None:
    """OCaml try bodies: every pushtrap sequence in the executable sections."""
    for section in elf.iter_sections():
        if not section["sh_flags"] & 0x4 or section["sh_type"] == "SHT_NOBITS":  # SHF_EXECINSTR
            continue
        data = section.data()
        base = section["sh_addr"]
        for m in _OCAML_PUSHTRAP.finditer(data):
            (disp,) = struct.unpack("<i", m.group(1))
            handler = base + m.start() + _LEA_LENGTH + disp
            body = base + m.end()
            if body < handler:
                _add_site(tables, handler, body, handler)


def read_landing_pads(path: Path) -> _Tables:
    """The call sites of every function of ``path`` that has a landing pad (C++) or a
    trap handler (OCaml)."""
    from elftools.elf.elffile import ELFFile  # on first use: 30 ms of start-up otherwise

    with open(path, "rb") as f:
        elf = ELFFile(f)
        tables = _Tables(fixed=elf["e_type"] == "ET_EXEC")
        _read_ocaml_traps(elf, tables)
        eh = elf.get_section_by_name(".eh_frame")
        if eh is None:
            return tables
        sections = [
            (s["sh_addr"], s["sh_addr"] + s["sh_size"], s)
            for s in elf.iter_sections()
            if s["sh_addr"] and s["sh_type"] != "SHT_NOBITS"
        ]
        data_cache: dict[int, bytes] = {}

        def at(addr: int) -> _Reader | None:
            for lo, hi, s in sections:
                if lo <= addr < hi:
                    if lo not in data_cache:
                        data_cache[lo] = s.data()
                    r = _Reader(data_cache[lo], lo)
                    r.pos = addr - lo
                    return r
            return None

        for start, lsda in _fdes_with_lsda(_Reader(eh.data(), eh["sh_addr"])):
            r = at(lsda)
            if r is None:
                continue
            try:
                _read_lsda(r, start, tables)
            except (ValueError, IndexError, struct.error):
                continue  # one damaged table is no reason to lose the others
    return tables


def _fdes_with_lsda(r: _Reader) -> list[tuple[int, int]]:
    """(function start, LSDA address) of every FDE that has an LSDA."""
    cies: dict[int, tuple[int, int]] = {}  # CIE offset -> (FDE pointer enc, LSDA enc)
    out: list[tuple[int, int]] = []
    data = r.data
    while r.pos + 4 <= len(data):
        entry = r.pos
        length = r.fixed("<I")
        if length == 0:
            break  # terminator
        if length == 0xFFFFFFFF:
            length = r.fixed("<Q")
        body = r.pos
        end = body + length
        cie_id = r.fixed("<I")
        try:
            if cie_id == 0:
                cies[entry] = _read_cie(r)
            else:
                cie = cies.get(body - cie_id)
                if cie is not None:
                    fde_enc, lsda_enc = cie
                    start = r.encoded(fde_enc)
                    r.encoded(fde_enc & 0x0F)  # the range: same size, no relocation
                    if lsda_enc != _OMIT:
                        r.uleb()  # augmentation data length
                        lsda = r.encoded(lsda_enc)
                        if lsda:
                            out.append((start, lsda))
        except (ValueError, IndexError, struct.error):
            pass
        r.pos = end
    return out


def _read_cie(r: _Reader) -> tuple[int, int]:
    """(FDE pointer encoding, LSDA encoding) of the CIE at ``r`` (after its id)."""
    version = r.u8()
    aug = r.cstring()
    if b"eh" in aug:
        r.fixed("<Q")
    r.uleb()  # code alignment
    r.sleb()  # data alignment
    if version == 1:
        r.u8()
    else:
        r.uleb()  # return address register
    fde_enc = 0x00
    lsda_enc = _OMIT
    if aug.startswith(b"z"):
        r.uleb()  # augmentation data length
        for c in aug[1:]:
            if c == ord("L"):
                lsda_enc = r.u8()
            elif c == ord("P"):
                penc = r.u8()
                r.encoded(penc & 0x7F)
            elif c == ord("R"):
                fde_enc = r.u8()
            elif c in b"SB":
                continue
            else:
                break
    return fde_enc, lsda_enc


def _read_lsda(r: _Reader, func_start: int, tables: _Tables) -> None:
    lp_enc = r.u8()
    lp_start = func_start if lp_enc == _OMIT else r.encoded(lp_enc)
    if r.u8() != _OMIT:  # type table encoding
        r.uleb()  # type table offset
    cs_enc = r.u8()
    length = r.uleb()
    end = r.pos + length
    while r.pos < end:
        start = r.encoded(cs_enc & 0x0F)
        size = r.encoded(cs_enc & 0x0F)
        pad = r.encoded(cs_enc & 0x0F)
        r.uleb()  # action
        if pad:
            _add_site(tables, lp_start + pad, func_start + start, func_start + start + size)


class LandingPads:
    """Answers "which call sites land here?" for the binaries of a trace, reading each
    binary's tables the first time one of its addresses is asked about."""

    def __init__(self, resolve: Callable[[str], Path | None] | None = None) -> None:
        self._resolve = resolve or _existing_file
        self._tables: dict[str, _Tables | None] = {}
        self._answers: dict[tuple[str, int], Ranges] = {}

    def call_sites_landing_at(self, dso: str, ip: int) -> Ranges:
        """Run-time ranges ``[start, end)`` of the call sites of ``dso`` whose exceptions
        land at run-time address ``ip`` (empty when ``ip`` is no landing pad we know)."""
        key = (dso, ip)
        found = self._answers.get(key)
        if found is None:
            found = self._answers[key] = self._find(dso, ip)
        return found

    def _find(self, dso: str, ip: int) -> Ranges:
        tables = self._tables_of(dso)
        if tables is None:
            return ()
        if tables.fixed:
            return tuple(tables.by_pad.get(ip, ()))
        out: list[tuple[int, int]] = []
        # Loaded at a page-aligned bias: every pad at the same page offset is a candidate.
        for pad in tables.by_page_offset.get(ip % _PAGE, ()):
            bias = ip - pad
            out += [(a + bias, b + bias) for a, b in tables.by_pad[pad]]
        return tuple(out)

    def _tables_of(self, dso: str) -> _Tables | None:
        if dso in self._tables:
            return self._tables[dso]
        from elftools.common.exceptions import ELFError

        path = self._resolve(dso)
        tables = None
        if path is not None:
            try:
                tables = read_landing_pads(path)
            except (OSError, ELFError, ValueError) as e:
                log.debug("landing pads of %s: %s", dso, e)
        self._tables[dso] = tables
        return tables


def _existing_file(dso: str) -> Path | None:
    path = Path(dso)
    return path if dso.startswith("/") and path.is_file() else None
