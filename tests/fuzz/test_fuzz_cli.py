"""Fuzz target ``cli``: generated argument vectors for every subcommand, run in-process
through the command line's entry point (:func:`ptscope.cli.main`), as a user's shell
would hand them over.

Each option gets odd values: numbers at and past every limit (0, -1, 2**31, 1e400, nan,
inf, 50 digits), units that exist and that do not, time windows past the end, paths that
are missing, directories, devices, fifos, links to /proc, names too long. A failure is an
internal error (exit 70, "internal error", a traceback) or an exception that leaves
``main``; every refusal must be one error line.

What keeps it safe and fast: every path a command may write is in the input's own
temporary directory (the working directory while it runs; only devices and /proc files
outside it, which are refused or take nothing), ``run`` always records ``/bin/true`` with
the emulated backend, ``attach`` is always given a PID that cannot exist (above any
``pid_max``), ``demo`` finds no compiler (so it stops after checking its options),
``serve`` is always pointed at a port this target holds (so it can only refuse), and no
``--serve`` or picker (``--trigger ?``, ``attach`` without ``-p``) is generated, nor
``--perf-script`` of a fifo or ``-`` (text that streams in: the command waits for it, by
design). The fifo has a reader while the command runs (a command writing to a fifo nobody
reads waits for one, by design, as a shell redirection does: a campaign counted those as
hangs). The
recording and trace the commands read are made once per process (``/bin/true`` under the
emulated backend).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import io
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.target import FuzzTarget, quick

QUICK_EXAMPLES = 200
"""Inputs in ``make test`` (about 5 s: most are refused at once, a decode takes 0.3 s)."""

NO_PID = str((1 << 22) + 4321)
"""Above Linux's largest pid_max (2**22): no process has it."""


@functools.cache
def workspace() -> dict[str, str]:
    """A recording of /bin/true (emulated backend) and its trace, for the whole process."""
    from ptscope.cli import main
    from ptscope.record.emulated import record

    root = Path(tempfile.mkdtemp(prefix="ptscope-fuzz-cli-"))
    atexit.register(shutil.rmtree, root, True)
    rec = root / "rec"
    result = record(["/bin/true"], rec)
    trace = root / "true.fxt.gz"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["decode", str(rec), "-o", str(trace)]) == 0
    return {"@REC@": str(rec), "@TRACE@": str(trace), "@TID@": str(min(result.recording.threads))}


# -- values ------------------------------------------------------------------------------

NUMBERS = [
    "0", "1", "3", "-1", "-0", "1.5", "1e3", "0x10", "1_000", " 7", "", " ", "nan", "inf",
    "-inf", "1e400", "2147483647", "2147483648", "4294967296", "9223372036854775808",
    "99999999999999999999999", "9" * 50,
]  # fmt: skip
numbers = st.sampled_from([*NUMBERS, "2", "5", "10", "100"])
suffixed = st.builds(
    lambda n, u: n + u,
    numbers,
    st.sampled_from(["", "k", "M", "G", "T", "b", "KiB", "x", "ns", "us", "µs", "ms", "s", "h"]),
)
maybe_suffixed = st.one_of(suffixed, st.just(""))
windows = st.one_of(
    st.builds(lambda a, b: f"{a},{b}", maybe_suffixed, maybe_suffixed),
    st.sampled_from([",", "", "a,b,c", "5us", "10us,5us", "0,1ms", "1us,20us"]),
)
perf_windows = st.one_of(
    st.sampled_from(
        ["1.000010000,1.000010500", "1.00002,1.000020300", "1,1.000000400", "0,0", "2,1",
         "1.0000000001,2", "nan,inf", "0,9999999999", "0,99999999999999999999", ",", "1"]
    ),
    st.builds(lambda a, b: f"{a},{b}", numbers, numbers),
)  # fmt: skip
ids = st.one_of(
    st.sampled_from(["@TID@", "@TID@,1", "1,,2", ",", "1 2", "0"]),
    numbers,
)
anchors = st.one_of(
    st.sampled_from(["0x401000:1", "0x0:0", "0x:1", "401000:1", "0x" + "f" * 17 + ":1"]),
    st.builds(lambda a, k: f"0x{a}:{k}", st.sampled_from(["10", "f" * 16, "zz"]), numbers),
)

READ = [
    "@REC@", "@TRACE@", "@REC@/perf.data", "@REC@/ptscope-recording.json", "@TMP@",
    "@TMP@/missing", "@TMP@/fifo.fxt", "/dev/null", "/proc/version", "/nonexistent", "",
    "@TMP@/" + "x" * 300,
]  # fmt: skip
inputs = st.sampled_from(READ)
recordings = st.sampled_from(["@REC@"] * 8 + READ)  # mostly the real one: deeper paths
traces = st.sampled_from(["@TRACE@"] * 8 + READ)
TRACES_OUT = [
    "@TMP@/out.fxt.gz", "@TMP@/out.fxt", "out.fxt.gz", "@TMP@/out.json", "@TMP@/out",
    "@TMP@/missing/out.fxt", "@TMP@", "@TMP@/fifo.fxt", "@TMP@/link.fxt", "@TMP@/dir.fxt",
    "@TMP@/" + "x" * 300 + ".fxt", "/dev/null", "/proc/version", "",
]  # fmt: skip
trace_out = st.sampled_from(TRACES_OUT)
svg_out = st.sampled_from(
    ["@TMP@/f.svg", "f.svg", "@TMP@/missing/f.svg", "@TMP@", "@TMP@/fifo.fxt",
     "@TMP@/link.fxt", "/dev/null", "/proc/version", "@TMP@/" + "x" * 300, ""]
)  # fmt: skip
archive_out = st.sampled_from(
    ["@TMP@/a.tar.gz", "a.tar.gz", "@TMP@/missing/a.tar.gz", "@TMP@", "@TMP@/fifo.fxt",
     "@TMP@/dir.fxt", "@TMP@/" + "x" * 300, ""]
)  # fmt: skip
keep_dirs = st.sampled_from(
    [
        "@TMP@/keep",
        "@TMP@",
        "@TMP@/fifo.fxt",
        "@TMP@/missing/keep",
        "@TMP@/dir.fxt",
        "/dev/null",
        "",
    ]
)
symbols = st.sampled_from(["main,exit", "main", ",", "a,b,c", "main,", ",exit", "(,)", ""])
regexes = st.sampled_from(["", ".", "(", "[", "main", "*", "\\", "(?P<x>", "_.*"])


def choice(*values: str) -> st.SearchStrategy[str]:
    """A choice option: its values and some it does not have."""
    return st.sampled_from([*values, "", "nope", values[0].upper()])


DECODING: dict[str, Any] = {
    "--decoder": choice("auto", "dlfilter", "text"),
    "--jobs": numbers,
    "--time-axis": choice("time", "instructions", "cycles"),
    "--no-insn-detail": None,
    "--split-size": suffixed,
    "--split-time": suffixed,
    "--pid": ids,
    "--tid": ids,
    "--filter": symbols,
    "--symfs": inputs,
}
RECORDING: dict[str, Any] = {
    "-o": trace_out,
    "--keep-recording": keep_dirs,
    "--trigger": st.sampled_from(["main", "0x401000", "demo.c:10", "nothing_here", ""]),
    "--multi-snapshot": None,
    "--snapshot-size": suffixed,
    "--full-execution": None,
    "--timer-resolution": st.sampled_from(
        [
            "low",
            "high",
            "cyc=1,mtc_period=3",
            "cyc=99",
            "nope=1",
            "cyc=1,cyc=1",
            "cyc=0x" + "f" * 40,
        ]
    ),
    "--kernel": None,
    "--kernel-only": None,
    "--no-kcore": None,
    "--multi-thread": None,
    "--callgraph": choice("auto", "fp", "dwarf", "lbr"),
    "--frequency": numbers,
    "--print-perf-commands": None,
    **DECODING,
}
COMMANDS: dict[str, tuple[list[st.SearchStrategy[str]], dict[str, Any]]] = {
    # name: (positionals, options)
    "decode": (
        [recordings],
        {
            "-o": trace_out,
            "--perf-script": inputs.filter(lambda p: p != "@TMP@/fifo.fxt"),
            **DECODING,
        },
    ),
    "dump": ([traces], {"--instants": None}),
    "stats": (
        [traces],
        {
            "--tid": ids,
            "--time": windows,
            "--top": numbers,
            "--sort": choice("total", "self", "calls", "p50", "p90", "p99", "max", "name"),
            "--match": regexes,
            "--json": None,
            "--csv": None,
            "--wide": None,
        },
    ),
    "flame": (
        [traces],
        {
            "--tid": ids,
            "--time": windows,
            "-o": svg_out,
            "--chart": None,
            "--title": st.sampled_from(["", "t", "\x1b[31mred", "<&>", "x" * 2000]),
        },
    ),
    "archive": ([recordings], {"-o": archive_out}),
    "insns": (
        [recordings, st.just("--tid"), ids, st.just("--time"), perf_windows],
        {
            "--tid": ids,
            "--time": perf_windows,
            "--after": anchors,
            "--count": numbers,
            "--symfs": inputs,
        },
    ),
    "serve": ([traces], {"--port": numbers}),
    "run": ([], {**RECORDING, "--max-instructions": numbers}),
    "attach": ([], {**RECORDING, "--backend": choice("auto", "intel-pt", "sampling")}),
    "demo": (
        [],
        {
            "-o": trace_out,
            "--rounds": numbers,
            "--keep-recording": keep_dirs,
            "--backend": choice("auto", "intel-pt", "emulated", "sampling"),
        },
    ),
    "doctor": ([], {}),
}


@st.composite
def argument_vectors(draw: st.DrawFn) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    positionals, options = COMMANDS[name]
    argv = [name]
    for positional in positionals:
        if draw(st.integers(0, 9)):  # now and then left out
            argv.append(draw(positional))
    chosen = draw(st.lists(st.sampled_from(sorted(options)), max_size=4)) if options else []
    for option in chosen:
        values = options[option]
        argv.append(option)
        if values is not None:
            argv.append(draw(values))
    if not draw(st.integers(0, 4)):
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(["-v", "-vv", "-h"])))
    return argv


# -- running one -------------------------------------------------------------------------


def prepared(argv: list[str], tmp: Path, port: int) -> list[str]:
    """The tokens replaced, and what keeps the command safe (see the module's doc)."""
    tokens = {**workspace(), "@TMP@": str(tmp), "@PORT@": str(port)}
    args = []
    for arg in argv:
        for token, value in tokens.items():
            arg = arg.replace(token, value)
        args.append(arg)
    at = next(i for i, a in enumerate(args) if a in COMMANDS)  # `-v` may come first
    name = args[at]
    if name == "serve":
        ports = [i + 1 for i, a in enumerate(args[:-1]) if a == "--port"]
        for i in ports:
            with contextlib.suppress(ValueError):
                if 0 <= int(args[i]) < 65536:  # as argparse reads it: would listen
                    args[i] = str(port)
        if not ports:
            args += ["--port", str(port)]
        args.append("--no-browser")
    elif name == "run":
        args[at + 1 : at + 1] = ["--backend", "emulated"]
        args += ["--", "/bin/true"]
    elif name == "attach":
        args += ["-p", NO_PID]
    return args


@contextlib.contextmanager
def environment(**changes: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in changes}
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def drained(fifo: Path) -> Iterator[None]:
    """A reader on ``fifo`` for as long as the ``with`` lasts, throwing away what comes."""
    import select
    import threading

    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    stop = threading.Event()

    def drain() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                with contextlib.suppress(BlockingIOError):
                    if not os.read(fd, 1 << 16):
                        stop.wait(0.01)  # no writer (yet, or any more)

    thread = threading.Thread(target=drain, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        os.close(fd)


def check(argv: list[str]) -> None:
    from ptscope.cli import main

    with (
        tempfile.TemporaryDirectory(prefix="ptscope-fuzz-cli-") as name,
        socket.socket() as held,
    ):
        tmp = Path(name)
        os.mkfifo(tmp / "fifo.fxt")
        (tmp / "link.fxt").symlink_to("/proc/version")
        (tmp / "dir.fxt").mkdir()
        held.bind(("127.0.0.1", 0))
        held.listen()
        args = prepared(argv, tmp, held.getsockname()[1])
        out, err = io.StringIO(), io.StringIO()
        with (
            drained(tmp / "fifo.fxt"),
            contextlib.chdir(tmp),
            environment(CC="/nonexistent/cc", XDG_CACHE_HOME=str(tmp), DISPLAY=None,
                        WAYLAND_DISPLAY=None, BROWSER=None),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):  # fmt: skip
            try:
                code: Any = main(args)
            except SystemExit as e:  # argparse: usage errors (2), --help (0)
                code = e.code
        stderr = err.getvalue()
        assert code != 70 and "internal error" not in stderr, (args, stderr)
        assert "Traceback" not in stderr, (args, stderr)
        assert code in (None, 0) or (isinstance(code, int) and code > 0), (args, code)
        if code not in (None, 0):
            errors = [line for line in stderr.splitlines() if ": error: " in line]
            assert len(errors) == 1, (args, stderr)


TARGET = FuzzTarget("cli", argument_vectors(), check)

test_cli_quick = quick(TARGET, QUICK_EXAMPLES)
