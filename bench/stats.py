"""How fast ``ptscope stats`` (and the columnar reader under it) is on a big trace.

Builds a synthetic trace of N call slices (default 12,000,000) over 4 threads with our
FxtWriter (``_calltree.random_call_timeline``: random nested calls over 2000 functions,
some recursion, every slice with an address, one in 500 with a flag), writes it as
``.fxt.gz``, then, best of ``--repeat``:

- baseline: inflating the file (ISA-L) and nothing else: no reader can be faster;
- ``read_columns`` (the columnar reader, argument columns skipped) and with them;
- ``load_calls`` + ``function_stats``: what ``ptscope stats`` computes;
- ``ptscope stats --json`` as a user runs it (a new process: imports, reading, output);
- for scale, the strict reader (``read_trace``) on a 200,000-slice trace of the same kind.

Prints seconds (wall and CPU: the machine may be shared), slices/s and ratios against the
baseline. Usage: ``python bench/stats.py [--slices N] [--repeat R] [--trace PATH]``
(``--trace``: reuse or keep the generated file).
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from _calltree import random_call_timeline  # noqa: E402
from ptscope.analyze.calls import load_calls  # noqa: E402
from ptscope.analyze.stats import function_stats  # noqa: E402
from ptscope.fxt import read_trace, write_timeline  # noqa: E402
from ptscope.fxt.columns import read_columns  # noqa: E402

try:
    from isal.igzip import IGzipFile as Inflate
except ImportError:  # pragma: no cover
    from gzip import GzipFile as Inflate  # type: ignore[assignment]


def cpu_seconds() -> float:
    """CPU time of this process and of the children it waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(wall, CPU) seconds of the fastest run."""
    runs = []
    for _ in range(repeat):
        gc.collect()
        wall, cpu = time.perf_counter(), cpu_seconds()
        fn()
        runs.append((time.perf_counter() - wall, cpu_seconds() - cpu))
    return min(runs)


def inflate(path: Path) -> None:
    with Inflate(path, "rb") as f:
        while f.read(1 << 24):
            pass


def stats(path: Path) -> None:
    function_stats(load_calls(path))


def cli(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ptscope", "stats", str(path), "--json"],
        capture_output=True,
        check=True,
    )
    assert done.stdout.startswith(b"{")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slices", type=int, default=12_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--trace", type=Path, help="use this file (made if missing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace or Path(tmp) / "big.fxt.gz"
        if not path.exists():
            t0 = time.perf_counter()
            timeline = random_call_timeline(args.slices)
            t1 = time.perf_counter()
            write_timeline(timeline, path)
            print(
                f"trace: {timeline.slice_count():,} slices, {len(timeline.threads)} threads, "
                f"{len(timeline.names)} functions; built in {t1 - t0:.1f} s, "
                f"written in {time.perf_counter() - t1:.1f} s"
            )
            del timeline
        n = len(read_columns(path, with_args=False))
        print(f"file: {path.stat().st_size / 2**20:.0f} MiB, {n:,} slices")
        print(f"{'':34} {'wall':>8} {'cpu':>8} {'M slices/s':>11} {'x baseline':>11}")
        floor = best(lambda: inflate(path), args.repeat)
        print(f"{'baseline: inflate only':34} {floor[0]:7.2f}s {floor[1]:7.2f}s "
              f"{n / floor[0] / 1e6:11.2f} {1:10.1f}x")  # fmt: skip
        for label, fn, repeat in (
            ("read_columns (no args)", lambda: read_columns(path, with_args=False), args.repeat),
            ("read_columns (all columns)", lambda: read_columns(path), args.repeat),
            ("stats: load_calls + function_stats", lambda: stats(path), args.repeat),
            ("ptscope stats --json (a process)", lambda: cli(path), 1),
        ):
            wall, cpu = best(fn, repeat)
            print(f"{label:34} {wall:7.2f}s {cpu:7.2f}s {n / wall / 1e6:11.2f} "
                  f"{wall / floor[0]:10.1f}x")  # fmt: skip
        small = Path(tmp) / "small.fxt.gz"
        write_timeline(random_call_timeline(200_000), small)
        wall, _ = best(lambda: read_trace(small), 1)
        fast, _ = best(lambda: read_columns(small), args.repeat)
        print(
            f"strict reader on 200,000 slices: {wall:.2f} s ({200_000 / wall / 1e6:.2f} M/s, "
            f"{wall / fast:.0f}x the columnar reader; {n / (200_000 / wall) / 60:.1f} min "
            f"for {n:,} slices at that rate)"
        )


if __name__ == "__main__":
    main()
