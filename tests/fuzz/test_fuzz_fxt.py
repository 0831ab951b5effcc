"""Fuzzing the trace readers: real traces written by ``FxtWriter`` (from a real decode of
perf text, with names long enough to be cut, table entries reused, instants and counters;
and one outside the columnar reader's subset), damaged in their records or their gzip
stream, read by the strict reader, the columnar reader, and ``ptscope dump``, ``stats``
and ``flame`` (graph and chart) in-process.

A reader may refuse a trace (:class:`FxtFormatError`); a command may refuse it in one line
(exit 1 or 3). Anything else (another exception, an internal error, a traceback, more than
one error line) is a bug.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import tempfile
from functools import cache
from pathlib import Path

from hypothesis import strategies as st

from fuzz.mutations import damaged_bytes, edge_numbers
from fuzz.seed_inputs import branch_trace_lines
from fuzz.target import FuzzTarget, quick
from ptscope.cli import main
from ptscope.decode.perf_text import PerfTextParser
from ptscope.fxt import FxtFormatError, FxtWriter, read_trace
from ptscope.fxt import records as rec
from ptscope.fxt.columns import read_columns
from ptscope.fxt.writer import ArgValue, Koid, Pointer, UInt64
from ptscope.reconstruct.fast_engine import FastEngine
from ptscope.timeline import Timeline
from support.cli import one_line_error, ptscope


def _timeline() -> Timeline:
    parser = PerfTextParser()
    events = parser.feed(branch_trace_lines(ipc=True)) + parser.finish()
    engine = FastEngine()
    engine.feed_all(events)
    timeline = engine.finish()
    timeline.processes[100] = "prog"
    return timeline


@cache
def seeds() -> tuple[list[bytes], list[bytes]]:
    """Real traces, plain and compressed: as ``ptscope decode`` writes them, and with
    small tables (entries reused)."""
    timeline = _timeline()
    start = timeline.time_range()
    base = start[0] if start else 0
    with tempfile.TemporaryDirectory() as tmp:
        plain_path, packed_path = Path(tmp) / "t.fxt", Path(tmp) / "t.fxt.gz"
        for path in (plain_path, packed_path):
            with FxtWriter.open(path, time_base=base) as writer:
                writer.timeline(timeline)
        plain, packed = [plain_path.read_bytes()], [packed_path.read_bytes()]
    out = io.BytesIO()
    writer = FxtWriter(out, time_base=base, string_slots=9, thread_slots=1)
    writer.timeline(timeline)
    writer.close()
    plain.append(out.getvalue())
    packed.append(gzip.compress(out.getvalue(), 1, mtime=0))
    plain.append(_foreign_trace())
    return plain, packed


def _foreign_trace() -> bytes:
    """A trace outside the subset the columnar reader decodes itself (begin/end pairs, a
    tick rate other than 1 GHz, arguments of every type): read by the strict reader."""
    out = io.BytesIO()
    writer = FxtWriter(out, time_base=1_000_000)
    writer.process(7, "other", {rec.ARG_TIME_BASE: 1_000_000})
    writer.thread_name(7, 8, "worker")
    args: dict[str, ArgValue] = {
        rec.ARG_ADDRESS: Pointer(0x401000),
        rec.ARG_INSTRUCTIONS: UInt64(120),
        rec.ARG_CYCLES: 300,
        rec.ARG_FLAGS: "inferred",
        "ratio": 0.25,
        "koid": Koid(7),
        "text": "note",
    }
    for i in range(4):
        writer.begin(7, 8, 1_000_100 + 100 * i, "outer", args)
        writer.complete(7, 8, 1_000_110 + 100 * i, 1_000_150 + 100 * i, "inner", args)
        writer.instant(7, 8, 1_000_120 + 100 * i, "[decode error: overflow packet]", args)
        writer.counter(7, 8, 1_000_130 + 100 * i, "CPU frequency (MHz)", {"value": 2000 + i})
        writer.end(7, 8, 1_000_190 + 100 * i, "outer")
    writer.close()
    data = out.getvalue()
    at, words = _records(data)[3]  # after the magic, the provider and its tick rate
    cut = at + 8 * words
    return data[:cut] + rec.initialization_record(500_000_000) + data[cut:]


RECORD_HEADERS = [
    rec.RecordType.LARGE | (0xFFFFFFFF << 4),  # a large record of 32 GiB
    rec.RecordType.LARGE | (0x10000 << 4),
    rec.RecordType.EVENT | (0xFFF << 4) | (rec.EventType.DURATION_COMPLETE << 16) | (1 << 24),
    rec.RecordType.EVENT | (1 << 4) | (rec.EventType.DURATION_COMPLETE << 16) | (1 << 24),
    rec.RecordType.STRING | (0xFFF << 4) | (1 << 16) | (0x7FFF << 32),
    rec.RecordType.INITIALIZATION | (2 << 4),
    rec.MAGIC,
    0,
]
"""Header words worth trying: sizes at their limits, a record too short for its kind."""


def _records(data: bytes) -> list[tuple[int, int]]:
    """(byte offset, words) of each record, framed by the header's size field."""
    out = []
    at = 0
    while at + 8 <= len(data):
        header = int.from_bytes(data[at : at + 8], "little")
        large = header & 0xF == rec.RecordType.LARGE
        words = (header >> 4) & (0xFFFFFFFF if large else 0xFFF)
        if not words or at + 8 * words > len(data):
            break
        out.append((at, words))
        at += 8 * words
    return out


@st.composite
def _record_edit(draw: st.DrawFn, data: bytearray) -> None:
    """One record's header replaced (by one of :data:`RECORD_HEADERS`, or with its size
    field set to an edge value), or one of its words (times, args, ids) set to one."""
    records = _records(bytes(data))[1:]  # the magic record: byte edits find it often enough
    processes = [r for r in records if data[r[0]] & 0xF == rec.RecordType.KERNEL_OBJECT]
    if processes and not draw(st.integers(0, 4)):
        # A process record's last word: its time base (added to every time).
        at, words = draw(st.sampled_from(processes))
        at += 8 * (words - 1)
        data[at : at + 8] = draw(edge_numbers()).to_bytes(8, "little")
        return
    # Half the time one of the rare records (strings, threads, processes with their time
    # base, metadata): an edit anywhere would seldom find them among the slices.
    rare = [(at, words) for at, words in records if data[at] & 0xF != rec.RecordType.EVENT]
    use_rare = draw(st.booleans())
    if rare and use_rare:
        records = rare
    if not records:
        return
    at, words = draw(st.sampled_from(records))
    header = int.from_bytes(data[at : at + 8], "little")
    edit = draw(st.sampled_from(["word", "word", "size", "header"]))
    if edit == "header":
        value = draw(st.sampled_from(RECORD_HEADERS))
    elif edit == "size":
        large = header & 0xF == rec.RecordType.LARGE
        mask = (0xFFFFFFFF if large else 0xFFF) << 4
        value = (header & ~mask) | ((draw(edge_numbers(32 if large else 12)) << 4) & mask)
    else:
        at += 8 * draw(st.integers(0, words - 1))
        value = draw(edge_numbers())
    data[at : at + 8] = value.to_bytes(8, "little")


@st.composite
def damaged_traces(draw: st.DrawFn) -> bytes:
    """A real trace with records damaged (numbers at and past their limits, sizes that
    lie), then bytes damaged, compressed or not; or its gzip stream damaged."""
    plain, packed = seeds()
    if draw(st.integers(0, 5)):
        data = bytearray(draw(st.sampled_from(plain)))
        for _ in range(draw(st.integers(1, 3))):
            draw(_record_edit(data))
        damaged = bytes(data)
        if not draw(st.integers(0, 2)):
            damaged = draw(damaged_bytes([damaged], word_values=RECORD_HEADERS, max_edits=2))
        return gzip.compress(damaged, 1) if draw(st.booleans()) else damaged
    return draw(damaged_bytes(packed))


COMMANDS = (
    ("dump", "--instants"),
    ("stats",),
    ("stats", "--json", "--top", "0"),
    ("flame",),
    ("flame", "--chart"),
)


def _run(argv: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, err.getvalue()


def check_trace(case: tuple[bytes, int]) -> None:
    data, command = case
    for reader in (read_trace, read_columns):
        with contextlib.suppress(FxtFormatError):
            reader(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.fxt.gz"  # the name says nothing: readers go by content
        path.write_bytes(data)
        argv = [*COMMANDS[command], str(path)]
        if argv[0] == "flame":
            argv += ["-o", str(Path(tmp) / "f.svg")]
        code, err = _run(argv)
    assert "internal error" not in err and "Traceback" not in err, err
    if code != 0:
        assert code in (1, 3), (code, err)
        lines = [ln for ln in err.splitlines() if ln.startswith("ptscope: error:")]
        assert len(lines) == 1, err


TARGET = FuzzTarget(
    name="fxt",
    inputs=st.tuples(damaged_traces(), st.integers(0, len(COMMANDS) - 1)),
    check=check_trace,
)

test_fuzz = quick(TARGET)


def test_damaged_traces_through_the_real_command_line(tmp_path: Path) -> None:
    """End to end, in a process of its own: a trace cut short, one whose gzip stream is
    damaged, one that announces a 32 GiB record, and garbage are each refused in one
    line by two of dump, stats and flame (graph and chart)."""
    plain, packed = seeds()
    huge = bytearray(plain[0])
    huge[64:72] = RECORD_HEADERS[0].to_bytes(8, "little")
    bad_deflate = bytearray(packed[0])
    for i in range(40, 60):
        bad_deflate[i] ^= 0x55
    cases = {
        "cut.fxt.gz": packed[0][: len(packed[0]) // 2],
        "deflate.fxt.gz": bytes(bad_deflate),
        "huge.fxt": bytes(huge),
        "garbage.fxt.gz": b"\x1f\x8b" + bytes(range(256)) * 4,
    }
    for i, (name, data) in enumerate(cases.items()):
        path = tmp_path / name
        path.write_bytes(data)
        for command in (COMMANDS[i], COMMANDS[(i + 2) % len(COMMANDS)]):  # each one twice
            argv = [*command, str(path)]
            if command[0] == "flame":
                argv += ["-o", str(tmp_path / "f.svg")]
            line = one_line_error(ptscope(*argv, timeout=60))
            assert str(path) in line, line
