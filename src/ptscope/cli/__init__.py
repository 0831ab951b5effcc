"""Command-line entry point: builds the parser from the subcommand modules, maps errors to
one line and an exit code. Only this package and :mod:`ptscope.pipeline` know every stage.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Final, NoReturn

from ptscope import __version__
from ptscope.cli.base import Command, malloc_restored
from ptscope.errors import PtscopeError, Terminated

__all__ = ["main"]

# numpy's OpenBLAS starts a thread per core that spins after each call; ptscope does no
# linear algebra, and on a decode those threads took CPU from perf (set before numpy loads).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

log = logging.getLogger("ptscope")


_COMMANDS: Final = (
    ("decode", "DecodeCommand"),
    ("dump", "DumpCommand"),
    ("demo", "DemoCommand"),
    ("run", "RunCommand"),
    ("attach", "AttachCommand"),
    ("doctor", "DoctorCommand"),
    ("serve", "ServeCommand"),
    ("stats", "StatsCommand"),
    ("diff", "DiffCommand"),
    ("flame", "FlameCommand"),
    ("archive", "ArchiveCommand"),
    ("insns", "InsnsCommand"),
)
"""Each subcommand's name, which is also its module's in this package, and its class, in
``--help``'s order."""


def _commands(only: str | None = None) -> list[Command]:
    """The subcommands, or only the one named ``only`` when there is one of that name.

    Imported here, not at the top, so that a broken optional module cannot stop the others
    from working; and only the one a command line names, when it names one: importing
    every command's module (the recorders', the server's...) and building its parser cost
    a ``ptscope decode`` a third of the time before perf could start."""
    chosen = [c for c in _COMMANDS if c[0] == only] or _COMMANDS
    return [getattr(importlib.import_module(f"ptscope.cli.{name}"), cls)() for name, cls in chosen]


def _command_named(argv: Sequence[str]) -> str | None:
    """The subcommand a command line names: its first word that is not an option (the
    top-level options take no value). None when there is none, as with ``--help``."""
    return next((a for a in argv if not a.startswith("-")), None)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and a pointer to --help), like every error."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ptscope",
        description="Every function call a native program made, on a zoomable timeline.",
    )
    parser.add_argument("--version", action="version", version=f"ptscope {__version__}")
    # -v is accepted before the command too (`ptscope -v decode ...`); its own dest, since a
    # subcommand's defaults would overwrite a shared one.
    parser.add_argument(
        "-v", "--verbose", dest="verbose_global", action="count", default=0, help=argparse.SUPPRESS
    )
    common = _Parser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="count", default=0, help="more detail (repeat for debug)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in commands:
        p = sub.add_parser(
            command.name, help=command.help, description=command.help, parents=[common]
        )
        command.add_arguments(p)
        p.set_defaults(_command=command)
    return parser


def _setup_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="ptscope: %(message)s", stream=sys.stderr)


_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _terminate(signum: int, frame: FrameType | None) -> None:
    # Once: the way out (stopping perf, removing temporary files) must not be cut short
    # by a second signal. SIGKILL still stops everything (children die with ptscope).
    for sig in _TERMINATING:
        if signal.getsignal(sig) is _terminate:
            signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    """SIGTERM and SIGHUP unwind ptscope as Ctrl-C does (:class:`Terminated`), so that
    children are stopped, temporary files removed and the recording kept (a recorder
    replaces these handlers while the program runs: then they stop the program)."""
    try:
        # A signal that is ignored (nohup) stays ignored.
        old = {
            sig: signal.signal(sig, _terminate)
            for sig in _TERMINATING
            if signal.getsignal(sig) is not signal.SIG_IGN
        }
    except ValueError:  # not the main thread (ptscope called as a library)
        yield
        return
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None, *, leaving: bool = False) -> int:
    """Run the CLI; returns the process exit code. ``leaving``: the process ends with the
    command (the ``ptscope`` command, :func:`run`), so the allocator's and the garbage
    collector's settings that a command changes are not restored after it
    (:func:`~ptscope.cli.base.malloc_restored`: 7 ms after a decode of 2.5 M calls, most
    of it giving the heap back, which the process's end does at no cost)."""
    given = sys.argv[1:] if argv is None else argv
    parser = _build_parser(_commands(_command_named(given)))
    verbose = sum(a in ("-v", "--verbose") or a.startswith("-vv") for a in given)  # a guess
    try:
        # Inside the try: an option's parser that fails in an unforeseen way is a bug
        # reported in one line too (usage errors leave through SystemExit(2)).
        args = parser.parse_args(argv)
        verbose = getattr(args, "verbose", 0) + getattr(args, "verbose_global", 0)
        _setup_logging(verbose)
        command: Command = args._command
        with _terminable(), contextlib.nullcontext() if leaving else malloc_restored():
            return command.run(args)
    except Terminated as e:
        print(f"ptscope: stopped by {signal.Signals(e.signum).name}", file=sys.stderr)
        return 128 + e.signum
    except PtscopeError as e:
        print(f"ptscope: error: {e.message}", file=sys.stderr)
        if e.hint:
            print(f"ptscope: {e.hint}", file=sys.stderr)
        if verbose and e.details:
            print(e.details.rstrip(), file=sys.stderr)
        elif e.details:
            print("ptscope: (run with -v for details)", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("ptscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:  # a bug: say so in one line, show the traceback with -v
        print(f"ptscope: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        if verbose:
            traceback.print_exc()
        else:
            print("ptscope: (run with -v for the traceback)", file=sys.stderr)
        return 70


def run() -> NoReturn:
    """The ``ptscope`` command: :func:`main`, then leave at once.

    Tearing the interpreter down (freeing every module, array and object one by one)
    costs 0.06 to 0.1 s, a tenth of a small decode and most of a drill-down's wait, and
    nothing ptscope keeps needs it: every file is closed where it is written. So once the
    output is flushed and the exit handlers have run (logging's), the process ends with
    ``os._exit``. Not when another thread is still alive, or the output cannot be
    flushed (a closed pipe): then Python exits as usual.
    """
    code = main(leaving=True)
    if threading.active_count() == 1:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        else:
            atexit._run_exitfuncs()
            os._exit(code)
    sys.exit(code)
