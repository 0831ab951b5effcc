"""The drill arg's text, built with numpy: what Python's own formatting gives."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ptscope.cli.insns import parse_time_range
from ptscope.fxt import records as rec


@given(st.lists(st.tuples(st.integers(0, 10**13), st.integers(0, 10**6)), min_size=1, max_size=20))
def test_drill_text_names_each_slices_perf_times(rows: list[tuple[int, int]]) -> None:
    start = np.array([s for s, _ in rows], dtype=np.int64)
    end = start + np.array([d for _, d in rows], dtype=np.int64)
    length, words = rec.drill_strings("ptscope insns /r --tid 7 --time ", start, end)
    texts = [w.tobytes()[:length].decode() for w in words]
    width = max(len(str(int(x) // 10**9)) for x in (*start, *end))
    for text, s, e in zip(texts, start.tolist(), end.tolist(), strict=True):
        want = f"{s // 10**9:0{width}d}.{s % 10**9:09d},{e // 10**9:0{width}d}.{e % 10**9:09d}"
        assert text == "ptscope insns /r --tid 7 --time " + want
        # and `ptscope insns` reads it back as those times
        assert parse_time_range(text.rsplit(" ", 1)[1]) == (s, e)
    # zero padding after the text, whole words
    assert all(not any(w.tobytes()[length:]) for w in words)
