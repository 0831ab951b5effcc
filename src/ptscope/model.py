"""The event model: what a decoder produces and the reconstruction engine consumes.

Pure data and pure functions only. Nothing here does I/O or imports from the rest of the
package, so every stage can depend on it.

Hot-path note: events are ``@dataclass(slots=True)`` (not frozen: frozen dataclasses cost
4x more to build), and decoders are expected to share one :class:`Location` object per
address, so an event costs one allocation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, IntFlag
from typing import Final, TypeAlias

__all__ = [
    "NOWHERE",
    "SYNTHETIC_SYSCALL",
    "SYNTHETIC_UNTRACED",
    "UNKNOWN_SYMBOL",
    "BranchEvent",
    "BranchFlags",
    "BranchKind",
    "CommEvent",
    "DecodeError",
    "Event",
    "Location",
    "PowerEvent",
    "StackSample",
    "TraceState",
    "classify_flags",
    "function_key",
]

UNKNOWN_SYMBOL: Final = "[unknown]"
"""Symbol name perf prints when it cannot resolve an address."""
SYNTHETIC_UNTRACED: Final = "[untraced]"
"""Name of the frame that stands for a gap in the trace (``tr end`` ... ``tr strt``)."""
SYNTHETIC_SYSCALL: Final = "[syscall]"
"""Name of the frame that stands for a system call under user-only tracing."""


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
    ``insn_cnt`` / ``cyc_cnt``); 0 means "not known".
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
