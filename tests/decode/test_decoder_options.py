"""Every decode option means the same on every decoder (issue 14, item 2).

Each option of ``ptscope decode`` (``--pid``, ``--tid``, ``--filter``, ``--symfs``,
``--jobs``) is applied to a real emulated recording with the own decoder, the dlfilter
decoder and the text decoder: the traces must be identical, and a filter must keep exactly
what it names (the thread and process ids come from the recording's metadata, not from a
decoder).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ptscope import _native
from ptscope.decode.dlfilter_stream import decode_with_dlfilter
from ptscope.decode.perf_script import BRANCH_FIELDS, decode_perf_data_text, format_time
from ptscope.fxt.reader import read_trace
from ptscope.model import BranchEvent, PowerEvent
from ptscope.reconstruct.engine import TraceSegmentEngine
from support.emulated_corpus import decode_case_recording, perf_text
from support.perf_text_format import cut_inside_a_loop

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built"),
]

DECODERS = ("native", "dlfilter", "text")


def _meta(perf_data: Path) -> dict[str, dict[str, str]]:
    meta: dict[str, dict[str, str]] = json.loads(
        (perf_data.parent / "ptscope-recording.json").read_text()
    )
    return meta


def _decode(perf_data: Path, out: Path, *options: str) -> dict[tuple[int, int], list[str]]:
    """``ptscope decode`` through the CLI; the trace's slices per (pid, tid) as text."""
    command = ["decode", str(perf_data.parent), "-o", str(out), *options]
    done = subprocess.run(
        [sys.executable, "-m", "ptscope", *command],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    trace = read_trace(out)
    return {
        key: [f"{s.start} {s.end} {s.depth} {s.name}" for s in rows]
        for key, rows in trace.slices.items()
        if rows
    }


def _same_on_every_decoder(perf_data: Path, tmp_path: Path, *options: str) -> set[tuple[int, int]]:
    traces = [
        _decode(perf_data, tmp_path / f"{decoder}.fxt.gz", "--decoder", decoder, *options)
        for decoder in DECODERS
    ]
    for decoder, trace in zip(DECODERS[1:], traces[1:], strict=True):
        assert trace == traces[0], f"{options}: {decoder} and {DECODERS[0]} disagree"
    return set(traces[0])


@pytest.fixture(scope="module")
def threads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decode_case_recording("threads-pie", tmp_path_factory)


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decode_case_recording("fork-pie", tmp_path_factory)


def test_tid_keeps_only_that_thread_on_every_decoder(threads: Path, tmp_path: Path) -> None:
    tids = sorted(int(t) for t in _meta(threads)["threads"])
    assert len(tids) == 3
    for tid in tids[1:]:
        kept = _same_on_every_decoder(threads, tmp_path, "--tid", str(tid))
        assert {t for _p, t in kept} == {tid}
    both = _same_on_every_decoder(threads, tmp_path, "--tid", f"{tids[0]},{tids[2]}")
    assert {t for _p, t in both} == {tids[0], tids[2]}


def test_pid_keeps_only_that_process_on_every_decoder(forked: Path, tmp_path: Path) -> None:
    pids = sorted(int(p) for p in _meta(forked)["processes"])
    assert len(pids) == 2
    for pid in pids:
        kept = _same_on_every_decoder(forked, tmp_path, "--pid", str(pid))
        assert {p for p, _t in kept} == {pid}


@pytest.mark.parametrize(
    "options",
    [("--filter", "work,work"), ("--jobs", "2"), ("--symfs", "/")],
    ids=["filter", "jobs", "symfs"],
)
def test_other_options_are_the_same_on_every_decoder(
    threads: Path, tmp_path: Path, options: tuple[str, ...]
) -> None:
    kept = _same_on_every_decoder(threads, tmp_path, *options)
    assert kept


def test_a_trace_cut_in_a_loop_ends_there_on_every_decoder(threads: Path) -> None:
    """perf decoding up to a time inside a loop (`--time=,T`): both decoders end the
    thread with its last jump (dropped otherwise, as jumps inside a function are), so the
    frames still open end at T, and they give the same events."""
    cut = cut_inside_a_loop(perf_text(threads, BRANCH_FIELDS).splitlines())
    until = f"--time=,{format_time(cut.time_ns)}"
    # perf hands the dlfilter each thread's first cbr even past --time (the parallel
    # decoder's time windows drop such events); every branch is within the time.
    dlfilter = [
        e
        for b in decode_with_dlfilter(threads, extra=[until])
        for e in b
        if not (isinstance(e, PowerEvent) and e.time > cut.time_ns)
    ]
    text_events = [
        e
        for b in decode_perf_data_text(threads, ipc=True, time_window=(None, cut.time_ns))
        for e in b
    ]
    assert dlfilter == text_events
    [last] = [e for e in dlfilter if isinstance(e, BranchEvent) and e.tid == cut.tid][-1:]
    assert last.time == cut.time_ns and last.src.function == cut.function
    engine = TraceSegmentEngine()
    engine.feed_all(dlfilter)
    [thread] = [t for t in engine.finish().threads if t.tid == cut.tid]
    assert int(thread.end.max()) == cut.time_ns
