"""Emulated-PT recording speed and memory, against QEMU alone measured in the same run.

Usage::

    python bench/emulated.py                  # 5 M and 22 M instruction runs (default)
    python bench/emulated.py --sizes 2 20 50  # other sizes, in millions of instructions
    python bench/emulated.py --no-decode      # recording only

Each measurement runs in a fresh child process (so its peak RSS is its own):

* qemu alone: the same program under ``qemu-x86_64`` with the same log items, its log
  streamed through a FIFO to a reader that throws it away: the floor for the recorder,
  which has to read and encode that same log;
* record: ``ptscope.record.emulated.record()`` (QEMU + log parsing + PT encoding + perf.data),
  with QEMU's own CPU time and ours;
* end to end: record, then ``ptscope.pipeline.decode_recording`` to ``.fxt.gz`` (perf script,
  the engine and the writer) -- the figure the issue's target (>= 1 M instructions/s) is for.

:func:`measure_record` and :func:`measure_qemu_alone` take any command line, so another
workload (or another benchmark) can reuse them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "programs" / "bench.c"
BUILD = ROOT / "tests" / ".build" / "bench"
INSNS_PER_ITERATION = 880  # measured: the workload's instructions per iteration (-O1, static)


def build_workload() -> Path:
    """Compile ``tests/programs/bench.c`` (static, -O1), cached by source hash."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    exe = BUILD / f"bench-{digest}"
    if not exe.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_name(f".{exe.name}.{os.getpid()}")
        subprocess.run(
            ["gcc", "-O1", "-static", "-no-pie", "-o", str(tmp), str(SOURCE)], check=True
        )
        tmp.replace(exe)
    return exe


def measure_record(argv: list[str], directory: Path, decode: bool) -> dict[str, Any]:
    """Record ``argv`` into ``directory`` (and decode it); timings, counts and CPU times."""
    from ptscope.record.emulated import record

    started = time.perf_counter()
    result = record(argv, directory)
    recorded = time.perf_counter()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {
        "instructions": result.instructions,
        "record_s": recorded - started,
        "qemu_cpu_s": children.ru_utime + children.ru_stime,
        "recorder_cpu_s": me.ru_utime + me.ru_stime,
        "record_rss_mib": me.ru_maxrss / 1024,
        "perf_data_mib": (directory / "perf.data").stat().st_size / 2**20,
    }
    if decode:
        from ptscope.pipeline import decode_recording

        summary = decode_recording(result.recording, directory / "trace.fxt.gz")
        out["decode_s"] = time.perf_counter() - recorded
        out["slices"] = summary.slices
        out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def measure_qemu_alone(argv: list[str]) -> dict[str, Any]:
    """QEMU with the recorder's flags, its log drained from a FIFO and thrown away."""
    from ptscope.record.emulated.qemu import REQUIRED_LOG_ITEMS, find_qemu

    tool = find_qemu()
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "log")
        os.mkfifo(fifo)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        keep = os.open(fifo, os.O_WRONLY)
        try:
            import fcntl

            fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ, as the recorder does
        except OSError:
            pass
        started = time.perf_counter()
        proc = subprocess.Popen(
            [tool.path, "-d", ",".join(REQUIRED_LOG_ITEMS), "-D", fifo, *argv],
            stdout=subprocess.DEVNULL,
        )
        size = 0
        while True:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                data = b""
            size += len(data)
            if not data:
                if proc.poll() is not None:
                    break
                select.select([fd], [], [], 0.05)
        elapsed = time.perf_counter() - started
        os.close(fd)
        os.close(keep)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "seconds": elapsed,
        "log_mib": size / 2**20,
        "qemu_cpu_s": children.ru_utime + children.ru_stime,
    }


def _child(kind: str, argv: list[str], decode: bool) -> dict[str, Any]:
    """Run one measurement in a fresh Python process; returns its JSON result."""
    cmd = [sys.executable, __file__, "--child", kind, json.dumps(argv)]
    if not decode:
        cmd.append("--no-decode")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _run_child(kind: str, argv: list[str], decode: bool) -> None:
    if kind == "qemu_alone":
        result = measure_qemu_alone(argv)
    else:
        with tempfile.TemporaryDirectory(prefix="ptscope-bench-") as tmp:
            result = measure_record(argv, Path(tmp), decode)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--sizes", type=float, nargs="+", default=[5, 22], help="millions of instructions"
    )
    parser.add_argument("--no-decode", action="store_true", help="time the recording only")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ARGV"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _run_child(args.child[0], json.loads(args.child[1]), not args.no_decode)
        return
    exe = build_workload()
    print(f"workload: {exe.relative_to(ROOT)} ({os.cpu_count()} CPUs)")
    header = (
        f"{'insns':>7} {'qemu alone':>11} {'record':>11} {'ratio':>6} "
        f"{'qemu cpu':>9} {'our cpu':>8} {'rec RSS':>8}"
    )
    if not args.no_decode:
        header += f" {'decode':>8} {'end to end':>11} {'RSS':>7}"
    print(header)
    for millions in args.sizes:
        iterations = max(1, int(millions * 1e6 / INSNS_PER_ITERATION))
        argv = [str(exe), str(iterations)]
        alone = _child("qemu_alone", argv, False)
        rec = _child("record", argv, not args.no_decode)
        n = rec["instructions"]
        qemu_rate = n / alone["seconds"] / 1e6
        rec_rate = n / rec["record_s"] / 1e6
        line = (
            f"{n / 1e6:6.1f}M {qemu_rate:7.2f} M/s {rec_rate:7.2f} M/s "
            f"{rec_rate / qemu_rate:5.2f}x {rec['qemu_cpu_s']:8.1f}s "
            f"{rec['recorder_cpu_s']:7.1f}s {rec['record_rss_mib']:5.0f} MiB"
        )
        if not args.no_decode:
            total = rec["record_s"] + rec["decode_s"]
            line += f" {rec['decode_s']:7.1f}s {n / total / 1e6:7.2f} M/s {rec['rss_mib']:4.0f} MiB"
        print(line, flush=True)
    print(
        "qemu alone: QEMU with the same log items into a FIFO drained by a trivial reader; "
        "ratio = record / qemu alone; RSS = peak resident set of the recording process."
    )


if __name__ == "__main__":
    main()
