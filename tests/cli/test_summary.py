"""The decode summary's top functions: counted per name across threads and chunks."""

from __future__ import annotations

from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.fxt import totals
from ptscope.timeline import ThreadTimeline, Timeline

NAMES = ["main", "work", "leaf", "[untraced]"]


def _thread(tid: int, slices: list[tuple[int, int, int]]) -> ThreadTimeline:
    return ThreadTimeline(
        pid=1,
        tid=tid,
        start=np.array([s for s, _, _ in slices], dtype=np.int64),
        end=np.array([s + d for s, d, _ in slices], dtype=np.int64),
        depth=np.zeros(len(slices), dtype=np.int32),
        name_id=np.array([n for _, _, n in slices], dtype=np.int32),
    )


slices_st = st.lists(
    st.tuples(st.integers(0, 10**12), st.integers(0, 10**9), st.integers(0, len(NAMES) - 1)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    threads=st.lists(slices_st, min_size=1, max_size=3),
    chunk=st.integers(1, 9),
    in_c=st.booleans(),
)
def test_top_functions_sums_every_slice(
    threads: list[list[tuple[int, int, int]]], chunk: int, in_c: bool
) -> None:
    # In C (fxt/_cfxt.c) and with numpy's bincounts a chunk at a time.
    timeline = Timeline(names=list(NAMES))
    timeline.threads = [_thread(i + 1, s) for i, s in enumerate(threads)]
    calls: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for slices in threads:
        for _, d, n in slices:
            calls[NAMES[n]] += 1
            total[NAMES[n]] += d
    saved, saved_c = totals._CHUNK, totals._cfxt
    totals._CHUNK = chunk  # type: ignore[misc]
    if not in_c:
        totals._cfxt = None
    try:
        stats = totals.top_functions(timeline)
    finally:
        totals._CHUNK, totals._cfxt = saved, saved_c  # type: ignore[misc]
    assert {s.name: (s.calls, s.total_ns) for s in stats} == {
        n: (calls[n], total[n]) for n in NAMES if calls[n] and not n.startswith("[")
    }
    assert [s.total_ns for s in stats] == sorted((s.total_ns for s in stats), reverse=True)
