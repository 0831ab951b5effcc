"""Fuchsia trace files: the writer ptscope's traces go through and a strict reader.

The reader's names are loaded on first use (PEP 562): a decode writes a trace and never
reads one, and importing the reader cost it 8 ms of start-up.
"""

from typing import TYPE_CHECKING, Any

from ptscope.fxt.writer import (
    FxtWriter,
    Koid,
    Pointer,
    UInt64,
    WriteStats,
    write_timeline,
)

if TYPE_CHECKING:
    from ptscope.fxt.reader import (
        FxtFormatError,
        FxtTrace,
        TraceCounter,
        TraceInstant,
        TraceSlice,
        read_trace,
    )

_READER_NAMES = frozenset(
    ("FxtFormatError", "FxtTrace", "TraceCounter", "TraceInstant", "TraceSlice", "read_trace")
)

__all__ = [
    "FxtFormatError",
    "FxtTrace",
    "FxtWriter",
    "Koid",
    "Pointer",
    "TraceCounter",
    "TraceInstant",
    "TraceSlice",
    "UInt64",
    "WriteStats",
    "read_trace",
    "write_timeline",
]


def __getattr__(name: str) -> Any:
    if name in _READER_NAMES:
        from ptscope.fxt import reader

        return getattr(reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
