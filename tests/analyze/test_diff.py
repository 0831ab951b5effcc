"""``ptscope diff`` and ``flame --diff`` on real emulated recordings of a deterministic
program and its variants (tests/programs/diff_work.c).

Ground truth: the per-function sums are recomputed from what the third-party ``fxt``
reader (PyPI) reads (``support.stats_truth``), and the variants differ from the baseline
only where their source does (an extra loop in ``work``; an extra function).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

from support.cli import one_line_error, ptscope
from support.programs import build
from support.stats_truth import function_truth, third_party_calls

pytestmark = pytest.mark.usefixtures("emulated_backend")

ROUNDS = 20


@pytest.fixture(scope="module")
def emulated_backend() -> None:
    from ptscope.errors import PtscopeError
    from ptscope.record.emulated.qemu import find_qemu, recorder_plugin

    try:
        recorder_plugin(find_qemu())
    except PtscopeError as e:
        pytest.skip(f"the emulated backend cannot record here: {e.message}")


def record(
    binary: Path, out: Path, *, deterministic: bool = True, env: dict[str, str] | None = None
) -> Path:
    args = ["run", "--backend", "emulated", "-o", str(out)]
    if deterministic:
        args.append("--deterministic")
    result = ptscope(*args, "--", str(binary), str(ROUNDS), env=env, cwd=out.parent)
    assert result.returncode in (0, 1), result.stderr  # the program's exit status is s & 1
    return out


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The baseline twice (different environments and directories), each variant once."""
    base = tmp_path_factory.mktemp("diff")
    out: dict[str, Path] = {}
    plain = build("diff_work")
    for key, binary, env in (
        ("before", plain, {"PTSCOPE_TEST_PADDING": "x" * 3000}),
        ("again", plain, {"PTSCOPE_TEST_OTHER": "y"}),
        ("loop", build("diff_work", extra=["-DEXTRA_LOOP"]), None),
        ("calls", build("diff_work", extra=["-DEXTRA_CALLS"]), None),
    ):
        where = base / key
        where.mkdir()
        out[key] = record(binary, where / f"{key}.fxt.gz", env=env)
    return out


def diff_json(*args: str) -> dict[str, Any]:
    result = ptscope("diff", *args, "--format", "json", "--top", "0")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_two_deterministic_runs_count_the_same(traces: dict[str, Path]) -> None:
    """Different environment sizes and working directories: with --deterministic every
    function's calls, instructions and cycles are identical."""
    data = diff_json(str(traces["before"]), str(traces["again"]))
    functions = data["functions"]
    assert len(functions) > 50  # the program, the loader and libc's start-up
    changed = [
        f["name"]
        for f in functions
        if f["status"] != "both"
        or any(f["change"][m] for m in ("calls", "instructions", "self_instructions", "cycles"))
    ]
    assert changed == []
    assert data["before"]["instructions"] == data["after"]["instructions"] > 0


def test_without_deterministic_the_environment_shows(tmp_path: Path) -> None:
    """The control: libc's start-up walks every environment variable (the loader's
    tunables, getenv), so 200 more variables change the counts of a plain emulated run
    (what --deterministic is for). One long variable is not a control: it moves the
    strings, and whether that changes a count depends on their alignment, so on the rest of
    the environment."""
    plain = build("diff_work")
    more = {f"PTSCOPE_TEST_VAR{k}": "x" for k in range(200)}
    a = record(plain, tmp_path / "a.fxt.gz", deterministic=False, env=more)
    b = record(plain, tmp_path / "b.fxt.gz", deterministic=False)
    data = diff_json(str(a), str(b))
    assert data["before"]["instructions"] != data["after"]["instructions"]


def test_the_sums_are_the_third_party_readers(traces: dict[str, Path]) -> None:
    """Calls, total (recursion once: fib) and self instructions, per function, as the
    `fxt` reader's slices add up."""
    from ptscope.analyze.diff import matching_name

    truth = {
        matching_name(name): t
        for name, t in function_truth(third_party_calls(traces["before"])).items()
    }
    data = diff_json(str(traces["before"]), str(traces["loop"]))
    rows = {f["name"]: f["before"] for f in data["functions"] if f["before"] is not None}
    assert rows.keys() == truth.keys()
    for name, t in truth.items():
        got = rows[name]
        assert (got["calls"], got["instructions"], got["self_instructions"]) == (
            t.calls,
            t.instructions,
            t.self_instructions,
        ), name
    fib = rows["fib"]
    assert fib["calls"] == ROUNDS * 177  # fib(10) makes 177 calls
    assert fib["instructions"] < sum(1 for _ in range(fib["calls"])) * 1000


def test_the_changed_function_comes_first(traces: dict[str, Path]) -> None:
    data = diff_json(str(traces["before"]), str(traces["loop"]))
    first, *others = data["functions"]
    assert first["name"] == "work"
    grew = first["change"]["self_instructions"]
    # 200 iterations of a volatile loop, in every one of the ROUNDS calls.
    assert grew >= ROUNDS * 200 * 3
    assert grew == data["after"]["instructions"] - data["before"]["instructions"]
    assert first["change"]["instructions"] == grew
    assert first["change"]["calls"] == 0
    for row in others:
        assert row["change"]["self_instructions"] == 0, row["name"]
        assert row["status"] == "both"


def test_new_functions_are_marked(traces: dict[str, Path]) -> None:
    data = diff_json(str(traces["before"]), str(traces["calls"]))
    rows = {f["name"]: f for f in data["functions"]}
    assert rows["extra"]["status"] == "new"
    assert rows["extra"]["before"] is None
    assert rows["extra"]["after"]["calls"] == ROUNDS
    back = diff_json(str(traces["calls"]), str(traces["before"]))
    assert {f["name"]: f["status"] for f in back["functions"]}["extra"] == "vanished"
    table = ptscope("diff", str(traces["before"]), str(traces["calls"]), "--changed")
    assert table.returncode == 0, table.stderr
    assert "extra (new)" in table.stdout


def test_the_gate(traces: dict[str, Path]) -> None:
    before, loop = str(traces["before"]), str(traces["loop"])
    data = diff_json(before, loop)
    rise = data["after"]["instructions"] - data["before"]["instructions"]
    percent = 100 * rise / data["before"]["instructions"]
    failed = ptscope("diff", before, loop, "--fail-above", f"{percent / 2:.3f}%")
    assert failed.returncode == 1
    assert "ptscope: diff: total instructions:" in failed.stderr
    assert "Traceback" not in failed.stderr
    passed = ptscope("diff", before, loop, "--fail-above", f"{percent * 2:.3f}%")
    assert passed.returncode == 0, passed.stderr
    assert "within --fail-above" in passed.stderr
    # Per function: only work grew; fib, which did not, passes at 0%.
    assert ptscope("diff", before, loop, "--fail-above", "fib=0%").returncode == 0
    per_function = ptscope("diff", before, loop, "--fail-above", "work=1%")
    assert per_function.returncode == 1
    assert "ptscope: diff: work:" in per_function.stderr
    assert ptscope("diff", before, loop, "--fail-above", f"work={rise}").returncode == 0
    assert ptscope("diff", before, loop, "--fail-above", f"work={rise - 1}").returncode == 1
    # A new function crosses any limit.
    assert ptscope("diff", before, str(traces["calls"]), "--fail-above", "extra=50%").returncode
    # The same trace twice never fails.
    assert ptscope("diff", before, str(traces["again"]), "--fail-above", "0%").returncode == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--fail-above", "2x"], "give a rise such as 2% or 5000"),
        (["--fail-above", "=2%"], "give a rise such as 2% or 5000"),
        (["--fail-above", "1.5"], "whole number"),
        (["--fail-above", "nosuchfunction=2%"], "no function 'nosuchfunction' in either trace"),
        (["--match", "("], "not a regular expression"),
        (["--tid", "999999999"], "none of the threads of --tid"),
    ],
)
def test_bad_arguments_are_one_line(traces: dict[str, Path], args: list[str], says: str) -> None:
    result = ptscope("diff", str(traces["before"]), str(traces["loop"]), *args)
    assert says in one_line_error(result)


def test_unreadable_traces_are_one_line(traces: dict[str, Path], tmp_path: Path) -> None:
    junk = tmp_path / "junk.fxt.gz"
    junk.write_bytes(b"\x1f\x8b not gzip at all")
    result = ptscope("diff", str(traces["before"]), str(junk))
    assert "junk.fxt.gz" in one_line_error(result, 3)
    missing = ptscope("diff", str(tmp_path / "missing.fxt"), str(traces["before"]))
    assert "missing.fxt" in one_line_error(missing)


def test_formats_agree(traces: dict[str, Path]) -> None:
    before, loop = str(traces["before"]), str(traces["loop"])
    data = diff_json(before, loop)
    result = ptscope("diff", before, loop, "--format", "csv", "--top", "0")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["name"] for r in rows] == [f["name"] for f in data["functions"]]
    for row, f in zip(rows, data["functions"], strict=True):
        assert int(row["self_instructions_change"]) == f["change"]["self_instructions"]
        assert int(row["calls_after"]) == f["after"]["calls"]
    markdown = ptscope("diff", before, loop, "--format", "markdown", "--top", "3")
    assert markdown.returncode == 0, markdown.stderr
    lines = markdown.stdout.splitlines()
    assert lines[0].startswith("**ptscope diff**")
    header = next(i for i, line in enumerate(lines) if line.startswith("| function"))
    assert lines[header + 1].startswith("|---|")
    assert lines[header + 2].startswith("| `work` |")
    assert len([ln for ln in lines if ln.startswith("| `")]) == 3
    table = ptscope("diff", before, loop, "--top", "3")
    assert table.returncode == 0, table.stderr
    assert "work" in table.stdout.splitlines()[4]  # before, after, total, header, work
    assert "(3 of" in table.stdout


def test_flame_diff(traces: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.svg"
    result = ptscope("flame", "--diff", str(traces["before"]), str(traces["loop"]), "-o", str(out))
    assert result.returncode == 0, result.stderr
    svg = out.read_text()
    assert 'data-unit="instructions"' in svg
    boxes = _boxes(svg)
    work = [b for b in boxes if b["name"] == "work"]
    assert work and all(b["dd"] > 0 for b in work)
    assert all(b["dd"] == 0 for b in boxes if b["name"] not in ("work",))
    reds = {b["fill"] for b in work}
    assert all(int(f[1:3], 16) > int(f[5:7], 16) for f in reds)  # red over blue
    # Reversed: work shrank, drawn blue.
    back = tmp_path / "back.svg"
    ptscope("flame", "--diff", str(traces["loop"]), str(traces["before"]), "-o", str(back))
    work_back = [b for b in _boxes(back.read_text()) if b["name"] == "work"]
    assert work_back and all(b["dd"] < 0 for b in work_back)
    assert all(int(b["fill"][5:7], 16) > int(b["fill"][1:3], 16) for b in work_back)
    wrong = ptscope("flame", "--diff", str(traces["before"]), "-o", str(out))
    assert "two traces" in one_line_error(wrong, 2)


def _boxes(svg: str) -> list[dict[str, Any]]:
    import re

    found = re.finditer(
        r'<g class="f"[^>]*data-dd="(-?\d+)"><title>([^\n<]*)[^<]*</title><rect[^>]*fill="(#\w+)"',
        svg,
    )
    return [{"dd": int(m[1]), "name": m[2], "fill": m[3]} for m in found]


def test_deterministic_is_for_the_emulated_backend() -> None:
    result = ptscope("run", "--backend", "sampling", "--deterministic", "--", "true")
    assert "--deterministic only applies to --backend emulated" in one_line_error(result, 2)


def test_determinism_is_recorded_in_the_metadata(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    result = ptscope(
        "run", "--backend", "emulated", "--deterministic", "--keep-recording", str(rec),
        "-o", str(tmp_path / "t.fxt.gz"), "--", "/usr/bin/env",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # The program saw the fixed environment, not the test's.
    printed = {ln for ln in result.stdout.splitlines() if "=" in ln and " " not in ln}
    assert printed == {"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"}
    notes = json.loads((rec / "ptscope-recording.json").read_text())["notes"]
    assert notes["deterministic"] is True
    assert os.environ.get("PATH")  # the test's own environment was not touched


@pytest.mark.parametrize(
    ("name", "matched"),
    [
        ("[unknown] (/usr/lib/x86_64-linux-gnu/libc.so.6)", "[unknown] (libc.so.6)"),
        ("[unknown] (/build/a/prog)", "[unknown] (prog)"),
        ("[unknown] (prog)", "[unknown] (prog)"),
        ("[unknown @ 0x401136 (/build/a/prog)]", "[unknown] (prog)"),
        ("[unknown @ 0x7f0000001000 ([anon])]", "[unknown] ([anon])"),
        ("std::vector<int>::push_back(int const&)", "std::vector<int>::push_back(int const&)"),
        ("f (/x/y)", "f (/x/y)"),
    ],
)
def test_code_without_a_symbol_is_matched_by_file(name: str, matched: str) -> None:
    from ptscope.analyze.diff import matching_name

    assert matching_name(name) == matched


@pytest.mark.parametrize(
    ("text", "function", "percent", "count"),
    [
        ("2%", None, 2.0, None),
        ("0.5%", None, 0.5, None),
        ("5000", None, None, 5000),
        ("work=2%", "work", 2.0, None),
        ("ns::operator==1%", "ns::operator=", 1.0, None),
    ],
)
def test_thresholds_parse(text: str, function: str | None, percent: float, count: int) -> None:
    from ptscope.analyze.diff import Threshold, parse_threshold

    assert parse_threshold(text) == Threshold(function, percent, count)
