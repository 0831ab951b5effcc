"""The own decoder's packet layer (``_native/pt_packet.c``) against perf's: every packet
perf 6.1 knows, and random bytes, must split into the same packets with the same fields.

perf's side is its own dump (``perf script -D``: offset, bytes and a description of each
packet); ours is ``_ptdecode.packets()``, described here the way perf describes them (the
formats of perf's ``intel_pt_pkt_desc``), so the comparison is of text, packet by packet.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ptscope.decode import native
from support.emulated_corpus import decode_case_recording
from support.perf_dump import packet_dump
from support.pt_reshape import with_aux_data

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not native.is_available(), reason="the own decoder is not built"),
]

if native.is_available():
    from ptscope.decode import _ptdecode  # type: ignore[attr-defined]

# pt_packet.h's packet types, in its order
(BAD, PAD, TNT, TIP_PGD, TIP_PGE, TIP, FUP, PSB, PSBEND, MODE_EXEC, MODE_TSX, PIP, TSC, MTC) = (
    range(14)
)
(TMA, CYC, CBR, VMCS, OVF, MNT, PTWRITE, EXSTOP, MWAIT, PWRE, PWRX, BBP, BIP, BEP, CFE, EVD) = (
    range(14, 30)
)
TRACESTOP = 30

_NAMES = {
    PAD: "PAD", TIP_PGD: "TIP.PGD", TIP_PGE: "TIP.PGE", TIP: "TIP", FUP: "FUP", PSB: "PSB",
    PSBEND: "PSBEND", OVF: "OVF", TRACESTOP: "TraceSTOP", CYC: "CYC", MTC: "MTC",
    MNT: "MNT", CBR: "CBR", TSC: "TSC",
}  # fmt: skip


def _describe(kind: int, count: int, ip: int, payload: int) -> str:
    """A packet as perf's dump describes it."""
    name = _NAMES.get(kind)
    if kind in (PAD, PSB, PSBEND, OVF, TRACESTOP):
        return str(name)
    if kind == TNT:
        bits = "".join("T" if payload >> (63 - i) & 1 else "N" for i in range(count))
        return f"TNT {bits} ({count})"
    if kind in (TIP_PGD, TIP_PGE, TIP, FUP):
        return f"{name} no ip" if count == 0 else f"{name} {payload:#x}"
    if kind in (CYC, MTC, MNT, CBR, TSC):
        return f"{name} {payload:#x}"
    if kind == VMCS:
        return f"VMCS {payload >> 12:#x}"
    if kind == TMA:
        return f"TMA CTC {payload:#x} FC {count | ip << 8:#x}"
    if kind == MODE_EXEC:
        return f"MODE.Exec IF:{count} {payload}"
    if kind == MODE_TSX:
        return f"MODE.TSX TXAbort:{payload >> 1 & 1} InTX:{payload & 1}"
    if kind == PIP:
        return f"PIP {payload >> 5:#x} (NR={count})"
    if kind == PTWRITE:
        return f"PTWRITE {payload:#x} IP:{ip}"
    if kind in (BEP, EXSTOP):
        return f"{'BEP' if kind == BEP else 'EXSTOP'} IP:{ip}"
    if kind == MWAIT:
        return f"MWAIT {payload:#x} Hints {payload & 0xFF:#x} Extensions {payload >> 32 & 3:#x}"
    if kind == PWRE:
        hw, cstate, sub = payload >> 7 & 1, payload >> 12 & 0xF, payload >> 8 & 0xF
        return f"PWRE {payload:#x} HW:{hw} CState:{cstate} Sub-CState:{sub}"
    if kind == PWRX:
        last, deepest, wake = payload >> 4 & 0xF, payload & 0xF, payload >> 8 & 0xF
        return (
            f"PWRX {payload:#x} Last CState:{last} Deepest CState:{deepest} Wake Reason {wake:#x}"
        )
    if kind == BBP:
        return f"BBP SZ {count}-byte Type {payload:#x}"
    if kind == BIP:
        return f"BIP ID 0x{count:02x} Value {payload:#x}"
    if kind == CFE:
        return f"CFE IP:{ip} Type 0x{count:02x} Vector {payload:#x}"
    if kind == EVD:
        return f"EVD Type 0x{count:02x} Payload {payload:#x}"
    assert kind == BAD
    return "Bad packet!"


def _ours(data: bytes) -> list[tuple[int, int, str]]:
    """(offset, size, description) of each packet, by the own packet layer, listed as
    perf's dump lists them: a packet takes the PADs after it while it is under 8 bytes
    (perf's reader does; its decoder skips them either way), and a packet cut by the end
    is a bad byte, after which the dump goes on with the next."""
    out: list[tuple[int, int, str]] = []
    start = end = 0
    while start < len(data):
        for offset, kind, size, count, ip, payload in _ptdecode.packets(data[start:]):
            offset += start
            if kind == PAD and out and offset == end and out[-1][2] != "Bad packet!":
                at, n, desc = out[-1]
                if n < 8:
                    out[-1] = (at, n + 1, desc)
                    end += 1
                    continue
            out.append((offset, size, _describe(kind, count, ip, payload)))
            end = offset + size
        if end < len(data):
            out.append((end, 1, "Bad packet!"))
            end += 1
        start = end
    return out


def _perfs(carrier: Path, data: bytes, tmp_path: Path) -> list[tuple[int, int, str]]:
    """(offset, size, description) of each packet of ``data``, by ``perf script -D``."""
    (buffer,) = packet_dump(with_aux_data(carrier, tmp_path / "perf.data", [data]))
    return buffer


@pytest.fixture(scope="module")
def carrier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real recording whose AUX data the tests replace."""
    return decode_case_recording("tailcall-static", tmp_path_factory)


PSB_ = b"\x02\x82" * 8


def _every_packet() -> bytes:
    """One of each packet perf 6.1 decodes, with every IP compression and payload size."""
    ip = bytes(range(1, 9))
    parts = [
        PSB_, b"\x19" + bytes(range(7)), b"\x02\x73\x34\x12\x00\xff\x01", b"\x02\x03\x2a\x00",
        b"\x99\x01", b"\x99\x05", b"\x99\x00", b"\x99\x02", b"\x99\x21", b"\x99\x22", b"\x99\x20",
        b"\x1d" + ip[:0], b"\x3d" + ip[:2], b"\x5d" + ip[:4], b"\x7d" + ip[:6], b"\x9d" + ip[:6],
        b"\xdd" + ip[:8], b"\x02\x23",
        b"\x0d", b"\x2d" + ip[:2], b"\x4d" + ip[:4], b"\x6d" + ip[:6], b"\x8d" + ip[:6],
        b"\xcd" + ip[:8], b"\x11", b"\x31" + ip[:2], b"\x01", b"\xd1" + ip[:8],
        b"\x02", b"\x06", b"\x0a", b"\x1e", b"\x7e",  # short TNTs: 0 (bad), 1, 2, 3 and 6 bits
        b"\x02\xa3" + bytes([0xFF, 0, 0x55, 0, 0, 0x80]), b"\x02\xa3" + bytes(6),
        b"\x03", b"\x0b", b"\x07\x02", b"\x07\x81\x04", b"\x0f\xff\xff\xff\xff\xff\xff\xff\xfe",
        b"\x59\x7f", b"\x02\xc8\x01\x02\x03\x04\x05", b"\x02\xc3\x88" + ip,
        b"\x02\x43" + bytes([0x61, 0x22, 0x33, 0x44, 0x55, 0x66]),
        b"\x02\x43" + bytes([0x60, 0x22, 0x33, 0x44, 0x55, 0x66]), b"\x02\xf3",
        b"\x02\x12" + ip[:4], b"\x02\x32" + ip, b"\x02\x92" + ip[:4], b"\x02\xb2" + ip,
        b"\x02\x52" + ip,  # PTWRITE with a reserved size: bad
        b"\x02\x62", b"\x02\xe2", b"\x02\xc2" + bytes([0x21, 0, 0, 0, 3, 0, 0, 0]),
        b"\x02\x22\xa5\x31", b"\x02\xa2\x36\x07\x00\x00\x00",
        b"\x02\x63\x84", b"\x24" + ip[:4], b"\xfc" + ip[:4], b"\x02\x33",  # BBP 4-byte, BIPs
        b"\x02\x63\x05", b"\x14" + ip, b"\x02\xb3",  # BBP 8-byte, a BIP, BEP.IP
        b"\x02\x13\x81\x20", b"\x02\x93\x0e\x0d", b"\x02\x53\x3f" + ip, b"\x02\x83",
        b"\x00\x00", b"\x02\x99", b"\x99\xe0", b"\x99\x03", b"\x02\xc3\x87" + ip,
        PSB_, b"\x02\x23", b"\x02\x82\x02\x82",  # a PSB cut by the end
    ]  # fmt: skip
    return b"".join(parts)


def _first_difference(ours: list[tuple[int, int, str]], perfs: list[tuple[int, int, str]]) -> str:
    for a, b in zip(ours, perfs, strict=False):
        if a != b:
            return f"ours {a} != perf's {b}"
    return f"{len(ours)} packets here, {len(perfs)} in perf's dump"


def _padded(data: bytes) -> bytes:
    """As perf.data holds it: AUXTRACE data is padded with zeros to 8 bytes (which perf's
    dump shows as the trace's)."""
    return data + bytes(-len(data) % 8)


def test_every_packet_type_splits_and_reads_as_perf_reads_it(carrier: Path, tmp_path: Path) -> None:
    data = _padded(_every_packet())
    ours, perfs = _ours(data), _perfs(carrier, data, tmp_path)
    assert ours == perfs, _first_difference(ours, perfs)
    described = {d.split()[0] for _o, _s, d in ours}
    assert {"BBP", "BIP", "BEP", "CFE", "EVD", "TraceSTOP", "MWAIT", "PTWRITE", "Bad"} <= described


@pytest.mark.parametrize("seed", range(6))
def test_random_bytes_split_as_perf_splits_them(carrier: Path, tmp_path: Path, seed: int) -> None:
    """Bytes drawn mostly from packet headers (so that most are packets, of every kind, in
    every context), with random payloads and stray bytes between them."""
    rng = random.Random(seed)
    heads = [0x02, 0x19, 0x59, 0x99, 0x0D, 0x1D, 0x11, 0x01, 0x03, 0x07, 0x06, 0x00, 0x04]
    second = [0x82, 0x23, 0xF3, 0x03, 0xA3, 0x43, 0xC8, 0x73, 0xC3, 0x62, 0xE2, 0xC2, 0x22]
    second += [0xA2, 0x63, 0x83, 0x33, 0xB3, 0x13, 0x93, 0x53, 0x12, 0x32, 0x92, 0xB2]
    data = bytearray(PSB_)
    while len(data) < 3000:
        head = rng.choice(heads) if rng.random() < 0.8 else rng.randrange(256)
        data.append(head)
        if head == 0x02 and rng.random() < 0.9:
            data.append(rng.choice(second))
        data += bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 2, 4, 6, 8])))
        if rng.random() < 0.01:
            data += PSB_
    stream = _padded(bytes(data))
    ours, perfs = _ours(stream), _perfs(carrier, stream, tmp_path)
    assert ours == perfs, _first_difference(ours, perfs)
