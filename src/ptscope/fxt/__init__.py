"""Fuchsia trace files: the writer ptscope's traces go through and a strict reader."""

from ptscope.fxt.reader import (
    FxtFormatError,
    FxtTrace,
    TraceCounter,
    TraceInstant,
    TraceSlice,
    read_trace,
)
from ptscope.fxt.writer import (
    FxtWriter,
    Koid,
    Pointer,
    UInt64,
    WriteStats,
    write_timeline,
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
