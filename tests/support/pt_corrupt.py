"""Damage a recording on purpose: a copy with exactly one Intel PT TNT bit flipped.

The negative control of the emulated backend's tests, and a ready-made damaged recording for
testing that decode errors show up as ``[decode error]`` markers while the rest of the trace
is still written::

    flip = damaged_copy(recording_dir, tmp_path / "damaged")
    decode_recording(Recording.load(tmp_path / "damaged"), out)

Works on any perf.data with Intel PT AUXTRACE data in file mode; it walks the packet stream
(PSB, PSBEND, CBR, TSC, MODE, CYC, TIP family, PAD and short TNT -- what the emulated
backend writes) to find a one-bit "not taken" TNT packet and makes it "taken".

A flipped bit does not always show: the wrong path may consume the following packets just
as well and meet the right one again (a string compare loop does that). ``flip_tnt_bit``
flips one given candidate; ``damaged_copy`` tries candidates until perf reports an
``instruction trace error`` for the copy.
"""

from __future__ import annotations

import bisect
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

_AUXTRACE = 71
_TIP_FAMILY = {0x01, 0x0D, 0x11, 0x1D}
_IP_BYTES = {0: 0, 1: 2, 2: 4, 3: 6, 4: 6, 6: 8}
_NOT_TAKEN = 0x04  # short TNT, one bit, 0
_TAKEN = 0x06


@dataclass(frozen=True)
class Flip:
    """Where the bit was flipped."""

    file_offset: int
    tid: int
    queue: int
    packet_index: int
    """Index of the flipped packet among that buffer's packets."""


def auxtrace_buffers(perf_data: Path) -> list[tuple[int, int, int, int]]:
    """(file offset of the data, size, queue, tid) of every AUXTRACE buffer."""
    raw = perf_data.read_bytes()
    data_offset, data_size = struct.unpack_from("<QQ", raw, 40)
    pos, end = data_offset, data_offset + data_size
    out = []
    while pos < end:
        rtype, _misc, size = struct.unpack_from("<IHH", raw, pos)
        if size == 0:
            raise ValueError(f"{perf_data}: zero-sized record at {pos}")
        if rtype == _AUXTRACE:
            length, _offset, _ref, idx, tid = struct.unpack_from("<QQQII", raw, pos + 8)
            out.append((pos + size, length, idx, tid))
            pos += size + length
        else:
            pos += size
    return out


def packets(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of each packet of an Intel PT stream written by the emulated backend."""
    out = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b == 0x00:
            length = 1
        elif b == 0x02:
            second = data[i + 1]
            length = {0x82: 16, 0x23: 2, 0x03: 4}.get(second)
            if length is None:
                raise ValueError(f"unknown extended packet 02 {second:02x} at {i}")
        elif b == 0x19:
            length = 8
        elif b == 0x99:
            length = 2
        elif b & 0x03 == 0x03:  # CYC
            length = 1
            if b & 0x04:
                while data[i + length] & 1:
                    length += 1
                length += 1
        elif b & 0x1F in _TIP_FAMILY:
            length = 1 + _IP_BYTES[b >> 5]
        elif b & 1 == 0:
            length = 1  # short TNT
        else:
            raise ValueError(f"unknown packet {b:02x} at {i}")
        out.append((i, length))
        i += length
    return out


def flip_tnt_bit(
    source: Path, destination: Path, *, where: float = 0.5, before_psb: int | None = None
) -> Flip:
    """Copy the recording directory ``source`` to ``destination`` with one TNT bit flipped
    in its largest AUXTRACE buffer, at about ``where`` (0..1) of its not-taken TNT packets;
    or, with ``before_psb=r``, in the one that is the r-th closest before a PSB (ranked by
    the packets between them: a flip there loses the least, as perf resynchronises at the
    PSB)."""
    if destination.exists():
        shutil.rmtree(destination)
    shutil.copytree(source, destination)
    perf_data = destination / "perf.data"
    buffers = auxtrace_buffers(perf_data)
    if not buffers:
        raise ValueError(f"{perf_data} holds no AUXTRACE data")
    offset, size, queue, tid = max(buffers, key=lambda b: b[1])
    with open(perf_data, "r+b") as f:
        f.seek(offset)
        data = f.read(size)
        candidates = [
            (k, off) for k, (off, length) in enumerate(packets(data)) if data[off] == _NOT_TAKEN
        ]
        if not candidates:
            raise ValueError(f"{perf_data}: no one-bit not-taken TNT packet to flip")
        if before_psb is None:
            k, off = candidates[min(len(candidates) - 1, int(len(candidates) * where))]
        else:
            k, off = _closest_before_psb(data, candidates)[before_psb]
        f.seek(offset + off)
        f.write(bytes((_TAKEN,)))
    return Flip(offset + off, tid, queue, k)


def _closest_before_psb(data: bytes, candidates: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``candidates`` (packet index, offset) ordered by how many packets lie between each and
    the next PSB (those with no PSB after them last)."""
    psbs = [k for k, (off, _) in enumerate(packets(data)) if data[off : off + 2] == b"\x02\x82"]

    def distance(candidate: tuple[int, int]) -> int:
        after = bisect.bisect_right(psbs, candidate[0])
        return psbs[after] - candidate[0] if after < len(psbs) else len(data)

    return sorted(candidates, key=distance)


def perf_reports_errors(perf_data: Path, perf: str = "perf") -> list[str]:
    """The ``instruction trace error`` lines ``perf script --itrace=e`` prints for a file."""
    out = subprocess.run(
        [perf, "script", "-i", str(perf_data), "--itrace=e"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [line.strip() for line in out.stdout.splitlines() if "instruction trace error" in line]


def damaged_copy(source: Path, destination: Path, perf: str = "perf") -> Flip:
    """A copy of the recording with one flipped TNT bit that perf reports as an error:
    the flip closest before a PSB that perf catches, so that what is lost (up to the PSB,
    where perf synchronises again) does not depend on where the PSBs happen to fall."""
    for rank in range(24):
        try:
            flip = flip_tnt_bit(source, destination, before_psb=rank)
        except IndexError:
            break
        if perf_reports_errors(destination / "perf.data", perf):
            return flip
    raise AssertionError(f"no flipped TNT bit of {source} made perf report an error")
