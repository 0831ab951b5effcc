"""The streaming FxtWriter: its numpy slice encoding against the scalar record encoders,
begin/end pairs, argument types, errors, streaming and reproducible output."""

from __future__ import annotations

import gzip
import io
import struct
from pathlib import Path

import numpy as np
import pytest
from fxt.reader import parse_records
from fxt.transform import transform_records_to_spans
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ptscope.errors import PtscopeError
from ptscope.fxt import FxtWriter, Koid, Pointer, UInt64, read_trace, write_timeline
from ptscope.fxt import records as rec
from ptscope.timeline import ThreadTimeline, Timeline

NAMES = ["main", "f", "g", "", "f", "std::map<int, int>::find(int const&)"]


def split_records(data: bytes) -> list[bytes]:
    out = []
    at = 0
    while at < len(data):
        size = ((struct.unpack_from("<Q", data, at)[0] >> 4) & 0xFFF) * 8
        out.append(data[at : at + size])
        at += size
    return out


@st.composite
def slice_columns(draw: st.DrawFn) -> dict[str, np.ndarray]:  # type: ignore[type-arg]
    n = draw(st.integers(1, 300))
    start = draw(hnp.arrays(np.int64, n, elements=st.integers(0, 1 << 40)))
    length = draw(hnp.arrays(np.int64, n, elements=st.integers(0, 1 << 20)))
    uniform = draw(st.booleans())  # every slice with the same args (the 2-D fast path)

    def column(dtype: type, absent: int, values: st.SearchStrategy[int]) -> np.ndarray:  # type: ignore[type-arg]
        if uniform:
            fill = draw(st.one_of(st.just(absent), values))
            return np.full(n, fill, dtype=dtype)
        return draw(hnp.arrays(dtype, n, elements=st.one_of(st.just(absent), values)))

    return {
        "start": start,
        "end": start + length,
        "name_id": draw(hnp.arrays(np.int32, n, elements=st.integers(0, len(NAMES) - 1))),
        "address": column(np.uint64, 0, st.integers(1, (1 << 64) - 1)),
        "instructions": column(np.int64, -1, st.integers(0, (1 << 63) - 1)),
        "cycles": column(np.int64, -1, st.integers(0, (1 << 63) - 1)),
        "flags": column(np.uint8, 0, st.integers(1, 255)),
    }


@settings(max_examples=200, deadline=None)
@given(cols=slice_columns(), base=st.integers(0, 1000))
def test_numpy_slices_equal_the_scalar_encoders(cols: dict[str, np.ndarray], base: int) -> None:  # type: ignore[type-arg]
    """Every record that ``slices()`` builds with numpy is, byte for byte, what the
    spec-level encoders in ``records`` give for that slice with the same table refs."""
    cols["start"] = cols["start"] + base
    cols["end"] = cols["end"] + base
    buf = io.BytesIO()
    writer = FxtWriter(buf, time_base=base)
    writer.slices(1, 2, NAMES, **cols)
    writer.close()
    strings: dict[str, int] = {}
    thread = 0
    events = []
    for record in split_records(buf.getvalue()):
        header = struct.unpack_from("<Q", record)[0]
        kind = header & 0xF
        if kind == rec.RecordType.STRING:
            length = (header >> 32) & 0x7FFF
            strings[record[8 : 8 + length].decode()] = (header >> 16) & 0x7FFF
        elif kind == rec.RecordType.THREAD:
            thread = (header >> 16) & 0xFF
            assert struct.unpack_from("<2Q", record, 8) == (1, 2)
        elif kind == rec.RecordType.EVENT:
            events.append(record)
    n = len(cols["start"])
    assert len(events) == n
    ref = strings.get
    for i in range(n):
        args = []
        if cols["address"][i]:
            args.append(rec.arg_pointer(strings["address"], int(cols["address"][i])))
        if cols["instructions"][i] >= 0:
            args.append(rec.arg_u64(strings["instructions"], int(cols["instructions"][i])))
        if cols["cycles"][i] >= 0:
            args.append(rec.arg_u64(strings["cycles"], int(cols["cycles"][i])))
        if cols["flags"][i]:
            text = rec.flags_text(int(cols["flags"][i]))
            args.append(rec.arg_string(strings["flags"], strings[text]))
        name = NAMES[cols["name_id"][i]]
        expected = rec.event_record(
            rec.EventType.DURATION_COMPLETE,
            thread,
            strings[rec.CATEGORY],
            ref(name, 0),
            int(cols["start"][i]) - base,
            args,
            [int(cols["end"][i]) - base],
        )
        assert events[i] == expected, i


def test_begin_end_pairs_load_in_both_readers(tmp_path: Path) -> None:
    """Begin/end pairs whose ends repeat name and category: the third-party reader's span
    builder accepts them, ours nests them like complete events and merges end args."""
    path = tmp_path / "pairs.fxt"
    with FxtWriter.open(path, time_base=1000) as w:
        w.process(7, "prog")
        w.thread_name(7, 8, "main thread")
        w.begin(7, 8, 1000, "main")
        w.begin(7, 8, 1010, "work", {"n": 1})
        w.complete(7, 8, 1012, 1015, "leaf")
        w.end(7, 8, 1020, "work", {"instructions": UInt64(12)})
        w.instant(7, 8, 1025, "[decode error: lost]")
        w.end(7, 8, 1030, "main")
    with open(path, "rb") as f:
        result = parse_records(f)
    assert not result.had_unexpected_eof
    spans = transform_records_to_spans(result.records_by_provider[0].records)
    (root,) = spans[7].threads[8].spans
    assert (root.name, root.timestamp_ns, root.duration_ns) == ("main", 0, 30)
    (work,) = root.children
    assert (work.name, work.timestamp_ns, work.duration_ns) == ("work", 10, 10)
    assert work.args == {"n": 1, "instructions": 12}
    assert spans[7].name == "prog" and spans[7].threads[8].name == "main thread"

    trace = read_trace(path)
    got = [(s.start, s.end, s.depth, s.name, s.args) for s in trace.slices[(7, 8)]]
    assert got == [
        (1000, 1030, 0, "main", {}),
        (1010, 1020, 1, "work", {"n": 1, "instructions": 12}),
        (1012, 1015, 2, "leaf", {}),
    ]
    assert [(i.time, i.name) for i in trace.instants[(7, 8)]] == [(1025, "[decode error: lost]")]


def test_argument_types_round_trip() -> None:
    buf = io.BytesIO()
    w = FxtWriter(buf)
    args = {
        "i": -5,
        "big": (1 << 64) - 1,  # does not fit i64: written as u64
        "u": UInt64(3),
        "p": Pointer(0xFFFF_8000_0000_0000),
        "k": Koid(42),
        "d": 2.5,
        "s": "text",
        "empty": "",
        "yes": True,  # an int
    }
    w.instant(1, 1, 10, "point", args)
    w.counter(1, 1, 11, "freq", {"MHz": 2400, "ratio": 0.5}, counter_id=3)
    w.close()
    trace = read_trace(buf.getvalue())
    (instant,) = trace.instants[(1, 1)]
    assert instant.args == {**args, "yes": 1}
    (counter,) = trace.counters[(1, 1)]
    assert (counter.name, counter.values, counter.counter_id) == (
        "freq",
        {"MHz": 2400, "ratio": 0.5},
        3,
    )


def test_bad_calls_are_refused() -> None:
    w = FxtWriter(io.BytesIO(), time_base=100)
    with pytest.raises(ValueError, match="before the trace's time base"):
        w.instant(1, 1, 99, "early")
    with pytest.raises(ValueError, match="ends"):
        w.complete(1, 1, 150, 140, "backwards")
    with pytest.raises(ValueError, match="at most 15"):
        w.instant(1, 1, 100, "many", {f"a{i}": i for i in range(16)})
    with pytest.raises(ValueError, match="64 bits"):
        w.instant(1, 1, 100, "huge", {"x": 1 << 64})
    with pytest.raises(TypeError, match="unsupported"):
        w.instant(1, 1, 100, "odd", {"x": [1]})  # type: ignore[dict-item]
    one = np.array([100], dtype=np.int64)
    with pytest.raises(ValueError, match="name id"):
        w.slices(1, 1, ["a"], one, one, np.array([1], dtype=np.int32))
    with pytest.raises(ValueError, match="ends before it starts"):
        w.slices(1, 1, ["a"], one + 5, one, np.array([0], dtype=np.int32))
    with pytest.raises(ValueError, match="before the trace's time base"):
        w.slices(1, 1, ["a"], one - 1, one, np.array([0], dtype=np.int32))
    with pytest.raises(ValueError, match="differ in length"):
        w.slices(1, 1, ["a"], one, np.array([1, 2]), np.array([0], dtype=np.int32))


def test_a_record_needing_more_strings_than_the_table_holds_is_refused() -> None:
    w = FxtWriter(io.BytesIO(), string_slots=2)
    w.instant(1, 1, 0, "a", {"b": 1})  # two strings: fits
    with pytest.raises(rec.RecordTooLargeError):
        w.instant(1, 1, 0, "a", {"b": "c"})


def test_slices_are_streamed_to_disk_before_close(tmp_path: Path) -> None:
    n = 200_000
    start = np.arange(n, dtype=np.int64) * 3
    path = tmp_path / "stream.fxt"
    with FxtWriter.open(path) as w:
        w.slices(1, 1, ["f"], start, start + 2, np.zeros(n, dtype=np.int32))
        w.flush()
        # Written under a temporary name beside it until the trace is whole.
        (partial,) = tmp_path.glob("stream.fxt.ptscope-*.tmp")
        assert partial.stat().st_size >= n * 3 * 8  # 3 words a slice, already on disk
        assert not path.exists()
    assert path.stat().st_size == w.stats.bytes
    assert list(tmp_path.iterdir()) == [path]


def make_timeline() -> Timeline:
    start = np.array([5, 6, 8], dtype=np.int64)
    thread = ThreadTimeline(
        pid=3, tid=4, name="t", start=start, end=np.array([9, 7, 9]),
        depth=np.array([0, 1, 1], dtype=np.int32), name_id=np.array([0, 1, 1], dtype=np.int32),
        address=np.array([0x10, 0x20, 0x20], dtype=np.uint64),
        instructions=np.full(3, -1), cycles=np.full(3, -1), flags=np.zeros(3, dtype=np.uint8),
    )  # fmt: skip
    return Timeline(names=["main", "f"], threads=[thread], processes={3: "prog"})


def test_gzip_output_is_reproducible_and_chosen_by_suffix(tmp_path: Path) -> None:
    timeline = make_timeline()
    write_timeline(timeline, tmp_path / "a.fxt.gz")
    write_timeline(timeline, tmp_path / "b.fxt.gz")
    write_timeline(timeline, tmp_path / "c.fxt")
    write_timeline(timeline, tmp_path / "d.fxt", compress=True)
    a = (tmp_path / "a.fxt.gz").read_bytes()
    assert a[:2] == b"\x1f\x8b" and a == (tmp_path / "b.fxt.gz").read_bytes()
    assert (tmp_path / "c.fxt").read_bytes()[:8] == rec.magic_record()
    assert (tmp_path / "d.fxt").read_bytes() == a
    assert read_trace(tmp_path / "a.fxt.gz").slices == read_trace(tmp_path / "c.fxt").slices
    write_timeline(timeline, tmp_path / "e.fxt.gz", gzip_level=6)  # zlib, not ISA-L
    assert (
        gzip.decompress((tmp_path / "e.fxt.gz").read_bytes()) == (tmp_path / "c.fxt").read_bytes()
    )


def test_unwritable_output_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PtscopeError, match=r"cannot write .*missing"):
        write_timeline(make_timeline(), tmp_path / "missing" / "t.fxt")
    with pytest.raises(PtscopeError, match="cannot write"):
        write_timeline(make_timeline(), tmp_path)  # a directory


def test_without_isal_gzip_falls_back_to_zlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ptscope.fxt import writer

    monkeypatch.setattr(writer, "_FastGzipFile", None)
    write_timeline(make_timeline(), tmp_path / "fallback.fxt.gz")
    write_timeline(make_timeline(), tmp_path / "zlib1.fxt.gz", gzip_level=1)
    fallback = (tmp_path / "fallback.fxt.gz").read_bytes()
    assert fallback == (tmp_path / "zlib1.fxt.gz").read_bytes()


def test_a_failed_write_leaves_no_trace_and_the_old_one_intact(tmp_path: Path) -> None:
    """Issue 20: an error (or a signal) while writing removes what was written; a trace
    already there is replaced only by a whole one."""
    path = tmp_path / "t.fxt"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), FxtWriter.open(path) as w:
        w.slices(1, 1, ["f"], np.array([1]), np.array([2]), np.zeros(1, dtype=np.int32))
        raise RuntimeError("stopped")
    assert list(tmp_path.iterdir()) == [path] and path.read_bytes() == b"old"


def test_a_link_stays_a_link_and_a_device_is_written_in_place(tmp_path: Path) -> None:
    target = tmp_path / "real.fxt"
    link = tmp_path / "link.fxt"
    link.symlink_to(target)
    write_timeline(make_timeline(), link)
    assert link.is_symlink() and target.stat().st_size > 0
    assert read_trace(link).slices
    write_timeline(make_timeline(), "/dev/null")  # not replaced by a regular file
    assert Path("/dev/null").is_char_device()
