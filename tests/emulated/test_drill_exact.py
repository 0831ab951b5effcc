"""A slice's ``drill`` command lists exactly its call, against QEMU's instruction log.

``leaf37`` (37 instructions on either of two paths, which one its argument says) is called
twice in a row, then once more through a tail call from ``forward37``, 200 times. perf
dates instructions coarsely (here: the emulator's clock with a CYC packet only every 1,000
cycles, so a dozen calls share one perf time), so a time range alone holds its neighbours
too; the drill command's anchor (``--after ADDRESS:K``) and count must list the call's own
instructions, first to last, marked, whichever call it is. Both decoders write the same
commands.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ptscope.fxt.reader import TraceSlice, read_trace
from ptscope.record.emulated import CycleModel, EmulationOptions, record
from support import programs, qemu_truth
from support.cli import one_line_error, ptscope
from support.emulated_corpus import needs_tools

pytestmark = pytest.mark.slow

_ANCHOR_RE = re.compile(r" --after 0x([0-9a-f]+):(\d+) --count (\d+)$")


class Recorded:
    def __init__(self, directory: Path, truth: qemu_truth.Truth) -> None:
        self.directory = directory
        self.truth = truth


_recordings: dict[str, Recorded] = {}


def _recorded(clock: str, base: Path) -> Recorded:
    """leaf37 recorded with the default clock ("fine": every branch dated exactly) or a
    coarse one (once per session each)."""
    needs_tools()
    if clock not in _recordings:
        exe = programs.build("leaf37")
        directory = base / clock
        raw = directory / "qemu.log"
        model = CycleModel(cyc_threshold=1000) if clock == "coarse" else CycleModel()
        record([str(exe)], directory, options=EmulationOptions(raw_log=raw), cycle_model=model)
        _recordings[clock] = Recorded(directory, qemu_truth.load(raw, exe))
    return _recordings[clock]


@pytest.fixture(scope="module", params=["fine", "coarse"])
def leaf37(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return _recorded(request.param, tmp_path_factory.mktemp("drill"))


def _slices(rec: Recorded, out: Path, *args: str) -> tuple[int, list[TraceSlice]]:
    result = ptscope("decode", str(rec.directory), "-o", str(out), *args)
    assert result.returncode == 0, result.stderr
    ((_, tid), thread) = read_trace(out).slices.popitem()
    return tid, sorted(thread, key=lambda s: s.start)


def _drill(call: TraceSlice) -> tuple[list[str], list[list[str]]]:
    """Run a slice's drill command: each line's mark, and its other words."""
    argv = shlex.split(str(call.args["drill"]))
    assert argv[:2] == ["ptscope", "insns"]
    result = ptscope(*argv[1:])
    assert result.returncode == 0, result.stderr
    assert not result.stderr
    lines = result.stdout.splitlines()
    return [line[:2] for line in lines], [line[2:].split() for line in lines]


@pytest.mark.parametrize("name", ["leaf37", "forward37"])
def test_each_drill_lists_exactly_its_call(leaf37: Recorded, tmp_path: Path, name: str) -> None:
    tid, thread = _slices(leaf37, tmp_path / "t.fxt.gz")
    calls = [s for s in thread if s.name == name]
    assert len(calls) == (600 if name == "leaf37" else 200)
    pcs = [i.pc for i in leaf37.truth.thread(tid).insns]
    entry = calls[0].args["address"]
    entries = [n for n, pc in enumerate(pcs) if pc == entry]
    assert len(entries) == len(calls)
    occurrences = []
    # the first iterations (two calls in a row, then the tail call), and later ones
    for k in [0, 1, 2, 3, 4, 5, 301, 302, 598, 599] if name == "leaf37" else [0, 1, 100, 199]:
        call = calls[k]
        m = _ANCHOR_RE.search(str(call.args["drill"]))
        assert m is not None, call.args["drill"]
        occurrences.append(int(m.group(2)))
        count = int(call.args["instructions"])
        assert count == (37 if name == "leaf37" else 3) == int(m.group(3))
        marks, words = _drill(call)
        # exactly the call: QEMU's instructions from its k-th entry on, as many as it ran
        assert [int(w[1], 16) for w in words] == pcs[entries[k] : entries[k] + count], k
        assert words[0][2] == f"{name}+0x0"
        assert words[-1][3] == ("ret" if name == "leaf37" else "jmp")
        assert marks == ["> ", *["  "] * (count - 2), "< "]
    if "coarse" in leaf37.directory.name:
        # the case the anchor is for: calls of one place at one perf time
        assert max(occurrences) > 1


def test_both_decoders_write_the_same_drills(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rec = _recorded("coarse", tmp_path_factory.mktemp("drill"))
    _, native = _slices(rec, tmp_path / "n.fxt.gz")
    _, dlfilter = _slices(rec, tmp_path / "d.fxt.gz", "--decoder", "dlfilter")
    _, text = _slices(rec, tmp_path / "t.fxt.gz", "--decoder", "text")
    drills = [(s.start, s.name, s.args["drill"]) for s in native]
    assert drills == [(s.start, s.name, s.args["drill"]) for s in dlfilter]
    assert drills == [(s.start, s.name, s.args["drill"]) for s in text]
    # every call has an anchor; the [syscall] gaps and the inferred root do not
    anchored = {s.name for s in native if _ANCHOR_RE.search(str(s.args["drill"]))}
    assert {"leaf37", "forward37", "main"} <= anchored
    assert not any(_ANCHOR_RE.search(str(s.args["drill"])) for s in native if s.name == "[syscall]")


def test_a_call_cut_short_or_not_there(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    rec = _recorded("coarse", tmp_path_factory.mktemp("drill"))
    _, thread = _slices(rec, tmp_path / "t.fxt.gz")
    call = next(s for s in thread if s.name == "leaf37")
    argv = shlex.split(str(call.args["drill"]))[1:]
    anchor = argv[argv.index("--after") + 1]
    times = argv[: argv.index("--after")]
    # The drill names the call's start only (its anchor and count say where it ends).
    (start,) = times[-1:]
    assert times[-2] == "--time" and "," not in start
    # More instructions than the recording holds after the anchor: what there is, and a
    # warning.
    result = ptscope(*times, "--after", anchor, "--count", "1000000")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert 37 <= len(lines) < 1000000
    assert lines[0].startswith("> ") and not any(line.startswith("< ") for line in lines)
    (warning,) = result.stderr.splitlines()
    assert f"only {len(lines)} of the call's 1000000 instructions" in warning
    assert "before the recording ends" in warning
    # ... or than a range given whole holds: START,START has the instructions dated START.
    closed = [*times[:-1], f"{start},{start}"]
    result = ptscope(*closed, "--after", anchor, "--count", "1000000")
    assert result.returncode == 0, result.stderr
    short = result.stdout.splitlines()
    assert 1 <= len(short) < len(lines) and short[0].split() == lines[0].split()
    (warning,) = result.stderr.splitlines()
    assert f"only {len(short)} of the call's 1000000 instructions" in warning
    assert f"in {start},{start}" in warning
    # START alone is for a call only.
    line = one_line_error(ptscope(*times))
    assert "START,END" in line and "START alone with --after" in line
    # An anchor that is not there is an error.
    address = anchor.partition(":")[0]
    line = one_line_error(ptscope(*times, "--after", f"{address}:999", "--count", "37"))
    assert f"no instruction 999 at {address}" in line
    for more, words in (
        (("--after", anchor), "--after and --count go together"),
        (("--count", "37"), "--after and --count go together"),
        (("--after", "401136:1", "--count", "37"), "0xADDRESS:K"),
        (("--after", "0x401136:0", "--count", "37"), "0xADDRESS:K"),
        (("--after", anchor, "--count", "0"), "at least 1 instruction"),
    ):
        line = one_line_error(ptscope(*times, *more))
        assert words in line, line
