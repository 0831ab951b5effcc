"""Fixtures of the fault suite: small recordings made once per session, copied per test."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from support import programs
from support.emulated_corpus import needs_tools
from support.faults import environment, run


def record_program(base: Path, key: str, name: str, *arguments: str) -> Path:
    """``ptscope run --keep-recording`` of a test program; the recording's directory."""
    needs_tools()
    exe = programs.build(name, static=True)
    rec = base / f"{key}-rec"
    out = base / f"{key}.fxt"
    args = ["run", "--backend", "emulated", "--keep-recording", str(rec), "-o", str(out)]
    done = run([*args, "--", str(exe), *arguments], environment(base), base)
    assert done.code == 0, done.stderr
    return rec


def copy_recording(source: Path, target: Path) -> Path:
    """A finished recording's files (not the recorder's state, which a finished recording
    does not need, and which is a large sparse file)."""
    target.mkdir(parents=True)
    for name in ("perf.data", "ptscope-recording.json"):
        shutil.copy(source / name, target / name)
    return target


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``recordings(name)``: the recording of a test program (made once per session)."""
    base = tmp_path_factory.mktemp("fault-recordings")
    made: dict[str, Path] = {}
    programs_and_arguments = {
        "basics": ("basics", "3"),
        "many_calls": ("many_calls", "3000"),
        "many_calls_long": ("many_calls", "30000"),
        "silent_loop": ("silent_loop", "3000000"),
    }

    def get(key: str) -> Path:
        if key not in made:
            made[key] = record_program(base, key, *programs_and_arguments[key])
        return made[key]

    return get


@pytest.fixture
def recording_copy(recordings: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """``recording_copy(name)``: this test's own copy of a session recording."""

    def get(name: str) -> Path:
        return copy_recording(recordings(name), tmp_path / f"{name}-rec")

    return get
