"""Program shapes that reconstruction must get exactly right, each checked end to end
(``ptscope`` on the command line, the trace read back with the third-party ``fxt`` reader)
against oracles that share nothing with the engine: the compiler's own instrumentation
(``-finstrument-functions``), ``uftrace`` on ``-pg`` builds, and for the reproducers of
reported bugs the exact tree the program makes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from support import fidelity, oracles, programs
from support.fidelity import ptscope, record_and_decode

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _tools() -> None:
    missing = fidelity.tools_missing()
    if missing:
        pytest.skip(missing)


def instrumented(name: str, opt: str = "-O1") -> Path:
    source = (programs.SOURCES / f"{name}.c").read_text()
    return fidelity.build_source(source, cxx=False, variant="instrumented", opt=opt)


def assert_same(expected: oracles.Trees, got: oracles.Trees) -> None:
    diff = oracles.first_difference(expected, got)
    assert diff is None, diff


# ------------------------------------------------------------- the reproducers


def _parity_chain(tree: oracles.Tree) -> list[tuple[int, str]]:
    return [(d, n) for d, n in tree if n in ("is_even", "is_odd")]


EXPECTED_CHAIN = [(1 + k, "is_even" if k % 2 == 0 else "is_odd") for k in range(7)]
"""main -> is_even(6) -> is_odd(5) -> ... -> is_even(0): seven levels, each inside the last."""


@pytest.mark.parametrize(("opt", "extra"), [("-O0", ()), ("-O1", ("-pg",))], ids=["O0", "O1-pg"])
def test_mutual_recursion_nests(tmp_path: Path, opt: str, extra: tuple[str, ...]) -> None:
    exe = programs.build("mutual_recursion", opt=opt, extra=extra)
    keep = {"main", "is_even", "is_odd", "fib"}.__contains__
    trace, rec = record_and_decode(exe, tmp_path)
    (got,) = oracles.fxt_trees(trace, keep).values()
    assert _parity_chain(got) == EXPECTED_CHAIN
    # The text decoder gives the same tree.
    text = tmp_path / "text.fxt.gz"
    ptscope("decode", str(rec), "--decoder", "text", "-o", str(text))
    assert oracles.fxt_trees(text, keep) == oracles.fxt_trees(trace, keep)
    if "-pg" in extra and shutil.which("uftrace"):
        data = tmp_path / "uftrace.data"
        subprocess.run(
            ["uftrace", "record", "-d", str(data), str(exe)],
            check=True, capture_output=True, cwd=tmp_path,
        )  # fmt: skip
        (expected,) = oracles.uftrace_trees(data, keep).values()
        assert got == expected


def test_mutual_recursion_against_the_hooks(tmp_path: Path) -> None:
    exe = instrumented("mutual_recursion", opt="-O0")
    log = tmp_path / "cyg.log"
    trace, _ = record_and_decode(exe, tmp_path, PTSCOPE_CYG_LOG=str(log))
    keep = oracles.cyg_functions(log, exe).__contains__
    expected = oracles.cyg_trees(log, exe, keep)
    assert _parity_chain(next(iter(expected.values()))) == EXPECTED_CHAIN
    assert_same(expected, oracles.fxt_trees(trace, keep))


PERF_SCRIPT_MID_LOOP = "".join(
    f" 4242/4242  1000.{ns:09d}:          1 branches:uH:   {kind:8s} {src} (/tmp/orders) =>"
    f"  {dst} (/tmp/orders)\n"
    for ns, kind, src, dst in [
        (100, "jcc", "401126 add_order+0x16", "401110 add_order+0x0"),
        (110, "jmp", "401130 add_order+0x20", "401140 add_order+0x30"),
        (119, "call", "401150 add_order+0x40", "401200 insert+0x0"),
        (130, "return", "401230 insert+0x30", "401155 add_order+0x45"),
        (150, "return", "401170 add_order+0x60", "401022 main+0x22"),
    ]
)
"""A snapshot taken in the middle of add_order's loop: jumps inside it come first."""


def test_a_trace_that_starts_inside_a_function_starts_it_at_its_first_branch(
    tmp_path: Path,
) -> None:
    text = tmp_path / "script.txt"
    text.write_text(PERF_SCRIPT_MID_LOOP)
    trace = tmp_path / "t.fxt.gz"
    ptscope("decode", "--perf-script", str(text), "-o", str(trace))
    rows = {s.name: s for s in oracles.fxt_slices(trace)[4242]}
    t0 = rows["main"].start  # the thread's first branch (times start at 0 in the trace)
    assert rows["add_order"].start == t0, rows
    assert rows["insert"].start == t0 + 19
    assert rows["add_order"].end == t0 + 50


# ------------------------------------------------------------------------ scale


@pytest.mark.parametrize(
    ("name", "args"),
    [("deep_recursion", ()), ("many_calls", ()), ("threads_recurse", ())],
    ids=["recursion-5000-deep", "100k-calls", "threads-recurse"],
)
def test_scale_against_the_hooks(tmp_path: Path, name: str, args: tuple[str, ...]) -> None:
    exe = instrumented(name)
    log = tmp_path / "cyg.log"
    trace, rec = record_and_decode(exe, tmp_path, *args, PTSCOPE_CYG_LOG=str(log))
    keep = oracles.cyg_functions(log, exe).__contains__
    expected = oracles.cyg_trees(log, exe, keep)
    if name == "deep_recursion":
        assert (
            max(d for d, _ in next(iter(expected.values()))) == 5002
        )  # main, 5,001 descends, bottom
    if name == "many_calls":
        assert sum(len(t) for t in expected.values()) > 100_000
    if name == "threads_recurse":
        assert len(expected) == 5
    assert_same(expected, oracles.fxt_trees(trace, keep))
    if name == "many_calls":
        # The Python reference engine is judged on every other shape; on 100,000 calls it
        # cost two thirds of this test's 35 s.
        return
    (perf_data,) = rec.glob("perf.data*")
    assert_same(expected, fidelity.reference_timeline_trees(perf_data, keep))


def test_coroutines_keep_their_own_frames(tmp_path: Path) -> None:
    """Stacks switched by swapcontext: each run shows its own stack; no frame of one
    coroutine holds a call of the other (docs/architecture.md, stack switches)."""
    exe = instrumented("coroutines")
    log = tmp_path / "cyg.log"
    trace, rec = record_and_decode(exe, tmp_path, PTSCOPE_CYG_LOG=str(log))
    keep = oracles.cyg_functions(log, exe).__contains__
    load, _ = oracles.read_cyg_log(log)
    base, size = oracles.object_symbol(exe, load, "stacks")

    def stack_of(fp: int) -> object:
        return (fp - base) * 2 // size if base <= fp < base + size else "main"

    (calls,) = oracles.cyg_activations(log, exe, keep, stack_of).values()
    assert {c.stack for c in calls} == {"main", 0, 1}
    (perf_data,) = rec.glob("perf.data*")
    for engine, found in (
        ("C engine, trace file", oracles.fxt_slices(trace)),
        (
            "Python reference engine",
            oracles.timeline_slices(fidelity.reference_timeline(perf_data)),
        ),
    ):
        (slices,) = found.values()
        problems = oracles.check_own_stacks(slices, calls, keep)
        assert not problems, f"{engine}:\n" + "\n".join(problems[:10])


# ------------------------------------------------------------ minimised failures


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_catch_inside_recursion(tmp_path: Path, opt: str) -> None:
    """Found by the fuzzer (seed 60): the activation that catches is found in the binary's
    exception tables, not taken as the nearest one of its function."""
    source = (programs.SOURCES / "catch_in_recursion.cpp").read_text()
    keep = {"main", "f6", "f10", "f13", "f16"}.__contains__
    exe = fidelity.build_source(source, cxx=True, variant="instrumented", opt=opt)
    log = tmp_path / "cyg.log"
    trace, rec = record_and_decode(exe, tmp_path, PTSCOPE_CYG_LOG=str(log))
    expected = oracles.cyg_trees(log, exe, keep)
    assert_same(expected, oracles.fxt_trees(trace, keep))
    (perf_data,) = rec.glob("perf.data*")
    assert_same(expected, fidelity.reference_timeline_trees(perf_data, keep))
    if shutil.which("uftrace"):
        pg = fidelity.build_source(source, cxx=True, variant="pg", opt=opt)
        data = tmp_path / "uftrace.data"
        subprocess.run(
            ["uftrace", "record", "--no-libcall", "-d", str(data), str(pg)],
            check=True, capture_output=True, cwd=tmp_path,
        )  # fmt: skip
        traced = tmp_path / "pg"
        traced.mkdir()
        pg_trace, _ = record_and_decode(pg, traced)
        got = oracles.fxt_trees(pg_trace, keep)
        assert list(oracles.uftrace_trees(data, keep).values()) == list(got.values())
