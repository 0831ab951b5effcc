"""Fuzzing the perf script text decoder: valid text in every shape it reads (branch
traces with and without IPC, call-stack samples, other ``-F`` fields), with numbers set at
and past their limits (times, pids, addresses, offsets, counts, frequencies: as decimal or
hex, negative, with thousands of digits, with digits ``int`` refuses), lines cut, repeated,
dropped, moved, mixed with other lines or bytes.

The parser never raises; what it gives, the engines (C and Python) and the sampled stack
builder take without an exception; the whole ``decode --perf-script`` pipeline (in
process) writes a trace the strict reader reads back, or refuses the text in one line.
"""

from __future__ import annotations

import io
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.mutations import edge_numbers, number_text
from fuzz.seed_inputs import branch_trace_lines, other_shape_lines, sampling_lines
from fuzz.target import FuzzTarget, quick
from ptscope.decode.perf_text import PerfTextParser
from ptscope.errors import BadInputError
from ptscope.fxt import FxtWriter, read_trace
from ptscope.model import BranchEvent, DecodeError, Event, StackSample
from ptscope.pipeline import DecodeOptions, decode_perf_script_text
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import make_engine
from ptscope.reconstruct.sampled import SampledStackBuilder

SEEDS = [
    branch_trace_lines(),
    branch_trace_lines(ipc=True),
    sampling_lines(),
    other_shape_lines() + branch_trace_lines()[:12],
]
NUMBER = re.compile(r"[0-9a-f]+")
CHARACTERS = st.characters(exclude_categories=["Cs"])
"""Any character perf's text can hold once decoded (as UTF-8, damage replaced)."""
JUNK_LINES = [
    "",
    "Warning: something odd",
    "\x1b[2J\x00\x7f not perf",
    " instruction trace error type 1 cpu -1 pid -1 tid -1 ip 0 code 1: Overflow packet",
    "  100/100  5.000000000: PERF_RECORD_COMM exec: x:1/1",
    "\t401009 main+0x9 (/usr/bin/prog)",
]


def _number(hexadecimal: bool) -> st.SearchStrategy[str]:
    if hexadecimal:
        return edge_numbers(80).map(lambda n: f"{n:x}")
    return number_text()


def _time_text(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


_NEAR = st.sampled_from([-1, 0, 1])
FIELDS: list[tuple[re.Pattern[str], st.SearchStrategy[str]]] = [
    # A time in s.ns, at and past model.TIME_LIMIT and 2**63, 2**64.
    (
        re.compile(r"\b\d+\.\d+(?=:)"),
        st.one_of(
            st.builds(lambda b, d: _time_text((1 << b) + d), st.sampled_from([61, 63, 64]), _NEAR),
            st.just("9" * 30 + ".000000000"),
        ),
    ),
    # PID/TID, at and past 32 bits.
    (
        re.compile(r"-?\d+/-?\d+(?= )"),
        st.builds(
            lambda a, b: f"{a}/{b}",
            st.sampled_from([0, -1, (1 << 31) - 1, 1 << 31, 1 << 32, -(1 << 31) - 1]),
            st.sampled_from([1, (1 << 31) - 1, 1 << 31, 1 << 63]),
        ),
    ),
    # An address, at and past 64 bits.
    (
        re.compile(r"(?<= )[0-9a-f]{5,}(?= )"),
        st.sampled_from([(1 << 64) - 1, 1 << 64, 1 << 63, 1 << 80]).map(lambda n: f"{n:x}"),
    ),
    # IPC counts, at and past the decode's budget (model.COUNT_BUDGET).
    (
        re.compile(r"\(\d+/\d+\)"),
        st.builds(
            lambda a, b: f"({a}/{b})",
            st.sampled_from([0, 1 << 51, 1 << 52, 1 << 63, 1 << 64]),
            st.sampled_from([0, 1, 1 << 52, (1 << 64) - 1]),
        ),
    ),
]
"""Fields worth setting at and past their limits, and values for them."""


EDITS = ["limit", "limit", "number", "number", "cut", "char", "drop", "repeat", "move", "insert"]
"""What may happen to a line (numbers twice as often as the rest)."""


@st.composite
def damaged_text(draw: st.DrawFn) -> list[str]:
    """One of the seeds with one to six edits."""
    lines = list(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        if not lines:
            lines.append(draw(st.sampled_from(JUNK_LINES)))
            continue
        at = draw(st.integers(0, len(lines) - 1))
        line = lines[at]
        edit = draw(st.sampled_from(EDITS))
        if edit == "limit":
            found = [
                (m.span(), values) for pattern, values in FIELDS for m in pattern.finditer(line)
            ]
            if found:
                (start, end), values = draw(st.sampled_from(found))
                lines[at] = line[:start] + draw(values) + line[end:]
        elif edit == "number":
            spans = [m.span() for m in NUMBER.finditer(line)]
            if spans:
                start, end = draw(st.sampled_from(spans))
                text = draw(_number(draw(st.booleans())))
                lines[at] = line[:start] + text + line[end:]
        elif edit == "cut":
            lines[at] = line[: draw(st.integers(0, len(line)))]
        elif edit == "char":
            where = draw(st.integers(0, len(line)))
            lines[at] = line[:where] + draw(CHARACTERS) + line[where + 1 :]
        elif edit == "drop":
            del lines[at]
        elif edit == "repeat":
            lines[at:at] = [line] * draw(st.integers(1, 3))
        elif edit == "move":
            lines.insert(draw(st.integers(0, len(lines))), lines.pop(at))
        else:
            lines.insert(at, draw(st.sampled_from(JUNK_LINES)))
    return lines


def _consume(events: list[Event]) -> None:
    """What the pipeline gives the parser's events to, and the trace writer."""
    branches = [e for e in events if not isinstance(e, StackSample)]
    for engine in (make_engine(), TraceSegmentEngine()):
        engine.feed_all(branches)
        timeline = engine.finish()
        FxtWriter(io.BytesIO()).timeline(timeline)
    builder = SampledStackBuilder()
    builder.feed_all(e for e in events if isinstance(e, StackSample))
    FxtWriter(io.BytesIO()).timeline(builder.finish())


def check_text(case: tuple[list[str], int, str]) -> None:
    lines, batch, axis = case
    parser = PerfTextParser()
    events: list[Event] = []
    for i in range(0, len(lines), batch):
        events += parser.feed(lines[i : i + batch])
    events += parser.finish()
    stats = parser.stats
    assert stats.decode_errors == sum(isinstance(e, DecodeError) for e in events)
    assert stats.branches == sum(isinstance(e, BranchEvent) for e in events)
    _consume(events)
    with tempfile.TemporaryDirectory() as tmp:
        text, out = Path(tmp) / "perf.txt", Path(tmp) / "t.fxt"
        text.write_text("".join(line + "\n" for line in lines))
        try:
            decode_perf_script_text(text, out, DecodeOptions(time_axis=axis))
        except BadInputError as e:
            assert "\n" not in e.message
            return
        read_trace(out)


def _inputs() -> st.SearchStrategy[Any]:
    return st.tuples(
        damaged_text(),
        st.sampled_from([1, 7, 1000]),
        st.sampled_from(["time", "time", "instructions", "cycles"]),
    )


TARGET = FuzzTarget(name="perf-text", inputs=_inputs(), check=check_text)

test_fuzz = quick(TARGET)
