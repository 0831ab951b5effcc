"""``--jobs`` cuts a trace at PSB times found by scanning the perf.data's Intel PT data
(``decode/parallel.py``): the scan reads every byte of a trace, and must not keep the
trace's pages in ptscope's memory (they made a ``--jobs 2`` decode's peak RSS the size of
its perf.data).

The perf.data here is built by hand: the header, an AUXTRACE_INFO record with a time
conversion, and one AUXTRACE buffer of PSB+ groups (PSB, TSC, PSBEND), one per 4 KiB,
the rest of each 4 KiB filled with bytes that are no packet's start."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from ptscope.decode import parallel

_MIB = 1 << 20
_GROUP = 4096


def _perf_data(path: Path, trace_bytes: int) -> int:
    """Writes the perf.data; returns how many PSB+ groups its trace holds."""
    shift, mult, zero = 10, 1 << 10, 0  # perf time = TSC
    priv = [0, shift, mult, zero, 1, 0]  # ..., time_shift, time_mult, time_zero, cap_zero
    info = struct.pack("<IHH", 70, 0, 16 + 8 * len(priv))
    info += struct.pack("<II", 1, 0) + struct.pack(f"<{len(priv)}Q", *priv)  # Intel PT
    groups = trace_bytes // _GROUP
    aux = struct.pack("<IHH", 71, 0, 48) + struct.pack("<QQQIII4x", groups * _GROUP, 0, 0, 0, 1, 0)
    header_size = 104
    data = info + aux
    data_size = len(data) + groups * _GROUP
    with path.open("wb") as f:
        # magic, header size, attr size, attrs, data (offset, size), event types, features
        f.write(struct.pack("<8sQQ2Q2Q2Q4Q", b"PERFILE2", header_size, 0, 0, 0,
                            header_size, data_size, 0, 0, 0, 0, 0, 0))  # fmt: skip
        f.write(data)
        for k in range(groups):
            group = b"\x02\x82" * 8 + b"\x19" + (1000 + k).to_bytes(7, "little") + b"\x02\x23"
            f.write(group + b"\xff" * (_GROUP - len(group)))
    return groups


def _peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_the_psb_scan_does_not_keep_the_trace_in_memory(tmp_path: Path) -> None:
    perf_data = tmp_path / "perf.data"
    groups = _perf_data(perf_data, 96 * _MIB)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts again from here
    except OSError as e:
        pytest.skip(f"cannot reset the peak RSS here: {e}")
    before = _peak_rss_kib()
    layout = parallel.read_trace_layout(perf_data)
    grew = (_peak_rss_kib() - before) * 1024
    assert layout is not None
    assert len(layout.psbs) == groups
    assert [p.time for p in layout.psbs[:3]] == [1000, 1001, 1002]
    assert layout.trace_bytes == groups * _GROUP
    # Without letting pages go the scan kept all 96 MiB; now about one step of it.
    assert grew < parallel._RELEASE_BYTES + 16 * _MIB


@pytest.mark.parametrize(
    ("body", "pad"),
    [(b"\x19\x01\x02", 0), (b"\x19\x01\x02", 5), (b"\x19\x00\x02", 300_000), (b"", 7)],
)
def test_a_buffers_zero_padding_is_not_trace(tmp_path: Path, body: bytes, pad: int) -> None:
    # The emulated recorder's buffers end in PAD packets (zeros) after the last PSB+ group:
    # no trace there, so no window is cut in it.
    import mmap

    data = b"\xaa" * 100 + parallel._PSB + body + b"\0" * pad
    path = tmp_path / "buf"
    path.write_bytes(data)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert parallel._used_end(m, 50, len(data)) == len(data.rstrip(b"\0"))
        assert parallel._used_end(m, 50, 60) == 60
