"""OCaml exceptions, end to end: ``ptscope run --backend emulated`` on native programs built
by ``ocamlopt`` (with and without ``-g``), the trace read back with the third-party ``fxt``
reader, against the program's own log of its enters, exits and handlers
(``tests/programs/ocaml_exceptions.ml``): after every raise the stack goes on in the
handler's frame, with the frames in between ended at the raise.

What a raise is to the trace (``docs/architecture.md``): without ``-g``, and always for
``raise_notrace``, a jump into the handler; with ``-g`` a call to ``caml_raise_exn``, whose
return lands on the handler. Which activation catches comes from the try bodies that
``decode/landing_pads.py`` finds in the binary.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from support import fidelity, oracles, programs
from support.fidelity import record_and_decode

pytestmark = pytest.mark.slow

_NAME = re.compile(r"^Ocaml_exceptions\.(\w+?)_\d+$")
EVERYTHING = ("catcher", "local", "quiet", "mutual", "iter", "again", "loop")


def function(name: str) -> str:
    """``Ocaml_exceptions.dive_156`` (perf's spelling of ``camlOcaml_exceptions__dive_156``)
    -> ``dive``, as the program logs it."""
    m = _NAME.match(name)
    return m.group(1) if m else name


def trees(slices: dict[int, list[oracles.TraceSlice]], keep: Callable[[str], bool]) -> oracles.Tree:
    (thread,) = slices.values()
    return oracles.nest(((s.start, s.end, function(s.name)) for s in thread), keep)


def traced(tmp: Path, debug: bool, *scenarios: str) -> tuple[oracles.Tree, Path, Path, Path]:
    """(the program's own tree, its log, the trace, the recording)."""
    exe = programs.build("ocaml_exceptions", extra=["-g"] if debug else [])
    log = tmp / "ocaml.log"
    trace, rec = record_and_decode(exe, tmp, *scenarios, PTSCOPE_OCAML_LOG=str(log))
    return oracles.self_log_tree(log), log, trace, rec


@pytest.fixture(params=[False, True], ids=["plain", "g"], scope="module")
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """Every scenario; without -g all but one (its negative control is below)."""
    tmp = tmp_path_factory.mktemp("ocaml")
    debug = bool(request.param)
    return traced(tmp, debug, *(s for s in EVERYTHING if debug or s != "again"))


def test_every_raise_ends_the_frames_up_to_its_handler(run: tuple) -> None:
    expected, log, trace, rec = run
    keep = {a.name for a in oracles.self_log_activations(log)}.__contains__
    # The log itself holds every scenario: 10,000 loop steps, half of them raising.
    assert sum(1 for _, n in expected if n == "step") == 10_000
    assert {"after", "dive", "quiet", "odd", "visit"} <= {n for _, n in expected}
    got = trees(oracles.fxt_slices(trace), keep)
    diff = oracles.first_difference({0: expected}, {0: got})
    assert diff is None, diff
    (perf_data,) = rec.glob("perf.data*")
    reference = trees(oracles.timeline_slices(fidelity.reference_timeline(perf_data)), keep)
    diff = oracles.first_difference({0: expected}, {0: reference})
    assert diff is None, f"Python reference engine: {diff}"


def test_every_function_has_its_own_name(run: tuple) -> None:
    """perf names a module's first function by the module's code_begin label; the decode
    stage gives it its own name from the symbol table."""
    _, _, trace, _ = run
    (thread,) = oracles.fxt_slices(trace).values()
    names = {s.name for s in thread}
    assert "caml_program" in names  # at the label caml_startup__code_begin
    assert not [n for n in names if n.endswith(("code_begin", "code_end"))]
    assert any(n.startswith("Stdlib.List.iter_") for n in names)  # perf's OCaml spelling


def test_a_try_in_a_loop_keeps_the_stack_flat(run: tuple) -> None:
    _, _, trace, _ = run
    (thread,) = oracles.fxt_slices(trace).values()
    loop = next(s for s in thread if function(s.name) == "loop")
    inside = [s for s in thread if loop.start <= s.start and s.end <= loop.end]
    depth = max(d for d, _ in oracles.nest(((s.start, s.end, s.name) for s in inside), bool))
    assert len(inside) > 10_000
    assert depth < 10  # loop > step (> enter > push): no staircase of 5,000 raises


def test_negative_control_without_debug_info_an_older_activation_of_the_raiser(
    tmp_path: Path,
) -> None:
    """The limit of what branches tell (README): without -g a raise caught by an older
    activation of the raising function itself is a jump inside that function, which the
    decoders drop as they drop every jump inside a function. The comparison with the
    program's log sees it (the test can fail); with -g the same program is exact."""
    expected, log, trace, _ = traced(tmp_path, False, "again")
    keep = {a.name for a in oracles.self_log_activations(log)}.__contains__
    got = trees(oracles.fxt_slices(trace), keep)
    assert oracles.first_difference({0: expected}, {0: got}) is not None


def test_negative_control_without_the_try_bodies(run: tuple) -> None:
    """Without the try bodies read from the binary (the reference engine given none), a
    raise in recursion lands in the nearest activation of the handler's function, which
    did not arm that try (odd/even, again): the comparison sees it."""
    expected, log, _, rec = run
    keep = {a.name for a in oracles.self_log_activations(log)}.__contains__
    (perf_data,) = rec.glob("perf.data*")
    timeline = fidelity.reference_timeline(perf_data, landing_pads=False)
    got = trees(oracles.timeline_slices(timeline), keep)
    assert oracles.first_difference({0: expected}, {0: got}) is not None
