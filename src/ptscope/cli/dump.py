"""`ptscope dump` (work in progress)."""

from __future__ import annotations

import argparse

from ptscope.errors import PtscopeError


class DumpCommand:
    name = "dump"
    help = "(not implemented yet)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise PtscopeError("dump is not implemented yet")
