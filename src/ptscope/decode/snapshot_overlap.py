"""Where each buffer of a snapshot recording starts to hold new trace, as perf finds it.

In snapshot mode (``perf record -S``) every snapshot copies the whole AUX ring, so a
queue's next buffer may repeat the end of the one before. perf's decoder cuts the repeat
off before decoding (``intel_pt_find_overlap``): the new data starts at a PSB (what comes
before a buffer's first PSB cannot be decoded), the two buffers line up at the last PSB+
of the older one whose TSC the newer one also has, and up to 7 bytes of padding at the
older one's end are allowed for. A buffer that continues the one before is decoded as
one stream with it; one that does not restarts the decoder at its first PSB. Without
TSCs the buffers are compared byte by byte from each PSB of the older one.

The rules are perf 6.1's, so that both decoders decode the same bytes; the code is our
own. Offsets are the file's (the buffers lie in the mmap'd perf.data, so the padding
check may look at the bytes before a buffer, as perf's does).
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from ptscope.decode import _ptdecode  # type: ignore[attr-defined]

__all__ = ["BufferUse", "buffer_uses"]

Trace: TypeAlias = bytes | mmap.mmap
"""The perf.data's bytes (mapped)."""

_PSB: Final = b"\x02\x82" * 8
_MAX_PADDING: Final = 7
"""perf aligns AUXTRACE data to 8 bytes."""
_HALFWAY: Final = 1 << 55
"""Two 7-byte TSCs further apart than this are taken to have wrapped."""


@dataclass(frozen=True)
class BufferUse:
    """What of one buffer the decoder reads: ``size`` bytes from file offset ``offset``
    (0: none of it is new), and whether they continue the buffer before."""

    offset: int
    size: int
    consecutive: bool


def buffer_uses(
    trace: Trace, buffers: Sequence[tuple[int, int]], *, have_tsc: bool
) -> list[BufferUse]:
    """How perf uses each of a queue's buffers, given as (file offset, size) in order."""
    uses: list[BufferUse] = []
    older: tuple[int, int] | None = None  # the last buffer with new data (all of it)
    for offset, size in buffers:
        end = offset + size
        if older is None:
            use = BufferUse(offset, size, False)
        else:
            start, consecutive = _find_overlap(trace, older, (offset, end), have_tsc)
            use = BufferUse(start, end - start, consecutive and end > start)
        uses.append(use)
        if use.size:
            older = (offset, end)
    return uses


def _find_overlap(
    trace: Trace, a: tuple[int, int], b: tuple[int, int], have_tsc: bool
) -> tuple[int, bool]:
    """Where new data starts in buffer ``b`` after buffer ``a`` (both (start, end)), and
    whether it continues ``a``."""
    b_start, b_end = b
    b_at = _find(trace, b_start, b_end)
    if b_at < 0:
        return b_end, False  # no PSB: nothing decodable
    a_at = _find(trace, a[0], a[1])
    if a_at < 0:
        return b_at, False
    if have_tsc:
        return _overlap_by_tsc(trace, (a_at, a[1]), (b_at, b_end))
    return _overlap_by_bytes(trace, (a_at, a[1]), (b_at, b_end))


def _overlap_by_tsc(trace: Trace, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, bool]:
    a_start, a_end = a
    b_at, b_end = b
    last = _rfind(trace, a_start, a_end)
    if last < 0:
        return b_at, False
    found = _ptdecode.psb_tsc(trace, last, a_end)
    if found is None:
        # The last PSB+ is cut short: the one before it (and a ends where that one began).
        a_end = last
        last = _rfind(trace, a_start, a_end)
        if last < 0:
            return b_at, False
        found = _ptdecode.psb_tsc(trace, last, a_end)
        if found is None:
            return b_at, False
    tsc_a, at_a = found
    rem_a = a_end - at_a
    while True:
        found = _ptdecode.psb_tsc(trace, b_at, b_end)
        if found is not None:
            tsc_b, at_b = found
            order = _tsc_order(tsc_a, tsc_b)
            if order == 0 and b_end - at_b >= rem_a:
                return _after_padding(trace, at_b + rem_a, a_end), True
            if order < 0:
                return b_at, False  # b starts after a ends
        following = _find(trace, b_at + 1, b_end)
        if following < 0:
            return b_end, False
        b_at = following


def _overlap_by_bytes(trace: Trace, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, bool]:
    a_at, a_end = a
    b_at, b_end = b
    # b cannot end inside a: only the last len(b) bytes of a can repeat in b
    while b_end - b_at < a_end - a_at:
        a_at = _find(trace, a_at + 1, a_end)
        if a_at < 0:
            return b_at, False
    while True:
        n = a_end - a_at
        if trace[b_at : b_at + n] == trace[a_at:a_end]:
            return _after_padding(trace, b_at + n, a_end), True
        a_at = _find(trace, a_at + 1, a_end)
        if a_at < 0:
            return b_at, False


def _after_padding(trace: Trace, start: int, a_end: int) -> int:
    """``start`` moved back over the bytes that may be a's padding (up to 7, as long as
    they equal a's last bytes)."""
    p, q = start - _MAX_PADDING, a_end - _MAX_PADDING
    for _ in range(_MAX_PADDING):
        if p < 0 or q < 0 or trace[p] != trace[q]:
            break
        p += 1
        q += 1
    return p


def _tsc_order(a: int, b: int) -> int:
    """-1, 0 or 1 as 7-byte TSC ``a`` is before, at or after ``b`` (allowing for a wrap)."""
    if a == b:
        return 0
    if a < b:
        return -1 if b - a < _HALFWAY else 1
    return 1 if a - b < _HALFWAY else -1


def _find(trace: Trace, start: int, end: int) -> int:
    """The first PSB wholly in [start, end), or -1."""
    return trace.find(_PSB, start, end) if end > start else -1


def _rfind(trace: Trace, start: int, end: int) -> int:
    """The last PSB wholly in [start, end), or -1."""
    return trace.rfind(_PSB, start, end) if end > start else -1
