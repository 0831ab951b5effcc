"""The record stream reader, on streams written by the real C filter (driven by a fake perf)."""

from __future__ import annotations

import contextlib
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope import _native
from ptscope.decode import dlfilter_stream as ds
from ptscope.decode import record_format as rf
from ptscope.decode.dlfilter_stream import RecordStreamParser, make_location
from ptscope.decode.perf_launch import choose_perf_decoder
from ptscope.decode.perf_text import parse_location
from ptscope.errors import BadInputError, ToolMissingError
from ptscope.model import (
    NOWHERE,
    BranchEvent,
    BranchKind,
    CommEvent,
    DecodeError,
    Event,
    PowerEvent,
    TraceState,
)
from ptscope.model import BranchFlags as F
from ptscope.perftool import PerfTool
from support.dlfilter_harness import FakePerf, Sym, build_dlfilter, split_stream

EXE = "/usr/bin/prog"
MAIN = Sym("main", EXE, 0x1000, 0x1100)
FOO = Sym("foo", EXE, 0x1100, 0x1200)
BAR = Sym(
    "std::vector<int, std::allocator<int> >::push_back(int const&)", "/lib/x.so", 0x7000, 0x7100
)
ERROR_LINE = (
    " instruction trace error type 1 time 1.000001688 cpu -1 pid 100 tid 100 ip 0x401029 "
    "code 6: Trace doesn't match instruction\n"
)


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A stream from the real filter: calls/returns, a power event, dropped jumps."""
    out = tmp_path_factory.mktemp("stream") / "s.bin"
    perf = FakePerf(build_dlfilter(), [str(out)])
    assert perf.start() == 0
    perf.sample(ip=0, addr=0x1000, flags=int(F.BRANCH | F.TRACE_BEGIN), addr_sym=MAIN, time=10)
    perf.sample(ip=0x1030, event="cbr", raw=struct.pack("<III", 20, 2_000_000, 0), time=10)
    for i in range(40):
        t = 100 + 10 * i
        perf.sample(
            ip=0x1030,
            addr=0x1100,
            flags=int(F.BRANCH | F.CALL),
            ip_sym=MAIN,
            addr_sym=FOO,
            time=t,
            insn_cnt=3,
        )
        perf.sample(
            ip=0x1110,
            addr=0x1120,
            flags=int(F.BRANCH | F.CONDITIONAL),
            ip_sym=FOO,
            addr_sym=FOO,
            time=t + 1,
            insn_cnt=2,
        )
        perf.sample(
            ip=0x1130,
            addr=0x7000,
            flags=int(F.BRANCH | F.CALL),
            ip_sym=FOO,
            addr_sym=BAR,
            time=t + 2,
        )
        perf.sample(
            ip=0x7010,
            addr=0x1135,
            flags=int(F.BRANCH | F.RETURN),
            ip_sym=BAR,
            addr_sym=FOO,
            time=t + 3,
        )
        perf.sample(
            ip=0x1140,
            addr=0x1035,
            flags=int(F.BRANCH | F.RETURN),
            ip_sym=FOO,
            addr_sym=MAIN,
            time=t + 4,
        )
    perf.sample(
        ip=0x1080,
        addr=0,
        flags=int(F.BRANCH | F.CALL | F.SYSCALLRET | F.TRACE_END),
        ip_sym=MAIN,
        time=900,
    )
    assert perf.stop() == 0
    return out.read_bytes()


def with_error_line(data: bytes, before_branch: int) -> bytes:
    """Insert perf's error text before the n-th branch record (as perf's stdout would)."""
    out = split_stream(data)
    branch_offsets = [o for o, kind in zip(out.offsets, out.order, strict=True) if kind == "branch"]
    at = branch_offsets[before_branch]
    return data[:at] + ERROR_LINE.encode() + data[at:]


def parse(data: bytes, chunk: int | None = None) -> list[Event]:
    parser = RecordStreamParser("test stream")
    events: list[Event] = []
    step = chunk or len(data) or 1
    for i in range(0, len(data), step):
        events += parser.feed(data[i : i + step])
    parser.close()
    return events


def test_events(stream: bytes) -> None:
    events = parse(stream)
    assert isinstance(events[0], BranchEvent)
    assert events[0].kind == BranchKind.JUMP and events[0].state == TraceState.START
    assert events[0].src is NOWHERE
    assert events[1] == PowerEvent(100, 100, 10, 20, 2000)
    branches = [e for e in events if isinstance(e, BranchEvent)]
    assert len(branches) == 1 + 40 * 4 + 1  # the jcc inside foo was dropped
    call = branches[1]
    assert (call.kind, call.state, call.time, call.insn_count) == (
        BranchKind.CALL,
        TraceState.NONE,
        100,
        3,
    )
    assert (call.src.symbol, call.src.offset, call.src.dso) == ("main", 0x30, EXE)
    assert call.dst.function == "foo"
    # The dropped jcc's instructions went to the next kept branch of the thread.
    assert branches[2].insn_count == 2
    assert branches[2].dst.symbol == BAR.name
    # One Location object per address: the engine compares them by their function.
    assert branches[5].src is call.src and branches[5].dst is call.dst
    last = branches[-1]
    assert (last.kind, last.state, last.dst) == (BranchKind.SYSCALL, TraceState.END, NOWHERE)


def test_decode_errors_are_merged_where_perf_printed_them(stream: bytes) -> None:
    events = parse(with_error_line(stream, 7))
    errors = [i for i, e in enumerate(events) if isinstance(e, DecodeError)]
    assert len(errors) == 1
    plain = parse(stream)
    i = errors[0]
    assert events[:i] + events[i + 1 :] == plain
    assert i == 8  # right after the 7th branch record (and the power event)
    err = events[i]
    assert isinstance(err, DecodeError)
    assert (err.pid, err.tid, err.time, err.ip, err.code) == (100, 100, 1_000_001_688, 0x401029, 6)


@pytest.mark.parametrize("chunk", [1, 5, 71, 72, 73, 4096])
def test_any_chunking_gives_the_same_events(stream: bytes, chunk: int) -> None:
    data = with_error_line(stream, 3)
    assert parse(data, chunk) == parse(data)


@pytest.mark.parametrize("join", [8, 80, 200])
@pytest.mark.parametrize("chunk", [71, 500, 3000])
def test_a_leftover_record_joined_to_a_few_bytes_gives_the_same_events(
    stream: bytes, chunk: int, join: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record cut by a chunk's end is finished with the next chunk's first ``_JOIN``
    bytes and the rest is read in place; a record (here perf's error line) longer than
    that is joined whole."""
    data = with_error_line(stream, 3)
    want = parse(data)
    monkeypatch.setattr(ds, "_JOIN", join)
    assert parse(data, chunk) == want


def test_truncation_is_an_error_at_every_length(stream: bytes) -> None:
    for cut in range(0, len(stream) - 1, 7):
        with pytest.raises(BadInputError, match=r"truncated|ends inside|no records"):
            parse(stream[:cut])


def test_trailer_counts_are_checked(stream: bytes) -> None:
    out = split_stream(stream)
    first_branch = out.offsets[out.order.index("branch")]
    missing = stream[:first_branch] + stream[first_branch + rf.BRANCH.size :]
    with pytest.raises(BadInputError, match=r"wrote .* branches_kept records"):
        parse(missing)


def test_version_mismatch(stream: bytes) -> None:
    bad = bytearray(stream)
    struct.pack_into("<I", bad, 8, rf.STREAM_VERSION + 1)
    with pytest.raises(BadInputError, match="format version") as exc:
        parse(bytes(bad))
    assert exc.value.hint is not None and "reinstall" in exc.value.hint


def test_stream_without_header() -> None:
    with pytest.raises(BadInputError, match="no records"):
        parse(b"")
    with pytest.raises(BadInputError, match="header"):
        parse(bytes([rf.TAG_BRANCH]) + bytes(rf.BRANCH.size - 1))


def test_text_lines_that_are_not_errors_are_counted(stream: bytes) -> None:
    out = split_stream(stream)
    at = out.offsets[5]
    parser = RecordStreamParser("t")
    parser.feed(stream[:at] + b"Warning: something odd\n\n" + stream[at:])
    parser.close()
    assert parser.stats.text.unknown_lines == 1
    assert parser.stats.text.unknown_examples == ["Warning: something odd"]


def test_task_events_become_comm_events(stream: bytes) -> None:
    out = split_stream(stream)
    at = out.offsets[3]
    line = b" 4242/4242      0.999990000: PERF_RECORD_COMM exec: prog:4242/4242\n"
    events = parse(stream[:at] + line + stream[at:])
    comms = [e for e in events if isinstance(e, CommEvent)]
    assert len(comms) == 1
    assert (comms[0].pid, comms[0].tid, comms[0].comm) == (4242, 4242, "prog")


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_corruption_is_an_error_or_harmless(stream: bytes, data: st.DataObject) -> None:
    """Damaged bytes never raise anything but BadInputError and never hang."""
    buf = bytearray(with_error_line(stream, 5))
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(buf) - 1))
        buf[pos] = data.draw(st.integers(0, 255))
    chunk = data.draw(st.sampled_from([None, 13, 1000]))
    with contextlib.suppress(BadInputError):
        parse(bytes(buf), chunk)


def test_time_window_drops_events_outside(stream: bytes) -> None:
    data = with_error_line(stream, 3)  # the error is at 1.000001688 s
    everything = parse(data)
    for window in ((None, None), (0, 2_000_000_000), (2_000_000_000, None), (150, 300)):
        lo, hi = window
        parser = RecordStreamParser("t", time_window=window)
        events = parser.feed(data)
        parser.close()
        expected = [
            e
            for e in everything
            if (lo is None or e.time >= lo) and (hi is None or e.time <= hi)  # type: ignore[union-attr]
        ]
        assert events == expected
        assert parser.stats.outside_window == len(everything) - len(expected)


def test_first_branch_after_the_window_is_remembered(stream: bytes) -> None:
    parser = RecordStreamParser("t", time_window=(None, 104))
    events = parser.feed(stream)
    parser.close()
    assert max(e.time for e in events if isinstance(e, BranchEvent)) == 104
    fix = parser.first_after_end[(100, 100)]
    assert (fix.time, fix.ip, fix.addr, fix.insn_count) == (110, 0x1030, 0x1100, 3)
    assert fix.exact  # the decode saw the thread before


# ------------------------------------------------------------------ locations


def test_locations_follow_the_text_decoders_conventions() -> None:
    assert make_location(0, None, -1, None) is NOWHERE
    unknown = make_location(0x5000, None, -1, EXE)
    assert (unknown.symbol, unknown.offset, unknown.dso, unknown.function) == (
        "[unknown]",
        -1,
        EXE,
        f"[unknown] ({EXE})",
    )
    assert make_location(0x5000, None, -1, None).dso == "[unknown]"
    # The same as the text decoder's locations for what perf prints.
    for text, args in (
        ("401136 main+0x26 (/tmp/a.out)", (0x401136, "main", 0x26, "/tmp/a.out")),
        ("5000 [unknown] (/tmp/a.out)", (0x5000, None, -1, "/tmp/a.out")),
        ("7f00 [unknown] ([unknown])", (0x7F00, None, -1, None)),
        ("0 [unknown] ([unknown])", (0, None, -1, None)),
    ):
        assert make_location(*args) == parse_location(text), text
        assert make_location(*args).function == parse_location(text).function  # type: ignore[union-attr]


# ------------------------------------------------------------------ choice


def _perf(version: tuple[int, int, int]) -> PerfTool:
    return PerfTool(path="/usr/bin/perf", version=version, version_text="perf version x")


def test_choose_perf_decoder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_native, "dlfilter_path", lambda: build_dlfilter())
    assert choose_perf_decoder("auto", _perf((6, 1, 0))).name == "dlfilter"
    assert choose_perf_decoder("text", _perf((6, 1, 0))).name == "text"
    old = choose_perf_decoder("auto", _perf((5, 13, 0)))
    assert old.name == "text" and "5.13" in old.reason and "5.14" in old.reason
    with pytest.raises(ToolMissingError, match=r"5\.14"):
        choose_perf_decoder("dlfilter", _perf((5, 13, 0)))
    monkeypatch.setattr(_native, "dlfilter_path", lambda: tmp_path / "missing.so")
    missing = choose_perf_decoder("auto", _perf((6, 1, 0)))
    assert missing.name == "text" and "not built" in missing.reason
    with pytest.raises(ToolMissingError):
        ds.DlfilterProcess(tmp_path / "perf.data", perf=_perf((6, 1, 0)))
