"""The trace's writing on a thread of its own (fxt/background.py): batches written in the
order given, a write's failure raised in the decoding thread, nothing left behind by a
decode that fails or is interrupted, and the same trace, byte for byte, as a decode that
writes in its own thread (real perf and QEMU recordings)."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ptscope import pipeline
from ptscope.decode import native
from ptscope.decode.perf_launch import core_idle_beside
from ptscope.fxt.background import WRITER_NICE, BackgroundWrites
from ptscope.fxt.stream import TooManyParts
from ptscope.pipeline import DecodeOptions, decode_recording
from ptscope.recording import Recording
from ptscope.timeline import SliceBatch
from support.emulated_corpus import decode_case_recording
from support.interrupted import interrupt_after_batches


def _batch(k: int) -> SliceBatch:
    one = np.array([k], dtype=np.int64)
    return SliceBatch(
        names=["f"],
        pid=one,
        tid=one,
        start=one,
        end=one + 1,
        name_id=np.zeros(1, dtype=np.int32),
        address=one.view(np.uint64),
        instructions=one,
        cycles=one,
        flags=np.zeros(1, dtype=np.uint8),
    )


class _ListSink:
    """Keeps what it is given; fails at batch ``fail_at`` (its index); waits at ``gate``
    (once ``entered`` is set) when given one; sleeps up to ``jitter`` seconds."""

    def __init__(
        self,
        fail_at: int | None = None,
        gate: threading.Event | None = None,
        jitter: float = 0.0,
    ) -> None:
        self.written: list[int] = []
        self.threads: set[str] = set()
        self.fail_at = fail_at
        self.gate = gate
        self.entered = threading.Event()
        self.jitter = random.Random(7) if jitter else None
        self.max_jitter = jitter
        self.error = OSError(28, "No space left on device")

    def write(self, batch: SliceBatch) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.jitter is not None:
            time.sleep(self.jitter.random() * self.max_jitter)
        if len(self.written) == self.fail_at:
            raise self.error
        self.written.append(int(batch.pid[0]))
        self.threads.add(threading.current_thread().name)


def _writer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ptscope-writer"]


def test_batches_are_written_in_order_and_finish_writes_the_rest() -> None:
    sink = _ListSink()
    writes = BackgroundWrites(sink)
    for k in range(50):
        writes.write(_batch(k))
    writes.finish()
    assert sink.written == list(range(50))
    assert writes.batches == 50
    assert not _writer_threads()


def test_in_order_whichever_thread_writes() -> None:
    """A writer that is slow now and then: the decoding thread writes the oldest batches
    itself while more than two wait, and the order holds."""
    sink = _ListSink(jitter=0.002)
    writes = BackgroundWrites(sink)
    for k in range(300):
        writes.write(_batch(k))
    writes.finish()
    assert sink.written == list(range(300))
    # (how many each wrote depends on the machine's load: at nice 19 on a busy machine the
    # writer thread may not run at all)
    assert writes.written_here > 0
    assert threading.current_thread().name in sink.threads


def test_a_writer_that_never_runs_only_delays_the_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No core for the writer thread (here: it waits to start): the decoding thread writes
    all but two batches itself as they come, and the rest at finish()."""
    start = threading.Event()
    run = BackgroundWrites._run

    def held(self: BackgroundWrites) -> None:
        start.wait(10)
        run(self)

    monkeypatch.setattr(BackgroundWrites, "_run", held)
    sink = _ListSink()
    writes = BackgroundWrites(sink)
    for k in range(10):
        writes.write(_batch(k))
        assert sink.written == list(range(max(0, k - 1)))
    writes_done = threading.Thread(target=writes.finish)
    writes_done.start()
    writes_done.join(0.5)
    assert sink.written == list(range(10))  # finish() wrote the last two itself
    start.set()
    writes_done.join(10)
    assert not _writer_threads()


def test_the_writer_thread_yields_to_every_other_thread() -> None:
    ours = os.getpriority(os.PRIO_PROCESS, 0)  # (Linux: this thread's)
    gate = threading.Event()
    sink = _ListSink(gate=gate)
    writes = BackgroundWrites(sink)
    writes.write(_batch(0))
    assert sink.entered.wait(10)
    native_id = writes._thread.native_id
    assert native_id is not None
    assert os.getpriority(os.PRIO_PROCESS, native_id) == WRITER_NICE == 19
    gate.set()
    writes.finish()
    assert os.getpriority(os.PRIO_PROCESS, 0) == ours  # the decoding thread's is unchanged


def test_a_failed_write_is_raised_in_the_decoding_thread_as_it_was() -> None:
    sink = _ListSink(fail_at=3)
    writes = BackgroundWrites(sink)
    with pytest.raises(OSError) as raised:
        for k in range(50):
            writes.write(_batch(k))
        writes.finish()
    assert raised.value is sink.error
    assert sink.written == [0, 1, 2]
    writes.abandon()
    assert not _writer_threads()


def test_a_failure_in_the_last_batch_is_raised_by_finish() -> None:
    sink = _ListSink(fail_at=1)
    writes = BackgroundWrites(sink)
    writes.write(_batch(0))
    writes.write(_batch(1))
    with pytest.raises(OSError):
        writes.finish()
    assert sink.written == [0]


def test_abandoning_drops_what_waits_and_ends_the_thread() -> None:
    gate = threading.Event()
    sink = _ListSink(gate=gate)
    writes = BackgroundWrites(sink, depth=2)
    writes.write(_batch(0))
    assert sink.entered.wait(10)  # the thread writes it (held at the gate)
    writes.write(_batch(1))
    writes.write(_batch(2))  # two wait: not more than the depth
    stopper = threading.Thread(target=writes.abandon)
    stopper.start()
    stopper.join(0.2)
    gate.set()
    stopper.join(10)
    assert not stopper.is_alive()
    assert sink.written == [0]
    assert not _writer_threads()


@pytest.mark.parametrize(
    ("cpus", "load", "busy", "expected"),
    [
        (2, 0.0, 2, False),  # one job on two cores: perf and the engine fill them
        (3, 0.0, 2, True),
        (4, 0.0, 3, True),
        (4, 1.5, 3, False),
        (16, 0.0, 5, True),
    ],
)
def test_a_writer_thread_is_wanted_where_a_core_is_idle_for_it(
    cpus: int, load: float, busy: int, expected: bool
) -> None:
    assert core_idle_beside(busy, cpus, load) is expected


# ------------------------------------------------------------ real decodes


@pytest.fixture(scope="module")
def perf_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return decode_case_recording("threads-pie", tmp_path_factory)


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of a few slices: the short recording goes through the queue many times."""
    monkeypatch.setattr(pipeline, "_DRAIN_SLICES", 64)
    monkeypatch.setattr(native, "BATCH_ROWS", 256)


def _parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.parent.iterdir())}


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        DecodeOptions(jobs=1),
        DecodeOptions(jobs=2),
        DecodeOptions(jobs=1, time_axis="instructions", insn_detail=True),
        DecodeOptions(jobs=1, split_size=20_000),
    ],
    ids=["j1", "j2", "instructions", "split"],
)
@pytest.mark.usefixtures("small_batches")
def test_the_writer_thread_writes_the_same_trace(
    perf_data: Path, tmp_path: Path, options: DecodeOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued: list[int] = []

    class Counted(BackgroundWrites):
        def write(self, batch: SliceBatch) -> None:
            queued.append(len(batch))
            super().write(batch)

    monkeypatch.setattr(pipeline, "BackgroundWrites", Counted)
    recording = Recording.find(perf_data)
    traces = []
    for threaded in (False, True):
        out = tmp_path / f"threaded-{threaded}" / "trace.fxt.gz"
        out.parent.mkdir()
        options = DecodeOptions(
            **{**options.__dict__, "drill": perf_data.parent, "writer_thread": threaded}
        )
        summary = decode_recording(recording, out, options)
        assert summary.slices > 200
        traces.append((_parts(out), summary.slices, summary.top_functions))
        # Through the queue, a few slices at a time (or not at all without the thread).
        assert (len(queued) > 1) is threaded
        assert sum(queued) == (summary.slices if threaded else 0)
    assert traces[0] == traces[1]
    if options.split_size:
        assert len(traces[0][0]) > 1
    assert not _writer_threads()


@pytest.mark.slow
@pytest.mark.usefixtures("small_batches")
def test_a_failure_in_the_writer_thread_is_the_decodes_error(
    perf_data: Path, tmp_path: Path
) -> None:
    """A split that would make too many parts is refused from the writer thread: the same
    one-line error as without it, and no part is left."""
    out = tmp_path / "trace.fxt.gz"
    with pytest.raises(TooManyParts):
        decode_recording(
            Recording.find(perf_data),
            out,
            DecodeOptions(jobs=1, split_time=1, writer_thread=True),
        )
    assert list(tmp_path.iterdir()) == []
    assert not _writer_threads()


@pytest.mark.slow
@pytest.mark.usefixtures("small_batches")
@pytest.mark.parametrize("decoder", ["dlfilter", "native"])
def test_an_interrupted_decode_leaves_no_trace_and_no_thread(
    perf_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, decoder: str
) -> None:
    """Ctrl-C while batches wait for the writer: the thread ends, the trace is removed."""
    interrupt_after_batches(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        decode_recording(
            Recording.find(perf_data),
            tmp_path / "trace.fxt.gz",
            DecodeOptions(decoder=decoder, jobs=1, writer_thread=True),
        )
    assert list(tmp_path.iterdir()) == []
    assert not _writer_threads()


def test_the_engine_answers_nothing_else_while_it_feeds() -> None:
    """feed() runs without the GIL, which it takes back to ask a landing-pad question: the
    lookup runs (in Python), and any other call on the engine meanwhile is refused
    instead of racing with its state; the trace is the one a plain run gives."""
    from ptscope.reconstruct import fast_engine
    from ptscope.reconstruct.fast_engine import FastEngine
    from support.engine_diff import to_items
    from support.event_script import parse_script

    if not fast_engine.is_available():
        pytest.skip("the C engine is not built")
    golden = Path(__file__).parents[1] / "engine" / "golden" / "ocaml_raise.golden"
    script = parse_script(golden.read_text())
    assert script.landing_pads is not None
    pads = script.landing_pads
    refused: list[str] = []
    engine: FastEngine | None = None

    def asking(dso: str, ip: int) -> list[tuple[int, int]]:
        assert engine is not None
        try:
            engine.take_output()
        except RuntimeError as e:
            refused.append(str(e))
        return pads(dso, ip)

    engine = FastEngine(landing_pads=asking)
    engine.feed_all(to_items(script.events))
    asked = engine.finish()
    plain = FastEngine(landing_pads=pads)
    plain.feed_all(to_items(script.events))
    assert refused and set(refused) == {"the engine is in use by another thread"}
    assert asked.slice_count() == plain.finish().slice_count() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("decoder", "jobs", "idle_core", "threaded", "busy"),
    [
        ("dlfilter", 1, False, False, [2]),
        ("dlfilter", 1, True, True, [2]),
        ("dlfilter", 2, False, True, []),
        ("native", 1, False, False, [1]),
        ("native", 2, True, True, [1]),
    ],
    ids=["one-job-no-idle-core", "one-job-idle-core", "windows", "own-busy", "own-idle"],
)
def test_the_decode_writes_on_the_thread_where_it_pays(
    perf_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    decoder: str,
    jobs: int,
    idle_core: bool,
    threaded: bool,
    busy: list[int],
) -> None:
    """By default: with windows (the later ones are read once their perfs have ended), or
    when a core is idle beside perf's and the engine's; not otherwise (two busy cores).
    The own decoder runs in the engine's thread (one busy core, whatever --jobs says)."""
    started: list[int] = []

    class Counted(BackgroundWrites):
        def __init__(self, sink: Any) -> None:
            started.append(1)
            super().__init__(sink)

    asked: list[int] = []

    def idle(busy: int) -> bool:
        asked.append(busy)
        return idle_core

    monkeypatch.setattr(pipeline, "BackgroundWrites", Counted)
    monkeypatch.setattr(pipeline, "core_idle_beside", idle)
    options = DecodeOptions(decoder=decoder, jobs=jobs)
    decode_recording(Recording.find(perf_data), tmp_path / "t.fxt.gz", options)
    assert bool(started) is threaded
    assert asked == busy  # perf's thread and the engine's, or the engine's alone
    # Into a FIFO or a device: never (a signal must reach the thread that waits).
    started.clear()
    decode_recording(
        Recording.find(perf_data),
        Path("/dev/null"),
        DecodeOptions(decoder=decoder, jobs=jobs, writer_thread=True),
    )
    assert not started
