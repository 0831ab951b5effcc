"""GNU build-ids: of an ELF file, and of the running kernel (what perf files binaries by)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

__all__ = ["file_build_id", "gnu_build_id", "kernel_build_id"]

_NT_GNU_BUILD_ID = 3


def gnu_build_id(elf: ELFFile) -> bytes | None:
    """The NT_GNU_BUILD_ID note of an open ELF file, if it has one."""
    for section in elf.iter_sections():
        if section["sh_type"] != "SHT_NOTE":
            continue
        for note in section.iter_notes():  # type: ignore[attr-defined]
            if note["n_type"] == "NT_GNU_BUILD_ID" and note["n_name"] == "GNU":
                desc = note["n_desc"]
                return desc if isinstance(desc, bytes) else bytes.fromhex(desc)
    return None


def file_build_id(path: str | Path) -> bytes | None:
    """The build-id of the ELF file at ``path``; None if it has none, is not ELF or
    cannot be read."""
    from elftools.common.exceptions import ELFError  # on first use (start-up time)
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                return None
            f.seek(0)
            return gnu_build_id(ELFFile(f))
    except (OSError, ELFError, ValueError, KeyError):
        return None


def kernel_build_id(notes: Path = Path("/sys/kernel/notes")) -> bytes | None:
    """The running kernel's build-id, from its ELF notes (what perf compares a
    recording's ``[kernel.kallsyms]`` build-id with)."""
    try:
        data = notes.read_bytes()
    except OSError:
        return None
    at = 0
    while at + 12 <= len(data):
        namesz, descsz, kind = struct.unpack_from("<III", data, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if kind == _NT_GNU_BUILD_ID and data[name_at : name_at + namesz] == b"GNU\0":
            return data[desc_at : desc_at + descsz]
        at = desc_at + (descsz + 3) // 4 * 4
    return None
