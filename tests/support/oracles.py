"""Call trees from oracles that share nothing with ptscope's engine, and from ptscope's output.

A call tree here is, per thread, the preorder list of ``(depth, name)`` of the calls of a
chosen set of functions (a program's own functions), depth counted among those functions
only. Two trees are equal exactly when the nesting is the same, so comparing lists compares
everything an oracle can see.

Oracles:

* :func:`cyg_trees` — a program built with ``-finstrument-functions`` and linked with
  ``cyg_hooks.c`` logs every enter and exit of its own functions, with frame addresses.
  The compiler put the hooks there, not us. Blind spots: ``longjmp`` skips exits (the frame
  addresses tell which frames died: a frame whose caller's frame is found on the stack pops
  everything above that caller; otherwise every frame at or below the new frame's address is
  dead); an inlined function still logs an enter/exit without a call (generated programs
  mark every function ``noinline, noclone`` in instrumented builds); instrumentation keeps
  ``return f(x)`` from being a tail call, so tail calls are not exercised by this oracle.
* :func:`uftrace_trees` — ``uftrace`` on a ``-pg`` build, run natively (not under QEMU).
  Blind spots: it nests a tail call under its caller (ptscope replaces the caller, as the
  stack does), so it is used where the compiler makes no tail calls (-O0, -O1, or
  ``-fno-optimize-sibling-calls``).

ptscope's side: :func:`fxt_trees` reads a trace with the third-party ``fxt`` reader and nests
slices by time, as Perfetto does; :func:`timeline_trees` reads an engine's Timeline.
"""

from __future__ import annotations

import gzip
import re
import struct
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from fxt.models import DurationCompleteEventRecord
from fxt.reader import parse_records

from ptscope.fxt.records import ARG_FLAGS
from ptscope.timeline import SliceFlags, Timeline

Tree = list[tuple[int, str]]
"""Preorder ``(depth, name)`` of one thread's calls."""
Trees = dict[int, Tree]
"""Per thread id."""

HOOKS_SOURCE = Path(__file__).with_name("cyg_hooks.c")
_CYG_MAGIC = 0x315F4759435F5450
_CYG_RECORD = struct.Struct("<QQQII")
_INFERRED = int(SliceFlags.INFERRED_START)
_CLONE_SUFFIX = re.compile(r"\.(?:isra|constprop|part|cold|lto_priv|localalias)(?:\.\d+)*")


class OracleError(Exception):
    """The oracle's own data is inconsistent (a bug in the test, not in ptscope)."""


class OracleBlind(OracleError):
    """The oracle could not see this run (it says so itself): nothing to compare."""


def base_name(name: str) -> str:
    """A function's name without C++ parameters and without compiler clone suffixes
    (``f3.isra.0`` and ``f3`` are one function to an oracle that logs the original)."""
    if "(" in name:
        name = name[: name.index("(")]
    return _CLONE_SUFFIX.sub("", name)


# ------------------------------------------------------------------- the cyg oracle


@dataclass(frozen=True)
class CygRecord:
    kind: int  # 1 enter, 2 exit
    function: int
    fp: int
    parent_fp: int
    tid: int


def read_cyg_log(path: Path) -> tuple[int, list[CygRecord]]:
    """(the program's load address, its records in the order they were logged)."""
    data = path.read_bytes()
    if len(data) < 32:
        raise OracleError(f"{path}: no hook log (did the program exit normally?)")
    magic, load, count, capacity = struct.unpack_from("<4Q", data)
    if magic != _CYG_MAGIC:
        raise OracleError(f"{path}: not a hook log")
    if count > capacity:
        raise OracleError(f"{path}: {count - capacity} records lost (buffer full)")
    records = []
    for off in range(32, 32 + count * _CYG_RECORD.size, _CYG_RECORD.size):
        fn, fp, parent, tid, kind = _CYG_RECORD.unpack_from(data, off)
        records.append(CygRecord(kind, fn, fp, parent, tid))
    return load, records


def _symbols(exe: Path, load: int, kinds: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """name -> (run-time address, size) of ``exe``'s symbols of the given types."""
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        base = (
            min(seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD")
            & ~0xFFF
        )
        bias = load - base
        out: dict[str, tuple[int, int]] = {}
        for section in elf.iter_sections():
            if not isinstance(section, SymbolTableSection):
                continue
            for sym in section.iter_symbols():
                if sym["st_info"]["type"] in kinds and sym["st_value"]:
                    out.setdefault(sym.name, (sym["st_value"] + bias, sym["st_size"]))
    return out


def function_symbols(exe: Path, load: int) -> dict[int, str]:
    """Run-time address -> name of every function symbol of ``exe`` loaded at ``load``."""
    names: dict[int, str] = {}
    for name, (address, _) in _symbols(exe, load, ("STT_FUNC",)).items():
        names.setdefault(address, name)
    return names


def object_symbol(exe: Path, load: int, name: str) -> tuple[int, int]:
    """(run-time address, size) of the data object ``name`` of ``exe``."""
    return _symbols(exe, load, ("STT_OBJECT",))[name]


@dataclass(frozen=True)
class Activation:
    """One call of one of the program's own functions, as the hooks saw it."""

    name: str
    stack: object
    """Which stack it ran on (``stack_of``'s answer; 0 when not asked)."""
    parent: int
    """Index of the activation that called it (its thread's list), -1 for none."""
    depth: int


def cyg_activations(
    log: Path,
    exe: Path,
    keep: Callable[[str], bool],
    stack_of: Callable[[int], object] | None = None,
) -> dict[int, list[Activation]]:
    """Every call the hooks logged, per thread, in the order they happened.

    ``stack_of(frame_address)`` names the stack a frame lives on, for programs that switch
    stacks (coroutines): each stack then has its own chain of callers.
    """
    load, records = read_cyg_log(log)
    names = function_symbols(exe, load)
    stacks: dict[tuple[int, object], list[tuple[str, int, int]]] = {}  # (name, fp, index)
    out: dict[int, list[Activation]] = {}
    for r in records:
        name = names.get(r.function)
        if name is None:
            raise OracleError(f"hook log names {r.function:#x}, which is no function of {exe}")
        name = base_name(name)
        if not keep(name):
            continue
        where = stack_of(r.fp) if stack_of is not None else 0
        stack = stacks.setdefault((r.tid, where), [])
        calls = out.setdefault(r.tid, [])
        if r.kind == 1:
            _drop_dead_frames(stack, r)
            parent = stack[-1][2] if stack else -1
            stack.append((name, r.fp, len(calls)))
            calls.append(Activation(name, where, parent, len(stack) - 1))
        else:
            for k in range(len(stack) - 1, -1, -1):
                if stack[k][:2] == (name, r.fp):
                    del stack[k:]
                    break
            else:
                raise OracleError(f"exit of {name} (frame {r.fp:#x}) that never entered")
    return out


def cyg_functions(log: Path, exe: Path) -> set[str]:
    """The functions the hooks logged: the program's own (instrumented) code that ran."""
    load, records = read_cyg_log(log)
    names = function_symbols(exe, load)
    return {base_name(names[f]) for f in {r.function for r in records} if f in names}


def cyg_trees(log: Path, exe: Path, keep: Callable[[str], bool]) -> Trees:
    """The call tree the hooks logged, per thread."""
    return {
        tid: [(a.depth, a.name) for a in calls]
        for tid, calls in cyg_activations(log, exe, keep).items()
    }


def _drop_dead_frames(stack: list[tuple[str, int, int]], r: CygRecord) -> None:
    """Before an enter: frames that ended without an exit record (longjmp) are gone."""
    for k in range(len(stack) - 1, -1, -1):
        if stack[k][1] == r.parent_fp:
            del stack[k + 1 :]  # called from that frame: anything above it died
            return
    # The caller keeps no frame pointer of ours (libc, the kernel's signal frame): frames at
    # or below this one's address cannot be alive (the stack grows down).
    while stack and stack[-1][1] <= r.fp:
        stack.pop()


# ---------------------------------------------------------- a program's own log


def self_log_activations(path: Path) -> list[Activation]:
    """The calls a program logged itself, in the order they happened.

    The corpus programs of other languages (``tests/programs/*.ml``, ``.go``, ``.rs``)
    write a line of their function names, then one little-endian int64 per event:
    ``id << 16 | stack << 8 | function << 2 | kind``, kind 1 when activation ``id`` of
    ``names[function]`` is entered on ``stack`` (a goroutine; 0 otherwise), 2 when it
    returns, 3 when a handler of activation ``id`` runs (an exception ended every
    activation above it on its stack). Each stack has its own chain of callers."""
    head, _, body = path.read_bytes().partition(b"\n")
    names = head.decode().split()
    stacks: dict[int, list[tuple[int, int]]] = {}  # stack -> [(id, index in calls)]
    where: dict[int, int] = {}
    calls: list[Activation] = []
    for (v,) in struct.iter_unpack("<q", body):
        kind, a, stack_id = v & 3, v >> 16, (v >> 8) & 0xFF
        if kind == 1:
            stack = stacks.setdefault(stack_id, [])
            where[a] = stack_id
            parent = stack[-1][1] if stack else -1
            stack.append((a, len(calls)))
            calls.append(Activation(names[(v >> 2) & 63], stack_id, parent, len(stack) - 1))
            continue
        stack = stacks.get(where.get(a, -1), [])
        ids = [i for i, _ in stack]
        if a not in ids:
            raise OracleError(f"{path}: event {v:#x} names no running activation")
        k = ids.index(a)
        if kind == 2 and k != len(stack) - 1:
            raise OracleError(f"{path}: activation {a} returns from below the top")
        del stack[k if kind == 2 else k + 1 :]
    return calls


def self_log_tree(path: Path) -> Tree:
    """The call tree of a program's own log (one thread)."""
    return [(a.depth, a.name) for a in self_log_activations(path)]


# ------------------------------------------------------------------ the uftrace oracle

_UFTRACE_LINE = re.compile(r"^\s*\[\s*(\d+)\]\s*\|\s?(\s*)(.*)$")


def uftrace_trees(data: Path, keep: Callable[[str], bool]) -> Trees:
    """The call tree of ``uftrace replay`` of a ``uftrace record -d DATA`` directory."""
    out = subprocess.run(
        ["uftrace", "replay", "-d", str(data), "--no-libcall", "-f", "tid"],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise OracleError(f"uftrace replay failed: {out.stderr.strip()[:300]}")
    if "LOST" in out.stdout or "lost" in out.stderr.lower():
        # uftrace drops records when its buffers fill faster than its writer empties
        # them (a loaded machine): its tree is then incomplete.
        raise OracleBlind("uftrace lost records")
    stacks: dict[int, list[str]] = {}
    trees: Trees = {}
    for line in out.stdout.splitlines():
        m = _UFTRACE_LINE.match(line)
        if not m:
            continue
        tid, text = int(m.group(1)), m.group(3).strip()
        stack = stacks.setdefault(tid, [])
        tree = trees.setdefault(tid, [])
        if text.startswith("}"):
            name = base_name(text.partition("/*")[2].rstrip("*/ ").strip())
            if keep(name):
                if name not in stack:
                    raise OracleError(f"uftrace: end of {name}, which is not running")
                # Frames above it ended unseen (longjmp): uftrace prints no end for them.
                del stack[len(stack) - 1 - stack[::-1].index(name) :]
            continue
        if "(" not in text:
            continue  # an event line (signal, sched, ...)
        name = base_name(text)
        if not keep(name):
            continue
        tree.append((len(stack), name))
        if text.endswith("{"):
            stack.append(name)
    return trees


# ------------------------------------------------------------------- ptscope's side


@dataclass(frozen=True)
class TraceSlice:
    start: float
    end: float
    name: str
    flags: int = 0


def _nest_own(
    items: Iterable[TraceSlice], keep: Callable[[str], bool]
) -> list[tuple[TraceSlice, int, int]]:
    """Nest one thread's slices by time (Perfetto's rule; ties keep the given order) and
    return the kept ones in preorder as (slice, depth among kept, index of the nearest kept
    ancestor in the returned list or -1)."""
    ordered = sorted(enumerate(items), key=lambda x: (x[1].start, -x[1].end, x[0]))
    out: list[tuple[TraceSlice, int, int]] = []
    stack: list[tuple[float, int]] = []  # (end, index in out or -1)
    owners: list[int] = []  # kept ancestors' indices in out
    for _, s in ordered:
        # A slice that ends where this one starts is done, unless this one is empty.
        while stack and stack[-1][0] <= s.start and not stack[-1][0] == s.start == s.end:
            if stack.pop()[1] >= 0:
                owners.pop()
        if keep(base_name(s.name)):
            out.append((s, len(owners), owners[-1] if owners else -1))
            stack.append((s.end, len(out) - 1))
            owners.append(len(out) - 1)
        else:
            stack.append((s.end, -1))
    return out


def nest(items: Iterable[tuple[float, float, str]], keep: Callable[[str], bool]) -> Tree:
    """The preorder ``(depth among kept, name)`` of one thread's ``(start, end, name)``."""
    nested = _nest_own((TraceSlice(a, b, n) for a, b, n in items), keep)
    return [(depth, base_name(s.name)) for s, depth, _ in nested]


def fxt_slices(path: Path) -> dict[int, list[TraceSlice]]:
    """Every call of a ptscope trace (its complete slices but inlined bodies, which no
    oracle here sees as calls: see tests/decode/test_inlined_frames.py), per thread, read
    with the ``fxt`` reader."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
        result = parse_records(f)
    slices: dict[int, list[TraceSlice]] = {}
    for records in result.records_by_provider.values():
        for r in records.records:
            if isinstance(r, DurationCompleteEventRecord):
                # The flags arg names the flags ("inferred_start|open_at_end").
                words = str(r.args.get(ARG_FLAGS, "")).split("|")
                if "inlined" in words:
                    continue
                flags = _INFERRED if "inferred_start" in words else 0
                # The reader calls the end tick a duration (see fxt_check.py).
                slices.setdefault(r.thread.thread_id, []).append(
                    TraceSlice(r.timestamp_ns, r.duration_ns, r.name, flags)
                )
    return slices


def fxt_trees(path: Path, keep: Callable[[str], bool]) -> Trees:
    """The call tree of a ptscope trace, read with the third-party ``fxt`` reader."""
    return {
        tid: nest(((s.start, s.end, s.name) for s in items), keep)
        for tid, items in fxt_slices(path).items()
    }


def timeline_slices(timeline: Timeline) -> dict[int, list[TraceSlice]]:
    """Every call of an engine's Timeline (inlined bodies left out), per thread."""
    return {
        th.tid: [
            TraceSlice(float(s.start), float(s.end), s.name, int(s.flags))
            for s in th.slices(timeline.names)
            if not s.flags & SliceFlags.INLINED
        ]
        for th in timeline.threads
    }


def timeline_trees(timeline: Timeline, keep: Callable[[str], bool]) -> Trees:
    """The call tree of an engine's Timeline (slices nested by time, like the trace)."""
    return {
        tid: nest(((s.start, s.end, s.name) for s in items), keep)
        for tid, items in timeline_slices(timeline).items()
    }


def check_own_stacks(
    slices: Iterable[TraceSlice], calls: list[Activation], keep: Callable[[str], bool]
) -> list[str]:
    """Problems with a trace of a program that switches stacks (empty = none).

    The trace shows one stack at a time (see docs/architecture.md, stack switches), so it is
    not one tree to compare; instead: every call the hooks saw is a slice (not flagged as
    inferred), in the same order; and every slice's nearest own ancestor is its real
    caller — or, at the bottom of a stack's run, a frame of another stack. A slice that
    continues a call made before a switch (flagged inferred) stands for the call whose
    callees it holds, and all of them must agree: frames of two calls, or of two stacks,
    never merge.
    """
    own = _nest_own(slices, keep)
    made = [k for k, (s, _, _) in enumerate(own) if not s.flags & _INFERRED]
    names = [base_name(own[k][0].name) for k in made]
    expected = [a.name for a in calls]
    if names != expected:
        k = next(
            (i for i, (a, b) in enumerate(zip(names, expected, strict=False)) if a != b),
            min(len(names), len(expected)),
        )
        return [
            f"call {k}: trace has {names[k : k + 3]}, hooks saw {expected[k : k + 3]} "
            f"({len(names)} calls in the trace, {len(expected)} logged)"
        ]
    who: dict[int, int] = dict(zip(made, range(len(calls)), strict=True))
    problems: list[str] = []
    for k in made:  # a continued frame is the caller of the calls it holds
        parent = own[k][2]
        if parent >= 0 and own[parent][0].flags & _INFERRED:
            caller = calls[who[k]].parent
            if who.setdefault(parent, caller) != caller:
                problems.append(
                    f"slice {parent} ({own[parent][0].name}) holds calls of "
                    f"two different calls {who[parent]} and {caller}"
                )
    for k, (s, _, parent) in enumerate(own):
        if k not in who:
            continue
        mine = calls[who[k]]
        theirs = who.get(parent, -2) if parent >= 0 else -1
        if theirs == mine.parent:
            continue
        # The bottom of a stack's run (a continued frame, or a call with no caller of ours:
        # a coroutine's body) may sit on a frame of another stack, or on nothing we know.
        bottom = bool(s.flags & _INFERRED) or mine.parent < 0
        if bottom and (theirs < 0 or calls[theirs].stack != mine.stack):
            continue
        where = f"{own[parent][0].name} (call {theirs})" if parent >= 0 else "nothing"
        problems.append(
            f"{s.name} (call {who[k]}) is under {where}; its caller is call {mine.parent}"
        )
    return problems


# ------------------------------------------------------------------------ comparing


def first_difference(expected: Trees, got: Trees, *, context: int = 4) -> str | None:
    """None when equal; else where the trees first differ, with context, for a message."""
    if sorted(expected) != sorted(got):
        # Thread ids may differ (tid reuse); pair them in order of first appearance.
        if len(expected) != len(got):
            return f"threads differ: oracle {sorted(expected)}, trace {sorted(got)}"
        pairs = list(zip(expected.values(), got.values(), strict=True))
        tids = list(zip(expected, got, strict=True))
    else:
        pairs = [(expected[t], got[t]) for t in sorted(expected)]
        tids = [(t, t) for t in sorted(expected)]
    for (tid_e, tid_g), (e, g) in zip(tids, pairs, strict=True):
        if e == g:
            continue
        k = next((i for i, (a, b) in enumerate(zip(e, g, strict=False)) if a != b), None)
        if k is None:
            k = min(len(e), len(g))
        lo = max(0, k - context)
        rows = []
        for i in range(lo, k + context + 1):
            a = f"{'  ' * e[i][0]}{e[i][1]}" if i < len(e) else "-"
            b = f"{'  ' * g[i][0]}{g[i][1]}" if i < len(g) else "-"
            mark = ">" if i == k else " "
            rows.append(f" {mark}{i:6d}  {a:40.40s} | {b}")
        return (
            f"tid {tid_e}/{tid_g}: call {k} of {len(e)} differs (trace has {len(g)} calls)\n"
            f"   index  oracle{' ' * 34} | trace\n" + "\n".join(rows)
        )
    return None
