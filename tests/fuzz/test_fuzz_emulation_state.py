"""Fuzz target ``emulation-state``: damaged ``ptscope-emulation.state`` files, read by the
recovery of an unfinished emulated recording (``ptscope decode DIR``: ``state.read_state``,
then ``perf_data.checked_state`` and ``finish_perf_data`` on the perf.data).

Inputs are the state of a real recording (:mod:`fuzz.recovery`) with one of its parts (the
header, the thread slots, the AUXTRACE index, the build-id table) damaged: bits flipped,
words set at and past the limits of their fields, pieces deleted, repeated or cut off,
sometimes the whole file cut short; beside a perf.data that is whole, torn in its header
or cut before its feature sections. The check is :func:`fuzz.recovery.decode_prepared`:
no internal error, one error line, the perf.data unchanged unless a repair was made.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.mutations import damaged_bytes, edge_numbers
from fuzz.recovery import STATE_REGIONS, TEARS, decode_prepared, prepare, workspace
from fuzz.target import FuzzTarget, quick

QUICK_EXAMPLES = 60
"""Inputs in ``make test`` (a decode of each: about 0.1 s)."""


@st.composite
def damaged_states(draw: st.DrawFn) -> dict[str, Any]:
    """A region of the state (by name) and its damaged bytes, a length to cut the file
    to (or None), and how the perf.data is torn."""
    ws = workspace()
    region = draw(st.sampled_from(STATE_REGIONS))
    offset, seed = ws.regions[region]
    cut = None
    if draw(st.integers(0, 7)) == 0:
        cut = draw(st.one_of(st.integers(0, offset + len(seed)), st.just(ws.state_size - 1)))
    # Words the state holds: its sizes and offsets, and the perf.data's data end.
    words = [ws.data_end, ws.data_end - 8, ws.data_end + 8, len(ws.perf_data), ws.state_size]
    damaged = draw(damaged_bytes([seed], word_values=words))
    if draw(st.booleans()):  # a 32-bit field at any aligned place: most of the header's
        at = draw(st.integers(0, max(0, len(seed) // 4 - 1))) * 4
        value = draw(edge_numbers(32)).to_bytes(4, "little")
        damaged = damaged[:at] + value + damaged[at + 4 :]
    return {
        "region": region,
        "bytes": damaged[: len(seed)].ljust(len(seed), b"\0"),
        "cut": cut,
        "tear": draw(st.sampled_from(TEARS)),
    }


def check(value: dict[str, Any]) -> None:
    offset, _ = workspace().regions[value["region"]]
    with tempfile.TemporaryDirectory(prefix="ptscope-fuzz-state-") as tmp:
        rec = Path(tmp) / "rec"
        before = prepare(
            rec,
            state_edits=[(offset, value["bytes"])],
            state_cut=value["cut"],
            tear=value["tear"],
        )
        decode_prepared(rec, before, tear=value["tear"])


TARGET = FuzzTarget("emulation-state", damaged_states(), check)

test_emulation_state_quick = quick(TARGET, QUICK_EXAMPLES)
