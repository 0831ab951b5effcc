"""C++ names, end to end: ``ptscope run --backend emulated`` on ``tests/programs/cxx_names.cpp``
(templates, a lambda, operators, an anonymous namespace, and a function template instance
named by over 40,000 characters), the trace read back with the third-party ``fxt`` reader.

The expected names are written here from the source, not by any demangler. perf demangles
the ordinary ones; it leaves the huge one mangled, and the decode stage demangles it
(``ptscope.demangle``); the writer shows it shortened, with the whole name in its
``full_name`` args, once in the file.
"""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import pytest

from ptscope.fxt import records as rec
from ptscope.perftool import find_perf
from support import oracles, programs
from support.fidelity import ptscope, record_and_decode
from support.fxt_check import third_party_view

pytestmark = pytest.mark.slow

LONG_TYPE = (
    "a_type_whose_name_is_long_so_that_one_instance_has_a_name_of_over_forty_thousand_"
    "characters_in_all_"
)
HUGE = "huge<" + ", ".join(f"{LONG_TYPE}{n}" for n in range(100, 500)) + ", end_of_list>"
READABLE = {
    "shapes::Box<long>::operator+",
    "shapes::Box<long>::operator<",
    "shapes::(anonymous namespace)::hidden",
    "shapes::apply<main::{lambda(int)#1}>",
    "main::{lambda(int)#1}::operator()",
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("cxx")
    return record_and_decode(programs.build("cxx_names"), tmp)


def names(trace: Path) -> set[str]:
    """Every slice's whole name, as the third-party reader sees it (long ones joined)."""
    return {key[2] for key in third_party_view(trace).complete}


def test_templates_lambdas_operators_and_anonymous_namespaces_are_readable(run: tuple) -> None:
    trace, rec_dir = run
    assert len(HUGE) > 40_000
    seen = names(trace)
    assert READABLE | {HUGE} <= seen
    assert not [n for n in seen if n.startswith("_Z")]
    # The text decoder gives the same names.
    text = rec_dir.parent / "text.fxt.gz"
    ptscope("decode", str(rec_dir), "--decoder", "text", "-o", str(text))
    assert names(text) == seen


def _without_inlined(rec_dir: Path) -> Path:
    plain = rec_dir.parent / "no-inline.fxt.gz"
    if not plain.exists():
        ptscope("decode", str(rec_dir), "--no-inline", "-o", str(plain))
    return plain


def test_a_40000_character_name_is_shortened_and_kept_whole_once(run: tuple) -> None:
    trace, _ = run
    (thread,) = oracles.fxt_slices(trace).values()
    (shown,) = [s.name for s in thread if s.name.startswith("huge<")]
    assert len(shown) < 1_100 and "characters cut]" in shown
    assert shown.startswith(HUGE[:500]) and shown.endswith(HUGE[-100:])
    middle = f"{LONG_TYPE}300".encode()  # only in the whole name, not in the shown one
    assert gzip.decompress(trace.read_bytes()).count(middle) == 1  # one record, many calls
    # The name once, plus the rest of the trace (without the inlined frames of the C++
    # runtime, which grow with the system's debug information).
    raw = gzip.decompress(_without_inlined(run[1]).read_bytes())
    assert raw.count(middle) == 1
    assert len(raw) < 4 * len(HUGE) + 400_000
    assert len(HUGE.encode()) > rec.MAX_STRING_BYTES  # hence the pieces


def test_negative_control_perf_leaves_the_huge_name_mangled(run: tuple) -> None:
    """Without the decode stage's demangling the name would stay mangled (the test above
    would fail): perf itself prints it mangled."""
    _, rec_dir = run
    (perf_data,) = rec_dir.glob("perf.data*")
    out = subprocess.run(
        [str(find_perf().path), "script", "-i", str(perf_data), "--itrace=b", "-F", "sym,addr"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "_Z4hugeIJ" in out and "huge<" not in out
