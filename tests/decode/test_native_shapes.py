"""The own decoder on Intel PT streams shaped like hardware's, against perf's decoder.

The emulated recorder writes one shape of stream; ``support/pt_reshape.py`` rewrites its
recordings into the others real hardware writes (CYC thresholds or no CYC, MTC and TMA,
long TNTs, longer PSB periods, PTWRITE, TSX, power events, OVF with and without lost
data, VMCS/MNT/PIP/PAD noise) and into snapshot recordings (overlapping snapshots, and
snapshots with trace lost between them). perf's own packet dump must see what each shape
adds, and the two decoders must give identical events, times included: on these streams
perf's time estimates (MTC/TMA, CYC thresholds, no CYC) are matched exactly, so the bound
on how far the own decoder's times may be from perf's is zero.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest

from ptscope import _native
from ptscope.decode.dlfilter_stream import decode_with_dlfilter
from ptscope.decode.native import decode_native
from ptscope.model import BranchEvent, BranchKind, DecodeError, Event
from support.emulated_corpus import decode_case_recording
from support.perf_dump import packet_dump
from support.pt_reshape import Shape, reshape, snapshots

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built"),
]

SHAPES = {
    "cyc-threshold": (Shape(cyc_threshold=64), {"CYC"}),
    "no-cyc": (Shape(no_cyc=True), set()),
    "mtc": (Shape(mtc_period=3), {"MTC", "TMA"}),
    "mtc-no-cyc": (Shape(mtc_period=2, no_cyc=True), {"MTC", "TMA"}),
    "long-tnt": (Shape(no_cyc=True, long_tnt=True), {"TNT"}),
    "psb-period": (Shape(keep_psb_every=4), {"PSBEND"}),
    "ptwrite": (Shape(ptwrite_every=50, ptwrite_ip_every=5), {"PTWRITE"}),
    "tsx": (Shape(tsx_every=7), {"MODE.TSX"}),
    "power": (Shape(power_every=40, cbr_every=300), {"PWRE", "PWRX", "EXSTOP", "CBR"}),
    "ovf": (Shape(ovf_every=40), {"OVF"}),
    "ovf-lost": (Shape(ovf_every=60, drop_after_ovf=True), {"OVF"}),
    "noise": (Shape(noise_every=20), {"VMCS", "MNT", "PIP", "PAD"}),
}
"""name: (shape, packet kinds perf's dump must show in the result)."""

RECORDINGS = ["threads-pie", "exceptions-pie"]
LONG_SHAPES = ["mtc-no-cyc", "long-tnt", "ptwrite", "tsx", "ovf-lost"]
"""The shapes also tried on the longer, one-thread recording (each costs seconds there):
those whose time or flow rules reach furthest (the rest are on three threads' queues)."""

_MODES = [{"insns": True}, {"keep_all": True}]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {key: decode_case_recording(key, tmp_path_factory) for key in RECORDINGS}


def _packet_kinds(perf_data: Path) -> collections.Counter[str]:
    """Packets by kind, as ``perf script -D`` (perf's own packet decoder) lists them."""
    return collections.Counter(
        desc.split()[0] for buffer in packet_dump(perf_data) for _at, _size, desc in buffer
    )


def _first_difference(a: list[Event], b: list[Event]) -> str | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"event {i}: perf's {x} != own {y}"
    if len(a) != len(b):
        return f"{len(a)} events from perf, {len(b)} from the own decoder"
    return None


def _agree(perf_data: Path) -> list[Event]:
    """Both decoders give the same events in every mode; perf's (instruction mode)."""
    first: list[Event] = []
    for mode in _MODES:
        perf = [e for b in decode_with_dlfilter(perf_data, task_events=True, **mode) for e in b]
        own = [e for b in decode_native(perf_data, **mode) for e in b]
        assert len(perf) > 100
        diff = _first_difference(perf, own)
        assert diff is None, f"{perf_data.name} {mode}: {diff}"
        first = first or perf
    return first


@pytest.mark.parametrize(
    ("key", "name"),
    [("threads-pie", name) for name in SHAPES] + [("exceptions-pie", n) for n in LONG_SHAPES],
)
def test_both_decoders_agree_on_a_hardware_shaped_stream(
    recordings: dict[str, Path], key: str, name: str, tmp_path: Path
) -> None:
    shape, kinds = SHAPES[name]
    shaped = reshape(recordings[key], tmp_path / "perf.data", shape)
    seen = _packet_kinds(shaped)
    assert kinds <= set(seen), f"perf sees no {kinds - set(seen)} in the {name} stream"
    if shape.no_cyc:
        assert "CYC" not in seen
    if name in ("psb-period", "long-tnt"):  # fewer, longer: PSB+ periods, TNTs
        (fewer,) = kinds
        assert seen[fewer] < _packet_kinds(recordings[key])[fewer] / 2
    events = _agree(shaped)
    errors = [e for e in events if isinstance(e, DecodeError)]
    if shape.ovf_every:
        assert errors, "an overflow is a decode error"
    elif name != "tsx":  # (an aborted transaction's FUP is where perf resyncs)
        assert not errors, errors[:3]


@pytest.mark.parametrize("key", RECORDINGS)
@pytest.mark.parametrize(
    ("count", "ring"),
    [(1, 1.0), (4, 1.5), (3, 2.9), (4, 0.6), (5, 1.0)],
    ids=["one", "overlapping", "mostly-repeated", "data-lost-between", "end-to-end"],
)
def test_both_decoders_agree_on_snapshots(
    recordings: dict[str, Path], key: str, count: int, ring: float, tmp_path: Path
) -> None:
    """Snapshots that repeat the one before are cut where perf cuts them (a repeat decoded
    twice would double calls); snapshots with trace lost between them restart at a PSB.
    (Of a thread whose trace is short, a snapshot may hold no PSB: perf decodes none of
    it, and neither does the own decoder.)"""
    original = recordings[key]
    snapped = snapshots(original, tmp_path / "perf.data", count=count, ring=ring)
    events = _agree(snapped)
    whole = [e for b in decode_with_dlfilter(original, task_events=True, insns=True) for e in b]
    if ring > 1.2 and key == "exceptions-pie":  # (one thread, PSBs in every snapshot)
        assert _calls(events) == _calls(whole), "every call once, as in the full recording"
    elif ring < 1:
        assert len(_calls(events)) < len(_calls(whole))


def _calls(events: list[Event]) -> list[tuple[int, int, int]]:
    return [
        (e.tid, e.src.ip, e.dst.ip)
        for e in events
        if isinstance(e, BranchEvent) and e.kind is BranchKind.CALL
    ]
