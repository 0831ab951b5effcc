"""A small language for writing event streams by hand, and the transcript renderer.

Input lines (one event each; ``#`` starts a comment)::

    100 call main+0x10 => f             # perf's branch words: call, return, jmp, jcc,
    120 return f+0x8 => main+0x15       #   syscall, sysret, int, iret, hw int, async,
    130 tr end  syscall write+0x5 => 0  #   tx abrt, tr strt, tr end, tr strt jmp, ...
    140 tr strt 0 => write+0x7          # `0` is "nowhere"; `sym` means `sym+0x0`
    150 error Overflow packet           # a decode error (time may be `-` for none)
    155 cbr 3600                        # a CPU frequency change (MHz)
    160 tid=2 call g+0x4 => h           # another thread (default tid 1, pid 1)
    170 (x) jmp f+0x3 => g              # in a transaction
    180 call f+0x3!0x1000 => g          # explicit addresses: `sym+0xOFF!0xADDR`
    190 gap=185 return g+0x8 => f+0x8   # a jump dropped at 185 (BranchEvent.gap_time)

A header line ``#! pad f+0x40 <= f+0x18..f+0x1d`` says that exceptions thrown from call
sites in ``[f+0x18, f+0x1d)`` land at ``f+0x40`` (the binary's exception tables, as the
engine's landing-pad lookup would read them). ``#! inline g = f+0x8..f+0x20 at a.c:10``
says that ``[f+0x8, f+0x20)`` is the body of ``g`` inlined into ``f`` at ``a.c:10``
(``#! inline h in g = ...``: inlined in that body; the addresses of the innermost body a
location falls in are its node, as DWARF gives them); ``105 inline f+0x8`` is the
decoders' row where control enters or leaves a body there without a branch.

Symbols get stable fake addresses (0x400000 + 0x1000 * n) so offsets stay meaningful.
The transcript interleaves each input line with what the engine's final pass produced at the
slots that event created: ``-> TIME END name``, ``-> TIME BEGIN name``, ``-> TIME INSTANT``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ptscope.model import (
    NOWHERE,
    BranchEvent,
    BranchFlags,
    BranchKind,
    DecodeError,
    Event,
    InlineNodes,
    Location,
    PowerEvent,
    TraceState,
    classify_flags,
)
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.timeline import SliceFlags, Timeline

F = BranchFlags
WORDS: dict[str, int] = {
    "call": F.BRANCH | F.CALL,
    "return": F.BRANCH | F.RETURN,
    "jcc": F.BRANCH | F.CONDITIONAL,
    "jmp": F.BRANCH,
    "int": F.BRANCH | F.CALL | F.INTERRUPT,
    "iret": F.BRANCH | F.RETURN | F.INTERRUPT,
    "syscall": F.BRANCH | F.CALL | F.SYSCALLRET,
    "sysret": F.BRANCH | F.RETURN | F.SYSCALLRET,
    "async": F.BRANCH | F.ASYNC,
    "hw int": F.BRANCH | F.CALL | F.ASYNC | F.INTERRUPT,
    "tx abrt": F.BRANCH | F.TX_ABORT,
    "tr strt": F.BRANCH | F.TRACE_BEGIN,
    "tr end": F.BRANCH | F.TRACE_END,
}


@dataclass
class Script:
    """Parsed input: the events and the source line of each."""

    events: list[Event] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    symbols: dict[str, int] = field(default_factory=dict)
    pads: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    inline: InlineNodes | None = None
    bodies: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, node)

    def landing_pads(self, dso: str, ip: int) -> list[tuple[int, int]]:
        """The engine's landing-pad lookup, from the script's ``#! pad`` lines."""
        return self.pads.get(ip, [])

    def location(self, text: str) -> Location:
        if text == "0":
            return NOWHERE
        text, _, at = text.partition("!")
        if at:  # an explicit address: `sym+0xOFF!0xADDR`
            sym, _, off = text.partition("+")
            if sym == "[unknown]":
                return Location(int(at, 16), sym, -1, "libgcc_s.so.1")
            return Location(int(at, 16), sym, int(off, 16) if off else 0, "prog")
        sym, _, off = text.partition("+")
        offset = int(off, 16) if off else 0
        if sym == "[unknown]":
            return Location(0xDEAD0000 + offset, "[unknown]", -1, "")
        base = self.symbols.setdefault(sym, 0x400000 + 0x1000 * len(self.symbols))
        ip = base + offset
        inside = [(e - s, n) for s, e, n in self.bodies if s <= ip < e]
        return Location(ip, sym, offset, "prog", inline=min(inside)[1] if inside else 0)


def parse_script(text: str) -> Script:
    script = Script()
    for raw in text.splitlines():
        if raw.startswith("#! pad "):
            pad, _, sites = raw[len("#! pad ") :].partition(" <= ")
            start, _, end = sites.partition("..")
            ranges = script.pads.setdefault(script.location(pad.strip()).ip, [])
            ranges.append((script.location(start.strip()).ip, script.location(end.strip()).ip))
            continue
        if raw.startswith("#! inline "):
            head, _, rest = raw[len("#! inline ") :].partition(" = ")
            name, _, parent = head.partition(" in ")
            span, _, site = rest.partition(" at ")
            start, _, end = span.partition("..")
            if script.inline is None:
                script.inline = InlineNodes()
            up = script.inline.add(parent.strip(), parent.strip(), "", 0) if parent else 0
            node = script.inline.add(name.strip(), name.strip(), site.strip(), up)
            lo, hi = script.location(start.strip()).ip, script.location(end.strip()).ip
            script.bodies.append((lo, hi, node))
            continue
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("->") or line.strip() == "INPUT ENDED":
            continue
        script.lines.append(line.strip())
        script.events.append(_parse_event(script, line))
    return script


def _parse_event(script: Script, line: str) -> Event:
    words = line.split()
    time_s = words.pop(0)
    time = None if time_s == "-" else int(time_s)
    pid = tid = 1
    gap_time = 0
    while words and words[0].startswith(("tid=", "pid=", "gap=")):
        k, v = words.pop(0).split("=")
        if k == "tid":
            tid = int(v)
        elif k == "gap":
            gap_time = int(v)
        else:
            pid = int(v)
    if words[0] == "error":
        return DecodeError(pid, tid, time, None, " ".join(words[1:]))
    if words[0] == "cbr":  # `TIME cbr MHZ`: a CPU frequency change
        assert time is not None, line
        return PowerEvent(pid, tid, time, int(words[1]) // 100, int(words[1]))
    if words[0] == "inline":  # `TIME inline f+0x8`: control enters or leaves a body there
        assert time is not None, line
        where = script.location(words[1])
        return BranchEvent(pid, tid, time, BranchKind.INLINE, TraceState.NONE, where, where)
    in_tx = words[0] == "(x)"
    if in_tx:
        words.pop(0)
    arrow = words.index("=>")
    src, dst = words[arrow - 1], words[arrow + 1]
    kind_words = words[: arrow - 1]
    flags = 0
    i = 0
    while i < len(kind_words):
        two = " ".join(kind_words[i : i + 2])
        if two in WORDS:
            flags |= WORDS[two]
            i += 2
        else:
            flags |= WORDS[kind_words[i]]
            i += 1
    if in_tx:
        flags |= F.IN_TX
    kind, state = classify_flags(flags)
    assert time is not None, line
    return BranchEvent(
        pid,
        tid,
        time,
        kind,
        state,
        script.location(src),
        script.location(dst),
        in_tx,
        gap_time=gap_time,
    )


def run_transcript(text: str) -> tuple[str, Timeline, TraceSegmentEngine]:
    """Feed a script through the engine; return the transcript, the timeline, the engine."""
    script = parse_script(text)
    engine = TraceSegmentEngine(
        keep_slots=True, landing_pads=script.landing_pads, inline=script.inline
    )
    owner: dict[tuple[int, int, int], int] = {}  # (pid, tid, slot) -> input line index
    for index, event in enumerate(script.events):
        pid = getattr(event, "pid", 1) or 1
        tid = getattr(event, "tid", 1) or 1
        before = engine.thread_slot_count(pid, tid)
        engine.feed(event)
        after = engine.thread_slot_count(pid, tid)
        for slot in range(before, after):
            owner[(pid, tid, slot)] = index
    timeline = engine.finish()
    engine.self_check(timeline)
    multi = len(timeline.threads) > 1
    # (line index or -1 for the end) -> list of (slot, order, depth, text)
    out: dict[int, list[tuple[int, int, int, int, str]]] = defaultdict(list)
    first_slot: dict[int, int] = {}
    for (_, _, slot), index in owner.items():
        first_slot[index] = min(slot, first_slot.get(index, slot))
    for ti, tt in enumerate(timeline.threads):
        prefix = f"[tid {tt.tid}] " if multi else ""
        start_slots, end_slots = engine.slot_columns[(tt.pid, tt.tid)]
        for i, sl in enumerate(tt.slices(timeline.names)):
            s0, s1 = int(start_slots[i]), int(end_slots[i])
            note = " (inferred)" if sl.flags & SliceFlags.INFERRED_START else ""
            note += " (inlined)" if sl.flags & SliceFlags.INLINED else ""
            out[owner.get((tt.pid, tt.tid, s0), -1)].append(
                (ti, s0, 2, sl.depth, f"{prefix}{sl.start} BEGIN {sl.name}{note}")
            )
            note = " (return not seen)" if sl.flags & SliceFlags.OPEN_AT_END else ""
            out[owner.get((tt.pid, tt.tid, s1), -1)].append(
                (ti, s1, 0, -sl.depth, f"{prefix}{sl.end} END   {sl.name}{note}")
            )
        # The k-th instant of a thread is its k-th decode error.
        errors = [
            k
            for k, e in enumerate(script.events)
            if isinstance(e, DecodeError) and (e.tid or 1) == tt.tid
        ]
        for k, inst in enumerate(tt.instants):
            idx = errors[k] if k < len(errors) else -1
            slot = first_slot.get(idx, -1)
            out[idx].append((ti, slot, 1, 0, f"{prefix}{inst.time} INSTANT {inst.name}"))
    lines: list[str] = []
    for index, line in enumerate(script.lines):
        lines.append(line)
        lines.extend(f"  -> {text}" for *_, text in sorted(out.get(index, [])))
    lines.append("INPUT ENDED")
    lines.extend(f"  -> {text}" for *_, text in sorted(out.get(-1, [])))
    return "\n".join(lines) + "\n", timeline, engine
