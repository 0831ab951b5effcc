"""The drill arg's text, built with numpy: what Python's own formatting gives, and what
``ptscope insns`` reads back; written by the FxtWriter, every slice's own string (of its
own length) reads back through the strict reader and the third-party one."""

from __future__ import annotations

import io
import shlex

import numpy as np
from fxt.models import DurationCompleteEventRecord
from fxt.reader import parse_records
from hypothesis import given
from hypothesis import strategies as st

from ptscope.cli import _build_parser, _commands
from ptscope.cli.insns import parse_anchor, parse_time_range
from ptscope.fxt import FxtWriter
from ptscope.fxt import records as rec
from ptscope.fxt.reader import read_trace
from ptscope.fxt.writer import Drill

PREFIX = "ptscope insns /r --tid 7 --time "

# (start, duration, anchor address, occurrence (0: none), count (-1: unknown))
ROWS = st.lists(
    st.tuples(
        st.integers(0, 10**13),
        st.integers(0, 10**6),
        st.integers(0, (1 << 64) - 1),
        st.one_of(st.just(0), st.integers(1, 10**6)),
        st.one_of(st.just(-1), st.just(0), st.integers(1, 10**12)),
    ),
    min_size=1,
    max_size=20,
)


def _columns(
    rows: list[tuple[int, int, int, int, int]],
) -> tuple[np.ndarray, ...]:  # type: ignore[type-arg]
    start = np.array([r[0] for r in rows], dtype=np.int64)
    end = start + np.array([r[1] for r in rows], dtype=np.int64)
    ip = np.array([r[2] for r in rows], dtype=np.uint64)
    occurrence = np.array([r[3] for r in rows], dtype=np.int64)
    count = np.array([r[4] for r in rows], dtype=np.int64)
    return start, end, ip, occurrence, count


def _want(rows: list[tuple[int, int, int, int, int]]) -> list[str]:
    """Python's own formatting of each slice's drill command."""
    width = max(len(str(int(t) // 10**9)) for r in rows for t in (r[0], r[0] + r[1]))
    out = []
    for s, d, ip, k, n in rows:
        e = s + d
        text = f"{PREFIX}{s // 10**9:0{width}d}.{s % 10**9:09d}"
        if k > 0 and n > 0:  # the anchor and the count say where it ends
            text += f" --after {ip:#x}:{k} --count {n}"
        else:
            text += f",{e // 10**9:0{width}d}.{e % 10**9:09d}"
        out.append(text)
    return out


@given(st.lists(st.tuples(st.integers(0, 10**13), st.integers(0, 10**6)), min_size=1, max_size=20))
def test_drill_text_names_each_slices_perf_times(rows: list[tuple[int, int]]) -> None:
    start = np.array([s for s, _ in rows], dtype=np.int64)
    end = start + np.array([d for _, d in rows], dtype=np.int64)
    lengths, words = rec.drill_strings(PREFIX, start, end)
    texts = [w.tobytes()[:n].decode() for w, n in zip(words, lengths.tolist(), strict=True)]
    assert texts == _want([(s, d, 0, 0, -1) for s, d in rows])
    for text, s, e in zip(texts, start.tolist(), end.tolist(), strict=True):
        # and `ptscope insns` reads it back as those times
        assert parse_time_range(text.rsplit(" ", 1)[1]) == (s, e)
    # zero padding after the text, whole words
    assert all(not any(w.tobytes()[n:]) for w, n in zip(words, lengths.tolist(), strict=True))


@given(ROWS)
def test_a_slice_with_an_anchor_and_a_count_names_its_call(
    rows: list[tuple[int, int, int, int, int]],
) -> None:
    start, end, ip, occurrence, count = _columns(rows)
    lengths, words = rec.drill_strings(PREFIX, start, end, ip, occurrence, count)
    texts = [w.tobytes()[:n].decode() for w, n in zip(words, lengths.tolist(), strict=True)]
    assert texts == _want(rows)
    assert all(not any(w.tobytes()[n:]) for w, n in zip(words, lengths.tolist(), strict=True))
    # `ptscope insns` takes each as its arguments
    parser = _build_parser(_commands())
    for text, (s, d, address, k, n) in zip(texts, rows, strict=True):
        args = parser.parse_args(shlex.split(text)[1:])
        if k > 0 and n > 0:
            assert parse_time_range(args.time, open_end=True) == (s, None)
            assert parse_anchor(args.after) == (address, k) and args.count == n
        else:
            assert parse_time_range(args.time) == (s, s + d)
            assert args.after is None and args.count is None


@given(ROWS)
def test_the_writer_gives_each_slice_its_own_drill_string(
    rows: list[tuple[int, int, int, int, int]],
) -> None:
    perf_start, perf_end, ip, occurrence, count = _columns(rows)
    # slices one after the other (the drill's perf times are columns of their own)
    start = np.arange(len(rows), dtype=np.int64) * 10
    buf = io.BytesIO()
    with FxtWriter(buf) as writer:
        writer.slices(
            1,
            7,
            ["f"],
            start,
            start + 5,
            np.zeros(len(rows), dtype=np.int32),
            instructions=count,
            drill=Drill(PREFIX, perf_start, perf_end, ip, occurrence, count),
        )
    data = buf.getvalue()
    (thread,) = read_trace(data).slices.values()
    assert [s.args["drill"] for s in sorted(thread, key=lambda s: s.start)] == _want(rows)
    result = parse_records(io.BytesIO(data))
    assert not result.had_unexpected_eof
    third = [
        r.args["drill"]
        for provider in result.records_by_provider.values()
        for r in provider.records
        if isinstance(r, DurationCompleteEventRecord)
    ]
    assert third == _want(rows)
