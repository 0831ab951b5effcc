"""Decode speed against perf's own floor: dlfilter path, text path, parallel windows.

Usage::

    python bench/decode.py                    # emulated-PT recording of >= 5 M branches (cached)
    python bench/decode.py --perf-data FILE   # any Intel PT perf.data instead
    python bench/decode.py --branches 1000000 # a smaller recording
    python bench/decode.py --workload calls   # the call-heavy program, 60,000 rounds
    python bench/decode.py --memory           # peak RSS of `ptscope decode` vs trace length
    python bench/decode.py --workload calls --peers --repeat 5   # against perf2perfetto

Every figure comes from one run, each measurement in a fresh child process (so that peak
RSS is its own), and is reported as a ratio to the floor measured in the same run; the
best of ``--repeat`` runs is kept (``--median``: their median, and each ratio the median of
the rounds' own ratios, every other round run in reverse order: a shared VM's speed drifts
by a third between rounds, much less within one), for the wall time and for the CPU time
(user + system, of Python and perf together: steadier than the wall time on a busy
machine):

* floor: ``perf script --itrace=bep`` with a dlfilter that drops every sample and does
  nothing else (built here from ``bench/null_dlfilter.c``): no perf-based decoder can beat it
  on one core;
* perf+dlfilter: perf with ptscope's dlfilter, its record stream thrown away (the cost of
  the C filter itself);
* dlfilter / text / parallel: ptscope's decoders alone (events out of the reader), then
  through the reconstruction engine (events/s through the engine), then the whole
  ``ptscope decode`` (``ptscope.pipeline``: decode, engine, writer) to ``.fxt.gz``;
* columnar / +C engine: the dlfilter reader yielding branch batches, and those through the
  C engine (``FastEngine``), which ``ptscope decode`` uses on the dlfilter path;
* engines alone: the decoded trace held in memory, fed to the Python engine (events) and
  to the C engine (batches): feed and final-pass times, events/s;
* instruction detail (``--dlarg insns``: exact instruction counts and code lines from the
  basic-block cache): perf+dlfilter insns, dlfilter insns, columnar insns, columnar+C
  engine insns (counts and i-cache footprints per slice), text insns, against their plain
  twins (target: at most 1.15x the plain decode); the whole ``ptscope decode`` with it
  (``ptscope dlfilter``, the default), without (``ptscope dlfilter plain``,
  ``--no-insn-detail``) and with every slice's ``drill`` arg (``ptscope dlfilter drill``,
  with its trace size);
* perf's own per-instruction path, the way to exact counts without a block cache
  (perf2perfetto's ``--itrace=i0ns``): perf i0ns floor (every instruction synthesized and
  handed to the null dlfilter) and perf i0ns text (printed, ``-F ...,insn``, thrown away).

``--native`` measures the own decoder (``ptscope.decode.native``: perf.data to the engine's
batches in C, no perf) against the floor and the perf path in one interleaved run: the own
decoder alone (batches out, with and without instruction detail), into the C engine, the
whole pipeline with it and with perf's dlfilter, and the ``ptscope decode`` command with
its defaults (the own decoder, every slice's ``drill`` arg) and with ``--decoder
dlfilter``; CPU and wall as multiples of the floor, peak RSS, the trace's size. With
``--peer-dlfilter SO`` (an already built perf2perfetto) the peer's row too.

``--workload sort`` records ``sort -n`` of ``--lines`` numbers (a real program: glibc's
sort, its allocator and locale code) instead of the call-heavy program.

``--peers`` measures against perf2perfetto (given already built with ``--peer-dlfilter
SO``, ../shared/docs/peers.md; this script builds and fetches nothing of another project,
and says in one line that the row is skipped without it):
the floor, perf2perfetto (time axis), ptscope ``--no-insn-detail -j1``, ``-j1``, ``-j1``
with the records through a pipe (``PTSCOPE_NO_RING=1``, the transport before ring mode),
``--jobs 2`` and with no ``--jobs`` (its default), in interleaved rounds; those run the
pipeline in the measuring process, after its imports. Last, ``ptscope decode -j1 (CLI)``:
the command itself in a process of its own (Python's start-up, the CLI's process settings
and every slice's ``drill`` arg, which the CLI always writes, included).

``--only`` picks measurements by name; ``--insns`` is a shortcut for the floor, the plain
and instruction-detail dlfilter decodes and perf's i0ns paths.

``--instructions`` counts instructions instead of timing (callgrind, every process of a
run: perf, ptscope, anything they start): the floor, perf2perfetto and the ``ptscope
decode -j1`` command with its defaults, ``--no-drill`` and ``--no-insn-detail``, each
once, with each run's share in perf's process and in ptscope's. A count does not drift
with a shared VM's speed (times here moved by a third between runs), so a change's effect
shows at once; it ignores the kernel's work (system time) and what one instruction costs
(memory stalls), which the timed modes keep. Needs valgrind (``make bench-system-deps``);
a 60k-round run takes a few minutes.

``--timeline`` splits the ``ptscope decode -j1`` command's wall time around perf's decode:
from its launch to perf's start (Python's start-up and whatever runs before perf), perf's
own run, and from perf's end to the command's (the last batches, closing the trace), with
the floor's perf beside it; medians of ``--repeat`` runs.

``--writer-thread`` measures the trace's writing (encoding, compression, the file) on a
thread of its own beside the engine, against the same decode without it, every slice's
``drill`` arg written as the CLI does: ``-j1``, ``--jobs N``, and ptscope's side alone (the
record stream decoded beforehand and held in memory, then the engine and the writing
timed: what the decode's process does when it does not wait for perf, as with windows on
a machine with cores to spare). ``ptscope decode`` writes on the thread (at nice 19, the
decoding thread writing the oldest batches itself while it is behind) when a core is idle
for it or the decode has windows (``ptscope.decode.perf_launch.core_idle_beside``).

``--read-ahead`` measures ``--jobs N`` (writer thread on) with the windows' records read
on a thread of their own ahead of the engine (``ptscope.decode.read_ahead``, off by
default until measured where each thread has a core) against the same decode reading them
in the engine's thread.

``--scaling N ...`` measures how the decode scales with windows on a machine with cores to
spare: the floor, ``ptscope -j1``, ``--jobs N`` for each N given, and no ``--jobs`` (its
default, with the windows it chose), in interleaved rounds; wall and CPU time as multiples
of the floor, and each row's speed-up over ``-j1`` (medians of the rounds' own ratios).
This is what ``ptscope.decode.perf_launch.default_jobs`` is chosen by.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "bench" / "cache"
ITRACE = "bep"

PROGRAM = r"""
/* Benchmark workload: calls and returns, loops and branches inside functions, a jump table,
 * recursion, libc string functions -- a mix like ordinary compiled code. */
#include <stdlib.h>
#include <string.h>
static volatile unsigned sink;
static char buf[256];
__attribute__((noinline)) static unsigned leaf(unsigned x) { return x * 2654435761u; }
__attribute__((noinline)) static unsigned checksum(const char *p, unsigned n) {
    unsigned h = 0;
    for (unsigned i = 0; i < n; i++) {
        if (p[i] & 1) h = h * 31 + (unsigned char)p[i];
        else h ^= (unsigned char)p[i] << (i & 7);
    }
    return h;
}
__attribute__((noinline)) static unsigned mix(unsigned x) {
    unsigned s = 0;
    for (unsigned i = 0; i < (x & 7); i++) s += leaf(x + i);
    return s;
}
__attribute__((noinline)) static unsigned dispatch(unsigned x) {
    switch (x & 3) {
    case 0: return mix(x);
    case 1: return leaf(x) ^ mix(x >> 1);
    case 2: return checksum(buf + (x & 63), 48);
    default: return leaf(leaf(x));
    }
}
__attribute__((noinline)) static unsigned fib(unsigned n) {
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}
int main(int argc, char **argv) {
    unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : 1000;
    for (unsigned i = 0; i < sizeof buf; i++) buf[i] = (char)(i * 7 + 3);
    for (unsigned i = 0; i < n; i++) {
        sink += dispatch(i);
        sink += (unsigned)strlen(buf + (i & 127));
        if ((i & 63) == 0) sink += fib(12);
    }
    return 0;
}
"""

CALL_HEAVY = (ROOT / "bench" / "call_heavy.c").read_text()

NULL_DLFILTER = ROOT / "bench" / "null_dlfilter.c"


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


# ------------------------------------------------------------------ inputs


def build_null_dlfilter() -> Path:
    out = CACHE / f"null_dlfilter-{_hash(NULL_DLFILTER.read_text())}.so"
    if not out.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                "gcc",
                "-O2",
                "-Wall",
                "-Werror",
                "-fPIC",
                "-shared",
                "-o",
                str(out),
                str(NULL_DLFILTER),
            ],
            check=True,
        )
    return out


def emulated_recording(branches: int) -> Path:
    """An emulated-PT recording of the workload with at least ``branches`` branches."""
    # About 37 branches per iteration of the workload's main loop (measured with perf).
    return _recording(PROGRAM, "decode_workload", max(1000, branches // 36))


def call_heavy_recording(rounds: int) -> Path:
    """An emulated-PT recording of the call-heavy program running ``rounds`` rounds."""
    return _recording(CALL_HEAVY, "call_heavy", rounds)


def sort_recording(lines: int) -> Path:
    """An emulated-PT recording of ``sort -n`` sorting ``lines`` numbers (the system's
    sort: dynamically linked, glibc's qsort, allocator and locale code)."""
    import random
    import shutil

    sort = shutil.which("sort") or "/usr/bin/sort"
    directory = CACHE / f"sort-{lines}-{_hash(sort, str(lines))}"
    perf_data = directory / "perf.data"
    if perf_data.exists():
        return perf_data
    from ptscope.record import emulated  # type: ignore[attr-defined]

    CACHE.mkdir(parents=True, exist_ok=True)
    numbers = CACHE / f"numbers-{lines}.txt"
    rng = random.Random(lines)
    numbers.write_text("".join(f"{rng.randrange(10**9)}\n" for _ in range(lines)))
    tmp = directory.with_name(directory.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    print(f"recording sort -n of {lines:,} lines under emulated PT (once; cached in {directory})")
    t0 = time.perf_counter()
    options = emulated.EmulationOptions(deterministic=True)
    result = emulated.record([sort, "-n", "-o", "/dev/null", str(numbers)], tmp, options=options)
    print(f"  recorded {result.instructions:,} instructions in {time.perf_counter() - t0:.1f} s")
    tmp.rename(directory)
    return perf_data


def _recording(program: str, name: str, iterations: int) -> Path:
    directory = CACHE / f"{name}-{_hash(program, str(iterations))}"
    perf_data = directory / "perf.data"
    if perf_data.exists():
        return perf_data
    try:
        from ptscope.record import emulated  # type: ignore[attr-defined]
    except ImportError:
        sys.exit("bench/decode.py: ptscope.record.emulated is not available; use --perf-data")
    CACHE.mkdir(parents=True, exist_ok=True)
    src = CACHE / f"{name}.c"
    exe = CACHE / f"{name}-{_hash(program)}"
    if not exe.exists():
        src.write_text(program)
        subprocess.run(["gcc", "-O2", "-static", "-o", str(exe), str(src)], check=True)
    tmp = directory.with_name(directory.name + ".tmp")
    subprocess.run(["rm", "-rf", str(tmp)], check=True)
    print(f"recording {exe.name} {iterations} under emulated PT (once; cached in {directory})")
    t0 = time.perf_counter()
    result = emulated.record([str(exe), str(iterations)], tmp)
    print(f"  recorded {result.instructions:,} instructions in {time.perf_counter() - t0:.1f} s")
    tmp.rename(directory)
    return perf_data


# ------------------------------------------------------------ measurements
# Each runs in a child process: `python bench/decode.py --child NAME PERF_DATA [JOBS]`.


def _null_filter(perf_data: Path, itrace: str) -> dict[str, float]:
    """perf synthesizing its samples, handed to a filter that drops them."""
    from ptscope.perftool import find_perf, perf_env

    subprocess.run(_floor_argv(find_perf().path, perf_data, itrace), check=True, env=perf_env())
    return {"events": 0}


def _floor_argv(perf: str, perf_data: Path, itrace: str) -> list[str]:
    """The floor: perf handing its samples to a filter that drops them."""
    argv = [perf, "script", "-i", str(perf_data), f"--itrace={itrace}"]
    return [*argv, "--dlfilter", str(build_null_dlfilter())]


def _perf_dlfilter(perf_data: Path, insns: bool) -> dict[str, float]:
    """perf running ptscope's dlfilter with its stream discarded: the filter's own cost."""
    from ptscope.decode.dlfilter_stream import dlfilter_command
    from ptscope.perftool import find_perf, perf_env

    argv = dlfilter_command(perf_data, perf=find_perf().path, itrace=ITRACE, insns=insns)
    subprocess.run(argv, check=True, env=perf_env(), stdout=subprocess.DEVNULL)
    return {"events": 0}


def _dlfilter(perf_data: Path, insns: bool) -> dict[str, float]:
    from ptscope.decode.dlfilter_stream import DlfilterRun, decode_with_dlfilter

    n = 0
    info: list[DlfilterRun] = []
    for batch in decode_with_dlfilter(perf_data, itrace=ITRACE, run_info=info, insns=insns):
        n += len(batch)
    trailer = info[0].stats.trailer or {}
    return {
        "events": n,
        "samples": trailer.get("samples", 0),
        "dropped": trailer.get("branches_dropped", 0),
        "blocks": trailer.get("blocks_decoded", 0),
        "unknown": trailer.get("blocks_unknown", 0),
    }


def _child_perf_i0ns_text(perf_data: Path, _jobs: int) -> dict[str, float]:
    """perf printing every instruction (its text thrown away): perf2perfetto's input."""
    from ptscope.perftool import find_perf, perf_env

    argv = [find_perf().path, "script", "-i", str(perf_data), "--itrace=i0ns", "--ns"]
    argv += ["-F", "tid,time,ip,sym,symoff,dso,insn,flags"]
    subprocess.run(argv, check=True, env=perf_env(), stdout=subprocess.DEVNULL)
    return {"events": 0}


def _child_parallel(perf_data: Path, jobs: int) -> dict[str, float]:
    from ptscope.decode.parallel import SegmentBreak, decode_parallel

    n = 0
    for batch in decode_parallel(perf_data, jobs=jobs, itrace=ITRACE):
        if not isinstance(batch, SegmentBreak):
            n += len(batch)
    return {"events": n}


def _text(perf_data: Path, insns: bool) -> dict[str, float]:
    from ptscope.decode.perf_script import decode_perf_data_text

    n = 0
    for batch in decode_perf_data_text(perf_data, ipc=True, insns=insns):
        n += len(batch)
    return {"events": n}


def _child_text_engine(perf_data: Path, _jobs: int) -> dict[str, float]:
    from ptscope.decode.perf_script import decode_perf_data_text

    return _engine_run(decode_perf_data_text(perf_data, ipc=True))


def _engine_run(stream: object) -> dict[str, float]:
    from ptscope.decode.parallel import feed_sink
    from ptscope.reconstruct.engine import TraceSegmentEngine

    engine = TraceSegmentEngine()
    feed_sink(engine, stream)  # type: ignore[arg-type]
    timeline = engine.finish()
    return {"events": engine.stats.events, "slices": sum(len(t) for t in timeline.threads)}


def _columnar(perf_data: Path, insns: bool) -> dict[str, float]:
    from ptscope.decode.dlfilter_stream import decode_with_dlfilter_columnar
    from ptscope.model import BranchBatch

    n = 0
    for items in decode_with_dlfilter_columnar(perf_data, itrace=ITRACE, insns=insns):
        n += sum(len(x) if type(x) is BranchBatch else 1 for x in items)
    return {"events": n}


def _columnar_c_engine(perf_data: Path, insns: bool) -> dict[str, float]:
    from ptscope.decode.parallel import decode_parallel_columnar, feed_sink
    from ptscope.reconstruct.fast_engine import FastEngine

    engine = FastEngine()
    stream = decode_parallel_columnar(perf_data, jobs=1, itrace=ITRACE, insns=insns)
    feed_sink(engine, stream)
    timeline = engine.finish()
    return {"events": engine.stats.events, "slices": timeline.slice_count()}


def _child_engines(perf_data: Path, _jobs: int) -> dict[str, float]:
    """Both engines on the same trace, held in memory (decoding not timed)."""
    from ptscope.decode.dlfilter_stream import (
        decode_with_dlfilter,
        decode_with_dlfilter_columnar,
    )
    from ptscope.reconstruct.engine import TraceSegmentEngine
    from ptscope.reconstruct.fast_engine import FastEngine

    events = list(decode_with_dlfilter(perf_data, itrace=ITRACE))
    columns = list(decode_with_dlfilter_columnar(perf_data, itrace=ITRACE))
    out: dict[str, float] = {}
    for name, engine, stream in (
        ("py", TraceSegmentEngine(), events),
        ("c", FastEngine(), columns),
    ):
        t0 = time.perf_counter()
        for batch in stream:
            engine.feed_all(batch)
        t1 = time.perf_counter()
        engine.finish()
        out[f"{name}_feed"] = t1 - t0
        out[f"{name}_finish"] = time.perf_counter() - t1
        out["events"] = engine.stats.events
    return out


def _child_dlfilter_engine(perf_data: Path, _jobs: int) -> dict[str, float]:
    from ptscope.decode.dlfilter_stream import decode_with_dlfilter

    return _engine_run(decode_with_dlfilter(perf_data, itrace=ITRACE))


def _child_parallel_engine(perf_data: Path, jobs: int) -> dict[str, float]:
    from ptscope.decode.parallel import decode_parallel

    return _engine_run(decode_parallel(perf_data, jobs=jobs, itrace=ITRACE))


def _pipeline(
    perf_data: Path,
    decoder: str,
    jobs: int | None,
    *,
    insns: bool = True,
    drill: bool = False,
    writer_thread: bool | None = None,
    read_ahead: bool = False,
) -> dict[str, float]:
    import tempfile

    from ptscope import pipeline  # type: ignore[attr-defined, unused-ignore]
    from ptscope.recording import Recording

    with tempfile.TemporaryDirectory() as tmp:
        summary = pipeline.decode_recording(
            Recording.find(perf_data),
            Path(tmp) / "trace.fxt.gz",
            pipeline.DecodeOptions(
                decoder=decoder,
                jobs=jobs,
                insn_detail=insns,
                drill=perf_data.parent.resolve() if drill else None,
                writer_thread=writer_thread,
                read_ahead=read_ahead,
            ),
        )
        size = sum(p.file_bytes for p in summary.parts)
        return {
            "events": summary.events,
            "slices": summary.slices,
            "trace_bytes": size,
            "ring_wait_s": summary.ring_wait_ns / 1e9,
        }


def _consumer(perf_data: Path, writer_thread: bool) -> dict[str, float]:
    """ptscope's side of a decode alone: the record stream decoded beforehand and held in
    memory (not timed), then the engine and the trace's writing (with every slice's
    ``drill`` arg, as the CLI writes it), timed: what a decode's process does when perf is
    not what it waits for (windows on a machine with cores to spare)."""
    import tempfile

    from ptscope import pipeline  # type: ignore[attr-defined, unused-ignore]
    from ptscope.decode.parallel import SegmentBreak, decode_parallel_columnar
    from ptscope.decode.progress import ProgressTracker
    from ptscope.recording import Recording

    recording = Recording.find(perf_data)
    items = list(decode_parallel_columnar(perf_data, jobs=1, task_events=True, insns=True))
    options = pipeline.DecodeOptions(
        jobs=1, drill=perf_data.parent.resolve(), writer_thread=writer_thread
    )

    def feed(engine: Any, after: Callable[[], None]) -> None:
        for item in items:
            if isinstance(item, SegmentBreak):
                engine.end_segment()
            else:
                engine.feed_all(item)
            after()

    with tempfile.TemporaryDirectory() as tmp:
        summary = pipeline.DecodeSummary(Path(tmp) / "trace.fxt.gz", "dlfilter", "bench")
        t0 = time.perf_counter()
        cpu0 = _cpu_seconds()
        pipeline._stream(recording, options, summary, ProgressTracker(None, []), feed, perfs=1)
        return {
            "inner_wall": time.perf_counter() - t0,
            "cpu": _cpu_seconds() - cpu0,
            "slices": summary.slices,
            "trace_bytes": sum(p.file_bytes for p in summary.parts),
        }


def _without_ring(measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """The records through perf's stdout pipe, as before ring mode (decode/record_ring.py)."""
    os.environ["PTSCOPE_NO_RING"] = "1"
    return measure()


def _native(perf_data: Path, insns: bool) -> dict[str, float]:
    """The own decoder alone: perf.data to the engine's batches (no perf)."""
    from ptscope.decode.native import NativeRun, decode_native_columnar
    from ptscope.model import BranchBatch

    n = 0
    runs: list[NativeRun] = []
    for items in decode_native_columnar(perf_data, insns=insns, run_info=runs):
        n += sum(len(x) if type(x) is BranchBatch else 1 for x in items)
    counters = runs[0].stats.trailer or {}
    return {"events": n, "samples": counters.get("samples", 0)}


def _native_c_engine(perf_data: Path, insns: bool) -> dict[str, float]:
    """The own decoder's batches through the C engine (no trace written)."""
    from ptscope.decode.native import decode_native_columnar
    from ptscope.reconstruct.fast_engine import FastEngine

    engine = FastEngine()
    for items in decode_native_columnar(perf_data, insns=insns):
        engine.feed_all(items)
    timeline = engine.finish()
    return {"events": engine.stats.events, "slices": timeline.slice_count()}


def _child_pipeline_dlfilter(perf_data: Path, _jobs: int) -> dict[str, float]:
    return _pipeline(perf_data, "dlfilter", 1)


def _child_pipeline_parallel(perf_data: Path, jobs: int) -> dict[str, float]:
    return _pipeline(perf_data, "dlfilter", jobs)


def _child_pipeline_text(perf_data: Path, _jobs: int) -> dict[str, float]:
    return _pipeline(perf_data, "text", 1)


# ------------------------------------------------------------------ peers

PEER_ENV = "PTSCOPE_BENCH_PEER_DLFILTER"
"""The peer dlfilter the children use (main sets it from ``--peer-dlfilter``)."""


def peer_dlfilter() -> Path | str:
    """perf2perfetto's dlfilter, already built, given by ``--peer-dlfilter SO``; or why its
    rows are skipped (one line). This script builds and fetches nothing of another
    project (../shared/docs/peers.md says how to build it)."""
    given = os.environ.get(PEER_ENV)
    if not given:
        return "no peer dlfilter given (--peer-dlfilter SO: an already built perf2perfetto)"
    if not Path(given).is_file():
        return f"{given}: no such file"
    return Path(given)


def _child_perf2perfetto(perf_data: Path, _jobs: int) -> dict[str, float]:
    """perf2perfetto on the time axis (``t``), writing plain FXT."""
    import tempfile

    from ptscope.perftool import find_perf, perf_env

    library = peer_dlfilter()
    if isinstance(library, str):
        raise SystemExit(library)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p2p.fxt"
        argv = _perf2perfetto_argv(find_perf().path, perf_data, library, out)
        subprocess.run(argv, check=True, env=perf_env(), stdout=subprocess.DEVNULL)
        return {"events": 0, "trace_bytes": out.stat().st_size}


def _perf2perfetto_argv(perf: str, perf_data: Path, library: Path, out: Path) -> list[str]:
    """perf2perfetto on the time axis (``t``), writing plain FXT to ``out``."""
    argv = [perf, "script", "-i", str(perf_data), "--itrace=be"]
    return [*argv, "--dlfilter", str(library), "--dlarg", str(out), "--dlarg", "t"]


def _cli_decode(perf_data: Path, _jobs: int, *options: str) -> dict[str, float]:
    """The command a user runs, ``ptscope decode -j1`` (with ``options``), in a process of
    its own: Python's start-up, the CLI's process settings and every slice's ``drill`` arg
    included."""
    import re
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.fxt.gz"
        argv = [sys.executable, "-c", _CLI_WITH_RSS, "decode", str(perf_data.parent)]
        done = subprocess.run(
            [*argv, "-o", str(out), "-j1", *options], capture_output=True, text=True, check=True
        )
        found = re.search(r"([\d,]+) slices", done.stdout + done.stderr)
        slices = int(found.group(1).replace(",", "")) if found else 0
        own, perf = json.loads(done.stdout.strip().splitlines()[-1])
        return {
            "events": 0,
            "slices": slices,
            "trace_bytes": out.stat().st_size,
            "rss_python_mb": own,
            "rss_perf_mb": perf,
        }


# The `ptscope` command as its entry point runs it (cli.run: main, then os._exit), which
# first prints the peak RSS of the command's own process and of its perf (a parent's view
# of a child's rusage mixes the two).
_CLI_WITH_RSS = """
import json, os, resource, sys
from ptscope import cli
code = cli.main(sys.argv[1:], leaving=True)
who = (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
print(json.dumps([resource.getrusage(w).ru_maxrss / 1024 for w in who]), flush=True)
sys.stderr.flush()
os._exit(code)
"""


PEERS_SET = [
    "floor",
    "perf2perfetto",
    "ptscope --no-insn-detail -j1",
    "ptscope -j1",
    "ptscope -j1 pipe",
    "ptscope --jobs 2",
    "ptscope default",
    "ptscope decode -j1 (CLI)",
]
# --native: the own decoder against the floor and perf's path
NATIVE_SET = [
    "floor",
    "perf2perfetto",
    "own decoder",
    "own decoder plain",
    "ptscope native",
    "ptscope dlfilter",
    "ptscope decode (CLI)",
    "ptscope decode --decoder dlfilter (CLI)",
]


CHILDREN: dict[str, Callable[[Path, int], dict[str, float]]] = {
    "floor": lambda p, _j: _null_filter(p, ITRACE),
    "perf+dlfilter": lambda p, _j: _perf_dlfilter(p, False),
    "dlfilter": lambda p, _j: _dlfilter(p, False),
    "parallel": _child_parallel,
    "text": lambda p, _j: _text(p, False),
    "columnar": lambda p, _j: _columnar(p, False),
    "dlfilter+engine": _child_dlfilter_engine,
    "columnar+C engine": lambda p, _j: _columnar_c_engine(p, False),
    "engines alone": _child_engines,
    "parallel+engine": _child_parallel_engine,
    "text+engine": _child_text_engine,
    "ptscope dlfilter": _child_pipeline_dlfilter,
    "ptscope --jobs": _child_pipeline_parallel,
    "ptscope text": _child_pipeline_text,
    "ptscope dlfilter plain": lambda p, _j: _pipeline(p, "dlfilter", 1, insns=False),
    "ptscope dlfilter drill": lambda p, _j: _pipeline(p, "dlfilter", 1, drill=True),
    "perf+dlfilter insns": lambda p, _j: _perf_dlfilter(p, True),
    "dlfilter insns": lambda p, _j: _dlfilter(p, True),
    "columnar insns": lambda p, _j: _columnar(p, True),
    "columnar+C engine insns": lambda p, _j: _columnar_c_engine(p, True),
    "text insns": lambda p, _j: _text(p, True),
    "perf i0ns floor": lambda p, _j: _null_filter(p, "i0ns"),
    "perf2perfetto": _child_perf2perfetto,
    "ptscope --no-insn-detail -j1": lambda p, _j: _pipeline(p, "dlfilter", 1, insns=False),
    "ptscope -j1": lambda p, _j: _pipeline(p, "dlfilter", 1),
    "ptscope -j1 pipe": lambda p, _j: _without_ring(lambda: _pipeline(p, "dlfilter", 1)),
    "ptscope --jobs 2": lambda p, _j: _pipeline(p, "dlfilter", 2),
    "ptscope default": lambda p, _j: _pipeline(p, "dlfilter", None),
    "ptscope -j1 drill": lambda p, _j: _pipeline(p, "dlfilter", 1, drill=True, writer_thread=False),
    "ptscope -j1 drill, writer thread": lambda p, _j: _pipeline(
        p, "dlfilter", 1, drill=True, writer_thread=True
    ),
    "ptscope --jobs drill": lambda p, j: _pipeline(
        p, "dlfilter", j, drill=True, writer_thread=False
    ),
    "ptscope --jobs drill, writer thread": lambda p, j: _pipeline(
        p, "dlfilter", j, drill=True, writer_thread=True
    ),
    "ptscope --jobs drill, writer thread, read ahead": lambda p, j: _pipeline(
        p, "dlfilter", j, drill=True, writer_thread=True, read_ahead=True
    ),
    "engine+writer alone": lambda p, _j: _consumer(p, False),
    "engine+writer alone, writer thread": lambda p, _j: _consumer(p, True),
    "ptscope decode -j1 (CLI)": lambda p, j: _cli_decode(p, j, "--decoder", "dlfilter"),
    "own decoder": lambda p, _j: _native(p, True),
    "own decoder plain": lambda p, _j: _native(p, False),
    "own decoder+C engine": lambda p, _j: _native_c_engine(p, True),
    "ptscope native": lambda p, _j: _pipeline(p, "native", 1),
    "ptscope decode (CLI)": _cli_decode,
    "ptscope decode --decoder dlfilter (CLI)": lambda p, j: _cli_decode(
        p, j, "--decoder", "dlfilter"
    ),
    "perf i0ns text": _child_perf_i0ns_text,
}
INSNS_SET = [
    "floor",
    "perf+dlfilter",
    "perf+dlfilter insns",
    "dlfilter",
    "dlfilter insns",
    "columnar",
    "columnar insns",
    "columnar+C engine",
    "columnar+C engine insns",
    "ptscope dlfilter plain",
    "ptscope dlfilter",
    "ptscope dlfilter drill",
    "perf i0ns floor",
    "perf i0ns text",
]
# --writer-thread: each decode with the trace's writing on a thread of its own and without
WRITER_SET = [
    "floor",
    "ptscope -j1 drill",
    "ptscope -j1 drill, writer thread",
    "ptscope --jobs drill",
    "ptscope --jobs drill, writer thread",
    "engine+writer alone",
    "engine+writer alone, writer thread",
]
# --read-ahead: a decode in windows with their records read ahead on a thread of their own
# and without (the default)
READ_AHEAD_SET = [
    "floor",
    "ptscope --jobs drill, writer thread",
    "ptscope --jobs drill, writer thread, read ahead",
]
# Measurements only --only or --insns ask for (perf's per-instruction paths are slow).
NOT_BY_DEFAULT = {
    "perf i0ns floor",
    "perf i0ns text",
    "text insns",
    *PEERS_SET[1:],
    *NATIVE_SET[1:],
    *WRITER_SET[1:],
    *READ_AHEAD_SET[1:],
}


def run_child(name: str, perf_data: Path, jobs: int) -> dict[str, float] | None:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--child", name, str(perf_data), str(jobs)],
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {name}: failed ({last})")
        return None
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    return result


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its finished children (perf)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def child_main(name: str, perf_data: Path, jobs: int) -> None:
    # Imports are not part of any measurement.
    import ptscope.decode.dlfilter_stream
    import ptscope.decode.native
    import ptscope.decode.parallel
    import ptscope.decode.perf_script
    import ptscope.reconstruct.engine
    import ptscope.reconstruct.fast_engine  # noqa: F401

    t0 = time.perf_counter()
    cpu0 = _cpu_seconds()
    result = CHILDREN[name](perf_data, jobs)
    # (unless the measurement timed a part of its own)
    result.setdefault("inner_wall", time.perf_counter() - t0)
    result.setdefault("cpu", _cpu_seconds() - cpu0)
    # (unless the measurement ran a command of its own, which says its own figures)
    result.setdefault("rss_python_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    result.setdefault("rss_perf_mb", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)
    print(json.dumps(result))


def _times(r: dict[str, float], base: dict[str, float], base_name: str, key: str) -> float:
    """``r[key]`` as a multiple of ``base``'s: with ``--median``, the median of the rounds'
    own ratios (kept in ``r`` by main()); otherwise the ratio of the kept figures."""
    return r.get(f"{key} x {base_name}", r[key] / base[key])


def peers_report(results: dict[str, dict[str, float]]) -> None:
    """The peers table: CPU and wall as x the floor, output, slices, peak RSS."""
    floor = results.get("floor")
    print(
        f"\n{'':<30} {'CPU s':>7} {'CPU x floor':>11} {'wall s':>7} {'wall x floor':>12}"
        f" {'output MB':>9} {'slices':>10} {'RSS MB ptscope':>14} {'perf':>5}"
        f" {'perf waited s':>13}"
    )
    for name, r in results.items():
        cpu_x = f"{_times(r, floor, 'floor', 'cpu'):.2f}" if floor else "-"
        wall_x = f"{_times(r, floor, 'floor', 'inner_wall'):.2f}" if floor else "-"
        size = f"{r['trace_bytes'] / 1e6:.1f}" if "trace_bytes" in r else "-"
        slices = f"{int(r['slices']):,}" if "slices" in r else "-"
        # Peak RSS: ptscope's process (the Python side; the floor's and perf2perfetto's
        # child wrappers only wait) and perf's (the largest perf it ran: with --jobs,
        # one window's).
        # Ring mode: perf's time waiting for a free record chunk (ptscope busy writing).
        waited = f"{r['ring_wait_s']:.2f}" if "ring_wait_s" in r else "-"
        print(
            f"{name:<30} {r['cpu']:7.2f} {cpu_x:>11} {r['inner_wall']:7.2f} {wall_x:>12}"
            f" {size:>9} {slices:>10} {r['rss_python_mb']:14.0f} {r['rss_perf_mb']:5.0f}"
            f" {waited:>13}"
        )
    p2p, ours = results.get("perf2perfetto"), results.get("ptscope default")
    if p2p and ours:
        cpu = _times(ours, p2p, "perf2perfetto", "cpu")
        wall = _times(ours, p2p, "perf2perfetto", "inner_wall")
        print(
            f"ptscope default / perf2perfetto: CPU {cpu:.2f}x, wall {wall:.2f}x"
            " (target: CPU <= 1.0x)"
        )
        cli = results.get("ptscope decode -j1 (CLI)")
        if cli is not None:
            cpu = _times(cli, p2p, "perf2perfetto", "cpu")
            print(f"ptscope decode (CLI, drill strings) / perf2perfetto: CPU {cpu:.2f}x")


def native_report(results: dict[str, dict[str, float]]) -> None:
    """The own decoder's figures against the issue's targets."""
    floor = results.get("floor")
    if not floor:
        return
    for name, target in (
        ("ptscope decode (CLI)", "target: CPU <= 0.2x the floor, goal 0.1x"),
        ("ptscope native", "the pipeline alone, after its imports"),
        ("own decoder", "the decoder alone"),
    ):
        r = results.get(name)
        if r is not None:
            print(
                f"{name}: CPU {_times(r, floor, 'floor', 'cpu'):.2f}x the floor, wall"
                f" {_times(r, floor, 'floor', 'inner_wall'):.2f}x ({target})"
            )
    cli, perf_cli = (
        results.get("ptscope decode (CLI)"),
        results.get("ptscope decode --decoder dlfilter (CLI)"),
    )
    if cli and perf_cli:
        print(
            f"ptscope decode, own decoder / perf's: CPU {cli['cpu'] / perf_cli['cpu']:.2f}x,"
            f" wall {cli['inner_wall'] / perf_cli['inner_wall']:.2f}x; peak RSS"
            f" {cli['rss_python_mb']:.0f} MB (target <= 100 MB)"
        )
    own = results.get("own decoder")
    if own and own.get("samples"):
        rate = own["samples"] / own["inner_wall"] / 1e6
        print(f"own decoder: {int(own['samples']):,} perf samples, {rate:.1f} M samples/s")


INSTRUCTION_RUNS: list[tuple[str, list[str]]] = [
    ("floor", []),
    ("perf2perfetto", []),
    ("ptscope decode -j1", []),
    ("ptscope decode -j1 --no-drill", ["--no-drill"]),
    ("ptscope decode -j1 --no-insn-detail", ["--no-insn-detail"]),
]


def _counted(argv: list[str], out: Path, env: dict[str, str] | None = None) -> dict[str, int]:
    """Instructions each process of ``argv`` ran (callgrind, children followed), by its
    program's name (perf, python...): the sums of every callgrind file of the run."""
    out.mkdir(parents=True, exist_ok=True)
    cg = ["valgrind", "--tool=callgrind", "--trace-children=yes"]
    subprocess.run(
        [*cg, f"--callgrind-out-file={out / 'cg.%p'}", *argv],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    counts: dict[str, int] = {}
    for f in out.glob("cg.*"):
        program, total = "?", 0
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("cmd:"):
                program = Path(line.split()[1]).name if len(line.split()) > 1 else "?"
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
        program = "perf" if program.startswith("perf") else program
        counts[program] = counts.get(program, 0) + total
        f.unlink()
    return counts


def instructions_main(perf_data: Path) -> None:
    """--instructions: each run's instructions, in all and per process, × the floor and
    against perf2perfetto."""
    import shutil
    import tempfile

    from ptscope.perftool import find_perf, perf_env

    if not shutil.which("valgrind"):
        print("--instructions: skipped: valgrind is missing (make bench-system-deps)")
        return
    perf = find_perf().path
    library = peer_dlfilter()
    rows: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, options in INSTRUCTION_RUNS:
            env = perf_env()
            if name == "floor":
                argv = _floor_argv(perf, perf_data, ITRACE)
            elif name == "perf2perfetto":
                if isinstance(library, str):
                    print(f"perf2perfetto: skipped: {library}")
                    continue
                argv = _perf2perfetto_argv(perf, perf_data, library, Path(tmp) / "p2p.fxt")
            else:
                argv = [sys.executable, "-m", "ptscope", "decode", str(perf_data.parent)]
                argv += ["-o", f"{tmp}/trace.fxt.gz", "-j1", *options]
                # (perf runs ~50x slower under callgrind: no stall is a hang)
                env = {**os.environ, "PTSCOPE_PERF_STALL_TIMEOUT": "86400"}
            print(f"  counting {name}...", end=" ", flush=True)
            rows[name] = _counted(argv, Path(tmp) / "cg", env)
            # (each as it is counted: a 300k run takes an hour)
            print(f"{sum(rows[name].values()) / 1e9:.2f} G", flush=True)
    floor = sum(rows["floor"].values()) if "floor" in rows else 0
    p2p = sum(rows["perf2perfetto"].values()) if "perf2perfetto" in rows else 0
    print(f"\n{'instructions (G)':<36} {'all':>7} {'x floor':>8} {'perf':>7} {'ptscope':>8}")
    for name, counts in rows.items():
        total = sum(counts.values())
        mine = total - counts.get("perf", 0)
        x = f"{total / floor:.2f}" if floor else "-"
        print(
            f"{name:<36} {total / 1e9:7.2f} {x:>8} {counts.get('perf', 0) / 1e9:7.2f}"
            f" {mine / 1e9:8.2f}"
        )
    for name in ("ptscope decode -j1", "ptscope decode -j1 --no-drill"):
        if p2p and name in rows:
            print(f"{name} / perf2perfetto: {sum(rows[name].values()) / p2p:.2f}x instructions")


def memory_main(rounds: list[int]) -> None:
    """Peak RSS of a whole decode (one job) as the trace grows: flat, if the engine streams."""
    rows = []
    for n in rounds:
        perf_data = call_heavy_recording(n)
        meta = json.loads((perf_data.parent / "ptscope-recording.json").read_text())
        instructions = int(meta.get("notes", {}).get("instructions", 0))
        r = run_child("ptscope dlfilter", perf_data, 1)
        if r is None:
            continue
        rows.append((n, instructions, os.path.getsize(perf_data), r))
    print(
        f"\n{'rounds':>8} {'instructions':>13} {'perf.data MB':>12} {'slices':>11}"
        f" {'seconds':>8} {'peak RSS MB':>11}"
    )
    for n, insns, size, r in rows:
        print(
            f"{n:>8,} {insns:>13,} {size / 1e6:>12.1f} {int(r['slices']):>11,}"
            f" {r['inner_wall']:>8.1f} {r['rss_python_mb']:>11.0f}"
        )
    if len(rows) >= 2:
        first, last = rows[0][3], rows[-1][3]
        print(
            f"peak RSS, {rows[-1][0]:,} rounds / {rows[0][0]:,} rounds:"
            f" {last['rss_python_mb'] / first['rss_python_mb']:.2f}x"
            f" (trace {int(last['slices']) / int(first['slices']):.1f}x longer)"
        )


def timeline_main(perf_data: Path, repeat: int) -> None:
    """--timeline: where the wall time of the ``ptscope decode -j1`` command goes around
    perf's decode: from the command's launch to perf's (a wrapper named by PTSCOPE_PERF
    notes the times perf starts and ends), perf's own run, and from perf's end to the
    command's; the floor's perf alone beside it. Medians of ``repeat`` runs."""
    import tempfile

    from ptscope.perftool import find_perf, perf_env

    perf = find_perf().path
    floor_argv = _floor_argv(perf, perf_data, ITRACE)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "times"
        wrapper = Path(tmp) / "perf"
        wrapper.write_text(
            "#!/bin/sh\n"
            f'[ "$1" = script ] && date +"start %s.%N" >> {log}\n'
            f'{perf} "$@"\nrc=$?\n'
            f'[ "$1" = script ] && date +"end %s.%N" >> {log}\n'
            "exit $rc\n"
        )
        wrapper.chmod(0o755)
        env = {**os.environ, "PTSCOPE_PERF": str(wrapper)}
        argv = [sys.executable, "-m", "ptscope", "decode", str(perf_data.parent), "-j1"]
        for _ in range(repeat):
            log.write_text("")
            t0 = time.time()
            subprocess.run(
                [*argv, "-o", f"{tmp}/trace.fxt.gz"], env=env, check=True, capture_output=True
            )
            t1 = time.time()
            times = dict(line.split() for line in log.read_text().splitlines())
            start, end = float(times["start"]), float(times["end"])
            t2 = time.time()
            subprocess.run(floor_argv, check=True, capture_output=True, env=perf_env())
            floor = time.time() - t2
            for key, value in (
                ("command", t1 - t0),
                ("before perf starts", start - t0),
                ("perf (with the dlfilter)", end - start),
                ("after perf ends", t1 - end),
                ("floor (perf alone)", floor),
            ):
                rows.setdefault(key, []).append(value)
    print(f"\n{'ptscope decode -j1':<28} {'median ms':>10} {'min ms':>8}")
    for key, values in rows.items():
        print(f"{key:<28} {statistics.median(values) * 1e3:10.0f} {min(values) * 1e3:8.0f}")


def _median_ratio(
    rounds: list[dict[str, dict[str, float]]], name: str, base: str, key: str
) -> float:
    """The median over the rounds of ``name``'s ``key`` / ``base``'s in the same round (the
    machine's speed changes between rounds, much less within one); NaN if no round has
    both."""
    ratios = [
        rd[name][key] / rd[base][key]
        for rd in rounds
        if name in rd and base in rd and rd[base][key] > 0
    ]
    return statistics.median(ratios) if ratios else float("nan")


def scaling_main(perf_data: Path, jobs_list: list[int], repeat: int) -> None:
    """``--scaling``: the floor, ``-j1``, ``--jobs N`` for each N and the default, in
    interleaved rounds; medians of each round's own ratios (to the floor and to ``-j1``)."""
    from ptscope.decode.perf_launch import decode_jobs, free_cores

    chosen = decode_jobs(None, perf_data)
    print(
        f"recording: {perf_data} ({os.path.getsize(perf_data) / 1e6:.1f} MB), "
        f"{os.cpu_count()} CPUs, {free_cores()} free; the default runs {chosen} window(s)"
    )
    rows = [("floor", "floor", 0), ("-j1", "ptscope --jobs", 1)]
    rows += [(f"--jobs {n}", "ptscope --jobs", n) for n in jobs_list if n != 1]
    rows.append((f"default ({chosen})", "ptscope default", 0))
    rounds: list[dict[str, dict[str, float]]] = []
    for k in range(repeat):
        rounds.append({})
        for label, child, jobs in rows if k % 2 == 0 else rows[::-1]:
            r = run_child(child, perf_data, jobs)
            if r is not None:
                rounds[-1][label] = r
                print(
                    f"  round {k + 1}: {label:<12} {r['inner_wall']:7.2f} s wall"
                    f" {r['cpu']:7.2f} s CPU",
                    flush=True,
                )

    print(
        f"\n{'':<12} {'wall s':>7} {'x floor':>8} {'speed-up':>9} {'CPU s':>7} {'x floor':>8}"
        f" {'RSS py MB':>9} {'RSS perf':>8}"
    )
    for label, _child, _jobs in rows:
        runs = [rd[label] for rd in rounds if label in rd]
        if not runs:
            continue
        wall = statistics.median(r["inner_wall"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        speedup = _median_ratio(rounds, "-j1", label, "inner_wall") if label != "floor" else 0.0
        wall_x = _median_ratio(rounds, label, "floor", "inner_wall")
        cpu_x = _median_ratio(rounds, label, "floor", "cpu")
        print(
            f"{label:<12} {wall:7.2f} {wall_x:8.2f}"
            f" {speedup:9.2f} {cpu:7.2f} {cpu_x:8.2f}"
            f" {max(r['rss_python_mb'] for r in runs):9.0f}"
            f" {max(r['rss_perf_mb'] for r in runs):8.0f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--perf-data", type=Path, help="an Intel PT perf.data to decode")
    ap.add_argument("--branches", type=int, default=5_000_000, help="size of the recording")
    ap.add_argument("--jobs", type=int, default=2, help="windows for the parallel decode")
    ap.add_argument("--repeat", type=int, default=2, help="runs per measurement (best kept)")
    ap.add_argument(
        "--median",
        action="store_true",
        help="report the median of the --repeat runs, not the best (on a machine whose speed"
        " varies from minute to minute the best of a few runs can mislead; take >= 7)",
    )
    ap.add_argument("--only", nargs="*", choices=list(CHILDREN), help="measure only these")
    ap.add_argument(
        "--insns",
        action="store_true",
        help="instruction detail: the plain and insns dlfilter decodes and perf's i0ns paths",
    )
    ap.add_argument(
        "--workload",
        choices=("mixed", "calls", "sort"),
        default="mixed",
        help="mixed: the default program; calls: the call-heavy one (--rounds); sort: "
        "`sort -n` of --lines numbers",
    )
    ap.add_argument("--rounds", type=int, default=60_000, help="rounds of the call-heavy one")
    ap.add_argument("--lines", type=int, default=200_000, help="lines `sort -n` sorts")
    ap.add_argument(
        "--native",
        action="store_true",
        help="the own decoder against the floor and perf's path (the whole pipeline, the "
        "command), with the peer's row when --peer-dlfilter is given",
    )
    ap.add_argument(
        "--peer-dlfilter",
        type=Path,
        metavar="SO",
        help="perf2perfetto's dlfilter, already built (its rows are skipped without it)",
    )
    ap.add_argument(
        "--memory",
        nargs="*",
        type=int,
        metavar="ROUNDS",
        help="peak RSS of `ptscope decode --jobs 1` on call-heavy recordings of these rounds "
        "(default 60000 300000), and its ratio between the shortest and the longest",
    )
    ap.add_argument(
        "--peers",
        action="store_true",
        help="against perf2perfetto (--peer-dlfilter, or skipped saying why): the floor, "
        "perf2perfetto, ptscope --no-insn-detail -j1, -j1, --jobs 2 and its default",
    )
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="instruction counts (callgrind, every process): the floor, perf2perfetto and "
        "`ptscope decode -j1` (default, --no-drill, --no-insn-detail)",
    )
    ap.add_argument(
        "--timeline",
        action="store_true",
        help="the ptscope decode -j1 command's wall time before perf starts, perf's own, "
        "and after perf ends, against the floor's perf",
    )
    ap.add_argument(
        "--writer-thread",
        action="store_true",
        help="the trace's writing on a thread of its own against the same decode without it: "
        "-j1, --jobs N and ptscope's side alone (the records held in memory)",
    )
    ap.add_argument(
        "--read-ahead",
        action="store_true",
        help="--jobs N with the windows' records read ahead on a thread of their own against "
        "the same decode without it (the default)",
    )
    ap.add_argument(
        "--scaling",
        nargs="+",
        type=int,
        metavar="N",
        help="the floor, -j1, --jobs N for each N and the default, interleaved: how the "
        "decode scales with windows (speed-up over -j1)",
    )
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args.child[0], Path(args.child[1]), int(args.child[2]))
        return
    if args.peer_dlfilter is not None:
        os.environ[PEER_ENV] = str(args.peer_dlfilter.resolve())
    if args.memory is not None:
        memory_main(args.memory or [60_000, 300_000])
        return
    if args.perf_data:
        perf_data = args.perf_data
    elif args.workload == "calls":
        perf_data = call_heavy_recording(args.rounds)
    elif args.workload == "sort":
        perf_data = sort_recording(args.lines)
    else:
        perf_data = emulated_recording(args.branches)
    build_null_dlfilter()
    if args.instructions:
        print(f"recording: {perf_data}")
        instructions_main(perf_data)
        return
    if args.timeline:
        print(f"recording: {perf_data}")
        timeline_main(perf_data, args.repeat)
        return
    if args.scaling:
        scaling_main(perf_data, args.scaling, args.repeat)
        return
    size = os.path.getsize(perf_data)
    print(
        f"recording: {perf_data} ({size / 1e6:.1f} MB), {os.cpu_count()} CPUs, --jobs {args.jobs}"
    )
    results: dict[str, dict[str, float]] = {}
    names = args.only or (
        INSNS_SET
        if args.insns
        else PEERS_SET
        if args.peers
        else NATIVE_SET
        if args.native
        else WRITER_SET
        if args.writer_thread
        else READ_AHEAD_SET
        if args.read_ahead
        else []
    )
    names = names or [n for n in CHILDREN if n not in NOT_BY_DEFAULT]
    if "perf2perfetto" in names:
        library = peer_dlfilter()
        if isinstance(library, str):
            print(f"perf2perfetto: skipped: {library}")
            names = [n for n in names if n != "perf2perfetto"]
    cpus: dict[str, list[float]] = {}
    walls: dict[str, list[float]] = {}
    rounds: list[dict[str, dict[str, float]]] = []
    for k in range(args.repeat):  # interleaved: each round measures every one once
        rounds.append({})
        # Every other round in reverse order: a machine whose speed drifts during a round
        # favours neither the first measurements nor the last.
        for name in names if k % 2 == 0 else names[::-1]:
            r = run_child(name, perf_data, args.jobs)
            if r is None:
                continue
            # (a copy: `r` may become the kept result, whose figures are replaced below)
            rounds[-1][name] = {"cpu": r["cpu"], "inner_wall": r["inner_wall"]}
            best = results.get(name)
            if best is None or r["inner_wall"] < best["inner_wall"]:
                results[name] = r
            cpus.setdefault(name, []).append(r["cpu"])
            walls.setdefault(name, []).append(r["inner_wall"])
    pick = statistics.median if args.median else min
    for name, r in results.items():
        # The least over the runs (or the median): on a busy machine, both vary.
        r["cpu"] = pick(cpus[name])
        r["inner_wall"] = pick(walls[name])
        if args.median:
            # Ratios within a round, then their median: the machine's speed changes
            # between rounds (by a third, on a shared VM), much less within one.
            for base in ("floor", "perf2perfetto"):
                for key in ("cpu", "inner_wall"):
                    ratio = _median_ratio(rounds, name, base, key)
                    if ratio == ratio:  # (not NaN: both were measured in some round)
                        r[f"{key} x {base}"] = ratio
    if args.peers or args.native:
        peers_report(results)
        if args.native:
            native_report(results)
        return
    floor = results.get("floor", {}).get("inner_wall")
    print()
    print(
        f"{'measurement':<23} {'wall s':>7} {'x floor':>8} {'cpu s':>7} {'events':>10}"
        f" {'events/s':>10} {'RSS py MB':>9} {'RSS perf':>8}"
    )
    for name, r in results.items():
        wall = r["inner_wall"]
        ratio = f"{wall / floor:.2f}" if floor else "-"
        ev = int(r.get("events", 0))
        rate = f"{ev / wall / 1e6:.2f} M" if ev else "-"
        print(
            f"{name:<23} {wall:7.2f} {ratio:>8} {r['cpu']:7.2f} {ev:>10} {rate:>10}"
            f" {r['rss_python_mb']:9.0f} {r['rss_perf_mb']:8.0f}"
        )
    if "engines alone" in results:
        r = results["engines alone"]
        ev = r["events"]
        print("\nengines alone (trace in memory):")
        for name, label in (("py", "Python engine, events"), ("c", "C engine, batches")):
            feed, fin = r[f"{name}_feed"], r[f"{name}_finish"]
            print(
                f"  {label:<22} feed {feed:6.3f} s ({ev / feed / 1e6:5.1f} M events/s)"
                f"  final pass {fin:6.3f} s"
            )
        print(
            f"  C / Python: feed {r['py_feed'] / r['c_feed']:.0f}x,"
            f" final pass {r['py_finish'] / r['c_finish']:.1f}x"
        )
    if "dlfilter" in results and results["dlfilter"].get("samples"):
        d = results["dlfilter"]
        print(
            f"\nperf samples: {int(d['samples']):,}; the dlfilter dropped {int(d['dropped']):,}"
            f" same-function jumps ({d['dropped'] / d['samples']:.0%})"
        )
    for name in ("ptscope dlfilter plain", "ptscope dlfilter", "ptscope dlfilter drill"):
        if name in results and results[name].get("trace_bytes"):
            r = results[name]
            print(
                f"{name}: trace {r['trace_bytes'] / 1e6:.1f} MB"
                f" ({r['trace_bytes'] / max(r['slices'], 1):.1f} bytes/slice)"
            )
    if "dlfilter insns" in results:
        d = results["dlfilter insns"]
        print(
            f"instruction detail: {int(d['blocks']):,} basic blocks decoded,"
            f" {int(d['unknown']):,} not countable"
        )
    for a, b in (
        ("text", "dlfilter"),
        ("text+engine", "dlfilter+engine"),
        ("ptscope text", "ptscope dlfilter"),
        ("dlfilter+engine", "columnar+C engine"),
        ("perf+dlfilter insns", "perf+dlfilter"),
        ("dlfilter insns", "dlfilter"),
        ("columnar insns", "columnar"),
        ("columnar+C engine insns", "columnar+C engine"),
        ("text insns", "text"),
        ("ptscope dlfilter", "ptscope dlfilter plain"),
        ("ptscope dlfilter drill", "ptscope dlfilter"),
        ("perf i0ns floor", "dlfilter insns"),
        ("perf i0ns text", "dlfilter insns"),
        ("ptscope -j1 drill, writer thread", "ptscope -j1 drill"),
        ("ptscope --jobs drill, writer thread", "ptscope --jobs drill"),
        ("engine+writer alone, writer thread", "engine+writer alone"),
    ):
        if a in results and b in results:
            wall = results[a]["inner_wall"] / results[b]["inner_wall"]
            cpu = results[a]["cpu"] / results[b]["cpu"]
            print(f"{a} / {b}: {wall:.2f}x wall, {cpu:.2f}x cpu")


if __name__ == "__main__":
    main()
