"""The dlfilter stream's branch runs read in C (``decode/_crecords.c``) against the numpy
reader it stands in for: the same batches, column for column and dtype for dtype, from
real streams (plain and with instruction detail) cut into any chunks and with any bytes
damaged; and every run the C reader declines (damage, a window, lines records) is still
read, by numpy, as before."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decode.test_dlfilter_insns_stream import BRANCH_COLUMNS, insns_stream, plain_stream
from decode.test_dlfilter_stream import stream
from ptscope.decode import dlfilter_stream as ds
from ptscope.decode import record_format as rf
from ptscope.decode.dlfilter_stream import RecordStreamParser
from ptscope.errors import BadInputError
from ptscope.model import BranchBatch
from support.dlfilter_harness import split_stream

# Built by `pip install .`: a missing module fails here rather than skipping.
from ptscope.decode import _crecords  # type: ignore[attr-defined]  # isort: skip

__all__ = ["insns_stream", "plain_stream", "stream"]  # the fixtures

COLUMNS = (*BRANCH_COLUMNS, "line_offsets", "lines", "gap_insns")


def _read(data: bytes, chunk: int, c_reader: Any, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(ds, "_crecords", c_reader)
    return columnar_items(data, chunk)


def columnar_items(
    data: bytes,
    chunk: int,
    *,
    time_window: tuple[int | None, int | None] | None = None,
    in_place: bool = False,
) -> list[Any]:
    """What the columnar reader gives for ``data`` fed in pieces of ``chunk`` bytes, as
    plain values (a batch as its columns' dtypes and contents), and the BadInputError it
    raised if any. ``in_place``: each piece is a view of one buffer that is overwritten
    once the piece is parsed, as perf reuses a ring chunk given back; the items are made
    plain only at the end, so a view the parser kept would show the overwriting."""
    parser = RecordStreamParser("test stream", time_window=time_window)
    buffer = bytearray(chunk)
    out: list[Any] = []
    try:
        for i in range(0, len(data), chunk):
            piece = data[i : i + chunk]
            if not in_place:
                out += parser.feed_columnar(piece)
                continue
            buffer[: len(piece)] = piece
            with memoryview(buffer)[: len(piece)] as view:
                out += parser.feed_columnar(view)
            buffer[:] = b"\xee" * chunk
        parser.close()
    except BadInputError as e:
        out.append(("error", str(e)))
    return [plain_item(item) for item in out]


def plain_item(item: Any) -> Any:
    """An item of the columnar reader as plain values (comparable with ==)."""
    if not isinstance(item, BranchBatch):
        return item
    values = []
    for name in COLUMNS:
        column = getattr(item, name)
        if column is None:
            values.append(None)
        else:
            array = np.asarray(column)
            values.append((array.dtype.str, array.tolist()))
    return ("batch", tuple(values))


def _same_both_ways(data: bytes, chunk: int, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    want = _read(data, chunk, None, monkeypatch)
    got = _read(data, chunk, _crecords, monkeypatch)
    assert got == want
    return got


@pytest.fixture(scope="module")
def wide_stream(insns_stream: bytes) -> bytes:
    """The instruction-detail stream with every branch's own range three lines wide (and
    at least two instructions, so that the ranges are not damage)."""
    raw = bytearray(insns_stream)
    records = split_stream(insns_stream)
    for offset, kind in zip(records.offsets, records.order, strict=True):
        if kind == "branch":
            insns = max(2, struct.unpack_from("<Q", raw, offset + 40)[0])
            struct.pack_into("<Q", raw, offset + 40, insns)
            struct.pack_into("<Q", raw, offset + 80, 3)
    return bytes(raw)


@pytest.mark.parametrize("which", ["stream", "plain_stream", "insns_stream", "wide_stream"])
@pytest.mark.parametrize("chunk", [1 << 20, 1000, 88])
def test_c_reader_gives_the_numpy_readers_batches(
    which: str, chunk: int, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = request.getfixturevalue(which)
    items = _same_both_ways(data, chunk, monkeypatch)
    assert any(isinstance(i, tuple) and i[0] == "batch" for i in items)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_damaged_runs_are_read_as_the_numpy_reader_reads_them(
    insns_stream: bytes,
    plain_stream: bytes,
    wide_stream: bytes,
    data: st.DataObject,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bytes changed in branch records (times, counts, location ids, line ranges): the C
    reader takes the runs it can vouch for and hands the rest to numpy, which reports the
    damage; the result is the same either way."""
    raw = bytearray(data.draw(st.sampled_from([insns_stream, plain_stream, wide_stream])))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(rf.HEADER.size, len(raw) - 1))
        raw[at] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
    _same_both_ways(bytes(raw), data.draw(st.sampled_from([1 << 20, 500])), monkeypatch)


def test_the_c_reader_refuses_a_run_outside_its_buffer() -> None:
    with pytest.raises(ValueError, match="inside"):
        _crecords.check_run(bytes(100), 50, 1, 88, 10, 1 << 40)
    with pytest.raises(ValueError, match="72 or 88"):
        _crecords.check_run(bytes(100), 0, 1, 80, 10, 1 << 40)
    with contextlib.suppress(ValueError):  # a tag that is not a branch's: not taken
        assert _crecords.check_run(bytes(88), 0, 1, 88, 10, 1 << 40) is None


_TAG_BYTES = st.sampled_from([rf.TAG_BRANCH, rf.TAG_LINES, rf.TAG_LOCATION, 0, 0xFF, ord("\n")])


@settings(max_examples=300, deadline=None)
@given(
    tags=st.lists(_TAG_BYTES, max_size=40),
    size=st.sampled_from([72, 88]),
    lead=st.integers(0, 100),
    filler=st.sampled_from([0, rf.TAG_BRANCH, rf.TAG_LINES]),
)
def test_the_c_tag_scan_is_its_numpy_twins(
    tags: list[int], size: int, lead: int, filler: int
) -> None:
    """Where a run of branch records ends: the first byte of every row, whatever the rest
    of the rows hold (here the tags themselves), as the numpy reference finds it."""
    buf = bytearray([filler]) * (lead + size * len(tags))
    for i, tag in enumerate(tags):
        buf[lead + i * size] = tag
    data = bytes(buf)
    want = ds.scan_tags(data, lead, len(tags), size)
    assert _crecords.scan_tags(data, lead, len(tags), size) == want
    stop, first_lines, last_branch = want
    assert stop == next(
        (i for i, t in enumerate(tags) if t not in (rf.TAG_BRANCH, rf.TAG_LINES)), len(tags)
    )
    assert first_lines == next((i for i, t in enumerate(tags[:stop]) if t == rf.TAG_LINES), -1)
    assert last_branch == max(
        (i for i, t in enumerate(tags[:stop]) if t == rf.TAG_BRANCH), default=-1
    )


def test_the_c_tag_scan_refuses_rows_outside_its_buffer() -> None:
    with pytest.raises(ValueError, match="inside"):
        _crecords.scan_tags(bytes(100), 50, 1, 88)
