"""Where the decoders read a binary that perf names by path: at that path, or under the
recording's ``--symfs`` (an archive brings its own copies), as perf itself reads it.

Names that come from the binaries' own tables (PLT stubs, OCaml functions) are made while
locations are built, far from the decode's options; the pipeline says where binaries are for
the length of a decode with :func:`reading_binaries`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

__all__ = ["local_binary", "reading_binaries"]

BinaryResolver = Callable[[str], Path | None]

_resolver: BinaryResolver | None = None


@contextlib.contextmanager
def reading_binaries(resolve: BinaryResolver) -> Iterator[None]:
    """Read the binaries perf names through ``resolve`` until the block ends."""
    global _resolver
    previous = _resolver
    _resolver = resolve
    try:
        yield
    finally:
        _resolver = previous


def local_binary(name: str) -> Path | None:
    """The file to read for the binary perf names ``name`` (None: no such file here)."""
    if _resolver is not None:
        return _resolver(name)
    return Path(name) if name.startswith("/") else None
