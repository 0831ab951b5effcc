"""The trace-segment engine: decoded events in, a lossless per-thread call history out.

Per thread, events are folded into an in-memory history of frames; nothing is written until
:meth:`TraceSegmentEngine.finish`, so later events can correct earlier ones (callers that are
only discovered by returning into them, segments that turn out to continue an older stack).

Model (see ``docs/architecture.md`` for the rules with examples):

* A **frame** is one function activation. It knows its parent frame, its start and end *slot*
  (an index into the thread's time log, turned into nanoseconds in the final pass), the
  function's entry address and a few flags.
* A **context** is one stack of open frames. The thread's contexts form a stack too:
  - a *nested* context runs on top of the frame it interrupted (a kernel entry through a
    syscall or interrupt): its frames are children of that frame;
  - a *detached* context starts where the trace lost track of the stack (a decode error, a
    trace that resumes somewhere unrelated, a return to a function that is nowhere on the
    stack). Until something returns into an older context it is an independent *segment*.
* **Landing**: when control arrives (return, ``tr strt``, sysret/iret, a jump into the middle
  of a function, a call from a function) in a function that is on an older context, that
  context becomes current again: the segments above it are **stitched** underneath the frame
  landed in, frames left behind are closed where their segment ended.
* **Roots**: a return out of the bottom frame of a context into a function that was never seen
  adds that function below *every* frame the context ever had (O(1) per frame, by re-parenting
  the context's top-level frames), starting at the context's start.
* **Time**: each frame boundary takes a slot ``time*2 + consumes_time``. Runs of equal
  timestamps are spread over the interval to the next timestamp, calls taking equal shares and
  returns none; every call gets at least 1 ns, and time never goes backwards.

Hot-path note: frames are small lists indexed by the ``_F_*`` constants, not objects: the
engine must sustain about a million events per second in CPython.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ptscope.model import (
    SYNTHETIC_SYSCALL,
    SYNTHETIC_UNTRACED,
    BranchEvent,
    BranchKind,
    CommEvent,
    DecodeError,
    Event,
    Location,
    PowerEvent,
    StackSample,
    TraceState,
)
from ptscope.timeline import (
    CounterSample,
    Instant,
    NestingError,
    SliceFlags,
    ThreadTimeline,
    Timeline,
    check_nesting,
)

__all__ = ["EngineStats", "TraceSegmentEngine"]

# Frame layout: [function, parent index, start_slot, end_slot, address, flags, index,
# call site]. ``function`` is what events are matched against (and the slice's name unless
# the frame was renamed, see ``_Thread.renamed``); ``index`` is the frame's position in its
# thread's ``all_frames`` (parent -1 = none); ``call site`` is the address of the call
# instruction that created the frame (0 when not created by a call).
_F_NAME: Final = 0
_F_PARENT: Final = 1
_F_START: Final = 2
_F_END: Final = 3
_F_ADDR: Final = 4
_F_FLAGS: Final = 5
_F_INDEX: Final = 6
_F_CALLSITE: Final = 7
# A return lands this close after its call instruction (x86 instructions are <= 15 bytes).
_MAX_INSN: Final = 15

Frame = list[Any]

_INFERRED: Final = int(SliceFlags.INFERRED_START)
_OPEN_AT_END: Final = int(SliceFlags.OPEN_AT_END)
_SYNTHETIC: Final = int(SliceFlags.SYNTHETIC)
# Private flag: an [untraced] frame that began with a call whose target was not traced; if
# the trace resumes in an unrelated function, that function is the callee.
_AFTER_CALL: Final = 1 << 8

# Slot log entries are ``time * 4 + flags``: a call slot takes a share of the time until
# the next timestamp and lasts at least 1 ns; a segment-start slot only lasts at least 1 ns
# (frames found later start there and must not be empty).
_CALL_SLOT: Final = 1
_START_SLOT: Final = 2

_CALL: Final = int(BranchKind.CALL)
_RETURN: Final = int(BranchKind.RETURN)
_JUMP: Final = int(BranchKind.JUMP)
_CJUMP: Final = int(BranchKind.CONDITIONAL_JUMP)
_SYSCALL: Final = int(BranchKind.SYSCALL)
_SYSRET: Final = int(BranchKind.SYSRET)
_HWINT: Final = int(BranchKind.HARDWARE_INTERRUPT)
_IRET: Final = int(BranchKind.IRET)
_SWINT: Final = int(BranchKind.SOFTWARE_INTERRUPT)
_ASYNC: Final = int(BranchKind.ASYNC)
_TX_ABORT: Final = int(BranchKind.TX_ABORT)
_ST_NONE: Final = int(TraceState.NONE)
_ST_START: Final = int(TraceState.START)
_ST_END: Final = int(TraceState.END)


class _Context:
    """One stack of open frames (see the module docstring)."""

    __slots__ = ("detached", "frames", "parent", "start_slot", "suspend_slot", "toplevel")

    def __init__(self, parent: int, detached: bool, start_slot: int) -> None:
        self.frames: list[Frame] = []
        self.toplevel: list[Frame] = []
        self.parent = parent  # index of the frame this context runs on top of, or -1
        self.detached = detached
        self.start_slot = start_slot
        self.suspend_slot = -1


class _Thread:
    """Everything the engine keeps about one thread."""

    __slots__ = (
        "all_frames",
        "counters",
        "counts",
        "ctxs",
        "cum_cycles",
        "cum_insns",
        "instants",
        "last_time",
        "log",
        "name",
        "pid",
        "renamed",
        "tid",
        "txq",
    )

    def __init__(self, pid: int, tid: int, time: int) -> None:
        self.pid = pid
        self.tid = tid
        self.name = ""
        self.all_frames: list[Frame] = []
        # The first slot starts the thread's first segment (frames found later start there).
        self.log = array("q", [time * 4 + _START_SLOT])
        self.last_time = time
        # The first context starts at the thread's first event: frames found later by
        # returning into them were running since then.
        self.ctxs: list[_Context] = [_Context(-1, True, 0)]
        self.instants: list[tuple[int, str]] = []
        self.counters: list[tuple[int, str, int]] = []
        self.counts: list[tuple[int, int, int]] = []
        self.cum_insns = 0
        self.cum_cycles = 0
        self.txq: list[BranchEvent] = []
        # Frames matched by another name than their slice's (frame index -> slice name).
        self.renamed: dict[int, str] = {}


@dataclass
class EngineStats:
    """What the engine saw; ``unexpected`` counts events that contradicted the stack."""

    events: int = 0
    branches: int = 0
    decode_errors: int = 0
    segments_started: int = 0
    stitched: int = 0
    roots_inferred: int = 0
    unexpected: int = 0
    ignored: int = 0
    unexpected_examples: list[str] = field(default_factory=list)


class TraceSegmentEngine:
    """Folds events into per-thread call histories; :meth:`finish` returns the Timeline.

    ``keep_slots`` keeps each slice's start/end slot (for transcript tests).
    """

    def __init__(self, *, keep_slots: bool = False, max_examples: int = 5) -> None:
        self._threads: dict[tuple[int, int], _Thread] = {}
        self._last_key: tuple[int, int] | None = None
        self._last_thread: _Thread | None = None
        self.stats = EngineStats()
        self._keep_slots = keep_slots
        self._max_examples = max_examples
        self.slot_columns: dict[tuple[int, int], tuple[npt.NDArray[np.int64], ...]] = {}
        self._orphan_errors: list[DecodeError] = []
        self._comms: dict[tuple[int, int], str] = {}
        self._finished = False

    # ------------------------------------------------------------------ input

    def feed(self, event: Event) -> None:
        """Consume one event of any type."""
        if type(event) is BranchEvent:
            self._branch(event)
        elif isinstance(event, DecodeError):
            self.decode_error(event)
        elif isinstance(event, PowerEvent):
            self._power(event)
        elif isinstance(event, CommEvent):
            self._comm(event)
        elif isinstance(event, StackSample):
            self.stats.ignored += 1
        else:
            raise TypeError(f"not an event: {event!r}")

    def feed_all(self, events: Iterable[Event]) -> None:
        """Consume a stream of events.

        The fast path: the common cases (a call, a return to the parent, a jump inside a
        function) are handled inline; everything else goes through the same handlers as
        :meth:`feed`, so both give identical results (a property test checks it).
        """
        with _gc_paused():
            count = self._feed_loop(events)
        self.stats.events += count
        self.stats.branches += count

    def _feed_loop(self, events: Iterable[Event]) -> int:
        branch_event = BranchEvent
        feed = self.feed
        slow = self._branch
        apply = self._apply
        thread_of = self._thread
        call, ret, jump, cjump, no_change = _CALL, _RETURN, _JUMP, _CJUMP, _ST_NONE
        th: _Thread | None = None
        ctxs: list[_Context] = []
        cur_pid = cur_tid = -2
        count = 0
        for ev in events:
            if type(ev) is not branch_event:
                feed(ev)
                cur_tid = -2  # `feed` may have switched the engine's current thread
                continue
            if ev.tid != cur_tid or ev.pid != cur_pid or th is None:
                cur_pid = ev.pid
                cur_tid = ev.tid
                th = thread_of(cur_pid, cur_tid, ev.time)
                ctxs = th.ctxs
            if ev.in_tx or th.txq or ev.insn_count or ev.cycle_count:
                slow(ev)
                continue
            count += 1
            t = ev.time
            if t < th.last_time:
                t = th.last_time
            else:
                th.last_time = t
            kind = ev.kind
            if ev.state != no_change:
                apply(th, ev, t)
            elif kind == call:
                src = ev.src
                dst = ev.dst
                fn = dst.function
                if fn == src.function and dst.offset != 0:
                    continue  # `call next; pop`
                frames = ctxs[-1].frames
                if not frames or frames[-1][_F_NAME] != src.function:
                    frames = self._sync_source(th, src, t).frames
                log = th.log
                all_frames = th.all_frames
                frame = [
                    fn,
                    frames[-1][_F_INDEX],
                    len(log),
                    -1,
                    dst.entry,
                    0,
                    len(all_frames),
                    src.ip,
                ]
                log.append(t * 4 + _CALL_SLOT)
                frames.append(frame)
                all_frames.append(frame)
            elif kind == ret:
                frames = ctxs[-1].frames
                if len(frames) >= 2 and frames[-2][_F_NAME] == ev.dst.function:
                    log = th.log
                    frames.pop()[_F_END] = len(log)
                    log.append(t * 4)
                else:
                    self._return_slow(th, ev, t)
            elif kind == jump or kind == cjump:  # noqa: SIM109 - faster than `in`
                if ev.dst.function != ev.src.function:
                    self._jump(th, ev, t)
                elif not ctxs[-1].frames:
                    self._sync_source(th, ev.src, t)
            else:
                apply(th, ev, t)
        return count

    def thread_slot_count(self, pid: int, tid: int) -> int:
        """Slots created so far for a thread (transcript tests map slots to input events)."""
        th = self._threads.get((pid, tid))
        return len(th.log) if th is not None else 0

    def end_segment(self) -> None:
        """Break every thread's segment here without a marker (parallel-decode windows).

        What follows is stitched to what came before exactly as after a decode error.
        """
        for th in self._threads.values():
            self._break(th, th.last_time)

    def decode_error(self, err: DecodeError) -> None:
        """A decode error: an instant marker, and the thread's segment ends here."""
        self.stats.events += 1
        self.stats.decode_errors += 1
        th: _Thread | None
        if err.tid is not None and err.tid >= 0:
            if err.pid is not None and err.pid >= 0:
                pid = err.pid
            else:
                pid = next((p for p, t in self._threads if t == err.tid), err.tid)
            th = self._thread(pid, err.tid, err.time if err.time is not None else 0)
        else:
            # perf could not say which thread: the one decoded last is the best guess.
            th = self._last_thread
        if th is None:
            self._orphan_errors.append(err)
            return
        time = err.time if err.time is not None else th.last_time
        if time < th.last_time:
            time = th.last_time
        th.last_time = time
        slot = len(th.log)
        th.log.append(time * 4 + _START_SLOT)
        th.instants.append((slot, f"[decode error: {err.message}]"))
        self._break(th, time, slot)

    # ------------------------------------------------------------- threads

    def _thread(self, pid: int, tid: int, time: int) -> _Thread:
        key = (pid, tid)
        if key == self._last_key:
            assert self._last_thread is not None
            return self._last_thread
        th = self._threads.get(key)
        if th is None:
            th = self._threads[key] = _Thread(pid, tid, time)
        self._last_key = key
        self._last_thread = th
        return th

    def _comm(self, ev: CommEvent) -> None:
        # Only a name: the thread's history starts with its first branch, not here.
        self.stats.events += 1
        self._comms[(ev.pid, ev.tid)] = ev.comm

    def _power(self, ev: PowerEvent) -> None:
        self.stats.events += 1
        th = self._thread(ev.pid, ev.tid, ev.time)
        t = ev.time if ev.time > th.last_time else th.last_time
        th.last_time = t
        th.counters.append((len(th.log), "CPU frequency (MHz)", ev.freq_mhz))
        th.log.append(t * 4)

    # ---------------------------------------------------------- the branch

    def _branch(self, ev: BranchEvent) -> None:
        stats = self.stats
        stats.events += 1
        stats.branches += 1
        key = (ev.pid, ev.tid)
        if key == self._last_key:
            th = self._last_thread
            assert th is not None
        else:
            th = self._thread(ev.pid, ev.tid, ev.time)
        t = ev.time
        if t < th.last_time:
            t = th.last_time
        th.last_time = t
        if ev.insn_count or ev.cycle_count:
            th.cum_insns += ev.insn_count
            th.cum_cycles += ev.cycle_count
            th.counts.append((len(th.log), th.cum_insns, th.cum_cycles))
        if ev.in_tx:
            # Speculative until the transaction commits: a later abort discards it.
            th.txq.append(ev)
            return
        if th.txq:
            if ev.kind == _TX_ABORT:
                th.txq.clear()
            else:
                queued, th.txq = th.txq, []
                for q in queued:
                    self._apply(th, q, q.time if q.time <= t else t)
        self._apply(th, ev, t)

    def _apply(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        kind = ev.kind
        state = ev.state
        src = ev.src
        dst = ev.dst
        if state == _ST_NONE:
            if kind == _CALL:
                if dst.function == src.function and dst.offset != 0:
                    return  # `call next; pop`: reads the PC, not a call
                ctx = th.ctxs[-1]
                frames = ctx.frames
                if not frames or frames[-1][_F_NAME] != src.function:
                    ctx = self._sync_source(th, src, t)
                    frames = ctx.frames
                slot = len(th.log)
                th.log.append(t * 4 + _CALL_SLOT)
                parent = frames[-1][_F_INDEX]
                frame = self._new_frame(th, dst.function, parent, slot, dst.entry, 0)
                frame[_F_CALLSITE] = src.ip
                frames.append(frame)
            elif kind == _RETURN:
                ctx = th.ctxs[-1]
                frames = ctx.frames
                fn = dst.function
                if len(frames) >= 2 and frames[-2][_F_NAME] == fn:
                    slot = len(th.log)
                    th.log.append(t * 4)
                    frames.pop()[_F_END] = slot
                else:
                    self._return_slow(th, ev, t)
            elif kind in (_JUMP, _CJUMP):
                if dst.function != src.function:
                    self._jump(th, ev, t)
                elif not th.ctxs[-1].frames:
                    # Nothing seen yet in this segment but that we run in this function.
                    self._sync_source(th, src, t)
            elif kind in (_SYSCALL, _HWINT, _SWINT):
                self._enter_nested(th, ev, t)
            elif kind in (_SYSRET, _IRET):
                self._long_return(th, dst, t)
            elif kind in (_ASYNC, _TX_ABORT):
                if dst.function != src.function:
                    self._jump(th, ev, t)
            else:
                self.stats.ignored += 1
        elif state == _ST_END:
            self._trace_end(th, ev, t)
        elif state == _ST_START:
            self._trace_start(th, ev, t)
        else:
            self.stats.ignored += 1

    # ------------------------------------------------------------ handlers

    def _unexpected(self, th: _Thread, what: str) -> None:
        self.stats.unexpected += 1
        if len(self.stats.unexpected_examples) < self._max_examples:
            self.stats.unexpected_examples.append(f"tid {th.tid} t={th.last_time}: {what}")

    def _sync_source(self, th: _Thread, src: Location, t: int) -> _Context:
        """Make ``src``'s function the current frame before a call/jump/trace end from it.

        Returns the (possibly new) current context, whose top frame is ``src.function``.
        """
        ctx = th.ctxs[-1]
        frames = ctx.frames
        fn = src.function
        if frames and frames[-1][_F_NAME] == fn:
            return ctx
        if frames:
            for i in range(len(frames) - 2, -1, -1):
                if frames[i][_F_NAME] == fn:
                    # Frames above returned without us seeing it (lost data).
                    self._unexpected(th, f"branch from {fn} while in {frames[-1][_F_NAME]}")
                    slot = len(th.log)
                    th.log.append(t * 4)
                    self._close_above(ctx, i, slot, _OPEN_AT_END)
                    return ctx
        if self._land(th, fn, t):
            return th.ctxs[-1]
        if frames:
            self._unexpected(th, f"branch from {fn}, which is not on the stack")
            ctx = self._push_detached(th, t)
        # The function we are in was entered before we could see it.
        self._new_first_frame(th, ctx, src, ctx.start_slot, _INFERRED)
        return ctx

    def _return_slow(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        ctx = th.ctxs[-1]
        frames = ctx.frames
        fn = ev.dst.function
        if not frames:
            # The segment begins with a return: the function returning was running since
            # the segment started.
            ctx = self._sync_source(th, ev.src, t)
            frames = ctx.frames
            if len(frames) >= 2 and frames[-2][_F_NAME] == fn:
                slot = len(th.log)
                th.log.append(t * 4)
                frames.pop()[_F_END] = slot
                return
        for i in range(len(frames) - 3, -1, -1):
            if frames[i][_F_NAME] == fn:
                # A return past several frames (exception unwinding, longjmp via ret).
                slot = len(th.log)
                th.log.append(t * 4)
                self._close_above(ctx, i, slot, 0)
                return
        top = frames[-1]
        if top[_F_CALLSITE] and 0 < ev.dst.ip - top[_F_CALLSITE] <= _MAX_INSN and len(frames) > 1:
            # It returns right after its call, into a differently named function: an
            # assembly label inside the caller (ld.so's `_start` / `_dl_start_user`). The
            # caller carries on; from now on events name it by the label.
            slot = len(th.log)
            th.log.append(t * 4)
            frames.pop()[_F_END] = slot
            self._rename(th, frames[-1], fn)
            return
        if self._land(th, fn, t):
            return
        if len(frames) == 1:
            self._add_root(th, ctx, ev.dst, t)
            return
        # A return into a function that is nowhere on a non-empty stack: data was lost.
        self._unexpected(th, f"return to {fn}, which is not on the stack")
        ctx = self._push_detached(th, t)
        self._new_first_frame(th, ctx, ev.dst, ctx.start_slot, _INFERRED)

    def _jump(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        """A jump between functions: tail call, unwind (longjmp) or leaf replacement."""
        dst = ev.dst
        fn = dst.function
        ctx = th.ctxs[-1]
        if dst.offset != 0:
            frames = ctx.frames
            for i in range(len(frames) - 2, -1, -1):
                if frames[i][_F_NAME] == fn:
                    # Into the middle of a caller: longjmp, landing pad, OCaml raise.
                    slot = len(th.log)
                    th.log.append(t * 4)
                    self._close_above(ctx, i, slot, 0)
                    return
            if self._land(th, fn, t):
                return
        ctx = self._sync_source(th, ev.src, t)
        frames = ctx.frames
        if frames[-1][_F_NAME] == fn:
            return
        # A tail call (jump to the start of another function, PLT stubs), or a jump into
        # the middle of an unrelated function: the leaf is replaced.
        slot = len(th.log)
        th.log.append(t * 4 + _CALL_SLOT)
        old = frames.pop()
        old[_F_END] = slot
        frame = self._new_frame(th, fn, old[_F_PARENT], slot, dst.entry, 0)
        frames.append(frame)
        if len(frames) == 1:
            ctx.toplevel.append(frame)

    def _enter_nested(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        """Syscall / interrupt entry with kernel tracing: a new stack on top of this frame."""
        ctx = self._sync_source(th, ev.src, t)
        slot = len(th.log)
        th.log.append(t * 4 + _CALL_SLOT)
        nested = _Context(ctx.frames[-1][_F_INDEX], False, slot)
        th.ctxs.append(nested)
        frame = self._new_frame(th, ev.dst.function, nested.parent, slot, ev.dst.entry, 0)
        nested.frames.append(frame)
        nested.toplevel.append(frame)

    def _long_return(self, th: _Thread, dst: Location, t: int) -> None:
        """sysret / iret: back to where the kernel was entered (any context)."""
        fn = dst.function
        ctx = th.ctxs[-1]
        frames = ctx.frames
        for i in range(len(frames) - 2, -1, -1):
            if frames[i][_F_NAME] == fn:
                slot = len(th.log)
                th.log.append(t * 4)
                self._close_above(ctx, i, slot, 0)
                return
        if self._land(th, fn, t):
            return
        if not frames:
            self._new_first_frame(th, ctx, dst, ctx.start_slot, _INFERRED)
            return
        # The kernel was entered before the trace began: the user function it returns to
        # was running underneath all of it.
        self._add_root(th, ctx, dst, t)

    def _trace_end(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        kind = ev.kind
        ctx = self._sync_source(th, ev.src, t)
        if kind == _RETURN and len(ctx.frames) >= 2:
            # The return executed; its target (the caller) is where tracing stopped.
            slot = len(th.log)
            th.log.append(t * 4)
            ctx.frames.pop()[_F_END] = slot
        elif (kind in (_SYSRET, _IRET)) and len(th.ctxs) > 1 and not ctx.detached:
            # Back to the interrupted stack, which is not traced.
            slot = len(th.log)
            th.log.append(t * 4)
            for f in ctx.frames:
                f[_F_END] = slot
            th.ctxs.pop()
            ctx = th.ctxs[-1]
            if not ctx.frames:
                return
        name = SYNTHETIC_SYSCALL if kind == _SYSCALL else SYNTHETIC_UNTRACED
        flags = _SYNTHETIC | (_AFTER_CALL if kind == _CALL else 0)
        slot = len(th.log)
        th.log.append(t * 4 + _CALL_SLOT)
        ctx.frames.append(self._new_frame(th, name, ctx.frames[-1][_F_INDEX], slot, 0, flags))

    def _trace_start(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        dst = ev.dst
        fn = dst.function
        ctx = th.ctxs[-1]
        frames = ctx.frames
        if not frames:
            if not self._land(th, fn, t):
                self._new_first_frame(th, ctx, dst, ctx.start_slot, _INFERRED)
            return
        top = frames[-1]
        if top[_F_NAME] == fn:
            return  # a repeated `tr strt` where we already are
        for i in range(len(frames) - 2, -1, -1):
            if frames[i][_F_NAME] == fn:
                # Normally the frame just below [untraced]/[syscall]: tracing resumed where
                # it stopped. Further up: frames returned while untraced.
                slot = len(th.log)
                th.log.append(t * 4)
                self._close_above(ctx, i, slot, 0)
                return
        if top[_F_FLAGS] & _AFTER_CALL:
            # `tr end  call` then resume in a new function: that is the callee.
            top[_F_NAME] = fn
            top[_F_ADDR] = dst.entry
            top[_F_FLAGS] = 0
            return
        if self._land(th, fn, t):
            return
        # Resumed somewhere unrelated to the stack (a signal handler, lost data): a new
        # segment, which stitching rejoins if control comes back to this stack.
        ctx = self._push_detached(th, t)
        self._new_first_frame(th, ctx, dst, ctx.start_slot, _INFERRED)

    # ------------------------------------------------------ stack surgery

    @staticmethod
    def _close_above(ctx: _Context, index: int, slot: int, flags: int) -> None:
        frames = ctx.frames
        for f in frames[index + 1 :]:
            f[_F_END] = slot
            f[_F_FLAGS] |= flags
        del frames[index + 1 :]

    def _new_first_frame(
        self, th: _Thread, ctx: _Context, loc: Location, start_slot: int, flags: int
    ) -> Frame:
        """The first frame of an empty context (its call was not seen)."""
        frame = self._new_frame(th, loc.function, ctx.parent, start_slot, loc.entry, flags)
        ctx.frames.append(frame)
        ctx.toplevel.append(frame)
        return frame

    @staticmethod
    def _rename(th: _Thread, frame: Frame, function: str) -> None:
        """Match ``frame`` by another function name from now on; its slice keeps its name."""
        th.renamed.setdefault(frame[_F_INDEX], frame[_F_NAME])
        frame[_F_NAME] = function

    @staticmethod
    def _new_frame(
        th: _Thread, name: str, parent: int, start_slot: int, address: int, flags: int
    ) -> Frame:
        frame = [name, parent, start_slot, -1, address, flags, len(th.all_frames), 0]
        th.all_frames.append(frame)
        return frame

    def _push_detached(self, th: _Thread, t: int) -> _Context:
        """End the current segment here; what follows is a new, detached one."""
        slot = len(th.log)
        th.log.append(t * 4 + _START_SLOT)
        cur = th.ctxs[-1]
        if not cur.frames and cur.detached:
            cur.start_slot = slot
            return cur
        cur.suspend_slot = slot
        ctx = _Context(-1, True, slot)
        th.ctxs.append(ctx)
        self.stats.segments_started += 1
        return ctx

    def _break(self, th: _Thread, time: int, slot: int | None = None) -> None:
        if slot is None:
            slot = len(th.log)
            th.log.append(time * 4 + _START_SLOT)
        cur = th.ctxs[-1]
        if not cur.frames and cur.detached:
            cur.start_slot = slot
            return
        cur.suspend_slot = slot
        th.ctxs.append(_Context(-1, True, slot))
        self.stats.segments_started += 1

    def _add_root(self, th: _Thread, ctx: _Context, loc: Location, t: int) -> None:
        """Return out of the context's bottom frame into a never-seen caller."""
        slot = len(th.log)
        th.log.append(t * 4)
        root = self._new_frame(th, loc.function, ctx.parent, ctx.start_slot, loc.entry, _INFERRED)
        for f in ctx.toplevel:
            f[_F_PARENT] = root[_F_INDEX]
        ctx.toplevel = [root]
        for f in ctx.frames:
            f[_F_END] = slot
        ctx.frames = [root]
        self.stats.roots_inferred += 1

    def _land(self, th: _Thread, fn: str, t: int) -> bool:
        """Control arrived in ``fn``: if it is on an older context, return to it (stitching).

        Everything above the frame landed in is closed; detached segments in between become
        children of that frame (they ran while it was active).
        """
        ctxs = th.ctxs
        for ci in range(len(ctxs) - 2, -1, -1):
            target = ctxs[ci]
            tframes = target.frames
            for fi in range(len(tframes) - 1, -1, -1):
                if tframes[fi][_F_NAME] == fn:
                    break
            else:
                continue
            landed = tframes[fi]
            slot = len(th.log)
            th.log.append(t * 4)
            end = slot
            for j in range(len(ctxs) - 1, ci, -1):
                c = ctxs[j]
                for f in c.frames:
                    f[_F_END] = end
                if c.detached:
                    for f in c.toplevel:
                        f[_F_PARENT] = landed[_F_INDEX]
                    self.stats.stitched += 1
                    end = ctxs[j - 1].suspend_slot
            for f in tframes[fi + 1 :]:
                f[_F_END] = end
                f[_F_FLAGS] |= _OPEN_AT_END
            del tframes[fi + 1 :]
            del ctxs[ci + 1 :]
            target.suspend_slot = -1
            return True
        return False

    # ------------------------------------------------------------- output

    def finish(self) -> Timeline:
        """Close what is still open and return the whole trace (call once)."""
        if self._finished:
            raise RuntimeError("finish() called twice")
        self._finished = True
        names: dict[str, int] = {}
        timeline = Timeline()
        with _gc_paused():
            for key, th in sorted(self._threads.items()):
                th.name = th.name or self._comms.get(key, "")
                self._close_all(th)
                timeline.threads.append(self._thread_timeline(th, names))
        timeline.names = list(names)
        return timeline

    @staticmethod
    def _close_all(th: _Thread) -> None:
        slot = len(th.log)
        th.log.append(th.last_time * 4)
        end = slot
        ctxs = th.ctxs
        for j in range(len(ctxs) - 1, -1, -1):
            c = ctxs[j]
            for f in c.frames:
                f[_F_END] = end
                f[_F_FLAGS] |= _OPEN_AT_END
            c.frames = []
            if j > 0 and c.detached:
                end = ctxs[j - 1].suspend_slot

    def _thread_timeline(self, th: _Thread, names: dict[str, int]) -> ThreadTimeline:
        times = _slot_times(th.log)
        frames = th.all_frames
        n = len(frames)
        if n:
            name_col, parent_col, start_col, end_col, addr_col, flag_col, _, _ = zip(
                *frames, strict=True
            )
            if th.renamed:
                name_col = tuple(th.renamed.get(i, x) for i, x in enumerate(name_col))
            intern = names.setdefault
            name_ids = np.array([intern(x, len(names)) for x in name_col], dtype=np.int32)
            parents = np.array(parent_col, dtype=np.int64)
            start_slot = np.array(start_col, dtype=np.int64)
            end_slot = np.array(end_col, dtype=np.int64)
            addrs = np.array(addr_col, dtype=np.uint64)
            flags = (np.array(flag_col, dtype=np.int64) & 0xFF).astype(np.uint8)
        else:
            name_ids = np.zeros(0, dtype=np.int32)
            parents = start_slot = end_slot = np.zeros(0, dtype=np.int64)
            addrs = np.zeros(0, dtype=np.uint64)
            flags = np.zeros(0, dtype=np.uint8)
        depths = _depths(parents)
        start = times[start_slot]
        end = times[end_slot]
        insns = np.full(n, -1, dtype=np.int64)
        cycles = np.full(n, -1, dtype=np.int64)
        if th.counts and n:
            updates = np.array(th.counts, dtype=np.int64)
            at_start = np.searchsorted(updates[:, 0], start_slot, side="right") - 1
            at_end = np.searchsorted(updates[:, 0], end_slot, side="right") - 1
            insns = _counter_delta(updates[:, 1], at_start, at_end)
            cycles = _counter_delta(updates[:, 2], at_start, at_end)
        order = np.lexsort((depths, start))
        timeline = ThreadTimeline(
            pid=th.pid,
            tid=th.tid,
            name=th.name,
            start=start[order],
            end=end[order],
            depth=depths[order],
            name_id=name_ids[order],
            address=addrs[order],
            instructions=insns[order],
            cycles=cycles[order],
            flags=flags[order],
            instants=[Instant(int(times[s]), name) for s, name in th.instants],
            counters=[CounterSample(int(times[s]), name, v) for s, name, v in th.counters],
        )
        if self._keep_slots:
            self.slot_columns[(th.pid, th.tid)] = (start_slot[order], end_slot[order])
        return timeline

    # ------------------------------------------------------------ checks

    def orphan_errors(self) -> list[DecodeError]:
        """Decode errors that could not be attributed to any thread."""
        return list(self._orphan_errors)

    def self_check(self, timeline: Timeline) -> None:
        """Verify the invariants of a finished trace; raises ``AssertionError``.

        Every frame is closed, times are non-decreasing in each thread's log, children lie
        inside their parents, and names/ids are consistent.
        """
        for th in self._threads.values():
            for f in th.all_frames:
                if f[_F_END] < 0:
                    raise AssertionError(f"tid {th.tid}: frame {f[_F_NAME]} never closed")
                if f[_F_END] < f[_F_START]:
                    raise AssertionError(f"tid {th.tid}: frame {f[_F_NAME]} ends before start")
            log = np.frombuffer(th.log, dtype=np.int64) >> 2
            if np.any(np.diff(log) < 0):
                raise AssertionError(f"tid {th.tid}: time goes backwards")
        for tt in timeline.threads:
            try:
                check_nesting(tt)
            except NestingError as e:
                raise AssertionError(f"tid {tt.tid}: {e}") from e
            if len(tt) and int(tt.name_id.max()) >= len(timeline.names):
                raise AssertionError("name id out of range")


def _slot_times(log: array[int]) -> npt.NDArray[np.int64]:
    """Turn a thread's slot log into nanoseconds (see "Time" in the module docstring)."""
    raw = np.frombuffer(log, dtype=np.int64)
    t = raw >> 2
    n = t.shape[0]
    same = t[1:] == t[:-1]
    if same.any():
        # Spread each run of equal timestamps over the interval to the next timestamp,
        # calls taking equal shares. Only slots in runs longer than one are touched.
        member = np.zeros(n, dtype=bool)
        member[1:] |= same
        member[:-1] |= same
        idx = np.flatnonzero(member)
        run_t = t[idx]
        calls = raw[idx] & _CALL_SLOT
        first = np.ones(idx.shape[0], dtype=bool)
        first[1:] = run_t[1:] != run_t[:-1]
        run_first = np.flatnonzero(first)
        run_id = np.cumsum(first) - 1
        after_run = np.append(idx[run_first[1:] - 1], idx[-1]) + 1
        next_t = np.where(after_run < n, t[np.minimum(after_run, n - 1)], run_t[run_first])
        calls_before = np.cumsum(calls) - calls
        before_in_run = calls_before - calls_before[run_first][run_id]
        calls_in_run = np.add.reduceat(calls, run_first)
        span = (next_t - run_t[run_first])[run_id]
        t[idx] += span * before_in_run // np.maximum(calls_in_run[run_id], 1)
    # Every call (and segment start) lasts at least 1 ns, and time never goes backwards.
    lasting = ((raw & (_CALL_SLOT | _START_SLOT)) != 0).astype(np.int64)
    lasting_before = np.cumsum(lasting)
    lasting_before -= lasting
    t -= lasting_before
    np.maximum.accumulate(t, out=t)
    t += lasting_before
    return t


def _depths(parents: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
    """Depth of every frame from parent indices (-1 = none), by pointer jumping.

    Parents may come after their children (roots found later), so this cannot be a
    single forward pass; doubling the jump each round needs log2(max depth) rounds.
    """
    depth = (parents >= 0).astype(np.int64)
    jump = parents.copy()
    while True:
        has = jump >= 0
        if not has.any():
            break
        idx = np.flatnonzero(has)
        target = jump[idx]
        depth[idx] += depth[target]
        jump[idx] = jump[target]
    return depth.astype(np.int32)


def _counter_delta(
    values: npt.NDArray[np.int64],
    at_start: npt.NDArray[np.int64],
    at_end: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Counter value at each end minus at each start (0 before the first update)."""
    begin = np.where(at_start >= 0, values[np.maximum(at_start, 0)], 0)
    finish = np.where(at_end >= 0, values[np.maximum(at_end, 0)], 0)
    out: npt.NDArray[np.int64] = finish - begin
    return out


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the engine allocates millions of small, acyclic
    containers, and generational collections over them cost more than the work itself."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
