"""A binary's inlined code as the decoders take it: runs of file addresses, each in a node.

:mod:`ptscope.decode.inline_info` reads a binary's DWARF inline information (link-time
virtual addresses, scopes numbered per binary). The decoders resolve addresses as perf
does, in *file addresses* (a virtual address inside a ``PT_LOAD`` segment, less the
segment's ``p_vaddr - p_offset``: what perf's symbols are in), and the engine knows one
numbering of inlined bodies per decode (:class:`ptscope.model.InlineNodes`). This module
converts the one into the other, once per binary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from ptscope.decode.inline_info import InlineTable, read_inline_table
from ptscope.decode.perf_dsos import Dso, DsoLocator
from ptscope.decode.perf_symbols import ElfImage
from ptscope.errors import PtscopeError
from ptscope.model import InlineNodes

__all__ = [
    "RUNS_MAGIC",
    "RUNS_VERSION",
    "InlineRuns",
    "dlfilter_argument",
    "dwarf_file",
    "inline_runs",
    "recording_runs",
    "write_runs_file",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InlineRuns:
    """Sorted, disjoint runs ``[start, end)`` of file addresses and the innermost inlined
    body (a node of the decode's :class:`~ptscope.model.InlineNodes`) of each."""

    start: npt.NDArray[np.uint64]
    end: npt.NDArray[np.uint64]
    node: npt.NDArray[np.int32]

    def __len__(self) -> int:
        return int(self.start.shape[0])


def _nodes(table: InlineTable, inline: InlineNodes, key: object) -> npt.NDArray[np.int32]:
    """The decode-wide node of each of the binary's scopes (parents added first)."""
    scopes = table.scopes
    node = np.zeros(len(scopes), dtype=np.int32)
    done = np.zeros(len(scopes), dtype=bool)
    for i in range(len(scopes)):
        chain = []
        k = i
        while k >= 0 and not done[k]:
            chain.append(k)
            k = scopes[k].parent
            if len(chain) > len(scopes):
                raise ValueError("inlined scopes form a cycle")
        for k in reversed(chain):
            s = scopes[k]
            parent = int(node[s.parent]) if s.parent >= 0 else 0
            node[k] = inline.add((key, k), s.name, s.call_site, parent)
            done[k] = True
    return node


def _file_addresses(
    vaddr: npt.NDArray[np.uint64], loads: list[tuple[int, int, int]]
) -> npt.NDArray[np.uint64]:
    out = vaddr.copy()
    for start, offset, size in loads:
        inside = (vaddr >= np.uint64(start)) & (vaddr < np.uint64(start + size))
        out[inside] = vaddr[inside] - np.uint64(start - offset)
    return out


def dwarf_file(dso: Dso, locator: DsoLocator, runtime: Path) -> str:
    """Where a DSO's DWARF is: the first of the files perf looks in for its symbols (its
    debuglink, the build-id cache — an archive's copies under ``--symfs`` —,
    ``/usr/lib/debug``) that has a ``.debug_info`` and the DSO's build-id, else ``runtime``
    (the file read for its code; the reader looks for a separate debug file too)."""
    for candidate in locator.symbol_candidates(dso):
        if not os.path.isfile(candidate):
            continue
        image = ElfImage.open(candidate)
        if image is None:
            continue
        try:
            if image.section(".debug_info") is not None and (
                not dso.build_id or image.build_id() == dso.build_id
            ):
                return candidate
        finally:
            image.close()
    return str(runtime)


def inline_runs(
    dwarf: str, inline: InlineNodes, key: object, runtime: str | None = None
) -> InlineRuns | None:
    """The inlined code of a binary (None: none known) from the DWARF in file ``dwarf``, in
    the file addresses of ``runtime`` (the binary itself; default: ``dwarf``), its scopes
    added to ``inline`` under ``key`` (the binary's identity within the decode)."""
    table = read_inline_table(dwarf)
    if table is None or not len(table.starts):
        return None
    image = ElfImage.open(runtime or dwarf)
    if image is None:
        return None
    try:
        loads = list(image.loads)
    finally:
        image.close()
    try:
        nodes = _nodes(table, inline, key)
    except ValueError as e:
        log.debug("inline information of %s not used: %s", dwarf, e)
        return None
    start = _file_addresses(np.asarray(table.starts, dtype=np.uint64), loads)
    end = _file_addresses(np.asarray(table.ends, dtype=np.uint64) - np.uint64(1), loads)
    end += np.uint64(1)
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    node = nodes[np.asarray(table.scope, dtype=np.intp)[order]]
    keep = end > start
    if len(start) > 1:
        keep[1:] &= start[1:] >= end[:-1]  # (overlaps cannot come from one segment's runs)
    return InlineRuns(start[keep], end[keep], node[keep].astype(np.int32))


# ------------------------------------------------------------ for perf's dlfilter

RUNS_MAGIC: Final = b"PTSINLN\0"
RUNS_VERSION: Final = 1
"""The runs file (docs/file-formats.md, "Inline runs"): what the dlfilter, inside perf,
knows of the binaries' inlined code (``--dlarg inline=PATH``)."""


def write_runs_file(path: Path, runs: Mapping[str, InlineRuns]) -> None:
    """Write ``runs`` (by the DSO names perf gives them) for the dlfilter."""
    out = bytearray(RUNS_MAGIC + struct.pack("<II", RUNS_VERSION, len(runs)))
    for name, r in runs.items():
        raw = name.encode("utf-8", "surrogateescape")
        out += struct.pack("<IIQ", len(raw), 0, len(r))
        out += raw + b"\0" * (8 - len(raw) % 8)  # NUL-terminated, padded to 8
        out += r.start.astype("<u8").tobytes() + r.end.astype("<u8").tobytes()
        out += r.node.astype("<i4").tobytes()
        out += b"\0" * (-len(out) % 8)
    path.write_bytes(bytes(out))


def dlfilter_argument(
    perf_data: Path, inline: InlineNodes, symfs: Path | None, scratch: contextlib.ExitStack
) -> list[str]:
    """The dlfilter's ``--dlarg inline=PATH``: the recording's inlined code
    (:func:`recording_runs`, its nodes added to ``inline``) in a runs file that ``scratch``
    removes; no argument where there is none."""
    from ptscope.children import temporary_directory

    runs = recording_runs(perf_data, inline, symfs)
    if not runs:
        return []
    file = scratch.enter_context(temporary_directory("ptscope-inline-")) / "inline-runs"
    write_runs_file(file, runs)
    return ["--dlarg", f"inline={file}"]


def recording_runs(
    perf_data: Path, inline: InlineNodes, symfs: Path | None = None
) -> dict[str, InlineRuns]:
    """The inlined code of every binary a recording maps, by the name perf gives it, read
    where perf reads it (as the own decoder does: :mod:`ptscope.decode.perf_dsos`). Empty
    where the recording cannot be read here (perf then decodes it without)."""
    from ptscope.decode import perf_data as pd
    from ptscope.decode.native_support import read_cached
    from ptscope.decode.perf_dsos import DsoTable, classify_mapping

    try:
        data = read_cached(perf_data)
    except (pd.Unsupported, PtscopeError, OSError, ValueError) as e:
        # (what perf cannot read either: its own error says what is wrong)
        log.debug("no inline information for %s: %s", perf_data, e)
        return {}
    table = DsoTable(data.build_ids)
    locator = DsoLocator(symfs)
    out: dict[str, InlineRuns] = {}
    seen: set[str] = set()
    for rec in data.sideband:
        if rec.type not in (pd.REC_MMAP, pd.REC_MMAP2):
            continue
        if rec.misc & pd.MISC_CPUMODE_MASK == pd.MISC_KERNEL:
            continue
        _addr, _length, _pgoff, prot, flags = rec.fields
        if rec.type == pd.REC_MMAP:
            prot = 0 if rec.misc & (1 << 13) else 4  # PERF_RECORD_MISC_MMAP_DATA
        if not prot & 4:  # PROT_EXEC: code
            continue
        name, kind, identity = classify_mapping(rec.name, rec.pid, prot, flags)
        if name in seen or identity:
            continue
        seen.add(name)
        dso = table.find(name, kind, identity, (0, 0, 0, 0), rec.build_id)
        path = locator.data_path(dso)
        if path is None:
            continue
        runs = inline_runs(dwarf_file(dso, locator, path), inline, name, str(path))
        if runs is not None:
            out[name] = runs
    return out
