"""Generated programs (tests/support/progen.py) traced by ptscope and compared with every
oracle that can judge them (docs/architecture.md, "Proving the stacks right"): the
instrumented build's own log, QEMU's instruction log of the plain build, and uftrace on the
-pg build, each against the trace file (C engine) and the Python reference engine.

A fixed set of seeds covering every feature of the generator; ``make fuzz N=500`` runs many
more (tests/fidelity/fuzz.py).
"""

from __future__ import annotations

import pytest

from support import fidelity, progen

pytestmark = pytest.mark.slow

SEEDS = {
    0: "plain, static",
    3: "plain, dynamic (a PIE; not position-independent at -O1)",
    17: "signal handler, dynamic (not position-independent at -O1)",
    2: "setjmp/longjmp out of recursion",
    60: "C++ exceptions caught inside recursion",
    6: "signal handler re-entered by its own signal",
    9: "plain, 34 functions",
    294: "longjmp to the oldest guard, again while the landing is held, over a window break",
}


def test_the_seeds_cover_every_feature() -> None:
    features = {progen.generate(seed).features[0] for seed in SEEDS}
    assert features == {"plain", "longjmp", "exceptions", "signals"}
    assert not progen.generate(3).static_link


ONE_LEVEL = {60: "-O1"}
"""Seeds judged at one level only: seed 60's static C++ build and its oracles cost half a
minute a level (a third of the suite's fidelity time), and C++ exceptions are also judged
at -O0 and -O2 by test_shapes.py::test_catch_inside_recursion; ``make fuzz`` runs every
level."""

CASES = [
    pytest.param(seed, opt, id=f"seed{seed}-{opt}")
    for seed in SEEDS
    for opt in fidelity.OPTS
    if ONE_LEVEL.get(seed, opt) == opt
]


@pytest.mark.parametrize(("seed", "opt"), CASES)
def test_generated_program_matches_every_oracle(seed: int, opt: str) -> None:
    missing = fidelity.tools_missing()
    if missing:
        pytest.skip(missing)
    outcomes = fidelity.check_program(progen.generate(seed), (opt,))
    judged = [o for o in outcomes if not o.skipped]
    assert {o.oracle for o in judged} >= {"cyg"}
    bad = [str(o) for o in outcomes if not o.ok]
    assert not bad, "\n".join(bad)
