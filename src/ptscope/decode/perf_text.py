"""Parsing ``perf script`` text into ``ptscope.model`` events, tolerantly and fast.

The input is what :mod:`ptscope.decode.perf_script` asks perf for (``--ns -F
pid,tid,time,flags,ip,addr,sym,symoff,synth,dso,event,period`` for branch traces, the same
without ``flags,addr`` plus callchains for sampling), from perf 5.x to 6.x. A branch line::

    PID/TID  SEC.NSEC:  PERIOD  EVENT:  FLAGS  IP SYM+OFF (DSO) =>  ADDR SYM+OFF (DSO)

Hot path: a branch line is cut with one ``str.split`` into its header fields and its body
(flags, source, target); the body, which repeats for every execution of a branch in
compiled code, is looked up in a dict that maps it to the event's ready-made parts, so a
typical line costs one split, one dict hit, one ``int()`` for the time and one event
allocation. Everything else (and any cache miss) goes through slower, careful code that
parses locations from the right (trailing ``(DSO)``, then ``+0xOFF``) so that symbols may
hold spaces, ``=>``, ``+`` and parentheses.

Conventions shared with the dlfilter decoder (:mod:`ptscope.decode.dlfilter_stream`), so
that both produce equal events: an unresolved symbol is :data:`~ptscope.model.UNKNOWN_SYMBOL`
with offset -1; a missing DSO is ``[unknown]``; address 0 with no symbol is
:data:`~ptscope.model.NOWHERE`; jumps inside one function are dropped unless ``keep_all``;
decode errors with time, ip or pid 0 / -1 have ``None`` there; offsets of 2**32 or more
(perf's map-relative garbage for addresses past a symbol's end) are truncated to 32 bits,
which is what perf hands a dlfilter.

Saved text (``decode --perf-script``) may come with other ``-F`` fields: a command name
first, one id instead of ``PID/TID``, no period or event, times without ``--ns``, locations
without symbol, offset or DSO. Such lines take the slow path, whose header parser anchors on
the time; :class:`TextShape` records which fields the text showed, so that the caller can
say what it lacks (``perf_script.decode_text_file``).

Nothing here raises on bad input: a line that is not understood is counted in
:class:`TextStats` (with the first few kept as examples) and the decode goes on. Numbers
are range-checked where they are read: a line whose time is at or past
:data:`~ptscope.model.TIME_LIMIT`, whose address does not fit in 64 bits, whose pid or tid
does not fit in 32, or whose counts overrun :data:`~ptscope.model.COUNT_BUDGET` is damaged
data, and becomes a :class:`~ptscope.model.DecodeError` (counted in
``TextStats.decode_errors``, a ``[decode error]`` marker in the trace), never an event.
"""

from __future__ import annotations

import gc
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, cast

from ptscope.decode.blocks import InstructionDetail
from ptscope.decode.ocaml_names import is_ocaml_label, ocaml_function_name
from ptscope.decode.plt_names import plt_stub
from ptscope.demangle import readable_symbol
from ptscope.model import (
    COUNT_BUDGET,
    NOWHERE,
    TIME_LIMIT,
    UNKNOWN_SYMBOL,
    BranchEvent,
    BranchFlags,
    BranchKind,
    CommEvent,
    DecodeError,
    Event,
    Location,
    PowerEvent,
    StackSample,
    TraceState,
    classify_flags,
    function_key,
)

__all__ = [
    "FLAG_LETTERS",
    "FLAG_NAMES",
    "MAX_EXAMPLES",
    "PerfTextParser",
    "TextStats",
    "function_of",
    "make_location",
    "parse_error_line",
    "parse_flags",
    "parse_lines",
    "parse_location",
    "parse_text",
]

MAX_EXAMPLES: Final = 8
"""How many unrecognised lines (and unknown flag texts) :class:`TextStats` keeps."""

_F = BranchFlags
FLAG_NAMES: Final[dict[str, int]] = {
    "call": _F.BRANCH | _F.CALL,
    "return": _F.BRANCH | _F.RETURN,
    "jcc": _F.BRANCH | _F.CONDITIONAL,
    "jmp": _F.BRANCH,
    "int": _F.BRANCH | _F.CALL | _F.INTERRUPT,
    "iret": _F.BRANCH | _F.RETURN | _F.INTERRUPT,
    "syscall": _F.BRANCH | _F.CALL | _F.SYSCALLRET,
    "sysret": _F.BRANCH | _F.RETURN | _F.SYSCALLRET,
    "async": _F.BRANCH | _F.ASYNC,
    "hw int": _F.BRANCH | _F.CALL | _F.ASYNC | _F.INTERRUPT,
    "tx abrt": _F.BRANCH | _F.TX_ABORT,
    "vmentry": _F.BRANCH | _F.CALL | _F.VMENTRY,
    "vmexit": _F.BRANCH | _F.CALL | _F.VMEXIT,
    # perf >= 6.14 (Arm SPE): bit 15 is BRANCH_MISS, unnamed in our BranchFlags.
    "br miss": _F.BRANCH | (1 << 15),
}
"""perf's names for whole flag combinations (``sample_flags[]`` in perf), without the
``tr strt`` / ``tr end`` prefixes and the ``(x)`` suffix."""

FLAG_LETTERS: Final = "bcrosyiABExghDtmn"
"""perf's ``PERF_IP_FLAG_CHARS`` (plus the two newer bits): letter *i* is flag bit *i*. perf
prints a combination as letters when it has no name for it."""

_SUFFIX_LETTERS: Final[dict[str, int]] = {"x": _F.IN_TX, "D": _F.INTR_DISABLE, "t": _F.INTR_TOGGLE}
_TRACE_PREFIXES: Final = (("tr strt", int(_F.TRACE_BEGIN)), ("tr end", int(_F.TRACE_END)))
_JUMP_FLAGS: Final = (int(_F.BRANCH), int(_F.BRANCH | _F.CONDITIONAL))
_IN_TX: Final = int(_F.IN_TX)
_ASYNC: Final = int(_F.ASYNC)
_U32: Final = (1 << 32) - 1
_U64: Final = (1 << 64) - 1
_I32_MIN: Final = -(1 << 31)
_I32_MAX: Final = (1 << 31) - 1
_NS: Final = 1_000_000_000
_TOO_BIG: Final = 1 << 64
"""What a decimal number with more digits than any range we accept stands for (see
:func:`_decimal`): out of every range, without reading thousands of digits."""

_IGNORED_EVENTS: Final = frozenset(
    {"instructions", "pwre", "pwrx", "exstop", "mwait", "ptwrite", "evt", "iflag", "psb"}
)
"""Intel PT synthesized events that carry nothing the model represents (counted, skipped).
``psb`` is counted separately."""

_MISSING: Final[Any] = object()
_DROP: Final[Any] = object()
_NO_GAP: Final = (0, 0)


def _gap(found: tuple[int, int], time: int) -> tuple[int, int]:
    """A kept branch's ``(gap_time, gap_insns)`` from its thread's first later-dated dropped
    jump ``(time, instructions counted up to it)``, as the dlfilter writes them: none when
    more than 2**32 ns back, a count over 65,535 unknown (0)."""
    gap, counted = found
    if not gap or not (gap < time and time - gap <= 0xFFFFFFFF):
        return _NO_GAP
    return gap, counted if counted <= 0xFFFF else 0


_BODY_CACHE_LIMIT: Final = 1 << 17
_TEXT_CACHE_LIMIT: Final = 1 << 18
"""Entries per text cache (branch bodies; sources and locations) before it is emptied:
bounds memory (~150 MB at worst) on traces with very many distinct branches; real traces
repeat a few thousand."""

# Miss path only: the flags are the words before the first bare lowercase hex token.
_SOURCE_RE: Final = re.compile(r"\s*(?P<flags>(?:\S+\s+)*?)(?P<loc>[0-9a-f]+(?:\s.*)?)\Z", re.S)


# -------------------------------------------------------------------------- stats


@dataclass
class TextShape:
    """Which of perf script's ``-F`` fields the text shows, learnt while parsing (each
    distinct branch body and location is looked at once, when it is first parsed)."""

    full_headers: int = 0
    """Branch lines with ``PID/TID``, a time in ns, a period and an event."""
    id_pairs: int = 0
    single_ids: int = 0
    no_ids: int = 0
    coarse_times: int = 0
    """Headers whose time has fewer than 9 decimals (no ``--ns``)."""
    untimed_branches: int = 0
    """Branch lines (``=>``) without a time: not decoded."""
    unnamed_events: int = 0
    """Lines without an event name that are no branches (psb, cbr without ``synth``)."""
    flagged_sources: int = 0
    flagless_sources: int = 0
    sourceless_branches: int = 0
    """Distinct branch bodies with nothing before ``=>`` but flags (no ``ip``)."""
    locations: int = 0
    """Distinct locations other than address 0."""
    symbol_fields: int = 0
    """Locations with a symbol field (a name or ``[unknown]``)."""
    resolved: int = 0
    offsets: int = 0
    dsos: int = 0

    def essential_missing(self, stats: TextStats) -> list[str]:
        """The fields without which no call can be rebuilt, with what each is for; only
        when they are missing from the whole text seen so far."""
        missing = []
        branch_lines = stats.branches + stats.branches_dropped + self.sourceless_branches
        if self.untimed_branches and not stats.branches:
            missing.append("-F time (when each branch ran)")
        elif not branch_lines:
            missing.append("branches (`IP => ADDR` lines: --itrace=b, -F ip,addr)")
        if self.flagless_sources and not self.flagged_sources:
            missing.append("-F flags (which branches are calls, returns or jumps)")
        if self.sourceless_branches and not stats.branches:
            missing.append("-F ip (where each branch comes from)")
        return missing

    def other_missing(self, stats: TextStats) -> list[str]:
        """The fields whose absence makes the trace poorer, with what is lost."""
        missing = []
        if not (self.full_headers or self.id_pairs):
            if self.single_ids:
                missing.append("-F pid,tid (one id per line: threads or processes may merge)")
            elif self.no_ids:
                missing.append("-F pid,tid (every line is taken as one thread)")
        if self.coarse_times and not self.full_headers:
            missing.append("--ns (times are rounded to microseconds)")
        if self.locations and not self.symbol_fields:
            missing.append("-F sym (function names: calls are named by their binary)")
        elif self.resolved and not self.offsets:
            missing.append("-F symoff (function entries: tail calls are taken for jumps)")
        if self.locations and not self.dsos:
            missing.append("-F dso (binaries: exception landing pads and PLT stub names)")
        if self.unnamed_events and not stats.power:
            missing.append("-F synth,event (CPU frequency changes)")
        elif stats.ignored_events["cbr"] and not stats.power:
            missing.append("-F synth (CPU frequency changes)")
        return missing


@dataclass
class TextStats:
    """What the text held: lines, events by type, and what could not be understood."""

    lines: int = 0
    branches: int = 0
    branches_dropped: int = 0
    """Jumps inside one function, dropped as the dlfilter does (unless ``keep_all``)."""
    decode_errors: int = 0
    power: int = 0
    psb: int = 0
    samples: int = 0
    comms: int = 0
    task_events: int = 0
    """Other ``PERF_RECORD_*`` lines (fork, exit, mmap, switch...), skipped."""
    ignored_events: Counter[str] = field(default_factory=Counter)
    """Lines of events the model has no use for (``instructions``, ``pwre``...), by name."""
    unknown_lines: int = 0
    unknown_examples: list[str] = field(default_factory=list)
    unknown_flags: list[str] = field(default_factory=list)
    """Distinct branch flag texts with words perf may have added since (the first few):
    the known words in them were still used (see :func:`parse_flags`)."""
    shape: TextShape = field(default_factory=TextShape)
    """Which ``-F`` fields the text shows."""

    @property
    def events(self) -> int:
        return self.branches + self.decode_errors + self.power + self.samples + self.comms

    def summary(self) -> str:
        """A few lines for the user: what was decoded and what was not understood."""
        parts = [
            f"{self.lines:,} lines: {self.branches:,} branches"
            + (
                f" (+{self.branches_dropped:,} jumps inside functions)"
                if self.branches_dropped
                else ""
            )
        ]
        for count, what in (
            (self.samples, "stack samples"),
            (self.decode_errors, "decode errors"),
            (self.power, "power events"),
            (self.psb, "psb packets"),
            (self.comms, "thread names"),
        ):
            if count:
                parts.append(f"{count:,} {what}")
        text = ", ".join(parts)
        if self.unknown_lines:
            text += f"\n{self.unknown_lines:,} lines not understood, e.g.:"
            text += "".join(f"\n  {ex!r}" for ex in self.unknown_examples)
        if self.unknown_flags:
            text += "\nunknown branch flags: " + ", ".join(map(repr, self.unknown_flags))
        return text


# --------------------------------------------------------------- pure line parts


def parse_flags(text: str) -> tuple[int, bool]:
    """perf's printed branch flags (``call``, ``tr end  syscall``, ``jcc   (x)``, ``bcyB``,
    ``raw flags:0x...``) as ``(PERF_IP_FLAG_* bits, fully understood)``.

    Words perf may add in future versions do not make the line unusable: the bits of the
    words that are known are kept and the second value is ``False``.
    """
    words = text.split()
    if not words:
        return 0, True
    flags = 0
    ok = True
    last = words[-1]
    if last.startswith("(") and last.endswith(")"):
        # The in-transaction / interrupt-state suffix: "(x)", "(xD)", "(Dt)".
        for letter in last[1:-1]:
            bit = _SUFFIX_LETTERS.get(letter)
            if bit is None:
                ok = False
            else:
                flags |= bit
        words.pop()
    phrase = " ".join(words)
    if phrase.startswith("raw flags:"):
        try:
            raw = int(phrase[10:].strip(), 16)
        except ValueError:
            return flags, False
        # perf's flags are 32 bits: more is damage, whose known bits are kept.
        return flags | (raw & _U32), ok and raw == raw & _U32
    prefixed = False
    again = True
    while again:
        again = False
        for prefix, bit in _TRACE_PREFIXES:
            if phrase == prefix or phrase.startswith(prefix + " "):
                flags |= bit
                phrase = phrase[len(prefix) + 1 :]
                prefixed = again = True
    if not phrase:
        # A bare "tr strt" / "tr end" is perf's name for BRANCH with that bit.
        return (flags | _F.BRANCH if prefixed else flags), ok
    named = FLAG_NAMES.get(phrase)
    if named is not None:
        return flags | named, ok
    if " " not in phrase and all(c in FLAG_LETTERS or c == "?" for c in phrase):
        for c in phrase:
            if c != "?":
                flags |= 1 << FLAG_LETTERS.index(c)
        return flags, ok
    # Words perf added after this was written: keep the names among them that we know.
    words = phrase.split(" ")
    i = 0
    while i < len(words):
        pair = FLAG_NAMES.get(" ".join(words[i : i + 2])) if i + 1 < len(words) else None
        if pair is not None:
            flags |= pair
            i += 2
            continue
        flags |= FLAG_NAMES.get(words[i], 0)
        i += 1
    return flags, False


def _dso_start(text: str) -> int:
    """Index of the ``(`` opening the trailing ``(DSO)`` of ``text`` (which ends with
    ``)``); -1 if there is none. DSO paths may hold balanced parentheses."""
    start = text.rfind(" (") + 1
    if start == 0:
        return 0 if text[0] == "(" else -1
    if text.count("(", start) == text.count(")", start):
        return start
    # " (" inside the DSO path itself: match parentheses from the right.
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        c = text[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return i if i == 0 or text[i - 1] == " " else start
    return start


def _split_location(text: str) -> tuple[int, str | None, int, str | None] | None:
    """``IP [SYM[+0xOFF]] [(DSO)]`` as (ip, symbol or None, offset, dso or None)."""
    text = text.strip()
    ip_text, _, rest = text.partition(" ")
    if not _is_hex(ip_text):
        return None
    ip = int(ip_text, 16)
    if ip > _U64:
        return None  # no address: the caller tells damage from garbage (_has_big_hex)
    rest = rest.strip()
    dso: str | None = None
    if rest.endswith(")"):
        start = _dso_start(rest)
        if start >= 0:
            dso = rest[start + 1 : -1]
            rest = rest[:start].rstrip()
    if not rest or rest == UNKNOWN_SYMBOL or rest.startswith("[0x"):
        return ip, None, -1, dso
    sym, plus, off_text = rest.rpartition("+0x")
    if plus and sym and _is_hex(off_text):
        offset = int(off_text, 16)
        if offset > _U32:
            offset &= _U32
        return ip, sym, offset, dso
    return ip, rest, -1, dso


def _is_hex(text: str) -> bool:
    """Whether ``text`` is a non-empty lowercase hex number as perf prints addresses."""
    return bool(text) and not text.strip("0123456789abcdef")


def _has_big_hex(text: str) -> bool:
    """Whether ``text`` holds a word that reads as an address too large for 64 bits: what
    makes a location that is not understood damaged rather than foreign."""
    return any(len(word.lstrip("0")) > 16 and _is_hex(word) for word in text.split())


def _decimal(text: str) -> int | None:
    """``text`` as a decimal integer (ASCII digits after an optional ``-``), else None.

    ``str.isdigit`` alone would let through digits ``int`` refuses (``²``), and ``int``
    refuses more than 4,300 digits: a number longer than any range we accept is
    :data:`_TOO_BIG` (negated for ``-``) instead.
    """
    negative = text[:1] == "-"
    digits = text[1:] if negative else text
    if not (digits.isascii() and digits.isdigit()):
        return None
    significant = digits.lstrip("0")
    value = int(significant or "0") if len(significant) <= 20 else _TOO_BIG
    return -value if negative else value


def _fits_i32(value: int) -> bool:
    return _I32_MIN <= value <= _I32_MAX


def function_of(text: str) -> str | None:
    """The function key (:func:`ptscope.model.function_key`) of one printed address
    (``401136 main+0x26 (/tmp/a.out)``) as perf named it, or ``None`` if ``text`` does not
    start with a hex address. No demangling: two addresses are in one function exactly
    when these keys are equal, which is all the drill-down asks."""
    parts = _split_location(text)
    if parts is None:
        return None
    _, symbol, _, dso = parts
    return function_key(symbol or UNKNOWN_SYMBOL, dso if dso is not None else UNKNOWN_SYMBOL)


def parse_location(text: str) -> Location | None:
    """One printed address (``401136 main+0x26 (/tmp/a.out)``) as a new :class:`Location`,
    or ``None`` if ``text`` does not start with a hex address."""
    parts = _split_location(text)
    return None if parts is None else make_location(*parts)


def make_location(ip: int, symbol: str | None, offset: int, dso: str | None) -> Location:
    """The :class:`Location` for a resolved address, as both decoders make it.

    perf prints an unresolved address as ``[unknown]`` with no offset, and an address in
    no mapping with the DSO ``[unknown]``; address 0 (the source of ``tr strt``, the
    target of ``tr end``) is :data:`ptscope.model.NOWHERE`. A C++ or Rust name that perf
    left mangled is demangled here (``ptscope.demangle``), an OCaml function that perf
    named by its module's ``code_begin`` label gets its own name (``ocaml_names``), and a
    PLT entry that perf named after the symbol before the PLT (``_init+0x30``) gets its
    own (``strlen@plt``, ``.plt`` for PLT0: ``plt_names``).
    """
    if symbol is None:
        if ip == 0:
            return NOWHERE
        return Location(ip, UNKNOWN_SYMBOL, -1, dso if dso is not None else UNKNOWN_SYMBOL)
    stub = plt_stub(symbol, offset, dso) if dso is not None else None
    if stub is not None:
        symbol, offset = stub
    elif symbol.startswith(("_Z", "_R")):
        symbol = readable_symbol(symbol)
    elif dso is not None and is_ocaml_label(symbol):
        symbol = ocaml_function_name(symbol, dso)
    return Location(ip, symbol, offset, dso if dso is not None else UNKNOWN_SYMBOL)


def _parse_time(text: str) -> int | None:
    """``SEC[.FRAC]`` in ns (possibly at or past :data:`TIME_LIMIT`: the caller checks)."""
    sec, dot, frac = text.partition(".")
    seconds = _decimal(sec)
    if seconds is None or seconds < 0 or (dot and not (frac.isascii() and frac.isdigit())):
        return None
    return seconds * _NS + int((frac + "000000000")[:9])


def parse_error_line(line: str) -> DecodeError | None:
    """A decode error line (`` instruction trace error type 1 time 1.2 cpu 0 pid 5 tid 5
    ip 0x4011f6 code 6: Trace doesn't match instruction``) as an event, else ``None``.

    Time, ip and pid/tid may be missing, ``0`` or ``-1`` (unknown): they become ``None``,
    and so do values out of range (damage: the line is a decode error anyway).
    """
    at = line.find("error type ")
    if at < 0:
        return None
    code_at = line.find(" code ", at)
    if code_at < 0:
        return None
    colon = line.find(":", code_at)
    if colon < 0:
        return None
    code = _decimal(line[code_at + 6 : colon].strip())
    if code is None or code < 0:
        return None
    tokens = line[at + 11 : code_at].split()
    if not tokens or _decimal(tokens[0]) is None:
        return None
    values: dict[str, str] = {}
    # tokens[0] is the error type; the rest are "name value" pairs.
    for i in range(1, len(tokens) - 1, 2):
        values[tokens[i]] = tokens[i + 1]
    time = _parse_time(values.get("time", "0"))
    pid = _decimal(values.get("pid", "-1"))
    tid = _decimal(values.get("tid", "-1"))
    try:
        ip = int(values.get("ip", "0"), 16)
    except ValueError:
        return None
    if time is None or pid is None or tid is None:
        return None
    message = line[colon + 1 :]
    if message[:1].isspace():
        message = message[1:]
    return DecodeError(
        pid=pid if 0 <= pid <= _I32_MAX else None,
        tid=tid if 0 <= tid <= _I32_MAX else None,
        time=time if 0 < time < TIME_LIMIT else None,
        ip=ip if 0 < ip <= _U64 else None,
        message=message.rstrip(),
        code=code if code <= _I32_MAX else 0,
    )


@dataclass(slots=True)
class _Header:
    pid: int
    tid: int
    time: int | None
    period: int
    event: str
    body: str
    ids: int = 2
    """How many ids the line gives: 2 (``PID/TID``), 1 (``pid`` or ``tid``) or 0."""
    ns: bool = True
    """Whether the time has all 9 decimals (``--ns``)."""


_HEADER_TOKENS: Final = 14
"""Tokens looked at for a line's header: a command name (up to 16 characters, spaces
allowed), the ids, the time, the period and the event."""


def _parse_header(line: str) -> _Header | None:
    """``[COMM] [PID/TID | ID] SEC.NSEC: [PERIOD EVENT: | EVENT:] BODY`` (the body keeps its
    spacing): the fields perf prints before the branch or sample, as ``-F`` chose them.

    The time anchors the header: what precedes it is the command name (``comm``) and the
    ids (``PID/TID``, or one number when only ``pid`` or ``tid`` was asked for: taken as
    both; none: -1); after it come the period and the event name when asked for. ``None``
    without a time.
    """
    pos = 0
    n = len(line)
    tokens: list[tuple[str, int, int]] = []  # (token, start, end)
    at_time = -1
    while pos < n and len(tokens) < _HEADER_TOKENS:
        while pos < n and line[pos] in " \t":
            pos += 1
        end = pos
        while end < n and line[end] not in " \t":
            end += 1
        if end == pos:
            break
        tok = line[pos:end]
        tokens.append((tok, pos, end))
        pos = end
        if tok.endswith(":") and _is_time(tok[:-1]):
            at_time = len(tokens) - 1
            break
    if at_time < 0:
        return None
    pid = tid = -1
    given = 0
    if at_time > 0:
        ids = tokens[at_time - 1][0]
        p, slash, t = ids.partition("/")
        pid_value, tid_value = _decimal(p), _decimal(t)
        one = _decimal(ids)
        if slash and pid_value is not None and tid_value is not None:
            pid, tid = pid_value, tid_value
            given = 2
        elif one is not None and one >= 0:
            pid = tid = one
            given = 1
    time_text = tokens[at_time][0][:-1]
    time = _parse_time(time_text)
    body_start = tokens[at_time][2]
    period = 0
    event = ""
    # PERIOD EVENT: or EVENT: may follow; anything else is the body.
    rest = line[body_start:].split(None, 2)
    count = _decimal(rest[0]) if rest else None
    if len(rest) >= 2 and count is not None and count >= 0 and _is_event(rest[1]):
        period = count
        event = rest[1][:-1]
        body_start = line.index(rest[1], line.index(rest[0], body_start) + len(rest[0]))
        body_start += len(rest[1])
    elif rest and _is_event(rest[0]):
        event = rest[0][:-1]
        body_start = line.index(rest[0], body_start) + len(rest[0])
    if body_start < n and line[body_start] == " ":
        body_start += 1
    fine = len(time_text) - time_text.index(".") > 9
    return _Header(pid, tid, time, period, event, line[body_start:], given, fine)


def _header_damage(header: _Header) -> str | None:
    """Which number of a header is out of range (damaged data), if one is."""
    if header.time is not None and header.time >= TIME_LIMIT:
        return "time"
    if not (_fits_i32(header.pid) and _fits_i32(header.tid)):
        return "pid/tid"
    if header.period > _U64:
        return "period"
    return None


def _is_event(token: str) -> bool:
    """perf's ``EVENT:`` (``branches:uH:``, ``cycles:``), not a time or an address."""
    return len(token) > 1 and token.endswith(":") and not _is_time(token[:-1])


def _parse_ipc(text: str) -> tuple[int, int] | None:
    """``1.23 (INSN/CYC) `` (what follows ``IPC:``) as (instructions, cycles)."""
    _, _, counts = text.partition("(")
    insn_text, slash, rest = counts.partition("/")
    insn, cycles = _decimal(insn_text), _decimal(rest.partition(")")[0])
    if slash and insn is not None and cycles is not None and insn >= 0 and cycles >= 0:
        return insn, cycles
    return None


def _looks_like_target(text: str) -> bool:
    # perf prints the target address right-aligned in 16 columns, then " SYM".
    address = text[:16].lstrip(" ")
    return _is_hex(address) and text[16:17] in ("", " ")


def _is_time(text: str) -> bool:
    sec, dot, frac = text.partition(".")
    return sec.isascii() and sec.isdigit() and bool(dot) and frac.isascii() and frac.isdigit()


# ------------------------------------------------------------------------ parser

_Source = tuple[int, BranchKind, TraceState, bool, Location]
"""A branch's flags, kind, trace state, in-transaction bit and source location."""


class PerfTextParser:
    """Incremental parser: lines (without their newline) in, events out, in order.

    :meth:`feed` takes any batch of lines and returns the events they completed;
    :meth:`finish` returns what the end of the input completes (a pending stack sample).
    ``keep_all=False`` drops jumps whose source and target are in the same function, like
    the dlfilter does; ``True`` keeps every branch. With ``detail`` (instruction detail:
    the text must hold perf's mmap and task lines), each kept branch's ``insn_count`` and
    ``lines`` come from the basic blocks run since the thread's previous kept branch, as
    the dlfilter's ``insns`` gives them; ``comm_events=False`` then parses thread-name lines
    (``exec``) without turning them into events.
    """

    def __init__(
        self,
        *,
        keep_all: bool = False,
        detail: InstructionDetail | None = None,
        comm_events: bool = True,
    ) -> None:
        self.keep_all = keep_all
        self.detail = detail
        self.comm_events = comm_events
        # Inlined code (the detail's runs): each location's inlined body, a jump between
        # two bodies kept, and a row where a block enters or leaves one (_inline_row), as
        # the C decoders do. The rows are dated with the thread's previous branch, written
        # into the batch being parsed, named after the block's branch source.
        self._inlined = detail is not None and bool(detail.runs)
        if self._inlined:
            assert detail is not None
            detail.on_split = self._inline_row
        self._noded: set[int] = set()  # ids of locations given their body
        self._drop_srcs: dict[str, Location] = {}  # a dropped body's source location
        self._split_src: Location | None = None
        self._out: list[Event] = []
        self._last_time: dict[tuple[int, int], int] = {}
        # Branch body -> (source ip, target ip, asynchronous), for the instruction detail.
        self._body_blocks: dict[str, tuple[int, int, bool] | None] = {}
        self.stats = TextStats()
        # Text -> parsed value. A branch line's body (flags, source and target) maps to
        # the event's (kind, state, src, dst, in_tx), to _DROP, or to None (not a branch).
        self._bodies: dict[str, Any] = {}
        self._flag_texts: dict[str, tuple[int, bool]] = {}
        self._sources: dict[str, _Source | None] = {}
        self._loc_texts: dict[str, Location | None] = {}
        self._threads: dict[str, tuple[int, int]] = {}
        # One Location object per distinct (ip, symbol, offset, dso), and one string object
        # per distinct name, for the life of the parser.
        self._locations: dict[tuple[int, str, int, str], Location] = {}
        # id of a location (kept alive by _locations) -> its function by perf's own name,
        # where that differs from Location.function (demangled, PLT and OCaml names).
        self._perf_functions: dict[int, str] = {}
        self._strings: dict[str, str] = {}
        self._pending: StackSample | None = None
        self._frames: list[Location] = []
        # What makes the pending sample damaged data (a frame's address out of range).
        self._pending_damage: str | None = None
        # Instructions plus cycles this parser may still hand out (model.COUNT_BUDGET).
        self._count_budget = COUNT_BUDGET
        # Instructions / cycles of dropped jumps, carried to the thread's next kept branch
        # (only known with ``-F +ipc``).
        self._pending_counts: dict[tuple[int, int], tuple[int, int]] = {}
        # As the dlfilter does: per thread, the time of its last kept branch, and of the
        # first dropped jump later than that (given to the next kept branch as gap_time),
        # with the instructions counted up to that jump (its gap_insns).
        self._last_kept: dict[tuple[int, int], int] = {}
        self._gaps: dict[tuple[int, int], tuple[int, int]] = {}
        # The latest dropped jump of each thread, (time, body): at the end of the input,
        # a thread whose trace ends with dropped jumps gets the last one as an event.
        self._last_dropped: dict[tuple[int, int], tuple[int, str]] = {}

    # ----------------------------------------------------------------- public

    def feed(self, lines: Iterable[str]) -> list[Event]:
        """Parse a batch of lines; return the events completed so far."""
        out: list[Event] = []
        was_enabled = gc.isenabled()
        gc.disable()  # events hold no reference cycles: collecting while building is waste
        try:
            self._feed(lines if isinstance(lines, list) else list(lines), out)
        finally:
            if was_enabled:
                gc.enable()
        return out

    def finish(self) -> list[Event]:
        """The input ended: return the events it completes (a pending stack sample, and
        each thread's trailing dropped jump: what was running still ran until then, as
        the dlfilter's ``to-end`` says too)."""
        out: list[Event] = []
        self._flush_sample(out)
        trailing = []
        for thread, (time, body) in self._last_dropped.items():
            if time <= self._last_kept.get(thread, 0):
                continue
            branch = self._parse_branch(body)
            if branch is None:
                continue
            (_flags, kind, state, in_tx, src), dst = branch
            trailing.append(self._kept(thread, time, kind, state, src, dst, in_tx, 0, 0))
            self.stats.branches += 1
            self.stats.branches_dropped -= 1
        trailing.sort(key=lambda e: (e.time, e.pid, e.tid))
        self._last_dropped.clear()
        return out + trailing

    # ------------------------------------------------------------- hot path

    def _kept(
        self,
        thread: tuple[int, int],
        time: int,
        kind: BranchKind,
        state: TraceState,
        src: Location,
        dst: Location,
        in_tx: bool,
        insn: int,
        cycles: int,
    ) -> BranchEvent:
        """A branch of ``thread`` that is kept (off the hot path, which does the same
        inline): the counts of the jumps dropped before it added, its instruction detail,
        and the time (and count) of the first of those jumps later than the last one kept."""
        old_insn, old_cycles = self._pending_counts.pop(thread, (0, 0))
        self._last_kept[thread] = time
        gap, gap_insns = _gap(self._gaps.pop(thread, _NO_GAP), time)
        lines = None
        if self.detail is not None:
            insn, lines = self.detail.take(thread)
        else:
            insn += old_insn
        return BranchEvent(
            thread[0], thread[1], time, kind, state, src, dst, in_tx, insn,
            cycles + old_cycles, gap, lines, gap_insns,
        )  # fmt: skip

    def _dropped(self, thread: tuple[int, int], time: int, insn: int, cycles: int) -> None:
        """A jump of ``thread`` that is dropped, as the dlfilter does: its counts go to the
        thread's next kept branch, and the first one later than the last kept branch gives
        that branch its gap time, with the instructions counted up to it."""
        carried = self._pending_counts
        if insn or cycles:
            old_insn, old_cycles = carried.get(thread, (0, 0))
            carried[thread] = (old_insn + insn, old_cycles + cycles)
        if thread not in self._gaps and time > self._last_kept.get(thread, 0):
            detail = self.detail
            counted = (
                detail.pending(thread) if detail is not None else carried.get(thread, (0, 0))[0]
            )
            self._gaps[thread] = (time, counted)

    def _feed(self, lines: list[str], out: list[Event]) -> None:
        append = out.append
        other = self._other_line
        body_get = self._bodies.get
        thread_get = self._threads.get
        missing = _MISSING
        drop = _DROP
        carried = self._pending_counts
        last_kept = self._last_kept
        gaps = self._gaps
        last_dropped = self._last_dropped
        detail = self.detail
        blocks_get = self._body_blocks.get
        branches = dropped = 0
        thread: tuple[int, int] = (0, 0)
        last_time_text = last_thread_text = last_event_text = ""
        time = pid = tid = 0
        # A stack sample being collected is completed by _other_line, which also takes
        # every line that is not a well-formed "branches" line, and says whether one is.
        pending = self._pending is not None
        for line in lines:
            parts = line.split(None, 4)
            if len(parts) != 5 or pending:
                pending = other(line, out)
                continue
            thread_text, time_text, _period, event_text, body = parts
            insn = cycles = 0
            if body[-1] == " ":
                # "-F +ipc" appends " \t IPC: 1.00 (INSN/CYC) " when both counts are known.
                at = body.rfind(" \t IPC: ")
                if at > 0:
                    ipc = body[at + 8 :]
                    body = body[:at]
                    try:
                        open_at = ipc.index("(")
                        slash = ipc.index("/", open_at)
                        insn = int(ipc[open_at + 1 : slash])
                        cycles = int(ipc[slash + 1 : ipc.index(")", slash)])
                        if (insn | cycles) < 0 or insn + cycles > self._count_budget:
                            raise ValueError  # damaged: the slow path says so
                    except ValueError:
                        pending = other(line, out)
                        continue
            if event_text != last_event_text:
                # Only "branches" events take the fast path (a cbr line's symbol may hold
                # " => " too; with other -F fields the fourth word is no event), checked
                # first so that no other line's words are cached as a branch body.
                if not (event_text.startswith("branches") and event_text[-1] == ":"):
                    pending = other(line, out)
                    continue
                last_event_text = event_text
            info = body_get(body, missing)
            if info is missing:
                info = self._body(body)
            if info is None:
                pending = other(line, out)
                continue
            if time_text != last_time_text:
                try:
                    if time_text[-11] != "." or time_text[-1] != ":":
                        raise ValueError
                    time = int(time_text[:-1].replace(".", "", 1))
                    if not 0 <= time < TIME_LIMIT:
                        raise ValueError  # damaged: the slow path says so
                except (ValueError, IndexError):
                    last_time_text = ""
                    pending = other(line, out)
                    continue
                last_time_text = time_text
            if thread_text != last_thread_text:
                found = thread_get(thread_text) or self._thread(thread_text)
                if found is None:
                    pending = other(line, out)
                    continue
                thread = found
                pid, tid = thread
                last_thread_text = thread_text
            if insn or cycles:
                self._count_budget -= insn + cycles
            if detail is not None:
                block = blocks_get(body, missing)
                if block is missing:
                    block = self._body_block(body)
                if block is not None:
                    if self._inlined:
                        self._split_src = info[2] if info is not drop else self._drop_srcs.get(body)
                        self._out = out
                    detail.branch(thread, *block)
                self._last_time[thread] = time
                insn = 0  # perf's count (IPC) is replaced by the blocks'
            if info is drop:
                dropped += 1
                last_dropped[thread] = (time, body)
                self._dropped(thread, time, insn, cycles)
                continue
            kind, state, src, dst, in_tx = info
            if carried:
                old_insn, old_cycles = carried.pop((pid, tid), (0, 0))
                insn += old_insn
                cycles += old_cycles
            last_kept[thread] = time
            gap, gap_insns = _gap(gaps.pop(thread, _NO_GAP), time) if gaps else _NO_GAP
            if detail is not None:
                insn, code_lines = detail.take(thread)
                append(
                    BranchEvent(
                        pid,
                        tid,
                        time,
                        kind,
                        state,
                        src,
                        dst,
                        in_tx,
                        insn,
                        cycles,
                        gap,
                        code_lines,
                        gap_insns,
                    )
                )
            elif insn or cycles or gap:
                append(
                    BranchEvent(
                        pid,
                        tid,
                        time,
                        kind,
                        state,
                        src,
                        dst,
                        in_tx,
                        insn,
                        cycles,
                        gap,
                        None,
                        gap_insns,
                    )
                )
            else:
                append(BranchEvent(pid, tid, time, kind, state, src, dst, in_tx))
            branches += 1
        st = self.stats
        st.lines += len(lines)
        st.branches += branches
        st.branches_dropped += dropped
        st.shape.full_headers += branches + dropped

    # --------------------------------------------------------- cache misses

    def _thread(self, text: str) -> tuple[int, int] | None:
        p, slash, t = text.partition("/")
        pid, tid = _decimal(p), _decimal(t)
        if not (slash and pid is not None and tid is not None):
            return None
        if not (_fits_i32(pid) and _fits_i32(tid)):
            return None  # damaged: the slow path says so
        value = self._threads[text] = (pid, tid)
        return value

    def _body(self, body: str) -> Any:
        """What a branch line's body (``FLAGS IP SYM (DSO) => ADDR SYM (DSO)``) becomes."""
        if len(self._bodies) >= _BODY_CACHE_LIMIT:
            self._bodies.clear()
        at = body.find(" => ")
        if at < 0:
            self._bodies[body] = None
            return None
        if " IPC: " in body:
            return None  # different on every line: parsed by _branch_line, not cached
        branch = self._parse_branch(body)
        value: Any = None
        if branch is not None:
            (flags, kind, state, in_tx, src_loc), dst_loc = branch
            if self._inlined:
                self._give_body(src_loc)
                self._give_body(dst_loc)
            if (
                not self.keep_all
                and flags in _JUMP_FLAGS
                and self._perf_function(src_loc) == self._perf_function(dst_loc)
                and src_loc.inline == dst_loc.inline  # (a jump between bodies is kept)
            ):
                value = _DROP
                if self._inlined:
                    if len(self._drop_srcs) >= _BODY_CACHE_LIMIT:
                        self._drop_srcs.clear()
                    self._drop_srcs[body] = src_loc
            else:
                value = (kind, state, src_loc, dst_loc, in_tx)
        self._bodies[body] = value
        return value

    def _body_block(self, body: str) -> tuple[int, int, bool] | None:
        """A branch body's (source ip, target ip, asynchronous) for the instruction detail."""
        if len(self._body_blocks) >= _BODY_CACHE_LIMIT:
            self._body_blocks.clear()
        branch = self._parse_branch(body) if " IPC: " not in body else None
        value = None
        if branch is not None:
            (flags, _kind, _state, _in_tx, src), dst = branch
            value = (src.ip, dst.ip, bool(flags & _ASYNC))
        self._body_blocks[body] = value
        return value

    def _parse_branch(self, body: str) -> tuple[_Source, Location] | None:
        """A branch body's source (with the flags) and target, cached on their own."""
        at = body.find(" => ")
        if at >= 0 and body.find(" => ", at + 4) < 0:
            # The usual case, inline: one separator.
            src_text = body[:at]
            dst_text = body[at + 4 :]
            src = self._sources.get(src_text) or self._source(src_text)
            dst = self._loc_texts.get(dst_text) or self._location_text(dst_text)
            return None if src is None or dst is None else (src, dst)
        return self._split_branch(body)

    def _split_branch(self, body: str) -> tuple[_Source, Location] | None:
        """The source (with the flags) and target of a branch body; ``None`` if not one.

        Symbols may contain `` => `` too: with several, the separator is the one followed
        by perf's 16-column right-aligned target address.
        """
        at = body.find(" => ")
        if at < 0:
            return None
        if body.find(" => ", at + 4) < 0:
            return self._branch_parts(body[:at], body[at + 4 :])
        candidates = []
        while at >= 0:
            candidates.append(at)
            at = body.find(" => ", at + 1)
        aligned = [a for a in candidates if _looks_like_target(body[a + 4 :])]
        for a in aligned + [a for a in candidates if a not in aligned]:
            parts = self._branch_parts(body[:a], body[a + 4 :])
            if parts is not None:
                return parts
        return None

    def _branch_parts(self, src_text: str, dst_text: str) -> tuple[_Source, Location] | None:
        src = self._sources.get(src_text, _MISSING)
        if src is _MISSING:
            src = self._source(src_text)
        dst = self._loc_texts.get(dst_text, _MISSING)
        if dst is _MISSING:
            dst = self._location_text(dst_text)
        if src is None or dst is None:
            return None
        return src, dst

    def _source(self, text: str) -> _Source | None:
        """``FLAGS IP SYM+OFF (DSO)`` as (flags, kind, state, in_tx, location)."""
        if len(self._sources) >= _TEXT_CACHE_LIMIT:
            self._sources.clear()
        value = None
        m = _SOURCE_RE.match(text)
        shape = self.stats.shape
        if m is None:
            shape.sourceless_branches += 1
        elif m.group("flags").strip():
            shape.flagged_sources += 1
        else:
            shape.flagless_sources += 1
        if m is not None:
            loc = self._location_text(m.group("loc"))
            if loc is not None:
                flags = self._flags(m.group("flags"))
                kind, state = classify_flags(flags)
                value = (flags, kind, state, bool(flags & _IN_TX), loc)
        self._sources[text] = value
        return value

    def _flags(self, text: str) -> int:
        found = self._flag_texts.get(text)
        if found is None:
            flags, understood = parse_flags(text)
            found = self._flag_texts[text] = (int(flags), understood)
        flags, understood = found
        if not understood:
            key = " ".join(text.split())
            seen = self.stats.unknown_flags
            if key not in seen and len(seen) < MAX_EXAMPLES:
                seen.append(key)
        return flags

    def _location_text(self, text: str) -> Location | None:
        found = self._loc_texts.get(text, _MISSING)
        if found is _MISSING:
            if len(self._loc_texts) >= _TEXT_CACHE_LIMIT:
                self._loc_texts.clear()
            parts = _split_location(text)
            if parts is not None:
                self._observe_location(text, *parts)
            found = self._loc_texts[text] = None if parts is None else self._location(*parts)
        return cast("Location | None", found)

    def _observe_location(
        self, text: str, ip: int, symbol: str | None, offset: int, dso: str | None
    ) -> None:
        """Which -F fields a printed location shows (:class:`TextShape`)."""
        if ip == 0:
            return  # tr strt / tr end: perf prints 0 with whatever fields there are
        shape = self.stats.shape
        shape.locations += 1
        if dso is not None:
            shape.dsos += 1
        if symbol is not None:
            shape.resolved += 1
            shape.symbol_fields += 1
        elif UNKNOWN_SYMBOL in text.partition(" (")[0]:
            shape.symbol_fields += 1
        if offset >= 0:
            shape.offsets += 1

    def _location(self, ip: int, symbol: str | None, offset: int, dso: str | None) -> Location:
        loc = make_location(ip, symbol, offset, dso)
        if loc is NOWHERE:
            return loc
        key = (loc.ip, loc.symbol, loc.offset, loc.dso)
        found = self._locations.get(key)
        if found is None:
            intern = self._intern
            loc.symbol = intern(loc.symbol)
            loc.dso = intern(loc.dso)
            loc.function = intern(loc.function)
            found = self._locations[key] = loc
            if symbol is not None:
                perf_function = function_key(symbol, loc.dso)
                if perf_function != loc.function:
                    self._perf_functions[id(found)] = perf_function
        return found

    def _give_body(self, loc: Location) -> None:
        """Set ``loc``'s inlined body (once: one Location object per address)."""
        if loc is NOWHERE or id(loc) in self._noded:
            return
        assert self.detail is not None
        loc.inline = self.detail.node(loc.dso, loc.ip)
        self._noded.add(id(loc))

    def _inline_row(self, thread: tuple[int, int], at: int, node: int) -> None:
        """Where a block enters or leaves an inlined body (InstructionDetail.on_split): a
        kept row of its own, as the C decoders write it (pt_feed.c: split_inlined): at the
        body's first instruction, dated with the thread's previous branch, with the
        instructions, code lines and cycles since the thread's previous kept row."""
        assert self.detail is not None
        src = self._split_src
        if src is None or src is NOWHERE:
            loc = self._location(at, None, -1, None)
        else:
            offset = src.offset - (src.ip - at) if src.offset >= 0 else -1
            symbol = src.symbol if offset >= 0 else None  # (before it: another symbol)
            loc = self._location(at, symbol, offset, src.dso)
        loc.inline = node
        self._noded.add(id(loc))
        time = self._last_time.get(thread, 0)
        _, cycles = self._pending_counts.pop(thread, (0, 0))
        self._last_kept[thread] = time
        gap, gap_insns = _gap(self._gaps.pop(thread, _NO_GAP), time)
        insn, lines = self.detail.take(thread)
        row = BranchEvent(
            thread[0], thread[1], time, BranchKind.INLINE, TraceState.NONE, loc, loc,
            False, insn, cycles, gap, lines, gap_insns,
        )  # fmt: skip
        self._out.append(row)
        self.stats.branches += 1

    def _perf_function(self, loc: Location) -> str:
        """The function of ``loc`` by perf's own name, which decides, as in the dlfilter,
        whether a jump stays inside one function (a PLT stub that perf named ``_init+0x30``
        jumping to PLT0, ``_init+0x20``, does)."""
        return self._perf_functions.get(id(loc), loc.function)

    def _intern(self, text: str) -> str:
        return self._strings.setdefault(text, sys.intern(text))

    # ------------------------------------------------------- other lines

    def _other_line(self, line: str, out: list[Event]) -> bool:
        """Everything but a well-formed branch line; returns whether a sample is pending."""
        self._slow_line(line, out)
        return self._pending is not None

    def _slow_line(self, line: str, out: list[Event]) -> None:
        """Samples, errors, power and task events, and branch lines of unusual shape."""
        if line.startswith("\t") and self._pending is not None:
            loc = self._location_text(line)
            if loc is None:
                if _has_big_hex(line):
                    self._pending_damage = "a frame's address"
                else:
                    self._unknown(line)
            elif loc is not NOWHERE:
                # perf ends frame-pointer chains with address 0: never a real frame.
                self._frames.append(loc)
            return
        self._flush_sample(out)
        stripped = line.strip()
        if not stripped:
            return
        if "error type " in line:
            err = parse_error_line(line)
            if err is not None:
                out.append(err)
                self.stats.decode_errors += 1
                return
        if "PERF_RECORD_" in line:
            self._task_line(line, out)
            return
        header = _parse_header(line)
        if header is None:
            if " => " in line:
                self.stats.shape.untimed_branches += 1
            self._unknown(line)
            return
        damage = _header_damage(header)
        if damage is not None:
            self._damaged(damage, header, out)
            return
        shape = self.stats.shape
        if header.ids == 2:
            shape.id_pairs += 1
        elif header.ids == 1:
            shape.single_ids += 1
        else:
            shape.no_ids += 1
        if not header.ns:
            shape.coarse_times += 1
        body = header.body
        if not header.event:
            # perf printed no event names (-F without event): branches are the lines
            # with "=>"; the others are psb and cbr lines, told apart by their payload.
            if " => " in body:
                if not self._branch_line(header, body, out):
                    self._not_understood(line, header, out)
            elif body.lstrip().startswith("psb offs:"):
                self.stats.psb += 1
            else:
                shape.unnamed_events += 1
            return
        name = header.event.partition(":")[0].partition("/")[0]
        if name == "cbr":
            self._power(header, line, out)
            return
        if name == "psb":
            self.stats.psb += 1
            return
        if name in _IGNORED_EVENTS:
            self.stats.ignored_events[name] += 1
            return
        if " => " in body:
            if not self._branch_line(header, body, out):
                self._not_understood(line, header, out)
            return
        text = body.strip()
        self._pending = StackSample(
            header.pid,
            header.tid,
            header.time if header.time is not None else 0,
            (),
            self._intern(header.event),
            header.period,
        )
        self._frames = []
        if text:
            # A sample printed on one line (no callchain): its own address is the stack.
            loc = self._location_text(text)
            if loc is None:
                self._pending = None
                self._not_understood(line, header, out)
            elif loc is not NOWHERE:
                self._frames.append(loc)

    def _flush_sample(self, out: list[Event]) -> None:
        sample = self._pending
        if sample is None:
            return
        self._pending = None
        damage = self._pending_damage
        if damage is not None:
            # A sample with a damaged frame: its stack cannot be trusted.
            self._pending_damage = None
            self._frames = []
            out.append(self._damage_event(damage, sample.pid, sample.tid, sample.time))
            return
        self._frames.reverse()  # perf prints the leaf first
        sample.frames = tuple(self._frames)
        self._frames = []
        out.append(sample)
        self.stats.samples += 1

    def _branch_line(self, header: _Header, body: str, out: list[Event]) -> bool:
        """A branch line the fast path did not take: odd header fields, or ``IPC:``."""
        if header.time is None:
            return False
        insn = cycles = 0
        at = body.rfind(" IPC: ")
        if at >= 0:
            counts = _parse_ipc(body[at + 6 :])
            if counts is None:
                return False
            insn, cycles = counts
            if insn + cycles > self._count_budget:
                out.append(self._damage_event("instructions or cycles", header.pid,
                                              header.tid, header.time))  # fmt: skip
                return True
            self._count_budget -= insn + cycles
            body = body[:at]
        body = body.strip()
        info = self._bodies.get(body, _MISSING)
        if info is _MISSING:
            info = self._body(body)
        if info is None:
            return False
        key = (header.pid, header.tid)
        if self.detail is not None:
            block = self._body_block(body)
            if block is not None:
                if self._inlined:
                    self._split_src = info[2] if info is not _DROP else self._drop_srcs.get(body)
                    self._out = out
                self.detail.branch(key, *block)
            self._last_time[key] = header.time
            insn = 0
        if info is _DROP:
            self.stats.branches_dropped += 1
            self._last_dropped[key] = (header.time, body)
            self._dropped(key, header.time, insn, cycles)
            return True
        kind, state, src, dst, in_tx = info
        out.append(self._kept(key, header.time, kind, state, src, dst, in_tx, insn, cycles))
        self.stats.branches += 1
        return True

    def _power(self, header: _Header, line: str, out: list[Event]) -> None:
        words = header.body.split()
        if "cbr:" not in words and "freq:" not in words:
            # perf printed the event without its payload (no ``synth`` in -F): nothing to
            # show, but nothing misunderstood either.
            self.stats.ignored_events["cbr"] += 1
            return
        try:
            at = words.index("freq:")
            cbr = _decimal(words[at - 1])
            freq = _decimal(words[at + 1])
        except (ValueError, IndexError):
            self._unknown(line)
            return
        if cbr is None or freq is None:
            self._unknown(line)
            return
        if not (0 <= cbr <= _U32 and 0 <= freq <= _U32):
            self._damaged("cbr or frequency", header, out)
            return
        time = header.time if header.time is not None else 0
        out.append(PowerEvent(header.pid, header.tid, time, cbr, freq))
        self.stats.power += 1

    def _task_line(self, line: str, out: list[Event]) -> None:
        # "PID/TID TIME: PERF_RECORD_COMM[ exec]: NAME:PID/TID"
        if self.detail is not None:
            self.detail.code.task_line(line)
        at = line.find("PERF_RECORD_COMM")
        if at < 0 or not self.comm_events:
            self.stats.task_events += 1
            return
        head, _, rest = line[at:].partition(": ")
        name, colon, ids = rest.rstrip().rpartition(":")
        pid_text, slash, tid_text = ids.partition("/")
        pid, tid = _decimal(pid_text), _decimal(tid_text)
        if not (colon and slash and pid is not None and tid is not None):
            self._unknown(line)
            return
        time = None
        words = line[:at].split()
        if words and words[-1].endswith(":") and _is_time(words[-1][:-1]):
            time = _parse_time(words[-1][:-1]) or None
        if not (_fits_i32(pid) and _fits_i32(tid)) or (time is not None and time >= TIME_LIMIT):
            out.append(self._damage_event("pid/tid or time", None, None, None))
            return
        out.append(CommEvent(pid, tid, time, self._intern(name), "exec" in head))
        self.stats.comms += 1

    def _not_understood(self, line: str, header: _Header, out: list[Event]) -> None:
        """A line with a header whose body was not understood: damaged data when it holds
        an address too large for 64 bits, else a line we do not know."""
        if _has_big_hex(header.body):
            self._damaged("an address", header, out)
        else:
            self._unknown(line)

    def _damaged(self, what: str, header: _Header, out: list[Event]) -> None:
        out.append(self._damage_event(what, header.pid, header.tid, header.time))

    def _damage_event(
        self, what: str, pid: int | None, tid: int | None, time: int | None
    ) -> DecodeError:
        """A decode error for a line with a number out of range (``what``), dated and
        placed on its thread as far as those numbers are in range."""
        self.stats.decode_errors += 1
        known = pid is not None and tid is not None and _fits_i32(pid) and _fits_i32(tid)
        return DecodeError(
            pid if known else None,
            tid if known else None,
            time if time is not None and 0 < time < TIME_LIMIT else None,
            None,
            f"{what} out of range in perf's text",
        )

    def _unknown(self, line: str) -> None:
        st = self.stats
        st.unknown_lines += 1
        if len(st.unknown_examples) < MAX_EXAMPLES:
            st.unknown_examples.append(line if len(line) <= 300 else line[:300] + "...")


# ------------------------------------------------------------------ conveniences


def parse_lines(
    lines: Iterable[str], *, keep_all: bool = False, detail: InstructionDetail | None = None
) -> tuple[list[Event], TextStats]:
    """Parse a whole (small) text at once (lines may keep their newline): events and stats."""
    parser = PerfTextParser(keep_all=keep_all, detail=detail)
    events = parser.feed(line.rstrip("\r\n") for line in lines)
    events += parser.finish()
    return events, parser.stats


def parse_text(
    batches: Iterable[list[str]],
    *,
    keep_all: bool = False,
    on_stats: Callable[[TextStats], None] | None = None,
    detail: InstructionDetail | None = None,
    comm_events: bool = True,
) -> Iterator[list[Event]]:
    """Parse batches of lines as they come (from a pipe or a file) into batches of events.

    ``on_stats`` receives the final :class:`TextStats` once the input is exhausted;
    ``detail``, ``comm_events``: see :class:`PerfTextParser`.
    """
    parser = PerfTextParser(keep_all=keep_all, detail=detail, comm_events=comm_events)
    for batch in batches:
        events = parser.feed(batch)
        if events:
            yield events
    tail = parser.finish()
    if tail:
        yield tail
    if on_stats is not None:
        on_stats(parser.stats)
