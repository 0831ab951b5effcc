"""Negative controls: a single flipped TNT bit is caught, by perf and by ptscope."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.perftool import find_perf
from ptscope.pipeline import decode_recording
from ptscope.recording import Recording
from support import qemu_truth
from support.emulated_corpus import Case, perf_branches, recorded
from support.fxt_check import third_party_view
from support.pt_corrupt import auxtrace_buffers, damaged_copy, flip_tnt_bit, packets

pytestmark = pytest.mark.slow

CASE = Case("basics", static=True)


def test_every_packet_of_a_recording_is_understood(corpus_dir: Path) -> None:
    """The packet walker used below parses the whole stream (a check of the walker)."""
    rec = recorded(CASE, corpus_dir)
    perf_data = rec.directory / "perf.data"
    raw = perf_data.read_bytes()
    for offset, size, _queue, _tid in auxtrace_buffers(perf_data):
        data = raw[offset : offset + size]
        walked = packets(data)
        assert sum(length for _, length in walked) == size


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
def test_a_flipped_tnt_bit_changes_what_perf_decodes(
    where: float, corpus_dir: Path, tmp_path: Path
) -> None:
    """Every flip is caught by the comparison with QEMU's branches (the test can fail)."""
    rec = recorded(CASE, corpus_dir)
    flip = flip_tnt_bit(rec.directory, tmp_path / "damaged", where=where)
    got = perf_branches(tmp_path / "damaged" / "perf.data")
    expected = qemu_truth.expected_branches(rec.truth.thread(flip.tid))
    assert got.errors or got.by_tid[flip.tid] != expected


def test_a_flipped_tnt_bit_is_a_perf_decode_error(corpus_dir: Path, tmp_path: Path) -> None:
    rec = recorded(CASE, corpus_dir)
    assert not perf_branches(rec.directory / "perf.data").errors  # the original is clean
    flip = damaged_copy(rec.directory, tmp_path / "damaged", find_perf().path)
    got = perf_branches(tmp_path / "damaged" / "perf.data")
    assert any("instruction trace error" in e for e in got.errors)
    # perf resynchronises at the next PSB: most of the trace still matches QEMU's.
    expected = qemu_truth.expected_branches(rec.truth.thread(flip.tid))
    decoded = set(got.by_tid[flip.tid])
    assert sum(1 for b in expected if b in decoded) > 0.9 * len(expected)


def test_ptscope_marks_the_damage_and_writes_the_rest(corpus_dir: Path, tmp_path: Path) -> None:
    rec = recorded(CASE, corpus_dir)
    damaged = tmp_path / "damaged"
    damaged_copy(rec.directory, damaged, find_perf().path)
    out = tmp_path / "damaged.fxt.gz"
    summary = decode_recording(Recording.load(damaged), out)
    assert summary.decode_errors >= 1
    view = third_party_view(out)
    markers = [i for i in view.instants if i[2].startswith("[decode error")]
    assert markers, sorted({i[2] for i in view.instants})
    clean = decode_recording(rec.result.recording, tmp_path / "clean.fxt.gz")
    # Nearly every slice is still there.
    assert summary.slices > 0.9 * clean.slices
