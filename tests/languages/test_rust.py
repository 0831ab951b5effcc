"""Rust, end to end: ``ptscope run --backend emulated`` on a program built by ``rustc``
(``tests/programs/rust_panics.rs``), the trace read back with the third-party ``fxt``
reader. Panics caught by ``std::panic::catch_unwind`` across several frames, through frames
that drop something (the unwinder runs their cleanup on the way) and in recursion, against
the program's own log of its enters, exits and catches; names readable in both manglings.

A panic unwinds with the same unwinder and tables as C++ (``.eh_frame``, LSDAs): the
landing pads and the exception's way out (the unwinder's return into the next cleanup) are
the rules of ``docs/architecture.md``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from support import fidelity, oracles, programs
from support.fidelity import record_and_decode

pytestmark = pytest.mark.slow

MANGLINGS = {"legacy": [], "v0": ["-Csymbol-mangling-version=v0"]}
_MANGLED = re.compile(r"^_(?:Z|R[A-Z])")


def build(mangling: str) -> Path:
    try:
        return programs.build("rust_panics", opt="-O1", extra=MANGLINGS[mangling])
    except RuntimeError as e:  # an older rustc without that mangling
        pytest.skip(f"rustc cannot build with {mangling} names: {str(e).splitlines()[-1]}")


@pytest.fixture(params=list(MANGLINGS), scope="module")
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    tmp = tmp_path_factory.mktemp("rust")
    log = tmp / "rust.log"
    trace, rec = record_and_decode(build(request.param), tmp, PTSCOPE_RUST_LOG=str(log))
    (perf_data,) = rec.glob("perf.data*")
    return request.param, oracles.self_log_activations(log), trace, perf_data


def tree(
    slices: dict[int, list[oracles.TraceSlice]], calls: list[oracles.Activation]
) -> oracles.Tree:
    (thread,) = slices.values()
    prefix = "rust_panics::"  # the crate's own functions (libc's main is no `main` of ours)
    named = ((s.start, s.end, s.name[len(prefix) :] if s.name.startswith(prefix) else s.name)
             for s in thread)  # fmt: skip
    keep = {c.name for c in calls if c.name != "main"}.__contains__
    return oracles.nest(named, keep)


def test_a_panic_ends_the_frames_up_to_its_catch(run: tuple) -> None:
    _, calls, trace, perf_data = run
    expected = [(c.depth - 1, c.name) for c in calls if c.name != "main"]
    assert sum(n == "guarded" for _, n in expected) == 4 and ("again" in dict(expected).values())
    for engine, found in (
        ("C engine, trace file", oracles.fxt_slices(trace)),
        ("Python reference", oracles.timeline_slices(fidelity.reference_timeline(perf_data))),
    ):
        diff = oracles.first_difference({0: expected}, {0: tree(found, calls)})
        assert diff is None, f"{engine}: {diff}"


def test_names_are_readable(run: tuple) -> None:
    mangling, _, trace, _ = run
    (thread,) = oracles.fxt_slices(trace).values()
    names = {s.name for s in thread}
    assert not [n for n in names if _MANGLED.match(n)]  # every name demangled
    assert not [n for n in names if re.search(r"::h[0-9a-f]{16}$", n)]  # no legacy hash
    assert {"rust_panics::dive", "<rust_panics::Square as rust_panics::Shape>::area"} <= names
    # Generic arguments: v0 names carry them (legacy names only hash them).
    generic = "rust_panics::pick::<u64>" if mangling == "v0" else "rust_panics::pick"
    assert generic in names
    closure = "{closure#0}" if mangling == "v0" else "{{closure}}"
    assert f"rust_panics::main::{closure}" in names  # the panic hook


def test_negative_control_without_the_landing_pads(run: tuple) -> None:
    """After a cleanup, the unwinder (_Unwind_Resume) jumps into the next frame's cleanup:
    in a recursion, which activation that is only the binary's tables tell (the nearest
    one just finished its cleanup). Without them (the reference engine given none) the
    next cleanup's calls nest under a frame already unwound: the comparison sees it."""
    _, calls, _, perf_data = run
    found = oracles.timeline_slices(fidelity.reference_timeline(perf_data, landing_pads=False))
    expected = [(c.depth - 1, c.name) for c in calls if c.name != "main"]
    assert oracles.first_difference({0: expected}, {0: tree(found, calls)}) is not None
