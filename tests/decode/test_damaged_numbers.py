"""Numbers out of range in what the decoders read (perf's text, the dlfilter stream) are
damaged data: a counted ``[decode error]``, never an exception here or in the engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.decode.perf_text import PerfTextParser
from ptscope.model import (
    COUNT_BUDGET,
    TIME_LIMIT,
    BranchEvent,
    CommEvent,
    DecodeError,
    Event,
    PowerEvent,
    StackSample,
)
from ptscope.reconstruct.engine import TraceSegmentEngine
from ptscope.reconstruct.fast_engine import make_engine
from support.cli import ptscope

HEAD = "  1234/1234  12345.678901234:          1  branches:uH:"
CALL = "  call  401136 main+0x26 (/tmp/a.out) =>  401106 f+0x0 (/tmp/a.out)"
RETURN = "  return  401120 f+0x1a (/tmp/a.out) =>  40113b main+0x2b (/tmp/a.out)"
GOOD = [HEAD + CALL, "  1234/1234  12345.678901300:          1  branches:uH:" + RETURN]


def _time(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"


DAMAGED_LINES = {
    "time 2**63": f"  1234/1234  {_time(1 << 63)}:          1  branches:uH:" + RETURN,
    "time 2**64": f"  1234/1234  {_time(1 << 64)}:          1  branches:uH:" + RETURN,
    "time at the engine's limit": f"  1234/1234  {_time(TIME_LIMIT)}:  1  branches:uH:" + RETURN,
    "time of 5,000 digits": "  1234/1234  " + "9" * 5000 + ".000000001:  1  branches:uH:" + RETURN,
    "address 2**64": HEAD + "  return  10000000000000000 f+0x1a (/tmp/a.out) =>  40113b main",
    "target 2**64": HEAD + "  call  401136 main+0x26 (/tmp/a.out) =>  ffffffffffffffff1 f+0x0",
    "pid 2**31": "  2147483648/1234  12345.678901300:  1  branches:uH:" + RETURN,
    "tid 2**32": "  1234/4294967296  12345.678901300:  1  branches:uH:" + RETURN,
    "pid of 5,000 digits": "  " + "1" * 5000 + "/1  12345.678901300:  1  branches:uH:" + RETURN,
    "counts past the budget": (
        "  1234/1234  12345.678901300:  1  branches:uH:"
        + RETURN
        + f" \t IPC: 0.50 ({COUNT_BUDGET}/{COUNT_BUDGET}) "
    ),
    "counts of 5,000 digits": (
        "  1234/1234  12345.678901300:  1  branches:uH:"
        + RETURN
        + f" \t IPC: 1.00 ({'7' * 5000}/1) "
    ),
    "frequency 2**64": (
        "  1234/1234  12345.678901300:  0  cbr:  cbr: 20 freq: 18446744073709551616 MHz (55%)"
        "  0 401136 main+0x26 (/tmp/a.out)"
    ),
}


def _feed_engines(events: list[Event]) -> None:
    """Both engines take what the parser gave (the C engine refuses out-of-range input
    with an exception: none may reach it)."""
    for engine in (make_engine(), TraceSegmentEngine()):
        engine.feed_all(events)
        engine.finish()


@pytest.mark.parametrize("line", DAMAGED_LINES.values(), ids=DAMAGED_LINES.keys())
def test_a_perf_text_line_with_a_number_out_of_range_is_a_decode_error(line: str) -> None:
    parser = PerfTextParser()
    events = parser.feed([GOOD[0], line, GOOD[1]])
    events += parser.finish()
    errors = [e for e in events if isinstance(e, DecodeError)]
    assert len(errors) == 1, events
    assert "out of range" in errors[0].message
    assert parser.stats.decode_errors == 1
    assert parser.stats.unknown_lines == 0
    # The good lines around it are still decoded.
    assert sum(isinstance(e, BranchEvent) for e in events) == 2
    _feed_engines(events)


def test_a_damaged_perf_text_line_keeps_the_numbers_in_range_on_its_error() -> None:
    line = f"  1234/1234  12345.678901300:  1  branches:uH:  return  {'f' * 17} f+0x1a (/x)"
    [error] = PerfTextParser().feed([line])
    assert isinstance(error, DecodeError)
    assert (error.pid, error.tid, error.time) == (1234, 1234, 12345_678901300)
    [error] = PerfTextParser().feed([DAMAGED_LINES["time 2**64"]])
    assert isinstance(error, DecodeError)
    assert (error.pid, error.tid, error.time) == (1234, 1234, None)


def test_perf_text_other_lines_with_numbers_out_of_range() -> None:
    """Error lines keep what is in range; thread names, samples and digits that Python's
    ``str.isdigit`` takes but ``int`` refuses are damage or foreign text, not a crash."""
    parser = PerfTextParser()
    events = parser.feed(
        [
            " instruction trace error type 1 time 99999999999999999999.000000001 cpu 0 "
            "pid 99999999999 tid 5 ip 0x1ffffffffffffffff code 6: Trace doesn't match",
            "  5/5  1.000000000: PERF_RECORD_COMM exec: prog:4294967296/5",
            "  5/5  1.000000000: 1 cycles:u: ",
            "\t10000000000000000000 main+0x1 (/x)",
            "",
            "  5/5  1.000000000: ²  cycles:u: ",
            "  5/5  ².000000000:  1  branches:uH:" + CALL,
            "  5/5²  1.000000000:  1  branches:uH:" + CALL,
        ]
    )
    events += parser.finish()
    first = events[0]
    assert isinstance(first, DecodeError)
    assert (first.pid, first.tid, first.time, first.ip, first.code) == (None, None, None, None, 6)
    assert not any(isinstance(e, CommEvent | StackSample | PowerEvent) for e in events)
    assert parser.stats.decode_errors == 3
    _feed_engines(events)


def test_decode_of_perf_text_with_a_time_past_2_63_reports_a_decode_error(tmp_path: Path) -> None:
    text = "\n".join([GOOD[0], DAMAGED_LINES["time 2**64"], GOOD[1]]) + "\n"
    out = tmp_path / "t.fxt"
    result = ptscope("decode", "--perf-script", "-", "-o", str(out), stdin=text)
    assert result.returncode == 0, result.stderr
    assert "1 decode error" in result.stdout
    dumped = ptscope("dump", "--instants", str(out)).stdout
    assert "instant [decode error: time out of range in perf's text]" in dumped
