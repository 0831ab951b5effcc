"""Emulated-PT recording speed and memory, against plain QEMU and callgrind in the same run.

Usage::

    python bench/emulated.py                    # 40 M and 1 G instructions, best of 3 rounds
    python bench/emulated.py --sizes 40 --rounds 5
    python bench/emulated.py --no-end-to-end    # recording only (no `ptscope run`)

The workload is the call-heavy program of ``bench/call_heavy.c`` (``top`` calls ``mid`` once
per round, ``mid`` calls a tiny ``leaf`` 40-43 times), built ``-O1 -g`` the way gcc builds by
default (a dynamically linked PIE). Its rounds are chosen for each size from the instruction
count of a 60,000-round recording. Every figure comes from one run, each measurement in a
fresh child process (so that its peak RSS is its own), interleaved round by round; the best
wall time and the best CPU time (user + system, with every child process) are kept:

* native: the program alone;
* plain QEMU: ``qemu-x86_64 PROGRAM`` with no plugin and no log: the floor of any recorder
  inside QEMU;
* callgrind: ``valgrind --tool=callgrind`` (its output thrown away): what CI setups that gate
  on instruction counts use;
* record: ``ptscope.record.emulated.record()`` (QEMU with the recorder plugin writing the
  perf.data, Python waiting), with the recording's peak RSS (QEMU's) and perf.data size;
* ptscope run: the whole ``ptscope run --backend emulated -o trace.fxt.gz`` (record and
  decode), with its peak RSS (the largest of its processes).

Figures: instructions per second of wall time, and the ratios record / plain QEMU and
record / callgrind (the issue's target: record <= callgrind).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "bench" / "call_heavy.c"
BUILD = ROOT / "tests" / ".build" / "bench"
CALIBRATION_ROUNDS = 60_000


def build_workload() -> Path:
    """Compile ``bench/call_heavy.c`` with ``-O1 -g`` (a PIE), cached by source hash."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    exe = BUILD / f"call_heavy-{digest}"
    if not exe.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_name(f".{exe.name}.{os.getpid()}")
        subprocess.run(["gcc", "-O1", "-g", "-o", str(tmp), str(SOURCE)], check=True)
        tmp.replace(exe)
    return exe


def _cpu(children: resource.struct_rusage, me: resource.struct_rusage | None = None) -> float:
    total = children.ru_utime + children.ru_stime
    if me is not None:
        total += me.ru_utime + me.ru_stime
    return total


def _timed(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a command (output thrown away): wall time, CPU time and peak RSS of its tree."""
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, env=env)
    wall = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": wall, "cpu": _cpu(children), "rss_mib": children.ru_maxrss / 1024}


def measure(kind: str, argv: list[str]) -> dict[str, Any]:
    """One measurement (run in a child process by :func:`_child`)."""
    if kind == "native":
        return _timed(argv)
    if kind == "qemu":
        from ptscope.record.emulated.qemu import find_qemu

        return _timed([find_qemu().path, *argv])
    if kind == "callgrind":
        return _timed(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", "-q", *argv]
        )
    with tempfile.TemporaryDirectory(prefix="ptscope-bench-") as tmp:
        if kind == "record":
            from ptscope.record.emulated import record

            started = time.perf_counter()
            result = record(argv, Path(tmp) / "rec")
            wall = time.perf_counter() - started
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            me = resource.getrusage(resource.RUSAGE_SELF)
            return {
                "wall": wall,
                "cpu": _cpu(children, me),
                "qemu_cpu": _cpu(children),
                "rss_mib": children.ru_maxrss / 1024,
                "instructions": result.instructions,
                "perf_data_mib": (Path(tmp) / "rec" / "perf.data").stat().st_size / 2**20,
            }
        # ptscope run: record and decode, end to end
        out = Path(tmp) / "trace.fxt.gz"
        command = [sys.executable, "-m", "ptscope", "run", "--backend", "emulated"]
        result = _timed([*command, "-o", str(out), "--", *argv])
        me = resource.getrusage(resource.RUSAGE_SELF)
        result["rss_mib"] = max(result["rss_mib"], me.ru_maxrss / 1024)
        result["trace_mib"] = out.stat().st_size / 2**20
        return result


def _child(kind: str, argv: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, json.dumps(argv)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    best = dict(min(runs, key=lambda r: r["wall"]))
    best["cpu"] = min(r["cpu"] for r in runs)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[40, 1000], help="millions of instructions"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--no-end-to-end", action="store_true", help="skip `ptscope run`")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ARGV"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], json.loads(args.child[1]))))
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench/emulated.py needs valgrind (apt-get install valgrind)")
    exe = build_workload()
    calibration = _child("record", [str(exe), str(CALIBRATION_ROUNDS)])
    per_round = calibration["instructions"] / CALIBRATION_ROUNDS
    print(
        f"workload: {exe.relative_to(ROOT)} (-O1 -g, PIE), {per_round:.1f} instructions per "
        f"round; {os.cpu_count()} CPUs; best of {args.rounds} interleaved rounds"
    )
    kinds = ["native", "qemu", "callgrind", "record"]
    if not args.no_end_to_end:
        kinds.append("run")
    for millions in args.sizes:
        rounds = max(1, round(millions * 1e6 / per_round))
        argv = [str(exe), str(rounds)]
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                if kind == "run" and millions >= 500 and runs[kind]:
                    continue  # one end-to-end run of a big trace is enough
                runs[kind].append(_child(kind, argv))
        best = {k: _best(v) for k, v in runs.items()}
        rec = best["record"]
        n = rec["instructions"]
        print(
            f"\n{n / 1e6:,.1f} M instructions ({rounds:,} rounds, {n / per_round / 1e6:.2f}"
            f" M calls of mid, {rec['perf_data_mib']:.0f} MiB of perf.data)"
        )
        print(
            f"{'':14} {'wall':>8} {'cpu':>8} {'M insn/s':>9} {'x qemu':>7} {'x callgrind':>11}"
            f" {'peak RSS':>9}"
        )
        for kind in kinds:
            r = best[kind]
            label = {"run": "ptscope run", "qemu": "plain QEMU"}.get(kind, kind)
            print(
                f"{label:14} {r['wall']:7.2f}s {r['cpu']:7.2f}s {n / r['wall'] / 1e6:9.1f}"
                f" {r['wall'] / best['qemu']['wall']:6.2f}x"
                f" {r['wall'] / best['callgrind']['wall']:10.2f}x"
                f" {r['rss_mib']:6.0f} MiB"
            )
    print(
        "\nx qemu, x callgrind: wall time over that of plain QEMU / callgrind in the same run "
        "(record <= 1.00x callgrind is the target); peak RSS: of the recording QEMU for "
        "record, of the largest process for the others."
    )


if __name__ == "__main__":
    main()
