"""``check_metadata`` reads metadata as ptscope writes it without pydantic
(``recording._plain_fields``): it must accept only what the schema accepts, and give the
same fields. Documents: what a recorder writes, then values replaced by any JSON value
(of the right type or not, in range or not), keys added or removed, strings with lone
surrogates, NaN, a byte-order mark; each is read both ways."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ptscope.errors import BadInputError
from ptscope.recording import (
    MAX_ADDRESS,
    MAX_ID,
    Recording,
    TriggerHit,
    _metadata_schema,  # the schema alone: the reference
    check_metadata,
)

FIELDS = ("format", "version", "backend", "perf_data", "command", "processes", "threads",
          "hits", "perf_version", "scope", "notes")  # fmt: skip

EDGE_VALUES: list[Any] = [
    *(0, 1, 2, -1, MAX_ID, MAX_ID + 1, MAX_ADDRESS, MAX_ADDRESS + 1, 1 << 63, (1 << 63) - 1),
    *(True, False, None, 1.0, 0.5, "", ".", "..", "a/b", "perf.data", "\0", "\ud800"),
    *("emulated", "intel-pt", "sampling", "user", "kernel", "user+kernel", "01", "+1", "7"),
    *([], {}, ["perf.data"], [1], {"7": "x"}, {"07": "x"}, {"7": 1}, {"4294967296": "x"}),
]
EDGES = st.sampled_from(EDGE_VALUES)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | EDGES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text() | EDGES.filter(
        lambda v: isinstance(v, str)), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


def written() -> dict[str, Any]:
    recording = Recording(
        directory=__import__("pathlib").Path("."),
        backend="emulated",
        command=["/bin/true", "x"],
        processes={7120: "/bin/true"},
        threads={7120: "true", 7121: "worker"},
        hits=[TriggerHit(time=10**15, pid=7120, tid=7121, ip=0x401136, symbol="f")],
        perf_version="perf version 6.1",
        notes={"instructions": 104828, "state": "done", "recorder_pid": 42},
    )
    data: dict[str, Any] = json.loads(recording.metadata_json())
    return data


def by_schema(text: bytes) -> dict[str, Any] | None:
    """What the schema alone makes of the document (None: refused)."""
    from pydantic import ValidationError

    try:
        model = _metadata_schema()(text)
    except ValidationError:
        return None
    fields = {name: getattr(model, name) for name in type(model).model_fields}
    fields["hits"] = [hit.model_dump() for hit in model.hits]
    fields["notes"] = model.notes.model_dump(exclude_unset=True)
    return fields


def both(text: bytes) -> None:
    try:
        got: dict[str, Any] | None = check_metadata(text, "m.json")
    except BadInputError:
        got = None
    want = by_schema(text)
    if got is not None or want is not None:
        # format and version are checked first, in plain Python, by both
        assert got == want, (text, got, want)


def test_what_a_recorder_writes_is_read_the_same_and_without_pydantic() -> None:
    text = json.dumps(written()).encode()
    both(text)
    from ptscope.recording import _plain_fields

    assert _plain_fields(json.loads(text)) is not None


def test_every_edge_value_in_every_field() -> None:
    for where in (*FIELDS, "hits.time", "hits.pid", "hits.tid", "hits.ip", "hits.symbol",
                  "notes.state", "notes.recorder_pid", "extra"):  # fmt: skip
        for value in [*EDGE_VALUES, "nope"]:
            doc = written()
            if where.startswith("hits."):
                doc["hits"][0][where[5:]] = value
            elif where.startswith("notes."):
                doc["notes"][where[6:]] = value
            else:
                doc[where] = value
            both(json.dumps(doc).encode())
        if where in FIELDS:
            doc = written()
            del doc[where]
            both(json.dumps(doc).encode())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_change_is_judged_as_the_schema_judges_it(data: st.DataObject) -> None:
    doc = written()
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        where = data.draw(st.sampled_from((*FIELDS, "hits.0", "notes.x", "extra")))
        value = data.draw(JSON, label=where)
        hits, notes = doc.get("hits"), doc.get("notes")
        if where == "hits.0" and isinstance(hits, list) and hits and isinstance(hits[0], dict):
            key = data.draw(st.sampled_from(["time", "pid", "tid", "ip", "symbol", "x"]))
            hits[0][key] = value
        elif where == "notes.x" and isinstance(notes, dict):
            notes[data.draw(st.sampled_from(["state", "recorder_pid", "x"]))] = value
        elif "." in where:
            continue
        elif data.draw(st.booleans(), label="remove") and where in doc:
            del doc[where]
        else:
            doc[where] = value
    both(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "text",
    [
        b'{"format": "ptscope-recording", "version": 1, "x": NaN}',
        b'{"format": "ptscope-recording", "version": 1, "x": "\\ud800"}',
        b'\xef\xbb\xbf{"format": "ptscope-recording", "version": 1}',
        b'{"format": "ptscope-recording", "version": 1, "backend": "emulated", "backend": "nope"}',
    ],
    ids=["nan", "lone surrogate", "bom", "duplicate key"],
)
def test_what_only_the_schema_parser_refuses(text: bytes) -> None:
    both(text)
