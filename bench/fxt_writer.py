"""Throughput, size and memory of the FXT writer, against ``np.save`` of the same columns.

Builds a Timeline of N call slices (default 1,200,000) over 4 threads: a random call tree
of ~400 functions (Zipf-like popularity, depth up to 40), every slice with an entry
address, as the engine gives them without instruction counts. Then, on one core, best of
``--repeat`` runs:

- baseline: ``np.save`` of the 8 slice columns to one file (a floor for "just writing the
  data"), and the same bytes through each gzip compressor used below (floors for the
  compressed cases);
- ``write_timeline`` to ``.fxt`` (raw) and ``.fxt.gz``: the default (ISA-L level 1 when
  ``isal`` is installed) and zlib at levels 1 and 6;
- variants: every slice with instructions and cycles; a mix where args differ per slice
  (the scatter path instead of the 2-D fast path);
- ``read_trace`` of the raw file (the strict reader, pure Python) for scale.

Prints slices/s, ratios against the baseline, bytes per call slice and peak RSS.

Usage: ``python bench/fxt_writer.py [--slices N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import os
import random
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ptscope.fxt import read_trace, write_timeline  # noqa: E402
from ptscope.fxt.writer import GZIP_LEVEL  # noqa: E402

try:
    from isal.igzip import IGzipFile
except ImportError:
    IGzipFile = None  # type: ignore[assignment,misc]
from ptscope.timeline import ThreadTimeline, Timeline  # noqa: E402


def make_timeline(n: int, *, threads: int = 4, seed: int = 1) -> Timeline:
    """``n`` properly nested slices spread over ``threads`` threads."""
    rng = random.Random(seed)
    names = [f"fn_{i}" for i in range(397)] + [
        "std::vector<int, std::allocator<int> >::push_back(int const&)",
        "memcpy",
        "malloc",
    ]
    weights = [1 / (i + 1) for i in range(len(names))]
    timeline = Timeline(names=names, processes={1000: "/usr/bin/prog --flag"})
    per_thread = n // threads
    for t in range(threads):
        picks = rng.choices(range(len(names)), weights, k=per_thread)
        rows: list[tuple[int, int, int, int]] = []
        stack: list[tuple[int, int]] = []  # (start, name id)
        now = 1_700_000_000_000_000_000 + t
        k = 0
        while len(rows) < per_thread:
            now += rng.randint(1, 40)
            if k < per_thread and (not stack or (rng.random() < 0.5 and len(stack) < 40)):
                stack.append((now, picks[k]))
                k += 1
            else:
                start, name = stack.pop()
                rows.append((start, now, len(stack), name))
        rows.sort(key=lambda r: (r[0], r[2]))
        cols = np.array(rows, dtype=np.int64).T
        count = cols.shape[1]
        timeline.threads.append(
            ThreadTimeline(
                pid=1000,
                tid=1000 + t,
                name=f"worker-{t}",
                start=cols[0].copy(),
                end=cols[1].copy(),
                depth=cols[2].astype(np.int32),
                name_id=cols[3].astype(np.int32),
                address=(0x400000 + 0x1000 * cols[3]).astype(np.uint64),
                instructions=np.full(count, -1, dtype=np.int64),
                cycles=np.full(count, -1, dtype=np.int64),
                flags=np.zeros(count, dtype=np.uint8),
            )
        )
    return timeline


def with_counts(timeline: Timeline) -> Timeline:
    threads = []
    for th in timeline.threads:
        dur = th.end - th.start
        threads.append(
            ThreadTimeline(
                th.pid,
                th.tid,
                th.name,
                th.start,
                th.end,
                th.depth,
                th.name_id,
                th.address,
                dur * 3,
                dur * 2,
                th.flags,
            )
        )
    return Timeline(timeline.names, threads, timeline.processes)


def mixed(timeline: Timeline) -> Timeline:
    """Args that differ between slices: some addresses unknown, some counts and flags."""
    threads = []
    for th in timeline.threads:
        n = len(th)
        i = np.arange(n)
        threads.append(
            ThreadTimeline(
                th.pid,
                th.tid,
                th.name,
                th.start,
                th.end,
                th.depth,
                th.name_id,
                np.where(i % 7 == 0, 0, th.address).astype(np.uint64),
                np.where(i % 3 == 0, th.end - th.start, -1),
                np.where(i % 5 == 0, th.end - th.start, -1),
                (i % 11 == 0).astype(np.uint8),
            )
        )
    return Timeline(timeline.names, threads, timeline.processes)


def columns(th: ThreadTimeline) -> list[np.ndarray]:  # type: ignore[type-arg]
    return [
        th.start,
        th.end,
        th.depth,
        th.name_id,
        th.address,
        th.instructions,
        th.cycles,
        th.flags,
    ]


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def row(label: str, secs: float, n: int, ratio: float, size: int) -> None:
    rate = n / secs / 1e6
    print(f"{label:34} {secs * 1e3:7.1f}ms {rate:8.2f} M {ratio:8.2f}x {size / n:8.1f}")


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slices", type=int, default=1_200_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    t0 = time.perf_counter()
    timeline = make_timeline(args.slices)
    n = timeline.slice_count()
    built = time.perf_counter() - t0
    threads, names = len(timeline.threads), len(timeline.names)
    print(f"timeline: {n:,} slices, {threads} threads, {names} names (built in {built:.1f} s)")
    rss_before = rss_mb()
    print(f"peak RSS after building the timeline: {rss_before:.0f} MB")

    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)

        def save() -> None:
            with open(d / "cols.npy", "wb") as f:
                for th in timeline.threads:
                    for col in columns(th):
                        np.save(f, col)

        def save_gz(open_gz: Callable[[Path], BinaryIO], name: str) -> None:
            with open_gz(d / name) as f:
                for th in timeline.threads:
                    for col in columns(th):
                        np.save(f, col)

        def zlib_gz(level: int) -> Callable[[Path], BinaryIO]:
            return lambda p: gzip.GzipFile(p, "wb", compresslevel=level, mtime=0)  # type: ignore[return-value]

        def fast_gz(p: Path) -> BinaryIO:
            return IGzipFile(p, "wb", compresslevel=GZIP_LEVEL, mtime=0)  # type: ignore[return-value]

        print(f"\n{'case':34} {'time':>9} {'slices/s':>10} {'vs floor':>9} {'B/slice':>8}")
        base = best(save, args.repeat)
        row("floor: np.save", base, n, 1.0, (d / "cols.npy").stat().st_size)
        floors = {}
        compressors: list[tuple[str, int | None, Callable[[Path], BinaryIO]]] = [
            ("zlib -1", 1, zlib_gz(1)),
            ("zlib -6", 6, zlib_gz(6)),
        ]
        if IGzipFile is not None:
            compressors.insert(0, ("isal -1", None, fast_gz))
        for label, level, open_gz in compressors:
            name = f"cols-{level}.npy.gz"
            floors[level] = best(lambda: save_gz(open_gz, name), args.repeat)  # noqa: B023
            row(f"floor: np.save + {label}", floors[level], n, 1.0, (d / name).stat().st_size)

        with_args, mixed_args = with_counts(timeline), mixed(timeline)
        cases: list[tuple[str, Timeline, str, int | None, float]] = [
            ("fxt raw (address only)", timeline, "t.fxt", None, base),
            ("fxt raw (+instr, cycles)", with_args, "c.fxt", None, base),
            ("fxt raw (mixed args)", mixed_args, "m.fxt", None, base),
        ]
        for label, level, _ in compressors:
            cases.append((f"fxt.gz {label}", timeline, f"t{level}.fxt.gz", level, floors[level]))
        cases.append(("fxt.gz default (+instr, cycles)", with_args, "c.fxt.gz", None, floors[None]))
        for label, tl, name, level, floor in cases:
            path = d / name
            secs = best(lambda: write_timeline(tl, path, gzip_level=level), args.repeat)  # noqa: B023
            row(label, secs, n, secs / floor, path.stat().st_size)
        extra = rss_mb() - rss_before
        print(f"\npeak RSS after writing: {rss_mb():.0f} MB (+{extra:.0f} MB over the timeline)")
        encoders(d, [("address only", timeline), ("+instr, cycles", with_args)], args.repeat)

        t0 = time.perf_counter()
        trace = read_trace(d / "t.fxt")
        secs = time.perf_counter() - t0
        got = sum(len(s) for s in trace.slices.values())
        assert got == n, (got, n)
        print(
            f"read_trace (strict, raw file): {secs:.2f} s, {n / secs / 1e3:.0f} k slices/s, "
            f"peak RSS {rss_mb():.0f} MB"
        )


def encoders(d: Path, timelines: list[tuple[str, Timeline]], repeat: int) -> None:
    """The slice encoder in C (fxt/_cfxt.c) against its numpy twin, the same timelines to
    a raw .fxt, in interleaved rounds (best of ``repeat`` each), with and without every
    slice's drill string (the default of a decode whose recording is kept)."""
    from ptscope.fxt import writer as fxt_writer

    c_encoder = fxt_writer._cfxt
    if c_encoder is None:
        print("\nslice encoder: the C one is not built (numpy only)")
        return
    print(f"\n{'slice encoder, raw .fxt':34} {'C s':>7} {'numpy s':>8} {'C/numpy':>8}")
    for label, plain in timelines:
        for drill in (None, Path("/tmp/a recording")):
            tl = plain if drill is None else _drillable(plain)
            times = {"c": float("inf"), "numpy": float("inf")}
            for _ in range(repeat):
                for which, encoder in (("c", c_encoder), ("numpy", None)):
                    fxt_writer._cfxt = encoder
                    t0 = time.process_time()
                    write_timeline(tl, d / "e.fxt", drill=drill)
                    times[which] = min(times[which], time.process_time() - t0)
            fxt_writer._cfxt = c_encoder
            name = label + (" + drill" if drill else "")
            ratio = times["c"] / times["numpy"]
            print(f"{name:34} {times['c']:7.2f} {times['numpy']:8.2f} {ratio:8.2f}")


def _drillable(timeline: Timeline) -> Timeline:
    """The timeline with perf times (its own) and, every other slice, an anchor: what a
    drill string is made of."""
    threads = []
    for th in timeline.threads:
        anchored = (np.arange(len(th)) % 2).astype(np.int64)
        count = th.instructions if th.instructions is not None else th.end - th.start
        threads.append(
            dataclasses.replace(
                th,
                perf_start=th.start,
                perf_end=th.end,
                anchor_ip=th.address,
                anchor_occurrence=anchored,
                instructions=count,
            )
        )
    return Timeline(timeline.names, threads, timeline.processes)


if __name__ == "__main__":
    main()
