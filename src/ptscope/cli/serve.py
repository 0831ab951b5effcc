"""``ptscope serve TRACE``: open a trace in the Perfetto UI with one command (and the
``--serve`` option of ``run``, ``attach`` and ``decode``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ptscope.cli.base import reading_trace

__all__ = ["ServeCommand", "add_serve_option", "serve_in_perfetto"]


def add_serve_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serve",
        action="store_true",
        help="then serve the trace to the Perfetto UI (as `ptscope serve`)",
    )


def serve_in_perfetto(path: Path, *, port: int | None = None, browser: bool = True) -> int:
    """Check that ``path`` is a trace, serve it until the UI has fetched it."""
    from ptscope.fxt.reader import check_trace_start
    from ptscope.serve import PERFETTO_PORT, serve_trace

    with reading_trace(path):
        check_trace_start(path)

    def ready(url: str) -> None:
        print(
            f"serving {path} until the Perfetto UI has fetched it (Ctrl-C to stop)",
            file=sys.stderr,
        )
        print(f"open in Perfetto: {url}", file=sys.stderr, flush=True)

    serve_trace(
        path, port=PERFETTO_PORT if port is None else port, open_browser=browser, on_ready=ready
    )
    print("the trace was fetched; done", file=sys.stderr)
    return 0


class ServeCommand:
    name = "serve"
    help = "open a trace in the Perfetto UI: serve it once on 127.0.0.1:9001 and print the link"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("trace", metavar="TRACE", type=Path, help="a .fxt or .fxt.gz trace")
        parser.add_argument(
            "--port",
            type=int,
            default=None,
            help="listen on this port instead of 9001, the only one ui.perfetto.dev's "
            "content-security policy lets it fetch from (0: any free port)",
        )
        parser.add_argument(
            "--no-browser", action="store_true", help="only print the link, open no browser"
        )

    def run(self, args: argparse.Namespace) -> int:
        if args.port is not None and not 0 <= args.port < 65536:
            from ptscope.errors import UsageError

            raise UsageError(f"--port {args.port}: not a TCP port")
        return serve_in_perfetto(args.trace, port=args.port, browser=not args.no_browser)
