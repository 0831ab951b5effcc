"""The final trace of every corpus program has the call tree QEMU's trace implies.

Expected slices come from :func:`support.qemu_truth.expected_call_tree` (QEMU's instruction
trace, pyelftools symbols), never from ptscope's engine; the trace is read back with the
third-party ``fxt`` reader. Compared per thread: every frame of a real function (a sized
symbol; PLT stubs and code covered only by a stretched size-0 symbol are named differently
by perf and are left out, their callees compared all the same) with its depth among such
frames, in order. Single-threaded programs also have their times checked against the cycle
model: a branch that writes no packet (a direct call or jump) is only known to have happened
between the packets around it, so each start and end must lie within that window.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ptscope.pipeline import DecodeOptions, decode_recording
from support import qemu_truth
from support.decoder_parity import perf_decodes_the_same
from support.emulated_corpus import CORPUS, Case, recorded
from support.fxt_check import third_party_view

pytestmark = pytest.mark.slow

_SLACK_NS = 8.0  # ns rounding, the 1 ns first slot, the engine spreading equal timestamps


@dataclass(frozen=True)
class Frame:
    entry: int
    depth: int
    start: float
    end: float
    name: str
    window: tuple[float, float, float, float] | None = None
    """(earliest start, latest start, earliest end, latest end) when times are checked."""

    def __str__(self) -> str:
        return f"{'  ' * self.depth}{self.name} ({self.entry:#x}) [{self.start}, {self.end}]"


def _real_frames(
    items: list[tuple[float, float, int | None, str, object]], symbols: qemu_truth.Symbols
) -> list[Frame]:
    """Nest (start, end, entry, name, window) by time; keep real functions with their depth
    counted among real functions only."""
    items = sorted(items, key=lambda x: (x[0], -x[1]))
    out: list[Frame] = []
    stack: list[tuple[float, bool]] = []
    for start, end, entry, name, window in items:
        while stack and stack[-1][0] <= start and not stack[-1][0] == start == end:
            stack.pop()
        real = entry is not None and symbols.is_real(entry)
        depth = sum(1 for _, r in stack if r)
        stack.append((end, real))
        if real:
            assert entry is not None
            out.append(Frame(entry, depth, start, end, name, window))  # type: ignore[arg-type]
    return out


def _expected(run: qemu_truth.ThreadRun, symbols: qemu_truth.Symbols) -> list[Frame]:
    items = []
    last = len(run.insns)
    timing = qemu_truth.Timing(run)
    for s in qemu_truth.expected_call_tree(run, symbols):
        if s.name == qemu_truth.SYSCALL_NAME:
            continue
        s_lo, s_hi = timing.window(s.start)
        e_lo, e_hi = timing.window(s.end) if s.end < last else (-1.0, float("inf"))
        window = (s_lo, s_hi, e_lo, e_hi)
        items.append((timing.ns(s.start), timing.ns(s.end), s.entry, s.name, window))
    return _real_frames(items, symbols)


def _compare(case: Case, corpus_dir: Path, *, times: bool) -> None:
    rec = recorded(case, corpus_dir)
    output = rec.directory / "trace.fxt.gz"
    if not output.exists():
        decode_recording(rec.result.recording, output)
    if times:
        # The truth's times are the cycle model's; each inlined slice's start takes a
        # nanosecond of its own (docs/architecture.md, "Inlined frames"): without them.
        output = rec.directory / "trace-no-inline.fxt.gz"
        if not output.exists():
            decode_recording(rec.result.recording, output, DecodeOptions(inline=False))
    view = third_party_view(output)
    slices: dict[int, list[tuple[float, float, int | None, str, object]]] = {}
    for r in view.records:
        if type(r).__name__ == "DurationCompleteEventRecord":
            if "inlined" in str(r.args.get("flags", "")):  # type: ignore[attr-defined]
                continue  # not a call: the truth has calls only
            address = r.args.get("address")  # type: ignore[attr-defined]
            slices.setdefault(r.thread.thread_id, []).append(  # type: ignore[attr-defined]
                (r.timestamp_ns, r.duration_ns, address, r.name, None)  # type: ignore[attr-defined]
            )
    truths = [rec.truth, *rec.child_truths.values()]
    single = len(truths) == 1 and len(rec.truth.threads) == 1
    if times and not single:
        pytest.skip("the catch-up clock of several threads is not modelled by the truth")
    for truth in truths:
        symbols = qemu_truth.Symbols(truth.images)
        for run in truth.threads:
            expected = _expected(run, symbols)
            items = slices.get(run.tid, [])
            got = _real_frames(items, symbols)
            if times:
                # The thread's first slice starts at its first instruction, which the
                # expected times count from.
                _check_times(expected, got, min(start for start, *_ in items))
            else:
                _check_shape(run.tid, expected, got)


def _check_shape(tid: int, expected: list[Frame], got: list[Frame]) -> None:
    assert len(expected) > 5
    shape_e = [(f.entry, f.depth) for f in expected]
    shape_g = [(f.entry, f.depth) for f in got]
    if shape_e == shape_g:
        return
    k = next(
        (k for k, (a, b) in enumerate(zip(shape_e, shape_g, strict=False)) if a != b),
        min(len(shape_e), len(shape_g)),
    )
    lines = [
        f"  expected {expected[x] if x < len(expected) else '-'}\n"
        f"  got      {got[x] if x < len(got) else '-'}"
        for x in range(max(0, k - 3), k + 4)
    ]
    pytest.fail(
        f"tid {tid}: call tree differs at frame {k} of {len(expected)} "
        f"(trace has {len(got)}):\n" + "\n".join(lines)
    )


def _check_times(expected: list[Frame], got: list[Frame], t0: float) -> None:
    assert [(f.entry, f.depth) for f in expected] == [(f.entry, f.depth) for f in got]
    late = []
    for e, g in zip(expected, got, strict=True):
        assert e.window is not None
        s_lo, s_hi, e_lo, e_hi = e.window
        start, end = g.start - t0, g.end - t0
        if not s_lo - _SLACK_NS <= start <= s_hi + _SLACK_NS or not (
            e_lo - _SLACK_NS <= end <= e_hi + _SLACK_NS
        ):
            late.append(f"{g.name}: [{start}, {end}] not within {e.window}")
    assert not late, f"{len(late)} frames off the cycle model: " + "; ".join(late[:5])


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_trace_has_the_call_tree_qemu_executed(case: Case, corpus_dir: Path) -> None:
    _compare(case, corpus_dir, times=False)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_trace_times_follow_the_cycle_model(case: Case, corpus_dir: Path) -> None:
    _compare(case, corpus_dir, times=True)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
def test_perf_decodes_the_same_trace(case: Case, corpus_dir: Path) -> None:
    """The trace above is the own decoder's: perf's decoder (the dlfilter) makes the same
    of each recording."""
    rec = recorded(case, corpus_dir)
    output = rec.directory / "trace.fxt.gz"
    if not output.exists():
        decode_recording(rec.result.recording, output)
    perf_decodes_the_same(rec.directory, output, DecodeOptions())
