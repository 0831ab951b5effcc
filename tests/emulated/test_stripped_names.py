"""A stripped binary's functions have no names, but each call into one begins at its
entry: ptscope names the call's slice after that address (`[unknown @ 0xADDR (DSO)]`, as
magic-trace does), on both decoders. Ground truth: `nm` of the same program built
without stripping (the same code at the same addresses: a non-PIE executable)."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from support.cli import dump_rows, traced_by_both_decoders
from support.programs import build

pytestmark = pytest.mark.slow

_NAME = re.compile(r"\[unknown @ 0x([0-9a-f]+) \((.+)\)\]")


def _functions(program: Path) -> dict[str, int]:
    """Function name -> address, by nm."""
    out = subprocess.run(["nm", str(program)], capture_output=True, text=True, check=True)
    return {
        parts[2]: int(parts[0], 16)
        for parts in (line.split() for line in out.stdout.splitlines())
        if len(parts) == 3 and parts[1] in "Tt"
    }


def test_calls_into_a_stripped_binary_are_named_by_their_entry(tmp_path: Path) -> None:
    named = build("stripped_calls", link="nopie")
    stripped = build("stripped_calls", link="nopie", extra=["-s"])
    assert (
        "no symbols" in subprocess.run(["nm", str(stripped)], capture_output=True, text=True).stderr
    )
    address = _functions(named)
    native, text = traced_by_both_decoders(stripped, tmp_path)
    rows = dump_rows(native)
    assert rows == dump_rows(text), "both decoders name them alike"

    by_address = {v: k for k, v in address.items()}
    calls: Counter[str] = Counter()
    parent: dict[str, set[str]] = {}
    stack: list[str] = []
    for depth, name in rows:
        del stack[depth:]
        match = _NAME.fullmatch(name)
        function = name
        if match and Path(match[2]).name == stripped.name:
            function = by_address.get(int(match[1], 16), name)
        calls[function] += 1
        if stack:
            parent.setdefault(function, set()).add(stack[-1])
        stack.append(function)
    assert (calls["main"], calls["outer"], calls["middle"], calls["leaf"]) == (1, 5, 10, 30)
    assert parent["outer"] == {"main"}
    assert parent["middle"] == {"outer"}
    assert parent["leaf"] == {"middle"}
    # Nothing of the program is left with the plain name, which no address tells apart.
    assert not [n for n in calls if n == f"[unknown] ({stripped})"]
