"""The streaming trace-segment engine in C: columnar branch batches in, finished slices out.

:class:`FastEngine` takes the events of :class:`~ptscope.reconstruct.engine.TraceSegmentEngine`
(the readable reference) and gives the same slices (differential tests run both on the golden
scripts, on random streams and on real recordings), but writes each slice as soon as it is
known and keeps only what can still change (``_native/engine.c`` explains how): its memory does not
grow with the trace. :meth:`FastEngine.take_output` hands over what was written so far as a
:class:`~ptscope.timeline.SliceBatch`; :meth:`FastEngine.finish` collects everything into a
:class:`~ptscope.timeline.Timeline` for callers that want one (tests, small traces).
The rules run in C over the columns of :class:`~ptscope.model.BranchBatch` es without a
Python object per event; this module registers locations and names with it (as integer
ids) and passes the other events in stream order. :func:`make_engine` falls back to the
Python engine when the extension was not built.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ptscope.model import (
    SYNTHETIC_SYSCALL,
    SYNTHETIC_UNTRACED,
    BranchBatch,
    BranchEvent,
    CommEvent,
    DecodeError,
    Event,
    InlineNodes,
    LocationTable,
    PowerEvent,
    StackSample,
    entry_name,
    is_unknown_code,
)
from ptscope.reconstruct.engine import (
    GOROUTINE_PARKERS,
    GOROUTINE_SWITCHERS,
    PLT_HEADERS,
    SETJMPS,
    SPECIAL_FUNCTIONS,
    STACK_SWITCHERS,
    EngineStats,
    LandingPadLookup,
    TraceSegmentEngine,
    is_plt_stub,
)
from ptscope.timeline import (
    CounterSample,
    Instant,
    SliceBatch,
    SliceFlags,
    ThreadTimeline,
    Timeline,
)

try:
    from ptscope.reconstruct import _cengine  # type: ignore[attr-defined]
except ImportError as _e:  # not built: make_engine() falls back to the Python engine
    _cengine = None
    _IMPORT_ERROR: str = str(_e)
else:
    _IMPORT_ERROR = ""

__all__ = ["TIME_AXES", "FastEngine", "is_available", "make_engine", "timeline_from_batches"]

log = logging.getLogger("ptscope")

_POWER_COUNTER: Final = "CPU frequency (MHz)"
TIME_AXES: Final = ("time", "instructions", "cycles")
"""What slice times measure: perf time (ns), or each thread's executed instructions or
cycles (its cumulative counts, spread over equal values as times are)."""
_UNEXPECTED: Final = (
    "branch from {fn} while in {fn2}",
    "branch from {fn}, which is not on the stack",
    "return to {fn}, which is not on the stack",
)


def is_available() -> bool:
    """Whether the C engine was built."""
    return _cengine is not None


def make_engine(
    *,
    keep_slots: bool = False,
    landing_pads: LandingPadLookup | None = None,
    spread_by_instructions: bool = False,
) -> FastEngine | TraceSegmentEngine:
    """The C engine when it is built, else the Python one (saying which in the log)."""
    if _cengine is not None:
        log.info("engine: C (ptscope.reconstruct._cengine)")
        return FastEngine(
            keep_slots=keep_slots,
            landing_pads=landing_pads,
            spread_by_instructions=spread_by_instructions,
        )
    log.info("engine: Python (the C engine is not built: %s)", _IMPORT_ERROR)
    return TraceSegmentEngine(
        keep_slots=keep_slots,
        landing_pads=landing_pads,
        spread_by_instructions=spread_by_instructions,
    )


def _i32(a: Any) -> npt.NDArray[np.int32]:
    return np.asarray(a, dtype=np.int32)


def _i64(a: Any) -> npt.NDArray[np.int64]:
    return np.asarray(a, dtype=np.int64)


@dataclass
class _TableSync:
    """How much of one LocationTable the C side has, and how its ids map to the engine's."""

    table: LocationTable
    synced: int = 0
    remap: npt.NDArray[np.int32] | None = None  # table id -> engine id (None: the same)
    functions: npt.NDArray[np.int32] | None = None  # table function id -> engine name id


def timeline_from_batches(
    batches: Sequence[SliceBatch],
    thread_names: dict[tuple[int, int], str],
    threads: Iterable[tuple[int, int]] = (),
) -> tuple[Timeline, dict[tuple[int, int], tuple[npt.NDArray[np.int64], ...]]]:
    """Collect streamed batches into one Timeline, as the Python engine's final pass lays it
    out: threads by (pid, tid) (``threads`` adds those that wrote nothing), slices by
    (start, depth) with depths from nesting by time, names numbered in order of first
    appearance. Also returns each thread's (start slot, end slot) columns when the batches
    carry them."""
    assert _cengine is not None
    names = batches[-1].names if batches else []

    def cat(column: str, dtype: Any) -> Any:
        parts = [getattr(b, column) for b in batches]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    pid, tid = cat("pid", np.int64), cat("tid", np.int64)
    start, end = cat("start", np.int64), cat("end", np.int64)
    name_id, address = cat("name_id", np.int32), cat("address", np.uint64)
    insns, cycles, flags = (
        cat("instructions", np.int64),
        cat("cycles", np.int64),
        cat("flags", np.uint8),
    )
    with_lines = any(b.icache_lines is not None for b in batches)
    icache = (
        np.concatenate(
            [
                b.icache_lines if b.icache_lines is not None else np.full(len(b), -1, np.int64)
                for b in batches
            ]
        )
        if with_lines
        else None
    )
    with_perf = bool(batches) and all(
        b.perf_start is not None and b.perf_end is not None for b in batches
    )
    pstart = np.concatenate([b.perf_start for b in batches]) if with_perf else None
    pend = np.concatenate([b.perf_end for b in batches]) if with_perf else None
    with_anchors = bool(batches) and all(
        b.anchor_ip is not None and b.anchor_occurrence is not None for b in batches
    )
    anchor = np.concatenate([b.anchor_ip for b in batches]) if with_anchors else None
    occurrence = np.concatenate([b.anchor_occurrence for b in batches]) if with_anchors else None
    with_slots = bool(batches) and all(b.start_slot is not None for b in batches)
    sslot = np.concatenate([b.start_slot for b in batches]) if with_slots else None
    eslot = np.concatenate([b.end_slot for b in batches]) if with_slots else None
    keys = sorted(set(threads) | set(zip(pid.tolist(), tid.tolist(), strict=True)))
    instants: dict[tuple[int, int], list[Instant]] = {}
    counters: dict[tuple[int, int], list[CounterSample]] = {}
    for b in batches:
        for p, t, inst in b.instants:
            instants.setdefault((p, t), []).append(inst)
        for p, t, sample in b.counters:
            counters.setdefault((p, t), []).append(sample)
    keys = sorted(set(keys) | set(instants) | set(counters))
    by_thread = np.lexsort((tid, pid)) if len(pid) else np.zeros(0, dtype=np.intp)
    bounds = np.flatnonzero(np.diff(pid[by_thread]) | np.diff(tid[by_thread])) + 1
    groups = np.split(by_thread, bounds) if len(by_thread) else []
    rows = {(int(pid[g[0]]), int(tid[g[0]])): g for g in groups}
    out_of: dict[int, int] = {}
    by_name: dict[str, int] = {}
    timeline = Timeline()
    slots: dict[tuple[int, int], tuple[npt.NDArray[np.int64], ...]] = {}
    for key in keys:
        g = rows.get(key, np.zeros(0, dtype=np.intp))
        order_b, depth_b = _cengine.nest_depths(
            np.ascontiguousarray(start[g]), np.ascontiguousarray(end[g])
        )
        order = g[np.frombuffer(order_b, dtype=np.int64)]
        depth = np.frombuffer(depth_b, dtype=np.int32)
        ids = name_id[order]
        for i in ids.tolist():
            if i not in out_of:  # (an inlined body's name id may share its name)
                out_of[i] = by_name.setdefault(names[i], len(by_name))
        lut = np.zeros(max(out_of, default=0) + 1, dtype=np.int32)
        lut[list(out_of)] = list(out_of.values())
        timeline.threads.append(
            ThreadTimeline(
                pid=key[0],
                tid=key[1],
                name=thread_names.get(key, ""),
                start=start[order],
                end=end[order],
                depth=depth,
                name_id=lut[ids] if len(ids) else ids,
                address=address[order],
                instructions=insns[order],
                cycles=cycles[order],
                flags=flags[order],
                instants=instants.get(key, []),
                counters=counters.get(key, []),
                icache_lines=icache[order] if icache is not None else None,
                perf_start=pstart[order] if pstart is not None else None,
                perf_end=pend[order] if pend is not None else None,
                anchor_ip=anchor[order] if anchor is not None else None,
                anchor_occurrence=occurrence[order] if occurrence is not None else None,
            )
        )
        if sslot is not None and eslot is not None:
            slots[key] = (sslot[order], eslot[order])
    timeline.names = list(by_name)
    return timeline, slots


class FastEngine:
    """:class:`~ptscope.reconstruct.engine.TraceSegmentEngine`, ingestion in C.

    Takes the same events (:meth:`feed`, :meth:`feed_all`) and, much faster, whole
    :class:`~ptscope.model.BranchBatch` es (:meth:`feed_batch`); ``keep_slots`` keeps each
    slice's start/end slot (in :attr:`slot_columns` after :meth:`finish`; for transcript
    tests). Stream with :meth:`take_output` and :meth:`close`, or call :meth:`finish` once.
    """

    def __init__(
        self,
        *,
        keep_slots: bool = False,
        max_examples: int = 5,
        landing_pads: LandingPadLookup | None = None,
        axis: str = "time",
        spread_by_instructions: bool = False,
        inline: InlineNodes | None = None,
    ) -> None:
        if _cengine is None:
            raise RuntimeError(f"the C engine is not built ({_IMPORT_ERROR})")
        if axis not in TIME_AXES:
            raise ValueError(f"time axis: one of {', '.join(TIME_AXES)}, not {axis!r}")
        self.axis = axis
        self._c = _cengine.Engine(
            max_examples, keep_slots, TIME_AXES.index(axis), spread_by_instructions
        )
        # C location ids by chunk: (first id, table, first row) in id order, to answer the
        # C side's landing-pad questions about a location it knows by id only.
        self._chunks: list[tuple[int, LocationTable, int]] = []
        self._landing_pads = landing_pads
        if landing_pads is not None:
            self._c.set_landing_pads(self._landing_ranges)
        self._keep_slots = keep_slots
        self.slot_columns: dict[tuple[int, int], tuple[npt.NDArray[np.int64], ...]] = {}
        # Engine name ids: the synthetic frames' are fixed in the C code.
        self._names: list[str] = [SYNTHETIC_UNTRACED, SYNTHETIC_SYSCALL]
        self._name_ids: dict[str, int] = {n: i for i, n in enumerate(self._names)}
        self._unknown_ids: list[int] = []  # the name ids of code without a symbol
        # Inlined bodies: each node has a name id of its own (its name may be a function's
        # too), whose slices take the node's call site as an arg.
        self._inline: InlineNodes | None = None
        self._nodes = 0  # nodes the C side holds (node 0 included)
        self._call_sites: dict[int, str] = {}
        self._tables: dict[int, _TableSync] = {}
        self._locations = 0  # locations the C side holds
        self._own_table = LocationTable()  # for events fed as objects
        self._own_table.inline = inline  # (their locations' inlined bodies: these nodes)
        self._messages: list[str] = []  # instant names, by id
        self._counter_names: list[str] = [_POWER_COUNTER]
        self._comms: dict[tuple[int, int], str] = {}
        self._orphan_errors: list[DecodeError] = []
        self._ignored = 0  # counted here, not in C (stack samples)
        self._comm_events = 0
        self._finished = False
        self._closed = False
        self._taken: list[SliceBatch] = []  # what finish() collects

    # ------------------------------------------------------------------ input

    def feed(self, event: Event | BranchBatch) -> None:
        """Consume one event of any type, or a batch."""
        self.feed_all((event,))

    def feed_all(self, events: Iterable[Event | BranchBatch]) -> None:
        """Consume a stream of events and batches (runs of events become one batch)."""
        pending: list[BranchEvent] = []
        for ev in events:
            if type(ev) is BranchEvent:
                pending.append(ev)
                continue
            if pending:
                self.feed_batch(BranchBatch.from_events(pending, self._own_table))
                pending = []
            if type(ev) is BranchBatch:
                self.feed_batch(ev)
            elif isinstance(ev, DecodeError):
                self.decode_error(ev)
            elif isinstance(ev, PowerEvent):
                self._c.counter(ev.pid, ev.tid, ev.time, 0, ev.freq_mhz)
            elif isinstance(ev, CommEvent):
                self._comm_events += 1
                self._comms[(ev.pid, ev.tid)] = ev.comm
            elif isinstance(ev, StackSample):
                self._ignored += 1
            else:
                raise TypeError(f"not an event: {ev!r}")
        if pending:
            self.feed_batch(BranchBatch.from_events(pending, self._own_table))

    def feed_batch(self, batch: BranchBatch) -> None:
        """Consume a batch of branches (the fast path)."""
        if self._finished:
            raise RuntimeError("the engine is finished")
        src, dst = self._engine_ids(batch)
        self._c.feed_batch(
            _i32(batch.pid),
            _i32(batch.tid),
            _i64(batch.time),
            np.asarray(batch.flags, dtype=np.uint32),
            src,
            dst,
            np.asarray(batch.insn_count, dtype=np.uint64),
            np.asarray(batch.cycle_count, dtype=np.uint64),
            np.asarray(batch.gap_delta, dtype=np.uint32)
            if batch.gap_delta is not None
            else np.zeros(len(batch), dtype=np.uint32),
            *(
                (
                    np.ascontiguousarray(batch.line_offsets, dtype=np.int32),
                    np.ascontiguousarray(batch.lines, dtype=np.uint64),
                )
                if batch.line_offsets is not None and batch.lines is not None
                else (None, None)
            ),
            None if batch.gap_insns is None else np.asarray(batch.gap_insns, dtype=np.uint16),
        )

    def end_segment(self) -> None:
        """Break every thread's segment here without a marker (see the Python engine)."""
        self._c.end_segment()

    def decode_error(self, err: DecodeError) -> None:
        """A decode error: an instant marker, and the thread's segment ends here."""
        message = len(self._messages)
        self._messages.append(f"[decode error: {err.message}]")
        attributed = self._c.decode_error(
            err.pid if err.pid is not None else -1,
            err.tid if err.tid is not None else -1,
            err.time is not None,
            err.time if err.time is not None else 0,
            message,
        )
        if not attributed:
            self._messages.pop()
            self._orphan_errors.append(err)

    def thread_slot_count(self, pid: int, tid: int) -> int:
        """Slots created so far for a thread (transcript tests map slots to input events)."""
        return int(self._c.slot_count(pid, tid))

    @property
    def stats(self) -> EngineStats:
        """What the engine saw (a fresh snapshot on every access)."""
        events, branches, errors, segments, stitched, roots, unexpected, ignored = self._c.stats()
        examples = []
        for what, tid, time, fn, fn2 in self._c.examples():
            text = _UNEXPECTED[what].format(
                fn=self._names[fn], fn2=self._names[fn2] if fn2 >= 0 else ""
            )
            examples.append(f"tid {tid} t={time}: {text}")
        return EngineStats(
            events=events + self._comm_events,
            branches=branches,
            decode_errors=errors,
            segments_started=segments,
            stitched=stitched,
            roots_inferred=roots,
            unexpected=unexpected,
            ignored=ignored + self._ignored,
            unexpected_examples=examples,
        )

    # -------------------------------------------------------------- locations

    def _engine_ids(self, batch: BranchBatch) -> tuple[npt.NDArray[np.int32], ...]:
        """The batch's location ids as the C side numbers them (registering new ones)."""
        table = batch.locations
        sync = self._tables.get(id(table))
        if sync is None:
            sync = self._tables[id(table)] = _TableSync(table)
            if len(self._tables) > 1:
                for other in self._tables.values():
                    if other.remap is None:  # it was the only table: ids were the same
                        other.remap = np.arange(other.synced, dtype=np.int32)
                sync.remap = np.zeros(0, dtype=np.int32)
        if len(table) > sync.synced:
            self._sync(sync)
        src, dst = _i32(batch.src), _i32(batch.dst)
        if sync.remap is None:
            return src, dst  # the C side checks the ids
        if len(src) and (
            min(int(src.min()), int(dst.min())) < 0
            or max(int(src.max()), int(dst.max())) >= sync.synced
        ):
            raise ValueError("a branch batch names a location that is not in its table")
        return sync.remap[src], sync.remap[dst]

    def _sync(self, sync: _TableSync) -> None:
        table = sync.table
        first, end = sync.synced, len(table)
        if table.inline is not None:
            # Before this batch's functions: the names' ids (and so the trace's bytes) do
            # not depend on where batches were cut (a read-ahead cuts them elsewhere).
            self._sync_inline(table.inline)
        functions = table.functions
        known = 0 if sync.functions is None else len(sync.functions)
        if len(functions) > known:
            new = []
            for name in functions[known:]:
                fresh = name not in self._name_ids
                i = self._intern(name)
                new.append(i)
                if fresh and (name in SPECIAL_FUNCTIONS or is_plt_stub(name)):
                    flags = (
                        (name in STACK_SWITCHERS)
                        | (name in SETJMPS) << 1
                        | (name in GOROUTINE_SWITCHERS) << 2
                        | (name in GOROUTINE_PARKERS) << 3
                        | (name in PLT_HEADERS) << 4
                        | is_plt_stub(name) << 5
                    )
                    self._c.mark_function(i, flags)
            added = np.array(new, dtype=np.int32)
            sync.functions = (
                added if sync.functions is None else np.concatenate([sync.functions, added])
            )
        assert sync.functions is not None
        fn_ids = sync.functions[np.array(table.function_ids[first:end], dtype=np.int32)]
        self._c.add_locations(
            fn_ids,
            np.array(table.entries[first:end], dtype=np.int64),
            np.array(table.offsets[first:end], dtype=np.int64),
            np.array(table.ips[first:end], dtype=np.uint64),
        )
        if table.inline is not None:
            nodes = np.array(table.inline_nodes[first:end], dtype=np.int32)
            if nodes.any():  # (their nodes were synced above)
                self._c.set_location_nodes(self._locations, nodes)
        self._chunks.append((self._locations, table, first))
        if sync.remap is not None:
            ids = np.arange(self._locations, self._locations + end - first, dtype=np.int32)
            sync.remap = np.concatenate([sync.remap, ids])
        self._locations += end - first
        sync.synced = end

    def inline_nodes(self, nodes: InlineNodes | None = None) -> InlineNodes:
        """The inlined bodies that events fed as objects may name (``Location.inline``):
        ``nodes`` (those the decode's batches name too: one numbering per engine), or made
        on first use."""
        if self._own_table.inline is None:
            self._own_table.inline = nodes if nodes is not None else InlineNodes()
        return self._own_table.inline

    def _sync_inline(self, inline: InlineNodes) -> None:
        """The inlined bodies the C side does not have yet (one node table per engine)."""
        if self._inline is None:
            self._inline = inline
        elif self._inline is not inline:
            raise ValueError("one engine takes the inlined bodies of one decode")
        if len(inline) <= self._nodes:
            return
        first = max(self._nodes, 1)
        names = []
        for k in range(first, len(inline)):
            i = len(self._names)
            self._names.append(inline.names[k])
            self._call_sites[i] = inline.call_sites[k]
            names.append(i)
        parents = np.array(inline.parents[first:], dtype=np.int32)
        self._nodes = self._c.add_inline_nodes(parents, np.array(names, dtype=np.int32))

    def _intern(self, name: str) -> int:
        """The engine name id of ``name``, a new one (the last) if it had none."""
        i = self._name_ids.setdefault(name, len(self._names))
        if i == len(self._names):
            self._names.append(name)
            if is_unknown_code(name):
                self._unknown_ids.append(i)
        return i

    def _landing_ranges(self, location: int) -> Sequence[tuple[int, int]]:
        assert self._landing_pads is not None
        k = bisect.bisect_right(self._chunks, location, key=lambda c: c[0]) - 1
        first, table, row = self._chunks[k]
        loc = table[row + location - first]
        return self._landing_pads(loc.dso, loc.ip)

    # ------------------------------------------------------------- output

    @property
    def names(self) -> list[str]:
        """The engine's name table (a SliceBatch's ``name_id`` indexes it; it only grows)."""
        return self._names

    def pending(self) -> int:
        """Slices (and instants, counters) written and not yet taken."""
        return int(self._c.pending())

    def first_time(self) -> int | None:
        """The earliest time any slice can start (None before the first event)."""
        value = self._c.first_time()
        return None if value is None else int(value)

    def memory(self) -> dict[str, int]:
        """What the engine holds now (live frames, the slot window, held spines...)."""
        return dict(self._c.memory())

    def take_output(self) -> SliceBatch:
        """Everything written since the last call (slices in the order they finished)."""
        slices, instants, counters = self._c.take_output()
        cols = [np.frombuffer(b, dtype=np.int64) for b in slices]
        pid, tid, start, end, name, addr, insns, cycles, flags, sslot, eslot, pstart, pend = cols[
            :13
        ]
        icache, anchor, occurrence = cols[13:16]
        inst = [np.frombuffer(b, dtype=np.int64).tolist() for b in instants]
        ctrs = [np.frombuffer(b, dtype=np.int64).tolist() for b in counters]
        return SliceBatch(
            names=self._names,
            call_sites=self._call_sites or None,
            pid=pid,
            tid=tid,
            start=start,
            end=end,
            name_id=self._named_by_entry(name.astype(np.int32), addr, flags),
            address=addr.view(np.uint64),
            instructions=insns,
            cycles=cycles,
            flags=flags.astype(np.uint8),
            start_slot=sslot if self._keep_slots else None,
            end_slot=eslot if self._keep_slots else None,
            perf_start=pstart,
            perf_end=pend,
            anchor_ip=anchor.view(np.uint64),
            anchor_occurrence=occurrence,
            icache_lines=icache if self._c.lines_on() else None,
            instants=[
                (p, t, Instant(time, self._messages[m]))
                for p, t, time, m in zip(*inst, strict=True)
            ],
            counters=[
                (p, t, CounterSample(time, self._counter_names[k], v))
                for p, t, time, k, v in zip(*ctrs, strict=True)
            ],
        )

    def _named_by_entry(
        self, name_id: npt.NDArray[np.int32], address: npt.NDArray[Any], flags: npt.NDArray[Any]
    ) -> npt.NDArray[np.int32]:
        """``name_id`` with each slice of code without a symbol named after the address it
        began at (:func:`~ptscope.model.entry_name`), unless its start was inferred (then
        that address is not an entry)."""
        if not self._unknown_ids or not len(name_id):
            return name_id
        rows = np.flatnonzero(
            np.isin(name_id, self._unknown_ids) & ((flags & int(SliceFlags.INFERRED_START)) == 0)
        )
        if not len(rows):
            return name_id
        for unknown in np.unique(name_id[rows]).tolist():
            at = rows[name_id[rows] == unknown]
            entries, which = np.unique(address[at], return_inverse=True)
            function = self._names[unknown]
            ids = [self._intern(entry_name(function, e)) for e in entries.tolist()]
            name_id[at] = np.array(ids, dtype=np.int32)[which]
        return name_id

    def close(self) -> SliceBatch:
        """The end of the input: close every open frame; the rest of the output."""
        if self._closed:
            raise RuntimeError("the engine is already closed")
        self._closed = True
        self._c.close_all()
        return self.take_output()

    def thread_names(self) -> dict[tuple[int, int], str]:
        """Thread names seen in the stream (comm events), by (pid, tid)."""
        return dict(self._comms)

    def finish(self) -> Timeline:
        """Close what is still open and return the whole trace (call once; for callers
        that want one Timeline rather than a stream)."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        batches = (
            [*self._taken, self.take_output()]
            if self._closed
            else [*self._taken, self.take_output(), self.close()]
        )
        timeline, slots = timeline_from_batches(batches, self._comms, self._c.thread_keys())
        self.slot_columns = slots
        return timeline

    # ------------------------------------------------------------ checks

    def orphan_errors(self) -> list[DecodeError]:
        """Decode errors that could not be attributed to any thread."""
        return list(self._orphan_errors)

    def self_check(self, timeline: Timeline) -> None:
        """Verify the invariants of a finished trace (see the Python engine's): every
        slice nests, and the engine holds nothing any more."""
        if not self._finished:
            raise RuntimeError("self_check() needs finish() first")
        held = self.memory()
        for what in ("live_frames", "window_slots", "waiters", "held_frames"):
            if held[what]:
                raise AssertionError(f"the engine still holds {held[what]} {what}")
        TraceSegmentEngine.check_timeline(timeline)
