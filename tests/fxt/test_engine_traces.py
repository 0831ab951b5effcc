"""Real engine output through the writer: every engine golden script's Timeline (decode
errors, inferred roots, synthetic frames, kernel stacks...) comes back exactly from our
reader (depths recomputed from nesting, as Perfetto nests) and loads in the ``fxt`` reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.fxt import read_trace, write_timeline
from support.event_script import run_transcript
from support.fxt_check import check_against_timeline

GOLDENS = sorted((Path(__file__).parents[1] / "engine" / "golden").glob("*.golden"))


@pytest.mark.parametrize("golden", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_engine_timeline_round_trips(tmp_path: Path, golden: Path) -> None:
    _, timeline, _ = run_transcript(golden.read_text())
    path = tmp_path / "trace.fxt.gz"
    write_timeline(timeline, path)
    trace = read_trace(path)
    for thread in timeline.threads:
        got = [s.to_slice() for s in trace.slices.get((thread.pid, thread.tid), [])]
        assert got == list(thread.slices(timeline.names))
        got_instants = [(i.time, i.name) for i in trace.instants.get((thread.pid, thread.tid), [])]
        assert got_instants == sorted(
            ((i.time, i.name) for i in thread.instants), key=lambda i: i[0]
        )
    check_against_timeline(path, timeline)


def test_there_are_engine_goldens() -> None:
    assert len(GOLDENS) >= 10
