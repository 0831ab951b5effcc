"""perf decodes every emulated recording to exactly the branches QEMU executed."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import qemu_truth
from support.emulated_corpus import CORPUS, Case, perf_branches, recorded

pytestmark = pytest.mark.slow


def _mismatches(expected: list[qemu_truth.Branch], got: list[qemu_truth.Branch]) -> list[str]:
    bad = [
        f"#{k}: expected {e}, perf printed {g}"
        for k, (e, g) in enumerate(zip(expected, got, strict=False))
        if e != g
    ]
    if len(expected) != len(got):
        bad.append(f"expected {len(expected)} branches, perf printed {len(got)}")
    return bad


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_perf_reproduces_every_branch(case: Case, corpus_dir: Path) -> None:
    rec = recorded(case, corpus_dir)
    got = perf_branches(rec.directory / "perf.data")
    assert not got.errors, got.errors[:3]
    truths = [rec.truth, *rec.child_truths.values()]
    threads = [t for truth in truths for t in truth.threads]
    assert sorted(got.by_tid) == sorted(t.tid for t in threads)
    for thread in threads:
        expected = qemu_truth.expected_branches(thread)
        assert len(expected) > 10
        bad = _mismatches(expected, got.by_tid[thread.tid])
        assert not bad, f"tid {thread.tid}: {len(bad)} mismatches, first: " + "; ".join(bad[:5])
    # Instruction counts agree with QEMU's (rep string instructions counted once).
    insns = sum(len(t.insns) for t in threads)
    assert rec.result.instructions == insns


def test_corpus_covers_what_it_should(corpus_dir: Path) -> None:
    """The corpus really exercises the features it is meant to (guards the tests above)."""
    kinds = {}
    for case in (Case("signals"), Case("threads"), Case("fork"), Case("rep", static=True)):
        rec = recorded(case, corpus_dir)
        branches = [
            b
            for truth in (rec.truth, *rec.child_truths.values())
            for t in truth.threads
            for b in qemu_truth.expected_branches(t)
        ]
        kinds[case.name] = {b.kind for b in branches}
        if case.name == "signals":
            run = rec.truth.threads[0]
            # one handler on return from raise(), one interrupting the busy loop
            assert len(run.deliveries) >= 3
            assert "async" in kinds["signals"]
        if case.name == "threads":
            assert len(rec.truth.threads) == 3
        if case.name == "fork":
            assert len(rec.child_truths) == 1
            assert rec.result.recording.processes.keys() == {
                rec.truth.pid,
                *rec.child_truths,
            }
        if case.name == "rep":
            assert any(i.rep for i in rec.truth.threads[0].insns)
