"""The DSOs of a recording as perf 6.1 knows them, and where perf reads each one, for the
own decoder (:mod:`ptscope.decode.native`).

perf turns every mmap record into a map of a DSO (``machine__process_mmap2_event``,
``map__new``): most are files named by the record's file name, ``[vdso]`` is the vDSO,
and executable anonymous memory (``//anon``, ``[heap]``, ``[stack]``, huge pages) is the
JIT DSO ``/tmp/perf-PID.map``, whose symbols perf reads from that map file at decode time.
A DSO's bytes come from perf's build-id cache when it holds them, else from the file at
its path (under ``--symfs`` when given: a symfs also moves the build-id cache to
``SYMFS/.debug``); its symbols from the first of perf's candidates that exists and has
the recorded build-id (``dso__load``: the debuglink, the build-id cache, ``/usr/lib/debug``
in its layouts, the file itself). The rules are perf's own (docs/architecture.md, "The
own decoder: images and symbols").
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

__all__ = [
    "Dso",
    "DsoLocator",
    "classify_mapping",
]

PROT_EXEC: Final = 4
MAP_HUGETLB: Final = 0x40000

VDSO_NAME: Final = "[vdso]"


def _is_anon(name: str, flags: int) -> bool:
    return (
        name == "//anon"
        or name.startswith("/dev/zero")
        or name.startswith("/anon_hugepage")
        or bool(flags & MAP_HUGETLB)
    )


def _is_no_dso(name: str) -> bool:
    return name.startswith("[stack") or name.startswith("/SYSV") or name == "[heap]"


def classify_mapping(name: str, pid: int, prot: int, flags: int) -> tuple[str, str, bool]:
    """What perf makes of a mapping of ``name`` (``map__new``): (the DSO's name, its kind,
    whether addresses in it are absolute). Kinds: ``file``, ``vdso``, ``perfmap`` (JIT
    code: ``/tmp/perf-PID.map``), ``none`` (anonymous memory that is not code: no bytes,
    no symbols)."""
    anon = _is_anon(name, flags)
    no_dso = _is_no_dso(name)
    if anon or no_dso:
        if prot & PROT_EXEC and pid != 0:
            return f"/tmp/perf-{pid}.map", "perfmap", True
        return name, "none", True
    if name == VDSO_NAME:
        return name, "vdso", False
    return name, "file", False


@dataclass
class Dso:
    """One DSO: perf's name for it (what locations show), its build-id, and its file in
    the C image once one was made (``index``)."""

    name: str
    kind: str
    identity: bool
    build_id: bytes | None = None
    inode: tuple[int, int, int, int] = (0, 0, 0, 0)
    index: int = -1
    data_path: Path | None = None
    """Where its bytes are read from (None: perf cannot read them)."""
    loaded: bool = False
    extra: dict[str, object] = field(default_factory=dict)


def _compatible(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """perf's ``dso_id__cmp``: ids compare unless either is all zero (an mmap record
    without one); the inode generation only when both have one."""
    if not any(a) or not any(b):
        return True
    if a[:3] != b[:3]:
        return False
    return not (a[3] and b[3] and a[3] != b[3])


class DsoLocator:
    """Where perf looks for a DSO's files (``dso__read_binary_type_filename``)."""

    def __init__(self, symfs: Path | None = None, buildid_dir: Path | None = None) -> None:
        self.symfs = str(symfs) if symfs is not None else ""
        if buildid_dir is None:
            if symfs is not None:
                buildid_dir = Path(symfs) / ".debug"
            else:
                buildid_dir = Path(os.environ.get("HOME", "/")) / ".debug"
        self.buildid_dir = buildid_dir

    def join(self, path: str) -> str:
        """perf's ``path__join(symfs, path)``."""
        s = self.symfs
        if s and path and not s.endswith("/") and not path.startswith("/"):
            return f"{s}/{path}"
        return s + path

    def build_id_entry(self, build_id: bytes, kind: str, debug: bool) -> str:
        """A build-id cache entry: the link itself when it is a regular file (old cache
        layout), else its ``elf`` / ``debug`` / ``vdso`` file."""
        hexid = build_id.hex()
        link = os.path.join(self.buildid_dir, ".build-id", hexid[:2], hexid[2:])
        if os.path.isfile(link):
            return link
        base = "vdso" if kind == "vdso" else ("debug" if debug else "elf")
        return os.path.join(link, base)

    def data_path(self, dso: Dso) -> Path | None:
        """Where perf reads the DSO's bytes (``try_to_open_dso``): the build-id cache's
        copy, else the file at its name (no build-id check)."""
        if dso.kind == "none":
            return None
        if dso.build_id:
            entry = self.build_id_entry(dso.build_id, dso.kind, debug=False)
            if os.path.isfile(entry):
                return Path(entry)
        path = self.join(dso.name)
        return Path(path) if os.path.isfile(path) else None

    def symbol_candidates(self, dso: Dso) -> list[str]:
        """The files perf tries for symbols, in its order (``binary_type_symtab``)."""
        name = dso.name
        out: list[str] = []
        joined = self.join(name)
        # DEBUGLINK: the file's .gnu_debuglink, looked for where perf looks
        if os.path.isfile(joined):
            link = read_debuglink(joined)
            if link:
                directory = joined[: joined.rfind("/")] if "/" in joined else ""
                for candidate in (
                    link,
                    f"{directory}/{link}",
                    f"{directory}/.debug/{link}",
                    f"/usr/lib/debug{directory}/{link}",
                ):
                    if os.path.isfile(candidate):
                        out.append(candidate)
                        break
        if dso.build_id:
            out.append(self.build_id_entry(dso.build_id, dso.kind, debug=False))
            out.append(self.build_id_entry(dso.build_id, dso.kind, debug=True))
        out.append(self.join("/usr/lib/debug") + f"{name}.debug")  # Fedora
        out.append(self.join("/usr/lib/debug") + name)  # Ubuntu
        if dso.build_id:
            hexid = dso.build_id.hex()
            out.append(self.join("/usr/lib/debug/.build-id/") + f"{hexid[:2]}/{hexid[2:]}.debug")
        out.append(joined)  # the file itself
        slash = name.rfind("/")
        if slash >= 0:  # OpenEmbedded
            out.append(self.join("") + name[: slash + 1] + ".debug" + name[slash:])
        if name.startswith("/usr/lib/"):  # mixed-up Ubuntu
            out.append(self.join("/usr/lib/debug") + name[4:])
        return out


def read_debuglink(path: str) -> str | None:
    """The file name in an ELF file's ``.gnu_debuglink`` section, if any."""
    from ptscope.decode.perf_symbols import ElfImage

    elf = ElfImage.open(path)
    if elf is None:
        return None
    section = elf.section(".gnu_debuglink")
    if section is None:
        return None
    raw = elf.section_bytes(section)
    end = raw.find(b"\0")
    return raw[: end if end >= 0 else len(raw)].decode("utf-8", "surrogateescape") or None


class DsoTable:
    """Every DSO of a decode by perf's identity (name, and the mapping's inode when both
    records have one)."""

    def __init__(self, build_ids: dict[str, bytes]) -> None:
        self._by_name: dict[str, list[Dso]] = {}
        self.dsos: list[Dso] = []
        self._header_build_ids = build_ids

    def find(
        self, name: str, kind: str, identity: bool, inode: tuple[int, int, int, int],
        build_id: bytes,
    ) -> Dso:  # fmt: skip
        for dso in self._by_name.get(name, ()):
            if _compatible(dso.inode, inode):
                return dso
        bid = build_id or self._header_build_ids.get(name)
        if kind == "vdso" and not bid:
            bid = self._header_build_ids.get(VDSO_NAME)
        dso = Dso(name, kind, identity, bid or None, inode)
        self._by_name.setdefault(name, []).append(dso)
        self.dsos.append(dso)
        return dso
