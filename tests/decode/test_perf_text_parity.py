"""The text decoder and the dlfilter decoder make identical events from the same recording.

Recordings are real Intel PT perf.data files made by the emulated backend (QEMU), decoded
by the real perf both ways: as text parsed by ptscope, and through the C dlfilter.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ptscope.decode.perf_script import decode_perf_data_text
from ptscope.decode.perf_text import TextStats
from ptscope.errors import PtscopeError
from ptscope.model import BranchEvent, DecodeError, Event, PowerEvent

PROGRAMS = {
    # Static: calls through a function-pointer table, a jump table, recursion, libc.
    "static": (
        r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long sq(long x) { return x * x; }
__attribute__((noinline)) long cube(long x) { return sq(x) * x; }
__attribute__((noinline)) long fib(long n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
long (*table[2])(long) = {sq, cube};
__attribute__((noinline)) long dispatch(int i, long x) {
    switch (i % 4) { case 0: return table[0](x); case 1: return table[1](x);
                     case 2: return fib(x % 12); default: return x; }
}
int main(int argc, char **argv) {
    long s = 0; int n = argc > 1 ? atoi(argv[1]) : 40;
    for (int i = 0; i < n; i++) s += dispatch(i, i);
    printf("%ld\n", s);
    return 0;
}
""",
        ["-O2", "-static", "-no-pie", "-x", "c"],
    ),
    # Static C++: templates and an anonymous namespace (demangled names with spaces).
    "cxx": (
        r"""
#include <cstdio>
template <typename A, typename B> struct Pair { A a; B b; };
template <typename A, typename B> __attribute__((noinline)) B sum(const Pair<A, B>* p, int n) {
    B s = 0; for (int i = 0; i < n; i++) s += p[i].a + p[i].b; return s;
}
namespace { __attribute__((noinline)) long twice(long x) { return 2 * x; } }
int main() {
    Pair<int, long> p[50]; for (int i = 0; i < 50; i++) p[i] = {i, twice(i)};
    std::printf("%ld %d\n", sum(p, 50), (int)sum(reinterpret_cast<Pair<int, int>*>(p), 20));
}
""",
        ["-O1", "-static", "-x", "c++"],
    ),
    # Dynamic (PIE, ld.so, libc through the PLT) with two threads.
    "threads": (
        r"""
#include <pthread.h>
#include <stdio.h>
__attribute__((noinline)) long work(long n) {
    long s = 0; for (long i = 0; i < n; i++) s += i % 7; return s;
}
static void *run(void *arg) { *(long *)arg = work(3000); return NULL; }
int main(void) {
    pthread_t t[2]; long r[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run, &r[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("%ld\n", r[0] + r[1]);
    return 0;
}
""",
        ["-O1", "-pthread", "-x", "c"],
    ),
}


def _record(name: str, tmp: Path) -> Path:
    pytest.importorskip("ptscope.record.emulated")
    from ptscope.record.emulated import record

    if shutil.which("qemu-x86_64") is None:
        pytest.skip("qemu-x86_64 is not installed")
    source, flags = PROGRAMS[name]
    # Built where no other test process builds (-n 2): a shared path was written while
    # the other one ran it.
    src = tmp / f"parity_{name}.src"
    prog = tmp / f"parity_{name}"
    src.write_text(source)
    compiler = "g++" if "c++" in flags else "gcc"
    subprocess.run([compiler, *flags, "-o", str(prog), str(src)], check=True)
    try:
        result = record([str(prog)], tmp / name, max_instructions=1_500_000)
    except PtscopeError as e:
        pytest.skip(f"the emulated backend cannot record here: {e.message}")
    (perf_data,) = result.recording.perf_data_paths()
    return perf_data


def _dlfilter_events(perf_data: Path, keep_all: bool) -> list[Event]:
    stream = pytest.importorskip("ptscope.decode.dlfilter_stream")
    from ptscope import _native

    if not _native.is_available():
        pytest.skip("the dlfilter is not built")
    return [e for batch in stream.decode_with_dlfilter(perf_data, keep_all=keep_all) for e in batch]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_text_and_dlfilter_decoders_agree(name: str, tmp_path: Path) -> None:
    perf_data = _record(name, tmp_path)
    for keep_all in (False, True):
        stats: list[TextStats] = []
        text = [
            e
            for batch in decode_perf_data_text(perf_data, keep_all=keep_all, on_stats=stats.append)
            for e in batch
        ]
        assert stats[0].unknown_lines == 0, stats[0].unknown_examples
        branches = [e for e in text if isinstance(e, BranchEvent)]
        assert len(branches) > 500
        assert any(e.insn_count for e in branches)  # the counts came through -F +ipc
        assert any(isinstance(e, PowerEvent) for e in text)
        assert len({e.tid for e in branches}) == (3 if name == "threads" else 1)
        if name == "cxx":
            assert any(" " in e.dst.symbol and "<" in e.dst.symbol for e in branches)
        dlfilter = _dlfilter_events(perf_data, keep_all)
        assert text == dlfilter
        errors = [e for e in text if isinstance(e, DecodeError)]
        assert stats[0].decode_errors == len(errors)
