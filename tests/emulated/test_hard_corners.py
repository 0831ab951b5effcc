"""Stacks in the hard corners, each program its own truth (issue 21): signal handlers that
leave by ``siglongjmp``, and a ``longjmp`` to an activation older than the nearest armed
one. Both engines are checked: the trace file (C engine, read with the third-party ``fxt``
reader) and the Python reference engine fed by perf's text decoder. QEMU's own log judges
the same programs in ``test_call_tree.py`` (corpus cases ``siglongjmp``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import oracles, programs
from support.emulated_corpus import needs_tools
from support.fidelity import reference_timeline_trees, trace

pytestmark = pytest.mark.slow


def _trees(exe: Path, tmp: Path, *args: str, keep: set[str]) -> list[oracles.Tree]:
    needs_tools()
    traced = trace(exe, tmp, args=args)
    out = []
    for trees in (
        oracles.fxt_trees(traced.trace, keep.__contains__),
        reference_timeline_trees(traced.perf_data, keep.__contains__),
    ):
        [tree] = trees.values()
        out.append(tree)
    return out


@pytest.mark.parametrize("how", ["alarm", "segv"])
def test_a_handler_that_leaves_by_siglongjmp_runs_on_the_frame_it_interrupted(
    how: str, tmp_path: Path
) -> None:
    """f(5)..f(0), f(3) armed sigsetjmp; the handler interrupts wait_here in f(0) and
    siglongjmps to f(3). The handler nests under wait_here (it did not run under f(3)), and
    f(2)..f(0) end at the jump: `resumed`, called after it, is f(3)'s child."""
    exe = programs.build("siglongjmp", static=how == "segv")
    handler = "on_alarm" if how == "alarm" else "on_segv"
    keep = {"main", "f", "wait_here", handler, "resumed"}
    expected = [(0, "main")] + [(1 + k, "f") for k in range(6)]
    expected += [(7, "wait_here"), (8, handler), (4, "resumed")]
    for tree in _trees(exe, tmp_path, how, keep=keep):
        assert tree == expected


@pytest.mark.parametrize("target", [9, 6, 3])
def test_a_longjmp_lands_in_the_activation_whose_buffer_it_used(
    target: int, tmp_path: Path
) -> None:
    """f(9), f(6) and f(3) arm a jmp_buf at the same setjmp call site; f(0) jumps to f(N)'s.
    `resumed` is f(N)'s child, so f(N-1)..f(0) ended at the longjmp."""
    exe = programs.build("longjmp_older")
    keep = {"main", "f", "resumed"}
    expected = [(0, "main")] + [(1 + k, "f") for k in range(10)]
    expected.append((1 + (9 - target) + 1, "resumed"))
    for tree in _trees(exe, tmp_path, str(target), keep=keep):
        assert tree == expected
