"""``--filter START,STOP`` on a streamed decode (reconstruct/region_filter.StreamedRegions).

The streaming engine hands slices over as calls return, so the filter spills them and
clips once the regions are known. Two checks: on random timelines, written as batches in a
streaming engine's order and read back from the FXT file, it keeps exactly what the
whole-Timeline filter keeps, nested the same; on a real recording decoded by the CLI, the
filtered trace is the unfiltered trace clipped by this test's own reading of the regions.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope import _native
from ptscope.fxt.reader import read_trace
from ptscope.fxt.records import flags_text
from ptscope.fxt.stream import TraceStream
from ptscope.reconstruct.region_filter import StreamedRegions, clip_to_regions, find_regions
from ptscope.timeline import SliceBatch, Timeline
from support.emulated_corpus import decode_case_recording
from support.perfetto_import import assert_perfetto_keeps_everything
from support.timeline_strategies import stream_order, timelines


def _rows(path: Path) -> dict[tuple[int, int], list[tuple[int, int, int, str, str]]]:
    trace = read_trace(path)
    return {
        key: sorted((s.start, s.end, s.depth, s.name, str(s.args.get("flags", ""))) for s in v)
        for key, v in trace.slices.items()
        if v
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(timelines(max_threads=3), st.integers(0, 2**32 - 1), st.data())
def test_streamed_filter_keeps_what_the_timeline_filter_keeps(
    tmp_path_factory: pytest.TempPathFactory, timeline: Timeline, seed: int, data: st.DataObject
) -> None:
    start = data.draw(st.sampled_from(timeline.names), label="START")
    stop = data.draw(st.sampled_from(timeline.names), label="STOP")
    regions = find_regions(timeline, start, stop)
    if not regions or any(t.start.size and t.start.min() >= 1 << 60 for t in timeline.threads):
        return
    expected = clip_to_regions(timeline, regions)
    tmp = tmp_path_factory.mktemp("streamed")
    streamed = StreamedRegions(start, stop, tmp)
    batch = stream_order(timeline, seed)
    cut = max(1, len(batch) // 3)  # several batches
    for lo in range(0, max(len(batch), 1), cut):
        rows = np.arange(lo, min(lo + cut, len(batch)))
        streamed.add(
            SliceBatch(
                names=batch.names,
                **{k: getattr(batch, k)[rows] for k in ("pid", "tid", "start", "end", "name_id",
                                                         "address", "instructions", "cycles",
                                                         "flags")},
            )
        )  # fmt: skip
    assert streamed.regions() == regions
    out, want = tmp / "streamed.fxt", tmp / "whole.fxt"
    sink = TraceStream(out, regions[0][0], compress=False)
    for piece in streamed.clipped(regions):
        sink.write(piece)
    sink.close({}, {})
    streamed.close()
    whole = TraceStream(want, regions[0][0], compress=False)
    for t in expected.threads:
        if len(t):
            whole.write(stream_order(Timeline(names=expected.names, threads=[t]), 0))
    whole.close({}, {})
    # Written in (start, depth) order, the whole-Timeline filter's pieces nest as it says.
    assert _rows(out) == _rows(want)
    assert_perfetto_keeps_everything(out)  # (a region's cut pieces first, outermost first)
    kept = {
        (t.pid, t.tid): sorted(
            (int(s), int(e), int(d), expected.names[n], flags_text(int(f)))
            for s, e, d, n, f in zip(t.start, t.end, t.depth, t.name_id, t.flags, strict=True)
        )
        for t in expected.threads
        if len(t)
    }
    assert _rows(out) == kept


@pytest.mark.slow
@pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built")
def test_a_filtered_decode_is_the_whole_trace_clipped(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Three threads call ``work``; each region runs from one call of it to the next (on
    any thread), and cuts whatever was running on every thread at its begin."""
    perf_data = decode_case_recording("threads-pie", tmp_path_factory)

    def decode(out: Path, *options: str) -> None:
        command = ["decode", str(perf_data.parent), "-o", str(out), "--no-drill", *options]
        done = subprocess.run(
            [sys.executable, "-m", "ptscope", *command], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr

    decode(tmp_path / "whole.fxt.gz")
    decode(tmp_path / "kept.fxt.gz", "--filter", "work,work")
    whole = read_trace(tmp_path / "whole.fxt.gz").slices
    starts = sorted(s.start for rows in whole.values() for s in rows if s.name == "work")
    assert len(starts) == 3
    # A region ends at the first STOP call *after* its START, and the next begins at the
    # first START from there on: two threads may call `work` at one perf time (seen under
    # load), which makes no empty region between them.
    regions = list(itertools.pairwise(sorted(set(starts))))
    expected: dict[tuple[int, int], list[tuple[int, int, int, str, str]]] = {}
    for key, rows in whole.items():
        for s in rows:
            for begin, end in regions:
                overlaps = s.start < end and s.end > begin
                if overlaps or (s.start == s.end and begin <= s.start < end):
                    flags = {f for f in str(s.args.get("flags", "")).split("|") if f}
                    flags |= {"inferred_start"} if s.start < begin else set()
                    flags |= {"open_at_end"} if s.end > end else set()
                    order = ("inferred_start", "open_at_end", "synthetic", "inlined")
                    text = "|".join(f for f in order if f in flags)
                    piece = (max(s.start, begin), min(s.end, end), s.depth, s.name, text)
                    expected.setdefault(key, []).append(piece)
    got = _rows(tmp_path / "kept.fxt.gz")
    assert got == {k: sorted(v) for k, v in expected.items()}
    assert_perfetto_keeps_everything(tmp_path / "whole.fxt.gz", tmp_path / "kept.fxt.gz")
    # Every thread was cut at a region's begin, deep in its calls.
    assert sum(1 for rows in got.values() for r in rows if "inferred_start" in r[4]) >= 6


@pytest.mark.slow
@pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built")
def test_a_filtered_decode_never_holds_the_whole_timeline(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter streams: no whole Timeline is built (the engine is never finished)."""
    from ptscope import pipeline
    from ptscope.reconstruct.fast_engine import FastEngine
    from ptscope.recording import Recording

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the whole Timeline was built")

    monkeypatch.setattr(FastEngine, "finish", refuse)
    monkeypatch.setattr(pipeline, "_branch_timeline", refuse)
    perf_data = decode_case_recording("threads-pie", tmp_path_factory)
    summary = pipeline.decode_recording(
        Recording.load(perf_data.parent),
        tmp_path / "t.fxt.gz",
        pipeline.DecodeOptions(region=("work", "work")),
    )
    assert summary.slices > 0
    assert not list(tmp_path.glob(".ptscope-filter-*"))  # the spill has no name
