"""Fuzzing the own Intel PT decoder (``decode/native.py`` and ``_native/pt_*.c``) on
damaged perf.data files: real emulated recordings (one thread; three threads) with their
trace damaged (bits flipped, bytes set, runs of random bytes or zeros, packets cut out or
repeated inside an AUX buffer), their sideband records' numbers set at and past the limits
(addresses, lengths, pids, times of MMAP2, COMM, FORK, EXIT, AUX, ITRACE_START), or the
file itself cut, shortened or spliced (buffers cut, records torn).

The decoder may refuse a file in one line (a ``PtscopeError``, or ``NativeUnsupported``
for what it does not take, which perf then decodes). Otherwise it must not crash, hang or
grow without bound: what it gives, decode errors as events, the C engine and the Python
engine take and the trace writer writes.
"""

from __future__ import annotations

import io
import resource
import struct
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.mutations import damaged_bytes, edge_numbers
from fuzz.target import FuzzTarget, quick
from ptscope.decode.native import NativeUnsupported, decode_native, decode_native_columnar
from ptscope.errors import PtscopeError
from ptscope.fxt import FxtWriter
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import make_engine

_AUXTRACE = 71
_SIDEBAND = {
    1,
    2,
    3,
    4,
    7,
    10,
    11,
    12,
    14,
    15,
}  # MMAP LOST COMM EXIT FORK MMAP2 AUX ITRACE_START SWITCH(_CPU_WIDE)


@cache
def seeds() -> list[bytes]:
    """Small real recordings' perf.data bytes (their binaries stay where they were built,
    so the decoder finds the code)."""
    from ptscope.record.emulated import record
    from support import programs

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, static, args in (("basics", True, ("30",)), ("threads", False, ())):
            exe = programs.build(name, static=static)
            result = record([str(exe), *args], Path(tmp) / name, max_instructions=400_000)
            (perf_data,) = result.recording.perf_data_paths()
            out.append(perf_data.read_bytes())
    return out


def _records(data: bytes) -> list[tuple[int, int, int]]:
    """(offset, type, size) of each record of the data section (AUXTRACE: with its data)."""
    if len(data) < 56:
        return []
    data_off, data_size = struct.unpack_from("<QQ", data, 40)
    out = []
    pos, end = data_off, min(data_off + data_size, len(data))
    while pos + 8 <= end:
        rtype, _misc, size = struct.unpack_from("<IHH", data, pos)
        if size < 8:
            break
        total = size
        if rtype == _AUXTRACE and pos + 16 <= end:
            total += struct.unpack_from("<Q", data, pos + 8)[0]
        if pos + total > end:
            break
        out.append((pos, rtype, total))
        pos += total
    return out


@st.composite
def _damaged_trace(draw: st.DrawFn, data: bytearray) -> None:
    """Damage inside one AUX buffer (its size unchanged: the file still frames)."""
    buffers = [(o + 48, s - 48) for o, t, s in _records(bytes(data)) if t == _AUXTRACE and s > 48]
    if not buffers:
        return
    start, size = draw(st.sampled_from(buffers))
    at = start + draw(st.integers(0, size - 1))
    n = min(draw(st.sampled_from([1, 1, 4, 16, 64, 300])), start + size - at)
    kind = draw(st.sampled_from(["flip", "byte", "random", "zeros", "shift", "repeat"]))
    if kind == "flip":
        data[at] ^= 1 << draw(st.integers(0, 7))
    elif kind == "byte":
        data[at] = draw(st.integers(0, 255))
    elif kind == "random":
        data[at : at + n] = draw(st.binary(min_size=n, max_size=n))
    elif kind == "zeros":
        data[at : at + n] = bytes(n)
    elif kind == "shift":  # bytes cut out, the rest moved up (the end padded)
        piece = data[at + n : start + size] + bytes(n)
        data[at : start + size] = piece
    else:  # a piece repeated over what follows it
        piece = data[at : at + n]
        room = start + size - (at + n)
        data[at + n : at + n + min(n, room)] = piece[: min(n, room)]


@st.composite
def _damaged_sideband(draw: st.DrawFn, data: bytearray) -> None:
    """A number of one sideband record (a word past its header) at an edge value."""
    records = [(o, s) for o, t, s in _records(bytes(data)) if t in _SIDEBAND and s > 8]
    if not records:
        return
    offset, size = draw(st.sampled_from(records))
    at = offset + 8 + 4 * draw(st.integers(0, (size - 8) // 4 - 1))
    width = draw(st.sampled_from([4, 8]))
    if at + width > offset + size:
        width = 4
    data[at : at + width] = draw(edge_numbers(8 * width)).to_bytes(width, "little")


@st.composite
def damaged_recordings(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds())))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 9))
        if kind < 6:
            draw(_damaged_trace(data))
        elif kind < 9:
            draw(_damaged_sideband(data))
        else:
            data = bytearray(draw(damaged_bytes([bytes(data)], max_edits=2)))
    return bytes(data)


def check_recording(case: tuple[bytes, bool, bool]) -> None:
    data, insns, columnar = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "perf.data"
        path.write_bytes(data)
        try:
            if columnar:  # (with inlined bodies: blocks split at the binaries' inline runs)
                batches = decode_native_columnar(path, insns=insns, inline=True)
                items: list[Any] = [x for b in batches for x in b]
            else:
                items = [e for b in decode_native(path, insns=insns) for e in b]
        except NativeUnsupported:
            return
        except PtscopeError as e:
            assert "\n" not in e.message, e.message
            return
    engine = make_engine() if columnar else TraceSegmentEngine()
    engine.feed_all(items)
    FxtWriter(io.BytesIO()).timeline(engine.finish())
    # Memory stays bounded whatever the damage (a length, a count or an address taken for
    # a size would show here): the process's peak, which only grows, stays far below it.
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    assert peak_mb < MEMORY_BOUND_MB, f"peak RSS {peak_mb:.0f} MB"


MEMORY_BOUND_MB = 2048


TARGET = FuzzTarget(
    name="native-decoder",
    inputs=st.tuples(damaged_recordings(), st.booleans(), st.booleans()),
    check=check_recording,
)

test_fuzz = quick(TARGET, examples=60)
