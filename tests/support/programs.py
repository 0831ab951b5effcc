"""Compile the test corpus in ``tests/programs/`` (cached under ``tests/.build/``).

``build("basics", static=True)`` returns the path of a binary compiled from
``tests/programs/basics.c``; the cache key is a hash of the source, the compiler's version
and the flags, so editing a program or a flag rebuilds it and nothing else.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
SOURCES = TESTS / "programs"
BUILD = TESTS / ".build" / "programs"


@functools.cache
def _compiler_version(compiler: str) -> str:
    path = shutil.which(compiler)
    if path is None:
        pytest.skip(f"{compiler} is not installed")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else compiler


def build(
    name: str,
    *,
    static: bool = False,
    opt: str = "-O1",
    shared: bool = False,
    extra: Sequence[str] = (),
) -> Path:
    """Compile ``tests/programs/<name>.c`` (or ``.cpp``) and return the binary's path.

    ``static``: a static non-PIE executable (native addresses); otherwise a dynamic PIE.
    ``shared``: a shared library (``lib<name>.so``).
    """
    source = SOURCES / f"{name}.c"
    if not source.exists():
        source = SOURCES / f"{name}.cpp"
    compiler = "g++" if source.suffix == ".cpp" else "gcc"
    flags = [opt, "-g", "-fno-omit-frame-pointer"]
    if shared:
        flags += ["-shared", "-fPIC"]
    elif static:
        flags += ["-static", "-no-pie"]
    else:
        flags += ["-pie", "-fPIE"]
    flags += list(extra)
    libs = ["-lpthread"] if name in ("threads",) else []
    key = hashlib.sha256(
        "\0".join([source.read_text(), _compiler_version(compiler), *flags, *libs]).encode()
    ).hexdigest()[:16]
    stem = f"lib{name}" if shared else name
    out = BUILD / f"{stem}-{key}{'.so' if shared else ''}"
    if out.exists():
        return out
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    cmd = [compiler, *flags, "-o", str(tmp), str(source), *libs]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"cannot compile {source.name}: {' '.join(cmd)}\n{res.stderr}")
    tmp.replace(out)  # atomic: parallel test runs never see a half-written binary
    return out
