"""Emulated recordings reshaped into the Intel PT streams real hardware writes.

The emulated recorder writes one shape of trace: a CYC before every packet, a TSC at every
resume, short TNTs, no MTC. Hardware writes others: CYCs only past a threshold or none,
MTC and TMA, long TNTs, rarer PSBs, OVF after lost data, PTWRITE, transactions, power
events, CBR changes, VMCS and PIP packets. :func:`reshape` rewrites the AUX data of a
perf.data into such a stream, packet by packet, keeping what it describes: the same code
runs (IP packets re-encoded against the new stream's own last IP), only timing and extra
packets change. It needs no knowledge of the code, so it can only add packets where the
current instruction is known without walking code (right after a TIP, whose target is
it), and it can only remove PSB+ groups, never add one (a PSB forgets the return stack,
and the returns after it were compressed against calls before it).

Both decoders must then agree on the result (``tests/decode/test_native_shapes.py``),
whatever perf makes of it; the packet parser and encoder here share nothing with
``_native/pt_packet.c`` or the recorder's ``pt_writer.h``.
"""

from __future__ import annotations

import bisect
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_HEADER = struct.Struct("<8sQQ QQ QQ QQ 4Q")
_EV = struct.Struct("<IHH")
_AUXTRACE, _AUXTRACE_INFO = 71, 70
_FEAT_AUXTRACE, _FEAT_EVENT_DESC = 18, 12
_PSB = b"\x02\x82" * 8


@dataclass(frozen=True)
class Shape:
    """What to make of the stream (each 0/None/False: as it was)."""

    seed: int = 1
    cyc_threshold: int = 0
    """CYC packets only once this many cycles passed (and always before a TSC)."""
    no_cyc: bool = False
    """No CYC at all (the event's cyc bit cleared): cycles estimated from the time."""
    mtc_period: int | None = None
    """MTC packets every 2**p CTC ticks, a TMA after every TSC (TSC:CTC ratio 2)."""
    long_tnt: bool = False
    """Adjacent TNT packets merged into long TNTs (up to 47 bits)."""
    keep_psb_every: int = 0
    """Keep one periodic PSB+ of this many (the others removed: a longer PSB period)."""
    ptwrite_every: int = 0
    """A PTWRITE (no IP) after about one packet in this many."""
    ptwrite_ip_every: int = 0
    """A PTWRITE with IP (and its FUP) after about one TIP in this many."""
    tsx_every: int = 0
    """A transaction begun (MODE.TSX + FUP) after about one TIP in this many, committed
    or aborted after a later one."""
    power_every: int = 0
    """MWAIT/PWRE/PWRX/EXSTOP packets after about one packet in this many."""
    cbr_every: int = 0
    """A CBR (ratio changed) after about one packet in this many."""
    ovf_every: int = 0
    """An OVF + FUP after about one TIP in this many (tracing goes on at the TIP's
    target)."""
    drop_after_ovf: bool = False
    """With an OVF, drop the packets after it up to the next PSB (data really lost)."""
    noise_every: int = 0
    """VMCS, MNT, PIP (NR=0) and PAD packets after about one packet in this many."""


# -------------------------------------------------------------------- packets


def _ip_len(header: int) -> int:
    return {0: 0, 1: 2, 2: 4, 3: 6, 4: 6, 6: 8}.get(header >> 5, -1)


def _parse(data: bytes) -> list[tuple[str, bytes, int]]:
    """(kind, raw bytes, offset) of each packet the emulated recorder writes (PADs
    dropped)."""
    out = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b == 0:
            i += 1
            continue
        if b == 0x02:
            ext = data[i + 1]
            size = {0x82: 16, 0x23: 2, 0x03: 4}[ext]
            kind = {0x82: "psb", 0x23: "psbend", 0x03: "cbr"}[ext]
        elif b == 0x19:
            kind, size = "tsc", 8
        elif b == 0x99:
            kind, size = "mode", 2
        elif b & 3 == 3:
            size = 1
            if b & 4:
                while data[i + size] & 1:
                    size += 1
                size += 1
            kind = "cyc"
        elif b & 1 == 0:
            kind, size = "tnt", 1
        else:
            kind = {0x0D: "tip", 0x11: "pge", 0x01: "pgd", 0x1D: "fup"}[b & 0x1F]
            size = 1 + _ip_len(b)
        out.append((kind, data[i : i + size], i))
        i += size
    return out


def _cyc_value(raw: bytes) -> int:
    v = raw[0] >> 3
    shift = 5
    for c in raw[1:]:
        v |= (c >> 1) << shift
        shift += 7
    return v


def _cyc(value: int) -> bytes:
    first = ((value & 0x1F) << 3) | 3
    value >>= 5
    if not value:
        return bytes([first])
    out = [first | 4]
    while True:
        more = value >> 7
        out.append(((value & 0x7F) << 1) | (1 if more else 0))
        if not more:
            return bytes(out)
        value = more


def _decode_ip(raw: bytes, last: int) -> int:
    kind = raw[0] >> 5
    payload = int.from_bytes(raw[1:], "little")
    if kind == 1:
        return (last & ~0xFFFF) | payload
    if kind == 2:
        return (last & ~0xFFFFFFFF) | payload
    if kind == 3:
        return payload - (1 << 48) if payload & (1 << 47) else payload
    if kind == 4:
        return (last & ~0xFFFFFFFFFFFF) | payload
    if kind == 6:
        return payload
    return last


def _encode_ip(opcode: int, ip: int, last: int | None) -> bytes:
    ip &= (1 << 64) - 1
    if last is not None:
        x = ip ^ last
        for kind, n in ((1, 2), (2, 4), (4, 6)):
            if x >> (8 * n) == 0:
                return bytes([(kind << 5) | opcode]) + ip.to_bytes(8, "little")[:n]
    if ip < (1 << 47) or ip >> 47 == 0x1FFFF:
        return bytes([(3 << 5) | opcode]) + (ip & ((1 << 48) - 1)).to_bytes(6, "little")
    return bytes([(6 << 5) | opcode]) + ip.to_bytes(8, "little")


_OPCODE = {"tip": 0x0D, "pge": 0x11, "pgd": 0x01, "fup": 0x1D}


def _tnt_bits(raw: bytes) -> list[int]:
    b = raw[0]
    top = b.bit_length() - 1
    return [(b >> k) & 1 for k in range(top - 1, 0, -1)]


def _tnt(bits: list[int]) -> bytes:
    if len(bits) <= 6:
        v = 1 << (len(bits) + 1)
        for k, bit in enumerate(bits):
            v |= bit << (len(bits) - k)
        return bytes([v])
    v = 1 << len(bits)
    for k, bit in enumerate(bits):
        v |= bit << (len(bits) - 1 - k)
    return b"\x02\xa3" + v.to_bytes(6, "little")


# ------------------------------------------------------------------ rewriting


class _Writer:
    def __init__(self, shape: Shape, tsc_per_cycle: float) -> None:
        self.shape = shape
        self.rng = random.Random(shape.seed)
        self.out = bytearray()
        self.last_ip: int | None = None  # None: reset (next IP absolute)
        self.pending_cyc = 0
        self.tsc = 0
        self.tsc_per_cycle = tsc_per_cycle
        self.last_mtc: int | None = None
        self.tnt_bits: list[int] = []
        self.in_tx = False
        self.cbr = 0

    def chance(self, every: int) -> bool:
        return every > 0 and self.rng.randrange(every) == 0

    def flush_tnt(self) -> None:
        bits = self.tnt_bits
        while bits:
            take = bits[:47] if self.shape.long_tnt else bits[:6]
            self.out += _tnt(take)
            bits = bits[len(take) :]
        self.tnt_bits = []

    def emit(self, raw: bytes) -> None:
        self.flush_tnt()
        self.out += raw

    def timing(self, before: str) -> None:
        """CYC (and MTC) as due before a packet of kind ``before``."""
        s = self.shape
        if s.mtc_period is not None:
            ctc = int(self.tsc + self.pending_cyc * self.tsc_per_cycle) // 2
            mtc = (ctc >> s.mtc_period) & 0xFF
            if self.last_mtc is not None and mtc != self.last_mtc:
                self.emit(bytes([0x59, mtc]))
            self.last_mtc = mtc
        if s.no_cyc:
            self.tsc += int(self.pending_cyc * self.tsc_per_cycle)
            self.pending_cyc = 0
            return
        due = before == "tsc" or self.pending_cyc >= max(s.cyc_threshold, 1)
        if s.cyc_threshold == 0:
            due = self.pending_cyc > 0 or before == "tsc"
        if due:
            self.emit(_cyc(self.pending_cyc))
            self.tsc += int(self.pending_cyc * self.tsc_per_cycle)
            self.pending_cyc = 0

    def ip_packet(self, kind: str, ip: int) -> None:
        self.emit(_encode_ip(_OPCODE[kind], ip, self.last_ip))
        self.last_ip = ip


class _Queue:
    """One AUX queue's stream, reshaped buffer after buffer (its buffers are one stream:
    IP compression, pending TNT bits and the clock go on from one to the next)."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.w = _Writer(shape, 1.0)
        self.last_ip = 0  # the original stream's, to decode its IPs
        self.psb_count = 0
        self.skipping_psb = False
        self.dropping = False

    def buffer(self, data: bytes) -> bytes:
        """The reshaped bytes of the next buffer of the queue."""
        start = len(self.w.out)
        self._walk(_parse(data))
        self.w.flush_tnt()  # (no packet straddles two buffers)
        out = bytes(self.w.out[start:])
        del self.w.out[:]
        return out

    def _walk(self, packets: list[tuple[str, bytes, int]]) -> None:
        shape, w = self.shape, self.w
        last_ip, psb_count = self.last_ip, self.psb_count
        skipping_psb, dropping = self.skipping_psb, self.dropping
        i = 0
        while i < len(packets):
            kind, raw, _at = packets[i]
            i += 1
            if dropping:
                if kind != "psb":
                    if kind in _OPCODE and _ip_len(raw[0]) > 0:
                        last_ip = _decode_ip(raw, last_ip)
                    continue
                dropping = False
            if kind == "psb":
                psb_count += 1
                periodic = psb_count > 1
                skipping_psb = (
                    periodic and shape.keep_psb_every > 1 and psb_count % shape.keep_psb_every
                )
                if not skipping_psb:
                    w.emit(_PSB)
                    w.last_ip = None
                last_ip = 0
                continue
            if kind == "psbend":
                if not skipping_psb:
                    w.emit(raw)
                skipping_psb = False
                continue
            if kind == "cyc":
                w.pending_cyc += _cyc_value(raw)
                continue
            if kind == "tsc":
                tsc = int.from_bytes(raw[1:], "little")
                if skipping_psb:
                    w.tsc = tsc  # (its time only moves the model's clock)
                    continue
                w.timing("tsc")
                w.emit(raw)
                w.tsc = tsc
                if shape.mtc_period is not None:
                    ctc = tsc // 2
                    fc = tsc % 2
                    w.emit(bytes([0x02, 0x73, ctc & 0xFF, (ctc >> 8) & 0xFF, 0, fc & 0xFF, 0]))
                    w.last_mtc = (ctc >> shape.mtc_period) & 0xFF
                continue
            if skipping_psb:
                if kind in _OPCODE:
                    last_ip = _decode_ip(raw, last_ip) if _ip_len(raw[0]) > 0 else last_ip
                continue  # CBR, MODE, FUP of a removed PSB+
            if kind == "tnt":
                w.timing("tnt")
                w.tnt_bits += _tnt_bits(raw)
                if not shape.long_tnt:
                    w.flush_tnt()
                continue
            if kind in ("cbr", "mode"):
                w.emit(raw)
                continue
            # an IP packet
            ip = _decode_ip(raw, last_ip) if _ip_len(raw[0]) > 0 else None
            if ip is not None:
                last_ip = ip
            w.timing(kind)
            if ip is None:
                w.emit(bytes([_OPCODE[kind]]))
            else:
                w.ip_packet(kind, ip)
            if kind != "tip" or ip is None:
                continue  # (nothing may come between a FUP and its TIP, nor inside PSB+)
            # Right after a TIP the current instruction is its target: what needs it goes here.
            _extras_after_tip(w, shape, ip)
            if shape.tsx_every and w.chance(shape.tsx_every):
                if not w.in_tx:
                    w.emit(bytes([0x99, 0x21]))  # MODE.TSX: in a transaction
                    w.ip_packet("fup", ip)
                    w.in_tx = True
                else:
                    abort = w.rng.random() < 0.5
                    w.emit(bytes([0x99, 0x22 if abort else 0x20]))  # aborted / committed
                    w.ip_packet("fup", ip)
                    if abort:
                        w.ip_packet("tip", ip)
                    w.in_tx = False
            if shape.ovf_every and w.chance(shape.ovf_every):
                w.emit(b"\x02\xf3")
                if shape.drop_after_ovf:
                    dropping = True
                else:
                    w.ip_packet("fup", ip)
            _extras_anywhere(w, shape)
        self.last_ip, self.psb_count = last_ip, psb_count
        self.skipping_psb, self.dropping = skipping_psb, dropping


def _extras_after_tip(w: _Writer, shape: Shape, ip: int) -> None:
    if shape.ptwrite_ip_every and w.chance(shape.ptwrite_ip_every):
        w.emit(b"\x02\xb2" + w.rng.getrandbits(64).to_bytes(8, "little"))
        w.ip_packet("fup", ip)


def _extras_anywhere(w: _Writer, shape: Shape) -> None:
    if shape.ptwrite_every and w.chance(shape.ptwrite_every):
        w.emit(b"\x02\x12" + w.rng.getrandbits(32).to_bytes(4, "little"))
    if shape.power_every and w.chance(shape.power_every):
        kind = w.rng.randrange(3)
        if kind == 0:
            w.emit(b"\x02\x22" + bytes([w.rng.randrange(256), 0]))  # PWRE
        elif kind == 1:
            w.emit(b"\x02\xa2" + bytes(w.rng.randrange(256) for _ in range(5)))  # PWRX
        else:
            w.emit(b"\x02\x62")  # EXSTOP
    if shape.cbr_every and w.chance(shape.cbr_every):
        w.cbr = 20 if w.cbr != 20 else 24
        w.emit(bytes([0x02, 0x03, w.cbr, 0]))
    if shape.noise_every and w.chance(shape.noise_every):
        kind = w.rng.randrange(4)
        if kind == 0:
            w.emit(b"\x02\xc8" + bytes(w.rng.randrange(256) for _ in range(5)))  # VMCS
        elif kind == 1:
            w.emit(b"\x02\xc3\x88" + bytes(8))  # MNT
        elif kind == 2:
            w.emit(b"\x02\x43" + (w.rng.getrandbits(40) << 1 << 5).to_bytes(6, "little"))  # PIP
        else:
            w.emit(b"\x00" * w.rng.randrange(1, 9))  # PAD


# ---------------------------------------------------------------- perf.data


def reshape(perf_data: Path, out: Path, shape: Shape) -> Path:
    """Write ``perf_data`` with its AUX data reshaped into ``out`` (a perf.data)."""
    queues: dict[int, _Queue] = {}

    def reshaped(records: list[_AuxRecord]) -> list[list[_AuxRecord]]:
        out = []
        for r in records:
            queue = queues.setdefault(r.idx, _Queue(shape))
            out.append([_AuxRecord(r.body, queue.buffer(r.data))])
        return out

    priv = {12: 2, 13: 1} if shape.mtc_period is not None else {}  # TSC:CTC 2:1
    return _rewrite(perf_data, out, _config_change(shape), priv, reshaped)


def snapshots(perf_data: Path, out: Path, *, count: int, ring: float) -> Path:
    """Write ``perf_data`` as a snapshot recording (``perf record -S``) into ``out``: each
    queue's trace as ``count`` snapshots of a ring of ``ring`` times a snapshot's share of
    the trace, evenly spaced, at the end of the recording (as ``--snapshot=e`` and
    triggered snapshots write them). A ring past 1 makes snapshots that repeat the end of
    the one before (which the decoder must cut off); one under 1, snapshots with trace
    lost between them. Each starts wherever the ring starts, mid-packet."""

    def snapped(records: list[_AuxRecord]) -> list[list[_AuxRecord]]:
        out: list[list[_AuxRecord]] = [[] for _ in records]
        by_idx: dict[int, list[int]] = {}
        for k, r in enumerate(records):
            by_idx.setdefault(r.idx, []).append(k)
        for ks in by_idx.values():
            stream = b"".join(records[k].data for k in ks).rstrip(b"\0")
            step = len(stream) / count
            size = int(step * ring)
            starts = [at for _kind, _raw, at in _parse(stream)]
            for n in range(1, count + 1):
                # (a snapshot ends where tracing was stopped: after a whole packet)
                end = bisect.bisect_left(starts, int(step * n)) if n < count else len(starts)
                end = starts[end] if end < len(starts) else len(stream)
                start = max(0, end - size)
                # the last of the queue's records holds them all, its reference for each
                out[ks[-1]].append(_AuxRecord(records[ks[-1]].body, stream[start:end]))
        return out

    return _rewrite(perf_data, out, (0, 0), {8: 1}, snapped)  # priv[8]: SNAPSHOT_MODE


def with_aux_data(perf_data: Path, out: Path, streams: list[bytes]) -> Path:
    """Write ``perf_data`` into ``out`` with its first queue's trace replaced by one
    buffer for each of ``streams`` (and no other queue): for handing perf any bytes."""

    def replaced(records: list[_AuxRecord]) -> list[list[_AuxRecord]]:
        first = next(k for k, r in enumerate(records) if r.idx == records[0].idx)
        return [
            [_AuxRecord(r.body, data) for data in streams] if k == first else []
            for k, r in enumerate(records)
        ]

    return _rewrite(perf_data, out, (0, 0), {}, replaced)


@dataclass
class _AuxRecord:
    body: bytes
    """The PERF_RECORD_AUXTRACE record (its size field is set when written)."""
    data: bytes

    @property
    def idx(self) -> int:
        return int(struct.unpack_from("<I", self.body, 32)[0])


def with_attr_flags(perf_data: Path, out: Path, set_bits: int, clear_bits: int) -> Path:
    """Write ``perf_data`` into ``out`` with bits of its PT event's attribute flags set and
    cleared (``exclude_kernel`` is bit 5: a recording that says it traced the kernel)."""
    return _rewrite(
        perf_data, out, (0, 0), {}, lambda rs: [[r] for r in rs], (set_bits, clear_bits)
    )


def _rewrite(
    perf_data: Path,
    out: Path,
    config_bits: tuple[int, int],
    priv: dict[int, int],
    aux: Callable[[list[_AuxRecord]], list[list[_AuxRecord]]],
    flag_bits: tuple[int, int] = (0, 0),
) -> Path:
    """Write ``perf_data`` into ``out`` with the PT event's config and flag bits changed,
    words of AUXTRACE_INFO's private data set, and each AUXTRACE record replaced by those
    ``aux`` makes of it (given them all in file order); the AUXTRACE index is made again."""
    raw = perf_data.read_bytes()
    f = list(_HEADER.unpack_from(raw, 0))
    attrs_off, attrs_size, attr_size = f[3], f[4], f[2]
    data_off, data_size = f[5], f[6]
    bitmap = f[9:13]
    head = bytearray(raw[:data_off])
    for pos in range(attrs_off, attrs_off + attrs_size, attr_size):
        (ptype,) = struct.unpack_from("<I", head, pos)
        if ptype == 8:  # the Intel PT event (type 8 in these recordings)
            (config,) = struct.unpack_from("<Q", head, pos + 8)
            struct.pack_into("<Q", head, pos + 8, _patched(config, config_bits))
            (flags,) = struct.unpack_from("<Q", head, pos + 40)
            struct.pack_into("<Q", head, pos + 40, _patched(flags, flag_bits))
    # the records: (AUXTRACE records are placeholders, their index in `aux_records`)
    items: list[bytes | int] = []
    aux_records: list[_AuxRecord] = []
    pos, end = data_off, data_off + data_size
    while pos < end:
        rtype, _misc, size = _EV.unpack_from(raw, pos)
        body = bytearray(raw[pos : pos + size])
        if rtype == _AUXTRACE:
            (length,) = struct.unpack_from("<Q", raw, pos + 8)
            items.append(len(aux_records))
            aux_records.append(_AuxRecord(bytes(body), raw[pos + size : pos + size + length]))
            pos += size + length
            continue
        if rtype == _AUXTRACE_INFO:
            for word, value in priv.items():
                struct.pack_into("<Q", body, 16 + 8 * word, value)
        items.append(bytes(body))
        pos += size
    replaced = aux(aux_records)
    records = bytearray()
    index: list[int] = []
    for item in items:
        if isinstance(item, bytes):
            records += item
            continue
        for r in replaced[item]:
            data = r.data + b"\0" * (-len(r.data) % 8)
            body = bytearray(r.body)
            struct.pack_into("<Q", body, 8, len(data))
            index.append(data_off + len(records))
            records += body + data
    # feature sections after the data: the AUXTRACE index is rewritten, the rest copied
    table_at = data_off + data_size
    features = []
    tpos = table_at
    for bit in range(256):
        if bitmap[bit // 64] >> (bit % 64) & 1:
            off, n = struct.unpack_from("<QQ", raw, tpos)
            tpos += 16
            blob = bytearray(raw[off : off + n])
            if bit == _FEAT_AUXTRACE:
                blob = bytearray(struct.pack("<Q", len(index)))
                for at in index:
                    blob += struct.pack("<QQ", at, 48)
            elif bit == _FEAT_EVENT_DESC:
                _patch_event_desc(blob, config_bits, flag_bits)
            features.append(bytes(blob))
    new_data_size = len(records)
    f[6] = new_data_size
    header = _HEADER.pack(*f)
    head[: len(header)] = header
    at = data_off + new_data_size + 16 * len(features)
    table = bytearray()
    blobs = bytearray()
    for blob in features:
        table += struct.pack("<QQ", at + len(blobs), len(blob))
        blobs += blob
    out.write_bytes(bytes(head) + bytes(records) + bytes(table) + bytes(blobs))
    return out


def _config_change(shape: Shape) -> tuple[int, int]:
    """(bits to set, bits to clear) of the PT event's config."""
    set_bits = clear = 0
    if shape.mtc_period is not None:
        set_bits |= 0x200 | (shape.mtc_period << 14)
        clear |= 0x3C000
    if shape.no_cyc:
        clear |= 0x2 | 0x780000
    elif shape.cyc_threshold:
        set_bits |= (shape.cyc_threshold.bit_length() - 1) << 19
        clear |= 0x780000
    if shape.ptwrite_every or shape.ptwrite_ip_every:
        set_bits |= 1 << 12
    if shape.power_every:
        set_bits |= 1 << 4
    return set_bits, clear


def _patched(config: int, bits: tuple[int, int]) -> int:
    set_bits, clear = bits
    return (config & ~clear) | set_bits


def _patch_event_desc(blob: bytearray, bits: tuple[int, int], flags: tuple[int, int]) -> None:
    count, attr_size = struct.unpack_from("<II", blob, 0)
    pos = 8
    for _ in range(count):
        (ptype,) = struct.unpack_from("<I", blob, pos)
        if ptype == 8:
            (config,) = struct.unpack_from("<Q", blob, pos + 8)
            struct.pack_into("<Q", blob, pos + 8, _patched(config, bits))
            (value,) = struct.unpack_from("<Q", blob, pos + 40)
            struct.pack_into("<Q", blob, pos + 40, _patched(value, flags))
        pos += attr_size
        (nr_ids,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        (length,) = struct.unpack_from("<I", blob, pos)
        pos += 4 + length + 8 * nr_ids
