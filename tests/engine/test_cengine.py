"""The C engine (FastEngine) against the Python reference engine: same input, same output.

Every golden script, random event streams (the property tests' strategies, plus
transactions, power events, thread names, several processes, kernel addresses and
assembly labels) cut into batches at random places, and bad input that must raise
instead of crashing.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import test_properties as props  # tests/ is on sys.path
from ptscope.model import (
    NOWHERE,
    BranchBatch,
    BranchEvent,
    BranchKind,
    CommEvent,
    DecodeError,
    Event,
    InlineNodes,
    Location,
    LocationTable,
    PowerEvent,
    StackSample,
    TraceState,
    branch_flags,
    classify_flags,
)
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.engine import LandingPadLookup, TraceSegmentEngine
from ptscope.reconstruct.fast_engine import FastEngine, make_engine
from ptscope.timeline import Timeline
from support.engine_diff import assert_same, check_outcome, to_items
from support.event_script import parse_script

pytestmark = pytest.mark.skipif(not fast_engine.is_available(), reason="the C engine is not built")

GOLDENS = sorted((Path(__file__).parent / "golden").glob("*.golden"))

Item = Event | BranchBatch
Engine = TraceSegmentEngine | FastEngine


# --------------------------------------------------------------------- helpers


def both(
    events: Sequence[Event],
    cuts: random.Random | None = None,
    pads: LandingPadLookup | None = None,
    inline: InlineNodes | None = None,
) -> None:
    """Events through the Python engine, their batches through the C engine: identical."""
    a = TraceSegmentEngine(keep_slots=True, landing_pads=pads, inline=inline)
    a.feed_all(events)
    ta = a.finish()
    b = FastEngine(keep_slots=True, landing_pads=pads)
    table = LocationTable()
    table.inline = inline
    b.feed_all(to_items(events, table=table, cuts=cuts))
    tb = b.finish()
    assert_same(a, ta, b, tb)
    assert check_outcome(a, ta) == check_outcome(b, tb)


# --------------------------------------------------------------------- goldens


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_golden_scripts_give_identical_traces(path: Path) -> None:
    script = parse_script(path.read_text())
    both(script.events, pads=script.landing_pads, inline=script.inline)
    both(
        script.events,
        cuts=random.Random(path.stem),
        pads=script.landing_pads,
        inline=script.inline,
    )


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_golden_scripts_event_by_event(path: Path) -> None:
    """One event at a time (as the transcript renderer feeds): same slots after each."""
    script = parse_script(path.read_text())
    events = script.events
    a = TraceSegmentEngine(keep_slots=True, landing_pads=script.landing_pads, inline=script.inline)
    b = FastEngine(keep_slots=True, landing_pads=script.landing_pads, inline=script.inline)
    for event in events:
        a.feed(event)
        b.feed(event)
        for pid, tid in {(getattr(e, "pid", 1) or 1, getattr(e, "tid", 1) or 1) for e in events}:
            assert a.thread_slot_count(pid, tid) == b.thread_slot_count(pid, tid)
    ta, tb = a.finish(), b.finish()
    assert_same(a, ta, b, tb)


# -------------------------------------------------------------- random streams

FUNCS = ["main", "f", "g", "f.cold", "puts@plt", "puts", "[unknown]", "ksys_write"]
FUNCS += ["__swapcontext", "_setjmp", "gogo", "runtime.mcall"]  # the special functions


def loc(fn: str, off: int) -> Location:
    if fn == "ksys_write":  # a kernel address (above 2**63)
        return Location(0xFFFFFFFF81000000 + off, fn, off, "[kernel.kallsyms]")
    if fn == "[unknown]":
        return Location(0x7F0000001000 + off, fn, -1, "libx.so")
    base = 0x400000 + 0x1000 * FUNCS.index(fn)
    return Location(base + off, fn, off, "prog")


KINDS = [
    (k, s)
    for k in BranchKind
    for s in TraceState
    if k != BranchKind.INLINE or s == TraceState.NONE  # (no state: not a branch)
]
OFFSETS = [0, 0x3, 0x8, 0x20]


class _Choices:
    """Choices read off one integer (one hypothesis draw per event keeps generation fast)."""

    def __init__(self, x: int) -> None:
        self.x = x

    def pick(self, options: Sequence[object]) -> Any:
        self.x, k = divmod(self.x, len(options))
        return options[k]

    def below(self, n: int) -> int:
        self.x, k = divmod(self.x, n)
        return k


def _event(x: int, time: int) -> Event:
    c = _Choices(x)
    pid, tid = c.pick([(1, 1), (1, 2), (7, 7)])
    what = c.below(40)
    if what == 0:
        t = c.pick([None, time])
        return DecodeError(c.pick([pid, None, -1]), c.pick([tid, None, -1]), t, None, "lost")
    if what == 1:
        return PowerEvent(pid, tid, time, 20, c.pick([2000, 3000]))
    if what == 2:
        return CommEvent(pid, tid, time, f"t{tid}")
    if what == 3:
        return StackSample(pid, tid, time, ())
    kind, state = c.pick(KINDS if c.below(4) else KINDS[:12])  # calls/returns more often
    src = NOWHERE if state == TraceState.START else loc(c.pick(FUNCS), c.pick(OFFSETS))
    dst = NOWHERE if state == TraceState.END else loc(c.pick(FUNCS), c.pick(OFFSETS))
    if c.below(6) == 0 and src is not NOWHERE:
        # A target right after the source: `call next` or an assembly label.
        dst = Location(src.ip + 1 + c.below(16), c.pick(FUNCS), 0, "prog")
    in_tx = c.below(10) == 0
    return BranchEvent(
        pid,
        tid,
        time,
        kind,
        state,
        src,
        dst,
        in_tx,
        c.pick([0, 0, 3, 100]),
        c.pick([0, 7]),
        # code lines (instruction detail): few values, so that unions overlap
        lines=c.pick([None, (), (1,), (2, 3), (1, 5, 9), (64,), (3,)]),
    )


@st.composite
def events_(draw: st.DrawFn) -> list[Event]:
    codes = draw(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2**40)), max_size=100))
    time = 1000
    events: list[Event] = []
    for step, x in codes:
        time += [0, 0, 1, 5, 100, -3][step]
        events.append(_event(x, time))
    return events


@settings(max_examples=300, deadline=None)
@given(events_(), st.integers(0, 2**32))
def test_random_streams_give_identical_traces(events: list[Event], seed: int) -> None:
    both(events, cuts=random.Random(seed))


@settings(max_examples=100, deadline=None)
@given(events_(), st.lists(st.integers(0, 100), max_size=3))
def test_segment_breaks_give_identical_traces(events: list[Event], breaks: list[int]) -> None:
    a = TraceSegmentEngine()
    b = FastEngine()
    items = to_items(events)
    for k, item in enumerate(items):
        if k in breaks:
            a.end_segment()
            b.end_segment()
        a.feed(item)
        b.feed(item)
    ta, tb = a.finish(), b.finish()
    assert_same(a, ta, b, tb)


def _broken(items: Sequence[Event | None]) -> list[tuple[str, int, int, int]]:
    """Events through both engines, ``None`` a segment break: the same trace, returned as
    thread 1's slices (name, start, end, depth)."""
    a = TraceSegmentEngine(keep_slots=True)
    b = FastEngine(keep_slots=True)
    for item in items:
        if item is None:
            a.end_segment()
            b.end_segment()
        else:
            a.feed(item)
            b.feed(item)
    ta, tb = a.finish(), b.finish()
    assert_same(a, ta, b, tb)
    assert check_outcome(a, ta) == check_outcome(b, tb) == ""
    t = next(t for t in ta.threads if (t.pid, t.tid) == (1, 1))
    return list(
        zip(
            [ta.names[i] for i in t.name_id.tolist()],
            t.start.tolist(),
            t.end.tolist(),
            t.depth.tolist(),
            strict=True,
        )
    )


def test_a_break_leaves_a_thread_without_open_frames_as_it_is() -> None:
    """Found by hypothesis: the thread's only branch before the break waits in a
    transaction, so no frame is open at the break. The function it finds once committed
    was running since the thread's first event, break or not; it used to start at the
    break, empty (the break takes no time), and the C engine nested that empty slice in
    the next segment's first frame, which starts at the same ns."""
    main, after = Location(0x400000, "main", 0, "prog"), Location(0x400001, "main", 0, "prog")
    events: list[Event | None] = [
        BranchEvent(1, 1, 1000, BranchKind.SYSRET, TraceState.NONE, main, after, True),
        DecodeError(1, 2, None, None, "lost"),
        BranchEvent(1, 1, 1000, BranchKind.JUMP, TraceState.END, loc("ksys_write", 0x20), NOWHERE),
    ]
    unbroken = _broken(events)
    assert unbroken == [
        ("main", 1000, 1001, 0),
        ("ksys_write", 1001, 1003, 0),
        ("[untraced]", 1002, 1003, 1),
    ]
    assert _broken([events[0], None, *events[1:]]) == unbroken


def test_a_segment_found_after_a_break_starts_at_its_first_frame() -> None:
    """A break takes no time. When what follows continues no older stack, its segment
    starts at its first frame, which lasts at least 1 ns as any segment start does: never
    an empty slice at the break, which a viewer would nest in whatever starts next."""
    call, jump, none = BranchKind.CALL, BranchKind.JUMP, TraceState.NONE
    events: list[Event | None] = [
        BranchEvent(1, 1, 1000, call, none, loc("main", 3), loc("f", 0)),
        None,
        BranchEvent(1, 1, 1000, jump, none, loc("g", 3), loc("g", 8)),  # g: on no stack
        BranchEvent(1, 1, 1000, jump, TraceState.START, NOWHERE, loc("puts", 8)),
    ]
    before = [("main", 1000, 1002, 0), ("f", 1001, 1002, 1)]
    assert _broken(events[:3]) == [*before, ("g", 1002, 1003, 0)]
    assert _broken(events) == [*before, ("g", 1002, 1003, 0), ("puts", 1003, 1004, 0)]


@settings(max_examples=100, deadline=None)
@given(props.random_streams(), props.programs(), st.integers(0, 2**32))
def test_property_test_strategies_too(
    events: list[Event], program: tuple[list[Event], object], seed: int
) -> None:
    """The Python engine's own property-test streams."""
    both(events, cuts=random.Random(seed))
    both(program[0], cuts=random.Random(seed))


# ------------------------------------------------------------------- batches


def test_batch_events_round_trip() -> None:
    table = LocationTable()
    events = [
        BranchEvent(1, 2, 10, BranchKind.CALL, TraceState.NONE, loc("main", 8), loc("f", 0)),
        BranchEvent(1, 2, 11, BranchKind.NONE, TraceState.START, NOWHERE, loc("f", 3)),
        BranchEvent(1, 3, 12, BranchKind.RETURN, TraceState.END, loc("f", 8), NOWHERE, True, 5, 9),
        BranchEvent(1, 2, 13, BranchKind.JUMP, TraceState.NONE, loc("f", 8), loc("f", 3)),
    ]
    batch = BranchBatch.from_events(events, table)
    assert list(batch.events()) == events
    assert len(table) == 5  # equal locations share an id
    # One shared object per distinct location.
    assert [e.dst for e in batch.events()][3] is [e.dst for e in batch.events()][1]
    assert table.functions == ["main", "f", "[unknown]"]


def test_branch_flags_inverts_classify_flags() -> None:
    for kind in BranchKind:
        for state in TraceState:
            if kind == BranchKind.INLINE and state != TraceState.NONE:
                continue  # not a branch: no trace state
            for in_tx in (False, True):
                flags = branch_flags(kind, state, in_tx)
                assert classify_flags(flags) == (kind, state)


def test_c_classification_equals_classify_flags() -> None:
    """Every value of the 15 bits classify_flags reads, and perf's higher bits ignored."""
    assert fast_engine._cengine is not None
    classify = fast_engine._cengine.classify
    for flags in range(1 << 15):
        assert classify(flags) == classify_flags(flags), hex(flags)
    rnd = random.Random(1)
    for _ in range(2000):
        flags = rnd.getrandbits(32)
        assert classify(flags) == classify_flags(flags), hex(flags)


def test_strided_columns_are_read_in_place() -> None:
    """Columns may be views into a record array (what the stream reader hands over)."""
    table = LocationTable()
    src, dst = table.add(loc("main", 8)), table.add(loc("f", 0))
    recs = np.zeros(
        3,
        dtype=[("pid", "<i4"), ("tid", "<i4"), ("time", "<i8"), ("flags", "<u4"), ("x", "u1")],
    )
    recs["pid"] = recs["tid"] = 1
    recs["time"] = [5, 6, 7]
    call = branch_flags(BranchKind.CALL, TraceState.NONE)
    recs["flags"] = [call, branch_flags(BranchKind.RETURN, TraceState.NONE), call]
    ids = np.array([src, dst, src], dtype=np.int32)
    batch = BranchBatch(
        table,
        recs["pid"],
        recs["tid"],
        recs["time"],
        recs["flags"],
        ids,
        ids[[1, 0, 1]],
        np.zeros(3, np.uint64),
        np.zeros(3, np.uint64),
    )
    a, b = TraceSegmentEngine(), FastEngine()
    a.feed(batch)  # the Python engine takes batches too (one event at a time)
    b.feed_batch(batch)
    assert_same(a, a.finish(), b, b.finish())


def test_batches_of_several_tables() -> None:
    events = parse_script((GOLDENS[0]).read_text()).events
    half = len(events) // 2
    a = TraceSegmentEngine()
    a.feed_all(events)
    b = FastEngine()
    b.feed_all(to_items(events[:half], LocationTable()))
    b.feed_all(to_items(events[half:], LocationTable()))
    assert_same(a, a.finish(), b, b.finish())


# ----------------------------------------------------------------- bad input


def _batch(table: LocationTable, **columns: object) -> BranchBatch:
    a = table.add(loc("main", 8))
    b = table.add(loc("f", 0))
    base: dict[str, object] = {
        "pid": [1],
        "tid": [1],
        "time": [10],
        "flags": [branch_flags(BranchKind.CALL, TraceState.NONE)],
        "src": [a],
        "dst": [b],
        "insn_count": [0],
        "cycle_count": [0],
    }
    base.update(columns)
    types = [np.int32, np.int32, np.int64, np.uint32, np.int32, np.int32, np.uint64, np.uint64]
    return BranchBatch(
        table, *(np.array(v, dtype=t) for v, t in zip(base.values(), types, strict=True))
    )


@pytest.mark.parametrize("ids", [{"src": [99]}, {"dst": [-1]}, {"src": [2**31 - 1]}])
def test_unknown_location_ids_raise(ids: dict[str, list[int]]) -> None:
    engine = FastEngine()
    with pytest.raises(ValueError, match="location"):
        engine.feed_batch(_batch(LocationTable(), **ids))
    engine.feed_batch(_batch(LocationTable()))  # refused before anything changed
    assert engine.finish().slice_count() == 2


def test_unknown_location_ids_raise_with_several_tables() -> None:
    engine = FastEngine()
    engine.feed_batch(_batch(LocationTable()))
    with pytest.raises(ValueError, match="location"):
        engine.feed_batch(_batch(LocationTable(), dst=[2]))


def test_out_of_range_times_raise_as_in_the_python_engine() -> None:
    for engine in (TraceSegmentEngine(), FastEngine()):
        with pytest.raises(OverflowError):
            engine.feed(_batch(LocationTable(), time=[2**62]))


@pytest.mark.parametrize(
    ("time", "refused"),
    [(2**61 - 1, False), (2**61, True), (-(2**61) + 1, False), (-(2**61), True), (-1, False)],
)
@pytest.mark.parametrize("strided", [False, True])
def test_times_at_the_limits(time: int, refused: bool, strided: bool) -> None:
    """The edges of the range the engine takes (model.TIME_LIMIT, exclusive, either way),
    in contiguous columns (checked in one pass) and in strided ones (row by row)."""
    batch = _batch(LocationTable(), time=[time])
    if strided:
        batch.time = np.repeat(batch.time, 2)[::2]
        batch.src = np.repeat(batch.src, 2)[::2]
    engine = FastEngine()
    if refused:
        with pytest.raises(OverflowError):
            engine.feed_batch(batch)
    else:
        engine.feed_batch(batch)


@pytest.mark.parametrize("strided", [False, True])
def test_the_last_location_id_is_taken_and_the_next_refused(strided: bool) -> None:
    table = LocationTable()
    _batch(table)  # its two locations, the table's only ones
    for dst, refused in ((len(table) - 1, False), (len(table), True)):
        batch = _batch(table, dst=[dst])
        if strided:
            batch.dst = np.repeat(batch.dst, 2)[::2]
        engine = FastEngine()
        if refused:
            with pytest.raises(ValueError, match="location"):
                engine.feed_batch(batch)
        else:
            engine.feed_batch(batch)


def test_overflowing_counts_raise_and_the_engine_refuses_more() -> None:
    engine = FastEngine()
    with pytest.raises(OverflowError):
        engine.feed_batch(_batch(LocationTable(), insn_count=[2**64 - 1]))
    with pytest.raises(RuntimeError, match="failed earlier"):
        engine.feed_batch(_batch(LocationTable()))


def test_garbage_flags_negative_ids_and_backwards_time() -> None:
    rnd = random.Random(7)
    n = 5000
    table = LocationTable()
    locs = [table.add(loc(f, o)) for f in FUNCS for o in OFFSETS] + [table.add(NOWHERE)]
    batch = BranchBatch(
        table,
        np.array([rnd.choice([-1, 0, 1, 2**31 - 1]) for _ in range(n)], dtype=np.int32),
        np.array([rnd.choice([-1, 1, 5]) for _ in range(n)], dtype=np.int32),
        np.array([rnd.randint(-(2**40), 2**40) for _ in range(n)], dtype=np.int64),
        np.array([rnd.getrandbits(32) for _ in range(n)], dtype=np.uint32),
        np.array([rnd.choice(locs) for _ in range(n)], dtype=np.int32),
        np.array([rnd.choice(locs) for _ in range(n)], dtype=np.int32),
        np.array([rnd.choice([0, 1, 2**40]) for _ in range(n)], dtype=np.uint64),
        np.array([rnd.choice([0, 3]) for _ in range(n)], dtype=np.uint64),
    )
    a = TraceSegmentEngine(keep_slots=True)
    a.feed(batch)
    b = FastEngine(keep_slots=True)
    b.feed(batch)
    ta, tb = a.finish(), b.finish()
    assert_same(a, ta, b, tb)
    assert check_outcome(a, ta) == check_outcome(b, tb)


def test_deep_recursion() -> None:
    """100k nested calls, then the returns: no recursion limit in the C engine."""
    depth = 100_000
    f = loc("f", 0)
    site = loc("f", 8)
    ret = loc("f", 13)
    call, back = (
        branch_flags(BranchKind.CALL, TraceState.NONE),
        branch_flags(BranchKind.RETURN, TraceState.NONE),
    )
    table = LocationTable()
    ids = [table.add(x) for x in (f, site, ret)]
    n = 2 * depth
    flags = np.array([call] * depth + [back] * depth, dtype=np.uint32)
    src = np.array([ids[1]] * depth + [ids[2]] * depth, dtype=np.int32)
    dst = np.array([ids[0]] * depth + [ids[2]] * depth, dtype=np.int32)
    ones = np.ones(n, dtype=np.int32)
    batch = BranchBatch(
        table,
        ones,
        ones,
        np.arange(n, dtype=np.int64),
        flags,
        src,
        dst,
        np.zeros(n, np.uint64),
        np.zeros(n, np.uint64),
    )
    engine = FastEngine()
    engine.feed_batch(batch)
    timeline = engine.finish()
    engine.self_check(timeline)
    (thread,) = timeline.threads
    assert len(thread) == depth + 1
    assert int(thread.depth.max()) == depth


def test_lifecycle_errors() -> None:
    engine = FastEngine()
    with pytest.raises(RuntimeError):
        engine.self_check(Timeline())
    engine.finish()
    with pytest.raises(RuntimeError):
        engine.finish()
    with pytest.raises(RuntimeError):
        engine.feed_batch(_batch(LocationTable()))
    with pytest.raises(TypeError):
        FastEngine().feed("not an event")  # type: ignore[arg-type]


def test_make_engine(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ptscope")
    assert isinstance(make_engine(), FastEngine)
    assert "engine: C" in caplog.text
    monkeypatch.setattr(fast_engine, "_cengine", None)
    assert type(make_engine()) is TraceSegmentEngine
    assert "engine: Python" in caplog.text


def test_instruction_length_boundaries() -> None:
    """`call next` and assembly-label returns at 14, 15 and 16 bytes from the call."""
    events: list[Event] = []
    time = 100
    site = loc("main", 0x40)
    for distance in (14, 15, 16):
        after = Location(site.ip + distance, "main", 0x40 + distance, "prog")
        label = Location(site.ip + distance, "label", 0, "prog")
        events += [
            BranchEvent(1, 1, time, BranchKind.CALL, TraceState.NONE, site, after),
            BranchEvent(1, 1, time + 1, BranchKind.CALL, TraceState.NONE, site, loc("g", 0)),
            BranchEvent(1, 1, time + 2, BranchKind.RETURN, TraceState.NONE, loc("g", 8), label),
            BranchEvent(1, 1, time + 3, BranchKind.JUMP, TraceState.NONE, label, site),
        ]
        time += 10
    both(events)


# ------------------------------------------------------------------ final pass


def test_calls_into_code_without_a_symbol_are_named_by_their_entry() -> None:
    """Both engines name such a call after its target, a kernel address shown unsigned,
    and a frame whose call was never seen (its start inferred) after its file only."""
    kernel = 0xFFFFFFFF81234000

    def unknown(ip: int, dso: str) -> Location:
        return Location(ip, "[unknown]", -1, dso)

    call, ret, none = BranchKind.CALL, BranchKind.RETURN, TraceState.NONE
    events: list[Event] = [
        BranchEvent(5, 5, 10, call, none, unknown(0x401010, "prog"), unknown(0x401200, "prog")),
        BranchEvent(5, 5, 11, call, none, unknown(0x401210, "prog"), unknown(kernel, "[k]")),
        BranchEvent(5, 5, 12, ret, none, unknown(kernel + 8, "[k]"), unknown(0x401215, "prog")),
        BranchEvent(5, 5, 13, ret, none, unknown(0x401220, "prog"), unknown(0x401015, "prog")),
        BranchEvent(5, 5, 14, ret, none, unknown(0x401030, "prog"), loc("main", 13)),
    ]
    a = TraceSegmentEngine()
    a.feed_all(events)
    b = FastEngine()
    b.feed_all(to_items(events))
    ta, tb = a.finish(), b.finish()
    assert_same(a, ta, b, tb)
    [thread] = tb.threads
    assert [tb.names[i] for i in thread.name_id] == [
        "main",
        "[unknown] (prog)",
        "[unknown @ 0x401200 (prog)]",
        "[unknown @ 0xffffffff81234000 ([k])]",
    ]


def test_perf_maps_name_jit_code_in_batches_too() -> None:
    """JIT code is named from perf maps in batches exactly as in events."""
    from ptscope.decode.perf_map import MapResolver, PerfMap

    jit = PerfMap.parse("7f0000001000 40 jitted_a\n7f0000001040 40 jitted_b\n")

    def unknown(ip: int) -> Location:
        return Location(ip, "[unknown]", -1, "[anon]")

    def script() -> list[Event]:
        call, ret = BranchKind.CALL, BranchKind.RETURN
        none = TraceState.NONE
        return [
            BranchEvent(5, 5, 10, call, none, loc("main", 8), unknown(0x7F0000001000)),
            BranchEvent(5, 5, 11, call, none, unknown(0x7F0000001010), unknown(0x7F0000001040)),
            BranchEvent(6, 6, 12, call, none, loc("main", 8), unknown(0x7F0000001040)),
            BranchEvent(5, 5, 13, ret, none, unknown(0x7F0000001050), unknown(0x7F0000001015)),
            BranchEvent(5, 5, 14, ret, none, unknown(0x7F0000001020), loc("main", 13)),
        ]

    maps = {5: jit}
    a = TraceSegmentEngine()
    a.feed_all(MapResolver(maps).events(script()))
    b = FastEngine()
    b.feed_all(MapResolver(maps).columnar(to_items(script())))
    ta, tb = a.finish(), b.finish()
    assert_same(a, ta, b, tb)
    # pid 6 has no map: its call lands in code without a symbol, named by its address.
    assert {"jitted_a", "jitted_b", "[unknown @ 0x7f0000001040 ([anon])]"} <= set(tb.names)
