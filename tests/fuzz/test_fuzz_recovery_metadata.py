"""Fuzz target ``recovery-metadata``: damaged ``ptscope-recording.json`` documents of an
unfinished emulated recording, which make ``ptscope decode DIR`` repair its perf.data from
the recorder's state (``record.emulated.recover``). The ``metadata`` target feeds the
loader alone; this one goes on into the repair and the decode.

Inputs are the real recording's metadata (:mod:`fuzz.recovery`) with ``notes.state`` set
to "recording" (most of the time), then changed as the ``metadata`` target changes its
documents (fields of other types, hostile ``perf_data`` names, keys removed, the text cut
or a byte changed), and its notes given odd values (``recorder_pid`` this process, init,
past pid_max; counts and flags of other types). A file outside the directory is reachable
through a link named ``out``. The check is :func:`fuzz.recovery.decode_prepared`, and the
file outside is never written.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.recovery import TEARS, decode_prepared, prepare, workspace
from fuzz.target import FuzzTarget, quick
from fuzz.test_fuzz_metadata import FIELDS, HOSTILE_NAMES, odd_values

QUICK_EXAMPLES = 60
"""Inputs in ``make test`` (a decode of each: about 0.1 s)."""

NOTES = ("state", "recorder_pid", "instructions", "perf_maps", "jitted_code", "recovered")
note_values = st.one_of(
    odd_values,
    st.sampled_from(["recording", "done", "Recording", "recording\0"]),
    st.sampled_from([os.getpid(), 1, 0, -1, 1 << 22, (1 << 22) + 1, 1 << 31, 1 << 64]),
)


@st.composite
def documents(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(json.dumps(workspace().metadata))
    if draw(st.integers(0, 7)):
        data["notes"]["state"] = "recording"
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from([*FIELDS, "notes", "notes", "extra"]))
        action = draw(st.sampled_from(["set", "delete", "nest", "nest"]))
        if action == "delete":
            data.pop(field, None)
        elif action == "nest" and isinstance(data.get(field), dict):
            key = draw(st.sampled_from(NOTES) if field == "notes" else st.sampled_from(
                sorted(data[field]) or ["0"]))  # fmt: skip
            data[field][key] = draw(note_values if field == "notes" else odd_values)
        elif action == "nest" and isinstance(data.get(field), list) and data[field]:
            data[field][draw(st.integers(0, len(data[field]) - 1))] = draw(odd_values)
        else:
            data[field] = draw(odd_values)
    if not draw(st.integers(0, 4)):
        data["perf_data"] = draw(st.lists(st.sampled_from(HOSTILE_NAMES), min_size=1, max_size=2))
    encoded = json.dumps(data).encode()
    damage = draw(st.sampled_from(["none"] * 6 + ["cut", "byte"]))
    if damage == "cut":
        encoded = encoded[: draw(st.integers(0, len(encoded) - 1))]
    elif damage == "byte":
        at = draw(st.integers(0, len(encoded) - 1))
        encoded = encoded[:at] + bytes([draw(st.integers(0, 255))]) + encoded[at + 1 :]
    return {"metadata": encoded, "tear": draw(st.sampled_from(TEARS))}


def check(value: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="ptscope-fuzz-recovery-") as tmp:
        root = Path(tmp)
        rec = root / "rec"
        before = prepare(rec, metadata=value["metadata"], tear=value["tear"])
        secret = root / "secret"
        secret.write_text("outside the recording\n")
        (rec / "out").symlink_to(secret)
        (rec / "loop").symlink_to("loop")
        decode_prepared(rec, before, tear=value["tear"])
        assert secret.read_text() == "outside the recording\n"


TARGET = FuzzTarget("recovery-metadata", documents(), check)

test_recovery_metadata_quick = quick(TARGET, QUICK_EXAMPLES)
