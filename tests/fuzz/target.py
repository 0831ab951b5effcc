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

import ast
import contextlib
import hashlib
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis.strategies import SearchStrategy

CORPUS = Path(__file__).resolve().parent / "corpus"
"""``corpus/<target>/``: the inputs that made a campaign find a bug, one per file."""


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
    """A pytest test function that runs ``target`` on its corpus (the inputs campaigns
    found bugs with), then on ``examples`` generated inputs."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(target.inputs)
    def run(value: Any) -> None:
        target.check(value)

    for value in reversed(load_corpus(target.name)):  # @example: the last one runs first
        run = example(value)(run)
    return run


def save_to_corpus(target: str, value: Any, kind: str) -> Path:
    """Keep ``value`` (an input that found a bug: ``kind`` ``crash`` or ``hang``) under
    ``corpus/<target>/``, as a Python literal when it is one (readable, diffable), else
    pickled. The name is the content's hash: the same input is kept once."""
    try:
        text = repr(value)
        literal = ast.literal_eval(text) == value
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        text, literal = "", False
    data = text.encode() if literal else pickle.dumps(value)
    suffix = "txt" if literal else "pickle"
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}-{hashlib.sha256(data).hexdigest()[:16]}.{suffix}"
    path.write_bytes(data)
    return path


def load_corpus(target: str) -> list[Any]:
    """The inputs kept under ``corpus/<target>/``, in name order."""
    folder = CORPUS / target
    values: list[Any] = []
    for path in sorted(folder.glob("*")) if folder.is_dir() else ():
        if path.suffix == ".txt":
            values.append(ast.literal_eval(path.read_text()))
        elif path.suffix == ".pickle":
            values.append(pickle.loads(path.read_bytes()))  # our own files (save_to_corpus)
    return values


@contextlib.contextmanager
def changed_environment(**changes: str | None) -> Iterator[None]:
    """``os.environ`` with ``changes`` (None: removed) for as long as the ``with`` lasts."""
    saved = {key: os.environ.get(key) for key in changes}

    def put(values: dict[str, str | None]) -> None:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    put(changes)
    try:
        yield
    finally:
        put(saved)
