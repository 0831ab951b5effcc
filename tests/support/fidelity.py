"""Build a program, trace it with ptscope's emulated backend, and compare the call tree with
independent oracles (see ``oracles.py``): the instrumented build's own log, QEMU's exact
instruction trace (``qemu_truth.py``), and ``uftrace`` on a ``-pg`` build.

Each check traces one build and reads the result twice: the trace file written by the
production pipeline (the own decoder and the C engine; perf's decoder, the dlfilter, must
write the same trace), read back with the third-party ``fxt`` reader; and the Python
reference engine fed by perf's text decoder. Both must equal
the oracle. :func:`check_program` runs every oracle on every optimisation level and returns
one :class:`Outcome` per (oracle, level, engine).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ptscope.decode.landing_pads import LandingPads
from ptscope.decode.perf_script import decode_perf_data_text
from ptscope.pipeline import DecodeOptions, decode_recording
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.record.emulated import EmulationOptions, record
from ptscope.timeline import Timeline
from support import oracles, qemu_truth
from support.decoder_parity import perf_decodes_the_same
from support.progen import Program

TESTS = Path(__file__).resolve().parents[1]
BUILD = TESTS / ".build" / "fidelity"
OPTS: tuple[str, ...] = ("-O0", "-O1", "-O2")
ORACLES: tuple[str, ...] = ("cyg", "qemu", "uftrace")
Variant = Literal["instrumented", "plain", "pg"]


@dataclass
class Outcome:
    """One comparison: which program, level, oracle and engine; ``diff`` None = identical."""

    seed: int
    opt: str
    oracle: str
    engine: str
    diff: str | None
    calls: int = 0
    skipped: str | None = None
    """Why the oracle could not judge this run (its blind spot), when it could not."""

    @property
    def ok(self) -> bool:
        return self.diff is None

    def __str__(self) -> str:
        head = f"seed {self.seed} {self.opt} {self.oracle}/{self.engine}"
        if self.skipped:
            return f"{head}: not judged ({self.skipped})"
        return f"{head}: identical ({self.calls} calls)" if self.ok else f"{head}: {self.diff}"


def tools_missing() -> str | None:
    """Why fidelity checks cannot run here, or None."""
    for tool in ("gcc", "g++", "qemu-x86_64", "perf"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


# ------------------------------------------------------------------------ building


@functools.cache
def _hooks_object() -> Path:
    source = oracles.HOOKS_SOURCE
    key = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    out = BUILD / f"cyg_hooks-{key}.o"
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        _run(["gcc", "-O1", "-fno-omit-frame-pointer", "-c", str(source), "-o", str(tmp)])
        tmp.replace(out)
    return out


def _run(cmd: Sequence[str]) -> None:
    res = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")


def build(program: Program, variant: Variant, opt: str, *, extra: Sequence[str] = ()) -> Path:
    """Compile ``program`` (cached by source and flags) and return the executable."""
    return build_source(
        program.source(inline=variant != "instrumented"),
        cxx=program.language == "c++",
        variant=variant,
        opt=opt,
        static=program.static_link,
        extra=extra,
    )


def build_source(
    source: str,
    *,
    cxx: bool,
    variant: Variant,
    opt: str,
    static: bool = True,
    extra: Sequence[str] = (),
) -> Path:
    """Compile a C (or C++) source text in one of the three variants."""
    compiler = "g++" if cxx else "gcc"
    flags = [opt, "-g", "-fno-omit-frame-pointer", "-w", *extra]
    if variant == "instrumented":
        # No sibling calls: the exit hook must run while the function's frame exists.
        flags += ["-finstrument-functions", "-fno-optimize-sibling-calls"]
    elif variant == "pg":
        flags.append("-pg")
        if opt not in ("-O0", "-O1"):
            flags.append("-fno-optimize-sibling-calls")  # uftrace nests tail calls
    if static and variant != "pg":
        link = ["-static", "-no-pie"]
    elif opt == "-O1" and variant != "pg":
        # Dynamically linked at its link-time addresses: the program below 4 GiB, its
        # libraries where QEMU maps them (at -O0 and -O2 such programs are PIEs).
        link = ["-no-pie", "-fno-pie"]
    else:
        link = ["-pie", "-fPIE"]
    hooks = [str(_hooks_object())] if variant == "instrumented" else []
    key = hashlib.sha256("\0".join([source, compiler, *flags, *link]).encode()).hexdigest()[:16]
    out = BUILD / f"prog-{key}"
    if out.exists():
        return out
    BUILD.mkdir(parents=True, exist_ok=True)
    src = BUILD / f"prog-{key}{'.cpp' if cxx else '.c'}"
    _write_atomically(src, source)  # a test worker may be compiling the same program
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    _run([compiler, *flags, *link, "-o", str(tmp), str(src), *hooks, "-lpthread"])
    tmp.replace(out)
    return out


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


# ------------------------------------------------------------------------- tracing

PTSCOPE = [sys.executable, "-m", "ptscope"]


def ptscope(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run the ``ptscope`` command line; it must succeed without a traceback."""
    out = subprocess.run(
        [*PTSCOPE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout


def record_and_decode(exe: Path, tmp: Path, *args: str, **env: str) -> tuple[Path, Path]:
    """``ptscope run --backend emulated`` (the own decoder, C engine): (trace, recording).
    perf's decoder (the dlfilter) must make the same trace of the recording."""
    trace = tmp / "trace.fxt.gz"
    rec = tmp / "rec"
    ptscope(
        "run", "--backend", "emulated", "--keep-recording", str(rec), "-o", str(trace),
        "--", str(exe), *args, cwd=tmp, env=env,
    )  # fmt: skip
    perf_decodes_the_same(rec, trace)
    return trace, rec


@dataclass
class Traced:
    """A program traced by ptscope: the trace file and the recording's perf.data."""

    exe: Path
    trace: Path
    perf_data: Path
    directory: Path


def trace(
    exe: Path,
    workdir: Path,
    *,
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    raw_log: Path | None = None,
) -> Traced:
    """Record ``exe`` with the emulated backend and decode it with the production pipeline."""
    directory = workdir / "recording"
    environment = {**os.environ, **(env or {})}
    # In the work directory: a -pg build writes gmon.out where it runs.
    options = EmulationOptions(raw_log=raw_log, env=environment, cwd=workdir)
    result = record([str(exe), *args], directory, options=options)
    if result.exit_code != 0:
        raise RuntimeError(f"{exe.name}: {result.summary}")
    out = workdir / "trace.fxt.gz"
    # The own decoder (the default); then perf's in two windows, whatever the default on
    # this machine: each window's edges (a lead-in, a segment break) are where the engine's
    # hardest cases meet (fuzz seed 294). Both must make the same trace.
    decode_recording(result.recording, out, DecodeOptions(jobs=2))
    perf_decodes_the_same(directory, out, DecodeOptions(jobs=2))
    (perf_data,) = result.recording.perf_data_paths()
    return Traced(exe, out, perf_data, directory)


def reference_timeline(perf_data: Path, *, landing_pads: bool = True) -> Timeline:
    """The Python reference engine's timeline, fed by perf's text decoder (without the
    binaries' landing pads when ``landing_pads`` is false: a negative control)."""
    pads = LandingPads().call_sites_landing_at if landing_pads else None
    engine = TraceSegmentEngine(landing_pads=pads)
    for batch in decode_perf_data_text(perf_data):
        engine.feed_all(batch)
    timeline = engine.finish()
    engine.self_check(timeline)
    return timeline


def reference_timeline_trees(perf_data: Path, keep: Callable[[str], bool]) -> oracles.Trees:
    """The Python reference engine's tree, fed by perf's text decoder."""
    return oracles.timeline_trees(reference_timeline(perf_data), keep)


def _outcomes(
    program: Program,
    opt: str,
    oracle: str,
    expected: oracles.Trees,
    traced: Traced,
    keep: Callable[[str], bool],
) -> list[Outcome]:
    calls = sum(len(t) for t in expected.values())
    out = []
    for engine, got in (
        ("c", oracles.fxt_trees(traced.trace, keep)),
        ("python", reference_timeline_trees(traced.perf_data, keep)),
    ):
        diff = oracles.first_difference(expected, got)
        out.append(Outcome(program.seed, opt, oracle, engine, diff, calls))
    return out


# ------------------------------------------------------------------------ checking


def check_cyg(program: Program, opt: str, workdir: Path) -> list[Outcome]:
    """The instrumented build against its own enter/exit log."""
    keep = set(program.function_names).__contains__
    exe = build(program, "instrumented", opt)
    log = workdir / "cyg.log"
    traced = trace(exe, workdir, env={"PTSCOPE_CYG_LOG": str(log)})
    expected = oracles.cyg_trees(log, exe, keep)
    return _outcomes(program, opt, "cyg", expected, traced, keep)


def check_qemu(program: Program, opt: str, workdir: Path) -> list[Outcome]:
    """The plain build (tail calls, inlining) against QEMU's exact instruction trace."""
    keep = set(program.function_names).__contains__
    exe = build(program, "plain", opt)
    raw = workdir / "qemu.log"
    traced = trace(exe, workdir, raw_log=raw)
    truth = qemu_truth.load(raw, exe)
    ambiguous: list[str] = []
    expected = qemu_trees(truth, keep, ambiguous)
    raw.unlink()
    if ambiguous:
        # Blind spot: no stack pointer in QEMU's log (the other oracles see these).
        why = f"a landing into recursion, {ambiguous[0]}"
        return [Outcome(program.seed, opt, "qemu", "-", None, skipped=why)]
    return _outcomes(program, opt, "qemu", expected, traced, keep)


def qemu_trees(
    truth: qemu_truth.Truth, keep: Callable[[str], bool], ambiguous: list[str] | None = None
) -> oracles.Trees:
    """The call tree :func:`qemu_truth.expected_call_tree` implies, per thread."""
    symbols = qemu_truth.Symbols(truth.images)
    out: oracles.Trees = {}
    for run in truth.threads:
        items = [
            (float(s.start), float(s.end), s.name)
            for s in qemu_truth.expected_call_tree(run, symbols, ambiguous)
        ]
        out[run.tid] = oracles.nest(items, keep)
    return out


def check_uftrace(program: Program, opt: str, workdir: Path) -> list[Outcome]:
    """The ``-pg`` build against ``uftrace`` (run natively). Not for ``longjmp``: uftrace
    loses track of its own return hooks when frames are skipped (it prints ends of frames
    that are not running, and crashes the program at -O1)."""
    if program.has_longjmp:
        return []
    keep = set(program.function_names).__contains__
    exe = build(program, "pg", opt)
    data = workdir / "uftrace.data"
    res = subprocess.run(
        ["uftrace", "record", "--no-libcall", "-d", str(data), str(exe)],
        capture_output=True,
        text=True,
        check=False,
        cwd=workdir,
    )
    if res.returncode != 0:
        raise RuntimeError(f"uftrace record failed: {res.stderr[-500:]}")
    try:
        expected_by_tid = oracles.uftrace_trees(data, keep)
    except oracles.OracleBlind as e:
        return [Outcome(program.seed, opt, "uftrace", "-", None, skipped=str(e))]
    traced = trace(exe, workdir)
    # uftrace ran the program natively, ptscope under QEMU: different thread ids.
    got_tids = sorted(oracles.fxt_trees(traced.trace, keep))
    expected = dict(zip(got_tids, expected_by_tid.values(), strict=False))
    return _outcomes(program, opt, "uftrace", expected, traced, keep)


CHECKS: dict[str, Callable[[Program, str, Path], list[Outcome]]] = {
    "cyg": check_cyg,
    "qemu": check_qemu,
    "uftrace": check_uftrace,
}


def check_program(
    program: Program,
    opts: Iterable[str] = OPTS,
    oracle_names: Iterable[str] = ORACLES,
    workdir: Path | None = None,
) -> list[Outcome]:
    """Every oracle on every level; a build or trace failure is an Outcome too."""
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="ptscope-fidelity-", dir=workdir) as tmp:
        for opt in opts:
            for name in oracle_names:
                work = Path(tmp) / f"{name}{opt}"
                work.mkdir()
                try:
                    outcomes += CHECKS[name](program, opt, work)
                except (RuntimeError, oracles.OracleError, OSError) as e:
                    outcomes.append(Outcome(program.seed, opt, name, "-", f"error: {e}"))
                shutil.rmtree(work, ignore_errors=True)
    return outcomes
