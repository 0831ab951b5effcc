"""The shape of a subcommand, shared by every module in ``ptscope.cli``."""

from __future__ import annotations

import argparse
from typing import Protocol

__all__ = ["Command"]


class Command(Protocol):
    """A subcommand: its name, a one-line help, its arguments and what it does.

    ``run`` returns the exit code; user-facing failures are raised as
    :class:`ptscope.errors.PtscopeError` and turned into one line by :func:`ptscope.cli.main`.
    """

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...
