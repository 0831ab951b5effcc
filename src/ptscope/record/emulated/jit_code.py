"""Code that runs from memory no file backs (JIT compilers, trampolines built at run time).

perf decodes Intel PT by reading each instruction from the file an MMAP2 record names, so
code in anonymous memory cannot be decoded from a hardware recording. Under emulation its
bytes are known: QEMU lists every block it translates. Each page of such code that runs is
written into one file of the recording (``jitted-code.bin``) and mapped there by an MMAP2
record, so the real perf decodes JIT code like any other. Names come from the program's
``/tmp/perf-PID.map`` (kept with the recording). When the code on a page changes, the new
version gets pages of its own and a new MMAP2 record from then on.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["JIT_CODE_FILE", "JitCodeFile", "JitPages"]

JIT_CODE_FILE: Final = "jitted-code.bin"
JIT_CODE_MAGIC: Final = b"PTSCOPE-JITCODE\0"
JIT_CODE_VERSION: Final = 1
_PAGE: Final = 4096


class JitCodeFile:
    """The recording's file of anonymous code pages, shared by its processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1
        self.size = 0

    def new_page(self) -> int:
        """Room for one more page (zeros); returns its file offset."""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            # A header page (docs/file-formats.md): the code pages follow it.
            header = JIT_CODE_MAGIC + struct.pack("<II", JIT_CODE_VERSION, _PAGE)
            os.pwrite(self._fd, header.ljust(_PAGE, b"\0"), 0)
            self.size = _PAGE
        offset = self.size
        self.size += _PAGE
        os.ftruncate(self._fd, self.size)
        return offset

    def write(self, offset: int, data: bytes) -> None:
        os.pwrite(self._fd, data, offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass
class _Page:
    offset: int
    data: bytearray
    known: bytearray


MapPage = Callable[[int, int], None]
"""``(page address, file offset)``: write the MMAP2 record of a page (version)."""


class JitPages:
    """One process's pages of anonymous code: what is known of each, where it is in the
    file. A forked child starts with a copy (its parent's pages are mapped in it too)."""

    def __init__(self, file: JitCodeFile) -> None:
        self.file = file
        self._pages: dict[int, _Page] = {}

    def copy(self) -> JitPages:
        twin = JitPages(self.file)
        twin._pages = {
            a: _Page(p.offset, bytearray(p.data), bytearray(p.known))
            for a, p in self._pages.items()
        }
        return twin

    def add(self, listing: list[tuple[int, bytes]], map_page: MapPage) -> None:
        """A block's instructions ``(address, bytes)``: put them in the file, mapping each
        page the first time and again when code already there has changed."""
        for address, code in listing:
            while code:
                base = address & ~(_PAGE - 1)
                at = address - base
                piece, code = code[: _PAGE - at], code[_PAGE - at :]
                self._put(base, at, piece, map_page)
                address += len(piece)

    def _put(self, base: int, at: int, piece: bytes, map_page: MapPage) -> None:
        page = self._pages.get(base)
        end = at + len(piece)
        if page is not None and page.data[at:end] == piece:
            return
        if page is None or _conflicts(page, at, piece):
            # New code on this page (or changed code): a new version, with what is known of
            # the old one for the code around it that may still run.
            fresh = _Page(self.file.new_page(), bytearray(_PAGE), bytearray(_PAGE))
            if page is not None:
                fresh.data[:] = page.data
                fresh.known[:] = page.known
                self.file.write(fresh.offset, bytes(fresh.data))
            page = self._pages[base] = fresh
            map_page(base, page.offset)
        page.data[at:end] = piece
        page.known[at:end] = b"\x01" * len(piece)
        self.file.write(page.offset + at, piece)


def _conflicts(page: _Page, at: int, piece: bytes) -> bool:
    """Whether ``piece`` changes bytes of ``page`` that earlier code had."""
    known = page.known[at : at + len(piece)]
    old = page.data[at : at + len(piece)]
    return any(k and o != n for k, o, n in zip(known, old, piece, strict=True))
