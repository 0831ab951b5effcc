"""Instruction detail on the slices of a decoded trace, end to end through the CLI.

Truth is QEMU's instruction log of the recorded run (``support.qemu_truth``), never the
trace itself: every call of the 100-instruction leaf says 100 instructions and 2 code
lines; a thread's outermost slice holds every instruction QEMU ran on it and exactly the
64-byte lines their bytes cover; the instruction time axis gives each leaf call 100 ticks,
the cycles axis a length equal to its cycles; and a slice's ``drill`` command lists exactly
that call's instructions (``--filter`` keeps it).
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

import pytest
from fxt.models import DurationCompleteEventRecord

from ptscope.fxt.reader import TraceSlice, read_trace
from support import qemu_truth
from support.cli import ptscope
from support.emulated_corpus import Case, Recorded, recorded
from support.fxt_check import third_party_view
from support.perfetto_import import assert_perfetto_keeps_everything

pytestmark = pytest.mark.slow

DECODERS = ["native", "dlfilter", "text"]


@pytest.fixture(scope="module")
def leaf(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return recorded(Case("leaf100"), tmp_path_factory.mktemp("detail"))


def _decode(rec: Recorded, out: Path, *args: str) -> dict[tuple[int, int], list[TraceSlice]]:
    """The trace's slices; on every time axis, filtered or not, Perfetto would keep them."""
    result = ptscope("decode", str(rec.directory), "-o", str(out), *args)
    assert result.returncode == 0, result.stderr
    assert_perfetto_keeps_everything(out)
    return read_trace(out).slices


def _lines_of(insns: list[qemu_truth.Insn]) -> set[int]:
    return {line for i in insns for line in range(i.pc >> 6, ((i.end - 1) >> 6) + 1)}


@pytest.mark.parametrize("decoder", DECODERS)
def test_every_leaf_call_has_100_instructions_on_2_lines(
    leaf: Recorded, tmp_path: Path, decoder: str
) -> None:
    slices = _decode(leaf, tmp_path / "t.fxt.gz", "--decoder", decoder)
    (thread,) = slices.values()
    calls = [s for s in thread if s.name == "leaf100"]
    assert len(calls) == 1000
    assert Counter((s.args["instructions"], s.args["icache_lines"]) for s in calls) == {
        (100, 2): 1000
    }


def test_no_drill_leaves_out_only_the_drill_arg(leaf: Recorded, tmp_path: Path) -> None:
    """``--no-drill``: the same slices and args, without the ``drill`` command."""
    with_drill = _decode(leaf, tmp_path / "a.fxt.gz")
    without = _decode(leaf, tmp_path / "b.fxt.gz", "--no-drill")
    assert all("drill" in s.args for thread in with_drill.values() for s in thread)

    def stripped(s: TraceSlice) -> tuple[object, ...]:
        args = {k: v for k, v in s.args.items() if k != "drill"}
        return (s.name, s.start, s.end, s.depth, sorted(args.items()))

    assert {k: [stripped(s) for s in v] for k, v in with_drill.items()} == {
        k: [(s.name, s.start, s.end, s.depth, sorted(s.args.items())) for s in v]
        for k, v in without.items()
    }
    assert (tmp_path / "b.fxt.gz").stat().st_size < (tmp_path / "a.fxt.gz").stat().st_size * 0.8


@pytest.mark.parametrize(
    "case",
    [Case("leaf100"), Case("basics", static=True), Case("threads"), Case("signals")],
    ids=lambda c: c.id,
)
def test_a_threads_outermost_slice_holds_what_qemu_ran(
    corpus_dir: Path, tmp_path: Path, case: Case
) -> None:
    rec = recorded(case, corpus_dir)
    slices = _decode(rec, tmp_path / "t.fxt.gz")
    for thread in rec.truth.threads:
        roots = sorted(
            (s for s in slices[(rec.truth.pid, thread.tid)] if s.depth == 0),
            key=lambda s: s.start,
        )
        counts = [int(s.args["instructions"]) for s in roots]
        assert sum(counts) == len(thread.insns), f"tid {thread.tid}"
        # The outermost slices follow each other, so each holds the next run of QEMU's
        # instructions: its lines are the lines of exactly those.
        done = 0
        for root, n in zip(roots, counts, strict=True):
            want = len(_lines_of(thread.insns[done : done + n]))
            assert root.args["icache_lines"] == want, (thread.tid, root.name, root.start)
            done += n


@pytest.mark.parametrize("decoder", DECODERS)
def test_instructions_time_axis_gives_each_leaf_call_its_100_instructions(
    leaf: Recorded, tmp_path: Path, decoder: str
) -> None:
    slices = _decode(
        leaf, tmp_path / "i.fxt.gz", "--time-axis", "instructions", "--decoder", decoder
    )
    (thread,) = slices.values()
    calls = [s for s in thread if s.name == "leaf100"]
    assert {s.end - s.start for s in calls} == {100}
    # A [syscall] gap runs no instruction: it lasts the least any slice lasts (1 tick, so
    # that nesting by time stays unambiguous), not up to the next frame boundary.
    gaps = [s for s in thread if s.name == "[syscall]"]
    assert gaps and {(s.end - s.start, s.args["instructions"]) for s in gaps} == {(1, 0)}


@pytest.mark.parametrize("decoder", DECODERS)
def test_cycles_axis_lengths_are_the_cycles_args(
    leaf: Recorded, tmp_path: Path, decoder: str
) -> None:
    slices = _decode(leaf, tmp_path / "c.fxt.gz", "--time-axis", "cycles", "--decoder", decoder)
    (thread,) = slices.values()
    assert all(s.end - s.start == s.args["cycles"] for s in thread)
    # The emulator's model: 1 cycle per instruction. perf counts cycles at timing packets,
    # so a call's own cycle comes with its callee's return: at most one more.
    calls = [s for s in thread if s.name == "leaf100"]
    assert {s.end - s.start for s in calls} <= {100, 101}


@pytest.mark.parametrize("decoder", DECODERS)
def test_time_axis_gives_identical_calls_the_cycle_models_time(
    leaf: Recorded, tmp_path: Path, decoder: str
) -> None:
    """The emulator's model: 1 cycle per instruction at 2 GHz, so each 100-instruction call
    lasts 50 ns, as its cycles arg says. perf dates the first call with its caller's
    (`main` is called at the same perf time): the run of equal times is spread by the
    instructions in it, not in equal shares per call (which gave that call 27 ns)."""
    slices = _decode(leaf, tmp_path / "t.fxt.gz", "--decoder", decoder)
    (thread,) = slices.values()
    calls = [s for s in thread if s.name == "leaf100"]
    assert len(calls) == 1000
    assert {s.end - s.start for s in calls} <= {50, 51}
    # Its cycles arg says the same (perf's count: the call's own cycle comes with the
    # return; the first call's also holds main's first instructions, which reached no
    # timing packet before it).
    assert all(abs(2 * (s.end - s.start) - s.args["cycles"]) <= 2 for s in calls[1:])


def test_filter_keeps_each_slices_detail(leaf: Recorded, tmp_path: Path) -> None:
    whole = _decode(leaf, tmp_path / "t.fxt.gz")
    kept = _decode(leaf, tmp_path / "f.fxt.gz", "--filter", "main,exit")
    ((key, thread),) = kept.items()
    calls = [s for s in thread if s.name == "leaf100"]
    assert len(calls) == 1000
    assert {s.args["icache_lines"] for s in calls} == {2}
    # the same drill commands as the whole trace's calls
    drills = {s.args["drill"] for s in whole[key] if s.name == "leaf100"}
    assert {s.args["drill"] for s in calls} == drills
    assert all("drill" in s.args and "icache_lines" in s.args for s in thread)


def test_a_slices_drill_command_lists_its_instructions(leaf: Recorded, tmp_path: Path) -> None:
    slices = _decode(leaf, tmp_path / "t.fxt.gz")
    ((key, thread),) = slices.items()
    assert all(str(s.args["drill"]).startswith("ptscope insns ") for s in thread)
    call = [s for s in thread if s.name == "leaf100"][500]
    argv = shlex.split(str(call.args["drill"]))
    assert argv[:5] == ["ptscope", "insns", str(leaf.directory.resolve()), "--tid", str(key[1])]
    result = ptscope(*argv[1:])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The whole call and nothing else, its first and last instruction marked.
    assert [line[2:].split()[2] for line in lines] == [f"leaf100+{n:#x}" for n in range(100)]
    assert [line[:2] for line in lines] == ["> ", *["  "] * 98, "< "]
    # The third-party reader reads the same args.
    view = third_party_view(tmp_path / "t.fxt.gz")
    drills = {
        (r.name, r.args.get("icache_lines"), r.args.get("drill"))
        for r in view.records
        if isinstance(r, DurationCompleteEventRecord)
    }
    assert ("leaf100", 2, call.args["drill"]) in drills


def test_no_insn_detail_and_no_kept_recording(leaf: Recorded, tmp_path: Path) -> None:
    slices = _decode(leaf, tmp_path / "t.fxt.gz", "--no-insn-detail")
    (thread,) = slices.values()
    assert not any("icache_lines" in s.args for s in thread)
    assert all("drill" in s.args for s in thread)
    # A run whose recording is not kept has nothing to drill into.
    out = tmp_path / "run.fxt.gz"
    result = ptscope("run", "--backend", "emulated", "-o", str(out), "--", str(leaf.exe))
    assert result.returncode == 0, result.stderr
    (thread,) = read_trace(out).slices.values()
    assert not any("drill" in s.args for s in thread)
    assert {s.args["icache_lines"] for s in thread if s.name == "leaf100"} == {2}


@pytest.mark.parametrize("jobs", ["1", "3"])
def test_every_block_is_counted_and_no_warning_says_otherwise(
    corpus_dir: Path, tmp_path: Path, jobs: str
) -> None:
    # Parallel windows start mid-block; that is fixed up, not code that could not be read.
    rec = recorded(Case("basics", static=True), corpus_dir)
    result = ptscope("decode", str(rec.directory), "-o", str(tmp_path / "t.fxt"), "-j", jobs)
    assert result.returncode == 0, result.stderr
    assert "wrote " in result.stderr and "instruction counts are short" not in result.stderr


def test_the_summary_says_when_counts_are_short() -> None:
    import io

    from ptscope.cli.output import print_summary
    from ptscope.pipeline import DecodeSummary

    out = io.StringIO()
    print_summary(DecodeSummary(Path("t.fxt.gz"), "dlfilter", "", uncounted_blocks=3), out)
    assert "instruction counts are short: 3 runs of code" in out.getvalue()
