"""Running ``ptscope`` as a user does (a subprocess), and checking its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["one_line_error", "ptscope"]


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
