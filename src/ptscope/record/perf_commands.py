"""Pure functions that build every ``perf record`` argv ptscope runs (Intel PT and sampling).

Nothing here touches the system: callers pass in what was probed (perf version, page
size, the machine's maximum sample rate), so every option combination is unit-tested
against the argv perf's documentation (perf-record(1), perf-intel-pt(1)) says it needs.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ptscope.errors import UsageError

__all__ = [
    "DEFAULT_SAMPLING_FREQUENCY",
    "MAX_AUX_PAGES",
    "NORMAL_TIMER",
    "PT_CONFIG_TERMS",
    "CallgraphMode",
    "Control",
    "IntelPtRecordOptions",
    "SamplingRecordOptions",
    "SnapshotMode",
    "SnapshotSize",
    "Targets",
    "TimerResolution",
    "TraceScope",
    "format_size",
    "intel_pt_event",
    "intel_pt_record_argv",
    "parse_size",
    "parse_timer_resolution",
    "sampling_event",
    "sampling_record_argv",
    "snapshot_pages",
]

PAGE_SIZE: Final = 4096
MAX_AUX_PAGES: Final = 1 << 36  # 256 TiB of 4 KiB pages: far beyond any real buffer
DEFAULT_SAMPLING_FREQUENCY: Final = 10_000


class TraceScope(enum.Enum):
    """Which privilege levels are traced: the perf event modifier."""

    USER = "u"
    KERNEL = "k"
    BOTH = "uk"

    @property
    def includes_kernel(self) -> bool:
        return self is not TraceScope.USER

    @property
    def label(self) -> str:
        return {"u": "user", "k": "kernel", "uk": "user+kernel"}[self.value]


class SnapshotMode(enum.Enum):
    """How the Intel PT AUX buffer is used."""

    FULL = "full"
    """No ring buffer: everything is written (``--full-execution``)."""
    ON_REQUEST = "request"
    """Ring buffer, snapshots only when asked (``--snapshot``): function triggers."""
    AT_EXIT = "exit"
    """Ring buffer, plus a snapshot when perf stops (``--snapshot=e``, perf >= 5.4)."""


class CallgraphMode(enum.Enum):
    """How the sampling backend unwinds stacks (``perf record --call-graph``)."""

    FP = "fp"
    DWARF = "dwarf"
    LBR = "lbr"


# Intel PT config terms a user may set through --timer-resolution, with their range
# (perf-intel-pt(1): cyc/mtc/noretcomp are bits, the others 4-bit fields).
PT_CONFIG_TERMS: Final[dict[str, tuple[int, int]]] = {
    "cyc": (0, 1),
    "cyc_thresh": (0, 15),
    "mtc": (0, 1),
    "mtc_period": (0, 15),
    "noretcomp": (0, 1),
    "psb_period": (0, 15),
}


@dataclass(frozen=True)
class TimerResolution:
    """Timing precision: Intel PT config terms, or a sampling frequency.

    ``low`` keeps perf's defaults; ``normal`` adds cycle-accurate packets on every
    opportunity (``cyc=1,cyc_thresh=1,mtc_period=0``); ``high`` also disables return
    compression (``noretcomp=1``: a TIP on every return, so returns get exact times).
    ``custom`` is a list of config terms. For sampling, the presets are 1 kHz, 10 kHz
    and the machine's maximum sample rate.
    """

    name: str
    terms: tuple[tuple[str, int], ...] = ()

    def pt_config(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.terms)

    def sampling_frequency(self, max_sample_rate: int) -> int:
        if self.name == "low":
            return 1000
        if self.name == "high":
            return max(1, max_sample_rate)
        if self.name == "normal":
            return DEFAULT_SAMPLING_FREQUENCY
        raise UsageError(
            "custom Intel PT timer terms do not apply to the sampling backend",
            hint="use --timer-resolution low|normal|high with --backend sampling",
        )

    @property
    def uses_cyc(self) -> bool:
        return dict(self.terms).get("cyc", 0) == 1


_NORMAL_TERMS: Final = (("cyc", 1), ("cyc_thresh", 1), ("mtc_period", 0))
_PRESETS: Final = {
    "low": TimerResolution("low"),
    "normal": TimerResolution("normal", _NORMAL_TERMS),
    "high": TimerResolution("high", (*_NORMAL_TERMS, ("noretcomp", 1))),
}


NORMAL_TIMER: Final = _PRESETS["normal"]


def parse_timer_resolution(text: str) -> TimerResolution:
    """``low`` / ``normal`` / ``high``, or custom terms such as ``cyc=1,mtc_period=3``."""
    text = text.strip().lower()
    if text in _PRESETS:
        return _PRESETS[text]
    terms: list[tuple[str, int]] = []
    seen: set[str] = set()
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        key = key.strip()
        if key not in PT_CONFIG_TERMS:
            raise UsageError(
                f"--timer-resolution: unknown term {key!r}",
                hint="use low, normal, high or terms among " + ", ".join(PT_CONFIG_TERMS),
            )
        if key in seen:
            raise UsageError(f"--timer-resolution: {key} given twice")
        seen.add(key)
        try:
            number = int(value, 0) if eq else 1
        except ValueError:
            raise UsageError(f"--timer-resolution: {key}={value!r} is not a number") from None
        low, high = PT_CONFIG_TERMS[key]
        if not low <= number <= high:
            raise UsageError(f"--timer-resolution: {key} must be in {low}..{high}")
        terms.append((key, number))
    return TimerResolution("custom", tuple(terms))


_SIZE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from ``4M``, ``256K``, ``1.5MiB``, ``65536`` (binary units, as perf)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise UsageError(f"not a size: {text!r}", hint="write it like 4M, 256K or 1G")
    size = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not size < MAX_AUX_PAGES * PAGE_SIZE:
        raise UsageError(f"too large a size: {text!r}", hint="write it like 4M, 256K or 1G")
    return int(size)


def format_size(size: int) -> str:
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


@dataclass(frozen=True)
class SnapshotSize:
    """An AUX buffer size perf accepts: a power-of-two number of pages."""

    pages: int
    requested: int
    page_size: int = PAGE_SIZE

    @property
    def bytes(self) -> int:
        return self.pages * self.page_size

    @property
    def changed(self) -> bool:
        return self.bytes != self.requested

    def warning(self) -> str | None:
        if not self.changed:
            return None
        return (
            f"--snapshot-size {format_size(self.requested)} rounded to "
            f"{format_size(self.bytes)} ({self.pages} pages: perf needs a power of two)"
        )


def snapshot_pages(size: int, page_size: int = PAGE_SIZE) -> SnapshotSize:
    """Round a requested AUX size up to whole pages, then to a power-of-two page count."""
    pages = max(1, -(-size // page_size))
    pages = 1 << (pages - 1).bit_length()
    pages = min(pages, MAX_AUX_PAGES)
    return SnapshotSize(pages=pages, requested=size, page_size=page_size)


@dataclass(frozen=True)
class Targets:
    """What perf attaches to: processes (all their threads) or main threads only.

    perf's ``-p PIDS`` follows every thread (and threads created later); ``--per-thread
    -t PIDS`` traces only the threads whose TID is given (the main thread of each
    process), each with its own buffer so no thread eats another's lookback.
    """

    pids: tuple[int, ...]
    all_threads: bool = False
    placeholder: str = ""
    """Printed instead of the PIDs: a command shown before its process exists
    (``--print-perf-commands`` where nothing can be recorded)."""

    def argv(self) -> list[str]:
        if self.placeholder:
            ids = self.placeholder
        elif not self.pids:
            raise UsageError("nothing to record: no process given")
        else:
            ids = ",".join(str(p) for p in self.pids)
        return ["-p", ids] if self.all_threads else ["--per-thread", "-t", ids]


@dataclass(frozen=True)
class Control:
    """perf's control channel: ``--control=fifo:CTL,ACK`` (perf >= 5.10)."""

    ctl: Path
    ack: Path

    def argv(self) -> list[str]:
        return [f"--control=fifo:{self.ctl},{self.ack}"]


@dataclass(frozen=True)
class IntelPtRecordOptions:
    """Everything that shapes an Intel PT ``perf record``."""

    output: Path
    targets: Targets
    scope: TraceScope = TraceScope.USER
    timer: TimerResolution = NORMAL_TIMER
    snapshot: SnapshotMode = SnapshotMode.AT_EXIT
    snapshot_size: SnapshotSize | None = None
    multi_snapshot: bool = False
    control: Control | None = None
    kcore: bool = False
    start_disabled: bool = False


def intel_pt_event(scope: TraceScope, timer: TimerResolution) -> str:
    """``intel_pt/CONFIG/MODIFIERS`` (an empty config keeps perf's defaults)."""
    return f"intel_pt/{timer.pt_config()}/{scope.value}"


def intel_pt_record_argv(perf: str, opts: IntelPtRecordOptions) -> list[str]:
    """The ``perf record`` argv for an Intel PT recording."""
    if opts.multi_snapshot and opts.snapshot is SnapshotMode.FULL:
        raise UsageError("--multi-snapshot needs snapshot mode (drop --full-execution)")
    argv = [perf, "record", "-o", str(opts.output), "--timestamp"]
    argv.append(f"--event={intel_pt_event(opts.scope, opts.timer)}")
    if opts.multi_snapshot:
        # Each SIGUSR2 both snapshots and switches to a new perf.data.<timestamp>.
        argv.append("--switch-output=signal")
    argv += opts.targets.argv()
    if opts.snapshot is SnapshotMode.ON_REQUEST:
        argv.append("--snapshot")
    elif opts.snapshot is SnapshotMode.AT_EXIT:
        argv.append("--snapshot=e")
    if opts.start_disabled:
        argv += ["--delay=-1"]
    if opts.control is not None:
        argv += opts.control.argv()
    if opts.kcore:
        if not opts.scope.includes_kernel:
            raise UsageError("--kcore only makes sense with --kernel or --kernel-only")
        argv.append("--kcore")
    if opts.snapshot_size is not None:
        # "-m,N": default data pages, N AUX-area pages (perf-intel-pt(1)).
        argv.append(f"-m,{opts.snapshot_size.pages}")
    return argv


@dataclass(frozen=True)
class SamplingRecordOptions:
    """Everything that shapes a sampling (``perf record -g``) recording."""

    output: Path
    targets: Targets
    callgraph: CallgraphMode
    hardware_events: bool
    frequency: int = DEFAULT_SAMPLING_FREQUENCY
    scope: TraceScope = TraceScope.USER
    dwarf_stack_size: int | None = None
    control: Control | None = None
    start_disabled: bool = False


def sampling_event(hardware_events: bool, scope: TraceScope) -> str:
    """``cycles`` where the CPU's counters are usable, else the ``cpu-clock`` timer (VMs)."""
    return f"{'cycles' if hardware_events else 'cpu-clock'}:{scope.value}"


def sampling_record_argv(perf: str, opts: SamplingRecordOptions) -> list[str]:
    """The ``perf record`` argv for stack sampling."""
    if opts.frequency <= 0:
        raise UsageError("the sampling frequency must be positive")
    argv = [perf, "record", "-o", str(opts.output), "--timestamp"]
    argv.append(f"--event={sampling_event(opts.hardware_events, opts.scope)}")
    argv += ["-F", str(opts.frequency)]
    if opts.callgraph is CallgraphMode.DWARF and opts.dwarf_stack_size is not None:
        argv.append(f"--call-graph=dwarf,{opts.dwarf_stack_size}")
    else:
        argv.append(f"--call-graph={opts.callgraph.value}")
    argv += opts.targets.argv()
    if opts.start_disabled:
        argv += ["--delay=-1"]
    if opts.control is not None:
        argv += opts.control.argv()
    return argv
