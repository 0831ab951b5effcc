"""Fuzz call-stack reconstruction: generated programs, every oracle, every optimisation level.

    python tests/fidelity/fuzz.py -n 500              # seeds 0..499 (make fuzz N=500)
    python tests/fidelity/fuzz.py --seeds 17,42 -v    # these seeds, with every difference
    python tests/fidelity/fuzz.py --minimize 42 --opt -O2 --oracle qemu

Prints ``K/N programs identical`` and the seed, level and oracle of every failure. A program
is identical when every oracle (instrumented build, QEMU's instruction trace, uftrace) gives
the same call tree as ptscope's trace (C engine) and as the Python reference engine, at -O0,
-O1 and -O2. ``--minimize`` shrinks a failing program (removing functions and statements
while the same oracle still disagrees) and prints its source: put it in tests/programs/ and
it becomes a corpus test.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import fidelity, progen


def _quiet_worker() -> None:
    # The generated programs print a checksum; keep the report readable.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _check(args: tuple[int, tuple[str, ...], tuple[str, ...]]) -> list[fidelity.Outcome]:
    seed, opts, oracle_names = args
    return fidelity.check_program(progen.generate(seed), opts, oracle_names)


def run(
    seeds: list[int], opts: tuple[str, ...], oracle_names: tuple[str, ...], jobs: int, verbose: bool
) -> int:
    started = time.perf_counter()
    failures: dict[int, list[fidelity.Outcome]] = {}
    comparisons = 0
    skipped: list[str] = []
    work = [(seed, opts, oracle_names) for seed in seeds]
    with multiprocessing.get_context("fork").Pool(jobs, initializer=_quiet_worker) as pool:
        for done, outcomes in enumerate(pool.imap(_check, work), start=1):
            comparisons += len(outcomes)
            skipped += [f"{o.oracle}: {o.skipped.split(',')[0]}" for o in outcomes if o.skipped]
            bad = [o for o in outcomes if not o.ok]
            if bad:
                failures[outcomes[0].seed] = bad
                print(
                    f"FAIL seed {outcomes[0].seed}: "
                    + ", ".join(sorted({f"{o.opt} {o.oracle}/{o.engine}" for o in bad})),
                    flush=True,
                )
                # The first difference always (a rare failure must be diagnosable), all
                # of them with -v.
                for o in bad if verbose else bad[:1]:
                    print(f"  {o}", flush=True)
            elif verbose:
                print(f"ok   seed {outcomes[0].seed}", flush=True)
            if done % 25 == 0:
                print(
                    f"  ... {done}/{len(seeds)} programs, {len(failures)} failing, "
                    f"{time.perf_counter() - started:.0f} s",
                    flush=True,
                )
    seconds = time.perf_counter() - started
    if skipped:
        print(f"{len(skipped)} comparisons not judged by an oracle that cannot see them:")
        for reason, count in Counter(skipped).most_common():
            print(f"  {count:5d}  {reason}")
    identical = len(seeds) - len(failures)
    print(
        f"{identical}/{len(seeds)} programs identical "
        f"({comparisons} comparisons: {len(opts)} levels x {len(oracle_names)} oracles x "
        f"2 engines; {seconds:.0f} s, {jobs} jobs)"
    )
    if failures:
        print("failing seeds: " + " ".join(str(s) for s in sorted(failures)))
    return 1 if failures else 0


def minimize(seed: int, opt: str, oracle: str) -> int:
    """Shrink the program of ``seed`` while ``oracle`` still disagrees at ``opt``."""

    def fails(p: progen.Program) -> bool:
        # The same failure: this oracle disagrees with an engine. A program that no longer
        # builds or runs (an Outcome without an engine) is no reduction.
        with contextlib.redirect_stdout(sys.stderr):
            try:
                outcomes = fidelity.check_program(p, (opt,), (oracle,))
            except Exception:
                return False
        return any(not o.ok and o.engine != "-" for o in outcomes)

    program = progen.generate(seed)
    if not fails(program):
        print(f"seed {seed} passes {oracle} at {opt}: nothing to minimise")
        return 1
    progress = True
    while progress:
        progress = False
        for candidate in program.smaller():
            if fails(candidate):
                program = candidate
                progress = True
                print(f"  size {program.size()}", file=sys.stderr)
                break
    print(program.source(inline=oracle != "cyg"))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("-n", type=int, default=50, help="seeds 0..N-1 (default 50)")
    ap.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--seeds", help="comma-separated seeds instead of -n")
    ap.add_argument("--opt", action="append", help="-O0/-O1/-O2 (default: all three)")
    ap.add_argument(
        "--oracle", action="append", choices=fidelity.ORACLES, help="oracles to use (default: all)"
    )
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--minimize", type=int, metavar="SEED")
    args = ap.parse_args()
    missing = fidelity.tools_missing()
    if missing:
        print(f"fuzz: {missing}", file=sys.stderr)
        return 2
    opts = tuple(args.opt or fidelity.OPTS)
    oracle_names = tuple(args.oracle or fidelity.ORACLES)
    if args.minimize is not None:
        return minimize(args.minimize, opts[0], oracle_names[0])
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
    else:
        seeds = list(range(args.first, args.first + args.n))
    return run(seeds, opts, oracle_names, args.jobs, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
