"""The dependency rule of docs/architecture.md, checked on the import graph.

Pure-data modules import nothing from the stages; no stage imports another stage; only
``pipeline`` and ``cli`` know every stage. ``analyze`` comes after the last stage: it reads
finished traces, through ``fxt`` only.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "ptscope"

SHARED = {"model", "timeline", "recording", "errors", "perftool", "demangle", "children"}
STAGES = {"record", "decode", "reconstruct", "fxt", "analyze"}
# What each part may import from ptscope (beyond itself). `_native` belongs to decode.
ALLOWED: dict[str, set[str]] = {
    "model": set(),
    "timeline": set(),
    "errors": set(),
    "perftool": {"errors"},
    "children": set(),
    "demangle": {"_demangle"},  # its C part (libiberty, as perf demangles)
    "recording": {"errors"},
    "record": {"model", "recording", "errors", "perftool", "timeline", "demangle", "children"},
    "decode": {"model", "errors", "perftool", "_native", "demangle", "children"},
    "_native": set(),
    "reconstruct": {"model", "timeline", "errors"},
    "fxt": {"timeline", "errors"},
    "analyze": {"fxt", "timeline", "errors"},
    "serve": {"errors"},
    "demo": set(),
}
# Stages that may read another stage's output through its module (never the reverse).
DOWNSTREAM_OF: dict[str, set[str]] = {"analyze": {"fxt"}}


def _part(module: Path) -> str:
    rel = module.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.ImportFrom) and node.level:
            continue  # relative imports stay inside a package
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "ptscope" and len(parts) > 1:
                found.add(parts[1])
            elif parts[0] == "ptscope" and isinstance(node, ast.ImportFrom):
                found.update(a.name for a in node.names)
    return found


MODULES = sorted(p for p in SRC.rglob("*.py") if _part(p) in ALLOWED)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_module_respects_the_layering(path: Path) -> None:
    part = _part(path)
    bad = _imports(path) - ALLOWED[part] - {part, "__init__"}
    bad.discard("__version__")
    assert not bad, f"{path.relative_to(SRC)} ({part}) must not import {sorted(bad)}"


def test_only_pipeline_and_cli_know_every_stage() -> None:
    for path in SRC.rglob("*.py"):
        part = _part(path)
        if part in ("pipeline", "cli", "__main__", "__init__"):
            continue
        stages = _imports(path) & STAGES - {part} - DOWNSTREAM_OF.get(part, set())
        assert not stages, f"{path.relative_to(SRC)} imports stages {sorted(stages)}"
