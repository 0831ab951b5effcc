"""Sampled stacks → slices (reconstruct/sampled.py), with hand-built StackSamples."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.model import Location, StackSample
from ptscope.reconstruct.sampled import SampledStackBuilder, timeline_from_samples
from ptscope.timeline import SliceFlags, Timeline, check_nesting

FUNCS = {
    name: 0x1000 * (i + 1)
    for i, name in enumerate(["main", "parse", "work", "leaf", "other", "f", "g"])
}


def loc(name: str, offset: int = 0x10) -> Location:
    return Location(FUNCS[name] + offset, name, offset, "prog")


def sample(
    time: int, *names: str, tid: int = 1, offsets: dict[str, int] | None = None
) -> StackSample:
    offsets = offsets or {}
    return StackSample(1, tid, time, tuple(loc(n, offsets.get(n, 0x10)) for n in names))


def rows(timeline: Timeline, tid: int = 1) -> list[tuple[int, int, int, str]]:
    thread = next(t for t in timeline.threads if t.tid == tid)
    return [(s.start, s.end, s.depth, s.name) for s in thread.slices(timeline.names)]


def test_frames_stay_open_while_on_the_stack() -> None:
    timeline = timeline_from_samples(
        [
            sample(100, "main", "work", "leaf"),
            sample(200, "main", "work", "leaf"),
            sample(300, "main", "work"),
            sample(400, "main", "parse"),
        ]
    )
    assert rows(timeline) == [
        (100, 500, 0, "main"),
        (100, 400, 1, "work"),
        (100, 300, 2, "leaf"),
        (400, 500, 1, "parse"),
    ]
    for thread in timeline.threads:
        check_nesting(thread)


def test_parent_not_split_when_its_return_address_changes() -> None:
    """main calls work from two call sites: same activation of main, one slice."""
    timeline = timeline_from_samples(
        [
            sample(10, "main", "work", offsets={"main": 0x87}),
            sample(20, "main", "leaf", offsets={"main": 0x160}),
        ]
    )
    main = [r for r in rows(timeline) if r[3] == "main"]
    assert main == [(10, 30, 0, "main")]


def test_recursion_is_compared_by_depth() -> None:
    timeline = timeline_from_samples(
        [
            sample(1, "main", "f", "f", "f"),
            sample(2, "main", "f", "f"),
            sample(3, "main", "f", "f", "g"),
        ]
    )
    assert rows(timeline) == [
        (1, 4, 0, "main"),
        (1, 4, 1, "f"),
        (1, 4, 2, "f"),
        (1, 2, 3, "f"),
        (3, 4, 3, "g"),
    ]


def test_threads_are_independent_and_interleave() -> None:
    timeline = timeline_from_samples(
        [
            sample(1, "main", "work", tid=1),
            sample(2, "main", "parse", tid=2),
            sample(3, "main", "leaf", tid=1),
            sample(4, "main", tid=2),
        ]
    )
    assert [t.tid for t in timeline.threads] == [1, 2]
    assert rows(timeline, 1) == [(1, 5, 0, "main"), (1, 3, 1, "work"), (3, 5, 1, "leaf")]
    assert rows(timeline, 2) == [(2, 6, 0, "main"), (2, 4, 1, "parse")]


def test_flags_mark_inferred_starts_and_open_ends() -> None:
    timeline = timeline_from_samples(
        [sample(10, "main", "work"), sample(20, "main", "leaf"), sample(30, "main", "leaf")]
    )
    thread = timeline.threads[0]
    got = {s.name: s.flags for s in thread.slices(timeline.names)}
    assert got["main"] == SliceFlags.INFERRED_START | SliceFlags.OPEN_AT_END
    assert got["work"] == SliceFlags.INFERRED_START
    assert got["leaf"] == SliceFlags.OPEN_AT_END


def test_single_sample_thread_and_equal_times() -> None:
    timeline = timeline_from_samples(
        [sample(5, "main", "work"), sample(5, "main", "leaf", tid=1), sample(5, "main", tid=3)]
    )
    for thread in timeline.threads:
        check_nesting(thread)
    assert rows(timeline, 3) == [(5, 6, 0, "main")]


def test_out_of_order_sample_is_clamped() -> None:
    timeline = timeline_from_samples(
        [sample(100, "main", "work"), sample(90, "main", "leaf"), sample(200, "main")]
    )
    for thread in timeline.threads:
        check_nesting(thread)
    assert all(r[0] >= 100 for r in rows(timeline))


def test_unknown_frames_of_one_dso_compare_equal() -> None:
    """Unresolved code is grouped per DSO (model.function_key), so it is not split."""
    a = Location(0x5000, "[unknown]", -1, "libjit.so")
    b = Location(0x5400, "[unknown]", -1, "libjit.so")
    timeline = timeline_from_samples(
        [StackSample(1, 1, 1, (loc("main"), a)), StackSample(1, 1, 2, (loc("main"), b))]
    )
    assert [r[3] for r in rows(timeline)] == ["main", "[unknown] (libjit.so)"]
    assert timeline.threads[0].address[1] == 0  # no entry address for unknown code


def test_addresses_are_function_entries() -> None:
    timeline = timeline_from_samples([sample(1, "main", "work")])
    thread = timeline.threads[0]
    assert [int(a) for a in thread.address] == [FUNCS["main"], FUNCS["work"]]


def test_an_offset_past_the_address_wraps_as_the_engines_wrap_it() -> None:
    """perf prints garbage offsets (map-relative, cut to 32 bits) for addresses past a
    symbol's end: the entry address computed from one can be below 0. It is kept as the
    engines keep it, two's complement in 64 bits, not refused by numpy."""
    frame = Location(0x1000, "main", 0xFFFF_F000, "prog")
    timeline = timeline_from_samples([StackSample(1, 1, 5, (frame,))])
    assert [int(a) for a in timeline.threads[0].address] == [(0x1000 - 0xFFFF_F000) % (1 << 64)]


stacks = st.lists(st.sampled_from(sorted(FUNCS)), min_size=0, max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 50), stacks), min_size=1, max_size=40))
def test_properties_nesting_and_coverage(items: list[tuple[int, int, list[str]]]) -> None:
    """Any sample sequence gives properly nested slices, and every sampled frame is
    covered, at its sample's time, by a slice of that function at that depth."""
    time_by_tid: dict[int, int] = {}
    samples = []
    for tid, gap, names in items:
        time_by_tid[tid] = time_by_tid.get(tid, 0) + gap
        samples.append(sample(time_by_tid[tid], *names, tid=tid))
    builder = SampledStackBuilder()
    builder.feed_all(samples)
    timeline = builder.finish()
    for thread in timeline.threads:
        check_nesting(thread)
    by_tid = {t.tid: list(t.slices(timeline.names)) for t in timeline.threads}
    # The last sample at a given time on a thread is the one whose stack is shown.
    last: dict[tuple[int, int], StackSample] = {(s.tid, s.time): s for s in samples}
    for (tid, time), s in last.items():
        for depth, frame in enumerate(s.frames):
            assert any(
                x.depth == depth and x.name == frame.function and x.start <= time < x.end
                for x in by_tid[tid]
            ), (tid, time, depth, frame.function)
