"""The engine library (``_native/engine*.c`` and ``line_set.c``) without Python: a C program
links it alone and replays the calls the Python extension received during real decodes (and
the golden scripts); every output column must equal what the extension handed to Python.

This is what lets the dlfilter link the same engine (decoding inside perf): its files
compile without Python's headers, and its behaviour is the extension's, call for call.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ptscope import _native
from ptscope.decode.dlfilter_stream import decode_with_dlfilter_columnar
from ptscope.decode.landing_pads import LandingPads
from ptscope.decode.parallel import feed_sink
from ptscope.reconstruct import fast_engine
from ptscope.reconstruct.fast_engine import FastEngine
from support.dlfilter_harness import NATIVE_SRC, compile_c, setup_files

pytestmark = pytest.mark.skipif(not fast_engine.is_available(), reason="the C engine is not built")

REPLAY = Path(__file__).with_name("engine_replay.c")
# The engine's files, as setup.py links them into the extension.
ENGINE_SOURCES = setup_files("ENGINE_FILES")

# What the log records of each slice, instant and counter column (engine.h: O_*, I_*, N_*).
KINDS = (("slices", 16), ("instants", 4), ("counters", 5))


def _ints(values: Any) -> str:
    return " ".join(str(int(v)) for v in np.asarray(values).ravel())


class _Recorder:
    """Stands in for ``_cengine.Engine``: forwards every call and writes it to the log."""

    def __init__(self, log: list[str], answers: dict[int, list[tuple[int, int]]], *args: Any):
        self._c = _real_engine_type(*args)
        self._log = log
        self._answers = answers
        self.outputs: list[tuple[Any, ...]] = []
        log.append("I " + _ints(args))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)

    def set_landing_pads(self, lookup: Any) -> None:
        def asked(loc: int) -> Any:
            ranges = lookup(loc)
            self._answers[loc] = [(int(a), int(b)) for a, b in ranges]
            return ranges

        self._log.append("W")
        self._c.set_landing_pads(asked)

    def add_locations(self, *cols: Any) -> int:
        self._log.append(f"L {len(cols[0])}")
        self._log += [_ints(row) for row in zip(*cols, strict=True)]
        return int(self._c.add_locations(*cols))

    def mark_function(self, fn: int, flags: int) -> None:
        self._log.append(f"M {fn} {flags}")
        self._c.mark_function(fn, flags)

    def feed_batch(self, *cols: Any) -> None:
        base, rest = cols[:9], list(cols[9:]) + [None] * (3 - len(cols[9:]))
        offsets, lines, gap = rest
        n = len(base[0])
        self._log.append(f"B {n} {int(offsets is not None)} {int(gap is not None)}")
        columns = [np.asarray(c).astype(np.int64) for c in base]
        if gap is not None:
            columns.append(np.asarray(gap).astype(np.int64))
        self._log += [_ints(row) for row in zip(*columns, strict=True)]
        if offsets is not None:
            self._log.append(_ints(offsets))
            self._log.append(f"{len(lines)} {_ints(np.asarray(lines).view(np.int64))}")
        self._c.feed_batch(*cols)

    def decode_error(self, pid: int, tid: int, has_time: bool, time: int, msg: int) -> bool:
        self._log.append(f"E {pid} {tid} {int(has_time)} {time} {msg}")
        return bool(self._c.decode_error(pid, tid, has_time, time, msg))

    def counter(self, pid: int, tid: int, time: int, name: int, value: int) -> None:
        self._log.append(f"C {pid} {tid} {time} {name} {value}")
        self._c.counter(pid, tid, time, name, value)

    def end_segment(self) -> None:
        self._log.append("S")
        self._c.end_segment()

    def close_all(self) -> None:
        self._log.append("Z")
        self._c.close_all()

    def take_output(self) -> Any:
        out = self._c.take_output()
        self.outputs.append(out)
        return out


_real_engine_type: Any = fast_engine._cengine.Engine if fast_engine._cengine else None


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[_Recorder]]:
    """Every FastEngine made in the test records its calls (the list of recorders)."""
    made: list[_Recorder] = []
    real = fast_engine._cengine

    def engine(*args: Any) -> _Recorder:
        made.append(_Recorder([], {}, *args))
        return made[-1]

    monkeypatch.setattr(
        fast_engine, "_cengine", SimpleNamespace(**{**vars(real), "Engine": engine})
    )
    yield made


def _replay(recorder: _Recorder, tmp: Path) -> dict[str, list[list[int]]]:
    program = compile_c(
        [REPLAY, *ENGINE_SOURCES],
        "engine_replay",
        shared=False,
        depends=[NATIVE_SRC / "engine.h"],
    )
    answers = [
        f"P {loc} {len(pairs)} {_ints(np.array(pairs, dtype=np.int64))}".rstrip()
        for loc, pairs in recorder._answers.items()
    ]
    log = recorder._log[:1] + answers + recorder._log[1:]
    (tmp / "calls.log").write_text("\n".join(log) + "\n")
    with open(tmp / "calls.log") as stdin:
        result = subprocess.run(
            [str(program)], stdin=stdin, capture_output=True, text=True, check=False
        )
    assert result.returncode == 0, result.stdout[-500:] + result.stderr
    got: dict[str, list[list[int]]] = {kind: [[] for _ in range(n)] for kind, n in KINDS}
    for line in result.stdout.splitlines():
        kind, k, *values = line.split()
        got[kind][int(k)] = [int(v) for v in values]
    return got


def _from_python(recorder: _Recorder) -> dict[str, list[list[int]]]:
    got: dict[str, list[list[int]]] = {kind: [[] for _ in range(n)] for kind, n in KINDS}
    for out in recorder.outputs:
        for (kind, _), blocks in zip(KINDS, out, strict=True):
            for k, block in enumerate(blocks):
                got[kind][k] += np.frombuffer(block, dtype=np.int64).tolist()
    return got


def _check(recorders: list[_Recorder], tmp: Path) -> int:
    slices = 0
    for i, recorder in enumerate(recorders):
        where = tmp / str(i)
        where.mkdir()
        expected = _from_python(recorder)
        assert _replay(recorder, where) == expected
        slices += len(expected["slices"][0])
    return slices


def test_golden_scripts_replayed_in_c(recorded: list[_Recorder], tmp_path: Path) -> None:
    from engine.test_cengine import GOLDENS, both
    from support.event_script import parse_script

    for path in GOLDENS:
        script = parse_script(path.read_text())
        both(script.events, pads=script.landing_pads)
    assert len(recorded) == len(GOLDENS)
    assert sum(any(r._answers.values()) for r in recorded) >= 2  # landing pads found
    assert _check(recorded, tmp_path) > 100


@pytest.mark.slow
@pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built")
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="qemu-x86_64 is missing")
@pytest.mark.parametrize("key", ["exceptions-pie", "longjmp-static", "threads-pie"])
def test_real_decodes_replayed_in_c(
    recorded: list[_Recorder], tmp_path: Path, key: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """C++ exceptions, setjmp/longjmp, threads: the calls of a real decode."""
    from support.emulated_corpus import decode_case_recording

    perf_data = decode_case_recording(key, tmp_path_factory)
    engine = FastEngine(landing_pads=LandingPads().call_sites_landing_at)
    feed_sink(engine, decode_with_dlfilter_columnar(perf_data, task_events=True))
    engine.finish()
    assert _check(recorded, tmp_path) > 50


def test_setup_links_every_engine_file() -> None:
    """setup.py lists every file of the engine (a file left out would leave the extension
    with an undefined symbol, found only on import)."""
    for source in [*NATIVE_SRC.glob("engine*.c"), NATIVE_SRC / "line_set.c"]:
        assert source in ENGINE_SOURCES, source.name
