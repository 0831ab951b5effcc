"""Analysis at any size: wall time and peak RSS of ``stats``, ``flame``, ``flame --chart``
and ``dump`` on traces of the call-heavy workload (``bench/call_heavy.c``: ``top`` ->
rounds x ``mid`` -> 40-43 x ``leaf``), before (every call in memory: ``load_calls``,
``read_trace``) and after (streamed: ``ptscope stats`` etc. as a user runs them).

    python bench/analysis.py                        # 60,000, 300,000 and 700,000 rounds
    python bench/analysis.py --rounds 60000 --repeat 3

Each measurement is a child process (``os.wait4`` gives its own peak RSS); wall and CPU
seconds are the best of ``--repeat`` interleaved rounds. The recordings and traces are
cached in ``bench/cache`` (decoded once with ``ptscope decode``). ``--before-limit`` skips
the in-memory runs on traces with more calls than that (they need several GB).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from decode import CACHE, call_heavy_recording  # noqa: E402

PY = sys.executable

BEFORE = {
    "stats": "from ptscope.analyze.calls import load_calls\n"
    "from ptscope.analyze.stats import function_stats\n"
    "function_stats(load_calls({P}))",
    "flame": "from ptscope.analyze.calls import load_calls\n"
    "from ptscope.analyze.flame import flame_graph\n"
    "from ptscope.analyze.flame_svg import render_svg\n"
    "open({OUT}, 'w').write(render_svg(flame_graph(load_calls({P})), title='t'))",
    "flame --chart": "from ptscope.analyze.calls import load_calls\n"
    "from ptscope.analyze.flame import flame_chart\n"
    "from ptscope.analyze.flame_svg import render_svg\n"
    "open({OUT}, 'w').write(render_svg(flame_chart(load_calls({P})), title='t'))",
    "dump": "import sys\n"
    "from ptscope.cli.dump import dump_lines\n"
    "from ptscope.fxt.reader import read_trace\n"
    "out = open({OUT}, 'w')\n"
    "lines = dump_lines(read_trace({P}))\n"
    "for i in range(0, len(lines), 4096): out.write('\\n'.join(lines[i:i + 4096]) + '\\n')",
}

AFTER = {
    "stats": ["stats", "{P}", "--json", "--top", "0"],
    "flame": ["flame", "{P}", "-o", "{OUT}"],
    "flame --chart": ["flame", "--chart", "{P}", "-o", "{OUT}"],
    "dump": ["dump", "{P}"],
}


def trace_of(rounds: int) -> Path:
    perf_data = call_heavy_recording(rounds)
    trace = perf_data.parent / "trace.fxt.gz"
    if not trace.exists():
        print(f"decoding {rounds:,} rounds (once; cached as {trace})", flush=True)
        tmp = trace.with_name("trace.tmp.fxt.gz")
        subprocess.run(
            [PY, "-m", "ptscope", "decode", str(perf_data.parent), "-o", str(tmp), "--jobs", "1"],
            check=True,
        )
        tmp.rename(trace)
    return trace


def measure(argv: list[str], stdout: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of one child."""
    with open(stdout, "w") as out:
        t0 = time.perf_counter()
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    err = child.stderr.read().decode() if child.stderr else ""
    if status:
        raise SystemExit(f"{' '.join(argv)} failed: {err}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def calls_in(trace: Path) -> int:
    import json

    out = subprocess.run(
        [PY, "-m", "ptscope", "stats", str(trace), "--json", "--top", "1"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(json.loads(out.stdout)["calls"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, nargs="+", default=[60_000, 300_000, 700_000])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--before-limit", type=int, default=13_000_000)
    ap.add_argument(
        "--dump-before-limit",
        type=int,
        default=3_000_000,
        help="the in-memory dump takes minutes and GBs: only on traces up to this many calls",
    )
    ap.add_argument("--what", nargs="+", default=list(AFTER), choices=list(AFTER))
    args = ap.parse_args()
    scratch = CACHE / "analysis-out"
    scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    for rounds in args.rounds:
        trace = trace_of(rounds)
        calls = calls_in(trace)
        size = trace.stat().st_size / 1e6
        print(f"\n{rounds:,} rounds: {calls:,} calls, {size:.0f} MB trace", flush=True)
        for what in args.what:
            out = scratch / "out"
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(args.repeat):
                runs = {
                    "after": [PY, "-m", "ptscope"]
                    + [a.format(P=trace, OUT=scratch / "x.svg") for a in AFTER[what]]
                }
                limit = args.dump_before_limit if what == "dump" else args.before_limit
                if calls <= limit:
                    target = out if what == "dump" else scratch / "y.svg"
                    code = BEFORE[what].format(P=repr(str(trace)), OUT=repr(str(target)))
                    runs["before"] = [PY, "-c", code]
                for name, argv in runs.items():
                    got = measure(argv, out if name == "after" else scratch / "before.out")
                    if name not in best or got[0] < best[name][0]:
                        best[name] = (got[0], got[1], max(got[2], best.get(name, got)[2]))
            line = f"  {what:14}"
            for name in ("before", "after"):
                if name in best:
                    w, c, m = best[name]
                    line += f"  {name}: {w:7.2f} s wall {c:7.2f} s CPU {m:7.0f} MB"
                else:
                    line += f"  {name}: {'(skipped: too big)':>38}"
            if "before" in best:
                line += f"   speed-up x{best['before'][0] / best['after'][0]:.1f}"
            print(line, flush=True)
            rows.append((rounds, calls, what, best))
    print("\nTargets: peak RSS <= 200 MB; stats and flame no slower; dump >= 10x faster.")


if __name__ == "__main__":
    main()
