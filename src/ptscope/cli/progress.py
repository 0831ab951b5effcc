"""The progress bar of a decode: trace bytes decoded out of the total, slices written,
elapsed time (rich, on stderr when it is a terminal; nothing otherwise)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ptscope.decode.progress import DecodeProgress, Progress

__all__ = ["decode_progress"]


@contextlib.contextmanager
def decode_progress(label: str = "decoding") -> Iterator[Progress | None]:
    """A callback for the pipeline's ``progress=`` that draws a bar, or None (quiet) when
    stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TextColumn("{task.fields[slices]:,} slices"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(label, total=None, slices=0)

    def update(state: DecodeProgress) -> None:
        bar.update(
            task,
            total=state.trace_bytes or None,
            completed=state.decoded_bytes,
            slices=state.slices,
        )

    with bar:
        yield update
