"""Per-function totals of the slices a trace is written with: how often each function was
called and how long its calls took (inclusive), for the decode's summary.

The writer keeps them as it goes (:class:`FunctionTotals`, vectorised per batch), so a
streamed decode never holds its slices to say which functions took the time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from ptscope.timeline import Timeline

try:  # the sums in C (fxt/_cfxt.c); without it, numpy's bincounts below
    from ptscope.fxt import _cfxt
except ImportError:  # pragma: no cover - the extension is optional
    _cfxt = None

__all__ = ["FunctionStat", "FunctionTotals", "top_functions"]

_CHUNK: Final = 8192
"""Rows summed at once: whole-column temporaries (durations, their float64 copy,
bincount's intp copy of the ids) are fresh mmapped memory, and first-touch page faults
made the summary cost more than writing the trace on a VM; small chunks reuse the heap."""


@dataclass
class FunctionStat:
    """How often a function was called and how long its calls took in total."""

    name: str
    calls: int
    total_ns: int


class FunctionTotals:
    """Calls and total time per name id, summed batch by batch."""

    def __init__(self) -> None:
        self.calls = np.zeros(0, dtype=np.int64)
        self.total = np.zeros(0, dtype=np.int64)

    def add(
        self,
        name_id: npt.NDArray[np.integer],
        start: npt.NDArray[np.int64],
        end: npt.NDArray[np.int64],
        names: int,
    ) -> None:
        """Count slices (their name ids, start and end times; ``names``: the name table's
        length)."""
        if len(self.calls) < names:
            grow = np.zeros(names - len(self.calls), np.int64)
            self.calls = np.concatenate([self.calls, grow])
            self.total = np.concatenate([self.total, grow])
        if _cfxt is not None:
            # One pass, exact in int64 (the bincounts: a tenth of ptscope's numpy time).
            _cfxt.add_totals(
                np.ascontiguousarray(name_id, dtype=np.int32),
                np.ascontiguousarray(start, dtype=np.int64),
                np.ascontiguousarray(end, dtype=np.int64),
                self.calls[:names],
                self.total[:names],
            )
            return
        for i in range(0, len(name_id), _CHUNK):
            ids = name_id[i : i + _CHUNK]
            self.calls[:names] += np.bincount(ids, minlength=names)
            durations = (end[i : i + _CHUNK] - start[i : i + _CHUNK]).astype(np.float64)
            self.total[:names] += np.bincount(ids, weights=durations, minlength=names).astype(
                np.int64
            )

    def top(self, names: list[str], limit: int = 10) -> list[FunctionStat]:
        """The ``limit`` functions with the most total time (synthetic frames, named
        ``[...]``, left out)."""
        out: list[FunctionStat] = []
        for i in np.argsort(-self.total, kind="stable").tolist():
            if len(out) == limit:
                break
            if self.calls[i] and not names[i].startswith("["):
                out.append(FunctionStat(names[i], int(self.calls[i]), int(self.total[i])))
        return out


def top_functions(timeline: Timeline, limit: int = 10) -> list[FunctionStat]:
    """The functions with the most total time in their calls (inclusive), across threads."""
    totals = FunctionTotals()
    for thread in timeline.threads:
        totals.add(thread.name_id, thread.start, thread.end, len(timeline.names))
    return totals.top(timeline.names, limit)
