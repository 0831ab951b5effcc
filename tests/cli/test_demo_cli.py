"""`ptscope demo` end to end: it builds, records (auto backend), decodes and summarises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ptscope.fxt import read_trace

pytestmark = pytest.mark.slow


def test_demo_writes_a_trace_with_the_programs_calls(tmp_path: Path) -> None:
    out = tmp_path / "demo.fxt.gz"
    result = subprocess.run(
        [sys.executable, "-m", "ptscope", "demo", "-o", str(out), "--rounds", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert "ui.perfetto.dev" in result.stdout
    assert "time in calls" in result.stdout
    trace = read_trace(out)
    (key,) = [k for k, v in trace.slices.items() if v]
    slices = trace.slices[key]
    names = {s.name for s in slices}
    assert {"main", "cosine_of", "build", "sum", "release"} <= names
    assert any("dlopen" in n for n in names) and any("dlclose" in n for n in names)
    assert any(n.startswith(("cos", "__cos")) and "ifunc" not in n for n in names)
    # One cosine_of per round, each calling into the dynamic loader.
    assert sum(s.name == "cosine_of" for s in slices) == 2
    # The tree walk recursed (build 5 levels deep below main).
    depth_of_build = max(s.depth for s in slices if s.name == "build")
    main_depth = min(s.depth for s in slices if s.name == "main")
    assert depth_of_build - main_depth >= 5
    # Then the variant, and the diff naming sum() first: the only function that changed
    # its own instructions (the others' totals grew through it).
    variant = tmp_path / "demo-variant.fxt.gz"
    assert variant.exists()
    table = result.stdout[result.stdout.index("$ ptscope diff") :].splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("function"))
    assert table[header + 1].split()[0] == "sum"
    assert all(" 0 " in f" {line} " for line in table[header + 2 :] if "->" in line)
