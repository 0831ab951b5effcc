"""Ring mode (decode/record_ring.py, dlfilter.c "Ring mode"): the records in shared memory,
perf's text in order.

The reader alone on crafted stdout (chunk records between text lines, cut anywhere); then
the real perf with the real dlfilter, ring against pipe, on recordings whose decode prints
text amid the records (decode errors of a damaged trace, task events of a forking program)
and with chunks so small that perf waits for them: the same events in the same order. The
dlfilter never cuts a record at a chunk's end (the reader still can join one: a string
longer than a chunk).
"""

from __future__ import annotations

import mmap
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decode.test_crecords import columnar_items
from decode.test_dlfilter_insns_stream import insns_stream, plain_stream
from decode.test_dlfilter_stream import stream
from ptscope import _native
from ptscope.decode import record_format as rf
from ptscope.decode.dlfilter_stream import (
    DlfilterProcess,
    RecordStreamParser,
    decode_with_dlfilter,
)
from ptscope.decode.record_ring import (
    RING_CHUNK_BYTES,
    RING_CHUNKS,
    RingReader,
    SharedRing,
)
from ptscope.decode.record_ring import (
    RING_HEADROOM_CHUNKS as RING_HEADROOM,
)
from ptscope.errors import BadInputError
from support.emulated_corpus import damaged_copy, decode_case_recording

__all__ = ["insns_stream", "plain_stream", "stream"]  # the fixtures


class FakeRing:
    """Chunk k holds bytes "A" + k; records what was given back."""

    chunks = 2
    chunk_bytes = 64

    def __init__(self) -> None:
        self.returned: list[int] = []
        self.behind: list[bool] = []

    def view(self, chunk: int, length: int) -> memoryview:
        return memoryview(bytes([65 + chunk]) * length)

    def give_back(self, chunk: int, *, behind: bool = False) -> None:
        self.returned.append(chunk)
        self.behind.append(behind)


def marker(chunk: int, length: int) -> bytes:
    return rf.CHUNK.pack(rf.TAG_CHUNK, chunk, length)


def read_all(stdout: bytes, cuts: list[int], ring: FakeRing | None = None) -> list[bytes]:
    """What the reader yields from ``stdout`` read in pieces cut at ``cuts``."""
    reader = RingReader(ring or FakeRing(), "test")  # type: ignore[arg-type]
    out: list[bytes] = []
    at = 0
    for cut in [*sorted(c % (len(stdout) + 1) for c in cuts), len(stdout)]:
        # each piece copied before the next is asked for: a chunk's view is released
        # (and the chunk given back) then
        out += [bytes(piece) for piece in reader.split(stdout[at:cut])]
        at = max(at, cut)
    out += reader.finish()
    return out


STDOUT = (
    marker(0, 5)  # records, no text
    + b"error one\n"
    + b"error two\n"
    + marker(1, 3)  # perf printed these after chunk 1's records
    + b"task event\n"
    + marker(rf.NO_CHUNK, 0)  # text with no record before it
    + marker(0, 4)
    + b"printed after the last chunk\n"
)
EXPECTED = [
    b"AAAAA",
    b"BBB",
    b"error one\nerror two\n",
    b"task event\n",
    b"AAAA",
    b"printed after the last chunk\n",
]


@given(st.lists(st.integers(0, len(STDOUT)), max_size=6))
def test_chunks_come_before_the_text_printed_after_them(cuts: list[int]) -> None:
    ring = FakeRing()
    assert read_all(STDOUT, cuts, ring) == EXPECTED
    assert ring.returned == [0, 1, 0]


@pytest.mark.parametrize(
    "bad",
    [
        marker(2, 1),  # no such chunk
        marker(0, 65),  # longer than a chunk
        marker(0, 0),  # an empty chunk handed over
        marker(rf.NO_CHUNK, 3),
        bytes([rf.TAG_CHUNK, 1]) + marker(0, 1)[2:],  # reserved bytes set
    ],
)
def test_a_damaged_chunk_record_is_one_clear_error(bad: bytes) -> None:
    with pytest.raises(BadInputError, match="damaged chunk record"):
        read_all(b"text\n" + bad, [])


@settings(max_examples=300)
@given(st.binary(max_size=200), st.lists(st.integers(0, 200), max_size=4))
def test_any_stdout_gives_pieces_or_a_clear_error(data: bytes, cuts: list[int]) -> None:
    try:
        pieces = read_all(data, cuts)
    except BadInputError:
        return
    assert all(isinstance(p, bytes) for p in pieces)


def test_the_shared_ring_hands_chunks_back_through_its_pipe() -> None:
    ring = SharedRing(chunks=4, chunk_bytes=4096, headroom=0)
    try:
        memfd, free_read = ring.perf_fds
        assert ring.argument() == f"ring={memfd},{free_read},4,4096"
        with mmap.mmap(memfd, 4 * 4096) as writable:
            writable[4096 : 4096 + 5] = b"hello"
        with ring.view(1, 5) as records:
            assert records == b"hello"
        ring.give_back(1)
        assert os.read(free_read, 16) == (1).to_bytes(4, "little")
    finally:
        ring.close()


def test_headroom_chunks_go_back_only_while_ptscope_is_behind() -> None:
    """perf fills the headroom chunks (those after the circulating ones) at its start,
    while ptscope imports its decoder; ptscope gives one back while more chunks wait for
    it, and otherwise frees its memory, so that the ring shrinks back once caught up."""
    ring = SharedRing(chunks=2, chunk_bytes=1 << 16, headroom=2)
    try:
        memfd, free_read = ring.perf_fds
        assert ring.argument() == f"ring={memfd},{free_read},4,{1 << 16}"
        os.set_blocking(free_read, False)
        with mmap.mmap(memfd, 4 << 16) as writable:
            writable[:] = b"x" * (4 << 16)  # perf filled every chunk
            assert os.fstat(memfd).st_blocks * 512 >= 4 << 16
            ring.give_back(2, behind=True)  # a headroom chunk, ptscope behind: back
            assert os.read(free_read, 16) == (2).to_bytes(4, "little")
            ring.give_back(1)  # a circulating chunk: always back
            assert os.read(free_read, 16) == (1).to_bytes(4, "little")
            ring.give_back(3)  # caught up: released, not back
            with pytest.raises(BlockingIOError):
                os.read(free_read, 16)
            assert os.fstat(memfd).st_blocks * 512 <= 3 << 16  # its memory is gone
            assert writable[3 << 16 : 4 << 16] == bytes(1 << 16)
            assert writable[2 << 16 : 3 << 16] == b"x" * (1 << 16)
    finally:
        ring.close()


def test_the_reader_says_when_more_chunks_wait() -> None:
    """A chunk is given back as "behind" when more of stdout was read after its record."""
    ring = FakeRing()
    assert read_all(marker(0, 2) + marker(1, 2) + marker(0, 1), [], ring) == [b"AA", b"BB", b"A"]
    assert ring.behind == [True, True, False]
    ring = FakeRing()
    read_all(marker(0, 2) + marker(1, 2), [16], ring)  # one record per read: caught up
    assert ring.behind == [False, False]


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_chunks_parsed_in_place_give_what_copies_give(
    stream: bytes, insns_stream: bytes, plain_stream: bytes, data: st.DataObject
) -> None:
    """ptscope parses a ring chunk where it lies and gives it back at once: the parser
    keeps no view of it (a record cut at its end, rows of runs read by numpy are copied),
    whatever the records hold (bytes damaged, perf's text among them) and whichever reader
    takes them."""
    raw = bytearray(data.draw(st.sampled_from([stream, insns_stream, plain_stream])))
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(rf.HEADER.size, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, ord("\n")]))
    size = data.draw(st.sampled_from([88 * 3 + 5, 4096, 1 << 16]))
    window = data.draw(st.sampled_from([None, (0, None), (None, 1 << 60)]))
    want = columnar_items(bytes(raw), size, time_window=window)
    assert columnar_items(bytes(raw), size, time_window=window, in_place=True) == want


# ----------------------------------------------------------------- with the real perf

real_perf = [
    pytest.mark.slow,
    pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built"),
    pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-x86_64 is missing"),
]


def _events(perf_data: Path, monkeypatch: pytest.MonkeyPatch, mode: str, **kw: Any) -> list[str]:
    """The decoded events, as comparable text, with the records through ``mode``."""
    if mode == "pipe":
        monkeypatch.setenv("PTSCOPE_NO_RING", "1")
    else:
        monkeypatch.delenv("PTSCOPE_NO_RING", raising=False)
    # tiny chunks: many chunk ends among the records, and perf waits for chunks to come back
    size = (2, 4096, 3) if mode == "tiny chunks" else (RING_CHUNKS, RING_CHUNK_BYTES, RING_HEADROOM)
    monkeypatch.setattr(SharedRing.__init__, "__defaults__", size)
    events = [repr(e) for batch in decode_with_dlfilter(perf_data, **kw) for e in batch]
    assert events
    return events


@pytest.mark.parametrize(
    ("key", "damaged", "insns"),
    [("fork-pie", False, False), ("basics-static", True, False), ("signals-static", True, True)],
)
@real_perf[0]
@real_perf[1]
@real_perf[2]
def test_ring_and_pipe_give_the_same_events(
    key: str,
    damaged: bool,
    insns: bool,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    perf_data = decode_case_recording(key, tmp_path_factory)
    if damaged:
        perf_data = damaged_copy(perf_data, tmp_path / "damaged.data")
    kw = {"task_events": True, "insns": insns}
    pipe = _events(perf_data, monkeypatch, "pipe", **kw)
    text = [e for e in pipe if e.startswith(("DecodeError", "CommEvent"))]
    assert text  # perf printed text amid the records: ring mode must keep its place
    assert _events(perf_data, monkeypatch, "ring", **kw) == pipe
    assert _events(perf_data, monkeypatch, "tiny chunks", **kw) == pipe


@pytest.mark.parametrize("insns", [False, True])
@real_perf[0]
@real_perf[1]
@real_perf[2]
def test_no_record_straddles_two_chunks(
    insns: bool, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record that does not fit in what is left of a chunk starts the next one, so each
    chunk is parsed whole where it lies: nothing is left over to join with the next chunk's
    start (a second run of records, and its Python work, per chunk)."""
    monkeypatch.delenv("PTSCOPE_NO_RING", raising=False)
    monkeypatch.setattr(SharedRing.__init__, "__defaults__", (2, 4096, 3))
    left_over: list[int] = []
    feed = RecordStreamParser._feed

    def spy(parser: RecordStreamParser, data: Any, *args: Any) -> None:
        feed(parser, data, *args)
        left_over.append(len(parser._buf))

    monkeypatch.setattr(RecordStreamParser, "_feed", spy)
    perf_data = decode_case_recording("basics-static", tmp_path_factory)
    process = DlfilterProcess(perf_data, insns=insns)
    assert any(a.startswith("ring=") for a in process.argv)
    assert sum(len(b) for b in process.columnar_batches()) > 100
    assert len(left_over) > 10  # many chunks
    assert set(left_over) == {0}


@real_perf[0]
@real_perf[1]
@real_perf[2]
def test_ring_mode_is_used_and_leaves_no_descriptor_open(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PTSCOPE_NO_RING", raising=False)
    try:
        SharedRing().close()
    except OSError as e:  # (then decodes use the pipe, which the other tests cover)
        pytest.skip(f"no memory files here: {e}")
    perf_data = decode_case_recording("basics-static", tmp_path_factory)
    before = sorted(os.listdir("/proc/self/fd"))
    process = DlfilterProcess(perf_data)
    assert any(a.startswith("ring=") for a in process.argv)
    assert sum(len(b) for b in process.batches()) > 100
    assert sorted(os.listdir("/proc/self/fd")) == before


@real_perf[0]
@real_perf[1]
@real_perf[2]
def test_perfs_waits_for_a_free_chunk_are_counted(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trailer says how often, and how long, perf waited for ptscope to give a chunk
    back (ring sizes are chosen by it): here ptscope holds its chunks for 0.2 s."""
    monkeypatch.delenv("PTSCOPE_NO_RING", raising=False)
    monkeypatch.setattr(SharedRing.__init__, "__defaults__", (2, 4096, 0))
    perf_data = decode_case_recording("basics-static", tmp_path_factory)
    process = DlfilterProcess(perf_data)
    batches = process.batches()
    next(batches)
    time.sleep(0.2)  # perf fills both chunks meanwhile, then waits
    assert sum(len(b) for b in batches) > 100
    trailer = process.run_info().stats.trailer
    assert trailer is not None
    assert trailer["ring_waits"] >= 1
    assert 0.1e9 <= trailer["ring_wait_ns"] < 60e9

    monkeypatch.setenv("PTSCOPE_NO_RING", "1")  # through the pipe: no chunks to wait for
    piped = DlfilterProcess(perf_data)
    for _ in piped.batches():
        time.sleep(0.01)
    trailer = piped.run_info().stats.trailer
    assert trailer is not None and trailer["ring_waits"] == trailer["ring_wait_ns"] == 0
