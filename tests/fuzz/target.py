"""What a parser fuzz target is: shared by the quick property tests in ``make test``
(``tests/fuzz/test_fuzz_*.py``) and the campaigns of ``make fuzz-parsers N=100000``
(``tests/fuzz/campaign.py``).

Each ``tests/fuzz/test_fuzz_<parser>.py`` defines one module-level ``TARGET`` and a quick
test that runs it (see :func:`quick`). A target feeds one generated input to the real
parser, the way a user's data reaches it, and raises only on a bug: an exception that is
not the clean, one-line error the parser is meant to give (``ptscope.errors.PtscopeError``
and the parser's own documented error types), an internal error of the command line (a
traceback, exit code 70/1 with "internal error"), or a hang (the campaign puts a time
limit on every input). Inputs that reproduce a crash found by a campaign are kept under
``tests/fuzz/corpus/<parser>/`` and replayed by the quick tests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy


@dataclass(frozen=True)
class FuzzTarget:
    name: str
    """The parser, as the campaign reports it: ``perf-text``, ``dlfilter-stream``,
    ``fxt``, ``metadata``, ``cli``."""
    inputs: SearchStrategy[Any]
    """Valid inputs mutated, truncated, with numbers at and past every range limit."""
    check: Callable[[Any], None]
    """Feeds one input to the parser; raises AssertionError (or lets a bug's exception
    through) only when the parser misbehaved."""


QUICK_EXAMPLES = 300
"""Inputs per target in ``make test`` (a few thousand in all, a few seconds each)."""


def quick(target: FuzzTarget, examples: int = QUICK_EXAMPLES) -> Callable[[], None]:
    """A pytest test function that runs ``target`` on ``examples`` generated inputs."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(target.inputs)
    def run(value: Any) -> None:
        target.check(value)

    return run
