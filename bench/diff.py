"""``ptscope diff`` on two big traces: wall, CPU and peak RSS against ``ptscope stats`` on
the larger one (the baseline, measured in the same interleaved rounds), and the determinism
of the emulated backend (the same program recorded several times).

    python bench/diff.py                          # 300,000 vs 310,000 rounds (12-13 M calls)
    python bench/diff.py --rounds 60000 62000 --repeat 3
    python bench/diff.py --determinism 5          # also: 5 deterministic runs compared

The traces are those of ``bench/analysis.py`` (the call-heavy workload, cached in
``bench/cache``). Each measurement is a child process; wall and CPU are the best of
``--repeat`` interleaved rounds, peak RSS the largest seen. Target: diff <= 2x stats.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from analysis import calls_in, measure, trace_of  # noqa: E402
from decode import CACHE, CALL_HEAVY, _hash, call_heavy_recording  # noqa: E402

PY = sys.executable


def timing(args: argparse.Namespace) -> None:
    before, after = (trace_of(r) for r in args.rounds)
    calls = [calls_in(t) for t in (before, after)]
    larger = after if calls[1] >= calls[0] else before
    print(f"before: {args.rounds[0]:,} rounds, {calls[0]:,} calls ({before})")
    print(f"after:  {args.rounds[1]:,} rounds, {calls[1]:,} calls ({after})", flush=True)
    scratch = CACHE / "diff-out"
    scratch.mkdir(parents=True, exist_ok=True)
    runs = {
        "stats (larger trace)": [PY, "-m", "ptscope", "stats", str(larger), "--json"],
        "diff": [PY, "-m", "ptscope", "diff", str(before), str(after), "--format", "json"],
        "flame --diff": [
            *(PY, "-m", "ptscope", "flame", "--diff", str(before), str(after)),
            *("-o", str(scratch / "d.svg")),
        ],
    }
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(args.repeat):
        for name, argv in runs.items():
            wall, cpu, rss = measure(argv, scratch / "out")
            old = best.get(name)
            if old is None:
                best[name] = (wall, cpu, rss)
            else:
                best[name] = (min(old[0], wall), min(old[1], cpu), max(old[2], rss))
    base = best["stats (larger trace)"]
    for name, (wall, cpu, rss) in best.items():
        print(
            f"  {name:22} {wall:7.2f} s wall {cpu:7.2f} s CPU {rss:6.0f} MB peak RSS"
            f"   x{wall / base[0]:.2f} wall, x{cpu / base[1]:.2f} CPU of stats"
        )
    print("Target: diff <= 2x the time of stats on the larger trace.")


def determinism(runs: int) -> None:
    """The call-heavy program and the bundled demo, each recorded ``runs`` times with
    --deterministic from different environments: every function's calls and instructions
    must be equal."""
    from ptscope.cli.demo import build_demo

    call_heavy_recording(2000)  # builds the program (static, -O2) once
    binaries = {
        "demo": [str(build_demo(CACHE / "demo-build")), "3"],
        "call_heavy": [str(CACHE / f"call_heavy-{_hash(CALL_HEAVY)}"), "2000"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        for label, command in binaries.items():
            traces = []
            for i in range(runs):
                out = Path(tmp) / f"{label}-{i}.fxt.gz"
                env = {"PATH": "/usr/bin:/bin", "PADDING": "x" * (1000 * i)}
                done = subprocess.run(
                    [PY, "-m", "ptscope", "run", "--backend", "emulated", "--deterministic",
                     "-o", str(out), "--", *command],
                    capture_output=True, text=True, env=env, cwd=tmp,
                )  # fmt: skip
                if done.returncode != 0:
                    raise SystemExit(f"recording {label} failed: {done.stderr}")
                traces.append(out)
            differences = 0
            functions = 0
            for other in traces[1:]:
                out = subprocess.run(
                    [PY, "-m", "ptscope", "diff", str(traces[0]), str(other), "--format",
                     "json", "--top", "0", "--changed"],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                data = json.loads(out.stdout)
                differences += len(data["functions"])
                all_rows = subprocess.run(
                    [PY, "-m", "ptscope", "diff", str(traces[0]), str(other), "--format",
                     "csv", "--top", "0"],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                functions = len(all_rows.stdout.splitlines()) - 1
            print(
                f"  determinism, {label}: {runs} runs, {functions} functions, "
                f"{differences} functions differing (calls, instructions or cycles; target 0)"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, nargs=2, default=[300_000, 310_000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--determinism", type=int, default=3, metavar="RUNS")
    args = ap.parse_args()
    if args.determinism:
        determinism(args.determinism)
    timing(args)


if __name__ == "__main__":
    main()
