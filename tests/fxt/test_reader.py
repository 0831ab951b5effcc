"""The strict reader on hand-built byte streams: what it accepts, skips and rejects."""

from __future__ import annotations

import gzip
import struct

import pytest

from ptscope.fxt import FxtFormatError, read_trace
from ptscope.fxt import records as rec

HEAD = (
    rec.magic_record()
    + rec.provider_info_record(0, "test")
    + rec.provider_section_record(0)
    + rec.initialization_record(1_000_000_000)
)
AFTER_HEAD = len(HEAD)  # 48: the offset of the first record after these four
THREAD = rec.thread_record(1, 10, 11)
NAME = rec.string_record(1, b"f")


def q(*words: int) -> bytes:
    return struct.pack(f"<{len(words)}Q", *[w & (1 << 64) - 1 for w in words])


def complete(start: int, end: int, name_ref: int = 1, thread_ref: int = 1) -> bytes:
    return rec.event_record(rec.EventType.DURATION_COMPLETE, thread_ref, 0, name_ref, start,
                            trailing=[end])  # fmt: skip


def test_header_alone_is_an_empty_trace() -> None:
    trace = read_trace(HEAD)
    assert trace.providers == {0: "test"} and trace.slices == {}
    assert trace.record_counts["magic"] == 1


@pytest.mark.parametrize(
    ("data", "message", "offset"),
    [
        (b"", "empty file", None),
        (b"hello, world\n", "not a Fuchsia trace", None),
        (HEAD[8:], "not a Fuchsia trace", None),
        (HEAD + q(0x4), "record of size 0", AFTER_HEAD),
        (HEAD + THREAD[:20], "truncated record", AFTER_HEAD),
        (HEAD + b"\x01\x02\x03", "truncated record header", AFTER_HEAD),
        (HEAD + THREAD + complete(0, 5), "string ref 1 was never set", AFTER_HEAD + 24),
        (HEAD + NAME + complete(0, 5, thread_ref=2), "thread ref 2 was never set",
         AFTER_HEAD + 16),
        (HEAD + rec.string_record(1, b"\xff\xfe"), "not valid UTF-8", AFTER_HEAD),
        (HEAD + THREAD + NAME + complete(9, 5), "ends before it starts", AFTER_HEAD + 40),
        # A complete event whose size field leaves out its end word.
        (HEAD + THREAD + NAME + q(0x0001_0000_0104_0024, 0, 5), "shorter", AFTER_HEAD + 40),
        # ... and one that claims a word more than it has contents for.
        (HEAD + THREAD + NAME + q(0x0001_0000_0104_0044, 0, 5, 0), "size field says",
         AFTER_HEAD + 40),
        # An i64 argument whose size field says 1 word.
        (HEAD + THREAD + NAME + q(0x0001_0000_0114_0044, 0, 0x1_0013, 7) + q(5), "says 1 words",
         AFTER_HEAD + 40),
        (HEAD + q(rec.MAGIC & ~(0xFF << 24)), "bad magic", AFTER_HEAD),
        (HEAD + rec.string_record(1, b"") + q(0x12), "string record for index 0", AFTER_HEAD + 8),
    ],
)  # fmt: skip
def test_malformed_input_is_an_error_at_its_offset(
    data: bytes, message: str, offset: int | None
) -> None:
    with pytest.raises(FxtFormatError, match=message) as info:
        read_trace(data)
    assert info.value.offset == offset


def test_unknown_records_are_skipped_by_their_size() -> None:
    blob = q(0x25 | (3 << 32) | (1 << 48)) + b"abc" + b"\0" * 5  # blob type 1, 3 bytes
    log = q((3 << 16) | (1 << 32) | 0x39, 77) + b"hey\0\0\0\0\0"  # log: time, msg
    future = q(0x2A, 1)  # record type 10, 2 words
    large = q(0x0000_0000_0000_003F, 1, 2)  # large record (type 15), 3 words (32-bit size)
    provider_event = q(0x0000_0000_0003_0010)
    unknown_arg = q(0x2A, 123)  # blob arg (10), 2 words, unnamed
    instant = q(0x0001_0000_0110_0044, 5) + unknown_arg
    data = HEAD + THREAD + NAME + blob + log + future + large + provider_event + instant
    trace = read_trace(data)
    counts = trace.record_counts
    assert counts["skipped:blob"] == 1 and counts["skipped:log"] == 1
    assert counts["skipped:type-10"] == 1 and counts["skipped:large"] == 1
    assert counts["skipped:metadata-3"] == 1
    (instant_read,) = trace.instants[(10, 11)]
    assert (instant_read.time, instant_read.name, instant_read.args) == (5, "f", {"": None})


def test_inline_strings_and_threads_are_read() -> None:
    """Other writers put strings and threads inline; ptscope never does but reads them."""
    name_ref = 0x8000 | 5  # inline, 5 bytes
    # A string arg of 3 words: header, inline name "key", inline value "vv".
    arg = q(0x0000_8002_8003_0036) + b"key\0\0\0\0\0" + b"vv\0\0\0\0\0\0"
    header = (
        rec.RecordType.EVENT
        | (9 << 4)
        | (rec.EventType.DURATION_COMPLETE << 16)
        | (1 << 20)
        | (0 << 24)  # inline thread
        | (name_ref << 48)
    )
    record = q(header, 100, 3, 4) + b"hello\0\0\0" + arg + q(250)
    trace = read_trace(HEAD + record)
    (s,) = trace.slices[(3, 4)]
    assert (s.start, s.end, s.name, s.args) == (100, 250, "hello", {"key": "vv"})


def test_other_tick_rates_and_gzip() -> None:
    head = HEAD.replace(rec.initialization_record(1_000_000_000), rec.initialization_record(1000))
    data = head + THREAD + NAME + complete(2, 3)
    trace = read_trace(gzip.compress(data))
    assert [(s.start, s.end) for s in trace.slices[(10, 11)]] == [(2_000_000, 3_000_000)]
    with pytest.raises(FxtFormatError, match="cannot decompress"):
        read_trace(gzip.compress(data)[:-12])


def test_time_base_from_process_records() -> None:
    def process(pid: int, base: int) -> bytes:
        return rec.kernel_object_record(
            rec.KernelObjectType.PROCESS, pid, 0, [rec.arg_i64(2, base)]
        )

    base_name = rec.string_record(2, rec.ARG_TIME_BASE.encode())
    data = HEAD + THREAD + NAME + base_name + process(10, 1000) + complete(2, 3)
    trace = read_trace(data + process(11, 1000))
    assert trace.time_base == 1000 and trace.processes == {10: "", 11: ""}
    assert [(s.start, s.end) for s in trace.slices[(10, 11)]] == [(1002, 1003)]
    with pytest.raises(FxtFormatError, match="disagree on the time base"):
        read_trace(data + process(11, 999))


def test_thread_names_need_their_process() -> None:
    process = rec.string_record(2, b"process")
    named = rec.kernel_object_record(rec.KernelObjectType.THREAD, 11, 1, [rec.arg_koid(2, 10)])
    assert read_trace(HEAD + NAME + process + named).threads == {(10, 11): "f"}
    unnamed = rec.kernel_object_record(rec.KernelObjectType.THREAD, 11, 1, [])
    with pytest.raises(FxtFormatError, match="has no 'process' koid"):
        read_trace(HEAD + NAME + unnamed)


def begin(t: int, name_ref: int = 1) -> bytes:
    return rec.event_record(rec.EventType.DURATION_BEGIN, 1, 0, name_ref, t)


def end(t: int, name_ref: int = 1) -> bytes:
    return rec.event_record(rec.EventType.DURATION_END, 1, 0, name_ref, t)


def test_begin_end_matching_is_strict() -> None:
    g = rec.string_record(2, b"g")
    base = HEAD + THREAD + NAME + g
    ok = read_trace(base + begin(0) + begin(1, 2) + end(2, 0) + end(3))  # unnamed end: fine
    assert [(s.start, s.end, s.depth, s.name) for s in ok.slices[(10, 11)]] == [
        (0, 3, 0, "f"),
        (1, 2, 1, "g"),
    ]
    # Records out of time order are matched in time order (as Perfetto sorts them).
    shuffled = read_trace(base + end(3) + begin(1, 2) + begin(0) + end(2, 2))
    assert shuffled.slices == ok.slices
    with pytest.raises(FxtFormatError, match="without a begin"):
        read_trace(base + end(3))
    with pytest.raises(FxtFormatError, match="never end"):
        read_trace(base + begin(0))
    with pytest.raises(FxtFormatError, match="closes 'g'"):
        read_trace(base + begin(0) + begin(1, 2) + end(2))


def test_depth_follows_perfetto_nesting() -> None:
    """Children start inside their parent; a slice ending at or before the next start is
    closed first (so an empty slice has no children); overlap is an error."""
    base = HEAD + THREAD + NAME
    trace = read_trace(
        base
        + complete(0, 10)
        + complete(0, 10)  # same interval: a child
        + complete(2, 2)  # empty: a child of the second
        + complete(2, 4)  # the empty one is closed: a sibling of it
        + complete(10, 10)  # at the end of the first two: a root
        + complete(10, 12)  # after an empty slice: a root
    )
    got = [(s.start, s.end, s.depth) for s in trace.slices[(10, 11)]]
    assert got == [(0, 10, 0), (0, 10, 1), (2, 2, 2), (2, 4, 2), (10, 10, 0), (10, 12, 0)]
    with pytest.raises(FxtFormatError, match="overlaps"):
        read_trace(base + complete(0, 10) + complete(5, 11))


def test_each_provider_has_its_own_tables_and_tick_rate() -> None:
    """Index 1 means "f" in provider 0 and "g" in provider 5 (1 tick = 1 us there)."""
    data = (
        HEAD + THREAD + NAME
        + rec.provider_info_record(5, "other") + rec.initialization_record(1_000_000)
        + rec.thread_record(1, 20, 21) + rec.string_record(1, b"g") + complete(1, 2)
        + rec.provider_section_record(0) + complete(1, 2)
    )  # fmt: skip
    trace = read_trace(data)
    assert trace.providers == {0: "test", 5: "other"}
    assert [(s.start, s.end, s.name) for s in trace.slices[(20, 21)]] == [(1000, 2000, "g")]
    assert [(s.start, s.end, s.name) for s in trace.slices[(10, 11)]] == [(1, 2, "f")]
    with pytest.raises(FxtFormatError, match="section of provider 7 before its info"):
        read_trace(HEAD + rec.provider_section_record(7))
