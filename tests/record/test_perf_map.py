"""JIT perf maps (decode/perf_map.py): parsing, overlaps, and naming unknown locations."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.decode.perf_map import PerfMap, perf_map_path, resolve_location
from ptscope.errors import BadInputError
from ptscope.model import Location


def test_parse_plain_and_0x_forms_with_spaces_in_names() -> None:
    text = (
        "7f0010 40 Interpreter\n"
        "0x7f1000 0x100 LFoo;::bar (Ljava/lang/String;)V\n"
        "\n"
        "garbage line\n"
        "7f2000 zz bad-size\n"
        "7f3000 0 empty\n"
    )
    pm = PerfMap.parse(text)
    assert len(pm) == 2
    assert pm.skipped == 3
    assert pm.lookup(0x7F0010) == ("Interpreter", 0x7F0010)
    assert pm.lookup(0x7F004F) == ("Interpreter", 0x7F0010)
    assert pm.lookup(0x7F0050) is None  # end is exclusive
    assert pm.lookup(0x7F10FF) == ("LFoo;::bar (Ljava/lang/String;)V", 0x7F1000)
    assert pm.lookup(0x10) is None


def test_later_lines_win_where_code_was_reused() -> None:
    pm = PerfMap.parse("1000 100 old\n1040 20 new\n1000 10 newest\n")
    assert pm.lookup(0x1005) == ("newest", 0x1000)
    assert pm.lookup(0x1020) == ("old", 0x1000)
    assert pm.lookup(0x1045) == ("new", 0x1040)
    assert pm.lookup(0x1070) == ("old", 0x1000)


def test_resolve_only_unknown_locations() -> None:
    pm = PerfMap.parse("5000 100 jitted_fn\n")
    unknown = Location(0x5010, "[unknown]", -1, "[anon]")
    named = resolve_location(unknown, pm)
    assert (named.symbol, named.offset, named.dso, named.function) == (
        "jitted_fn",
        0x10,
        "[anon]",
        "jitted_fn",
    )
    assert named.entry == 0x5000
    known = Location(0x5010, "real_symbol", 4, "lib.so")
    assert resolve_location(known, pm) is known
    outside = Location(0x9000, "[unknown]", -1, "")
    assert resolve_location(outside, pm) is outside


def test_load_and_pid_of(tmp_path: Path) -> None:
    path = tmp_path / "perf-1234.map"
    path.write_text("10 10 f\n")
    assert PerfMap.pid_of(path) == 1234
    assert PerfMap.pid_of(tmp_path / "other.map") is None
    assert PerfMap.load(path).lookup(0x15) == ("f", 0x10)
    assert perf_map_path(99) == Path("/tmp/perf-99.map")
    with pytest.raises(BadInputError):
        PerfMap.load(tmp_path / "missing.map")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), min_size=1, max_size=30))
def test_matches_a_naive_last_writer_wins_model(entries: list[tuple[int, int]]) -> None:
    text = "".join(f"{s:x} {n:x} f{i}\n" for i, (s, n) in enumerate(entries))
    pm = PerfMap.parse(text)
    for ip in range(0, 260):
        expected = None
        for i, (s, n) in enumerate(entries):
            if s <= ip < s + n:
                expected = (f"f{i}", s)
        assert pm.lookup(ip) == expected
    assert all(a <= b for a, b in zip(pm.ends, pm.starts[1:], strict=False))
