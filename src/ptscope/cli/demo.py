"""`ptscope demo` (work in progress)."""

from __future__ import annotations

import argparse

from ptscope.errors import PtscopeError


class DemoCommand:
    name = "demo"
    help = "(not implemented yet)"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace) -> int:
        raise PtscopeError("demo is not implemented yet")
