"""The dlfilter record stream's layout: the Python mirror of ``_native/record_format.h``.

Each record is described once as a numpy structured dtype (field names and offsets as in the
C structs; a test compiles the header and compares sizes and offsets). Readers use the
dtypes for bulk decoding and the derived :class:`struct.Struct` objects for single records.
The format is documented in ``docs/file-formats.md`` ("dlfilter record stream").
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

__all__ = [
    "BRANCH",
    "BRANCH_DTYPE",
    "CHUNK",
    "CHUNK_DTYPE",
    "HEADER",
    "HEADER_DTYPE",
    "INSNS_BRANCH",
    "INSNS_BRANCH_DTYPE",
    "INSNS_BRANCH_LAYOUT",
    "LAYOUTS",
    "LINES",
    "LINES_DTYPE",
    "LINES_PER_RECORD",
    "LINE_RANGE_DTYPE",
    "LOCATION",
    "LOCATION_DTYPE",
    "MAGIC",
    "NO_CHUNK",
    "NO_OFFSET",
    "NO_STRING",
    "OPT_INSNS",
    "OPT_KEEP_ALL",
    "POWER",
    "POWER_DTYPE",
    "STREAM_VERSION",
    "STRING",
    "STRING_DTYPE",
    "TAG_BRANCH",
    "TAG_CHUNK",
    "TAG_HEADER",
    "TAG_LINES",
    "TAG_LOCATION",
    "TAG_POWER",
    "TAG_STRING",
    "TAG_TRAILER",
    "TRAILER",
    "TRAILER_DTYPE",
    "TRAILER_FIELDS",
]

MAGIC: Final = b"PTSCOPE"
STREAM_VERSION: Final = 6

# Tag bytes: never the first byte of a UTF-8 character, so no text line starts with one.
TAG_CHUNK: Final = 0xF7  # ring mode, on perf's stdout only (decode/record_ring.py)
TAG_HEADER: Final = 0xF8
TAG_STRING: Final = 0xF9
TAG_LOCATION: Final = 0xFA
TAG_BRANCH: Final = 0xFB
TAG_POWER: Final = 0xFC
TAG_TRAILER: Final = 0xFD
TAG_LINES: Final = 0xFE

NO_STRING: Final = 0
"""String id meaning "no name" (unknown symbol, no DSO)."""
NO_OFFSET: Final = -1
"""Symbol offset of an address whose symbol is unknown."""
OPT_KEEP_ALL: Final = 1
"""Header option bit: the filter kept same-function jumps."""
OPT_INSNS: Final = 2
"""Header option bit: instruction detail (exact counts, lines records)."""
LINES_PER_RECORD: Final = 5
"""Line ranges a lines record holds."""


def _dtype(fields: list[tuple[str, str]], size: int) -> np.dtype[np.void]:
    names: list[str] = []
    formats: list[str] = []
    offsets: list[int] = []
    offset = 0
    for name, fmt in fields:
        width = np.dtype(fmt).itemsize
        if not name.startswith("_pad"):
            names.append(name)
            formats.append(fmt)
            offsets.append(offset)
        offset += width
    if offset != size:
        raise AssertionError(f"layout adds up to {offset} bytes, not {size}")
    return np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})


HEADER_DTYPE: Final = _dtype(
    [
        ("tag", "u1"),
        ("magic", "S7"),
        ("version", "<u4"),
        ("branch_size", "<u2"),
        ("location_size", "<u2"),
        ("string_size", "<u2"),
        ("power_size", "<u2"),
        ("trailer_size", "<u2"),
        ("options", "<u2"),
        ("lines_size", "<u2"),
        ("_pad0", "V6"),
    ],
    32,
)
STRING_DTYPE: Final = _dtype(
    [("tag", "u1"), ("_pad0", "V3"), ("id", "<u4"), ("length", "<u4")],
    12,
)
LOCATION_DTYPE: Final = _dtype(
    [
        ("tag", "u1"),
        ("_pad0", "V3"),
        ("id", "<u4"),
        ("ip", "<u8"),
        ("offset", "<i8"),
        ("symbol", "<u4"),
        ("dso", "<u4"),
        ("pid", "<i4"),
        ("node", "<i4"),
    ],
    40,
)
_BRANCH_FIELDS: Final = [
    ("tag", "u1"),
    ("cpumode", "u1"),
    ("gap_insns", "<u2"),
    ("flags", "<u4"),
    ("pid", "<i4"),
    ("tid", "<i4"),
    ("time", "<u8"),
    ("ip", "<u8"),
    ("addr", "<u8"),
    ("insn_cnt", "<u8"),
    ("cyc_cnt", "<u8"),
    ("ip_loc", "<u4"),
    ("addr_loc", "<u4"),
    ("cpu", "<i4"),
    ("gap_delta", "<u4"),
]
BRANCH_DTYPE: Final = _dtype(_BRANCH_FIELDS, 72)
POWER_DTYPE: Final = _dtype(
    [
        ("tag", "u1"),
        ("_pad0", "V3"),
        ("pid", "<i4"),
        ("tid", "<i4"),
        ("cpu", "<i4"),
        ("time", "<u8"),
        ("cbr", "<u4"),
        ("freq_mhz", "<u4"),
    ],
    32,
)
LINE_RANGE_DTYPE: Final = _dtype([("first", "<u8"), ("count", "<u8")], 16)
INSNS_BRANCH_LAYOUT: Final = _dtype([("branch", "V72"), ("last", "V16")], 88)
"""``ptscope_insns_branch_rec`` as C declares it: a branch record, then a line range."""
INSNS_BRANCH_DTYPE: Final = _dtype(
    [*_BRANCH_FIELDS, ("line_first", "<u8"), ("line_count", "<u8")], 88
)
"""The same, flat: the branch record's fields and the last range of its code lines
(``line_count`` 0: none) -- how a stream with instruction detail is read."""
LINES_DTYPE: Final = _dtype(
    [
        ("tag", "u1"),
        ("ranges", "u1"),
        ("_pad0", "V6"),
        # range[k] = (first line, line count); only the first `ranges` are used
        ("range", f"({LINES_PER_RECORD},2)<u8"),
    ],
    88,
)
TRAILER_FIELDS: Final = (
    "samples",
    "branches_kept",
    "branches_dropped",
    "power",
    "other",
    "locations",
    "strings",
    "lines",
    "blocks_decoded",
    "blocks_unknown",
    "ring_waits",
    "ring_wait_ns",
)
TRAILER_DTYPE: Final = _dtype(
    [("tag", "u1"), ("_pad0", "V7"), *((name, "<u8") for name in TRAILER_FIELDS)],
    104,
)

CHUNK_DTYPE: Final = _dtype(
    [("tag", "u1"), ("_pad0", "V3"), ("chunk", "<u4"), ("length", "<u4"), ("_pad1", "V4")], 16
)
NO_CHUNK: Final = 0xFFFFFFFF
"""A chunk record's ``chunk`` when it hands no chunk over (it orders perf's text only)."""

LAYOUTS: Final[dict[str, np.dtype[np.void]]] = {
    "ptscope_header_rec": HEADER_DTYPE,
    "ptscope_string_rec": STRING_DTYPE,
    "ptscope_location_rec": LOCATION_DTYPE,
    "ptscope_branch_rec": BRANCH_DTYPE,
    "ptscope_power_rec": POWER_DTYPE,
    "ptscope_trailer_rec": TRAILER_DTYPE,
    "ptscope_line_range": LINE_RANGE_DTYPE,
    "ptscope_insns_branch_rec": INSNS_BRANCH_LAYOUT,
    "ptscope_lines_rec": LINES_DTYPE,
    "ptscope_chunk_rec": CHUNK_DTYPE,
}
"""C struct name -> its dtype (the layout test walks this)."""

# Single-record codecs: field order as in the dtypes, padding skipped.
HEADER: Final = struct.Struct("<B7sIHHHHHHH6x")
STRING: Final = struct.Struct("<B3xII")
LOCATION: Final = struct.Struct("<B3xIQqIIii")
BRANCH: Final = struct.Struct("<BBHIiiQQQQQIIiI")
POWER: Final = struct.Struct("<B3xiiiQII")
LINES: Final = struct.Struct(f"<BB6x{2 * LINES_PER_RECORD}Q")
INSNS_BRANCH: Final = struct.Struct(BRANCH.format + "QQ")
TRAILER: Final = struct.Struct("<B7x12Q")
CHUNK: Final = struct.Struct("<B3xII4x")

for _codec, _dt in (
    (HEADER, HEADER_DTYPE),
    (STRING, STRING_DTYPE),
    (LOCATION, LOCATION_DTYPE),
    (BRANCH, BRANCH_DTYPE),
    (POWER, POWER_DTYPE),
    (TRAILER, TRAILER_DTYPE),
    (LINES, LINES_DTYPE),
    (INSNS_BRANCH, INSNS_BRANCH_DTYPE),
    (CHUNK, CHUNK_DTYPE),
):
    if _codec.size != _dt.itemsize:
        raise AssertionError(f"{_codec.format} is {_codec.size} bytes, dtype {_dt.itemsize}")
