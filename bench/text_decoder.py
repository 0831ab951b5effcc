"""Throughput of the ``perf script`` text parser, against plain line splitting of the same file.

Generates N branch lines (default 1,200,000) in perf 6.1's exact text layout from the
shared realistic event stream (calls/returns between ~400 functions including a C++
template symbol, jcc/jmp inside functions, some tail calls), writes them to a temporary
file, then times on one core, best of ``--repeat`` runs:

- baseline: ``for line in f: line.split()`` over the file;
- read:     the decoder's own chunked reading into line batches (no parsing);
- parse:    reading + parsing into events, default mode (jumps inside one function
            dropped, as the dlfilter does) and ``keep_all`` (an event for every line).

Usage: ``python bench/text_decoder.py [--lines N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _events import generate_events  # noqa: E402
from support.perf_text_format import Loc, branch_line  # noqa: E402

from ptscope.decode.perf_script import read_text_lines  # noqa: E402
from ptscope.decode.perf_text import PerfTextParser  # noqa: E402
from ptscope.model import BranchKind  # noqa: E402

_CALL, _RET, _JMP, _JCC = 1 | 2, 1 | 4, 1, 1 | 8
_DSO = "/usr/local/bin/server"
_NAMES = [
    "std::vector<int, std::allocator<int> >::push_back(int const&)",
    "std::_Rb_tree<std::__cxx11::basic_string<char, std::char_traits<char>, "
    "std::allocator<char> >, std::pair<std::__cxx11::basic_string<char> const, int> >"
    "::_M_insert_unique(std::pair<char const*, int>&&)",
    "operator new(unsigned long)",
    "(anonymous namespace)::Parser::next_token() [clone .isra.0]",
    "memcpy@plt",
    "__memmove_avx_unaligned_erms",
    "malloc",
]


class Program:
    """A fixed program: every function has fixed branch sites with fixed targets, as
    compiled code has. Function i only calls functions after it (no unbounded recursion)."""

    def __init__(self, n_funcs: int, rng: random.Random) -> None:
        self.rng = rng
        self.names = [
            *_NAMES,
            *(f"module{i % 7}::fn_{i}(int, char const*)" for i in range(n_funcs)),
        ]
        self.base = {name: 0x401000 + 0x800 * i for i, name in enumerate(self.names)}
        self.locs: dict[tuple[str, int], Loc] = {}
        # Per function: a list of ("jcc", off, loop_to) / ("call", off, callee) / ("jmp", ...)
        self.body: dict[str, list[tuple[str, int, object]]] = {}
        for i, name in enumerate(self.names):
            sites: list[tuple[str, int, object]] = []
            off = 0x10
            for _ in range(rng.randint(2, 8)):
                r = rng.random()
                if r < 0.45 and i + 1 < len(self.names):
                    callee = self.names[rng.randint(i + 1, min(len(self.names) - 1, i + 40))]
                    sites.append(("call", off, callee))
                elif r < 0.85:
                    sites.append(("jcc", off, off - rng.randrange(0x8, 0x40, 4)))
                else:
                    sites.append(("jmp", off, off + rng.randrange(0x8, 0x40, 4)))
                off += rng.randrange(0x10, 0x60, 4)
            self.body[name] = sites
            self.body[name].append(("ret", off, None))

    def loc(self, name: str, off: int) -> Loc:
        key = (name, off)
        found = self.locs.get(key)
        if found is None:
            found = self.locs[key] = Loc(self.base[name] + off, name, off, _DSO)
        return found

    def run(self, name: str, depth: int, emit: Callable[[int, Loc, Loc], None]) -> None:
        rng = self.rng
        for kind, off, target in self.body[name]:
            if kind == "jcc":
                for _ in range(rng.randint(0, 6)):  # a loop: its back edge taken n times
                    emit(_JCC, self.loc(name, off), self.loc(name, max(0, off - 0x20)))
            elif kind == "jmp":
                emit(_JMP, self.loc(name, off), self.loc(name, off + 0x8))
            elif kind == "call" and depth < 25:
                callee = str(target)
                emit(_CALL, self.loc(name, off), self.loc(callee, 0))
                self.run(callee, depth + 1, emit)
                ret_off = self.body[callee][-1][1]
                emit(_RET, self.loc(callee, ret_off), self.loc(name, off + 5))


def write_lines(path: Path, n: int) -> int:
    """Write ``n`` branch lines of a fixed program run by 4 threads; return the byte size."""
    rng = random.Random(7)
    program = Program(600, rng)
    clock = [1_000_000_000_000]
    written = [0]
    with open(path, "w") as f:
        tid = [1]

        def emit(flags: int, src: Loc, dst: Loc) -> None:
            if written[0] >= n:
                raise StopIteration
            clock[0] += rng.choice((0, 0, 0, 1, 2, 7, 30))
            f.write(branch_line(4242, 4242 + tid[0], clock[0], flags, src, dst) + "\n")
            written[0] += 1

        try:
            while True:
                tid[0] = rng.randint(0, 3)
                program.run(rng.choice(program.names[:40]), 0, emit)
        except StopIteration:
            pass
    return path.stat().st_size


def write_unique_lines(path: Path, n: int) -> int:
    """Worst case for the parser's caches: random offsets, almost every line distinct."""
    events = generate_events(n, seed=7, threads=4)
    flags = {
        BranchKind.CALL: _CALL,
        BranchKind.RETURN: _RET,
        BranchKind.JUMP: _JMP,
        BranchKind.CONDITIONAL_JUMP: _JCC,
    }
    with open(path, "w") as f:
        for e in events:
            src = Loc(e.src.ip, e.src.symbol, e.src.offset, e.src.dso)
            dst = Loc(e.dst.ip, e.dst.symbol, e.dst.offset, e.dst.dso)
            f.write(branch_line(4242, 4242 + e.tid, e.time, flags[e.kind], src, dst) + "\n")
    return path.stat().st_size


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    best = float("inf")
    result = 0
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


def measure(path: Path, n: int, repeat: int) -> None:
    def baseline() -> int:
        count = 0
        with open(path) as f:
            for line in f:
                line.split()
                count += 1
        return count

    def read_only() -> int:
        return sum(len(batch) for batch in read_text_lines(path))

    def parse(keep_all: bool) -> Callable[[], int]:
        def run() -> int:
            parser = PerfTextParser(keep_all=keep_all)
            events = 0
            for batch in read_text_lines(path):
                events += len(parser.feed(batch))
            events += len(parser.finish())
            assert parser.stats.unknown_lines == 0, parser.stats.summary()
            return events

        return run

    rows = [
        ("baseline: for line in f: line.split()", baseline),
        ("read: chunked line batches", read_only),
        ("parse (default: drop jumps inside functions)", parse(False)),
        ("parse (keep_all: one event per line)", parse(True)),
    ]
    base_t = 0.0
    print(f"  {'':46} {'seconds':>8} {'lines/s':>12} {'events':>10} {'x baseline':>10}")
    for name, fn in rows:
        t, result = best_of(repeat, fn)
        base_t = base_t or t
        print(f"  {name:46} {t:8.3f} {n / t:12,.0f} {result:10,} {t / base_t:10.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-unique", action="store_true", help="skip the worst-case data set")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sets = [("realistic: fixed program, 4 threads", write_lines)]
    if not args.no_unique:
        sets.append(("worst case: random sites, ~every line distinct", write_unique_lines))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "branches.txt"
        for title, write in sets:
            t0 = time.perf_counter()
            size = write(path, args.lines)
            took = time.perf_counter() - t0
            print(f"{title}: {args.lines:,} lines, {size / 1e6:.0f} MB (generated in {took:.0f} s)")
            measure(path, args.lines, args.repeat)


if __name__ == "__main__":
    main()
