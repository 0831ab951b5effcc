"""Running ``perf script`` for the text decoder: its argv, and its output as a stream of lines.

Two argvs: :func:`branch_script_argv` (Intel PT branches, errors and power events) and
:func:`sampling_script_argv` (call-stack samples). :func:`stream_perf_script` runs one and
yields its stdout in batches of lines while perf is still decoding (never the whole output
in memory), and turns perf's failures into one-line :class:`~ptscope.errors.PtscopeError`s.
:func:`read_text_lines` yields the same batches from a saved text file or stdin (``-``).
:func:`decode_perf_data_text` and :func:`decode_text_file` put these together with the
parser of :mod:`ptscope.decode.perf_text`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

from ptscope.children import die_with_parent
from ptscope.decode.blocks import CodeMap, InstructionDetail
from ptscope.decode.inline_runs import recording_runs
from ptscope.decode.perf_text import PerfTextParser, TextStats, parse_text
from ptscope.errors import BadInputError, PtscopeError, ToolMissingError
from ptscope.model import Event, InlineNodes
from ptscope.perftool import STALL_ENV, PerfTool, PerfWatch, find_perf, perf_env, stall_limit

__all__ = [
    "BRANCH_FIELDS",
    "BRANCH_ITRACE",
    "SAMPLING_FIELDS",
    "TimeWindow",
    "binary_resolver",
    "branch_script_argv",
    "decode_perf_data_text",
    "decode_text_file",
    "format_time",
    "perf_failure",
    "perf_stalled",
    "read_text_lines",
    "sampling_script_argv",
    "stream_perf_script",
]

BRANCH_FIELDS: Final = "pid,tid,time,flags,ip,addr,sym,symoff,synth,dso,event,period"
"""``-F`` for branch traces: what the text parser's fast path expects. ``synth`` makes perf
print the payload of synthesized events (the ``cbr: N freq: M MHz`` of power events)."""
SAMPLING_FIELDS: Final = "pid,tid,time,ip,sym,symoff,dso,event,period"
"""``-F`` for call-stack samples (perf prints the callchain under each sample)."""
BRANCH_ITRACE: Final = "bep"
"""Synthesize branches, errors and power events (cbr, psb)."""
CHUNK_SIZE: Final = 1 << 20
_STDERR_KEEP: Final = 16_384  # bytes of perf's stderr kept for error details
_MAX_LINE: Final = 1 << 24

TimeWindow = tuple[int | None, int | None]
"""A (start, end) pair of perf times in ns; ``None`` leaves that side open."""


# --------------------------------------------------------------------------- argv


def format_time(ns: int) -> str:
    """perf's ``SEC.NSEC`` spelling of a time in ns (what ``--time`` takes)."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


def _common_options(
    *,
    time_window: TimeWindow | None,
    pids: Sequence[int],
    tids: Sequence[int],
    symfs: Path | str | None,
    demangle: bool,
    task_events: bool,
) -> list[str]:
    argv: list[str] = []
    if time_window is not None:
        start, end = time_window
        if start is not None and end is not None and end < start:
            raise ValueError(f"time window ends before it starts: {time_window}")
        first = format_time(start) if start is not None else ""
        last = format_time(end) if end is not None else ""
        argv.append(f"--time={first},{last}")
    if pids:
        argv.append("--pid=" + ",".join(str(p) for p in pids))
    if tids:
        argv.append("--tid=" + ",".join(str(t) for t in tids))
    if symfs is not None:
        argv.append(f"--symfs={symfs}")
    if not demangle:
        argv.append("--no-demangle")
    if task_events:
        argv.append("--show-task-events")
    return argv


def branch_script_argv(
    perf_data: Path | str,
    *,
    perf: str = "perf",
    time_window: TimeWindow | None = None,
    pids: Sequence[int] = (),
    tids: Sequence[int] = (),
    itrace_extra: str = "",
    symfs: Path | str | None = None,
    demangle: bool = True,
    ipc: bool = False,
    task_events: bool = False,
    mmap_events: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``perf script`` argv printing the branch trace of ``perf_data`` as text.

    ``perf script -i PERF_DATA --ns --itrace=bep -F`` :data:`BRANCH_FIELDS` plus: ``--time``
    for ``time_window``, ``--pid`` / ``--tid``, ``itrace_extra`` appended to the itrace
    letters, ``--symfs``, ``--no-demangle`` when ``demangle`` is false, ``-F +ipc``
    (instruction and cycle counts, printed by cycle-accurate recordings),
    ``--show-task-events`` (thread names), ``--show-mmap-events`` (where code is mapped),
    then ``extra`` verbatim.
    """
    fields = BRANCH_FIELDS + (",ipc" if ipc else "")
    return [
        perf,
        "script",
        "-i",
        str(perf_data),
        "--ns",
        f"--itrace={BRANCH_ITRACE}{itrace_extra}",
        "-F",
        fields,
        *_common_options(
            time_window=time_window,
            pids=pids,
            tids=tids,
            symfs=symfs,
            demangle=demangle,
            task_events=task_events,
        ),
        *(["--show-mmap-events"] if mmap_events else []),
        *extra,
    ]


def sampling_script_argv(
    perf_data: Path | str,
    *,
    perf: str = "perf",
    time_window: TimeWindow | None = None,
    pids: Sequence[int] = (),
    tids: Sequence[int] = (),
    symfs: Path | str | None = None,
    demangle: bool = True,
    stitch_lbr: bool = False,
    task_events: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``perf script`` argv printing the call-stack samples of ``perf_data`` as text.

    ``perf script -i PERF_DATA --ns -F pid,tid,time,ip,sym,symoff,dso,event,period``: perf
    prints each sample's callchain (leaf first) under it when the recording has them
    (``perf record -g`` / ``--call-graph``); ``stitch_lbr`` adds ``--stitch-lbr`` for LBR
    call graphs. The other options are those of :func:`branch_script_argv`.
    """
    argv = [perf, "script", "-i", str(perf_data), "--ns", "-F", SAMPLING_FIELDS]
    argv += _common_options(
        time_window=time_window,
        pids=pids,
        tids=tids,
        symfs=symfs,
        demangle=demangle,
        task_events=task_events,
    )
    if stitch_lbr:
        argv.append("--stitch-lbr")
    return argv + list(extra)


# ---------------------------------------------------------------------- streaming


def _lines_of(chunks: Iterator[bytes], source: str | None = None) -> Iterator[list[str]]:
    """Batches of complete lines (without their newline) from byte chunks.

    With ``source`` (saved text given by the user), input that is clearly not text fails
    with a one-line error instead of turning into a flood of unrecognised lines.
    """
    rest = b""
    first = True
    for chunk in chunks:
        if first and source is not None:
            _check_text(chunk, source)
        first = False
        data = rest + chunk if rest else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) > _MAX_LINE:  # no newline for megabytes: not perf's text
                yield [data.decode("utf-8", "replace")]
                data = b""
            rest = data
            continue
        rest = data[cut + 1 :]
        yield data[:cut].decode("utf-8", "replace").split("\n")
    if rest:
        yield [rest.decode("utf-8", "replace")]


def _check_text(head: bytes, source: str) -> None:
    if head.startswith(b"PERFILE2") or head.startswith(b"PERFFILE"):
        raise BadInputError(
            f"{source} is a perf.data file, not perf script text",
            hint=f"decode it as a recording: ptscope decode {source}",
        )
    if b"\0" in head[:65536]:
        raise BadInputError(f"{source} is not perf script text (it holds binary data)")


def _read_chunks(fd: int, watch: PerfWatch | None = None) -> Iterator[bytes]:
    while True:
        if watch is not None:
            watch.wait_readable(fd)
        chunk = os.read(fd, CHUNK_SIZE)
        if not chunk:
            return
        yield chunk


def read_text_lines(source: Path | str) -> Iterator[list[str]]:
    """Batches of lines of saved ``perf script`` text: a file, or stdin for ``-``."""
    if str(source) == "-":
        yield from _lines_of(_read_chunks(sys.stdin.buffer.fileno()), "standard input")
        return
    path = Path(source)
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, also when the consumer stops)
    except FileNotFoundError:
        raise BadInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInputError(f"{path} is a directory, not perf script text") from None
    except OSError as e:
        raise BadInputError(f"cannot read {path}: {e.strerror or e}") from None
    with f:
        yield from _lines_of(_read_chunks(f.fileno()), str(path))


def stream_perf_script(
    argv: Sequence[str],
    *,
    perf_data: Path | str | None = None,
    on_stderr: Callable[[str], None] | None = None,
    watch: bool = True,
) -> Iterator[list[str]]:
    """Run ``perf script`` (``argv``) and yield its stdout in batches of lines as it comes.

    perf's stderr goes to a temporary file (no pipe to fill up and stall perf); when perf
    fails, that becomes a one-line :class:`~ptscope.errors.PtscopeError` (stderr as its
    ``details``) raised after the output perf did print. ``on_stderr`` receives the
    stderr of a successful run (perf's warnings). If the consumer stops early, perf is
    stopped. ``perf_data`` names the input in messages. ``watch``: a perf that prints
    nothing for a while is stopped (:class:`~ptscope.perftool.PerfWatch`; for output that
    comes steadily, as every branch does). perf dies with ptscope.
    """
    what = str(perf_data) if perf_data is not None else "the recording"
    limit = stall_limit() if watch else None
    with tempfile.TemporaryFile() as err_file:
        try:
            proc = subprocess.Popen(
                list(argv),
                stdout=subprocess.PIPE,
                stderr=err_file,
                env=perf_env(),
                preexec_fn=die_with_parent,
            )
        except OSError as e:
            raise ToolMissingError(f"cannot run {argv[0]}: {e.strerror or e}") from e
        assert proc.stdout is not None
        watcher = PerfWatch(proc, limit)
        done = False
        try:
            yield from _lines_of(_read_chunks(proc.stdout.fileno(), watcher))
            done = True
        finally:
            proc.stdout.close()
            if done:
                rc = proc.wait()
            else:
                # The consumer went away or failed: perf's output is no longer wanted.
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
        err_file.seek(0, os.SEEK_END)
        size = err_file.tell()
        err_file.seek(max(0, size - _STDERR_KEEP))
        stderr = err_file.read().decode("utf-8", "replace")
    if watcher.stalled is not None:
        raise perf_stalled(list(argv), watcher.stalled, stderr, what)
    if rc != 0:
        raise perf_failure(list(argv), rc, stderr, what)
    if on_stderr is not None and stderr.strip():
        on_stderr(stderr)


def perf_stalled(argv: list[str], how: str, stderr: str, what: str) -> PtscopeError:
    """The watchdog stopped perf (:class:`~ptscope.perftool.PerfWatch`): one line."""
    return BadInputError(
        f"perf script stopped making progress on {what} ({how}; a damaged recording?), "
        "so ptscope stopped it",
        details=" ".join(argv) + "\n" + stderr,
        hint=f"{STALL_ENV}=SECONDS waits longer before stopping perf (0: never)",
    )


def perf_failure(argv: list[str], rc: int, stderr: str, what: str) -> PtscopeError:
    """perf's failure as one line for the user; its stderr and argv as details."""
    details = " ".join(argv) + "\n" + stderr
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    text = "\n".join(lines)
    lowered = text.lower()
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return BadInputError(
            f"perf script crashed ({name}) while decoding {what}",
            details=details,
            hint="the recording may be damaged; run the command from -v to see perf's output",
        )
    if "no such file" in lowered:
        return BadInputError(f"{what}: no such file", details=details)
    if "permission denied" in lowered or "not owned by current user" in lowered:
        return BadInputError(
            f"{what}: permission denied",
            details=details,
            hint="run as the user who recorded it (or root), or fix the file's owner",
        )
    if "zero-sized data" in lowered:
        return BadInputError(
            f"{what} is empty (the recording was interrupted before perf wrote anything)",
            details=details,
        )
    if "not a perf.data" in lowered or "incompatible file format" in lowered:
        return BadInputError(
            f"{what} is not a perf.data file (or was written by an incompatible perf)",
            details=details,
        )
    if "do not have addr attribute set" in lowered or "cannot print 'flags'" in lowered:
        return BadInputError(
            f"{what} holds no branch trace (no Intel PT data)",
            details=details,
            hint="decode sampled call stacks with the sampling decoder instead",
        )
    first = next((ln for ln in lines if not ln.lower().startswith("warning")), "")
    first = first or (lines[0] if lines else "")
    message = f"perf script failed on {what} (exit {rc})"
    if first:
        message += f": {first[:200]}"
    return BadInputError(message, details=details)


# ----------------------------------------------------------------- whole decoders


def decode_perf_data_text(
    perf_data: Path | str,
    *,
    sampling: bool = False,
    keep_all: bool = False,
    time_window: TimeWindow | None = None,
    pids: Sequence[int] = (),
    tids: Sequence[int] = (),
    symfs: Path | str | None = None,
    task_events: bool = False,
    ipc: bool = True,
    insns: bool = False,
    extra: Sequence[str] = (),
    perf: PerfTool | None = None,
    on_stats: Callable[[TextStats], None] | None = None,
    on_stderr: Callable[[str], None] | None = None,
    on_detail: Callable[[InstructionDetail], None] | None = None,
    inline: InlineNodes | None = None,
) -> Iterator[list[Event]]:
    """Decode ``perf_data`` through ``perf script`` text: batches of events as perf prints.

    Branch traces by default (:func:`branch_script_argv`), call-stack samples with
    ``sampling`` (:func:`sampling_script_argv`); the options are theirs. ``keep_all``
    keeps jumps inside one function (dropped by default, as the dlfilter decoder does);
    ``ipc`` asks perf for instruction and cycle counts (printed only by cycle-accurate
    recordings), so that events carry them as the dlfilter decoder's do. ``insns``:
    instruction detail, as the dlfilter's (:mod:`ptscope.decode.blocks`: perf also prints
    its mmap and task lines, and the code is read from the files it names, under
    ``symfs`` when given); ``on_detail`` receives its :class:`InstructionDetail` at the
    end (counts of blocks that could not be counted). With ``insns`` and ``inline``, the
    recording's inlined code too (its nodes added to ``inline``), as the C decoders read it:
    each location's body, and a row where a block enters or leaves one.
    ``on_stats`` receives the parser's :class:`TextStats` at the end.
    """
    path = Path(perf_data)
    if not path.exists():
        raise BadInputError(f"{path}: no such file")
    tool = perf if perf is not None else find_perf()
    if sampling:
        argv = sampling_script_argv(
            path,
            perf=tool.path,
            time_window=time_window,
            pids=pids,
            tids=tids,
            symfs=symfs,
            task_events=task_events,
            extra=extra,
        )
    else:
        argv = branch_script_argv(
            path,
            perf=tool.path,
            time_window=time_window,
            pids=pids,
            tids=tids,
            symfs=symfs,
            task_events=task_events or insns,
            mmap_events=insns,
            ipc=ipc,
            extra=extra,
        )
    runs = (
        recording_runs(path, inline, Path(symfs) if symfs is not None else None)
        if insns and inline is not None
        else None
    )
    detail = InstructionDetail(CodeMap(binary_resolver(symfs)), runs) if insns else None
    lines = stream_perf_script(argv, perf_data=path, on_stderr=on_stderr)
    yield from parse_text(
        lines, keep_all=keep_all, on_stats=on_stats, detail=detail, comm_events=task_events
    )
    if detail is not None and on_detail is not None:
        on_detail(detail)


def binary_resolver(symfs: Path | str | None) -> Callable[[str], Path | None]:
    """Where to read a file that perf names (under ``symfs`` when given, as perf does)."""

    def resolve(name: str) -> Path | None:
        if not name.startswith("/"):
            return None
        path = Path(symfs) / name.lstrip("/") if symfs is not None else Path(name)
        return path if path.is_file() else None

    return resolve


SHAPE_CHECK_LINES: Final = 5000
"""Lines of saved text read before deciding whether it has the fields a decode needs."""


def decode_text_file(
    source: Path | str,
    *,
    keep_all: bool = False,
    on_stats: Callable[[TextStats], None] | None = None,
) -> Iterator[list[Event]]:
    """Decode saved ``perf script`` text (a file, or ``-`` for stdin) into event batches.

    The text may come with other ``-F`` fields than :data:`BRANCH_FIELDS`: what can be
    decoded is (``TextStats.shape`` says what is missing, for the caller to tell). Text
    that lacks a field every call needs (``time``, ``flags``, ``ip``, ``addr``: plain
    ``perf script`` has no flags) fails with a one-line :class:`BadInputError` naming
    them, after its first :data:`SHAPE_CHECK_LINES` lines and before any event is given.
    """
    name = "standard input" if str(source) == "-" else str(source)
    parser = PerfTextParser(keep_all=keep_all)
    held: list[list[Event]] | None = []  # until the check; None after it
    for batch in read_text_lines(source):
        events = parser.feed(batch)
        if held is None:
            if events:
                yield events
            continue
        if events:
            held.append(events)
        if parser.stats.lines >= SHAPE_CHECK_LINES:
            _check_shape(parser.stats, name)
            yield from held
            held = None
    tail = parser.finish()
    if held is not None:
        _check_shape(parser.stats, name)
        yield from held
    if tail:
        yield tail
    if on_stats is not None:
        on_stats(parser.stats)


def _check_shape(stats: TextStats, name: str) -> None:
    if not stats.lines:
        raise BadInputError(f"{name} is empty: no perf script text to decode")
    missing = stats.shape.essential_missing(stats)
    if missing:
        raise BadInputError(
            f"{name}: no call can be rebuilt from this perf script text; it lacks "
            + "; ".join(missing),
            hint=f"make it with: perf script --ns --itrace={BRANCH_ITRACE} -F {BRANCH_FIELDS}",
        )
