"""Record encoders against words worked out by hand from the Fuchsia trace format spec."""

from __future__ import annotations

import struct

import pytest

from ptscope.fxt import records as rec


def words(data: bytes) -> list[int]:
    assert len(data) % 8 == 0
    return list(struct.unpack(f"<{len(data) // 8}Q", data))


def test_magic_record_bytes() -> None:
    # Metadata (type 0), 1 word, trace-info (4), type magic (0), value "FxT\x16".
    assert rec.magic_record() == bytes([0x10, 0x00, 0x04, 0x46, 0x78, 0x54, 0x16, 0x00])


def test_provider_info_and_section() -> None:
    # type 0 | 2 words << 4 | provider info (1) << 16 | id 0 << 20 | name length 7 << 52
    assert rec.provider_info_record(0, "ptscope") == (
        bytes.fromhex("2000010000007000") + b"ptscope\0"
    )
    # type 0 | 1 word | provider section (2) << 16 | id 3 << 20
    assert words(rec.provider_section_record(3)) == [0x0000_0000_0032_0010]


def test_initialization_record() -> None:
    # type 1 | 2 words << 4, then ticks per second
    assert words(rec.initialization_record(1_000_000_000)) == [0x21, 0x3B9A_CA00]


def test_string_record() -> None:
    # type 2 | 2 words << 4 | index 1 << 16 | length 3 << 32, then "abc" padded to 8
    assert rec.string_record(1, b"abc") == bytes.fromhex("2200010003000000") + b"abc" + 5 * b"\0"
    # exactly 8 bytes: no padding word; the largest index
    assert words(rec.string_record(0x7FFF, b"12345678"))[0] == 0x0000_0008_7FFF_0022
    with pytest.raises(ValueError):
        rec.string_record(0, b"x")
    with pytest.raises(ValueError):
        rec.string_record(0x8000, b"x")
    with pytest.raises(ValueError):
        rec.string_record(1, b"x" * 32_001)


def test_thread_record() -> None:
    # type 3 | 3 words << 4 | index 5 << 16, then pid, tid
    assert words(rec.thread_record(5, 0x10, 0x11)) == [0x5_0033, 0x10, 0x11]
    assert words(rec.thread_record(255, -1, 2)) == [0xFF_0033, (1 << 64) - 1, 2]
    with pytest.raises(ValueError):
        rec.thread_record(256, 1, 1)


def test_complete_event_without_args() -> None:
    # type 4 | 3 words << 4 | complete (4) << 16 | 0 args << 20 | thread 1 << 24
    # | category 2 << 32 | name 3 << 48; then start tick, end tick
    data = rec.event_record(rec.EventType.DURATION_COMPLETE, 1, 2, 3, 10, trailing=[30])
    assert words(data) == [0x0003_0002_0104_0034, 10, 30]


def test_event_with_arguments() -> None:
    # instant (0) with an i64 arg (name 4, value -1) and a string arg (name 5, value 6):
    # 2 + 2 + 1 = 5 words, 2 args.
    data = rec.event_record(
        rec.EventType.INSTANT, 7, 0, 9, 123, [rec.arg_i64(4, -1), rec.arg_string(5, 6)]
    )
    assert words(data) == [
        0x0009_0000_0720_0054,
        123,
        0x0004_0023,  # i64 (3) | 2 words << 4 | name 4 << 16
        0xFFFF_FFFF_FFFF_FFFF,
        0x0000_0006_0005_0016,  # string (6) | 1 word << 4 | name 5 << 16 | value 6 << 32
    ]


def test_argument_encodings() -> None:
    assert words(rec.arg_i32(1, -2)) == [0xFFFF_FFFE_0001_0011]
    assert words(rec.arg_u32(1, 7)) == [0x0000_0007_0001_0012]
    assert words(rec.arg_u64(2, 1 << 63)) == [0x2_0024, 1 << 63]
    assert words(rec.arg_double(3, 1.5)) == [0x3_0025, 0x3FF8_0000_0000_0000]
    assert words(rec.arg_pointer(4, 0x401000)) == [0x4_0027, 0x401000]
    assert words(rec.arg_koid(5, 9)) == [0x5_0028, 9]


def test_counter_event() -> None:
    # counter (1), thread 2, category 1, name 8, one i64 arg "value" (name 3) = 42,
    # then the counter id: 5 words.
    data = rec.event_record(rec.EventType.COUNTER, 2, 1, 8, 50, [rec.arg_i64(3, 42)], [0])
    assert words(data) == [0x0008_0001_0211_0054, 50, 0x3_0023, 42, 0]


def test_kernel_object_record() -> None:
    # type 7 | 4 words << 4 | thread (2) << 16 | name 6 << 24 | 1 arg << 40; koid 7;
    # koid arg (8) | 2 words << 4 | name 5 << 16; value 9
    data = rec.kernel_object_record(rec.KernelObjectType.THREAD, 7, 6, [rec.arg_koid(5, 9)])
    assert words(data) == [0x0000_0100_0602_0047, 7, 0x5_0028, 9]


def test_no_record_over_4095_words() -> None:
    with pytest.raises(rec.RecordTooLargeError):
        rec.record_header(rec.RecordType.EVENT, 4096)
    with pytest.raises(rec.RecordTooLargeError):
        rec.record_header(rec.RecordType.EVENT, 0)
    with pytest.raises(rec.RecordTooLargeError):
        rec.event_record(rec.EventType.INSTANT, 1, 0, 0, 0, [rec.arg_u32(1, 0)] * 16)
    big_args = [rec.arg_string(1, 1) + b"\0" * 8 * 300] * 14  # args are opaque here
    with pytest.raises(rec.RecordTooLargeError):
        rec.event_record(rec.EventType.INSTANT, 1, 0, 0, 0, big_args)


def test_truncate_utf8() -> None:
    assert rec.truncate_utf8("abc", 2) == b"ab"
    assert rec.truncate_utf8("aé", 2) == b"a"  # never half a character
    assert rec.truncate_utf8("€€", 5) == "€".encode()
    assert rec.truncate_utf8("x" * 32_001) == b"x" * 32_000
    assert rec.truncate_utf8("\udcff") == b"?"  # a lone surrogate (surrogateescape)
