"""Property tests: events written as perf text (by an independent formatter) parse back equal."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.decode.perf_text import PerfTextParser, parse_lines
from ptscope.model import (
    NOWHERE,
    UNKNOWN_SYMBOL,
    BranchEvent,
    DecodeError,
    Event,
    Location,
    PowerEvent,
    StackSample,
    classify_flags,
)
from support.perf_text_format import (
    IN_TX,
    NAMED_FLAGS,
    TRACE_BEGIN,
    TRACE_END,
    Loc,
    branch_line,
    cbr_line,
    error_line,
    psb_line,
    sample_lines,
)

# --------------------------------------------------------------------- strategies

# Identifiers start with a letter that is not a hex digit, as a real one cannot be mistaken
# for perf's address column; the other pieces are what demangled C++/Rust names contain.
# (Not a mangled name, `_Z...` or `_R...`: those are demangled, by design.)
_IDENT = st.from_regex(r"[g-zA-Z_][A-Za-z0-9_]{0,8}", fullmatch=True).filter(
    lambda name: not name.startswith(("_Z", "_R"))
)
_PIECE = st.one_of(
    _IDENT,
    st.sampled_from(
        [
            "::",
            "<",
            ">",
            ", ",
            " ",
            "(",
            ")",
            "&",
            "*",
            " => ",
            "=>",
            "+",
            "operator()",
            "operator+",
            "[abi:cxx11]",
            "{lambda(int)#1}",
            " const",
            " [clone .isra.0]",
            ".cold",
            "@plt",
            "+0x10",
        ]
    ),
)


@st.composite
def symbols(draw: st.DrawFn) -> str:
    text = draw(_IDENT) + "".join(draw(st.lists(_PIECE, max_size=8)))
    return " ".join(text.split())  # perf's names have no runs of spaces nor edge spaces


_DIR = st.from_regex(
    r"[A-Za-z0-9._-]{1,8}( [A-Za-z0-9._-]{1,6})?( \([a-z0-9]{1,5}\))?", fullmatch=True
)
dsos = st.one_of(
    st.builds(lambda parts: "/" + "/".join(parts), st.lists(_DIR, min_size=1, max_size=4)),
    st.sampled_from(["[kernel.kallsyms]", "[vdso]", "//anon", "[unknown]"]),
)


@st.composite
def locs(draw: st.DrawFn) -> Loc:
    if draw(st.integers(0, 20)) == 0:
        return Loc(0)  # "0 [unknown] ([unknown])": nowhere
    ip = draw(st.integers(1, (1 << 64) - 1))
    symbol = draw(st.one_of(st.none(), symbols()))
    offset = draw(st.integers(0, (1 << 32) - 1)) if symbol is not None else 0
    dso = draw(st.one_of(st.none(), dsos))
    return Loc(ip, symbol, offset, dso)


_XF = [0, IN_TX, 1 << 13, IN_TX | 1 << 14, IN_TX | 1 << 13 | 1 << 14]


@st.composite
def branch_flags(draw: st.DrawFn) -> int:
    if draw(st.booleans()):
        flags = draw(st.sampled_from(sorted(NAMED_FLAGS)))
        flags |= draw(st.sampled_from([0, TRACE_BEGIN, TRACE_END, TRACE_BEGIN | TRACE_END]))
    else:
        # Any combination of perf's 15 defined bits (perf prints letters for unnamed ones),
        # except CALL alone, whose letter "c" reads as a hex address.
        flags = draw(st.integers(0, (1 << 15) - 1).filter(lambda f: f & ~_ALL_XF != 2))
    return flags | draw(st.sampled_from(_XF))


_ALL_XF = IN_TX | 1 << 13 | 1 << 14
times = st.integers(0, 10**15)
ids = st.integers(0, 4_000_000)


def expected_location(loc: Loc) -> Location:
    """The model's conventions, shared with the dlfilter decoder."""
    if loc.symbol is None:
        if loc.ip == 0:
            return NOWHERE
        return Location(loc.ip, UNKNOWN_SYMBOL, -1, loc.dso or "[unknown]")
    return Location(loc.ip, loc.symbol, loc.offset, loc.dso or "[unknown]")


@dataclass
class Case:
    lines: list[str]
    events: list[Event]
    flags: int = 0


@st.composite
def branch_cases(draw: st.DrawFn, style: str = "6.1") -> Case:
    pid, tid, time = draw(ids), draw(ids), draw(times)
    flags = draw(branch_flags())
    if style == "6.15":
        # Newer perf prints "tr strt tr end" as "tr strt jmp": it loses TRACE_END itself.
        flags &= ~TRACE_END if flags & TRACE_BEGIN else ~0
    src, dst = draw(locs()), draw(locs())
    kind, state = classify_flags(flags)
    event = BranchEvent(
        pid,
        tid,
        time,
        kind,
        state,
        expected_location(src),
        expected_location(dst),
        bool(flags & IN_TX),
    )
    return Case([branch_line(pid, tid, time, flags, src, dst, style=style)], [event], flags)


@st.composite
def other_cases(draw: st.DrawFn) -> Case:
    pid, tid, time = draw(ids), draw(ids), draw(times)
    which = draw(st.integers(0, 3))
    if which == 0:
        cbr, freq = draw(st.integers(0, 255)), draw(st.integers(0, 9999))
        line = cbr_line(pid, tid, time, cbr, freq, draw(locs()), flags=draw(branch_flags()))
        return Case([line], [PowerEvent(pid, tid, time, cbr, freq)])
    if which == 1:
        return Case([psb_line(pid, tid, time, draw(st.integers(0, 1 << 40)), draw(locs()))], [])
    if which == 2:
        message = " ".join(draw(st.from_regex(r"[A-Za-z0-9 ().:'-]{0,40}", fullmatch=True)).split())
        code = draw(st.integers(0, 40))
        with_time = draw(st.booleans())
        err_pid = draw(st.sampled_from([-1, 0, pid]))
        ip = draw(st.sampled_from([0, draw(st.integers(1, (1 << 64) - 1))]))
        line = error_line(
            code=code,
            message=message,
            time_ns=time,
            pid=err_pid,
            tid=err_pid,
            ip=ip,
            with_time=with_time,
        )
        event = DecodeError(
            err_pid if err_pid >= 0 else None,
            err_pid if err_pid >= 0 else None,
            time if with_time and time else None,
            ip or None,
            message,
            code,
        )
        return Case([line], [event])
    frames = draw(st.lists(locs(), max_size=6))
    period = draw(st.integers(1, 10**9))
    event_name = draw(st.sampled_from(["cycles:u", "cpu-clock", "cycles:ppp", "cpu-clock:uH"]))
    lines = sample_lines(pid, tid, time, period, event_name, frames)
    root_first = [expected_location(f) for f in reversed(frames) if f.symbol or f.ip]
    return Case(lines, [StackSample(pid, tid, time, tuple(root_first), event_name, period)])


# ------------------------------------------------------------------------ tests


@settings(max_examples=150, deadline=None)
@given(st.lists(branch_cases(), min_size=1, max_size=20))
def test_branch_lines_round_trip(cases: list[Case]) -> None:
    lines = [line for c in cases for line in c.lines]
    events, stats = parse_lines(lines, keep_all=True)
    assert stats.unknown_lines == 0, stats.unknown_examples
    assert events == [e for c in cases for e in c.events]


@settings(max_examples=150, deadline=None)
@given(st.lists(branch_cases(style="6.15"), min_size=1, max_size=10))
def test_newer_perf_flag_spelling_round_trips(cases: list[Case]) -> None:
    lines = [line for c in cases for line in c.lines]
    events, stats = parse_lines(lines, keep_all=True)
    assert stats.unknown_lines == 0, stats.unknown_examples
    assert events == [e for c in cases for e in c.events]


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.one_of(branch_cases(), other_cases()), min_size=1, max_size=25),
    st.lists(st.integers(0, 60), max_size=6),
)
def test_mixed_stream_in_any_batches(cases: list[Case], cuts: list[int]) -> None:
    """Every record type, interleaved, fed in arbitrary batches: same events, in order."""
    lines = [line for c in cases for line in c.lines]
    expected = [e for c in cases for e in c.events]
    parser = PerfTextParser(keep_all=True)
    events: list[Event] = []
    bounds = sorted({min(c, len(lines)) for c in cuts} | {0, len(lines)})
    for start, end in itertools.pairwise(bounds):
        events += parser.feed(lines[start:end])
    events += parser.finish()
    assert parser.stats.unknown_lines == 0, parser.stats.unknown_examples
    assert events == expected
    assert parser.stats.lines == len(lines)


@settings(max_examples=150, deadline=None)
@given(st.lists(branch_cases(), min_size=1, max_size=20))
def test_dropping_keeps_exactly_the_non_intra_function_jumps(cases: list[Case]) -> None:
    """The default mode drops what the dlfilter drops: plain jumps within one function."""
    lines = [line for c in cases for line in c.lines]
    every, _ = parse_lines(lines, keep_all=True)
    kept, stats = parse_lines(lines)
    expected = []
    last_kept: dict[tuple[int, int], int] = {}
    last_dropped: dict[tuple[int, int], BranchEvent] = {}
    first_dropped: dict[tuple[int, int], int] = {}
    for c, e in zip(cases, every, strict=True):
        key = (e.pid, e.tid)
        if c.flags in (1, 1 | 8) and e.src.function == e.dst.function:  # jmp, jcc
            last_dropped[key] = e
            if key not in first_dropped and e.time > last_kept.get(key, 0):
                first_dropped[key] = e.time
        else:
            # A kept branch carries the time of the first jump dropped before it (as the
            # dlfilter's gap_delta does).
            gap = first_dropped.pop(key, 0)
            e.gap_time = gap if gap and gap < e.time and e.time - gap <= 0xFFFFFFFF else 0
            expected.append(e)
            last_kept[key] = e.time
    # A thread whose input ends with dropped jumps keeps the last one (it ran until then).
    trailing = []
    for key, e in last_dropped.items():
        if e.time > last_kept.get(key, 0):
            gap = first_dropped.get(key, 0)
            e.gap_time = gap if gap and gap < e.time and e.time - gap <= 0xFFFFFFFF else 0
            trailing.append(e)
    expected += sorted(trailing, key=lambda e: (e.time, e.pid, e.tid))
    assert kept == expected
    assert stats.branches + stats.branches_dropped == len(every)
