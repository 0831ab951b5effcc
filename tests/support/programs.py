"""Compile the test corpus in ``tests/programs/`` (cached under ``tests/.build/``).

``build("basics", static=True)`` returns the path of a binary compiled from
``tests/programs/basics.c`` (``.cpp``: g++, ``.rs``: rustc, ``.ml``: ocamlopt, ``.go``: go
build); the cache key is a hash of the source, the compiler's version and the flags, so
editing a program or a flag rebuilds it and nothing else. A test whose compiler (or linker)
is missing is skipped, saying which.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
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
    version = ["version"] if compiler == "go" else ["--version"]
    out = subprocess.run([path, *version], capture_output=True, text=True, check=False)
    return out.stdout.splitlines()[0] if out.stdout else compiler


LINKERS = {"lld": "ld.lld", "gold": "ld.gold"}


def build(
    name: str,
    *,
    static: bool = False,
    opt: str = "-O1",
    shared: bool = False,
    link: str = "",
    extra: Sequence[str] = (),
) -> Path:
    """Compile ``tests/programs/<name>.c`` (or ``.cpp``, ``.rs``) and return the binary.

    ``static``: a static non-PIE executable (native addresses); otherwise a dynamic PIE.
    ``shared``: a shared library (``lib<name>.so``). ``link``: ``lld`` or ``gold`` (that
    linker instead of the default), ``static-pie`` (a static position-independent one),
    ``nopie`` (a dynamically linked executable at its link-time addresses).
    A Rust program is built by rustc its own way (a PIE; ``opt`` gives the level).
    """
    source = next(
        SOURCES / f"{name}{ext}"
        for ext in (".c", ".cpp", ".rs", ".ml", ".go")
        if (SOURCES / f"{name}{ext}").exists()
    )
    if source.suffix == ".rs":
        return _build_rust(source, opt, extra)
    if source.suffix == ".ml":
        return _build_ocaml(source, extra)
    if source.suffix == ".go":
        return _build_go(source)
    compiler = "g++" if source.suffix == ".cpp" else "gcc"
    flags = [opt, "-g", "-fno-omit-frame-pointer"]
    if shared:
        flags += ["-shared", "-fPIC"]
    elif static:
        flags += ["-static", "-no-pie"]
    elif link == "static-pie":
        flags += ["-static-pie", "-fPIE"]
    elif link == "nopie":
        flags += ["-no-pie", "-fno-pie"]
    else:
        flags += ["-pie", "-fPIE"]
    if link in LINKERS:
        if shutil.which(LINKERS[link]) is None:
            pytest.skip(f"{LINKERS[link]} is not installed (apt-get install {link} / binutils)")
        flags.append(f"-fuse-ld={link}")
    flags += list(extra)
    libs = ["-lpthread"] if name in ("threads", "thread_names") else []
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


def _cached(
    source: Path,
    compiler: str,
    flags: Sequence[str],
    command: Callable[[Path, Path], list[str]],
    env: dict[str, str] | None = None,
) -> Path:
    """Build ``source`` with ``command(source in a scratch directory, output)`` unless a
    build with the same source, compiler version and flags is cached. The compiler runs in
    a directory of its own: ocamlopt and go leave files beside the source."""
    if shutil.which(compiler) is None:
        pytest.skip(f"{compiler} is not installed (make installs it): no program to trace")
    key = hashlib.sha256(
        "\0".join([source.read_text(), _compiler_version(compiler), *flags]).encode()
    ).hexdigest()[:16]
    out = BUILD / f"{source.stem}-{key}"
    if out.exists():
        return out
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    with tempfile.TemporaryDirectory(dir=BUILD) as scratch:
        copy = Path(scratch) / source.name
        shutil.copyfile(source, copy)
        cmd = command(copy, tmp)
        res = subprocess.run(
            cmd, capture_output=True, text=True, check=False, cwd=scratch,
            env={**os.environ, **(env or {})},
        )  # fmt: skip
    if res.returncode != 0:
        raise RuntimeError(f"cannot compile {source.name}: {' '.join(cmd)}\n{res.stderr}")
    tmp.replace(out)
    return out


def _build_rust(source: Path, opt: str, extra: Sequence[str] = ()) -> Path:
    flags = [f"-Copt-level={opt.removeprefix('-O')}", "-g", "-Cforce-frame-pointers=yes", *extra]
    return _cached(
        source, "rustc", flags, lambda src, out: ["rustc", *flags, "-o", str(out), str(src)]
    )


def _build_ocaml(source: Path, extra: Sequence[str]) -> Path:
    """ocamlopt (native code); ``extra`` e.g. ``-g``."""
    flags = list(extra)
    return _cached(
        source, "ocamlopt", flags, lambda src, out: ["ocamlopt", *flags, "-o", str(out), src.name]
    )


def _build_go(source: Path) -> Path:
    """go build, with a build cache of its own under tests/.build."""
    env = {"GOCACHE": str(BUILD / "go-cache"), "GOPATH": str(BUILD / "go-path"), "GOFLAGS": ""}
    return _cached(
        source, "go", [], lambda src, out: ["go", "build", "-o", str(out), src.name], env
    )
