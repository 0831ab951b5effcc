"""JIT perf maps (``/tmp/perf-PID.map``): names for code perf has no symbol for.

JIT compilers (the JVM with ``-XX:+DumpPerfMapAtExit``, .NET with
``DOTNET_PerfMapEnabled=1``, node ``--perf-basic-prof``) append one line per compiled
function: ``START SIZE NAME`` with hexadecimal START and SIZE, ``0x`` optional (``jcmd
Compiler.perfmap`` writes it). A map is only consulted for locations perf left unresolved;
when regions overlap (code freed and reused), the line written last wins.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Final

import numpy as np

from ptscope.errors import BadInputError
from ptscope.model import UNKNOWN_SYMBOL, BranchBatch, BranchEvent, Event, Location

__all__ = [
    "MapResolver",
    "PerfMap",
    "load_perf_maps",
    "perf_map_path",
    "resolve_location",
]

log = logging.getLogger("ptscope")

_PID_RE: Final = re.compile(r"perf-(\d+)\.map$")


def perf_map_path(pid: int, directory: Path = Path("/tmp")) -> Path:
    return directory / f"perf-{pid}.map"


def _hex(text: str) -> int:
    return int(text[2:] if text[:2].lower() == "0x" else text, 16)


@dataclass(frozen=True)
class PerfMap:
    """Sorted, non-overlapping ``[start, end)`` ranges with names."""

    starts: tuple[int, ...]
    ends: tuple[int, ...]
    names: tuple[str, ...]
    entries: tuple[int, ...]
    """Each range's function start (a range can be the remnant of a function overlaid)."""
    skipped: int = 0

    @classmethod
    def parse(cls, text: str) -> PerfMap:
        """Parse map text; malformed lines are counted in ``skipped``, never fatal."""
        entries: list[tuple[int, int, str]] = []
        skipped = 0
        for line in text.splitlines():
            parts = line.strip().split(maxsplit=2)
            if len(parts) < 3:
                skipped += bool(line.strip())
                continue
            try:
                start, size = _hex(parts[0]), _hex(parts[1])
            except ValueError:
                skipped += 1
                continue
            if size <= 0:
                skipped += 1
                continue
            entries.append((start, start + size, parts[2]))
        return cls._from_entries(entries, skipped)

    @classmethod
    def _from_entries(cls, entries: list[tuple[int, int, str]], skipped: int) -> PerfMap:
        ordered = sorted(entries)
        if all(a[1] <= b[0] for a, b in pairwise(ordered)):
            firsts = tuple(e[0] for e in ordered)
            return cls(
                firsts, tuple(e[1] for e in ordered), tuple(e[2] for e in ordered), firsts, skipped
            )
        # Overlaps (code freed and reused): later lines win, each laid over the others.
        starts: list[int] = []
        ends: list[int] = []
        names: list[str] = []
        origins: list[int] = []
        for start, end, name in entries:
            i = bisect.bisect_right(ends, start)
            j = bisect.bisect_left(starts, end)
            pieces: list[tuple[int, int, str, int]] = []
            if i < j:
                if starts[i] < start:
                    pieces.append((starts[i], start, names[i], origins[i]))
                if ends[j - 1] > end:
                    pieces.append((end, ends[j - 1], names[j - 1], origins[j - 1]))
            new = sorted([*pieces, (start, end, name, start)])
            starts[i:j] = [p[0] for p in new]
            ends[i:j] = [p[1] for p in new]
            names[i:j] = [p[2] for p in new]
            origins[i:j] = [p[3] for p in new]
        return cls(tuple(starts), tuple(ends), tuple(names), tuple(origins), skipped)

    @classmethod
    def load(cls, path: Path) -> PerfMap:
        try:
            return cls.parse(path.read_text(errors="replace"))
        except OSError as e:
            raise BadInputError(f"cannot read perf map {path}: {e.strerror or e}") from e

    def lookup(self, ip: int) -> tuple[str, int] | None:
        """(name, start) of the function containing ``ip``."""
        i = bisect.bisect_right(self.starts, ip) - 1
        if i >= 0 and ip < self.ends[i]:
            return self.names[i], self.entries[i]
        return None

    def __len__(self) -> int:
        return len(self.starts)

    @staticmethod
    def pid_of(path: Path) -> int | None:
        """The PID a perf map belongs to, from its name (``perf-PID.map``)."""
        m = _PID_RE.search(path.name)
        return int(m.group(1)) if m else None


def resolve_location(location: Location, perf_map: PerfMap) -> Location:
    """``location`` itself when perf resolved it or the map does not know the address;
    otherwise a new Location named from the map (offset from the JIT function's start)."""
    if location.symbol and location.symbol != UNKNOWN_SYMBOL:
        return location
    found = perf_map.lookup(location.ip)
    if found is None:
        return location
    name, start = found
    return Location(location.ip, name, location.ip - start, location.dso)


def load_perf_maps(directory: Path, pids: Iterable[int]) -> dict[int, PerfMap]:
    """JIT perf maps (``perf-PID.map``) kept in a recording's ``directory``, or still in
    /tmp for its processes ``pids``."""
    maps: dict[int, PerfMap] = {}
    candidates = list(directory.glob("perf-*.map"))
    candidates += [perf_map_path(pid) for pid in pids]
    for path in candidates:
        pid = PerfMap.pid_of(path)
        if pid is not None and pid not in maps and path.is_file():
            maps[pid] = PerfMap.load(path)
            log.info("using perf map %s (%d symbols)", path, len(maps[pid]))
    return maps


class MapResolver:
    """Names JIT code that perf could not resolve, from its process's perf map, in the
    decoders' batches: event objects (the text decoder) and the columnar stream's
    branch batches (the dlfilter)."""

    def __init__(self, maps: dict[int, PerfMap]) -> None:
        self.maps = maps
        # Keyed by the Location's id, which is kept alive beside its answer (a new object
        # must not inherit a dead one's id).
        self._locations: dict[tuple[int, int], tuple[Location, Location]] = {}
        self._rows: dict[tuple[int, int], int] = {}

    def events(self, batch: list[Event]) -> list[Event]:
        """``batch`` with its branches' locations resolved (in place)."""
        if not self.maps:
            return batch
        for event in batch:
            if isinstance(event, BranchEvent) and event.pid in self.maps:
                event.src = self._resolved(event.pid, event.src)
                event.dst = self._resolved(event.pid, event.dst)
        return batch

    def columnar(self, batch: Sequence[Event | BranchBatch]) -> Sequence[Event | BranchBatch]:
        """:meth:`events` for a batch of the columnar stream."""
        if not self.maps:
            return batch
        out = [self._batch(e) if type(e) is BranchBatch else e for e in batch]
        self.events(out)  # type: ignore[arg-type]
        return out

    def _resolved(self, pid: int, loc: Location) -> Location:
        key = (pid, id(loc))
        found = self._locations.get(key)
        if found is None:
            found = self._locations[key] = (loc, resolve_location(loc, self.maps[pid]))
        return found[1]

    def _batch(self, batch: BranchBatch) -> BranchBatch:
        """:meth:`events` for a branch batch: its rows of mapped processes get resolved
        locations (new rows of its location table)."""
        maps, cache = self.maps, self._rows
        rows = np.flatnonzero(np.isin(batch.pid, np.array(list(maps), dtype=np.int32)))
        if not len(rows):
            return batch
        table = batch.locations
        pids = batch.pid[rows]
        for column in ("src", "dst"):
            ids = getattr(batch, column).copy()
            keys = (pids.astype(np.int64) << 32) | ids[rows].astype(np.int64)
            uniq, inverse = np.unique(keys, return_inverse=True)
            new = np.empty(len(uniq), dtype=np.int32)
            for i, key in enumerate(uniq.tolist()):
                pid, loc = key >> 32, key & 0xFFFFFFFF
                found = cache.get((pid, loc))
                if found is None:
                    found = cache[(pid, loc)] = table.add(resolve_location(table[loc], maps[pid]))
                new[i] = found
            ids[rows] = new[inverse]
            setattr(batch, column, ids)
        return batch
