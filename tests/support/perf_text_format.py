"""Writing ``perf script`` text the way perf prints it, for parser tests and benchmarks.

Written from perf's documented output format (``builtin-script.c`` of perf 6.1: the
``%5d/%-5d`` thread, ``%5lu.%09llu:`` time, ``%10lu`` period, right-aligned event name,
``  %-21s `` flags, ``%16lx`` addresses; the flag names of the perf-script man page), and
independent of the parser: nothing here is imported from ``ptscope.decode``.
"""

from __future__ import annotations

from dataclasses import dataclass

# perf's sample_flags[] names, by flag bits (BRANCH=1, CALL=2, RETURN=4, CONDITIONAL=8,
# SYSCALLRET=16, ASYNC=32, INTERRUPT=64, TX_ABORT=128, TRACE_BEGIN=256, TRACE_END=512,
# VMENTRY=2048, VMEXIT=4096).
NAMED_FLAGS: dict[int, str] = {
    1 | 2: "call",
    1 | 4: "return",
    1 | 8: "jcc",
    1: "jmp",
    1 | 2 | 64: "int",
    1 | 4 | 64: "iret",
    1 | 2 | 16: "syscall",
    1 | 4 | 16: "sysret",
    1 | 32: "async",
    1 | 2 | 32 | 64: "hw int",
    1 | 128: "tx abrt",
    1 | 256: "tr strt",
    1 | 512: "tr end",
    1 | 2 | 2048: "vmentry",
    1 | 2 | 4096: "vmexit",
}
LETTERS = "bcrosyiABExghDt"
IN_TX, INTR_DISABLE, INTR_TOGGLE = 1 << 10, 1 << 13, 1 << 14
TRACE_BEGIN, TRACE_END = 1 << 8, 1 << 9
_XF = IN_TX | INTR_DISABLE | INTR_TOGGLE


def _name(flags: int) -> str | None:
    return NAMED_FLAGS.get(flags)


def format_flags(flags: int, style: str = "6.1") -> str:
    """The flags column text as perf prints it (before the ``  %-21s `` padding).

    ``style="6.1"``: perf 6.1's names (``tr strt``, ``tr end  call``...); ``"6.15"``:
    newer perf, which always spells the branch type after a ``tr strt``/``tr end`` prefix
    (``tr strt jmp``) and puts the ``(x)`` suffix after one space.
    """
    xs = ""
    if flags & _XF:
        xs = (
            "("
            + ("x" if flags & IN_TX else "")
            + ("D" if flags & INTR_DISABLE else "")
            + ("t" if flags & INTR_TOGGLE else "")
            + ")"
        )
    base = flags & ~_XF
    if style == "6.15":
        prefix = "tr strt " if base & TRACE_BEGIN else "tr end  " if base & TRACE_END else ""
        rest = base & ~(TRACE_BEGIN | TRACE_END)
        name = _name(rest)
        if name is not None:
            text = prefix + name
            return text + (f" {xs}" if xs else "")
    else:
        name = _name(base)
        if name is not None:
            return f"{name:<15}{xs:>6}"
        if base & TRACE_BEGIN:
            name = _name(base & ~TRACE_BEGIN)
            if name is not None:
                return f"tr strt {name:<7}{xs:>6}"
        if base & TRACE_END:
            name = _name(base & ~TRACE_END)
            if name is not None:
                return f"tr end  {name:<7}{xs:>6}"
    out = ""
    for i in range(32):
        if flags & (1 << i):
            out += LETTERS[i] if i < len(LETTERS) else "?"
    return out


@dataclass
class Loc:
    """An address as perf resolves it: ``symbol`` None = unresolved, ``dso`` None = no map."""

    ip: int
    symbol: str | None = None
    offset: int = 0
    dso: str | None = None


def format_location(loc: Loc) -> str:
    sym = "[unknown]" if loc.symbol is None else f"{loc.symbol}+{loc.offset:#x}"
    return f"{loc.ip:16x} {sym} ({loc.dso if loc.dso is not None else '[unknown]'})"


def format_header(pid: int, tid: int, time_ns: int, period: int, event: str, width: int) -> str:
    sec, ns = divmod(time_ns, 1_000_000_000)
    return f"{pid:5d}/{tid:<5d} {sec:5d}.{ns:09d}: {period:10d} {event:>{width}}: "


def branch_line(
    pid: int,
    tid: int,
    time_ns: int,
    flags: int,
    src: Loc,
    dst: Loc,
    *,
    event: str = "branches:uH",
    width: int = 11,
    style: str = "6.1",
) -> str:
    flags_text = format_flags(flags, style)
    return (
        format_header(pid, tid, time_ns, 1, event, width)
        + f"  {flags_text:<21} "
        + " "
        + format_location(src)
        + " => "
        + format_location(dst)
    )


def cbr_line(
    pid: int, tid: int, time_ns: int, cbr: int, freq: int, ip: Loc, *, flags: int = 0
) -> str:
    body = f" cbr: {cbr:2d} freq: {freq:4d} MHz ({100 * cbr // 36:3d}%) "
    body = f"{body:<34}"
    return (
        format_header(pid, tid, time_ns, 0, "cbr", 11)
        + f"  {format_flags(flags):<21} "
        + body
        + f"{0:16x}"
        + " "
        + format_location(ip)
    )


def psb_line(pid: int, tid: int, time_ns: int, offset: int, ip: Loc) -> str:
    body = f" psb offs: {offset:#x} "
    return (
        format_header(pid, tid, time_ns, 0, "psb", 11)
        + f"  {'':<21} "
        + f"{body:<34}"
        + f"{0:16x}"
        + " "
        + format_location(ip)
    )


def error_line(
    *,
    code: int,
    message: str,
    time_ns: int | None = None,
    cpu: int = 0,
    pid: int = -1,
    tid: int = -1,
    ip: int = 0,
    with_time: bool = True,
) -> str:
    """perf's AUXTRACE_ERROR line; ``with_time=False`` is the old (perf < 4.16) shape."""
    text = " instruction trace error type 1"
    if with_time:
        if time_ns:
            sec, ns = divmod(time_ns, 1_000_000_000)
            text += f" time {sec}.{ns:09d}"
        else:
            text += " time 0"
    ip_text = f"{ip:#x}" if ip else "0"
    return text + f" cpu {cpu} pid {pid} tid {tid} ip {ip_text} code {code}: {message}"


def sample_lines(
    pid: int, tid: int, time_ns: int, period: int, event: str, frames_leaf_first: list[Loc]
) -> list[str]:
    """A call-stack sample: the header, one TAB-indented line per frame, a blank line."""
    lines = [format_header(pid, tid, time_ns, period, event, len(event))]
    lines += ["\t" + format_location(f) for f in frames_leaf_first]
    return [*lines, ""]


@dataclass(frozen=True)
class LoopCut:
    """Where to cut a branch trace inside a loop: the lines before ``index`` are kept."""

    index: int
    pid: int
    tid: int
    time_ns: int
    """The time of the last line kept (a jump inside ``function``, later than the loop's
    first jump)."""
    function: str


def cut_inside_a_loop(lines: list[str]) -> LoopCut:
    """A place in the longest-lasting run of one thread's jumps inside one function
    (``jcc``/``jmp`` whose source and target have the same symbol), read from perf's text
    with a plain split: what a trace cut off there leaves open ran until the cut."""
    runs: list[tuple[int, int, int]] = []  # (duration, first index, last index)
    start = -1
    for i, line in enumerate([*lines, ""]):
        words = line.split()
        # PID/TID TIME: PERIOD EVENT: FLAGS IP SYM+OFF (DSO) => ADDR SYM+OFF (DSO)
        same = (
            len(words) > 10
            and words[4] in ("jcc", "jmp")
            and words[8] == "=>"
            and words[6].split("+")[0] == words[10].split("+")[0]
        )
        if same and start >= 0 and words[0] == lines[start].split()[0]:
            continue
        if start >= 0 and i - start > 4:
            runs.append((_time(lines[i - 1]) - _time(lines[start]), start, i - 1))
        start = i if same else -1
    _duration, first, last = max(runs)
    later = [j for j in range(first + 1, last) if _time(lines[j]) > _time(lines[first])]
    assert later, "no loop with time passing in this trace"
    j = later[len(later) // 2]
    words = lines[j].split()
    pid, tid = (int(x) for x in words[0].split("/"))
    return LoopCut(j + 1, pid, tid, _time(lines[j]), words[6].split("+")[0])


def _time(line: str) -> int:
    seconds, _, fraction = line.split()[1].rstrip(":").partition(".")
    return int(seconds) * 1_000_000_000 + int(fraction)
