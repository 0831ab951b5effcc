"""Hypothesis strategies that damage valid inputs the way files get damaged (or forged):
bits flipped, bytes overwritten, numbers set at and past the limits of their fields,
pieces cut out, repeated or moved, the end cut off. Shared by the parser fuzz targets."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

__all__ = [
    "EDGE_NUMBERS",
    "damaged_bytes",
    "edge_numbers",
    "number_text",
]

EDGE_NUMBERS: tuple[int, ...] = (
    0,
    1,
    (1 << 8) - 1,
    (1 << 12) - 1,
    (1 << 15) - 1,
    1 << 15,
    (1 << 16) - 1,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 40) - 1,
    1 << 52,
    (1 << 52) + 1,
    (1 << 61) - 1,
    1 << 61,
    (1 << 62) + 1,
    (1 << 63) - 1,
    1 << 63,
    (1 << 64) - 1,
)
"""Values at and past the limits that matter somewhere: field widths (8 to 64 bits, signed
and unsigned), the FXT size fields (12 and 32 bits), ``model.COUNT_BUDGET`` (2**52) and
``model.TIME_LIMIT`` (2**61)."""


def edge_numbers(bits: int = 64) -> st.SearchStrategy[int]:
    """An integer of a ``bits``-wide unsigned field: an edge value (cut to the width)
    most of the time, else any."""
    mask = (1 << bits) - 1
    edges = sorted({n & mask for n in EDGE_NUMBERS} | {mask, mask >> 1}, reverse=True)
    # Largest first: hypothesis favours a list's first elements, and the large values
    # are the ones past the limits.
    return st.one_of(
        st.sampled_from(edges),
        st.sampled_from(edges[:8]),
        st.integers(0, mask),
    )


def number_text() -> st.SearchStrategy[str]:
    """A decimal number as text: at and past the edges, negative, thousands of digits, or
    digits that ``str.isdigit`` accepts and ``int`` refuses."""
    return st.one_of(
        edge_numbers().map(str),
        st.sampled_from(["-1", "-0", "00000000000000000000000001", "9" * 5000, "²", "1²", ""]),
        st.integers(-(1 << 70), 1 << 70).map(str),
        st.integers(1 << 64, 1 << 80).map(str),
    )


@st.composite
def damaged_bytes(
    draw: st.DrawFn,
    seeds: Sequence[bytes],
    *,
    word_values: Sequence[int] = (),
    max_edits: int = 4,
) -> bytes:
    """One of ``seeds`` with one to ``max_edits`` edits: a bit flipped, a byte set, an
    aligned 64-bit word set to an edge value (or one of ``word_values``: record headers
    worth trying), a piece deleted, repeated, copied from elsewhere (or another seed),
    or the end cut off."""
    data = bytearray(draw(st.sampled_from(list(seeds))))
    words = st.one_of(edge_numbers(), st.sampled_from(list(word_values) or [0]))
    for _ in range(draw(st.integers(1, max_edits))):
        if not data:
            break
        n = len(data)
        at = draw(st.integers(0, n - 1))
        if draw(st.booleans()):
            at = n - 1 - at  # hypothesis favours small numbers: as often near the end
        edit = draw(
            st.sampled_from(["flip", "byte", "word", "word", "delete", "repeat", "copy", "cut"])
        )
        if edit == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif edit == "byte":
            data[at] = draw(st.integers(0, 255))
        elif edit == "word":
            at &= ~7
            data[at : at + 8] = draw(words).to_bytes(8, "little")[: n - at]
        elif edit == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        elif edit == "repeat":
            piece = data[at : at + draw(st.integers(1, 256))]
            data[at:at] = piece * draw(st.integers(1, 3))
        elif edit == "copy":
            source = draw(st.sampled_from([bytes(data), *seeds]))
            start = draw(st.integers(0, max(0, len(source) - 1)))
            data[at:at] = source[start : start + draw(st.integers(1, 512))]
        else:
            del data[at:]
    return bytes(data)
