"""The shape of a subcommand, shared by every module in ``ptscope.cli``."""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, Protocol

from ptscope.errors import BadInputError, UsageError

__all__ = [
    "Command",
    "add_decoder_arguments",
    "add_recording_argument",
    "byte_size",
    "check_input",
    "check_output",
    "duration_ns",
    "int_at_least",
    "int_between",
    "non_negative_int",
    "parse_id_list",
    "positive_int",
    "reading_trace",
]


class Command(Protocol):
    """A subcommand: its name, a one-line help, its arguments and what it does.

    ``run`` returns the exit code; user-facing failures are raised as
    :class:`ptscope.errors.PtscopeError` and turned into one line by :func:`ptscope.cli.main`.
    """

    name: str
    help: str

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def int_between(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """argparse type: a whole number from ``minimum`` to ``maximum`` (no limit: None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}")
        return value

    return parse


def int_at_least(minimum: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``minimum``."""
    return int_between(minimum)


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)
MAX_JOBS = 256
"""The most decode windows run at once (each a perf process)."""


def add_recording_argument(parser: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The RECORDING positional of `decode` and `insns`."""
    parser.add_argument(
        "recording",
        metavar="RECORDING",
        nargs="?" if optional else None,
        type=Path,
        help="a recording directory (from run/attach --keep-recording), a perf.data, "
        "or an archive from `ptscope archive`",
    )


def add_decoder_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The "decoding" group shared by `decode`, `run` and `attach`: --decoder, --jobs."""
    group = parser.add_argument_group("decoding")
    group.add_argument(
        "--decoder",
        choices=("auto", "native", "dlfilter", "text"),
        default="auto",
        help="auto: ptscope's own Intel PT decoder, or perf for a recording it does not "
        "take (one line says why): the C dlfilter when perf supports it (>= 5.14), else "
        "perf script text",
    )
    group.add_argument(
        "-j",
        "--jobs",
        type=int_between(1, MAX_JOBS),
        default=None,
        metavar="N",
        help="decode N time windows in parallel (default: one per free core beyond the "
        "first, none below three free cores or for a perf.data under 32 MiB, at most 6, "
        f"at most one per 8 MiB of perf.data; at most {MAX_JOBS})",
    )
    group.add_argument(
        "--time-axis",
        choices=("time", "instructions", "cycles"),
        default="time",
        help="what slice lengths measure: perf time (default), or each thread's executed "
        "instructions or cycles (from the trace's counts)",
    )
    group.add_argument(
        "--no-insn-detail",
        dest="insn_detail",
        action="store_false",
        help="skip the basic-block cache: instruction counts are perf's (approximate) and "
        "slices have no icache_lines (a faster decode)",
    )
    group.add_argument(
        "--no-inline",
        dest="inline",
        action="store_false",
        help="no slices for inlined functions (by default each inlined call, read from the "
        "binaries' DWARF, is a slice of its own, flagged `inlined`)",
    )
    group.add_argument(
        "--no-drill",
        dest="drill",
        action="store_false",
        help="no `drill` arg on the slices (each call's `ptscope insns` command): a trace "
        "about two thirds the size, written with less CPU",
    )
    split = group.add_mutually_exclusive_group()
    split.add_argument(
        "--split-size",
        type=byte_size,
        metavar="SIZE",
        help="write OUT-000.fxt.gz, OUT-001.fxt.gz... of about SIZE each (e.g. 500M)",
    )
    split.add_argument(
        "--split-time",
        type=duration_ns,
        metavar="DURATION",
        help="write one part per DURATION of trace time (e.g. 10ms, 2s)",
    )
    return group


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TIME_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
MAX_INT64 = (1 << 63) - 1
"""The largest size or duration an option takes (bytes or ns: 8 EiB, 292 years)."""


def _bounded(text: str, value: float, what: str) -> int:
    """``value`` as a whole number of bytes or ns, from 1 to :data:`MAX_INT64`."""
    if math.isnan(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a {what} must be positive")
    if value > MAX_INT64:
        raise argparse.ArgumentTypeError(f"{text!r}: too large a {what}")
    return int(value)


def byte_size(text: str) -> int:
    """``500M`` → bytes (K, M, G, T are powers of 1024; a trailing B or iB is allowed)."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    number = t.rstrip("kmgt")
    unit = t[len(number) :]
    try:
        value = float(number) * _SIZE_UNITS[unit]
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 500M, 2G)") from None
    return _bounded(text, value, "size")


def duration_ns(text: str) -> int:
    """``10ms`` → nanoseconds (ns, us, ms, s)."""
    t = text.strip().lower()
    for unit in sorted(_TIME_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            number = t[: -len(unit)]
            break
    else:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 10ms, 2s)")
    try:
        value = float(number) * _TIME_UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 10ms, 2s)") from None
    return _bounded(text, value, "duration")


def check_output(output: Path, option: str = "-o") -> Path:
    """Refuse, before any work, an output that cannot be written: its directory missing or
    read-only, a directory, no name. A device or a pipe is written in place (a pipe waits
    for its reader, as pipes do)."""
    if not output.name or output.name in (".", ".."):
        raise UsageError(f"{option} {str(output)!r}: give a file name")
    parent = output.parent if str(output.parent) else Path(".")
    try:
        if not parent.is_dir():
            raise UsageError(f"{option} {output}: directory {parent} does not exist")
        try:
            mode = os.stat(output).st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None and stat.S_ISDIR(mode):
            raise UsageError(f"{option} {output} is a directory")
        if not os.access(parent, os.W_OK) or (mode is not None and not os.access(output, os.W_OK)):
            raise UsageError(f"{option} {output}: cannot write in {parent}")
    except OSError as e:  # a name too long, a loop of links...
        raise UsageError(f"{option} {output}: {e.strerror or e}") from e
    return output


TRACE_SUFFIXES: Final = (".fxt.gz", ".fxt")


def check_trace_suffix(output: Path) -> Path:
    """Refuse a trace name whose suffix promises another format: ptscope writes only
    Fuchsia traces, so ``-o trace.pftrace`` (Perfetto's protobuf) or ``-o trace.json``
    would be an FXT file under a misleading name. An output that exists and is no regular
    file (``/dev/null``, a FIFO, a device) names no file: any name is taken (the trace is
    written uncompressed unless it ends in ``.gz``)."""
    if not output.name or output.name in (".", ".."):
        raise UsageError(f"-o {str(output)!r}: give a file name (e.g. -o trace.fxt.gz)")
    if output.name.endswith(TRACE_SUFFIXES):
        return output
    with contextlib.suppress(OSError):
        mode = os.stat(output).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return output
    better = output.with_name(output.name.partition(".")[0] + ".fxt.gz")
    raise UsageError(
        f"-o {output}: ptscope writes only Fuchsia traces, named .fxt.gz (or .fxt uncompressed)",
        hint=f"-o {better} (Perfetto opens it)",
    )


def check_trace_output(output: Path) -> Path:
    """:func:`check_output` for a trace: also its suffix (:func:`check_trace_suffix`)."""
    return check_output(check_trace_suffix(output))


MAX_ID = (1 << 31) - 1
"""The largest process or thread ID (Linux's pid_t; perf's filters take no more)."""


def parse_id_list(text: str, what: str) -> tuple[int, ...]:
    """``1,2,3`` → (1, 2, 3), or a one-line usage error."""
    try:
        ids = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UsageError(
            f"{what} must be a comma-separated list of numbers, not {text!r}"
        ) from None
    if not ids:
        raise UsageError(f"{what} {text!r}: give at least one number")
    for n in ids:
        if not 0 <= n <= MAX_ID:
            raise UsageError(f"{what}: {n} is not a process or thread ID (0 to {MAX_ID})")
    return ids


def check_input(path: Path) -> Path:
    """Refuse, in one line, an input that is neither a regular file nor a directory: a
    fifo would block the command until something writes to it, a device never ends.
    (A missing one is left to the command, which says so in its own words.)"""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as e:  # a name too long, a loop of links, no permission...
        raise BadInputError(f"cannot read {path}: {e.strerror or e}") from e
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise BadInputError(f"{path} is not a regular file (a device, a pipe or a socket)")
    return path


@contextlib.contextmanager
def reading_trace(path: Path) -> Iterator[None]:
    """Turn every way reading a trace can fail into one line (a BadInputError)."""
    from ptscope.fxt.reader import FxtFormatError

    check_input(path)
    try:
        yield
    except FileNotFoundError as e:
        raise BadInputError(f"no such file: {path}") from e
    except IsADirectoryError as e:
        raise BadInputError(f"{path} is a directory, not a trace") from e
    except OSError as e:
        raise BadInputError(f"cannot read {path}: {e.strerror or e}") from e
    except FxtFormatError as e:
        raise BadInputError(
            f"cannot read {path}: {e} (ptscope reads the .fxt/.fxt.gz traces it writes)"
        ) from e


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_KEEP_FREED_BYTES = 256 << 20
_GLIBC_DEFAULTS = ((_M_MMAP_THRESHOLD, 128 << 10), (_M_TRIM_THRESHOLD, 128 << 10), (_M_TOP_PAD, 0))
_malloc_tuned = False
_gc_frozen: tuple[int, ...] | None = None  # the thresholds before


def _libc() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


def reuse_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for the next allocation (up to 256 MiB), until
    the command ends (:func:`malloc_restored`): the analyses allocate and free arrays of
    many MB per block, and by default each one is a fresh ``mmap`` whose pages fault in
    again (a third of `diff`'s CPU was the kernel's). Peak RSS does not change; elsewhere
    than glibc this does nothing."""
    global _malloc_tuned
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _KEEP_FREED_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, 2 * _KEEP_FREED_BYTES)
    libc.mallopt(_M_TOP_PAD, 64 << 20)
    _malloc_tuned = True


def settle_for_streaming() -> None:
    """Before a long decode: freed memory reused (:func:`reuse_freed_memory`; fresh pages
    for every batch's arrays were a tenth of a decode's CPU), and what the start-up
    imported moved out of the garbage collector's sight (``gc.freeze``) and the youngest
    generation collected less often: the streaming stages allocate many short-lived
    objects, and each collection used to walk every module's objects again. Undone by
    :func:`malloc_restored`."""
    global _gc_frozen
    reuse_freed_memory()
    gc.freeze()  # (without a collection first: one over every module's objects costs more)
    _gc_frozen = gc.get_threshold()
    # Collections of the youngest objects a hundred times rarer: each batch makes a few
    # hundred short-lived objects, none in a reference cycle that outlives it.
    gc.set_threshold(70_000, *_gc_frozen[1:])


@contextlib.contextmanager
def malloc_restored() -> Iterator[None]:
    """Around a command: glibc's defaults again after it, and what the heap holds given
    back (a process that runs many commands, a test session, must not keep growing a heap
    that no longer returns big blocks to the system)."""
    global _malloc_tuned, _gc_frozen
    try:
        yield
    finally:
        if _gc_frozen:
            gc.set_threshold(*_gc_frozen)
            _gc_frozen = None
            gc.unfreeze()
        if _malloc_tuned:
            _malloc_tuned = False
            libc = _libc()
            if libc is not None:
                for option, value in _GLIBC_DEFAULTS:
                    libc.mallopt(option, value)
                if hasattr(libc, "malloc_trim"):
                    libc.malloc_trim(0)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held while the block runs, then delivered (the first of
    them): for importing the pipeline, which a decode now does while its perf already runs
    (``decode/perf_launch.py``). An exception raised inside a C extension's import (numpy's
    ``PyCapsule_Import``) becomes an ImportError, and the command an internal error,
    instead of stopping as the signal asks."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    held = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        if handler not in (signal.SIG_IGN, None):
            held[sig] = handler
            signal.signal(sig, lambda signum, _frame: received.append(signum))
    try:
        yield
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)
        if received:
            signal.raise_signal(received[0])
