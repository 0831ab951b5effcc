"""Fuzz target ``metadata``: ``ptscope-recording.json`` documents fed to the code that
loads a recording (``Recording.find``, what ``decode``, ``archive`` and ``insns`` call).

Inputs are what a recorder writes (``Recording.metadata_json`` of generated recordings),
then mutated: a field given a value of another type, null, a huge or negative number, a
hostile path in ``perf_data`` (absolute, ``..``, a name that is a symbolic link leading
out of the directory), keys removed or added, the text cut short or a byte changed. The
only acceptable outcomes are a loaded recording that keeps every promise of the schema
(IDs, times and addresses in range; every perf.data inside the directory) or the
module's one-line error, :class:`ptscope.errors.BadInputError`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.target import FuzzTarget, quick
from ptscope.errors import BadInputError
from ptscope.recording import (
    MAX_ADDRESS,
    MAX_ID,
    MAX_TIME,
    METADATA_NAME,
    Recording,
    TriggerHit,
)

FIELDS = (
    "format",
    "version",
    "backend",
    "perf_data",
    "command",
    "processes",
    "threads",
    "hits",
    "perf_version",
    "scope",
    "notes",
)

ids = st.integers(0, MAX_ID)
text = st.text(max_size=12)


@st.composite
def recordings(draw: st.DrawFn) -> dict[str, Any]:
    """A document as a recorder writes it."""
    rec = Recording(
        Path("."),
        draw(st.sampled_from(["intel-pt", "emulated", "sampling", ""])),
        perf_data=draw(
            st.lists(st.sampled_from(["perf.data", "perf.data.1", "perf.data.2"]), min_size=1)
        ),
        command=draw(st.lists(text, max_size=3)),
        processes=draw(st.dictionaries(ids, text, max_size=3)),
        threads=draw(st.dictionaries(ids, text, max_size=3)),
        hits=[
            TriggerHit(*h)
            for h in draw(
                st.lists(
                    st.tuples(st.integers(0, MAX_TIME), ids, ids, st.integers(0, MAX_ADDRESS)),
                    max_size=2,
                )
            )
        ],
        perf_version=draw(text),
        scope=draw(st.sampled_from(["user", "kernel", "user+kernel"])),
        notes=draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "state": st.sampled_from(["recording", "done"]),
                    "recorder_pid": st.integers(0, 1 << 22),
                    "instructions": st.integers(0, 1 << 40),
                },
            )
        ),
    )
    data: dict[str, Any] = json.loads(rec.metadata_json())
    return data


HOSTILE_NAMES = [
    "/etc/passwd",
    "../x",
    "../../../../../etc/shadow",
    "/proc/self/mem",
    "a/../../b",
    "sub/perf.data",
    ".",
    "..",
    "",
    "perf.data\0x",
    "perf.data/",
    "out",  # made a link to a file outside the directory (see check)
    "loop",  # made a link to itself
]

odd_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([-1, 0, 1, MAX_ID, MAX_ID + 1, MAX_TIME, MAX_TIME + 1, MAX_ADDRESS + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    text,
    st.sampled_from(HOSTILE_NAMES),
    st.lists(st.one_of(st.none(), st.integers(-5, 5), text, st.sampled_from(HOSTILE_NAMES))),
    st.dictionaries(
        st.one_of(text, st.sampled_from(["-1", "01", "1.0", "+1", str(MAX_ID + 1), "7"])),
        st.one_of(st.none(), st.integers(-5, 5), text),
        max_size=3,
    ),
    st.lists(st.dictionaries(st.sampled_from(["time", "pid", "tid", "ip", "symbol"]),
                             st.one_of(st.none(), st.integers(-(1 << 65), 1 << 65), text)),
             max_size=2),
)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A recorder's document with a few things changed, as the bytes of the file."""
    data = draw(recordings())
    for _ in range(draw(st.integers(0, 3))):
        field = draw(st.sampled_from([*FIELDS, "extra"]))
        action = draw(st.sampled_from(["set", "set", "delete", "nest"]))
        if action == "delete":
            data.pop(field, None)
        elif action == "nest" and isinstance(data.get(field), list) and data[field]:
            data[field][draw(st.integers(0, len(data[field]) - 1))] = draw(odd_values)
        elif action == "nest" and isinstance(data.get(field), dict) and data[field]:
            key = draw(st.sampled_from(sorted(data[field])))
            data[field][key] = draw(odd_values)
        else:
            data[field] = draw(odd_values)
    if draw(st.booleans()):
        data["perf_data"] = draw(st.lists(st.sampled_from(HOSTILE_NAMES), min_size=1, max_size=2))
    encoded = json.dumps(data).encode()
    damage = draw(st.sampled_from(["none", "none", "none", "cut", "byte"]))
    if damage == "cut" and encoded:
        encoded = encoded[: draw(st.integers(0, len(encoded) - 1))]
    elif damage == "byte" and encoded:
        at = draw(st.integers(0, len(encoded) - 1))
        encoded = encoded[:at] + bytes([draw(st.integers(0, 255))]) + encoded[at + 1 :]
    return encoded


def check(document: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="ptscope-fuzz-metadata-") as tmp:
        root = Path(tmp)
        directory = root / "rec"
        directory.mkdir()
        (root / "secret").write_text("outside the recording\n")
        (directory / METADATA_NAME).write_bytes(document)
        (directory / "perf.data").write_bytes(b"")
        os.symlink(root / "secret", directory / "out")
        os.symlink("loop", directory / "loop")
        for path in (directory, directory / "perf.data"):
            try:
                recording = Recording.find(path)
            except BadInputError as e:
                assert e.message and "\n" not in e.message, e.message
                continue
            # Loaded: the schema's promises hold.
            inside = directory.resolve()
            for data in recording.perf_data_paths():
                assert data.resolve().is_relative_to(inside), data
            for key in (*recording.processes, *recording.threads):
                assert type(key) is int and 0 <= key <= MAX_ID
            assert all(type(v) is str for v in recording.processes.values())
            assert all(type(v) is str for v in recording.threads.values())
            assert all(type(a) is str for a in recording.command)
            for hit in recording.hits:
                assert 0 <= hit.time <= MAX_TIME and 0 <= hit.ip <= MAX_ADDRESS
                assert 0 <= hit.pid <= MAX_ID and 0 <= hit.tid <= MAX_ID
            assert isinstance(recording.notes, dict)
            # What it saves, it loads back the same.
            recording.save()
            again = Recording.load(directory)
            assert (again.processes, again.threads, again.hits) == (
                recording.processes,
                recording.threads,
                recording.hits,
            )


TARGET = FuzzTarget("metadata", mutated(), check)

test_metadata_quick = quick(TARGET)
