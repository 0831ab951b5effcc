"""What the emulated backend needs to know about an ELF file: kind, executable segments, build-id.

perf reads instruction bytes at ``ip - start + pgoff`` of the file named by an MMAP2
record, so every executable PT_LOAD becomes one page-aligned mapping with its file offset.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

from ptscope.errors import BadInputError
from ptscope.record.build_id import gnu_build_id

__all__ = ["ElfImage", "Segment", "load_bias", "read_elf"]

_PAGE = 4096
_MACHINES = {3: "EM_386", 40: "EM_ARM", 62: "EM_X86_64", 183: "EM_AARCH64", 243: "EM_RISCV"}
_PF_X = 1


@dataclass(frozen=True)
class Segment:
    """An executable PT_LOAD, page-aligned: ``[vaddr, vaddr + size)`` maps file ``offset``."""

    vaddr: int
    size: int
    offset: int


@dataclass(frozen=True)
class ElfImage:
    path: str
    """Absolute, symlink-free path (what perf opens and what BUILD_ID names)."""
    machine: str
    elf_class: int
    pie: bool
    """ET_DYN: loaded at a base chosen at run time (PIE executables, shared libraries)."""
    entry: int
    interpreter: str | None
    exec_segments: tuple[Segment, ...]
    build_id: bytes | None

    @property
    def is_x86_64(self) -> bool:
        return self.machine == "EM_X86_64" and self.elf_class == 64

    @property
    def lowest_exec_vaddr(self) -> int:
        return min((s.vaddr for s in self.exec_segments), default=0)


def load_bias(start_code: int, image: ElfImage) -> int:
    """Where a position-independent ``image`` is loaded, from QEMU's ``start_code``: the
    load address of its lowest executable segment, whose link-time address need not be on
    a page boundary (lld, rustc's lld: ``0x16e0``; GNU ld aligns it). The bias itself is
    a whole number of pages, whether QEMU reports that address exactly or page-aligned."""
    return (start_code - image.lowest_exec_vaddr) & ~(_PAGE - 1)


def _describe(machine: str, elf_class: int) -> str:
    names = {"EM_386": "i386", "EM_AARCH64": "aarch64", "EM_ARM": "arm", "EM_RISCV": "riscv"}
    return f"{names.get(machine, machine.removeprefix('EM_').lower())} ({elf_class}-bit)"


@functools.lru_cache(maxsize=256)
def read_elf(path: str) -> ElfImage:
    """Read an ELF file's facts; :class:`BadInputError` if it is not an ELF file at all."""
    # pyelftools on first use: a decode imports this module and never reads an ELF here.
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    real = os.path.realpath(path)
    try:
        with open(real, "rb") as f:
            head = f.read(20)
            if head[:4] != b"\x7fELF":
                raise BadInputError(f"{path} is not an ELF executable")
            elf_class = 64 if head[4:5] == b"\x02" else 32
            machine = _MACHINES.get(int.from_bytes(head[18:20], "little"), "EM_OTHER")
            if (elf_class, machine) != (64, "EM_X86_64"):
                # Not ours to run: say what it is without parsing the rest.
                return ElfImage(real, machine, elf_class, False, 0, None, (), None)
            f.seek(0)
            elf = ELFFile(f)
            segments = []
            interp = None
            for seg in elf.iter_segments():
                if seg["p_type"] == "PT_INTERP":
                    interp = seg.get_interp_name()  # type: ignore[attr-defined]
                elif seg["p_type"] == "PT_LOAD" and seg["p_flags"] & _PF_X:
                    start = seg["p_vaddr"] & ~(_PAGE - 1)
                    end = -(-(seg["p_vaddr"] + seg["p_memsz"]) // _PAGE) * _PAGE
                    segments.append(Segment(start, end - start, seg["p_offset"] & ~(_PAGE - 1)))
            build_id = gnu_build_id(elf)
            return ElfImage(
                path=real,
                machine=str(elf["e_machine"]),
                elf_class=elf.elfclass,
                pie=elf["e_type"] == "ET_DYN",
                entry=elf["e_entry"],
                interpreter=interp,
                exec_segments=tuple(segments),
                build_id=build_id,
            )
    except OSError as e:
        raise BadInputError(f"cannot read {path}: {e.strerror or e}") from e
    except (ELFError, ValueError, KeyError) as e:
        raise BadInputError(f"{path} is not a valid ELF file ({e})") from e


def describe_machine(image: ElfImage) -> str:
    """``x86-64`` style name of the image's architecture, for error messages."""
    return _describe(image.machine, image.elf_class)


def program_path(name: str) -> Path:
    """Resolve a command name like the shell does (PATH search when it has no slash)."""
    import shutil

    if os.sep in name:
        p = Path(name)
    else:
        found = shutil.which(name)
        if found is None:
            raise BadInputError(f"{name}: program not found (not in PATH)")
        p = Path(found)
    if not p.exists():
        raise BadInputError(f"{name}: program not found")
    if p.is_dir():
        raise BadInputError(f"{name} is a directory, not a program")
    if not os.access(p, os.X_OK):
        raise BadInputError(f"{name} is not executable")
    return p.resolve()
