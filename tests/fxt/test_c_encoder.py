"""The C slice encoder (``fxt/_cfxt.c`` over ``_native/fxt_slices.c``) against its numpy
twin (``FxtWriter._encode_complete``): the same words for any chunk of slices, every arg
present everywhere, nowhere or in some slices, drill strings of one or many lengths; and a
whole decoded trace written both ways reads back the same."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ptscope.fxt import FxtWriter, writer

# Built by `pip install .`: a missing module fails here rather than skipping.
from ptscope.fxt import _cfxt as cfxt  # type: ignore[attr-defined]
from ptscope.fxt.reader import read_trace
from ptscope.fxt.writer import Drill, _SliceColumns

SLICE = st.tuples(
    st.integers(0, 10**12),  # start
    st.integers(0, 10**6),  # duration
    st.one_of(st.just(0), st.integers(1, (1 << 64) - 1)),  # address (0: none)
    st.one_of(st.just(-1), st.integers(0, 10**15)),  # instructions
    st.one_of(st.just(-1), st.integers(0, 10**15)),  # cycles
    st.one_of(st.just(-1), st.integers(0, 10**4)),  # icache lines
    st.integers(0, 7),  # flags
    st.integers(0, 3),  # continued
    st.integers(-1, 10**13),  # perf start (negative: before perf's clock)
    st.one_of(st.just(0), st.integers(1, 10**9)),  # anchor occurrence (0: none)
    st.integers(0, (1 << 64) - 1),  # anchor address
)


# Drill prefixes around the encoder's word copies: short, whole words, and past the
# padded copy it keeps (32 words), where it copies the prefix as it is.
PREFIXES = [
    "ptscope insns '/a dir/r' --tid 7 --time ",
    "",
    "1234567",
    "12345678",
    "123456789",
    "p" * 255,
    "p" * 256,
    "/deep/" * 60 + " --time ",
]


def _chunk(
    rows: list[tuple[int, ...]], which: tuple[bool, ...], prefix: str = PREFIXES[0]
) -> dict[str, Any]:
    col = [np.array(c, dtype=object) for c in zip(*rows, strict=True)]
    start = col[0].astype(np.uint64)
    return {
        "columns": _SliceColumns(
            start,
            start + col[1].astype(np.uint64),
            col[2].astype(np.uint64) if which[0] else None,
            col[3].astype(np.int64) if which[1] else None,
            col[4].astype(np.int64) if which[2] else None,
            col[6].astype(np.uint8) if which[3] else None,
            col[7].astype(np.uint8) if which[4] else None,
            [],
            col[5].astype(np.int64) if which[5] else None,
        ),
        "drill": Drill(
            prefix,
            col[8].astype(np.int64),
            col[8].astype(np.int64) + col[1].astype(np.int64),
            col[10].astype(np.uint64) if which[7] else None,
            col[9].astype(np.int64) if which[7] else None,
            col[3].astype(np.int64) if which[7] else None,
        )
        if which[6]
        else None,
    }


def _both_encoders(
    chunk: dict[str, Any], slots: np.ndarray[Any, np.dtype[np.int32]]
) -> tuple[list[int], list[int]]:
    """The words of the numpy encoder and of the C one for ``chunk`` (flags 1..7 named)."""
    fx = FxtWriter(io.BytesIO())
    for value in range(1, 8):
        fx._flag_lut[value] = 200 + value
    header = 4 | (4 << 16) | (3 << 24) | (1 << 32)
    c: writer._SliceColumns = chunk["columns"]
    drill: Drill | None = chunk["drill"]
    n = len(slots)
    want = fx._encode_complete(
        header, slots, *c, drill=None if drill is None else drill.texts(0, n)
    )
    got = fx._encode_complete_c(header, slots, c, None if drill is None else (drill, 0, n))
    return want.tolist(), got.tolist()


@settings(max_examples=300)
@given(
    st.lists(SLICE, min_size=1, max_size=40),
    st.tuples(*[st.booleans()] * 8),
    st.integers(0, 5000),
    st.sampled_from(PREFIXES),
)
def test_c_encoder_writes_the_numpy_encoders_words(
    rows: list[tuple[int, ...]], which: tuple[bool, ...], first_slot: int, prefix: str
) -> None:
    slots = (np.arange(len(rows), dtype=np.int32) + first_slot) % 32767
    want, got = _both_encoders(_chunk(rows, which, prefix), slots)
    assert got == want


@settings(max_examples=200)
@given(
    st.integers(-1, 10**13),
    st.lists(st.tuples(st.integers(0, 30_000), st.integers(0, 300_000)), min_size=1, max_size=60),
    st.sampled_from(PREFIXES[:2]),
)
def test_drill_times_close_together_are_written_as_numpy_writes_them(
    first: int, steps: list[tuple[int, int]], prefix: str
) -> None:
    # The C encoder keeps the leading digits of the last time it wrote (times 100 us
    # apart share them): times a few us apart, going back and forth across 100 us (a
    # slice's end past the next one's start), second and width boundaries.
    starts = np.array([first] + [step for step, _ in steps[1:]], dtype=np.int64).cumsum()
    rows = [(1000 + i, d, 0, -1, -1, -1, 0, 0, int(t), 0, 0)
            for i, (t, (_, d)) in enumerate(zip(starts, steps, strict=True))]  # fmt: skip
    chunk = _chunk(rows, (False,) * 6 + (True, False), prefix)
    want, got = _both_encoders(chunk, np.arange(len(rows), dtype=np.int32))
    assert got == want


def test_a_batch_a_little_larger_than_the_first_reuses_the_scratch() -> None:
    """The encoder's output buffer is made with room to spare: a regrown one left the old
    block resident in the heap beside it (peak RSS +10 MB at 60k, when the second batch
    was 1 % larger than the first). The words are those of a fresh encoder."""
    fx = FxtWriter(io.BytesIO())
    header = 4 | (4 << 16) | (3 << 24) | (1 << 32)
    rows = [
        (10**9 + 10 * i, 5, 0x1000 + i, i, -1, 3, 0, 0, 10**9 + 10 * i, 0, 0) for i in range(1200)
    ]
    which = (True, True, True, False, False, True, True, False)
    first = _chunk(rows[:1000], which)
    fx._encode_complete_c(
        header, np.zeros(1000, np.int32), first["columns"], (first["drill"], 0, 1000)
    )
    scratch = fx._scratch
    larger = _chunk(rows, which)
    got = fx._encode_complete_c(
        header, np.zeros(1200, np.int32), larger["columns"], (larger["drill"], 0, 1200)
    )
    assert fx._scratch is scratch
    want = FxtWriter(io.BytesIO())._encode_complete_c(
        header, np.zeros(1200, np.int32), larger["columns"], (larger["drill"], 0, 1200)
    )
    assert got.tolist() == want.tolist()


def test_c_encoder_refuses_columns_of_the_wrong_size() -> None:
    n = np.zeros(3, dtype=np.uint64)
    slots = np.zeros(3, dtype=np.int32)
    with pytest.raises(ValueError, match="end"):
        cfxt.encode_complete(0, slots, n, n[:2], [], None)
    with pytest.raises(ValueError, match="present"):
        cfxt.encode_complete(0, slots, n, n, [(np.ones(2, dtype=bool), 1, None)], None)
    with pytest.raises(TypeError):
        cfxt.encode_complete(0, slots, n, n, [(None, 1)], None)
    with pytest.raises(ValueError, match="smaller"):
        cfxt.encode_complete(0, slots, n, n, [], None, np.zeros(8, dtype=np.uint64))
    out = np.zeros(9, dtype=np.uint64)
    assert cfxt.encode_complete(0, slots, n, n, [], None, out) == 9
    assert bytes(out) == cfxt.encode_complete(0, slots, n, n, [], None)


@pytest.mark.parametrize("chunk", [7, 1 << 16])
def test_a_trace_written_with_either_encoder_reads_back_the_same(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(5)
    n = 2000
    start = np.arange(n, dtype=np.int64) * 10**4 + 10**12  # one after the other
    ends = start + rng.integers(0, 10**4, n)
    names = [f"f{k}" for k in range(50)] + ["x" * 300]  # a long name: full_name args
    ids = rng.integers(0, len(names), n).astype(np.int32)
    args = {
        "address": rng.integers(0, 2**40, n).astype(np.uint64) * rng.integers(0, 2, n),
        "instructions": rng.integers(-1, 10**6, n),
        "cycles": rng.integers(-1, 10**6, n),
        "flags": rng.integers(0, 8, n).astype(np.uint8),
        "continued": rng.integers(0, 4, n).astype(np.uint8),
        "icache_lines": rng.integers(-1, 100, n),
        "drill": Drill("p ", start, ends, start.astype(np.uint64), rng.integers(0, 3, n), ids),
    }
    monkeypatch.setattr(writer, "_CHUNK", chunk)
    out = []
    for encoder in (cfxt, None):
        monkeypatch.setattr(writer, "_cfxt", encoder)
        buf = io.BytesIO()
        with FxtWriter(buf) as fx:
            fx.slices(1, 2, names, start, ends, ids, **args)
        out.append(buf.getvalue())
    assert out[0] == out[1]
    (thread,) = read_trace(out[0]).slices.values()
    assert len(thread) == n
