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
    One that began where the trace resumed right after the thread entered the kernel (a
    signal handler) *interrupts* the context below: it runs on top of the frame that was
    interrupted, which stays open until control comes back below it.
* **Landing**: when control arrives (return, ``tr strt``, sysret/iret, a jump into the middle
  of a function, a call from a function) in a function that is on an older context, that
  context becomes current again: the segments above it are **stitched** underneath the frame
  landed in, frames left behind are closed where their segment ended. An interrupting
  segment is stitched under the frame it interrupted instead, and the frames between that
  one and the frame landed in end at the landing (a handler that leaves by ``siglongjmp``).
* **Lookahead**: a longjmp (or a ``ret`` past several frames) to a resume point that several
  activations of a function armed (``setjmp`` at the same call site in recursion) cannot be
  placed from the jump alone: the trace has no stack pointer. The thread's next events are
  held (up to ``LOOKAHEAD_EVENTS``) while the returns among them are checked against each
  candidate activation's callers; the landing goes to the only one they fit (the nearest
  when several still fit), then the held events run as if never held.
* **Roots**: a return out of the bottom frame of a context into a function that was never seen
  adds that function below *every* frame the context ever had (O(1) per frame, by re-parenting
  the context's top-level frames), starting at the context's start.
* **Time**: each frame boundary takes a slot ``time*4 + flags``. Runs of equal timestamps are
  spread over the interval to the next timestamp, calls taking equal shares and returns none
  (counts as times: in proportion to the instructions between them); every call gets at
  least 1 ns, and time never goes backwards.

Storage (the engine must sustain about a million events per second in CPython and keep a
big trace's history in memory): a frame's fields live in one flat ``array('q')`` per thread,
six integers per frame (48 bytes, handed to numpy without copying); a frame that is still
open also has a *handle* ``[function, index]`` on its context's stack, which is what events
are matched against. The common events are handled inline in :meth:`feed_all`.
"""

from __future__ import annotations

import gc
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from ptscope.model import (
    SYNTHETIC_SYSCALL,
    SYNTHETIC_UNTRACED,
    BranchBatch,
    BranchEvent,
    BranchKind,
    CommEvent,
    DecodeError,
    Event,
    InlineNodes,
    Location,
    PowerEvent,
    StackSample,
    TraceState,
    entry_name,
    is_unknown_code,
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

__all__ = [
    "GOROUTINE_PARKERS",
    "GOROUTINE_SWITCHERS",
    "SETJMPS",
    "SPECIAL_RETURNS",
    "STACK_SWITCHERS",
    "EngineStats",
    "TraceSegmentEngine",
    "build_thread_timeline",
]

# A frame's fields in its thread's `fd` array (frame i at fd[i*6 : i*6+6]): parent frame
# index (-1 = none), start slot, end slot (-1 = open), entry address, flags, and the address
# of the call instruction that created it (0 = not created by a call).
_PARENT: Final = 0
_START: Final = 1
_END: Final = 2
_ADDR: Final = 3
_FLAGS: Final = 4
_CALLSITE: Final = 5
_FIELDS: Final = 6

# An open frame's handle on its context's stack: [function matched against events, index].
Handle = list[Any]
_FN: Final = 0
_IX: Final = 1

_INFERRED: Final = int(SliceFlags.INFERRED_START)
_OPEN_AT_END: Final = int(SliceFlags.OPEN_AT_END)
_SYNTHETIC: Final = int(SliceFlags.SYNTHETIC)
_INLINED: Final = int(SliceFlags.INLINED)
# Private flag: an [untraced] frame that began with a call whose target was not traced; if
# the trace resumes in an unrelated function, that function is the callee.
_AFTER_CALL: Final = 1 << 8
# Private flag: an [untraced]/[syscall] frame that began where the thread entered the kernel
# (a system call, an interrupt, an asynchronous event): if the trace resumes somewhere
# unrelated, a signal handler runs there, on top of the frame below this one.
_KERNEL_ENTRY: Final = 1 << 9
# A return lands this close after its call instruction (x86 instructions are <= 15 bytes).
_MAX_INSN: Final = 15
# Addresses are stored in a signed array: kernel addresses (>= 2**63) wrap around.
_SIGN: Final = 1 << 63
_WRAP: Final = 1 << 64
_MASK64: Final = _WRAP - 1

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
_KERNEL_ENTRIES: Final = frozenset({_SYSCALL, _HWINT, _SWINT, _ASYNC})
_TX_ABORT: Final = int(BranchKind.TX_ABORT)
_INLINE: Final = int(BranchKind.INLINE)
_ST_NONE: Final = int(TraceState.NONE)
_ST_START: Final = int(TraceState.START)
_ST_END: Final = int(TraceState.END)


class _Context:
    """One stack of open frames (see the module docstring)."""

    __slots__ = (
        "after_break",
        "detached",
        "frames",
        "interrupting",
        "parent",
        "start_slot",
        "suspend_slot",
        "switched_in",
        "toplevel",
    )

    def __init__(self, parent: int, detached: bool, start_slot: int) -> None:
        self.frames: list[Handle] = []
        self.toplevel: list[int] = []  # frames whose parent is this context's base
        self.parent = parent  # index of the frame this context runs on top of, or -1
        self.detached = detached
        self.start_slot = start_slot
        self.suspend_slot = -1
        # Began with a stack switch: the contexts below it are other stacks, which names
        # must not land on (see _stack_switch).
        self.switched_in = False
        # Began at a segment break (end_segment), whose slot takes no time: if control does
        # not land on an older stack, the segment starts at its first frame (_first_frame).
        self.after_break = False
        # Began where the trace resumed somewhere unrelated right after the thread entered
        # the kernel: a signal handler, running on top of the context below (see _land_on).
        self.interrupting = False


class _Thread:
    """Everything the engine keeps about one thread."""

    __slots__ = (
        "armed",
        "counters",
        "ctxs",
        "cum_cycles",
        "cum_insns",
        "cycle_counts",
        "fd",
        "guard",
        "held",
        "inl",
        "insn_counts",
        "instants",
        "last_time",
        "line_updates",
        "log",
        "name",
        "names",
        "pid",
        "resume",
        "tid",
        "txq",
        "update_slots",
    )

    def __init__(self, pid: int, tid: int, time: int) -> None:
        self.pid = pid
        self.tid = tid
        self.name = ""
        self.fd = array("q")
        self.names: list[str] = []  # each frame's slice name
        # The first slot starts the thread's first segment (frames found later start there).
        self.log = array("q", [time * 4 + _START_SLOT])
        self.last_time = time
        # The first context starts at the thread's first event: frames found later by
        # returning into them were running since then.
        self.ctxs: list[_Context] = [_Context(-1, True, 0)]
        self.instants: list[tuple[int, str]] = []
        self.counters: list[tuple[int, str, int]] = []
        # Cumulative instruction/cycle counts, as sparse updates: the values hold from the
        # slot `update_slots[i]` on (several updates before one slot keep the last).
        self.update_slots = array("q")
        self.insn_counts = array("q")
        self.cycle_counts = array("q")
        self.cum_insns = 0
        self.cum_cycles = 0
        # Code lines of events with instruction detail: (slot they precede, lines).
        self.line_updates: list[tuple[int, tuple[int, ...]]] = []
        self.txq: list[BranchEvent] = []
        # Frame index -> where a setjmp-family call last returned into it: a longjmp to that
        # address resumes that frame, whichever activations of its function lie above.
        self.resume: dict[int, int] = {}
        # The frames whose setjmp just returned (`armed`), and the call site of the first
        # call each made after it (`guard`: the call setjmp protects, in the common
        # `if (!setjmp(buf)) guarded();`): a frame still inside it is the likelier target
        # of a longjmp to that resume point (see _look_ahead).
        self.armed: set[int] = set()
        self.guard: dict[int, int] = {}
        # A landing waiting for the events that tell where it goes (see _Lookahead).
        self.held: _Lookahead | None = None
        # Frame index -> the inlined bodies open in it, outermost first: (node, frame
        # index of their own, inlined frame). Inlined frames are on no context's stack.
        self.inl: dict[int, list[tuple[int, int]]] = {}


LOOKAHEAD_EVENTS: Final = 65536
"""At most this many events wait for an ambiguous landing to be settled."""


_GAP: Final = ("", 0)
"""An untraced gap among the frames pushed since a landing (see _Hypothesis)."""

MAX_HYPOTHESES: Final = 256
"""At most this many stacks are followed at once; more, and the landing is settled."""


class _SegmentBreak:
    """A segment break held with a lookahead's events (see end_segment)."""


SEGMENT_BREAK: Final = _SegmentBreak()


class _Hypothesis:
    """One way the held events may have run: on candidate ``candidate``'s stack, whose
    top is now frame ``top`` of the landing's context, with ``above`` pushed on it since
    the landing (function and the resume point a setjmp gave it, 0 if none; ``_GAP``: an
    untraced gap)."""

    __slots__ = ("above", "candidate", "top")

    def __init__(self, candidate: int, top: int, above: list[tuple[str, int]]) -> None:
        self.candidate = candidate
        self.top = top
        self.above = above

    def key(self) -> tuple[int, list[tuple[str, int]]]:
        return self.top, self.above


class _Lookahead:
    """A landing in one of several activations armed at the same resume point, and the
    thread's events held until they tell which one it was.

    The candidates share the stack below them, and the events after the landing run on top
    of whichever it is: a return with nothing pushed since pops the landed frame, and must
    land in its caller, right after its call; a longjmp goes to a frame armed at its
    target (one of several, again: each is followed). ``hypotheses``: the stacks the events
    fit so far (see _Hypothesis); the landing is settled when they all come from one
    candidate, or when what follows can no longer tell them apart.
    """

    __slots__ = ("candidates", "ctx_index", "events", "hypotheses", "time")

    def __init__(self, ctx_index: int, candidates: list[int], time: int) -> None:
        self.ctx_index = ctx_index
        self.candidates = candidates  # frame indices in that context, nearest first
        self.hypotheses = [_Hypothesis(k, fi, []) for k, fi in enumerate(candidates)]
        self.time = time
        self.events: list[BranchEvent | PowerEvent | _SegmentBreak] = []

    def nearest(self) -> int:
        """The frame to land on: the nearest candidate the events still fit (the nearest
        of all if they fit none)."""
        k = min((h.candidate for h in self.hypotheses), default=0)
        return self.candidates[k]

    def decided(self) -> bool:
        """Nothing more to learn: the stacks the events fit all come from one candidate,
        or are the same frames (a longjmp below them all: what follows fits each alike)."""
        hyps = self.hypotheses
        if len({h.candidate for h in hyps}) <= 1:
            return True
        first = hyps[0].key()
        return all(h.key() == first for h in hyps)


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


def _new_frame(
    th: _Thread,
    function: str,
    parent: int,
    start_slot: int,
    address: int,
    flags: int,
    callsite: int = 0,
) -> Handle:
    index = len(th.names)
    th.names.append(function)
    if address >= _SIGN:
        address -= _WRAP
    if callsite >= _SIGN:
        callsite -= _WRAP
    th.fd.extend((parent, start_slot, -1, address, flags, callsite))
    return [function, index]


def _inner(th: _Thread, ix: int) -> int:
    """The innermost frame open in frame ``ix``: its innermost inlined body, or itself."""
    chain = th.inl.get(ix) if th.inl else None
    return chain[-1][1] if chain else ix


def _gap_and_count(th: _Thread, ev: BranchEvent, t: int) -> None:
    """A dropped jump's time between the thread's last slot and this event: logged as a
    time-only slot, it ends the previous run of equal timestamps where perf's time moved on
    (instead of at the next kept event, maybe much later). The event's instructions up to
    that jump (``gap_insns``, when known) count before the slot, the rest after it: where
    runs are spread by instructions, the slot sits where the clock moved."""
    insns = ev.insn_count
    gap_time = ev.gap_time
    if (th.log[-1] >> 2) < gap_time < t:
        early = ev.gap_insns
        if early and early <= insns:
            _count(th, early, 0)
            insns -= early
        th.log.append(gap_time * 4)
    if insns or ev.cycle_count:
        _count(th, insns, ev.cycle_count)


STACK_SWITCHERS: Final = frozenset(
    {"swapcontext", "__swapcontext", "setcontext", "__setcontext"}
    | {f"{name}@@GLIBC_2.2.5" for name in ("swapcontext", "setcontext")}
)
"""Functions whose return lands on another stack (ucontext coroutines)."""

SETJMPS: Final = frozenset(
    {"setjmp", "_setjmp", "__setjmp", "sigsetjmp", "__sigsetjmp", "__sigjmp_save"}
    | {f"{name}@@GLIBC_2.2.5" for name in ("setjmp", "_setjmp", "sigsetjmp")}
)
"""Functions that save a resume point: the address they return to (glibc's ``_setjmp``
jumps to ``__sigsetjmp``, which may jump to ``__sigjmp_save``: each can be the one that
returns)."""

SPECIAL_RETURNS: Final = STACK_SWITCHERS | SETJMPS
"""A return from one of these is never handled by the common fast path."""

GOROUTINE_SWITCHERS: Final = frozenset({"gogo", "runtime.gogo", "runtime.gogo.abi0"})
"""Go's ``runtime.gogo`` (and its ``gogo`` label): its jump out, never a return, lands on a
goroutine's stack (see _goroutine_switch)."""

GOROUTINE_PARKERS: Final = frozenset({"runtime.mcall", "runtime.mcall.abi0"})
"""Go's ``runtime.mcall``: every goroutine parked through it waits at the same address."""

PLT_HEADERS: Final = frozenset({".plt"})
"""PLT0, the lazy-binding header every PLT stub of a binary jumps to on its first call
(named so by ``decode/plt_names.py``, and by perf >= 6.2)."""

SPECIAL_FUNCTIONS: Final = SPECIAL_RETURNS | GOROUTINE_SWITCHERS | GOROUTINE_PARKERS | PLT_HEADERS
"""Every function a rule names (the C engine is told which is which; also every PLT stub,
``NAME@plt``: see :func:`is_plt_stub`)."""


def is_plt_stub(function: str) -> bool:
    """A PLT stub (``strlen@plt``), which may jump to :data:`PLT_HEADERS`."""
    return function.endswith("@plt")


LandingPadLookup = Callable[[str, int], Sequence[tuple[int, int]]]
"""``(dso, ip) -> [(start, end), ...]``: the run-time address ranges of the call sites whose
exceptions land at ``ip`` (see ``decode/landing_pads.py``; the pipeline provides it)."""


def _stopped_in(th: _Thread, frames: list[Handle], i: int) -> bool:
    """Is ``frames[i]`` where its stack stopped: the top frame, or the one right below an
    [untraced]/[syscall] gap frame?"""
    top = len(frames) - 1
    return i == top or (
        i == top - 1 and bool(th.fd[frames[top][_IX] * _FIELDS + _FLAGS] & _SYNTHETIC)
    )


def _after_call(th: _Thread, frame: Handle, ip: int) -> bool:
    """Does a return to ``ip`` land right after the call that created ``frame`` (or is
    that call unknown)? A return elsewhere is an exception's way out (OCaml's raise through
    ``caml_raise_exn``, the unwinder's return to a landing pad), not a return to the caller."""
    site: int = th.fd[frame[_IX] * _FIELDS + _CALLSITE] & _MASK64
    return site == 0 or 0 < ip - site <= _MAX_INSN


def _count(th: _Thread, insns: int, cycles: int) -> None:
    """Add an event's instruction/cycle counts; they hold from the next slot on."""
    th.cum_insns += insns
    th.cum_cycles += cycles
    slot = len(th.log)
    slots = th.update_slots
    if slots and slots[-1] == slot:
        th.insn_counts[-1] = th.cum_insns
        th.cycle_counts[-1] = th.cum_cycles
    else:
        slots.append(slot)
        th.insn_counts.append(th.cum_insns)
        th.cycle_counts.append(th.cum_cycles)


class TraceSegmentEngine:
    """Folds events into per-thread call histories; :meth:`finish` returns the Timeline.

    ``keep_slots`` keeps each slice's start/end slot (for transcript tests).
    ``spread_by_instructions``: a run of equal times is spread by the instructions in it
    (not by equal shares of its calls): for events whose times are their thread's cumulative
    counts (the C engine's other time axes), and for perf times where every event's count is
    exact (instruction detail), perf's clock moving at packets the events do not show.
    """

    def __init__(
        self,
        *,
        keep_slots: bool = False,
        spread_by_instructions: bool = False,
        max_examples: int = 5,
        landing_pads: LandingPadLookup | None = None,
        inline: InlineNodes | None = None,
    ) -> None:
        self._landing_pads = landing_pads
        self._threads: dict[tuple[int, int], _Thread] = {}
        self._last_key: tuple[int, int] | None = None
        self._last_thread: _Thread | None = None
        self.stats = EngineStats()
        self._keep_slots = keep_slots
        self._by_instructions = spread_by_instructions
        self._lines_seen = False  # some event had instruction detail
        self._max_examples = max_examples
        self.slot_columns: dict[tuple[int, int], tuple[npt.NDArray[np.int64], ...]] = {}
        self._orphan_errors: list[DecodeError] = []
        self._comms: dict[tuple[int, int], str] = {}
        self._finished = False
        self._inline = inline  # the inlined bodies the locations name (None: none)

    # ------------------------------------------------------------------ input

    def feed(self, event: Event | BranchBatch) -> None:
        """Consume one event of any type (or a batch of branches, one event at a time)."""
        if type(event) is BranchEvent:
            self._branch(event)
        elif isinstance(event, DecodeError):
            self.decode_error(event)
        elif isinstance(event, PowerEvent):
            self._power(event)
        elif isinstance(event, CommEvent):
            self._comm(event)
        elif isinstance(event, BranchBatch):
            if event.locations.inline is not None:
                self._inline = event.locations.inline
            self.feed_all(event.events())
        elif isinstance(event, StackSample):
            self.stats.ignored += 1
        else:
            raise TypeError(f"not an event: {event!r}")

    def feed_all(self, events: Iterable[Event | BranchBatch]) -> None:
        """Consume a stream of events.

        The fast path: the common cases (a call, a return to the parent, a jump inside a
        function) are handled inline; everything else goes through the same handlers as
        :meth:`feed`, so both give identical results (a property test checks it).
        """
        with _gc_paused():
            count = self._feed_loop(events)
        self.stats.events += count
        self.stats.branches += count

    def _feed_loop(self, events: Iterable[Event | BranchBatch]) -> int:
        branch_event = BranchEvent
        feed = self.feed
        slow = self._branch
        apply = self._apply
        thread_of = self._thread
        call, ret, jump, cjump, no_change = _CALL, _RETURN, _JUMP, _CJUMP, _ST_NONE
        special = SPECIAL_RETURNS
        mask, max_insn = _MASK64, _MAX_INSN
        th: _Thread | None = None
        ctxs: list[_Context] = []
        fd = array("q")
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
                th = thread_of(cur_pid, cur_tid, ev.gap_time or ev.time)
                ctxs = th.ctxs
                fd = th.fd  # extended in place: the same array for the thread's life
            if ev.in_tx or th.txq or th.held is not None or self._inline is not None:
                slow(ev)  # (inlined bodies: every rule through _apply_at)
                continue
            count += 1
            t = ev.time
            if t < th.last_time:
                t = th.last_time
            else:
                th.last_time = t
            if ev.gap_time:
                _gap_and_count(th, ev, t)
            elif ev.insn_count or ev.cycle_count:
                _count(th, ev.insn_count, ev.cycle_count)
            if ev.lines is not None:
                self._lines_seen = True
                if ev.lines:
                    th.line_updates.append((len(th.log), ev.lines))
            kind = ev.kind
            if ev.state != no_change:
                apply(th, ev, t)
            elif kind == call:
                src = ev.src
                dst = ev.dst
                fn = dst.function
                if fn == src.function and 0 < dst.ip - src.ip <= _MAX_INSN:
                    continue  # `call next; pop` (see _apply)
                frames = ctxs[-1].frames
                if not frames or frames[-1][_FN] != src.function:
                    frames = self._sync_source(th, src, t).frames
                log = th.log
                names = th.names
                entry = dst.entry
                site = src.ip
                if entry >= _SIGN or site >= _SIGN:  # kernel addresses
                    entry = entry - _WRAP if entry >= _SIGN else entry
                    site = site - _WRAP if site >= _SIGN else site
                caller = frames[-1][_IX]
                th.fd.extend((caller, len(log), -1, entry, 0, site))
                if th.armed and caller in th.armed:  # (see _Thread.guard)
                    th.armed.discard(caller)
                    th.guard[caller] = src.ip
                frames.append([fn, len(names)])
                names.append(fn)
                log.append(t * 4 + _CALL_SLOT)
            elif kind == ret:
                frames = ctxs[-1].frames
                if (
                    len(frames) >= 2
                    and frames[-2][_FN] == ev.dst.function
                    and ev.src.function not in special
                    and (  # _after_call, inline
                        not (site := fd[frames[-1][1] * 6 + 5] & mask)
                        or 0 < ev.dst.ip - site <= max_insn
                    )
                ):
                    log = th.log
                    th.fd[frames.pop()[_IX] * _FIELDS + _END] = len(log)
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

        What follows is stitched to what came before exactly as after a decode error; the
        break takes no time, so a stitched decode equals an unbroken one. A segment that
        does not continue an older stack starts at its first frame, as any segment starts:
        with a segment-start slot (at least 1 ns), never at the break (see _first_frame). A
        thread with no open frame is left as it is: there is nothing to stitch to, and the
        frames it finds later were running since its segment started, break or not.
        """
        for th in self._threads.values():
            if th.held is not None:
                # Held with the branches, in order: the break takes no time, and what
                # follows it goes on on the same stacks (a decode in windows must settle
                # a landing as an unbroken one does).
                th.held.events.append(SEGMENT_BREAK)
                if len(th.held.events) >= LOOKAHEAD_EVENTS:
                    self._settle(th)
            else:
                self._break_body(th)

    def _break_body(self, th: _Thread) -> None:
        cur = th.ctxs[-1]
        if not cur.frames and cur.detached:
            return
        slot = len(th.log)
        th.log.append(th.last_time * 4)
        self._break(th, slot)
        th.ctxs[-1].after_break = True

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
        self._settle_all(th)
        time = err.time if err.time is not None else th.last_time
        if time < th.last_time:
            time = th.last_time
        th.last_time = time
        slot = len(th.log)
        th.log.append(time * 4 + _START_SLOT)
        th.instants.append((slot, f"[decode error: {err.message}]"))
        th.txq.clear()  # whether a pending transaction committed is unknowable now
        self._break(th, slot)

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
        if th.held is not None:
            # A counter sample says nothing of the stack: held with the branches, in
            # order (a decoder that shows more of them must not settle a landing sooner).
            th.held.events.append(ev)
            if len(th.held.events) >= LOOKAHEAD_EVENTS:
                self._settle(th)
            return
        self._power_body(th, ev)

    def _power_body(self, th: _Thread, ev: PowerEvent) -> None:
        t = ev.time if ev.time > th.last_time else th.last_time
        th.last_time = t
        th.counters.append((len(th.log), "CPU frequency (MHz)", ev.freq_mhz))
        th.log.append(t * 4)

    # ---------------------------------------------------------- the branch

    def _branch(self, ev: BranchEvent) -> None:
        stats = self.stats
        stats.events += 1
        stats.branches += 1
        # A thread's first branch may carry the time of jumps before it (dropped by the
        # decoder): the thread's history, and the function it was in, start there.
        th = self._thread(ev.pid, ev.tid, ev.gap_time or ev.time)
        if th.held is not None:
            self._hold(th, ev)
        else:
            self._branch_body(th, ev)

    def _branch_body(self, th: _Thread, ev: BranchEvent) -> None:
        t = ev.time
        if t < th.last_time:
            t = th.last_time
        th.last_time = t
        if ev.gap_time:
            _gap_and_count(th, ev, t)
        elif ev.insn_count or ev.cycle_count:
            _count(th, ev.insn_count, ev.cycle_count)
        if ev.lines is not None:
            self._lines_seen = True
            if ev.lines:
                th.line_updates.append((len(th.log), ev.lines))
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
                    # Replayed at its own time, but never before what the thread has
                    # logged since (a power event or decode error in between) nor after now.
                    logged = th.log[-1] >> 2
                    tq = q.time if q.time > logged else logged
                    self._apply_at(th, q, tq if tq <= t else t)
        self._apply_at(th, ev, t)

    def _apply_at(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        """:meth:`_apply`, and the inlined bodies the branch leaves and enters: its source
        runs in its inlined bodies (without instruction detail, that is where the decoders
        first see them), its target in its own (``Location.inline``)."""
        if self._inline is None:
            self._apply(th, ev, t)
            return
        if ev.state == _ST_NONE:
            self._inline_at(th, ev.src, t)
        self._apply(th, ev, t)
        if ev.state != _ST_END:
            self._inline_at(th, ev.dst, t)

    def _inline_at(self, th: _Thread, loc: Location, t: int) -> None:
        """Control is at ``loc``: if the top frame runs its function, the inlined bodies
        open in it become ``loc``'s."""
        frames = th.ctxs[-1].frames
        if not frames or frames[-1][_FN] != loc.function:
            return
        ix = frames[-1][_IX]
        chain = th.inl.get(ix, [])
        if loc.inline != (chain[-1][0] if chain else 0):
            self._inline_to(th, ix, chain, loc.inline, t, loc.ip)

    def _inline_to(
        self, th: _Thread, ix: int, chain: list[tuple[int, int]], node: int, t: int, addr: int
    ) -> None:
        """Frame ``ix`` now runs in inlined body ``node`` (0: the function itself): the
        inlined frames it leaves end and those it enters begin (at ``addr``), at one slot at
        ``t``: a call slot when one begins (it lasts at least 1 ns before anything starts)."""
        assert self._inline is not None
        parents = self._inline.parents

        def depth(x: int) -> int:
            d = 0
            while x:
                x = parents[x]
                d += 1
            return d

        a, b = chain[-1][0] if chain else 0, node
        da, db = depth(a), depth(b)
        while da > db:
            a, da = parents[a], da - 1
        while db > da:
            b, db = parents[b], db - 1
        while a != b:
            a, b = parents[a], parents[b]
        slot = self._slot(th, t, _CALL_SLOT if node != a else 0)
        while chain and chain[-1][0] != a:
            th.fd[chain.pop()[1] * _FIELDS + _END] = slot
        path = []
        x = node
        while x != a:
            path.append(x)
            x = parents[x]
        names = self._inline.names
        for x in reversed(path):
            up = chain[-1][1] if chain else ix
            chain.append((x, _new_frame(th, names[x], up, slot, addr, _INLINED)[_IX]))
        if chain:
            th.inl[ix] = chain
        else:
            th.inl.pop(ix, None)

    def _apply(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        kind = ev.kind
        state = ev.state
        src = ev.src
        dst = ev.dst
        if state == _ST_NONE:
            if kind == _CALL:
                if dst.function == src.function and 0 < dst.ip - src.ip <= _MAX_INSN:
                    # `call next; pop`: reads the PC, not a call. Only inside one function:
                    # a call to the next function in memory (is_even calling is_odd, placed
                    # right after it) lands just as close, and is a call.
                    return
                frames = th.ctxs[-1].frames
                if not frames or frames[-1][_FN] != src.function:
                    frames = self._sync_source(th, src, t).frames
                slot = len(th.log)
                th.log.append(t * 4 + _CALL_SLOT)
                parent = frames[-1][_IX]
                inner = _inner(th, parent)
                frames.append(_new_frame(th, dst.function, inner, slot, dst.entry, 0, src.ip))
                if th.armed and parent in th.armed:
                    th.armed.discard(parent)
                    th.guard[parent] = src.ip
            elif kind == _RETURN:
                frames = th.ctxs[-1].frames
                if (
                    len(frames) >= 2
                    and frames[-2][_FN] == dst.function
                    and src.function not in SPECIAL_RETURNS
                    and _after_call(th, frames[-1], dst.ip)
                ):
                    self._close(th, frames.pop(), self._slot(th, t))
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
            elif kind == _INLINE:
                pass  # _apply_at's
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
        if frames and frames[-1][_FN] == fn:
            return ctx
        if frames and fn in PLT_HEADERS and is_plt_stub(frames[-1][_FN]):
            # The stub jumped to PLT0, and the decoders dropped that jump as one inside a
            # function: perf (6.1) names both after the symbol before the PLT, and the
            # decoders drop by perf's names. The stub goes on there; nothing was lost.
            return ctx
        if frames:
            for i in range(len(frames) - 2, -1, -1):
                if frames[i][_FN] == fn:
                    # Frames above returned without us seeing it (lost data).
                    self._unexpected(th, f"branch from {fn} while in {frames[-1][_FN]}")
                    self._close_above(th, ctx, i, self._slot(th, t), _OPEN_AT_END)
                    return ctx
        if self._land(th, fn, t):
            return th.ctxs[-1]
        if frames:
            self._unexpected(th, f"branch from {fn}, which is not on the stack")
            ctx = self._push_detached(th, t)
        # The function we are in was entered before we could see it.
        self._first_frame(th, ctx, src, _INFERRED, t)
        return ctx

    def _return_slow(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        if ev.src.function in STACK_SWITCHERS:
            self._stack_switch(th, ev.dst, t)
            return
        ctx = th.ctxs[-1]
        frames = ctx.frames
        if ev.src.function in SETJMPS and len(frames) >= 2 and frames[-2][_FN] == ev.dst.function:
            self._close(th, frames.pop(), self._slot(th, t))
            armed = frames[-1][_IX]
            th.resume[armed] = ev.dst.ip
            th.armed.add(armed)
            th.guard.pop(armed, None)
            return
        frames = ctx.frames
        dst = ev.dst
        fn = dst.function
        if not frames:
            # The segment begins with a return: the function returning was running since
            # the segment started.
            ctx = self._sync_source(th, ev.src, t)
            frames = ctx.frames
            if len(frames) >= 2 and frames[-2][_FN] == fn:
                self._close(th, frames.pop(), self._slot(th, t))
                return
        # Right after the call: the return goes past the caller (names matched it
        # otherwise). Elsewhere: an exception's way out, which may land in the caller.
        below = 3 if _after_call(th, frames[-1], dst.ip) else 2
        i = self._resumed_frame(th, frames, len(frames) - below, dst)
        if i >= 0:
            if self._look_ahead(th, len(th.ctxs) - 1, i, dst, t):
                return
            # A return past several frames (exception unwinding, longjmp via ret).
            self._close_above(th, ctx, i, self._slot(th, t), 0)
            return
        top = frames[-1]
        callsite = th.fd[top[_IX] * _FIELDS + _CALLSITE] & _MASK64
        if callsite and 0 < dst.ip - callsite <= _MAX_INSN and len(frames) > 1:
            # It returns right after its call, into a differently named function: an
            # assembly label inside the caller (ld.so's `_start` / `_dl_start_user`). The
            # caller carries on; from now on events name it by the label.
            self._close(th, frames.pop(), self._slot(th, t))
            frames[-1][_FN] = fn
            return
        if self._land(th, fn, t, at=dst):
            return
        if len(frames) == 1:
            self._add_root(th, ctx, dst, t)
            return
        # A return into a function that is nowhere on a non-empty stack: data was lost.
        self._unexpected(th, f"return to {fn}, which is not on the stack")
        ctx = self._push_detached(th, t)
        self._first_frame(th, ctx, dst, _INFERRED, t)

    def _stack_switch(self, th: _Thread, dst: Location, t: int) -> None:
        """A return from swapcontext/setcontext: control goes on on another stack.

        Names say nothing here (two coroutines suspended in the same function look alike),
        so the stack it lands on must be known exactly: an older context whose top frame is
        a switch call that returns to this very address, and only one. That context's
        switch call ends here and what ran since (other stacks) nests under it. Otherwise
        the stack is one we have not seen: a new segment, whose frames are discovered as
        they return; the stack we leave keeps its frames open until control comes back.
        """
        ctxs = th.ctxs
        found = -1
        for ci in range(len(ctxs) - 2, -1, -1):
            frames = ctxs[ci].frames
            if frames and frames[-1][_FN] in STACK_SWITCHERS:
                site = th.fd[frames[-1][_IX] * _FIELDS + _CALLSITE] & _MASK64
                if site and 0 < dst.ip - site <= _MAX_INSN:
                    if found >= 0:
                        found = -1  # two stacks wait there: which one resumes is unknown
                        break
                    found = ci
        if found >= 0:
            target = ctxs[found].frames
            self._land_on(th, found, len(target) - 1, t)
            self._close(th, target.pop(), self._slot(th, t))
            return
        ctx = self._push_detached(th, t)
        ctx.switched_in = True
        # At a function's first instruction, a coroutine's first run: its start is exact.
        self._first_frame(th, ctx, dst, 0 if dst.offset == 0 else _INFERRED, t)

    def _jump(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        """A jump between functions: tail call, unwind (longjmp) or leaf replacement."""
        dst = ev.dst
        fn = dst.function
        if ev.src.function in GOROUTINE_SWITCHERS and fn not in GOROUTINE_SWITCHERS:
            self._goroutine_switch(th, ev, t)
            return
        ctx = th.ctxs[-1]
        # Only a known symbol has boundaries: a jump into unknown code (a PLT header, a
        # stripped library) says nothing about the frames further up, even if they are
        # unknown code of the same library.
        if dst.offset > 0:
            frames = ctx.frames
            i = self._resumed_frame(th, frames, len(frames) - 2, dst)
            if i >= 0:
                if self._look_ahead(th, len(th.ctxs) - 1, i, dst, t):
                    return
                # Into the middle of a caller: longjmp, landing pad, OCaml raise.
                self._close_above(th, ctx, i, self._slot(th, t), 0)
                return
            if self._land(th, fn, t, at=dst):
                return
        ctx = self._sync_source(th, ev.src, t)
        frames = ctx.frames
        if frames[-1][_FN] == fn:
            return
        # A tail call (jump to the start of another function, PLT stubs), or a jump into
        # the middle of an unrelated function: the leaf is replaced.
        slot = self._slot(th, t, _CALL_SLOT)
        old = frames.pop()
        self._close(th, old, slot)
        parent = th.fd[old[_IX] * _FIELDS + _PARENT]
        # The new function returns where the old one would have: same call site.
        site = th.fd[old[_IX] * _FIELDS + _CALLSITE] & _MASK64
        frame = _new_frame(th, fn, parent, slot, dst.entry, 0, site)
        frames.append(frame)
        if len(frames) == 1:
            ctx.toplevel.append(frame[_IX])

    def _goroutine_switch(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        """Go's ``gogo`` jumps to where a goroutine's stack goes on.

        Into a function of the current stack, but not where a goroutine parks (the caller of
        a pending ``mcall``): the same goroutine goes on there (after ``morestack`` grew its
        stack, or where a panic was recovered), and the frames above end. Otherwise it is
        another goroutine, or a new one: which one cannot be told (every goroutine parked
        through ``mcall`` waits at the same address, and the trace has no stack pointer), so
        every frame of the thread ends here and a new stack begins; its callers appear as
        it returns into them, and a goroutine's first run starts exactly at its function.
        """
        dst = ev.dst
        ctx = self._sync_source(th, ev.src, t)
        frames = ctx.frames
        if dst.offset > 0:
            for i in range(len(frames) - 2, -1, -1):
                if frames[i][_FN] == dst.function:
                    if frames[i + 1][_FN] in GOROUTINE_PARKERS:
                        break
                    self._close_above(th, ctx, i, self._slot(th, t), 0)
                    return
        slot = self._slot(th, t, _START_SLOT)
        self._end_every_frame(th, slot)
        ctxs = th.ctxs
        ctxs[:] = [_Context(-1, True, slot)]  # in place: feed_all holds the list
        self.stats.segments_started += 1
        self._first_frame(th, ctxs[0], dst, 0 if dst.offset == 0 else _INFERRED, t)

    def _enter_nested(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        """Syscall / interrupt entry with kernel tracing: a new stack on top of this frame."""
        ctx = self._sync_source(th, ev.src, t)
        slot = self._slot(th, t, _CALL_SLOT)
        nested = _Context(_inner(th, ctx.frames[-1][_IX]), False, slot)
        th.ctxs.append(nested)
        frame = _new_frame(th, ev.dst.function, nested.parent, slot, ev.dst.entry, 0)
        nested.frames.append(frame)
        nested.toplevel.append(frame[_IX])

    def _long_return(self, th: _Thread, dst: Location, t: int) -> None:
        """sysret / iret: back to where the kernel was entered (any context)."""
        fn = dst.function
        ctx = th.ctxs[-1]
        frames = ctx.frames
        for i in range(len(frames) - 2, -1, -1):
            if frames[i][_FN] == fn:
                self._close_above(th, ctx, i, self._slot(th, t), 0)
                return
        if self._land(th, fn, t):
            return
        if not frames:
            self._first_frame(th, ctx, dst, _INFERRED, t)
            return
        # The kernel was entered before the trace began: the user function it returns to
        # was running underneath all of it.
        self._add_root(th, ctx, dst, t)

    def _trace_end(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        kind = ev.kind
        ctx = self._sync_source(th, ev.src, t)
        if kind == _RETURN and len(ctx.frames) >= 2:
            # The return executed; its target (the caller) is where tracing stopped.
            self._close(th, ctx.frames.pop(), self._slot(th, t))
        elif kind in (_SYSRET, _IRET) and len(th.ctxs) > 1 and not ctx.detached:
            # Back to the interrupted stack, which is not traced.
            slot = self._slot(th, t)
            for f in ctx.frames:
                self._close(th, f, slot)
            th.ctxs.pop()
            ctx = th.ctxs[-1]
            if not ctx.frames:
                return
        name = SYNTHETIC_SYSCALL if kind == _SYSCALL else SYNTHETIC_UNTRACED
        flags = _SYNTHETIC | (_AFTER_CALL if kind == _CALL else 0)
        if kind in _KERNEL_ENTRIES:
            flags |= _KERNEL_ENTRY
        slot = self._slot(th, t, _CALL_SLOT)
        ctx.frames.append(_new_frame(th, name, _inner(th, ctx.frames[-1][_IX]), slot, 0, flags))

    def _trace_start(self, th: _Thread, ev: BranchEvent, t: int) -> None:
        dst = ev.dst
        fn = dst.function
        # Tracing that resumes at a function's first instruction can only resume the frame
        # it stopped in; anywhere else it is a new activation (a signal handler that runs
        # again while an older run of it waits further down the stack).
        entry = dst.offset == 0
        ctx = th.ctxs[-1]
        frames = ctx.frames
        if not frames:
            if not self._land(th, fn, t, entry):
                self._first_frame(th, ctx, dst, _INFERRED, t)
            return
        top = frames[-1]
        if top[_FN] == fn:
            return  # a repeated `tr strt` where we already are
        for i in range(len(frames) - 2, -1, -1):
            if frames[i][_FN] == fn:
                if entry and not _stopped_in(th, frames, i):
                    break
                # Normally the frame just below [untraced]/[syscall]: tracing resumed where
                # it stopped. Further up: frames returned while untraced.
                self._close_above(th, ctx, i, self._slot(th, t), 0)
                return
        base = top[_IX] * _FIELDS
        if th.fd[base + _FLAGS] & _AFTER_CALL:
            # `tr end  call` then resume in a new function: that is the callee.
            top[_FN] = fn
            th.names[top[_IX]] = fn
            th.fd[base + _ADDR] = dst.entry - _WRAP if dst.entry >= _SIGN else dst.entry
            th.fd[base + _FLAGS] = 0
            return
        if self._land(th, fn, t, entry):
            return
        # Resumed somewhere unrelated to the stack (a signal handler, lost data): a new
        # segment, which stitching rejoins if control comes back to this stack. At a
        # function's first instruction the call starts right here: its start is exact.
        # Right after a kernel entry it is a signal handler, on top of the frame below.
        interrupts = bool(th.fd[base + _FLAGS] & _KERNEL_ENTRY) and len(frames) >= 2
        ctx = self._push_detached(th, t)
        ctx.interrupting = interrupts
        self._first_frame(th, ctx, dst, 0 if entry else _INFERRED, t)

    # ------------------------------------------------------ stack surgery

    @staticmethod
    def _slot(th: _Thread, t: int, flags: int = 0) -> int:
        slot = len(th.log)
        th.log.append(t * 4 + flags)
        return slot

    @staticmethod
    def _close(th: _Thread, frame: Handle, slot: int, flags: int = 0) -> None:
        base = frame[_IX] * _FIELDS
        th.fd[base + _END] = slot
        if flags:
            th.fd[base + _FLAGS] |= flags
        if th.inl:
            # the inlined bodies open in it end with it
            for _, k in th.inl.pop(frame[_IX], ()):
                th.fd[k * _FIELDS + _END] = slot
                th.fd[k * _FIELDS + _FLAGS] |= flags & _OPEN_AT_END

    def _close_above(self, th: _Thread, ctx: _Context, index: int, slot: int, flags: int) -> None:
        frames = ctx.frames
        for f in frames[index + 1 :]:
            self._close(th, f, slot, flags)
        del frames[index + 1 :]

    def _first_frame(self, th: _Thread, ctx: _Context, loc: Location, flags: int, t: int) -> Handle:
        """The first frame of an empty context (its call was not seen), at time ``t``.

        A context begun by a segment break starts its segment here (the break took no
        time): with a segment-start slot, so that its frames are never empty.
        """
        if ctx.after_break:
            self._break(th, self._slot(th, t, _START_SLOT))
        frame = _new_frame(th, loc.function, ctx.parent, ctx.start_slot, loc.entry, flags)
        ctx.frames.append(frame)
        ctx.toplevel.append(frame[_IX])
        return frame

    def _push_detached(self, th: _Thread, t: int) -> _Context:
        """End the current segment here; what follows is a new, detached one."""
        self._break(th, self._slot(th, t, _START_SLOT))
        return th.ctxs[-1]

    def _break(self, th: _Thread, slot: int) -> None:
        cur = th.ctxs[-1]
        if not cur.frames and cur.detached:
            cur.start_slot = slot
            cur.after_break = False
            return
        cur.suspend_slot = slot
        th.ctxs.append(_Context(-1, True, slot))
        self.stats.segments_started += 1

    def _add_root(self, th: _Thread, ctx: _Context, loc: Location, t: int) -> None:
        """Return out of the context's bottom frame into a never-seen caller."""
        slot = self._slot(th, t)
        root = _new_frame(th, loc.function, ctx.parent, ctx.start_slot, loc.entry, _INFERRED)
        fd = th.fd
        for i in ctx.toplevel:
            fd[i * _FIELDS + _PARENT] = root[_IX]
        ctx.toplevel = [root[_IX]]
        for f in ctx.frames:
            self._close(th, f, slot)
        ctx.frames = [root]
        self.stats.roots_inferred += 1

    def _resumed_frame(self, th: _Thread, frames: list[Handle], top: int, dst: Location) -> int:
        """The frame at or below ``frames[top]`` that control resumes in at ``dst`` (in
        the middle of its function), or -1 if none is of that function.

        The nearest activation of the function, unless a farther one is known to resume
        exactly there: a setjmp returned to ``dst`` in it (a longjmp out of recursion), or
        its pending call is one whose exceptions land at ``dst`` (a catch in recursion).
        """
        fn = dst.function
        first = -1
        for i in range(top, -1, -1):
            if frames[i][_FN] == fn:
                if first >= 0:
                    break  # two activations: which one resumes needs a closer look
                first = i
        else:
            return first
        ranges: Sequence[tuple[int, int]] | None = None
        fd = th.fd
        for i in range(first, -1, -1):
            if frames[i][_FN] != fn:
                continue
            ix = frames[i][_IX]
            if th.resume.get(ix) == dst.ip:
                return i
            if self._landing_pads is not None and i + 1 < len(frames):
                if ranges is None:
                    ranges = self._landing_pads(dst.dso, dst.ip)
                site = fd[frames[i + 1][_IX] * _FIELDS + _CALLSITE] & _MASK64
                if any(a <= site < b for a, b in ranges):
                    return i
        return first

    # ------------------------------------------------------------ lookahead

    def _follow(self, th: _Thread, held: _Lookahead, ev: BranchEvent) -> bool:
        """Follow one held event on every stack the events fit so far (see _Lookahead).
        False: an event this cannot follow (the landing must be settled before it)."""
        if ev.in_tx or ev.state not in (_ST_NONE, _ST_START, _ST_END):
            return False
        out: list[_Hypothesis] = []
        for h in held.hypotheses:
            fits = self._follow_on(th, held, h, ev)
            if fits is None:
                return False  # (the hypotheses stay as they were: settled on those)
            out += fits
        if not out:
            return False  # it fits none (a jump into a cold part): settled on those before
        if len(out) > 1 and ev.kind in (_JUMP, _CJUMP) and ev.dst.offset > 0:
            # A longjmp may leave the same stack twice: what follows fits both alike, so
            # only the nearer candidate's can be the one chosen (see nearest).
            same: dict[tuple[int, tuple[tuple[str, int], ...]], _Hypothesis] = {}
            for h in out:
                key = (h.top, tuple(h.above))
                if key not in same or h.candidate < same[key].candidate:
                    same[key] = h
            if len(same) > MAX_HYPOTHESES:
                return False
            out = list(same.values())
        held.hypotheses = out
        return True

    def _follow_on(
        self, th: _Thread, held: _Lookahead, h: _Hypothesis, ev: BranchEvent
    ) -> list[_Hypothesis] | None:
        """The stacks ``h`` becomes after ``ev``: [h] changed in place, [] if ``ev`` does
        not fit it, several for a longjmp to one of several armed frames; None: an event
        this cannot follow."""
        above = h.above
        state = ev.state
        if state == _ST_END:
            above.append(_GAP)  # an untraced gap: tracing resumes on top of it
            return [h]
        if state == _ST_START:
            if above and not above[-1][0]:
                above.pop()
                return [h]
            return None
        kind = ev.kind
        src = ev.src
        dst = ev.dst
        if kind == _INLINE:
            return [h]  # no branch: every stack as it was
        if kind == _CALL:
            if not (dst.function == src.function and 0 < dst.ip - src.ip <= _MAX_INSN):
                above.append((dst.function, 0))
            return [h]
        if kind == _RETURN:
            if above:
                if not above[-1][0]:
                    return None
                above.pop()
                caller = above[-1][0] if above else th.ctxs[held.ctx_index].frames[h.top][_FN]
                if caller and caller != dst.function:
                    return []  # not to its caller: not this stack
                if src.function in SETJMPS and above and caller:
                    above[-1] = (dst.function, dst.ip)  # a resume point armed since
                return [h]
            if src.function in SPECIAL_RETURNS:
                return None
            frames = th.ctxs[held.ctx_index].frames
            top = h.top
            if (
                top >= 1
                and frames[top - 1][_FN] == dst.function
                and _after_call(th, frames[top], dst.ip)
            ):
                h.top = top - 1
                return [h]
            return []
        if kind in (_JUMP, _CJUMP):
            if dst.function == src.function:
                return [h]
            if above and above[-1][0] and dst.offset == 0:
                above[-1] = (dst.function, 0)  # a tail call above the landing
                return [h]
            if dst.offset > 0:
                return self._follow_jump(th, held, h, dst)
        return None

    def _follow_jump(
        self, th: _Thread, held: _Lookahead, h: _Hypothesis, dst: Location
    ) -> list[_Hypothesis] | None:
        """A jump into the middle of a function among the held events (another longjmp, a
        landing pad): to every frame of ``h`` armed at ``dst``, pushed since the landing or
        below it; if none is, to the frame _resumed_frame picks; if none is of its
        function, the frame on top is replaced. None: one past an untraced gap, or one that
        replaces the landed frame."""
        fn = dst.function
        ip = dst.ip
        above = h.above
        armed_above: list[int] = []
        nearest = -1
        for a in range(len(above) - 1, -1, -1):
            if not above[a][0]:
                if nearest < 0:
                    return None  # past an untraced gap: what ran there is unknown
                break
            if above[a][0] == fn:
                nearest = a if nearest < 0 else nearest
                if above[a][1] == ip:
                    armed_above.append(a)
        else:
            frames = th.ctxs[held.ctx_index].frames
            armed_below = [
                j
                for j in range(h.top, -1, -1)
                if frames[j][_FN] == fn and th.resume.get(frames[j][_IX]) == ip
            ]
            if armed_above or armed_below:
                return [_Hypothesis(h.candidate, h.top, above[: a + 1]) for a in armed_above] + [
                    _Hypothesis(h.candidate, j, []) for j in armed_below
                ]
            if nearest < 0:
                j = self._resumed_frame(th, frames, h.top, dst)
                if j >= 0:
                    return [_Hypothesis(h.candidate, j, [])]
                if above:
                    above[-1] = (fn, 0)  # into an unrelated function: the leaf is replaced
                    return [h]
                return None
        if armed_above:
            return [_Hypothesis(h.candidate, h.top, above[: a + 1]) for a in armed_above]
        del above[nearest + 1 :]
        return [h]

    def _look_ahead(self, th: _Thread, ci: int, fi: int, dst: Location, t: int) -> bool:
        """A landing at ``dst`` in frame ``fi`` of context ``ci``: if farther activations
        of its function armed the same resume point, hold the landing and the events that
        follow until they tell which one it is (see _Lookahead). Returns True if held."""
        frames = th.ctxs[ci].frames
        resume = th.resume
        ip = dst.ip
        if resume.get(frames[fi][_IX]) != ip:
            return False
        fn = dst.function
        candidates = [fi] + [
            j
            for j in range(fi - 1, -1, -1)
            if frames[j][_FN] == fn and resume.get(frames[j][_IX]) == ip
        ]
        if len(candidates) < 2:
            return False
        # Those still inside the call their setjmp protects come first (the nearest of
        # them is the landing when what follows cannot tell); a frame that has moved on to
        # other calls has most likely left the protected code.
        candidates.sort(key=lambda j: not self._inside_guard(th, frames, j))
        th.held = _Lookahead(ci, candidates, t)
        return True

    @staticmethod
    def _inside_guard(th: _Thread, frames: list[Handle], j: int) -> bool:
        """Is frame ``j`` inside the first call it made after its setjmp returned?"""
        guard = th.guard.get(frames[j][_IX])
        if guard is None or j + 1 >= len(frames):
            return False
        site: int = th.fd[frames[j + 1][_IX] * _FIELDS + _CALLSITE] & _MASK64
        return site == guard & _MASK64

    def _hold(self, th: _Thread, ev: BranchEvent) -> None:
        held = th.held
        assert held is not None
        held.events.append(ev)
        followed = self._follow(th, held, ev)
        if not followed or len(held.events) >= LOOKAHEAD_EVENTS or held.decided():
            self._settle(th)

    def _settle_all(self, th: _Thread) -> None:
        """Settle until nothing is held (the held events, as they run, may land ambiguously
        again): before anything that is not a branch of the thread."""
        while th.held is not None:
            self._settle(th)

    def _settle(self, th: _Thread) -> None:
        """Land where the held events say (the nearest candidate that fits them, or the
        nearest of all if none does), then run the held events."""
        held = th.held
        if held is None:
            return
        th.held = None
        fi = held.nearest()
        if held.ctx_index == len(th.ctxs) - 1:  # in the current context (nothing held moved it)
            ctx = th.ctxs[held.ctx_index]
            self._close_above(th, ctx, fi, self._slot(th, held.time), 0)
        else:
            self._land_on(th, held.ctx_index, fi, held.time)
        for ev in held.events:
            if not isinstance(ev, BranchEvent):  # a counter sample or a segment break
                if th.held is not None:
                    th.held.events.append(ev)
                elif isinstance(ev, PowerEvent):
                    self._power_body(th, ev)
                else:
                    self._break_body(th)
            elif th.held is not None:
                self._hold(th, ev)  # the events landed again ambiguously
            else:
                self._branch_body(th, ev)

    def _land(
        self, th: _Thread, fn: str, t: int, entry: bool = False, at: Location | None = None
    ) -> bool:
        """Control arrived in ``fn``: if it is on an older context, return to it (stitching).

        Everything above the frame landed in is closed; detached segments in between become
        children of that frame (they ran while it was active). ``entry``: control arrived at
        the function's first instruction, which only the frame a context stopped in can be
        waiting at.
        """
        ctxs = th.ctxs
        for ci in range(len(ctxs) - 2, -1, -1):
            if ctxs[ci + 1].switched_in:
                break  # older contexts are other stacks
            target = ctxs[ci]
            tframes = target.frames
            if at is not None:
                fi = self._resumed_frame(th, tframes, len(tframes) - 1, at)
            else:
                for fi in range(len(tframes) - 1, -1, -1):
                    if tframes[fi][_FN] == fn:
                        break
                else:
                    fi = -1
            if fi < 0:
                continue
            if entry and not _stopped_in(th, tframes, fi):
                continue
            if at is not None and self._look_ahead(th, ci, fi, at, t):
                return True
            self._land_on(th, ci, fi, t)
            return True
        return False

    def _land_on(self, th: _Thread, ci: int, fi: int, t: int) -> None:
        """Make frame ``fi`` of context ``ci`` current (see :meth:`_land`)."""
        ctxs = th.ctxs
        target = ctxs[ci]
        tframes = target.frames
        landed = _inner(th, tframes[fi][_IX])  # (stitched under its innermost inlined body)
        end = self._slot(th, t)
        fd = th.fd
        interrupted = False  # the context above interrupts the one being closed
        for j in range(len(ctxs) - 1, ci, -1):
            c = ctxs[j]
            self._end_frames(th, c, 0, end, 0, interrupted)
            interrupted = False
            if c.detached:
                parent = landed
                if c.interrupting:
                    # A handler that did not return to where it interrupted (siglongjmp):
                    # it ran on top of the interrupted frame, which ended only now.
                    parent = fd[ctxs[j - 1].frames[-1][_IX] * _FIELDS + _PARENT]
                    interrupted = True
                else:
                    end = ctxs[j - 1].suspend_slot
                for i in c.toplevel:
                    fd[i * _FIELDS + _PARENT] = parent
                self.stats.stitched += 1
        # Left by a jump out of a handler, they end exactly; otherwise where nothing saw it.
        self._end_frames(th, target, fi + 1, end, 0 if interrupted else _OPEN_AT_END, interrupted)
        del tframes[fi + 1 :]
        del ctxs[ci + 1 :]
        target.suspend_slot = -1

    def _end_frames(
        self, th: _Thread, ctx: _Context, index: int, end: int, flags: int, interrupted: bool
    ) -> None:
        """Close ``ctx``'s frames from ``index`` up at slot ``end`` (with ``flags``); when a
        handler interrupted the context, its top [syscall]/[untraced] frame ended where the
        handler began, and the frames below it ran until ``end``."""
        frames = ctx.frames
        top = len(frames)
        if interrupted:
            top -= 1
            if top >= index:
                self._close(th, frames[top], ctx.suspend_slot, _OPEN_AT_END)
        for f in frames[index:top]:
            self._close(th, f, end, flags)

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

    def _close_all(self, th: _Thread) -> None:
        self._settle_all(th)
        self._end_every_frame(th, self._slot(th, th.last_time))

    def _end_every_frame(self, th: _Thread, end: int) -> None:
        """Close every open frame of the thread at slot ``end``: a detached context's where
        the one above it began (its frames stopped there)."""
        ctxs = th.ctxs
        interrupted = False
        for j in range(len(ctxs) - 1, -1, -1):
            c = ctxs[j]
            self._end_frames(th, c, 0, end, _OPEN_AT_END, interrupted)
            c.frames = []
            interrupted = False
            if j > 0 and c.detached:
                if c.interrupting:
                    # A handler still running: on top of the frame it interrupted.
                    parent = th.fd[ctxs[j - 1].frames[-1][_IX] * _FIELDS + _PARENT]
                    for i in c.toplevel:
                        th.fd[i * _FIELDS + _PARENT] = parent
                    interrupted = True
                else:
                    end = ctxs[j - 1].suspend_slot

    def _thread_timeline(self, th: _Thread, names: dict[str, int]) -> ThreadTimeline:
        n = len(th.names)
        intern = names.setdefault
        fd = np.frombuffer(th.fd, dtype=np.int64).reshape(n, _FIELDS)
        # A slice of code without a symbol is named after the address it began at, unless
        # its start was inferred (model.entry_name).
        slice_names = [
            entry_name(x, int(fd[i, _ADDR]))
            if is_unknown_code(x) and not fd[i, _FLAGS] & _INFERRED
            else x
            for i, x in enumerate(th.names)
        ]
        timeline, start_slots, end_slots = build_thread_timeline(
            pid=th.pid,
            tid=th.tid,
            name=th.name,
            fd=fd,
            name_ids=np.array([intern(x, len(names)) for x in slice_names], dtype=np.int32),
            log=np.frombuffer(th.log, dtype=np.int64),
            update_slots=np.array(th.update_slots, dtype=np.int64),
            insn_counts=np.array(th.insn_counts, dtype=np.int64),
            cycle_counts=np.array(th.cycle_counts, dtype=np.int64),
            line_updates=th.line_updates if self._lines_seen else None,
            instants=th.instants,
            counters=th.counters,
            by_instructions=self._by_instructions,
        )
        if self._keep_slots:
            self.slot_columns[(th.pid, th.tid)] = (start_slots, end_slots)
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
            fd = np.frombuffer(th.fd, dtype=np.int64).reshape(-1, _FIELDS)
            if np.any(fd[:, _END] < 0):
                i = int(np.flatnonzero(fd[:, _END] < 0)[0])
                raise AssertionError(f"tid {th.tid}: frame {th.names[i]} never closed")
            if np.any(fd[:, _END] < fd[:, _START]):
                i = int(np.flatnonzero(fd[:, _END] < fd[:, _START])[0])
                raise AssertionError(f"tid {th.tid}: frame {th.names[i]} ends before start")
            log = np.frombuffer(th.log, dtype=np.int64) >> 2
            if np.any(np.diff(log) < 0):
                raise AssertionError(f"tid {th.tid}: time goes backwards")
        self.check_timeline(timeline)

    @staticmethod
    def check_timeline(timeline: Timeline) -> None:
        """The finished trace's own invariants: nesting, name ids in range."""
        for tt in timeline.threads:
            try:
                check_nesting(tt)
            except NestingError as e:
                raise AssertionError(f"tid {tt.tid}: {e}") from e
            if len(tt) and int(tt.name_id.max()) >= len(timeline.names):
                raise AssertionError("name id out of range")


def build_thread_timeline(
    *,
    pid: int,
    tid: int,
    name: str,
    fd: npt.NDArray[np.int64],
    name_ids: npt.NDArray[np.int32],
    log: npt.NDArray[np.int64],
    update_slots: npt.NDArray[np.int64],
    insn_counts: npt.NDArray[np.int64],
    cycle_counts: npt.NDArray[np.int64],
    instants: Sequence[tuple[int, str]],
    counters: Sequence[tuple[int, str, int]],
    depths: npt.NDArray[np.int32] | None = None,
    line_updates: Sequence[tuple[int, tuple[int, ...]]] | None = None,
    by_instructions: bool = False,
) -> tuple[ThreadTimeline, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The final pass over one thread's closed history (shared by both engines).

    ``fd``: the frames' fields, one row of six per frame (``_PARENT`` ... ``_CALLSITE``;
    only the low 8 bits of ``_FLAGS`` are slice flags); ``name_ids``: each frame's index
    into the timeline's names; ``log``: the slot log (``time*4 + flags``); the count
    updates as sparse cumulative values with strictly increasing slots; ``instants`` and
    ``counters`` by slot. ``depths`` may be given when already known (it must equal
    ``_depths(fd[:, _PARENT])``). Returns the thread's timeline and each slice's start and
    end slot, in slice order.
    """
    times = _slot_times(
        log, _slot_instructions(len(log), update_slots, insn_counts) if by_instructions else None
    )
    n = fd.shape[0]
    start_slot = fd[:, _START]
    end_slot = fd[:, _END]
    if depths is None:
        depths = _depths(fd[:, _PARENT])
    order = _start_depth_order(times[start_slot], depths)
    start_slot = start_slot[order]
    end_slot = end_slot[order]
    insns = np.full(n, -1, dtype=np.int64)
    cycles = np.full(n, -1, dtype=np.int64)
    if len(update_slots) and n:
        # Index of the update in force at each slot (the last one at or before it).
        at_slot = np.zeros(max(len(log), int(update_slots[-1]) + 1), dtype=np.int64)
        at_slot[update_slots] = np.arange(1, len(update_slots) + 1)
        np.maximum.accumulate(at_slot, out=at_slot)
        at_slot -= 1
        at_start = at_slot[start_slot]
        at_end = at_slot[end_slot]
        insns = _counter_delta(insn_counts, at_start, at_end)
        cycles = _counter_delta(cycle_counts, at_start, at_end)
        # A slice that ended before the thread's first count has none (as a streaming
        # engine, which writes it before any count is known, says).
        uncounted = end_slot < update_slots[0]
        insns[uncounted] = -1
        cycles[uncounted] = -1
    timeline = ThreadTimeline(
        pid=pid,
        tid=tid,
        name=name,
        start=times[start_slot],
        end=times[end_slot],
        depth=depths[order],
        name_id=name_ids[order],
        address=fd[:, _ADDR][order].view(np.uint64),
        instructions=insns,
        cycles=cycles,
        flags=(fd[:, _FLAGS][order] & 0xFF).astype(np.uint8),
        instants=[Instant(int(times[s]), text) for s, text in instants],
        counters=[CounterSample(int(times[s]), text, v) for s, text, v in counters],
        icache_lines=None if line_updates is None else _icache(line_updates, start_slot, end_slot),
    )
    return timeline, start_slot, end_slot


def _icache(
    updates: Sequence[tuple[int, tuple[int, ...]]],
    start_slot: npt.NDArray[np.int64],
    end_slot: npt.NDArray[np.int64],
) -> npt.NDArray[np.int64]:
    """Each slice's i-cache footprint, by definition: the distinct code lines of the events
    between its start and end slot (an update at slot p lies in (start, end] as counts
    do), -1 for a slice that ended before the thread's first lines. Plain, not fast: the
    reference the streaming engine's merging is checked against."""
    at = [p for p, _ in updates]
    out = np.full(len(start_slot), -1, dtype=np.int64)
    for i, (s, e) in enumerate(zip(start_slot.tolist(), end_slot.tolist(), strict=True)):
        if not at or e < at[0]:
            continue
        seen: set[int] = set()
        for k in range(bisect_right(at, s), bisect_right(at, e)):
            seen.update(updates[k][1])
        out[i] = len(seen)
    return out


def _start_depth_order(start: npt.NDArray[np.int64], depth: npt.NDArray[np.int32]) -> Any:
    """The permutation sorting slices by (start, depth), ties in frame order.

    Equal to ``np.lexsort((depth, start))``, but one stable sort of a combined key when
    it fits in 63 bits: frames are created almost in start order, which the sort exploits.
    """
    if not len(start):
        return np.zeros(0, dtype=np.intp)
    lo = int(start.min())
    span = int(start.max()) - lo + 1
    deepest = int(depth.max()) + 1
    if span * deepest >= 1 << 62 or int(depth.min()) < 0:
        return np.lexsort((depth, start))
    key = (start - lo) * deepest + depth
    return np.argsort(key, kind="stable")


def _slot_instructions(
    n: int, update_slots: npt.NDArray[np.int64], insn_counts: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """The thread's instruction count in force at each of its ``n`` slots and after the
    last one (``n + 1`` values)."""
    if not len(update_slots):
        return np.zeros(n + 1, dtype=np.int64)
    at = np.zeros(max(n + 1, int(update_slots[-1]) + 1), dtype=np.int64)
    at[update_slots] = np.arange(1, len(update_slots) + 1)
    np.maximum.accumulate(at, out=at)
    counts = np.concatenate([np.zeros(1, dtype=np.int64), insn_counts])
    return counts[at[: n + 1]]


def _slot_times(
    log: npt.NDArray[np.int64], insns: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.int64]:
    """Turn a thread's slot log into nanoseconds (see "Time" in the module docstring).

    ``insns`` (when the times are counts: the C engine's other time axes): the instruction
    count in force at each slot and after the last; a run of equal times is then spread by
    the instructions in it. (Not on the time axis: perf's clock moves at a packet
    somewhere among a kept branch's instructions, which the events do not say.)"""
    raw = log
    t = raw >> 2
    n = t.shape[0]
    same = t[1:] == t[:-1]
    if same.any():
        # Spread each run of equal timestamps over the interval to the next timestamp:
        # calls taking equal shares, or (counts as times) in proportion to the
        # instructions run since the run's first slot, where it ran some up to the next
        # slot. Only slots in runs longer than one are touched.
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
        if insns is None:
            insns = np.zeros(n + 1, dtype=np.int64)
        first_insns = insns[idx[run_first]]
        ran = (insns[after_run] - first_insns)[run_id]
        by_insns = ran > 0
        before = np.where(by_insns, insns[idx] - first_insns[run_id], before_in_run)
        shares = np.where(by_insns, ran, np.maximum(calls_in_run[run_id], 1))
        span = (next_t - run_t[run_first])[run_id]
        if len(span) and int(span.max()) * int(before.max()) >= 1 << 62:
            # (as the C engine's 128-bit product)
            exact = [
                s * b // d
                for s, b, d in zip(span.tolist(), before.tolist(), shares.tolist(), strict=True)
            ]
            t[idx] += np.array(exact, dtype=np.int64)
        else:
            t[idx] += span * before // shares
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
