"""The record layout in record_format.h and its Python mirror agree, as the compiler sees it."""

from __future__ import annotations

import ctypes
import re
import subprocess

import numpy as np
import pytest

from ptscope.decode import record_format as rf
from support.dlfilter_harness import (
    BUILD_DIR,
    NATIVE_SRC,
    PERF_STRUCT_MIRRORS,
    c_layout,
    compile_c,
)


def _c_struct_members() -> dict[str, list[str]]:
    """Member names of every struct in record_format.h (read from the header itself)."""
    text = (NATIVE_SRC / "record_format.h").read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    structs: dict[str, list[str]] = {}
    for name, body in re.findall(r"struct (\w+) \{(.*?)\};", text, flags=re.S):
        structs[name] = [m for m in re.findall(r"(\w+)(?:\[\d+\])?;", body)]
    return structs


def test_every_c_struct_is_mirrored() -> None:
    assert set(_c_struct_members()) == set(rf.LAYOUTS)


@pytest.mark.parametrize("struct", sorted(rf.LAYOUTS))
def test_sizes_and_offsets_match_the_compiler(struct: str) -> None:
    members = _c_struct_members()[struct]
    layout = c_layout(['"record_format.h"'], {struct: members})[struct]
    assert isinstance(layout, dict)
    dtype = rf.LAYOUTS[struct]
    assert layout["size"] == dtype.itemsize
    c_fields = {k: tuple(v) for k, v in layout["fields"].items() if not k.startswith("reserved")}
    py_fields = {n: (dtype.fields[n][1], dtype.fields[n][0].itemsize) for n in dtype.names}
    assert c_fields == py_fields


def test_struct_codecs_agree_with_dtypes() -> None:
    # Pack a record with numpy (named fields), unpack it with the struct codec.
    for dtype, codec in (
        (rf.HEADER_DTYPE, rf.HEADER),
        (rf.STRING_DTYPE, rf.STRING),
        (rf.LOCATION_DTYPE, rf.LOCATION),
        (rf.BRANCH_DTYPE, rf.BRANCH),
        (rf.POWER_DTYPE, rf.POWER),
        (rf.TRAILER_DTYPE, rf.TRAILER),
    ):
        rec = np.zeros(1, dtype=dtype)
        expected = []
        for i, name in enumerate(dtype.names):
            if dtype.fields[name][0].kind == "S":
                value: object = b"ABCDEFG"[: dtype.fields[name][0].itemsize]
            else:
                value = 0xF0 + i if name == "tag" else i + 1
            rec[name] = value
            expected.append(value)
        assert list(codec.unpack(rec.tobytes())) == expected
    # The lines record holds an array of (first, count) pairs.
    lines = np.zeros(1, dtype=rf.LINES_DTYPE)
    lines["tag"], lines["ranges"] = rf.TAG_LINES, 3
    pairs = np.arange(1, 2 * rf.LINES_PER_RECORD + 1, dtype=np.uint64)
    lines["range"] = pairs.reshape(rf.LINES_PER_RECORD, 2)
    assert list(rf.LINES.unpack(lines.tobytes())) == [rf.TAG_LINES, 3, *pairs.tolist()]


def test_constants_match_the_header() -> None:
    program = """
#include <stdio.h>
#include "record_format.h"
int main(void) {
    printf("%s %u %d %d %d %d %d %d %d %u %d %u %u %d\\n", PTSCOPE_STREAM_MAGIC,
           PTSCOPE_STREAM_VERSION, PTSCOPE_TAG_HEADER, PTSCOPE_TAG_STRING,
           PTSCOPE_TAG_LOCATION, PTSCOPE_TAG_BRANCH, PTSCOPE_TAG_POWER, PTSCOPE_TAG_TRAILER,
           PTSCOPE_TAG_LINES, PTSCOPE_NO_STRING, PTSCOPE_NO_OFFSET, PTSCOPE_OPT_KEEP_ALL,
           PTSCOPE_OPT_INSNS, PTSCOPE_LINES_PER_REC);
    return 0;
}
"""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    c_file = BUILD_DIR / "constants.c"
    c_file.write_text(program)
    exe = compile_c([c_file], "constants", shared=False)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    assert out == [
        rf.MAGIC.decode(),
        str(rf.STREAM_VERSION),
        *map(str, (rf.TAG_HEADER, rf.TAG_STRING, rf.TAG_LOCATION, rf.TAG_BRANCH)),
        *map(str, (rf.TAG_POWER, rf.TAG_TRAILER, rf.TAG_LINES, rf.NO_STRING, rf.NO_OFFSET)),
        *map(str, (rf.OPT_KEEP_ALL, rf.OPT_INSNS, rf.LINES_PER_RECORD)),
    ]


def test_tags_cannot_start_a_text_line() -> None:
    # The reader tells records from perf's text by the first byte: no UTF-8 text starts
    # with 0xF8..0xFF.
    for tag in (rf.TAG_HEADER, rf.TAG_STRING, rf.TAG_LOCATION, rf.TAG_BRANCH):
        with pytest.raises(UnicodeDecodeError):
            bytes([tag, 0x41]).decode("utf-8")
    for tag in (rf.TAG_POWER, rf.TAG_TRAILER, rf.TAG_LINES):
        with pytest.raises(UnicodeDecodeError):
            bytes([tag, 0x41]).decode("utf-8")


@pytest.mark.parametrize("struct", sorted(PERF_STRUCT_MIRRORS))
def test_fake_perf_structs_match_the_system_header(struct: str) -> None:
    """The ctypes mirrors the unit tests feed the filter are perf's real layouts."""
    mirror = PERF_STRUCT_MIRRORS[struct]
    names = [name for name, *_ in mirror._fields_]
    layout = c_layout(["<perf/perf_dlfilter.h>"], {struct: names})[struct]
    assert isinstance(layout, dict)
    assert layout["size"] == ctypes.sizeof(mirror)
    for name in names:
        descr = getattr(mirror, name)
        assert tuple(layout["fields"][name]) == (descr.offset, descr.size), name
