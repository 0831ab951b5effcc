"""Instruction detail on emulated recordings of the test corpus, with the real perf: the
own decoder, the dlfilter (C block cache) and the text decoder (capstone) give identical
events, counts and code lines; a parallel decode gives each branch the same counts and
lines as a single one (tests/emulated/test_instruction_detail.py checks them against
QEMU's trace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from decode import test_dlfilter_corpus as corpus
from decode.test_dlfilter_corpus import _events, _windows, pytestmark, recordings
from ptscope.decode.dlfilter_stream import DlfilterRun, decode_with_dlfilter
from ptscope.decode.native import decode_native
from ptscope.decode.parallel import decode_parallel
from ptscope.decode.perf_script import decode_perf_data_text
from ptscope.model import BranchEvent

__all__ = ["pytestmark", "recordings"]  # shared with the plain decoders' corpus tests

# The corpus recordings but the two largest (basics: a quarter million branches each).
IDS = [key for key in corpus.IDS if not key.startswith("basics")]


@pytest.mark.parametrize("key", IDS)
def test_own_dlfilter_and_text_decoders_agree(recordings: dict[str, Path], key: str) -> None:
    perf_data = recordings[key]
    runs: list[DlfilterRun] = []
    dlfilter = _events(decode_with_dlfilter(perf_data, insns=True, task_events=True, run_info=runs))
    text = _events(decode_perf_data_text(perf_data, insns=True, task_events=True))
    branches = [e for e in dlfilter if isinstance(e, BranchEvent)]
    assert len(branches) > 100
    assert all(e.lines is not None for e in branches)
    assert sum(e.insn_count for e in branches) > len(branches)
    trailer = runs[0].stats.trailer
    assert trailer is not None and trailer["blocks_unknown"] == 0
    assert dlfilter == text
    assert _events(decode_native(perf_data, insns=True)) == dlfilter


@pytest.mark.parametrize("key", IDS)
def test_parallel_decode_gives_the_same_counts_and_lines(
    recordings: dict[str, Path], key: str
) -> None:
    perf_data = recordings[key]
    single = _events(decode_with_dlfilter(perf_data, insns=True))
    parallel = _events(decode_parallel(perf_data, windows=_windows(perf_data, 3), insns=True))

    def detail(events: list[object]) -> list[tuple[object, ...]]:
        return [(e.tid, e.insn_count, e.lines) for e in events if isinstance(e, BranchEvent)]

    assert detail(parallel) == detail(single)
