"""The own decoder against perf's: a recording decoded by both must give the same trace.

Same means what a viewer shows: the processes and threads and their names, and on every
thread the same slices (times, depth, name, every argument), the same instants (decode
errors and gaps with their arguments) and the same counters. The bytes may differ: the
two decoders hand the engine batches of different sizes, so records can come in another
order. The comparison names the first difference it finds.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from ptscope.fxt.reader import FxtTrace, read_trace
from ptscope.pipeline import DecodeOptions, decode_recording
from ptscope.recording import Recording

__all__ = ["assert_same_trace", "first_trace_difference", "perf_decodes_the_same"]

_PER_THREAD = ("slices", "instants", "counters")


def first_trace_difference(a: FxtTrace, b: FxtTrace) -> str | None:
    """Where traces ``a`` and ``b`` first differ, in words; None when they do not."""
    for what in ("processes", "threads"):
        if getattr(a, what) != getattr(b, what):
            return f"{what}: {getattr(a, what)} != {getattr(b, what)}"
    for what in _PER_THREAD:
        x, y = getattr(a, what), getattr(b, what)
        for key in sorted(set(x) | set(y)):
            rows_a, rows_b = x.get(key, []), y.get(key, [])
            for i, (p, q) in enumerate(zip(rows_a, rows_b, strict=False)):
                if p != q:
                    return f"{what} of {key}, row {i}: {p} != {q}"
            if len(rows_a) != len(rows_b):
                return f"{what} of {key}: {len(rows_a)} rows != {len(rows_b)}"
    return None


def assert_same_trace(a: Path, b: Path) -> None:
    """The traces at ``a`` and ``b`` show the same (else the first difference)."""
    trace_a, trace_b = read_trace(a), read_trace(b)
    diff = first_trace_difference(trace_a, trace_b)
    assert diff is None, f"{a.name} and {b.name} differ: {diff}"
    assert sum(map(len, trace_a.slices.values())) > 0, f"{a}: no slices (proves nothing)"


def perf_decodes_the_same(
    recording: Path, trace: Path, options: DecodeOptions | None = None, *cli: str
) -> None:
    """``trace`` (the own decoder's) is the trace perf's decoder (the dlfilter) makes of
    ``recording``: decoded in this process with ``options`` (the same options but the
    decoder), or through the CLI with the options ``cli`` when ``options`` is None."""
    again = trace.with_name(f"perf-{trace.name}")
    if options is not None:
        decode_recording(
            Recording.load(recording), again, dataclasses.replace(options, decoder="dlfilter")
        )
    else:
        command = ["decode", str(recording), "-o", str(again), *cli, "--decoder", "dlfilter"]
        done = subprocess.run(
            [sys.executable, "-m", "ptscope", *command],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    assert_same_trace(trace, again)
