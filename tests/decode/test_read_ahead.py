"""The windows' records read on a thread of their own (decode/read_ahead.py): items in
order, a stream's error raised where the stream raised it, a reader stopped and its
source closed when the consumer stops, and the same trace, byte for byte, as a decode
that reads in its own thread (a real recording, in windows)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ptscope import pipeline
from ptscope.decode import parallel
from ptscope.decode.read_ahead import ReadAhead
from ptscope.pipeline import DecodeOptions, decode_recording
from ptscope.recording import Recording
from support.emulated_corpus import decode_case_recording
from support.interrupted import interrupt_after_batches


def _readers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ptscope-read-ahead"]


def _perf_children() -> list[int]:
    """This process's children named perf, living or not yet reaped."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
        except OSError:
            continue
        if fields.get("PPid") == str(os.getpid()) and fields.get("Name") == "perf":
            found.append(int(status.parent.name))
    return found


class _Source:
    """Items 0..n-1, then ``error`` if given; notes when it is closed and which thread
    takes its items; waits at ``gate`` before item ``wait_at``."""

    def __init__(
        self,
        n: int,
        error: Exception | None = None,
        wait_at: int | None = None,
        gate: threading.Event | None = None,
    ) -> None:
        self.closed = threading.Event()
        self.taken_in: set[str] = set()
        self._items = self._make(n, error, wait_at, gate)

    def _make(
        self, n: int, error: Exception | None, wait_at: int | None, gate: threading.Event | None
    ) -> Iterator[int]:
        try:
            for k in range(n):
                if k == wait_at and gate is not None:
                    gate.wait()
                self.taken_in.add(threading.current_thread().name)
                yield k
            if error is not None:
                raise error
        finally:
            self.closed.set()

    def __iter__(self) -> _Source:
        return self

    def __next__(self) -> int:
        return next(self._items)

    def close(self) -> None:
        self._items.close()


def test_items_come_in_order_from_the_reader_thread() -> None:
    source = _Source(500)
    ahead = ReadAhead(source, depth=3)
    assert list(ahead) == list(range(500))
    assert source.taken_in == {"ptscope-read-ahead"}
    assert source.closed.is_set()
    assert not _readers()


def test_an_error_comes_after_the_items_before_it() -> None:
    ahead = ReadAhead(_Source(10, error=ValueError("damaged")), depth=2)
    got = []
    with pytest.raises(ValueError, match="damaged"):
        for item in ahead:
            got.append(item)
    assert got == list(range(10))
    assert not _readers()


def test_closing_stops_the_reader_and_closes_its_source() -> None:
    """The consumer stops after a few items while the reader waits for room."""
    source = _Source(10_000)
    ahead = ReadAhead(source, depth=2)
    assert [next(ahead) for _ in range(5)] == list(range(5))
    ahead.close()
    assert source.closed.is_set()
    assert not _readers()
    with pytest.raises(StopIteration):
        next(ahead)


def test_nothing_comes_after_closing_even_what_was_read() -> None:
    ahead = ReadAhead(_Source(3), depth=8)
    assert next(ahead) == 0
    while threading.active_count() > 1 and _readers():  # the reader has read them all
        threading.Event().wait(0.01)
    ahead.close()
    with pytest.raises(StopIteration):
        next(ahead)


def test_closing_unblocks_a_reader_that_waits_in_its_source() -> None:
    """The source waits (as for a window's perf to end) until ``unblock`` lets it go."""
    gate = threading.Event()
    source = _Source(10, wait_at=3, gate=gate)
    ahead = ReadAhead(source, depth=8, unblock=gate.set)
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    ahead.close()
    assert gate.is_set()
    assert source.closed.is_set()
    assert not _readers()


# ------------------------------------------------------------ real decodes


@pytest.fixture(scope="module")
def perf_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decode_case_recording("threads-pie", tmp_path_factory)


def _small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows of a few KB: the short recording is cut into as many as asked for."""
    plan = parallel.plan_windows

    def small(layout: Any, jobs: int, **kwargs: Any) -> Any:
        windows = plan(layout, jobs, min_window_bytes=1024, **kwargs)
        assert len(windows) == jobs
        return windows

    monkeypatch.setattr(parallel, "plan_windows", small)


def _parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.parent.iterdir())}


@pytest.mark.slow
def test_reading_ahead_writes_the_same_trace(
    perf_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[ReadAhead[Any]] = []

    class Counted(ReadAhead[Any]):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(parallel, "ReadAhead", Counted)
    _small_windows(monkeypatch)
    recording = Recording.find(perf_data)
    traces = []
    for ahead in (False, True):
        out = tmp_path / f"ahead-{ahead}" / "trace.fxt.gz"
        out.parent.mkdir()
        options = DecodeOptions(
            decoder="dlfilter", jobs=3, drill=perf_data.parent, read_ahead=ahead
        )
        summary = decode_recording(recording, out, options)
        assert summary.slices > 200
        traces.append((_parts(out), summary.slices, summary.top_functions))
        assert len(made) == int(ahead)  # (the recording is cut into windows)
    assert traces[0] == traces[1]
    assert not _readers()


@pytest.mark.slow
def test_an_interrupted_decode_leaves_no_reader_and_no_perf(
    perf_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the reader reads ahead: its thread ends, the trace is removed."""
    monkeypatch.setattr(pipeline, "_DRAIN_SLICES", 64)
    interrupt_after_batches(monkeypatch, 3)
    _small_windows(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        decode_recording(
            Recording.find(perf_data),
            tmp_path / "trace.fxt.gz",
            DecodeOptions(decoder="dlfilter", jobs=3, read_ahead=True),
        )
    assert list(tmp_path.iterdir()) == []
    assert not _readers()
    assert not _perf_children()
