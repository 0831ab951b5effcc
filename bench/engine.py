"""Engine + FXT writer throughput on a generated stream of call/return/jump events.

The issue's measure for the core pipeline (text parsing excluded): 1,000,000 branch events of
a random but consistent program (a third calls, a third returns, a third jumps, most jumps
inside one function, some tail calls), on one core.

Timing: the events are built first (untimed, as a decoder would hand them over), then the
engine and the writer are timed. Memory: a separate run builds the events in batches while
they are consumed (what the pipeline holds: never a list of a million event objects) and
reports its peak RSS. The baseline in the same run is building the events alone.

Each measurement runs in a fresh child process (clean peak RSS). Prints: events/s of the
engine alone and of engine + writer (gz and raw), peak RSS, bytes per call slice, and the
ratio to the 1 M events/s target.

Usage: ``python bench/engine.py [--events N] [--repeat R]``
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ptscope.model import BranchEvent, BranchKind, Location, TraceState  # noqa: E402

TARGET_EVENTS_PER_S = 1_000_000
BATCH = 8192


def event_columns(n: int, seed: int = 1) -> tuple[list[Location], list[array[int]]]:
    """Compact description of ``n`` events: a Location table and columns kind, time,
    source location, target location (``array('q')``: 32 bytes per event)."""
    rng = random.Random(seed)
    funcs = [f"fn_{i}" for i in range(400)] + [
        "std::vector<int, std::allocator<int> >::push_back(int const&)",
        "memcpy",
        "malloc",
    ]
    locations: list[Location] = []
    index: dict[tuple[str, int], int] = {}

    def loc(fn: str, off: int) -> int:
        key = (fn, off)
        if key not in index:
            base = 0x400000 + 0x1000 * (funcs.index(fn) if fn in funcs else 999)
            index[key] = len(locations)
            locations.append(Location(base + off, fn, off, "/usr/bin/prog"))
        return index[key]

    cols = [array("q") for _ in range(4)]
    kind_col, time_col, src_col, dst_col = cols

    def add(kind: int, time: int, src: int, dst: int) -> None:
        kind_col.append(kind)
        time_col.append(time)
        src_col.append(src)
        dst_col.append(dst)

    stack = ["main_loop"]
    sites: list[int] = []  # each frame's call site (offset in its caller)
    t = 1_000_000_000
    call, ret, jmp, jcc = (
        int(BranchKind.CALL),
        int(BranchKind.RETURN),
        int(BranchKind.JUMP),
        int(BranchKind.CONDITIONAL_JUMP),
    )
    while len(kind_col) < n:
        t += rng.randint(0, 40)
        r = rng.random()
        cur = stack[-1]
        off = rng.randrange(0x10, 0x200, 4)
        if (r < 0.34 and len(stack) < 60) or len(stack) == 1:
            callee = rng.choice(funcs)
            add(call, t, loc(cur, off), loc(callee, 0))
            stack.append(callee)
            sites.append(off)
        elif r < 0.68:
            stack.pop()
            # back right after the call (a tail call keeps its caller's call site)
            add(ret, t, loc(cur, off), loc(stack[-1], sites.pop() + 5))
        elif r < 0.72:
            target = rng.choice(funcs)
            add(jmp, t, loc(cur, off), loc(target, 0))
            stack[-1] = target
        else:
            add(jcc if r < 0.9 else jmp, t, loc(cur, off), loc(cur, off + 0x20))
    return locations, cols


def batches(locations: list[Location], cols: list[array[int]]) -> Iterator[list[BranchEvent]]:
    kinds = {int(k): k for k in BranchKind}
    none = TraceState.NONE
    kind_col, time_col, src_col, dst_col = cols
    for i in range(0, len(kind_col), BATCH):
        j = i + BATCH
        yield [
            BranchEvent(1, 1, t, kinds[k], none, locations[s], locations[d])
            for k, t, s, d in zip(
                kind_col[i:j], time_col[i:j], src_col[i:j], dst_col[i:j], strict=True
            )
        ]


def child(mode: str, n: int) -> dict[str, float]:
    from ptscope.fxt import write_timeline
    from ptscope.reconstruct.engine import TraceSegmentEngine

    locations, cols = event_columns(n)
    result: dict[str, float] = {}
    streaming = mode == "memory"
    prebuilt = [] if streaming else list(batches(locations, cols))
    started = time.perf_counter()
    if mode == "baseline":
        count = sum(len(b) for b in batches(locations, cols))
        assert count == n
    else:
        engine = TraceSegmentEngine()
        for batch in batches(locations, cols) if streaming else prebuilt:
            engine.feed_all(batch)
        timeline = engine.finish()
        result["engine_s"] = time.perf_counter() - started
        result["slices"] = timeline.slice_count()
        if mode != "engine":
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / ("t.fxt" if mode == "raw" else "t.fxt.gz")
                stats = write_timeline(timeline, path)
                result["file_bytes"] = stats.file_bytes
                result["raw_bytes"] = stats.bytes
    result["seconds"] = time.perf_counter() - started
    result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def run_child(mode: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, "--events", str(n)],
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.events)))
        return
    n = args.events
    best: dict[str, dict[str, float]] = {}
    for _ in range(args.repeat):
        for mode in ("baseline", "engine", "gz", "raw", "memory"):
            r = run_child(mode, n)
            if mode not in best or r["seconds"] < best[mode]["seconds"]:
                best[mode] = r
    base = best["baseline"]["seconds"]
    print(f"{n:,} branch events, best of {args.repeat} (each in a fresh process)")
    print(f"  baseline: building the event objects {base:.3f} s ({n / base / 1e6:.2f} M ev/s)")
    for mode, label in (
        ("engine", "engine alone"),
        ("gz", "engine + writer (.fxt.gz)"),
        ("raw", "engine + writer (.fxt)"),
    ):
        r = best[mode]
        rate = n / r["seconds"]
        print(
            f"  {label:<27} {r['seconds']:.3f} s  {rate / 1e6:.2f} M ev/s "
            f"({rate / TARGET_EVENTS_PER_S:.2f}x the 1 M ev/s target)"
        )
    slices = best["raw"]["slices"]
    print(f"  slices: {slices:,.0f} ({slices / n:.2f} per event)")
    print(
        f"  bytes per call slice: {best['raw']['file_bytes'] / slices:.1f} raw, "
        f"{best['gz']['file_bytes'] / slices:.1f} gzip"
    )
    mem = best["memory"]
    print(
        f"  peak RSS, events streamed in batches through engine + writer: "
        f"{mem['rss_mb']:.0f} MB (target 300 MB; {mem['seconds']:.2f} s incl. building events)"
    )


if __name__ == "__main__":
    main()
