"""The event model: what a decoder produces and the reconstruction engine consumes.

Pure data and pure functions only. Nothing here does I/O or imports from the rest of the
package, so every stage can depend on it.

Hot-path note: events are ``@dataclass(slots=True)`` (not frozen: frozen dataclasses cost
4x more to build), and decoders are expected to share one :class:`Location` object per
address, so an event costs one allocation.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from itertools import pairwise
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt

__all__ = [
    "COUNT_BUDGET",
    "DAMAGED_DATA",
    "IN_TX_FLAG",
    "NOWHERE",
    "SYNTHETIC_SYSCALL",
    "SYNTHETIC_UNTRACED",
    "TIME_LIMIT",
    "UNKNOWN_SYMBOL",
    "BranchBatch",
    "BranchEvent",
    "BranchFlags",
    "BranchKind",
    "CommEvent",
    "DecodeError",
    "Event",
    "InlineNodes",
    "Location",
    "LocationTable",
    "PowerEvent",
    "StackSample",
    "TraceState",
    "branch_flags",
    "classify_flags",
    "entry_name",
    "function_key",
    "is_unknown_code",
]

UNKNOWN_SYMBOL: Final = "[unknown]"
"""Symbol name perf prints when it cannot resolve an address."""
SYNTHETIC_UNTRACED: Final = "[untraced]"
"""Name of the frame that stands for a gap in the trace (``tr end`` ... ``tr strt``)."""
SYNTHETIC_SYSCALL: Final = "[syscall]"
"""Name of the frame that stands for a system call under user-only tracing."""

TIME_LIMIT: Final = 1 << 61
"""Perf times (ns) are below this: 73 years after the clock started. The C engine keeps a
time and two flag bits in one int64, so a decoder reads a later time as damaged data (a
decode error), never as an event."""
COUNT_BUDGET: Final = 1 << 52
"""The most instructions plus cycles one decode (one ``perf script`` run) may report in
all, about 17 days of one core at 3 GHz, more than perf decodes in weeks. A thread's
totals are int64 in the C engine (and times, below :data:`TIME_LIMIT`, on the
instructions axis): within this budget they stay in range even summed over hundreds of
parallel windows. A decoder reads counts past it as damaged data (a decode error)."""
DAMAGED_DATA: Final = "damaged data"
"""How the message of a decode error that stands for numbers out of these ranges begins
(whichever decoder read them)."""


class BranchFlags(IntFlag):
    """perf's branch flags, bit for bit ``PERF_DLFILTER_FLAG_*`` / ``PERF_IP_FLAG_*``."""

    BRANCH = 1 << 0
    CALL = 1 << 1
    RETURN = 1 << 2
    CONDITIONAL = 1 << 3
    SYSCALLRET = 1 << 4
    ASYNC = 1 << 5
    INTERRUPT = 1 << 6
    TX_ABORT = 1 << 7
    TRACE_BEGIN = 1 << 8
    TRACE_END = 1 << 9
    IN_TX = 1 << 10
    VMENTRY = 1 << 11
    VMEXIT = 1 << 12
    INTR_DISABLE = 1 << 13
    INTR_TOGGLE = 1 << 14
    INLINE = 1 << 30
    """ptscope's own, not perf's: no branch but the first instruction of another inlined
    body (the decoders split blocks there with instruction detail; src and dst are that
    instruction)."""


class BranchKind(IntEnum):
    """What kind of control transfer a branch event is."""

    NONE = 0
    CALL = 1
    RETURN = 2
    JUMP = 3
    CONDITIONAL_JUMP = 4
    SYSCALL = 5
    SYSRET = 6
    HARDWARE_INTERRUPT = 7
    IRET = 8
    SOFTWARE_INTERRUPT = 9
    ASYNC = 10
    TX_ABORT = 11
    VMENTRY = 12
    VMEXIT = 13
    INLINE = 14
    """Not a branch: control enters or leaves an inlined body (:attr:`BranchFlags.INLINE`)."""


class TraceState(IntEnum):
    """Whether tracing started or stopped at this branch (perf's ``tr strt`` / ``tr end``)."""

    NONE = 0
    START = 1
    END = 2


def _strip_cold(symbol: str) -> str:
    # GCC moves unlikely paths (error paths, C++ landing pads) into a separate symbol
    # ``f.cold``; control enters it by plain jumps from ``f``, so it is part of ``f``'s frame.
    return symbol[:-5] if symbol.endswith(".cold") else symbol


def function_key(symbol: str, dso: str) -> str:
    """The name that identifies a function for stack reconstruction (and names its frame).

    Unresolved code is grouped per DSO so that jumps inside it are not mistaken for calls.
    """
    if not symbol or symbol == UNKNOWN_SYMBOL:
        return f"[unknown] ({dso})" if dso else UNKNOWN_SYMBOL
    return _strip_cold(symbol)


_UNKNOWN_IN: Final = UNKNOWN_SYMBOL + " ("
_MASK64: Final = (1 << 64) - 1  # an address stored signed (a kernel one) shown unsigned


def is_unknown_code(function: str) -> bool:
    """Whether ``function`` (a :func:`function_key`) stands for code without a symbol."""
    return function == UNKNOWN_SYMBOL or (
        function.startswith(_UNKNOWN_IN) and function.endswith(")")
    )


def entry_name(function: str, entry: int) -> str:
    """The name of a slice of code without a symbol that began at address ``entry``:
    ``[unknown @ 0xENTRY (DSO)]``, as magic-trace names it.

    For the engine such code is one function per DSO (:func:`function_key`), so that a
    jump inside it is not taken for a call; but a call into it begins at a function's
    entry, so naming each slice after that address tells the functions of a stripped
    binary apart. ``function`` must be unknown code (:func:`is_unknown_code`)."""
    at = f"[unknown @ {entry & _MASK64:#x}"
    return at + "]" if function == UNKNOWN_SYMBOL else f"{at} {function[len(_UNKNOWN_IN) - 1 :]}]"


@dataclass(slots=True)
class Location:
    """An instruction address and what it resolves to.

    ``offset`` is the offset from the symbol's start (``-1`` when the symbol is unknown);
    ``function`` (see :func:`function_key`) and ``entry`` (the function's entry address) are
    derived; ``function`` is what the engine compares.
    """

    ip: int
    symbol: str = UNKNOWN_SYMBOL
    offset: int = -1
    dso: str = ""
    inline: int = field(default=0, compare=False, repr=False)
    """The innermost inlined body at ``ip``: a node of the decode's :class:`InlineNodes`
    (0: none; set by :meth:`LocationTable.add`)."""
    function: str = field(init=False, compare=False)
    entry: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        self.function = function_key(self.symbol, self.dso)
        # The function's entry address when the symbol is known, else the address itself.
        self.entry = self.ip - self.offset if self.offset >= 0 else self.ip

    @property
    def is_function_start(self) -> bool:
        return self.offset == 0

    def __str__(self) -> str:
        off = f"+{self.offset:#x}" if self.offset >= 0 else ""
        dso = f" ({self.dso})" if self.dso else ""
        return f"{self.ip:#x} {self.symbol}{off}{dso}"


NOWHERE: Final = Location(0, "", -1, "")
"""The location perf reports as ``0``: the source of ``tr strt``, the target of ``tr end``."""


@dataclass(slots=True)
class BranchEvent:
    """One decoded branch of one thread.

    ``time`` is perf time in nanoseconds. ``insn_count`` / ``cycle_count`` are the
    instructions and cycles since the previous count update of this thread (perf's
    ``insn_cnt`` / ``cyc_cnt``); 0 means "not known". ``gap_time`` is the time of the first
    jump the decoder dropped (inside one function) after this thread's previous branch, when
    it was later than that branch (0: none): the earliest perf time seen in between, which
    bounds how long the previous branches' timestamp lasted. ``gap_insns``: with a gap time,
    how many of ``insn_count``'s instructions ran up to and including that dropped jump
    (where perf's clock moved on; 0: not known).

    With instruction detail (``--dlarg insns`` / the text decoder's ``insns``),
    ``insn_count`` is exact: the instructions the thread executed after its previous
    branch event up to and including this branch's source instruction (not included when
    the branch is asynchronous: an interrupt, or the end of tracing, whose source is where
    the thread would resume), jumps the decoder dropped included; and ``lines`` holds the
    distinct 64-byte code lines (address >> 6, ascending) those instructions touched.
    ``lines`` is None without instruction detail.
    """

    pid: int
    tid: int
    time: int
    kind: BranchKind
    state: TraceState
    src: Location
    dst: Location
    in_tx: bool = False
    insn_count: int = 0
    cycle_count: int = 0
    gap_time: int = 0
    lines: tuple[int, ...] | None = None
    gap_insns: int = 0


@dataclass(slots=True)
class DecodeError:
    """perf could not decode part of the trace (``instruction trace error``).

    Every field but the message may be unknown: perf omits time, pid or ip for some errors.
    """

    pid: int | None
    tid: int | None
    time: int | None
    ip: int | None
    message: str
    code: int = 0


@dataclass(slots=True)
class PowerEvent:
    """A core-to-bus ratio change (``cbr``): the CPU frequency from this point on."""

    pid: int
    tid: int
    time: int
    cbr: int
    freq_mhz: int


@dataclass(slots=True)
class StackSample:
    """One sampled call stack (sampling backend). ``frames`` run from the root to the leaf."""

    pid: int
    tid: int
    time: int
    frames: tuple[Location, ...]
    event: str = ""
    period: int = 0


@dataclass(slots=True)
class CommEvent:
    """A thread got its name (``comm``), at creation or at ``exec``."""

    pid: int
    tid: int
    time: int | None
    comm: str
    exec: bool = False


Event: TypeAlias = BranchEvent | DecodeError | PowerEvent | StackSample | CommEvent


_KIND_STATE_CACHE: dict[int, tuple[BranchKind, TraceState]] = {}
_IGNORED_BITS: Final = (
    BranchFlags.TRACE_BEGIN
    | BranchFlags.TRACE_END
    | BranchFlags.IN_TX
    | BranchFlags.INTR_DISABLE
    | BranchFlags.INTR_TOGGLE
)


def _classify(flags: int) -> tuple[BranchKind, TraceState]:
    F = BranchFlags
    if flags & F.INLINE:
        return BranchKind.INLINE, TraceState.NONE
    begin = bool(flags & F.TRACE_BEGIN)
    end = bool(flags & F.TRACE_END)
    if begin and end:
        # ``tr strt tr end``: tracing started and stopped at once; nothing executed.
        return BranchKind.NONE, TraceState.NONE
    state = TraceState.START if begin else TraceState.END if end else TraceState.NONE
    f = flags & ~_IGNORED_BITS
    if f & F.TX_ABORT:
        kind = BranchKind.TX_ABORT
    elif f & F.VMENTRY:
        kind = BranchKind.VMENTRY
    elif f & F.VMEXIT:
        kind = BranchKind.VMEXIT
    elif f & F.SYSCALLRET:
        kind = BranchKind.SYSCALL if f & F.CALL else BranchKind.SYSRET
    elif f & F.INTERRUPT:
        if f & F.RETURN:
            kind = BranchKind.IRET
        elif f & F.ASYNC:
            kind = BranchKind.HARDWARE_INTERRUPT
        else:
            kind = BranchKind.SOFTWARE_INTERRUPT
    elif f & F.ASYNC:
        kind = BranchKind.ASYNC
    elif f & F.CALL:
        kind = BranchKind.CALL
    elif f & F.RETURN:
        kind = BranchKind.RETURN
    elif f & F.CONDITIONAL:
        kind = BranchKind.CONDITIONAL_JUMP
    elif f & F.BRANCH:
        kind = BranchKind.JUMP
    else:
        kind = BranchKind.NONE
    return kind, state


def classify_flags(flags: int) -> tuple[BranchKind, TraceState]:
    """Map perf branch flags to (kind, trace state change). Cached: called once per event."""
    try:
        return _KIND_STATE_CACHE[flags]
    except KeyError:
        result = _KIND_STATE_CACHE[flags] = _classify(flags)
        return result


IN_TX_FLAG: Final = int(BranchFlags.IN_TX)

# Raw flags that classify_flags maps to each kind (plus TRACE_BEGIN/TRACE_END for the state).
_KIND_FLAGS: Final[dict[BranchKind, int]] = {
    BranchKind.NONE: 0,
    BranchKind.CALL: BranchFlags.BRANCH | BranchFlags.CALL,
    BranchKind.RETURN: BranchFlags.BRANCH | BranchFlags.RETURN,
    BranchKind.JUMP: BranchFlags.BRANCH,
    BranchKind.CONDITIONAL_JUMP: BranchFlags.BRANCH | BranchFlags.CONDITIONAL,
    BranchKind.SYSCALL: BranchFlags.BRANCH | BranchFlags.CALL | BranchFlags.SYSCALLRET,
    BranchKind.SYSRET: BranchFlags.BRANCH | BranchFlags.RETURN | BranchFlags.SYSCALLRET,
    BranchKind.HARDWARE_INTERRUPT: (
        BranchFlags.BRANCH | BranchFlags.CALL | BranchFlags.ASYNC | BranchFlags.INTERRUPT
    ),
    BranchKind.IRET: BranchFlags.BRANCH | BranchFlags.RETURN | BranchFlags.INTERRUPT,
    BranchKind.SOFTWARE_INTERRUPT: BranchFlags.BRANCH | BranchFlags.CALL | BranchFlags.INTERRUPT,
    BranchKind.ASYNC: BranchFlags.BRANCH | BranchFlags.ASYNC,
    BranchKind.TX_ABORT: BranchFlags.BRANCH | BranchFlags.TX_ABORT,
    BranchKind.VMENTRY: BranchFlags.BRANCH | BranchFlags.VMENTRY,
    BranchKind.VMEXIT: BranchFlags.BRANCH | BranchFlags.VMEXIT,
    BranchKind.INLINE: BranchFlags.INLINE,
}
_STATE_FLAGS: Final[dict[TraceState, int]] = {
    TraceState.NONE: 0,
    TraceState.START: BranchFlags.TRACE_BEGIN,
    TraceState.END: BranchFlags.TRACE_END,
}


def branch_flags(kind: BranchKind, state: TraceState, in_tx: bool = False) -> int:
    """Raw perf flags that :func:`classify_flags` maps to ``(kind, state)`` (its inverse)."""
    return int(_KIND_FLAGS[kind] | _STATE_FLAGS[state] | (IN_TX_FLAG if in_tx else 0))


_SIGN: Final = 1 << 63
_WRAP: Final = 1 << 64


class InlineNodes:
    """The inlined bodies a decode met, numbered (append-only; node 0 is none).

    A node is one inlined instance of a function (one ``DW_TAG_inlined_subroutine``):
    ``names[i]`` the inlined function, ``call_sites[i]`` where it was inlined
    (``file:line``), ``parents[i]`` the node it is inlined in (0: the out-of-line function
    itself). A :class:`LocationTable` says which node each location's instruction is in
    (the innermost)."""

    __slots__ = ("_ids", "call_sites", "names", "parents")

    def __init__(self) -> None:
        self.names: list[str] = [""]
        self.call_sites: list[str] = [""]
        self.parents = array("i", [0])
        self._ids: dict[object, int] = {}

    def __len__(self) -> int:
        return len(self.names)

    def add(self, key: object, name: str, call_site: str, parent: int) -> int:
        """The node of ``key`` (any hashable naming the instance: added once)."""
        found = self._ids.get(key)
        if found is not None:
            return found
        if not 0 <= parent < len(self.names):
            raise ValueError("an inlined body's parent must be added first")
        index = self._ids[key] = len(self.names)
        self.names.append(name)
        self.call_sites.append(call_site)
        self.parents.append(parent)
        return index


class LocationTable:
    """Append-only numbering of locations (id -> :class:`Location`) for columnar batches.

    One table is shared by the :class:`BranchBatch` es of a stream (or of several streams
    that are consumed together). Equal locations get one id and one shared object. Each
    location's ``function`` is interned as well (``function_ids[id]`` indexes
    ``functions``), and the fields a consumer compares are kept as flat columns:
    ``ips``, ``offsets`` and ``entries`` (the entry address as a wrapped signed 64-bit
    value, as the engine stores addresses).
    """

    __slots__ = (
        "_fn_ids",
        "_ids",
        "entries",
        "function_ids",
        "functions",
        "inline",
        "inline_nodes",
        "ips",
        "locations",
        "offsets",
    )

    def __init__(self) -> None:
        # The inlined body of each location (``inline_nodes[id]``, a node of ``inline``;
        # 0: none), when a decoder reads inline information (else ``inline`` is None).
        self.inline: InlineNodes | None = None
        self.inline_nodes = array("i")
        self.locations: list[Location] = []
        self.functions: list[str] = []
        self.function_ids = array("i")
        self.ips = array("Q")
        self.offsets = array("q")
        self.entries = array("q")
        self._ids: dict[tuple[int, str, int, str], int] = {}
        self._fn_ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.locations)

    def __getitem__(self, index: int) -> Location:
        return self.locations[index]

    def add(self, loc: Location, node: int = 0) -> int:
        """The id of ``loc`` (of an equal location added before, if any); ``node``: the
        inlined body its instruction is in (a node of :attr:`inline`)."""
        key = (loc.ip, loc.symbol, loc.offset, loc.dso)
        found = self._ids.get(key)
        if found is not None:
            return found
        index = len(self.locations)
        entry = loc.entry - _WRAP if loc.entry >= _SIGN else loc.entry
        fn = self._fn_ids.get(loc.function)
        if fn is None:
            fn = self._fn_ids[loc.function] = len(self.functions)
            self.functions.append(loc.function)
        # Columns first: a value out of range fails before the table changes.
        self.ips.append(loc.ip)
        try:
            self.offsets.append(loc.offset)
            self.entries.append(entry)
        except OverflowError:
            del self.ips[index:], self.offsets[index:]
            raise
        self.function_ids.append(fn)
        self.inline_nodes.append(node)
        if node:
            loc.inline = node
        self.locations.append(loc)
        self._ids[key] = index
        return index


Int32Array: TypeAlias = npt.NDArray[np.int32]
Int64Array: TypeAlias = npt.NDArray[np.int64]
UInt32Array: TypeAlias = npt.NDArray[np.uint32]
UInt64Array: TypeAlias = npt.NDArray[np.uint64]
UInt16Array: TypeAlias = npt.NDArray[np.uint16]


@dataclass(slots=True, eq=False)
class BranchBatch:
    """A run of branch events of one stream as columns (no Python object per event).

    Row ``i`` is the event ``BranchEvent(pid[i], tid[i], time[i], *classify_flags(flags[i]),
    locations[src[i]], locations[dst[i]], flags[i] & IN_TX, insn_count[i], cycle_count[i])``
    (:meth:`events` yields exactly these, with ``gap_time = time - gap_delta`` where
    ``gap_delta`` is non-zero). Column types: pid/tid/src/dst int32, time int64, flags
    uint32 (raw perf flags), insn_count/cycle_count uint64, gap_delta uint32.

    With instruction detail, the code lines of row ``i`` (:attr:`BranchEvent.lines`) are
    ``lines[line_offsets[i]:line_offsets[i + 1]]`` (CSR columns: ``line_offsets`` int32
    of length ``n + 1``, starting at 0, and ``lines`` uint64); both are None otherwise.
    """

    locations: LocationTable
    pid: Int32Array
    tid: Int32Array
    time: Int64Array
    flags: UInt32Array
    src: Int32Array
    dst: Int32Array
    insn_count: UInt64Array
    cycle_count: UInt64Array
    gap_delta: UInt32Array | None = None
    """``time - gap_time`` per row (0: no gap time), or None when no row has one."""
    line_offsets: Int32Array | None = None
    """Instruction detail: where each row's code lines start in ``lines`` (``n + 1``)."""
    lines: UInt64Array | None = None
    """Instruction detail: the code lines (address >> 6) of all rows, row after row."""
    gap_insns: UInt16Array | None = None
    """:attr:`BranchEvent.gap_insns` per row, or None when no row has one."""

    def __post_init__(self) -> None:
        n = len(self.pid)
        columns = (self.tid, self.time, self.flags, self.src, self.dst)
        if any(len(c) != n for c in (*columns, self.insn_count, self.cycle_count)):
            raise ValueError("branch batch columns differ in length")
        if self.gap_delta is not None and len(self.gap_delta) != n:
            raise ValueError("branch batch columns differ in length")
        if self.gap_insns is not None and len(self.gap_insns) != n:
            raise ValueError("branch batch columns differ in length")
        if (self.line_offsets is None) != (self.lines is None):
            raise ValueError("branch batch has line offsets or lines, not both")
        if self.line_offsets is not None and self.lines is not None:
            offsets = self.line_offsets  # (ascending: not checked, it costs a pass)
            if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(self.lines):
                raise ValueError("branch batch line offsets do not fit its lines")

    def __len__(self) -> int:
        return len(self.pid)

    def events(self) -> Iterator[BranchEvent]:
        """The batch as :class:`BranchEvent` objects (slow: one object per row)."""
        locs = self.locations.locations
        gaps = self.gap_delta.tolist() if self.gap_delta is not None else [0] * len(self)
        gap_insns = self.gap_insns.tolist() if self.gap_insns is not None else [0] * len(self)
        lines: list[tuple[int, ...] | None] = [None] * len(self)
        if self.line_offsets is not None and self.lines is not None:
            every = self.lines.tolist()
            bounds = self.line_offsets.tolist()
            lines = [tuple(every[a:b]) for a, b in pairwise(bounds)]
        for pid, tid, time, flags, src, dst, insns, cycles, gap, row_lines, gap_n in zip(
            self.pid.tolist(),
            self.tid.tolist(),
            self.time.tolist(),
            self.flags.tolist(),
            self.src.tolist(),
            self.dst.tolist(),
            self.insn_count.tolist(),
            self.cycle_count.tolist(),
            gaps,
            lines,
            gap_insns,
            strict=True,
        ):
            kind, state = classify_flags(flags)
            yield BranchEvent(
                pid,
                tid,
                time,
                kind,
                state,
                locs[src],
                locs[dst],
                bool(flags & IN_TX_FLAG),
                insns,
                cycles,
                time - gap if gap else 0,
                row_lines,
                gap_n if gap else 0,
            )

    @classmethod
    def from_events(cls, events: Iterable[BranchEvent], locations: LocationTable) -> BranchBatch:
        """Columns for ``events`` (their locations are added to ``locations``).

        The batch has line columns when any event has ``lines`` (an event with None gets
        no lines there)."""
        events = list(events)
        add = locations.add
        rows = [
            (
                e.pid,
                e.tid,
                e.time,
                branch_flags(e.kind, e.state, e.in_tx),
                add(e.src, e.src.inline),
                add(e.dst, e.dst.inline),
                e.insn_count,
                e.cycle_count,
                _gap_delta(e.time, e.gap_time),
                e.gap_insns if _gap_delta(e.time, e.gap_time) else 0,
            )
            for e in events
        ]
        cols = list(zip(*rows, strict=True)) if rows else [()] * 10
        line_offsets = lines = None
        if any(e.lines is not None for e in events):
            counts = [len(e.lines) if e.lines is not None else 0 for e in events]
            line_offsets = np.zeros(len(events) + 1, dtype=np.int32)
            np.cumsum(counts, out=line_offsets[1:])
            lines = np.array(
                [line for e in events if e.lines is not None for line in e.lines], dtype=np.uint64
            )
        return cls(
            locations,
            np.array(cols[0], dtype=np.int32),
            np.array(cols[1], dtype=np.int32),
            np.array(cols[2], dtype=np.int64),
            np.array(cols[3], dtype=np.uint32),
            np.array(cols[4], dtype=np.int32),
            np.array(cols[5], dtype=np.int32),
            np.array(cols[6], dtype=np.uint64),
            np.array(cols[7], dtype=np.uint64),
            np.array(cols[8], dtype=np.uint32),
            line_offsets,
            lines,
            np.array(cols[9], dtype=np.uint16),
        )


def _gap_delta(time: int, gap_time: int) -> int:
    """``time - gap_time`` as stored in 32 bits (0: none, or too far back to keep)."""
    delta = time - gap_time if gap_time else 0
    return delta if 0 < delta <= 0xFFFFFFFF else 0
