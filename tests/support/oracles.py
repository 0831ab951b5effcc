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

from ptscope.timeline import Timeline

Tree = list[tuple[int, str]]
"""Preorder ``(depth, name)`` of one thread's calls."""
Trees = dict[int, Tree]
"""Per thread id."""

HOOKS_SOURCE = Path(__file__).with_name("cyg_hooks.c")
_CYG_MAGIC = 0x315F4759435F5450
_CYG_RECORD = struct.Struct("<QQQII")
_CLONE_SUFFIX = re.compile(r"\.(?:isra|constprop|part|cold|lto_priv|localalias)(?:\.\d+)*")


class OracleError(Exception):
    """The oracle's own data is inconsistent (a bug in the test, not in ptscope)."""


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


def function_symbols(exe: Path, load: int) -> dict[int, str]:
    """Run-time address -> name of every function symbol of ``exe`` loaded at ``load``."""
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        base = min(
            seg["p_vaddr"] for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"
        ) & ~0xFFF
        bias = load - base
        names: dict[int, str] = {}
        for section in elf.iter_sections():
            if not isinstance(section, SymbolTableSection):
                continue
            for sym in section.iter_symbols():
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]:
                    names.setdefault(sym["st_value"] + bias, sym.name)
    return names


def cyg_trees(
    log: Path,
    exe: Path,
    keep: Callable[[str], bool],
    stack_of: Callable[[CygRecord], object] | None = None,
) -> Trees:
    """The call tree the hooks logged, per thread (or per ``stack_of(record)`` key, for
    programs that switch stacks: the tree of each stack, keyed ``(tid, stack)``)."""
    load, records = read_cyg_log(log)
    names = function_symbols(exe, load)
    stacks: dict[object, list[tuple[str, int]]] = {}
    trees: dict[object, Tree] = {}
    for r in records:
        name = names.get(r.function)
        if name is None:
            raise OracleError(f"hook log names {r.function:#x}, which is no function of {exe}")
        name = base_name(name)
        if not keep(name):
            continue
        key: object = r.tid if stack_of is None else (r.tid, stack_of(r))
        stack = stacks.setdefault(key, [])
        tree = trees.setdefault(key, [])
        if r.kind == 1:
            _drop_dead_frames(stack, r)
            tree.append((len(stack), name))
            stack.append((name, r.fp))
        else:
            for k in range(len(stack) - 1, -1, -1):
                if stack[k] == (name, r.fp):
                    del stack[k:]
                    break
            else:
                raise OracleError(f"exit of {name} (frame {r.fp:#x}) that never entered")
    return trees  # type: ignore[return-value]


def _drop_dead_frames(stack: list[tuple[str, int]], r: CygRecord) -> None:
    """Before an enter: frames that ended without an exit record (longjmp) are gone."""
    for k in range(len(stack) - 1, -1, -1):
        if stack[k][1] == r.parent_fp:
            del stack[k + 1 :]  # called from that frame: anything above it died
            return
    # The caller keeps no frame pointer of ours (libc, the kernel's signal frame): frames at
    # or below this one's address cannot be alive (the stack grows down).
    while stack and stack[-1][1] <= r.fp:
        stack.pop()


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


def nest(items: Iterable[tuple[float, float, str]], keep: Callable[[str], bool]) -> Tree:
    """Nest ``(start, end, name)`` slices of one thread by time (Perfetto's rule; ties keep
    the given order) and return the preorder of the kept names with depths among them."""
    ordered = sorted(enumerate(items), key=lambda x: (x[1][0], -x[1][1], x[0]))
    tree: Tree = []
    stack: list[tuple[float, bool]] = []  # (end, kept)
    kept_open = 0
    for _, (start, end, name) in ordered:
        # A slice that ends where this one starts is done, unless this one is empty.
        while stack and stack[-1][0] <= start and not stack[-1][0] == start == end:
            kept_open -= stack.pop()[1]
        name = base_name(name)
        k = keep(name)
        if k:
            tree.append((kept_open, name))
        stack.append((end, k))
        kept_open += k
    return tree


def fxt_trees(path: Path, keep: Callable[[str], bool]) -> Trees:
    """The call tree of a ptscope trace, read with the third-party ``fxt`` reader."""
    with open(path, "rb") as f:
        compressed = f.read(2) == b"\x1f\x8b"
    with gzip.open(path, "rb") if compressed else open(path, "rb") as f:
        result = parse_records(f)
    slices: dict[int, list[tuple[float, float, str]]] = {}
    for records in result.records_by_provider.values():
        for r in records.records:
            if isinstance(r, DurationCompleteEventRecord):
                tid = r.thread.thread_id
                # The reader calls the end tick a duration (see fxt_check.py).
                slices.setdefault(tid, []).append((r.timestamp_ns, r.duration_ns, r.name))
    return {tid: nest(items, keep) for tid, items in slices.items()}


def timeline_trees(timeline: Timeline, keep: Callable[[str], bool]) -> Trees:
    """The call tree of an engine's Timeline (slices nested by time, like the trace)."""
    out: Trees = {}
    for th in timeline.threads:
        items = [(float(s.start), float(s.end), s.name) for s in th.slices(timeline.names)]
        out[th.tid] = nest(items, keep)
    return out


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
