"""Fixtures for the recording tests: real test programs compiled on demand (cached in
``tests/.build/record``), and checks of what this machine can do."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

SOURCES = Path(__file__).parent / "programs"
BUILD = Path(__file__).resolve().parents[1] / ".build" / "record"
BASE_FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-pthread")


def build_program(name: str, *, pie: bool = True) -> Path:
    """Compile ``programs/NAME.c`` (once per source and flags) and return the executable."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (apt-get install gcc)")
    source = SOURCES / f"{name}.c"
    flags = [*BASE_FLAGS, *(("-fPIE", "-pie") if pie else ("-fno-pie", "-no-pie"))]
    key = hashlib.sha256(source.read_bytes() + repr(flags).encode()).hexdigest()[:12]
    out = BUILD / f"{name}-{'pie' if pie else 'exec'}-{key}"
    if not out.exists():
        BUILD.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
        subprocess.run([cc, *flags, "-o", str(tmp), str(source)], check=True)
        tmp.replace(out)
    return out


@pytest.fixture(scope="session")
def program() -> Callable[..., Path]:
    return build_program


@pytest.fixture(scope="session")
def perf_path() -> str:
    path = shutil.which("perf")
    if path is None:
        pytest.skip("perf is not installed (apt-get install linux-perf)")
    return path
