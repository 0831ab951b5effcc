"""The trace-segment engine with its ingestion in C: columnar branch batches in, a Timeline out.

:class:`FastEngine` has the public API of :class:`~ptscope.reconstruct.engine.TraceSegmentEngine`
and gives identical results (differential tests run both on the golden scripts, on random
streams and on real recordings). The stack rules run in ``_cengine.c``, a rule-for-rule port
of ``engine.py``, over the columns of :class:`~ptscope.model.BranchBatch` es without a Python
object per event; this module registers locations and names with it (as integer ids), passes
the other events in stream order and runs the shared final pass
(:func:`~ptscope.reconstruct.engine.build_thread_timeline`). :func:`make_engine` falls back to
the Python engine when the extension was not built.
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
    LocationTable,
    PowerEvent,
    StackSample,
)
from ptscope.reconstruct.engine import (
    SETJMPS,
    SPECIAL_RETURNS,
    STACK_SWITCHERS,
    EngineStats,
    LandingPadLookup,
    TraceSegmentEngine,
    build_thread_timeline,
)
from ptscope.timeline import CounterSample, Instant, ThreadTimeline, Timeline

try:
    from ptscope.reconstruct import _cengine  # type: ignore[attr-defined]
except ImportError as _e:  # not built: make_engine() falls back to the Python engine
    _cengine = None
    _IMPORT_ERROR: str = str(_e)
else:
    _IMPORT_ERROR = ""

__all__ = ["FastEngine", "is_available", "make_engine"]

log = logging.getLogger("ptscope")

_FIELDS: Final = 6
_NAME_SHIFT: Final = 16  # a frame's name id sits above its flags (see _cengine.c)
_POWER_COUNTER: Final = "CPU frequency (MHz)"
_UNEXPECTED: Final = (
    "branch from {fn} while in {fn2}",
    "branch from {fn}, which is not on the stack",
    "return to {fn}, which is not on the stack",
)


def is_available() -> bool:
    """Whether the C engine was built."""
    return _cengine is not None


def make_engine(
    *, keep_slots: bool = False, landing_pads: LandingPadLookup | None = None
) -> FastEngine | TraceSegmentEngine:
    """The C engine when it is built, else the Python one (saying which in the log)."""
    if _cengine is not None:
        log.info("engine: C (ptscope.reconstruct._cengine)")
        return FastEngine(keep_slots=keep_slots, landing_pads=landing_pads)
    log.info("engine: Python (the C engine is not built: %s)", _IMPORT_ERROR)
    return TraceSegmentEngine(keep_slots=keep_slots, landing_pads=landing_pads)


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


@dataclass
class ThreadArrays:
    """One thread's closed history, as the shared final pass takes it (see
    :func:`~ptscope.reconstruct.engine.build_thread_timeline`)."""

    fd: npt.NDArray[np.int64]
    log: npt.NDArray[np.int64]
    update_slots: npt.NDArray[np.int64]
    insn_counts: npt.NDArray[np.int64]
    cycle_counts: npt.NDArray[np.int64]
    name_ids: npt.NDArray[np.int32]
    depths: npt.NDArray[np.int32]


ThreadResult = tuple[ThreadTimeline, npt.NDArray[np.int64] | None, npt.NDArray[np.int64] | None]


def numpy_thread_timeline(
    pid: int,
    tid: int,
    name: str,
    a: ThreadArrays,
    instants: list[tuple[int, str]],
    counters: list[tuple[int, str, int]],
    keep_slots: bool,
) -> ThreadResult:
    """The shared final pass (numpy, the reference) over one thread's arrays."""
    thread, start_slots, end_slots = build_thread_timeline(
        pid=pid,
        tid=tid,
        name=name,
        fd=a.fd,
        name_ids=a.name_ids,
        log=a.log,
        update_slots=a.update_slots,
        insn_counts=a.insn_counts,
        cycle_counts=a.cycle_counts,
        instants=instants,
        counters=counters,
        depths=a.depths,
    )
    return (thread, start_slots, end_slots) if keep_slots else (thread, None, None)


def c_thread_timeline(
    pid: int,
    tid: int,
    name: str,
    a: ThreadArrays,
    instants: list[tuple[int, str]],
    counters: list[tuple[int, str, int]],
    keep_slots: bool,
) -> ThreadResult:
    """The same as :func:`numpy_thread_timeline`, computed in C (no temporaries)."""
    assert _cengine is not None
    times, start, end, depth, name_id, address, insns, cycles, flags, sslot, eslot = (
        _cengine.final_pass(
            a.fd,
            a.log,
            a.update_slots,
            a.insn_counts,
            a.cycle_counts,
            a.name_ids,
            a.depths,
            keep_slots,
        )
    )
    t = np.frombuffer(times, dtype=np.int64)
    thread = ThreadTimeline(
        pid=pid,
        tid=tid,
        name=name,
        start=np.frombuffer(start, dtype=np.int64),
        end=np.frombuffer(end, dtype=np.int64),
        depth=np.frombuffer(depth, dtype=np.int32),
        name_id=np.frombuffer(name_id, dtype=np.int32),
        address=np.frombuffer(address, dtype=np.uint64),
        instructions=np.frombuffer(insns, dtype=np.int64),
        cycles=np.frombuffer(cycles, dtype=np.int64),
        flags=np.frombuffer(flags, dtype=np.uint8),
        instants=[Instant(int(t[s]), text) for s, text in instants],
        counters=[CounterSample(int(t[s]), text, v) for s, text, v in counters],
    )
    if not keep_slots:
        return thread, None, None
    return thread, np.frombuffer(sslot, dtype=np.int64), np.frombuffer(eslot, dtype=np.int64)


class FastEngine:
    """:class:`~ptscope.reconstruct.engine.TraceSegmentEngine`, ingestion in C.

    Takes the same events (:meth:`feed`, :meth:`feed_all`) and, much faster, whole
    :class:`~ptscope.model.BranchBatch` es (:meth:`feed_batch`); ``keep_slots`` keeps each
    slice's start/end slot in :attr:`slot_columns` (for transcript tests). ``final_pass``:
    ``"c"`` (default) or ``"numpy"`` (the Python engine's, for tests: both give the same).
    """

    def __init__(
        self,
        *,
        keep_slots: bool = False,
        max_examples: int = 5,
        final_pass: str = "c",
        landing_pads: LandingPadLookup | None = None,
    ) -> None:
        if final_pass not in ("c", "numpy"):
            raise ValueError(f"final_pass must be 'c' or 'numpy', not {final_pass!r}")
        self._final_pass = final_pass
        if _cengine is None:
            raise RuntimeError(f"the C engine is not built ({_IMPORT_ERROR})")
        self._c = _cengine.Engine(max_examples)
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
        self._tables: dict[int, _TableSync] = {}
        self._locations = 0  # locations the C side holds
        self._own_table = LocationTable()  # for events fed as objects
        self._messages: list[str] = []  # instant names, by id
        self._counter_names: list[str] = [_POWER_COUNTER]
        self._comms: dict[tuple[int, int], str] = {}
        self._orphan_errors: list[DecodeError] = []
        self._ignored = 0  # counted here, not in C (stack samples)
        self._comm_events = 0
        self._finished = False
        # Per thread, by order of appearance: (tid, frames, slot log), for self_check.
        self._arrays: dict[int, tuple[int, npt.NDArray[np.int64], npt.NDArray[np.int64]]] = {}

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
        functions = table.functions
        known = 0 if sync.functions is None else len(sync.functions)
        if len(functions) > known:
            intern = self._name_ids.setdefault
            new = [intern(f, len(self._name_ids)) for f in functions[known:]]
            for name, i in zip(functions[known:], new, strict=True):
                if i == len(self._names):
                    self._names.append(name)
                    if name in SPECIAL_RETURNS:
                        flags = (name in STACK_SWITCHERS) | (name in SETJMPS) << 1
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
        self._chunks.append((self._locations, table, first))
        if sync.remap is not None:
            ids = np.arange(self._locations, self._locations + end - first, dtype=np.int32)
            sync.remap = np.concatenate([sync.remap, ids])
        self._locations += end - first
        sync.synced = end

    def _landing_ranges(self, location: int) -> Sequence[tuple[int, int]]:
        assert self._landing_pads is not None
        k = bisect.bisect_right(self._chunks, location, key=lambda c: c[0]) - 1
        first, table, row = self._chunks[k]
        loc = table[row + location - first]
        return self._landing_pads(loc.dso, loc.ip)

    # ------------------------------------------------------------- output

    def finish(self) -> Timeline:
        """Close what is still open and return the whole trace (call once)."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        c = self._c
        c.close_all()
        names: list[str] = []
        timeline = Timeline()
        keys: list[tuple[int, int]] = c.thread_keys()
        for index in sorted(range(len(keys)), key=keys.__getitem__):
            pid, tid = keys[index]
            fd, slots, upd, insns, cycles, instants, counters, name_ids, depths, fresh = (
                c.take_thread(index)
            )
            names.extend(self._names[i] for i in fresh)
            fd_a = np.frombuffer(fd, dtype=np.int64).reshape(-1, _FIELDS)
            log_a = np.frombuffer(slots, dtype=np.int64)
            inst = np.frombuffer(instants, dtype=np.int64).reshape(-1, 2).tolist()
            ctrs = np.frombuffer(counters, dtype=np.int64).reshape(-1, 3).tolist()
            arrays = ThreadArrays(
                fd=fd_a,
                log=log_a,
                update_slots=np.frombuffer(upd, dtype=np.int64),
                insn_counts=np.frombuffer(insns, dtype=np.int64),
                cycle_counts=np.frombuffer(cycles, dtype=np.int64),
                name_ids=np.frombuffer(name_ids, dtype=np.int32),
                depths=np.frombuffer(depths, dtype=np.int32),
            )
            make = c_thread_timeline if self._final_pass == "c" else numpy_thread_timeline
            thread, start_slots, end_slots = make(
                pid,
                tid,
                self._comms.get((pid, tid), ""),
                arrays,
                [(s, self._messages[m]) for s, m in inst],
                [(s, self._counter_names[k], v) for s, k, v in ctrs],
                self._keep_slots,
            )
            timeline.threads.append(thread)
            self._arrays[index] = (tid, fd_a, log_a)
            if start_slots is not None and end_slots is not None:
                self.slot_columns[(pid, tid)] = (start_slots, end_slots)
        timeline.names = names
        return timeline

    # ------------------------------------------------------------ checks

    def orphan_errors(self) -> list[DecodeError]:
        """Decode errors that could not be attributed to any thread."""
        return list(self._orphan_errors)

    def self_check(self, timeline: Timeline) -> None:
        """Verify the invariants of a finished trace (see the Python engine's)."""
        if not self._finished:
            raise RuntimeError("self_check() needs finish() first")
        for _, (tid, fd, slots) in sorted(self._arrays.items()):
            if np.any(fd[:, 2] < 0):
                name = self._frame_name(fd, int(np.flatnonzero(fd[:, 2] < 0)[0]))
                raise AssertionError(f"tid {tid}: frame {name} never closed")
            if np.any(fd[:, 2] < fd[:, 1]):
                name = self._frame_name(fd, int(np.flatnonzero(fd[:, 2] < fd[:, 1])[0]))
                raise AssertionError(f"tid {tid}: frame {name} ends before start")
            if np.any(np.diff(slots >> 2) < 0):
                raise AssertionError(f"tid {tid}: time goes backwards")
        TraceSegmentEngine.check_timeline(timeline)

    def _frame_name(self, fd: npt.NDArray[np.int64], index: int) -> str:
        return self._names[int(fd[index, 4]) >> _NAME_SHIFT]
