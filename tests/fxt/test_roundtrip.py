"""Write -> read round trips of random Timelines, checked by our strict reader and by the
third-party ``fxt`` reader; the format's limits (string and thread tables, long strings,
record size) at their real values."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope.fxt import FxtWriter, read_trace, write_timeline
from ptscope.fxt import records as rec
from ptscope.timeline import (
    Instant,
    SliceFlags,
    ThreadTimeline,
    Timeline,
)
from support.fxt_check import check_against_timeline
from support.timeline_strategies import timelines


def check_roundtrip(timeline: Timeline, path: Path) -> None:
    """Our strict reader gets back exactly the Timeline's slices, instants, counters and
    names; the third-party reader sees the same slices, instants and counters."""
    trace = read_trace(path)
    time_range = timeline.time_range()
    assert trace.time_base == (time_range[0] if time_range else 0)
    assert trace.max_record_words <= rec.MAX_RECORD_WORDS

    def cut(text: str) -> str:
        return rec.truncate_utf8(text).decode()

    for th in timeline.threads:
        key = (th.pid, th.tid)
        want = list(th.slices(timeline.names))  # long names come back whole
        got = [s.to_slice() for s in trace.slices.get(key, [])]
        assert got == want
        assert all(s.category == rec.CATEGORY for s in trace.slices.get(key, []))
        got_instants = [(i.time, rec.full_name(i.name, i.args),
                         {k: v for k, v in i.args.items() if not k.startswith("full_name")})
                        for i in trace.instants.get(key, [])]  # fmt: skip
        want_instants = sorted(
            ((i.time, i.name, {k: v if isinstance(v, int) else cut(v) for k, v in
                               i.args.items()}) for i in th.instants),
            key=lambda i: i[0],
        )  # fmt: skip
        assert got_instants == want_instants
        got_counters = [(c.time, c.name, c.values) for c in trace.counters.get(key, [])]
        want_counters = sorted(
            ((c.time, c.name, {rec.ARG_COUNTER_VALUE: c.value}) for c in th.counters),
            key=lambda c: c[0],
        )
        assert got_counters == want_counters
        assert trace.threads.get(key, "") == cut(th.name)
    assert set(trace.thread_keys()) <= {(t.pid, t.tid) for t in timeline.threads}
    pids = {t.pid for t in timeline.threads} | set(timeline.processes)
    assert trace.processes == {p: cut(timeline.processes.get(p, "")) for p in pids}
    check_against_timeline(path, timeline)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(timeline=timelines(), gz=st.booleans())
def test_roundtrip(tmp_path: Path, timeline: Timeline, gz: bool) -> None:
    path = tmp_path / ("t.fxt.gz" if gz else "t.fxt")
    stats = write_timeline(timeline, path)
    assert stats.slices == timeline.slice_count()
    assert stats.file_bytes == path.stat().st_size
    assert (path.read_bytes()[:2] == b"\x1f\x8b") == gz
    check_roundtrip(timeline, path)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    timeline=timelines(max_threads=6),
    string_slots=st.sampled_from([5, 6, 9]),
    thread_slots=st.sampled_from([1, 2, 3]),
)
def test_roundtrip_with_tiny_tables(
    tmp_path: Path, timeline: Timeline, string_slots: int, thread_slots: int
) -> None:
    """Tables far smaller than the trace needs: entries are reused all the time (5 is
    the least an instant with two string args needs: its name, 2 keys, 2 values)."""
    path = tmp_path / "t.fxt"
    time_range = timeline.time_range()
    base = time_range[0] if time_range else 0
    with open(path, "wb") as f:
        writer = FxtWriter(f, time_base=base, string_slots=string_slots, thread_slots=thread_slots)
        writer.timeline(timeline)
        writer.close()
    check_roundtrip(timeline, path)


def walk_records(data: bytes) -> list[tuple[int, int]]:
    """(record type, size in words) of every record, framed independently of the reader."""
    out = []
    at = 0
    while at < len(data):
        header = struct.unpack_from("<Q", data, at)[0]
        words = (header >> 4) & 0xFFF
        assert words > 0
        out.append((header & 0xF, words))
        at += words * 8
    assert at == len(data)
    return out


def test_more_names_than_the_string_table_holds(tmp_path: Path) -> None:
    """40,000 distinct names on one thread (then again on a second): the table's 32,767
    entries are reused, every slice keeps its own name."""
    n = 40_000
    names = [f"function_{i}" for i in range(n)]
    threads = []
    for tid in (1, 2):
        start = np.arange(n, dtype=np.int64) * 10 + 1_000_000_000_000
        threads.append(
            ThreadTimeline(
                pid=1, tid=tid, start=start, end=start + 5,
                depth=np.zeros(n, dtype=np.int32),
                name_id=np.arange(n, dtype=np.int32)[:: 1 if tid == 1 else -1].copy(),
                address=np.zeros(n, dtype=np.uint64),
                instructions=np.full(n, -1, dtype=np.int64),
                cycles=np.full(n, -1, dtype=np.int64),
                flags=np.zeros(n, dtype=np.uint8),
            )
        )  # fmt: skip
    timeline = Timeline(names=names, threads=threads, processes={1: "prog"})
    path = tmp_path / "many.fxt"
    stats = write_timeline(timeline, path)
    assert stats.string_records > n  # entries were reused and strings written again
    kinds = walk_records(path.read_bytes())
    assert max(w for _, w in kinds) <= rec.MAX_RECORD_WORDS
    check_roundtrip(timeline, path)


def test_more_threads_than_the_thread_table_holds(tmp_path: Path) -> None:
    """300 threads in 3 processes, then the first ones again (instants written after all
    slices refer to threads whose table entries were reused)."""
    threads = []
    for i in range(300):
        start = np.array([1000 + i, 1001 + i], dtype=np.int64)
        threads.append(
            ThreadTimeline(
                pid=1 + i % 3, tid=10_000 + i, name=f"worker {i}",
                start=start, end=start + np.array([10, 2]),
                depth=np.array([0, 1], dtype=np.int32),
                name_id=np.array([i % 2, 2], dtype=np.int32),
                address=np.array([0x1000, 0], dtype=np.uint64),
                instructions=np.array([5, -1], dtype=np.int64),
                cycles=np.array([-1, 7], dtype=np.int64),
                flags=np.array([0, 1], dtype=np.uint8),
                instants=[Instant(1005 + i, "[decode error: overflow]")],
            )
        )  # fmt: skip
    threads.sort(key=lambda t: (t.pid, t.tid))
    timeline = Timeline(names=["main", "run", "leaf"], threads=threads,
                        processes={1: "a", 2: "b", 3: "c"})  # fmt: skip
    path = tmp_path / "threads.fxt.gz"
    stats = write_timeline(timeline, path)
    assert stats.thread_records == 300
    check_roundtrip(timeline, path)


def test_long_names_are_shortened_and_long_strings_cut_at_a_character_boundary(
    tmp_path: Path,
) -> None:
    long_name = "x" * 31_999 + "é" + "y" * 10_000  # é is 2 bytes: bytes 31,999..32,000
    long_error = "[decode error: " + "€" * 20_000 + "]"  # 3 bytes each
    start = np.array([10, 12], dtype=np.int64)
    thread = ThreadTimeline(
        pid=5, tid=6, name="t" * 40_000, start=start, end=np.array([20, 15]),
        depth=np.array([0, 1], dtype=np.int32), name_id=np.array([0, 1], dtype=np.int32),
        address=np.zeros(2, dtype=np.uint64), instructions=np.full(2, -1),
        cycles=np.full(2, -1), flags=np.zeros(2, dtype=np.uint8),
        instants=[Instant(11, long_error, {"detail": "z" * 50_000})],
    )  # fmt: skip
    timeline = Timeline(names=[long_name, "short"], threads=[thread], processes={5: "p" * 33_000})
    path = tmp_path / "long.fxt"
    write_timeline(timeline, path)
    trace = read_trace(path)
    slices = trace.slices[(5, 6)]
    # A long name is shown shortened and kept whole in full_name args of at most 32,000
    # bytes each (the 2-byte character did not fit in the first).
    assert slices[0].name == rec.short_name(long_name)
    assert "[41,200 characters cut]" in slices[0].name
    assert slices[0].args["full_name"] == "x" * 31_999
    assert slices[0].args["full_name_2"] == "é" + "y" * 10_000
    assert slices[0].to_slice().name == long_name
    assert slices[1].name == "short" and "full_name" not in slices[1].args
    instant = trace.instants[(5, 6)][0]
    assert instant.name == rec.short_name(long_error)
    assert rec.full_name(instant.name, instant.args) == long_error
    assert all(len(str(v).encode()) <= rec.MAX_STRING_BYTES for v in instant.args.values())
    assert instant.args["detail"] == "z" * 32_000
    assert trace.threads[(5, 6)] == "t" * 32_000
    assert trace.processes[5] == "p" * 32_000
    kinds = walk_records(path.read_bytes())
    assert max(w for _, w in kinds) == 1 + 32_000 // 8  # the longest string record
    check_roundtrip(timeline, path)


def test_empty_timeline(tmp_path: Path) -> None:
    path = tmp_path / "empty.fxt"
    write_timeline(Timeline(), path)
    trace = read_trace(path)
    assert trace.slices == {} and trace.processes == {} and trace.time_base == 0
    check_against_timeline(path, Timeline())


def test_negative_pid_and_tid_round_trip() -> None:
    """perf reports pid/tid -1 for samples it cannot attribute."""
    buf = io.BytesIO()
    writer = FxtWriter(buf, time_base=100)
    writer.process(-1, "unknown")
    writer.thread_name(-1, -1, "unknown thread")
    writer.complete(-1, -1, 100, 200, "f")
    writer.close()
    trace = read_trace(buf.getvalue())
    assert trace.processes == {-1: "unknown"}
    assert trace.threads == {(-1, -1): "unknown thread"}
    assert [(s.start, s.end, s.name) for s in trace.slices[(-1, -1)]] == [(100, 200, "f")]


def test_flag_words_cover_every_slice_flag() -> None:
    for flag in SliceFlags:
        if flag:
            assert rec.flags_text(flag) == flag.name.lower()  # type: ignore[union-attr]
            assert rec.parse_flags_text(rec.flags_text(flag)) == flag
    assert rec.flags_text(0x85) == "inferred_start|synthetic|bit7"
    assert rec.parse_flags_text("inferred_start|synthetic|bit7") == 0x85
    with pytest.raises(ValueError, match="unknown slice flag"):
        rec.parse_flags_text("sideways")
