"""Running ``ptscope`` as a user does (a subprocess), and checking its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.decoder_parity import perf_decodes_the_same

__all__ = ["dump_rows", "one_line_error", "ptscope", "traced_by_both_decoders"]


def ptscope(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ptscope", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        input=stdin,
        cwd=cwd,
        timeout=timeout,
    )


def one_line_error(result: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The command failed with exactly one `ptscope: error:` line, nothing more on stderr
    but hints, and no traceback; returns that line."""
    assert result.returncode != 0
    if code is not None:
        assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("ptscope: error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def traced_by_both_decoders(program: Path, where: Path) -> tuple[Path, Path]:
    """``program`` recorded under QEMU (in ``where``) and decoded by the own decoder (which
    must write the trace the dlfilter writes of it), then its recording decoded again by
    the text decoder: the two traces."""
    recording = where / "rec"
    native, text = where / "native.fxt", where / "text.fxt"
    done = ptscope(
        *("run", "--backend", "emulated", "--keep-recording", str(recording)),
        *("-o", str(native), "--", str(program)),
    )
    assert done.returncode == 0, done.stderr
    perf_decodes_the_same(recording, native)
    done = ptscope("decode", str(recording), "--decoder", "text", "-o", str(text))
    assert done.returncode == 0, done.stderr
    return native, text


def dump_rows(trace: Path) -> list[tuple[int, str]]:
    """(depth, name) of every slice of ``trace``, as ``ptscope dump`` lists them."""
    done = ptscope("dump", str(trace))
    assert done.returncode == 0, done.stderr
    return [(int(r.split()[4]), r.split(maxsplit=5)[5]) for r in done.stdout.splitlines()]
