"""Calls through the PLT are named after their stub (`strlen@plt`) on both decoders,
also where perf names every PLT entry after the symbol before the PLT (`_init+0x30`),
and on the lazy-binding first call, which goes through PLT0 and the resolver."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ptscope.decode.plt_names import plt_entries
from support.cli import dump_rows, traced_by_both_decoders
from support.programs import build

pytestmark = pytest.mark.slow

LAYOUTS = {
    "pie": ("pie", ()),
    "non-pie": ("nopie", ()),
    "ibt": ("pie", ("-fcf-protection=full", "-Wl,-z,ibtplt")),  # stubs in .plt.sec
}


def _children(rows: list[tuple[int, str]], name: str) -> list[list[str]]:
    """The names of the direct callees of each call of ``name``, in order."""
    calls = []
    for i, (depth, called) in enumerate(rows):
        if called != name:
            continue
        inside = []
        for child_depth, child in rows[i + 1 :]:
            if child_depth <= depth:
                break
            if child_depth == depth + 1:
                inside.append(child)
        calls.append(inside)
    return calls


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_calls_through_the_plt_are_named_after_their_stub(tmp_path: Path, layout: str) -> None:
    link, flags = LAYOUTS[layout]
    program = build("lazy_plt", link=link, extra=["-fno-builtin", "-Wl,-z,lazy", *flags])
    dynamic = subprocess.run(["readelf", "-d", str(program)], capture_output=True, text=True)
    assert "BIND_NOW" not in dynamic.stdout and "NOW" not in dynamic.stdout  # lazy binding
    native, text = traced_by_both_decoders(program, tmp_path)
    rows = dump_rows(native)
    assert rows == dump_rows(text), "both decoders give the same trace"
    first, second = _children(rows, "measure")
    # The first call binds strlen: the stub, then PLT0 and the resolver, then strlen.
    assert first[0] == "strlen@plt", first
    assert "_dl_runtime_resolve_xsave" in first or "_dl_runtime_resolve_xsavec" in first
    assert first[-1].startswith("__strlen"), first
    assert second[0] == "strlen@plt" and second[-1].startswith("__strlen"), second
    [main] = _children(rows, "main")
    assert "printf@plt" in main and "_init" not in main, main
    assert "_init" not in {name for calls in (first, second) for name in calls}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_plt_entries_are_those_objdump_names(layout: str) -> None:
    """Every stub objdump names `NAME@plt` (from the same relocations, its own way) is
    found at its address under that name; PLT0 is `.plt`."""
    link, flags = LAYOUTS[layout]
    program = build("lazy_plt", link=link, extra=["-fno-builtin", "-Wl,-z,lazy", *flags])
    listing = subprocess.run(
        ["objdump", "-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", str(program)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    named = {
        int(m[1], 16): m[2] for m in re.finditer(r"^([0-9a-f]+) <([\w.]+@plt)>:", listing, re.M)
    }
    assert {"strlen@plt", "printf@plt"} <= set(named.values())
    entries = plt_entries(str(program))
    for address, name in named.items():
        assert entries.name_at(address) == (name, 0)
    first = re.search(r"^([0-9a-f]+) <[^>]*>:", listing, re.M)  # .plt's start: PLT0
    assert first is not None
    assert entries.name_at(int(first[1], 16)) == (".plt", 0)
