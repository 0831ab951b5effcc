"""Exact instruction counts and code lines (instruction detail) against QEMU's own trace.

The emulated backend's recordings are decoded by the real perf with ``--dlarg insns`` (and
by the text decoder's capstone path); QEMU's log, re-read by ``support.qemu_truth``, says
which instructions each thread executed. The trace of a thread ends at the first
instruction of the last block QEMU logged, because QEMU logs a block before running it
(docs/emulated-pt.md): that block is in neither count, so the totals agree exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.decode.blocks import InstructionDetail
from ptscope.decode.dlfilter_stream import DlfilterRun, decode_with_dlfilter
from ptscope.decode.native import NativeRun, decode_native
from ptscope.decode.perf_script import decode_perf_data_text
from ptscope.model import BranchEvent, BranchKind
from support import qemu_truth
from support.emulated_corpus import Case, Recorded, recorded

pytestmark = pytest.mark.slow

DECODERS = ["native", "dlfilter", "text"]


def _decode(rec: Recorded, decoder: str, *, keep_all: bool = False) -> list[BranchEvent]:
    """The branches of a recording with instruction detail; no block may be uncounted."""
    perf_data = rec.directory / "perf.data"
    if decoder == "native":
        native_runs: list[NativeRun] = []
        batches = decode_native(perf_data, insns=True, keep_all=keep_all, run_info=native_runs)
        events = [e for b in batches for e in b if isinstance(e, BranchEvent)]
        counters = native_runs[0].stats.trailer
        assert counters is not None and counters["blocks_unknown"] == 0
    elif decoder == "dlfilter":
        runs: list[DlfilterRun] = []
        batches = decode_with_dlfilter(perf_data, insns=True, keep_all=keep_all, run_info=runs)
        events = [e for b in batches for e in b if isinstance(e, BranchEvent)]
        trailer = runs[0].stats.trailer
        assert trailer is not None and trailer["blocks_unknown"] == 0
    else:
        details: list[InstructionDetail] = []
        batches = decode_perf_data_text(
            perf_data, insns=True, keep_all=keep_all, on_detail=details.append
        )
        events = [e for b in batches for e in b if isinstance(e, BranchEvent)]
        assert details[0].unknown_blocks == 0
    return events


def _threads(rec: Recorded) -> list[qemu_truth.ThreadRun]:
    return [t for truth in (rec.truth, *rec.child_truths.values()) for t in truth.threads]


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_call_of_a_100_instruction_leaf(corpus_dir: Path, decoder: str) -> None:
    rec = recorded(Case("leaf100"), corpus_dir)
    events = _decode(rec, decoder)
    calls = [e for e in events if e.kind == BranchKind.CALL and e.dst.symbol == "leaf100"]
    returns = [e for e in events if e.kind == BranchKind.RETURN and e.src.symbol == "leaf100"]
    assert len(calls) == len(returns) == 1000
    entry = calls[0].dst.ip
    assert entry % 64 == 0
    # 99 nops and the ret, on the two 64-byte lines from the entry.
    assert {e.insn_count for e in returns} == {100}
    assert {e.lines for e in returns} == {(entry >> 6, (entry >> 6) + 1)}
    # And the whole program: QEMU's count.
    total = sum(len(t.insns) for t in _threads(rec))
    assert sum(e.insn_count for e in events) == total == rec.result.instructions


# Programs the per-branch check below does not cover (it covers threads, fork, rep...).
TOTALS = [
    Case("basics"),
    Case("signals"),
    Case("dlopen"),
    Case("rust_calls"),
]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("case", TOTALS, ids=lambda c: c.id)
def test_each_threads_total_is_what_qemu_executed(
    corpus_dir: Path, case: Case, decoder: str
) -> None:
    rec = recorded(case, corpus_dir)
    events = _decode(rec, decoder)
    for thread in _threads(rec):
        got = sum(e.insn_count for e in events if e.tid == thread.tid)
        assert got == len(thread.insns), f"tid {thread.tid}"


def _expected_counts_and_lines(thread: qemu_truth.ThreadRun) -> list[tuple[int, tuple[int, ...]]]:
    """What each branch perf prints for the thread counts: the instructions after the
    previous branch up to and including its own source (a trace start: none)."""
    out = []
    done = 0
    for branch in qemu_truth.expected_branches(thread):
        upto = branch.at if branch.kind == "start" else branch.at + 1
        ran = thread.insns[done:upto]
        lines = {line for i in ran for line in range(i.pc >> 6, ((i.end - 1) >> 6) + 1)}
        out.append((len(ran), tuple(sorted(lines))))
        done = upto
    return out


PER_BRANCH = [
    Case("basics", static=True),
    Case("threads"),
    Case("fork"),
    Case("rep", static=True),
    Case("tailcall", opt="-O2"),
]


@pytest.mark.parametrize("case", PER_BRANCH, ids=lambda c: c.id)
def test_each_branch_counts_the_instructions_and_lines_since_the_previous(
    corpus_dir: Path, case: Case
) -> None:
    rec = recorded(case, corpus_dir)
    events = _decode(rec, "dlfilter", keep_all=True)
    for thread in _threads(rec):
        got = [(e.insn_count, e.lines) for e in events if e.tid == thread.tid]
        expected = _expected_counts_and_lines(thread)
        assert len(got) == len(expected) > 10
        bad = [k for k, (g, x) in enumerate(zip(got, expected, strict=True)) if g != x]
        assert not bad, f"tid {thread.tid}: branch #{bad[0]}: {got[bad[0]]} != {expected[bad[0]]}"
