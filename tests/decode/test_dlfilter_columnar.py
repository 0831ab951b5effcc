"""The columnar record-stream reader: branch runs as BranchBatch es, everything else as
events in stream order. Checked against the event reader on a stream written by the real
filter (with perf's error lines between records, any chunking, time windows, damage)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decode.test_dlfilter_stream import parse, stream, with_error_line
from ptscope.decode.dlfilter_stream import RecordStreamParser
from ptscope.errors import BadInputError
from ptscope.model import BranchBatch, DecodeError, Event, LocationTable
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import TraceSegmentEngine
from support.engine_diff import assert_same

__all__ = ["stream"]  # the fixture, shared with the event reader's tests


def parse_columnar(
    data: bytes,
    chunk: int | None = None,
    table: LocationTable | None = None,
    window: tuple[int | None, int | None] | None = None,
) -> list[Event | BranchBatch]:
    parser = RecordStreamParser("test stream", locations=table, time_window=window)
    items: list[Event | BranchBatch] = []
    step = chunk or len(data) or 1
    for i in range(0, len(data), step):
        items += parser.feed_columnar(data[i : i + step])
    parser.close()
    return items


def expand(items: list[Event | BranchBatch]) -> list[Event]:
    out: list[Event] = []
    for item in items:
        if isinstance(item, BranchBatch):
            out += item.events()
        else:
            out.append(item)
    return out


@pytest.mark.parametrize("chunk", [None, 1, 7, 72, 1000])
def test_batches_hold_the_same_events_in_the_same_order(stream: bytes, chunk: int | None) -> None:
    data = with_error_line(stream, 5)
    items = parse_columnar(data, chunk)
    assert any(isinstance(i, BranchBatch) for i in items)
    assert any(isinstance(i, DecodeError) for i in items)
    assert expand(items) == parse(data, chunk)


def test_time_windows(stream: bytes) -> None:
    data = with_error_line(stream, 3)
    for window in ((None, None), (150, 300), (2_000_000_000, None)):
        parser = RecordStreamParser("t", time_window=window)
        events = parser.feed(data)
        parser.close()
        assert expand(parse_columnar(data, window=window)) == events


def test_a_shared_table_numbers_each_location_once(stream: bytes) -> None:
    table = LocationTable()
    first = parse_columnar(stream, table=table)
    size = len(table)
    second = parse_columnar(stream, 100, table=table)
    assert len(table) == size  # the second stream's locations were all known

    def ids(items: list[Event | BranchBatch]) -> list[int]:
        batches = [i for i in items if isinstance(i, BranchBatch)]
        return np.concatenate([np.stack([b.src, b.dst], axis=1).ravel() for b in batches]).tolist()

    assert ids(first) == ids(second)


@pytest.mark.skipif(not fast_engine.is_available(), reason="the C engine is not built")
def test_through_both_engines(stream: bytes) -> None:
    data = with_error_line(stream, 5)
    a = TraceSegmentEngine()
    a.feed_all(parse(data))
    b = fast_engine.FastEngine()
    b.feed_all(parse_columnar(data, 1000))
    assert_same(a, a.finish(), b, b.finish())


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corruption_is_an_error_or_harmless(stream: bytes, data: st.DataObject) -> None:
    """Damaged bytes give BadInputError or batches that the C engine takes without harm."""
    buf = bytearray(with_error_line(stream, 5))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    chunk = data.draw(st.sampled_from([None, 13, 1000]))
    with contextlib.suppress(BadInputError):
        items = parse_columnar(bytes(buf), chunk)
        if fast_engine.is_available():
            engine = fast_engine.FastEngine()
            with contextlib.suppress(OverflowError):  # a damaged time may be out of range
                engine.feed_all(items)
                engine.finish()
