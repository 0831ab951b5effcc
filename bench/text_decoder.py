"""Throughput of the ``perf script`` text parser, against plain line splitting of the same text.

Data sets (each about ``--lines`` lines, default 1,200,000, written to a temporary file):

- realistic: a generated fixed program (600 functions with fixed branch sites, C++
  template names, loops of jcc, calls/returns, 4 threads) in perf 6.1's exact layout;
- real: the text real ``perf script`` prints for an emulated Intel PT recording (QEMU) of a
  C program (PIE, ld.so, libc: qsort with a callback, snprintf, strcmp, malloc); skipped
  if QEMU or the emulated backend is missing;
- worst case: random branch sites, nearly every line distinct (defeats the caches).

Timed on one core, best of ``--repeat`` runs:

- baseline: ``for line in f: line.split()`` over the file;
- read:     the decoder's own chunked reading into line batches (no parsing);
- parse:    reading + parsing into events, default mode (jumps inside one function
            dropped, as the dlfilter does) and ``keep_all`` (an event for every line).

For the real recording, also end to end (both cores): ``perf script`` into /dev/null (the
floor) against perf piped into the parser (``decode_perf_data_text``).

Usage: ``python bench/text_decoder.py [--lines N] [--repeat R] [--no-unique] [--no-real]``
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from _events import generate_events  # noqa: E402
from ptscope.decode.perf_script import (  # noqa: E402
    branch_script_argv,
    decode_perf_data_text,
    read_text_lines,
)
from ptscope.decode.perf_text import PerfTextParser  # noqa: E402
from ptscope.model import BranchKind  # noqa: E402
from support.perf_text_format import Loc, branch_line  # noqa: E402

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


_REAL_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct item { char name[16]; long value; };
static int by_name(const void *a, const void *b) {
    return strcmp(((const struct item *)a)->name, ((const struct item *)b)->name);
}
__attribute__((noinline)) static long checksum(const struct item *items, int n) {
    long s = 0;
    for (int i = 0; i < n; i++) s = s * 31 + items[i].value + (long)strlen(items[i].name);
    return s;
}
int main(void) {
    long total = 0;
    for (int round = 0; round < 1000000; round++) {
        struct item *items = malloc(64 * sizeof *items);
        for (int i = 0; i < 64; i++) {
            snprintf(items[i].name, sizeof items[i].name, "k%d", (i * 7919 + round) % 1000);
            items[i].value = i * round;
        }
        qsort(items, 64, sizeof *items, by_name);
        total += checksum(items, 64);
        free(items);
    }
    printf("%ld\n", total);
    return 0;
}
"""


def record_real(tmp: Path, lines: int) -> Path | None:
    """An emulated PT recording that prints about ``lines`` branch lines, or None."""
    try:
        from ptscope.record.emulated import record
    except ImportError:
        return None
    if shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None:
        return None
    src = tmp / "real.c"
    src.write_text(_REAL_PROGRAM)
    prog = tmp / "real"
    subprocess.run(["gcc", "-O1", "-o", str(prog), str(src)], check=True)
    # About 9 instructions per printed branch for this program (qsort, strcmp, snprintf).
    result = record([str(prog)], tmp / "rec", max_instructions=lines * 9)
    return result.recording.perf_data_paths()[0]


def write_real_lines(perf_data: Path, path: Path) -> None:
    with open(path, "wb") as out:
        subprocess.run(
            branch_script_argv(perf_data), stdout=out, stderr=subprocess.DEVNULL, check=True
        )


def measure_end_to_end(perf_data: Path, n: int, repeat: int) -> None:
    argv = branch_script_argv(perf_data)

    def floor() -> int:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        return 0

    def decode() -> int:
        return sum(len(b) for b in decode_perf_data_text(perf_data))

    floor_t, _ = best_of(repeat, floor)
    decode_t, events = best_of(repeat, decode)
    print("  end to end (perf and the parser on their own cores):")
    print(f"  {'perf script > /dev/null (floor)':46} {floor_t:8.3f} {n / floor_t:12,.0f}")
    print(
        f"  {'perf script | parser':46} {decode_t:8.3f} {n / decode_t:12,.0f} {events:10,} "
        f"{decode_t / floor_t:10.2f} x floor"
    )


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
    ap.add_argument("--no-real", action="store_true", help="skip the emulated recording")
    args = ap.parse_args()
    all_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        path = tmp / "branches.txt"
        sets: list[tuple[str, Callable[[], object], Path | None]] = [
            ("realistic: fixed program, 4 threads", lambda: write_lines(path, args.lines), None)
        ]
        perf_data = None if args.no_real else record_real(tmp, args.lines)
        if perf_data is not None:
            sets.append(
                (
                    "real: perf script text of an emulated PT recording (C, PIE, libc)",
                    lambda: write_real_lines(perf_data, path),
                    perf_data,
                )
            )
        if not args.no_unique:
            sets.append(
                (
                    "worst case: random sites, ~every line distinct",
                    lambda: write_unique_lines(path, args.lines),
                    None,
                )
            )
        for title, write, recording in sets:
            t0 = time.perf_counter()
            write()
            n = sum(len(b) for b in read_text_lines(path))
            took = time.perf_counter() - t0
            size = path.stat().st_size
            print(f"{title}: {n:,} lines, {size / 1e6:.0f} MB (made in {took:.0f} s)")
            if all_cpus is not None:
                os.sched_setaffinity(0, {min(all_cpus)})
            measure(path, n, args.repeat)
            if all_cpus is not None:
                os.sched_setaffinity(0, all_cpus)
            if recording is not None:
                measure_end_to_end(recording, n, args.repeat)


if __name__ == "__main__":
    main()
