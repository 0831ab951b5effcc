"""Start-up latency of `ptscope run` and the cost of a trigger hit, against perf's own.

1. Start-up: wall time from launching a command to the traced program's first action (the
   program prints CLOCK_REALTIME first thing). Baseline, measured in the same run: perf
   launching the same program itself (`perf record -e cpu-clock -- prog`, and with the
   same options ptscope uses). ptscope holds the program until perf answers `ping`, so it
   should cost perf's start-up plus Python's own (target: baseline + 50 ms).
2. Trigger hit: the program calls trigger_target() N times and times the loop itself;
   the difference per call with a hardware breakpoint armed on it (every thread, as
   `--trigger` does), hits drained as ptscope does, is what one hit costs the program.

Run: .venv/bin/python bench/startup.py [--runs N]
"""

from __future__ import annotations

import argparse
import hashlib
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "record" / "programs" / "startup.c"
BUILD = ROOT / "tests" / ".build" / "bench"
FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline"]


# `ptscope run` with only its own command module imported: what start-up costs once the
# other commands import their heavy modules (numpy, the pipeline) lazily.
ONLY_RUN = (
    "import sys; from ptscope.cli import _build_parser; from ptscope.cli.run import RunCommand; "
    "c = RunCommand(); a = _build_parser([c]).parse_args(['run', *sys.argv[1:]]); "
    "sys.exit(c.run(a))"
)


def build() -> Path:
    key = hashlib.sha256(SOURCE.read_bytes() + repr(FLAGS).encode()).hexdigest()[:12]
    out = BUILD / f"startup-{key}"
    BUILD.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        subprocess.run(["gcc", *FLAGS, "-o", str(out), str(SOURCE)], check=True)
    # A non-PIE copy: perf's mem:ADDR:x event needs an absolute address.
    subprocess.run(
        ["gcc", *FLAGS, "-no-pie", "-fno-pie", "-o", str(BUILD / "startup-nopie"), str(SOURCE)],
        check=True,
    )
    return out


def started_after(argv: list[str], cwd: Path) -> float:
    """Seconds from launching argv to the program printing its start time."""
    launched = time.time_ns()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)
    for line in done.stdout.splitlines():
        if line.startswith("started "):
            return (int(line.split()[1]) - launched) / 1e9
    raise RuntimeError(f"{argv[0]} failed: {done.stderr.strip()[-300:]}")


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def bench_startup(prog: Path, runs: int) -> None:
    perf = shutil.which("perf")
    if perf is None:
        print("perf not installed: skipping the start-up benchmark")
        return
    ptscope = [sys.executable, "-m", "ptscope"]
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        cases = {
            "perf record -e cpu-clock -- prog (baseline)": [
                perf,
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-o",
                "b.data",
                "--",
                str(prog),
            ],
            "perf record, ptscope's sampling options -- prog": [
                perf,
                "record",
                "-q",
                "-e",
                "cpu-clock:u",
                "-F",
                "10000",
                "--call-graph=dwarf",
                "-o",
                "m.data",
                "--",
                str(prog),
            ],
            "ptscope run --backend sampling -- prog": [
                *ptscope,
                *("run", "--backend", "sampling", "-o", "p.fxt.gz", "--", str(prog)),
            ],
            "  the same, only the run command imported": [
                *(sys.executable, "-c", ONLY_RUN),
                *("--backend", "sampling", "-o", "q.fxt.gz", "--", str(prog)),
            ],
            "python -m ptscope --help (interpreter + CLI import)": [
                *ptscope,
                "--help",
            ],
        }
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):  # interleaved, so drifts hit every case alike
            for name, argv in cases.items():
                if name.startswith("python"):
                    t0 = time.perf_counter()
                    subprocess.run(argv, capture_output=True, check=True)
                    results[name].append(time.perf_counter() - t0)
                else:
                    results[name].append(started_after(argv, cwd))
    print(f"start-up: time to the program's first instruction, median of {runs}")
    for name, samples in results.items():
        print(f"  {name:<55} {median_ms(samples):8.1f} ms")
    base = median_ms(results["perf record -e cpu-clock -- prog (baseline)"])
    matched = median_ms(results["perf record, ptscope's sampling options -- prog"])
    ours = median_ms(results["ptscope run --backend sampling -- prog"])
    lean = median_ms(results["  the same, only the run command imported"])
    print(f"  ptscope - perf baseline: {ours - base:+.1f} ms (ratio {ours / base:.2f})")
    print(f"  ptscope - perf, same options: {ours - matched:+.1f} ms ({ours / matched:.2f}x)")
    print(f"  run command alone - perf, same options: {lean - matched:+.1f} ms")


def perf_breakpoint_ns_per_call(prog: Path, calls: int) -> float | None:
    """perf's own breakpoint event, counting only (`perf stat -e mem:ADDR:x`): the floor a
    breakpoint costs on this machine, whatever reads it."""
    perf = shutil.which("perf")
    nm = shutil.which("nm")
    if perf is None or nm is None:
        return None
    symbols = subprocess.run([nm, str(prog)], capture_output=True, text=True).stdout
    address = next(ln.split()[0] for ln in symbols.splitlines() if ln.endswith(" trigger_target"))
    done = subprocess.run(
        [perf, "stat", "-x,", "-e", f"mem:0x{address}:x", str(prog), str(calls)],
        capture_output=True,
        text=True,
    )
    for line in done.stdout.splitlines():
        if line.startswith("ns_per_call"):
            return float(line.split()[1])
    return None


def bench_trigger(prog: Path, calls: int) -> None:
    from ptscope.record.breakpoints import BreakpointSet
    from ptscope.record.launch import StoppedProgram
    from ptscope.record.symbols import parse_selection, read_maps, resolve_selection

    def run_once(mode: str) -> tuple[float, int]:
        """(ns per call as the program timed it, hits seen)."""
        program = StoppedProgram.spawn([str(prog), str(calls)], stdout=subprocess.PIPE)
        source = None
        hits = 0
        stop = threading.Event()
        reader = None
        if mode != "plain":
            selection = parse_selection("trigger_target")
            bps = resolve_selection(selection, str(prog), read_maps(program.pid))
            source = BreakpointSet(bps, data_pages=256, wake_each_hit=mode == "snapshot")
            source.arm([program.pid])

            def drain() -> None:  # what ptscope's session loop does with hits
                nonlocal hits
                assert source is not None
                while not stop.is_set():
                    select.select(source.fds(), [], [], 0.05)
                    hits += len(source.read_hits())

            reader = threading.Thread(target=drain)
            reader.start()
        program.release()
        out, _ = program.process.communicate()
        stop.set()
        if reader is not None:
            reader.join()
        if source is not None:
            hits += len(source.read_hits()) + source.lost
            source.close()
        text = out.decode()
        per_call = next(ln.split()[1] for ln in text.splitlines() if ln.startswith("ns_per_call"))
        return float(per_call), hits

    results = {mode: [run_once(mode) for _ in range(3)] for mode in ("plain", "mark", "snapshot")}
    plain = statistics.median(r[0] for r in results["plain"])
    print(f"trigger hit cost: {calls:,} calls of trigger_target, median of 3 runs")
    print(f"  no breakpoint:                                  {plain:9.1f} ns/call")
    floor = perf_breakpoint_ns_per_call(BUILD / "startup-nopie", calls)
    if floor is not None:
        print(f"  perf stat -e mem:ADDR:x (baseline: perf's own)  {floor:9.1f} ns/call")
    labels = {
        "mark": "--trigger, hits marked (sampling backend)",
        "snapshot": "--trigger, reader woken per hit (snapshots)",
    }
    for mode, label in labels.items():
        per_call = statistics.median(r[0] for r in results[mode])
        hits = [r[1] for r in results[mode]]
        line = f"  {label:<47} {per_call:9.1f} ns/call: one hit costs {per_call - plain:,.0f} ns"
        if floor is not None:
            line += f" ({(per_call - plain) / (floor - plain):.2f}x perf's)"
        print(line + f"; hits seen {min(hits):,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    prog = build()
    bench_startup(prog, args.runs)
    bench_trigger(prog, args.calls)


if __name__ == "__main__":
    main()
