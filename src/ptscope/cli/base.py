"""The shape of a subcommand, shared by every module in ``ptscope.cli``."""

from __future__ import annotations

import argparse
from typing import Protocol

__all__ = ["Command", "add_decoder_arguments", "positive_int"]


class Command(Protocol):
    """A subcommand: its name, a one-line help, its arguments and what it does.

    ``run`` returns the exit code; user-facing failures are raised as
    :class:`ptscope.errors.PtscopeError` and turned into one line by :func:`ptscope.cli.main`.
    """

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def add_decoder_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "decoding" group shared by `decode`, `run` and `attach`: --decoder, --jobs."""
    group = parser.add_argument_group("decoding")
    group.add_argument(
        "--decoder",
        choices=("auto", "dlfilter", "text"),
        default="auto",
        help="auto: the C dlfilter when perf supports it (>= 5.14), else perf script text",
    )
    group.add_argument(
        "-j",
        "--jobs",
        type=positive_int,
        default=None,
        metavar="N",
        help="decode N time windows in parallel (default: number of cores)",
    )
    return group
