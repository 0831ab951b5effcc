"""What inlined frames cost a decode: `ptscope decode` of one recording with them (the
default) and with `--no-inline`, interleaved rounds, each in a process of its own.

The workload is bench/inline_heavy.cpp at -O2 -g (C++ whose time goes into inlined
operators, lambdas, std::sort's and std::map's helpers), recorded once under emulated PT
(cached under bench/cache). A second recording, of the same program built without debug
information, shows what reading no inline information costs (the DWARF lookup only).

Prints, per variant: the best and median wall and CPU (user + system of the decode's
process tree) over the rounds, the slices written, the trace's size, and the ratios of the
medians to `--no-inline` measured in the same rounds (the issue's target: <= 1.2x).

    python bench/inline.py [--elements N] [--rounds R]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / "cache"
SOURCE = HERE / "inline_heavy.cpp"


def _build(debug: bool) -> Path:
    flags = ["-O2", "-g"] if debug else ["-O2"]
    key = hashlib.sha256((SOURCE.read_text() + " ".join(flags)).encode()).hexdigest()[:12]
    exe = CACHE / f"inline_heavy-{'g' if debug else 'nog'}-{key}"
    if not exe.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["g++", *flags, "-o", str(exe), str(SOURCE)], check=True)
    return exe


def _record(exe: Path, elements: int) -> Path:
    directory = CACHE / f"{exe.name}-{elements}.rec"
    if (directory / "perf.data").exists():
        return directory
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"recording {exe.name} {elements} under emulated PT (once; cached in {directory})")
    subprocess.run(
        [sys.executable, "-m", "ptscope", "run", "--backend", "emulated", "--keep-recording",
         str(tmp), "-o", os.devnull, "--", str(exe), str(elements)],
        check=True, capture_output=True,
    )  # fmt: skip
    tmp.rename(directory)
    return directory


def _decode(recording: Path, *options: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "trace.fxt.gz"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "ptscope", "decode", str(recording), "-o", str(out), *options],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        found = re.search(r"([\d,]+) slices", done.stdout + done.stderr)
        return {
            "wall": wall,
            "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "slices": float(found.group(1).replace(",", "")) if found else 0.0,
            "bytes": float(out.stat().st_size),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=20_000, help="points the workload sorts")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = ap.parse_args()
    with_dwarf = _record(_build(True), args.elements)
    without_dwarf = _record(_build(False), args.elements)
    variants = {
        "-O2 -g, inlined frames": (with_dwarf, ()),
        "-O2 -g, --no-inline": (with_dwarf, ("--no-inline",)),
        "-O2 (no DWARF), inline on": (without_dwarf, ()),
        "-O2 (no DWARF), --no-inline": (without_dwarf, ("--no-inline",)),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (recording, options) in variants.items():
            runs[name].append(_decode(recording, *options))
    print(f"bench/inline.py: {args.rounds} interleaved rounds, {os.cpu_count()} CPUs")
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    for name, rs in runs.items():
        m = med[name]
        print(
            f"  {name:30} wall best {min(r['wall'] for r in rs):6.2f} s median {m['wall']:6.2f} s,"
            f" CPU best {min(r['cpu'] for r in rs):6.2f} s median {m['cpu']:6.2f} s,"
            f" {m['slices']:12,.0f} slices, {m['bytes'] / 1e6:7.1f} MB"
        )
    for a, b in (
        ("-O2 -g, inlined frames", "-O2 -g, --no-inline"),
        ("-O2 (no DWARF), inline on", "-O2 (no DWARF), --no-inline"),
    ):
        x, y = med[a], med[b]
        per = (x["cpu"] - y["cpu"]) / max(1.0, x["slices"] - y["slices"]) * 1e9
        print(
            f"  {a} / {b}: wall {x['wall'] / y['wall']:.2f}x, CPU {x['cpu'] / y['cpu']:.2f}x,"
            f" slices {x['slices'] / max(1.0, y['slices']):.1f}x"
            + (f"; {per:.0f} ns CPU per extra slice" if x["slices"] > y["slices"] else "")
        )


if __name__ == "__main__":
    main()
