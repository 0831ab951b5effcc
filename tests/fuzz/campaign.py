"""A fuzz campaign over the parsers: ``make fuzz-parsers N=100000``.

Usage: ``python tests/fuzz/campaign.py -n 100000 [--target NAME ...]
[--timeout-per-input S] [--seed S] [--progress K]``.

Every ``TARGET`` of ``tests/fuzz/test_fuzz_*.py`` (see ``target.py``) runs on N generated
inputs (hypothesis, ``max_examples=N``, no example database, no shrinking). A failure
does not stop the campaign: it is counted, and its input is saved under
``tests/fuzz/corpus/<target>/`` for the quick tests to replay (the first of each kind
of failure, told apart by exception type and where it was raised). Each input gets
a time limit; one that runs past it is counted as a hang (and saved). Prints, per target,
the inputs tried, internal errors and hangs, and the distinct failures; exits 1 if there
was any.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))  # as pytest's pythonpath: `fuzz.*`, `support.*`

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from fuzz.target import FuzzTarget, save_to_corpus  # noqa: E402

KEEP_PER_FAILURE = 1
"""Inputs saved to the corpus per distinct failure (exception type and place)."""


class Hang(BaseException):
    """An input ran past its time limit. A BaseException, so that no ``except Exception``
    in the code under test takes it for an error of its own."""


@dataclass
class _Alarm:
    fired: bool = False


@contextmanager
def time_limit(seconds: float) -> Iterator[_Alarm]:
    """Raise :class:`Hang` in the code under test once ``seconds`` have passed, and again
    every second after (a Hang raised where Python ignores exceptions, in a garbage
    collector callback say, is lost). ``fired`` says whether the time ran out, whatever
    became of the exception."""
    alarm = _Alarm()

    def expired(signum: int, frame: FrameType | None) -> None:
        alarm.fired = True
        raise Hang

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
    try:
        yield alarm
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def discover() -> dict[str, FuzzTarget]:
    """Every ``TARGET`` in ``tests/fuzz/test_fuzz_*.py``, by name."""
    targets: dict[str, FuzzTarget] = {}
    for path in sorted((TESTS / "fuzz").glob("test_fuzz_*.py")):
        module = importlib.import_module(f"fuzz.{path.stem}")
        found = getattr(module, "TARGET", None)
        if isinstance(found, FuzzTarget):
            if found.name in targets:
                raise SystemExit(f"two fuzz targets are named {found.name!r}")
            targets[found.name] = found
    return targets


@dataclass
class Outcome:
    name: str
    tried: int = 0
    errors: int = 0
    hangs: int = 0
    seconds: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    """Each distinct failure (a short description) and how often it happened."""
    examples: dict[str, str] = field(default_factory=dict)
    """The first traceback (its last lines) of each failure."""
    saved: list[Path] = field(default_factory=list)


def _signature(error: BaseException) -> str:
    """What tells one bug from another: the exception type and the innermost frame of
    ptscope (or of the test) it was raised in."""
    frames = traceback.extract_tb(error.__traceback__)
    ours = [f for f in frames if "/ptscope/" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(error).__name__} at {where}"


def run_target(
    target: FuzzTarget, examples: int, timeout: float, seed_value: int, every: int = 0
) -> Outcome:
    """``every``: print a progress line (inputs, errors, hangs so far) every so many
    inputs (0: none), so that a campaign stopped early still says how far it went."""
    outcome = Outcome(target.name)
    started = time.monotonic()

    def record(kind: str, value: Any, error: BaseException) -> None:
        signature = "hang" if kind == "hang" else _signature(error)
        outcome.failures[signature] += 1
        if signature not in outcome.examples:
            lines = traceback.format_exception(error)
            outcome.examples[signature] = "".join(lines[-6:]).rstrip()
        if outcome.failures[signature] <= KEEP_PER_FAILURE:
            outcome.saved.append(save_to_corpus(target.name, value, kind))

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(target.inputs)
    def run(value: Any) -> None:
        outcome.tried += 1
        if every and outcome.tried % every == 0:
            print(
                f"  {target.name}: {outcome.tried:,} inputs, {outcome.errors:,} internal "
                f"errors, {outcome.hangs:,} hangs, {time.monotonic() - started:.0f} s",
                flush=True,
            )
        alarm = _Alarm()
        error: BaseException | None = None
        try:
            with time_limit(timeout) as alarm:
                target.check(value)
        except (Hang, Exception) as e:  # a bug (or the check's AssertionError): counted
            error = e
        if alarm.fired:  # whatever became of the time limit's exception
            outcome.hangs += 1
            record("hang", value, error or Hang())
        elif error is not None:
            outcome.errors += 1
            record("crash", value, error)

    run()
    outcome.seconds = time.monotonic() - started
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=100_000, help="inputs per target")
    parser.add_argument(
        "--target", action="append", metavar="NAME", help="only this target (repeatable)"
    )
    parser.add_argument(
        "--timeout-per-input", type=float, default=10.0, metavar="S", help="default 10 s"
    )
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    parser.add_argument(
        "--progress",
        type=int,
        default=10_000,
        metavar="K",
        help="a progress line every K inputs (default 10,000; 0: none)",
    )
    args = parser.parse_args(argv)
    targets = discover()
    chosen = args.target or list(targets)
    unknown = [name for name in chosen if name not in targets]
    if unknown:
        parser.error(f"no target {', '.join(unknown)} (there are: {', '.join(targets)})")
    outcomes = []
    for name in chosen:
        print(f"== {name}: {args.n:,} inputs", flush=True)
        outcome = run_target(
            targets[name], args.n, args.timeout_per_input, args.seed, args.progress
        )
        outcomes.append(outcome)
        for signature, count in outcome.failures.most_common():
            print(f"  {count:,} x {signature}")
            print("    " + outcome.examples.get(signature, "").replace("\n", "\n    "))
        for path in outcome.saved:
            print(f"  saved {path.relative_to(TESTS.parent)}")
    print(f"\n{'target':<20} {'inputs':>10} {'internal errors':>16} {'hangs':>6} {'seconds':>8}")
    for o in outcomes:
        print(f"{o.name:<20} {o.tried:>10,} {o.errors:>16,} {o.hangs:>6,} {o.seconds:>8.0f}")
    return 1 if any(o.errors or o.hangs for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
