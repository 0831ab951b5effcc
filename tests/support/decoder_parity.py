"""The own decoder against perf's: a recording decoded by both must give the same trace.

Same means what a viewer shows: the processes and threads and their names, and on every
thread the same slices (times, depth, name, address, counts, flags, code lines; read with
the columnar reader, whose columns leave out only the ``drill`` command, made of the
same times), the same instants (decode errors and gaps with their arguments) and the same
counters. The bytes may differ: the two decoders hand the engine batches of different
sizes, so records can come in another order. The comparison names the first difference.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np

from ptscope.fxt.columns import TraceColumns, read_columns
from ptscope.pipeline import DecodeOptions, decode_recording
from ptscope.recording import Recording

__all__ = ["assert_same_trace", "first_trace_difference", "perf_decodes_the_same"]


def first_trace_difference(a: TraceColumns, b: TraceColumns) -> str | None:
    """Where traces ``a`` and ``b`` first differ, in words; None when they do not."""
    if a.processes != b.processes:
        return f"processes: {a.processes} != {b.processes}"
    keys_a = [(t.pid, t.tid, t.name) for t in a.threads]
    keys_b = [(t.pid, t.tid, t.name) for t in b.threads]
    if keys_a != keys_b:
        return f"threads: {keys_a} != {keys_b}"
    for ta, tb in zip(a.threads, b.threads, strict=True):
        key = (ta.pid, ta.tid)
        for what in ("instants", "counters"):
            x, y = getattr(ta, what), getattr(tb, what)
            if x != y:
                i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
                at = f"row {i}: {x[i]} != {y[i]}" if i is not None else f"{len(x)} != {len(y)}"
                return f"{what} of {key}, {at}"
        if len(ta) != len(tb):
            return f"slices of {key}: {len(ta)} rows != {len(tb)}"
        ra, rb = slice(ta.first, ta.stop), slice(tb.first, tb.stop)
        names_a = [a.names[i] for i in a.name_id[ra].tolist()]
        names_b = [b.names[i] for i in b.name_id[rb].tolist()]
        if names_a != names_b:
            i = next(i for i, (p, q) in enumerate(zip(names_a, names_b, strict=True)) if p != q)
            return f"slices of {key}, row {i}: name {names_a[i]!r} != {names_b[i]!r}"
        for column in _COLUMNS:
            x, y = getattr(a, column)[ra], getattr(b, column)[rb]
            if not np.array_equal(x, y):
                i = int(np.flatnonzero(x != y)[0])
                return f"slices of {key}, row {i} ({names_a[i]}): {column} {x[i]} != {y[i]}"
    return None


_COLUMNS = ("start", "end", "depth", "address", "instructions", "cycles", "flags", "icache_lines")


def assert_same_trace(a: Path, b: Path) -> None:
    """The traces at ``a`` and ``b`` show the same (else the first difference)."""
    trace_a, trace_b = read_columns(a), read_columns(b)
    diff = first_trace_difference(trace_a, trace_b)
    assert diff is None, f"{a.name} and {b.name} differ: {diff}"
    assert len(trace_a) > 0, f"{a}: no slices (proves nothing)"


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
