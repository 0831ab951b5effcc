"""Fuchsia Trace Format constants and pure encoders of words and records (no I/O).

Every record is a sequence of little-endian 64-bit words whose first word is a header::

    bits  0..3   record type
    bits  4..15  record size in words, header included (at most 4095)
    bits 16..63  fields that depend on the record type

Strings and threads are referred to through 16-bit string refs (0 = empty, 1..32767 = an
entry of the string table set by a string record) and 8-bit thread refs (1..255 = an entry
of the thread table). These encoders only take table refs, never inline strings or threads,
so every record's size is known from its arguments and checked against the 12-bit limit.
See ``docs/file-formats.md`` for the records ptscope writes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from enum import IntEnum
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "ARG_ADDRESS",
    "ARG_CONTINUED",
    "ARG_COUNTER_VALUE",
    "ARG_CYCLES",
    "ARG_FLAGS",
    "ARG_FULL_NAME",
    "ARG_INSTRUCTIONS",
    "ARG_PROCESS",
    "ARG_TIME_AXIS",
    "ARG_TIME_BASE",
    "CATEGORY",
    "CONTINUED_TEXT",
    "LONG_NAME",
    "MAGIC",
    "MAX_ARGS",
    "MAX_PROVIDER_NAME_BYTES",
    "MAX_RECORD_WORDS",
    "MAX_STRING_BYTES",
    "MAX_STRING_INDEX",
    "MAX_THREAD_INDEX",
    "PROVIDER_ID",
    "PROVIDER_NAME",
    "TICKS_PER_SECOND",
    "ArgType",
    "EventType",
    "KernelObjectType",
    "MetadataType",
    "RecordTooLargeError",
    "RecordType",
    "arg_double",
    "arg_header",
    "arg_i32",
    "arg_i64",
    "arg_koid",
    "arg_pointer",
    "arg_string",
    "arg_u32",
    "arg_u64",
    "event_header",
    "event_record",
    "flags_text",
    "full_name",
    "full_name_args",
    "full_name_key",
    "initialization_record",
    "kernel_object_record",
    "magic_record",
    "pack_words",
    "padded",
    "parse_flags_text",
    "provider_info_record",
    "provider_section_record",
    "record_header",
    "short_name",
    "string_record",
    "thread_record",
    "truncate_utf8",
    "utf8_pieces",
]

MAGIC: Final = 0x0016547846040010
"""The magic record: metadata, 1 word, trace-info type 0 (magic), value ``0x16547846``."""
MAX_RECORD_WORDS: Final = 0xFFF
"""The 12-bit size field: no record may be longer than 4095 words (32,760 bytes)."""
MAX_STRING_INDEX: Final = 0x7FFF
"""String table indices are 1..32767 (15 bits; the 16th bit of a ref means "inline")."""
MAX_THREAD_INDEX: Final = 0xFF
"""Thread table indices are 1..255."""
MAX_STRING_BYTES: Final = 32000
"""Longest string we write (the spec's recommended maximum); longer ones are truncated."""
MAX_ARGS: Final = 15
"""Arguments per event or kernel-object record (a 4-bit count)."""
MAX_PROVIDER_NAME_BYTES: Final = 0xFF
"""The provider-info record has an 8-bit name length."""

_MASK64: Final = (1 << 64) - 1


class RecordType(IntEnum):
    METADATA = 0
    INITIALIZATION = 1
    STRING = 2
    THREAD = 3
    EVENT = 4
    BLOB = 5
    USERSPACE_OBJECT = 6
    KERNEL_OBJECT = 7
    SCHEDULING = 8
    LOG = 9
    LARGE = 15


class MetadataType(IntEnum):
    PROVIDER_INFO = 1
    PROVIDER_SECTION = 2
    PROVIDER_EVENT = 3
    TRACE_INFO = 4


class EventType(IntEnum):
    INSTANT = 0
    COUNTER = 1
    DURATION_BEGIN = 2
    DURATION_END = 3
    DURATION_COMPLETE = 4
    ASYNC_BEGIN = 5
    ASYNC_INSTANT = 6
    ASYNC_END = 7
    FLOW_BEGIN = 8
    FLOW_STEP = 9
    FLOW_END = 10


class ArgType(IntEnum):
    NULL = 0
    I32 = 1
    U32 = 2
    I64 = 3
    U64 = 4
    DOUBLE = 5
    STRING = 6
    POINTER = 7
    KOID = 8
    BOOL = 9
    BLOB = 10


class KernelObjectType(IntEnum):
    """Zircon object types; only these two name things in a trace we write."""

    PROCESS = 1
    THREAD = 2


class RecordTooLargeError(ValueError):
    """A record would not fit the 12-bit size field (a bug in the caller)."""


def record_header(record_type: int, size_words: int, fields: int = 0) -> int:
    """The header word; ``fields`` holds bits 16..63 already shifted into place."""
    if not 1 <= size_words <= MAX_RECORD_WORDS:
        raise RecordTooLargeError(
            f"record of type {record_type} would be {size_words} words "
            f"(the limit is {MAX_RECORD_WORDS})"
        )
    return record_type | (size_words << 4) | fields


_PACKERS: dict[int, struct.Struct] = {}


def pack_words(words: Sequence[int]) -> bytes:
    """Little-endian 64-bit words (negative values are written as two's complement)."""
    packer = _PACKERS.get(len(words))
    if packer is None:
        packer = _PACKERS[len(words)] = struct.Struct(f"<{len(words)}Q")
    try:
        return packer.pack(*words)
    except struct.error:  # a negative value (rare: masking every word costs more)
        return packer.pack(*[w & _MASK64 for w in words])


def padded(data: bytes) -> bytes:
    """``data`` followed by zeros up to a multiple of 8 bytes (a string stream)."""
    return data + b"\0" * (-len(data) % 8)


def truncate_utf8(text: str, limit: int = MAX_STRING_BYTES) -> bytes:
    """``text`` as UTF-8, cut to at most ``limit`` bytes without splitting a character."""
    # "replace": a lone surrogate (from a surrogateescape-decoded name) must not make
    # invalid UTF-8.
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return data
    cut = limit
    # Back up over continuation bytes (10xxxxxx) to the start of the character that was cut.
    while cut > 0 and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return data[:cut]


def short_name(name: str) -> str:
    """A name of more than :data:`LONG_NAME` characters as a slice shows it: its start and
    its end around a visible ``[N characters cut]`` (the whole name goes in an arg)."""
    if len(name) <= LONG_NAME:
        return name
    head, tail = LONG_NAME * 3 // 5, LONG_NAME // 5
    cut = len(name) - head - tail
    return f"{name[:head]} … [{cut:,} characters cut] … {name[-tail:]}"


def utf8_pieces(text: str, limit: int = MAX_STRING_BYTES) -> list[str]:
    """``text`` in pieces of at most ``limit`` UTF-8 bytes, cut between characters."""
    data = text.encode("utf-8", "replace")
    pieces = []
    while data:
        cut = min(limit, len(data))
        while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
            cut -= 1  # back up to the start of the character that was cut
        pieces.append(data[:cut].decode("utf-8"))
        data = data[cut:]
    return pieces


def full_name_key(piece: int) -> str:
    """The arg holding piece ``piece`` (0, 1, ...) of a shortened name."""
    return ARG_FULL_NAME if piece == 0 else f"{ARG_FULL_NAME}_{piece + 1}"


def full_name_args(name: str) -> dict[str, str]:
    """The ``full_name`` args of a slice named ``name`` (none when it is not long)."""
    if len(name) <= LONG_NAME:
        return {}
    return {full_name_key(k): piece for k, piece in enumerate(utf8_pieces(name))}


def full_name(shown: str, args: Mapping[str, object]) -> str:
    """The whole name of a slice shown as ``shown`` with ``args`` (its pieces joined)."""
    pieces: list[str] = []
    while isinstance(piece := args.get(full_name_key(len(pieces))), str):
        pieces.append(piece)
    return "".join(pieces) if pieces else shown


def magic_record() -> bytes:
    return pack_words([MAGIC])


def provider_info_record(provider_id: int, name: str) -> bytes:
    """Provider info: a provider id and its name (at most 255 bytes)."""
    data = truncate_utf8(name, MAX_PROVIDER_NAME_BYTES)
    stream = padded(data)
    fields = (MetadataType.PROVIDER_INFO << 16) | (provider_id << 20) | (len(data) << 52)
    header = record_header(RecordType.METADATA, 1 + len(stream) // 8, fields)
    return pack_words([header]) + stream


def provider_section_record(provider_id: int) -> bytes:
    fields = (MetadataType.PROVIDER_SECTION << 16) | (provider_id << 20)
    return pack_words([record_header(RecordType.METADATA, 1, fields)])


def initialization_record(ticks_per_second: int) -> bytes:
    return pack_words([record_header(RecordType.INITIALIZATION, 2), ticks_per_second])


def string_record(index: int, data: bytes) -> bytes:
    """Sets string table entry ``index`` (1..32767) to ``data`` (UTF-8, ≤ 32,000 bytes)."""
    if not 1 <= index <= MAX_STRING_INDEX:
        raise ValueError(f"string index {index} is outside 1..{MAX_STRING_INDEX}")
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(f"string of {len(data)} bytes is longer than {MAX_STRING_BYTES}")
    stream = padded(data)
    header = record_header(
        RecordType.STRING, 1 + len(stream) // 8, (index << 16) | (len(data) << 32)
    )
    return pack_words([header]) + stream


def thread_record(index: int, pid: int, tid: int) -> bytes:
    """Sets thread table entry ``index`` (1..255) to (pid, tid)."""
    if not 1 <= index <= MAX_THREAD_INDEX:
        raise ValueError(f"thread index {index} is outside 1..{MAX_THREAD_INDEX}")
    return pack_words([record_header(RecordType.THREAD, 3, index << 16), pid, tid])


def arg_header(arg_type: int, size_words: int, name_ref: int, payload: int = 0) -> int:
    """An argument's first word; ``payload`` goes in bits 32..63."""
    return arg_type | (size_words << 4) | (name_ref << 16) | ((payload & 0xFFFFFFFF) << 32)


def arg_i32(name_ref: int, value: int) -> bytes:
    return pack_words([arg_header(ArgType.I32, 1, name_ref, value)])


def arg_u32(name_ref: int, value: int) -> bytes:
    return pack_words([arg_header(ArgType.U32, 1, name_ref, value)])


def arg_i64(name_ref: int, value: int) -> bytes:
    return pack_words([arg_header(ArgType.I64, 2, name_ref), value])


def arg_u64(name_ref: int, value: int) -> bytes:
    return pack_words([arg_header(ArgType.U64, 2, name_ref), value])


def arg_double(name_ref: int, value: float) -> bytes:
    return pack_words([arg_header(ArgType.DOUBLE, 2, name_ref)]) + struct.pack("<d", value)


def arg_string(name_ref: int, value_ref: int) -> bytes:
    return pack_words([arg_header(ArgType.STRING, 1, name_ref, value_ref)])


def arg_pointer(name_ref: int, value: int) -> bytes:
    return pack_words([arg_header(ArgType.POINTER, 2, name_ref), value])


def arg_koid(name_ref: int, value: int) -> bytes:
    return pack_words([arg_header(ArgType.KOID, 2, name_ref), value])


def event_header(
    event_type: int,
    size_words: int,
    nargs: int,
    thread_ref: int,
    category_ref: int,
    name_ref: int,
) -> int:
    if nargs > MAX_ARGS:
        raise RecordTooLargeError(f"{nargs} arguments (the limit is {MAX_ARGS})")
    fields = (
        (event_type << 16)
        | (nargs << 20)
        | (thread_ref << 24)
        | (category_ref << 32)
        | (name_ref << 48)
    )
    return record_header(RecordType.EVENT, size_words, fields)


def event_record(
    event_type: int,
    thread_ref: int,
    category_ref: int,
    name_ref: int,
    timestamp: int,
    args: Sequence[bytes] = (),
    trailing: Sequence[int] = (),
) -> bytes:
    """An event: header, timestamp (ticks), encoded ``args``, then the type's own words
    (``trailing``: the counter id, the complete event's end time, a correlation id)."""
    body = b"".join(args)
    size = 2 + len(body) // 8 + len(trailing)
    header = event_header(event_type, size, len(args), thread_ref, category_ref, name_ref)
    return pack_words([header, timestamp]) + body + pack_words(trailing)


def kernel_object_record(
    object_type: int, koid: int, name_ref: int, args: Sequence[bytes] = ()
) -> bytes:
    """Names a process (koid = pid) or a thread (koid = tid, with a ``process`` koid arg)."""
    if len(args) > MAX_ARGS:
        raise RecordTooLargeError(f"{len(args)} arguments (the limit is {MAX_ARGS})")
    body = b"".join(args)
    fields = (object_type << 16) | (name_ref << 24) | (len(args) << 40)
    header = record_header(RecordType.KERNEL_OBJECT, 2 + len(body) // 8, fields)
    return pack_words([header, koid]) + body


# ---------------------------------------------------------------------------------------
# ptscope's conventions on top of the format (documented in docs/file-formats.md).

TICKS_PER_SECOND: Final = 1_000_000_000
"""We write 1 tick = 1 ns (times are perf nanoseconds minus the trace's time base)."""
PROVIDER_ID: Final = 0
PROVIDER_NAME: Final = "ptscope"
CATEGORY: Final = "ptscope"
"""The category of every event we write."""
ARG_TIME_BASE: Final = "time_base_ns"
"""i64 arg on every process kernel object: the perf time (ns) that tick 0 stands for."""
ARG_PROCESS: Final = "process"
"""koid arg on a thread kernel object: the pid it belongs to (the Fuchsia convention)."""
ARG_ADDRESS: Final = "address"
"""pointer arg on a slice: the function's entry address (absent when unknown)."""
ARG_INSTRUCTIONS: Final = "instructions"
"""u64 arg on a slice: instructions retired inside it (absent when unknown)."""
ARG_CYCLES: Final = "cycles"
"""u64 arg on a slice: cycles spent inside it (absent when unknown)."""
ARG_ICACHE_LINES: Final = "icache_lines"
"""u64 arg on a slice: distinct 64-byte lines of code it executed, callees included (absent
when unknown: without instruction detail)."""
ARG_DRILL: Final = "drill"
"""string arg on a slice: the ``ptscope insns`` command that lists its instructions (only
when the recording is kept)."""
ARG_FLAGS: Final = "flags"
"""string arg on a slice: its ``SliceFlags`` as ``inferred_start|open_at_end`` (absent when
none are set); unnamed bits read ``bit<N>``."""
ARG_CALL_SITE: Final = "call_site"
"""string arg on an inlined slice (``flags`` ``inlined``): where the function was inlined
into the one around it, ``file:line``."""
ARG_COUNTER_VALUE: Final = "value"
ARG_TIME_AXIS: Final = "time_axis"
"""string arg on process records when ticks are not ns: "instructions" or "cycles"."""
ARG_CONTINUED: Final = "continued"
"""string arg on a slice cut at the boundary of a split trace's part (absent otherwise)."""
ARG_FULL_NAME: Final = "full_name"
"""string arg on a slice whose name is longer than :data:`LONG_NAME`: the whole name (its
name says ``[N characters cut]``). A name over :data:`MAX_STRING_BYTES` continues in args
``full_name_2``, ``full_name_3``... (join them in order)."""
LONG_NAME: Final = 1000
"""Slice names longer than this many characters are shortened (see :func:`short_name`)."""
CONTINUED_TEXT: Final = {
    1: "from previous part",
    2: "in next part",
    3: "from previous part, in next part",
}
"""The one arg of a counter event (Perfetto names the track ``<counter name>:value``)."""

_FLAG_NAMES: Final = {1: "inferred_start", 2: "open_at_end", 4: "synthetic", 8: "inlined"}
"""``ptscope.timeline.SliceFlags`` bit -> the word written for it (kept in step by a test)."""


def flags_text(flags: int) -> str:
    """The text of the ``flags`` arg for a non-zero ``SliceFlags`` value."""
    words = []
    bit = 0
    while flags >> bit:
        if (flags >> bit) & 1:
            words.append(_FLAG_NAMES.get(1 << bit, f"bit{bit}"))
        bit += 1
    return "|".join(words)


def parse_flags_text(text: str) -> int:
    """Inverse of :func:`flags_text`; raises ValueError on a word it does not know."""
    by_name = {name: bit for bit, name in _FLAG_NAMES.items()}
    value = 0
    for word in text.split("|"):
        if word in by_name:
            value |= by_name[word]
        elif word.startswith("bit") and word[3:].isdigit():
            value |= 1 << int(word[3:])
        else:
            raise ValueError(f"unknown slice flag {word!r}")
    return value


_DIGITS3: Final = np.array(
    [[48 + n // 100, 48 + n // 10 % 10, 48 + n % 10] for n in range(1000)], dtype=np.uint8
)
"""The ASCII digits of 000..999."""


_HEX_DIGITS: Final = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_DECIMAL_LIMITS: Final = np.array([10**k for k in range(1, 19)], dtype=np.int64)
_HEX_LIMITS: Final = np.array([16**k for k in range(1, 16)], dtype=np.uint64)


def decimal_widths(values: npt.NDArray[np.int64]) -> npt.NDArray[np.intp]:
    """The number of decimal digits of each value (>= 0)."""
    return 1 + np.searchsorted(_DECIMAL_LIMITS, values, side="right")


def hex_widths(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.intp]:
    """The number of hexadecimal digits of each value."""
    return 1 + np.searchsorted(_HEX_LIMITS, values, side="right")


def _put_decimal(
    out: npt.NDArray[np.uint8], column: int, value: npt.NDArray[np.int64], digits: int
) -> None:
    """Write ``value`` as ``digits`` zero-filled decimal digits at ``column`` of each row:
    right to left, three digits at a time from a table (a third of the divisions)."""
    rest = value
    d = digits
    while d > 0:
        rest, group = np.divmod(rest, 1000)
        take = min(3, d)
        out[:, column + d - take : column + d] = _DIGITS3[group, 3 - take :]
        d -= take


def _put_time(
    out: npt.NDArray[np.uint8], column: int, times: npt.NDArray[np.int64], width: int
) -> None:
    """Write perf times as ``SEC.NSEC`` (seconds zero-filled to ``width``) at ``column``."""
    sec, nsec = np.divmod(np.maximum(times, 0), 1_000_000_000)
    _put_decimal(out, column, sec, width)
    out[:, column + width] = ord(".")
    _put_decimal(out, column + width + 1, nsec, 9)


def _put_hex(
    out: npt.NDArray[np.uint8], column: int, value: npt.NDArray[np.uint64], digits: int
) -> None:
    """Write ``value`` as ``digits`` zero-filled lowercase hex digits at ``column``."""
    for k in range(digits):
        nibble = (value >> np.uint64(4 * k)) & np.uint64(15)
        out[:, column + digits - 1 - k] = _HEX_DIGITS[nibble]


def drill_strings(
    prefix: str,
    perf_start: npt.NDArray[np.int64],
    perf_end: npt.NDArray[np.int64],
    anchor_ip: npt.NDArray[np.uint64] | None = None,
    anchor_occurrence: npt.NDArray[np.int64] | None = None,
    count: npt.NDArray[np.int64] | None = None,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64]]:
    """Inline string values ``PREFIX + START,END`` (perf times as ``SEC.NSEC``, 9 digits
    after the point), one per slice, built with numpy (a Python loop per slice would cost
    more than the rest of the encoding). Seconds have the width of the largest, zero-filled
    (``ptscope insns`` reads them as numbers). A slice with an anchor (occurrence > 0) and
    a count (> 0) has ``PREFIX + START --after 0xADDRESS:OCCURRENCE --count COUNT`` (no
    leading zeros; its end is where the count ends). Returns each string's length in bytes
    and an ``(n, words)`` array of their bytes, zero after each string's end (as many
    words as the longest needs)."""
    head = prefix.encode()
    n = len(perf_start)
    latest = max(int(perf_start.max(initial=0)), int(perf_end.max(initial=0)))
    width = len(str(latest // 1_000_000_000))
    field = width + 10  # SEC.NSEC
    base = len(head) + 2 * field + 1
    anchored = len(head) + field  # where an anchored slice's tail begins
    lengths = np.full(n, base, dtype=np.int64)
    rows = np.zeros(0, dtype=np.intp)
    ranged = np.ones(n, dtype=bool)  # the slices with START,END
    if anchor_ip is not None and anchor_occurrence is not None and count is not None:
        ranged = ~((anchor_occurrence > 0) & (count > 0))
        rows = np.flatnonzero(~ranged)
        address_w = hex_widths(anchor_ip[rows])
        occurrence_w = decimal_widths(anchor_occurrence[rows])
        count_w = decimal_widths(count[rows])
        fixed = len(_AFTER) + len(_OCCURRENCE) + len(_COUNT)
        lengths[rows] = anchored + fixed + address_w + occurrence_w + count_w
    words = -(-int(lengths.max(initial=base)) // 8)
    out = np.zeros((n, words * 8), dtype=np.uint8)
    out[:, : len(head)] = np.frombuffer(head, dtype=np.uint8)
    _put_time(out, len(head), perf_start, width)
    if ranged.any():
        part = out[ranged]  # (a copy: written back below)
        part[:, anchored] = ord(",")
        _put_time(part, anchored + 1, perf_end[ranged], width)
        out[ranged] = part
    if rows.size:
        assert anchor_ip is not None and anchor_occurrence is not None and count is not None
        # The rows whose three numbers have the same widths share one layout: a handful
        # of groups, each filled as columns.
        layout = (address_w << 16) | (occurrence_w << 8) | count_w
        for key in np.unique(layout).tolist():
            group = rows[layout == key]
            widths = (key >> 16, (key >> 8) & 0xFF, key & 0xFF)
            tail = np.zeros((len(group), int(lengths[group[0]]) - anchored), dtype=np.uint8)
            at = 0
            for text, digits, value in zip(
                (_AFTER, _OCCURRENCE, _COUNT),
                widths,
                (anchor_ip[group], anchor_occurrence[group], count[group]),
                strict=True,
            ):
                tail[:, at : at + len(text)] = np.frombuffer(text, dtype=np.uint8)
                at += len(text)
                if text is _AFTER:
                    _put_hex(tail, at, value.astype(np.uint64), digits)
                else:
                    _put_decimal(tail, at, value.astype(np.int64), digits)
                at += digits
            out[group, anchored : anchored + tail.shape[1]] = tail
    return lengths, out.view(np.uint64).reshape(n, words)


_AFTER: Final = b" --after 0x"
_OCCURRENCE: Final = b":"
_COUNT: Final = b" --count "
