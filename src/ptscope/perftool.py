"""Finding and running the ``perf`` tool: the one place that knows its path and version.

Shared infrastructure for the record and decode stages. ``PTSCOPE_PERF`` overrides the
binary (default: ``perf`` on ``PATH``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ptscope.errors import ToolMissingError

__all__ = ["PerfTool", "find_perf", "perf_env"]

_VERSION_RE = re.compile(r"perf version (\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class PerfTool:
    """A located perf binary and its version (major, minor, patch)."""

    path: str
    version: tuple[int, int, int]
    version_text: str

    def at_least(self, major: int, minor: int) -> bool:
        return self.version[:2] >= (major, minor)

    @property
    def has_dlfilter(self) -> bool:
        return self.at_least(5, 14)

    @property
    def has_control_fifo(self) -> bool:
        return self.at_least(5, 10)

    @property
    def has_snapshot_on_exit(self) -> bool:
        return self.at_least(5, 4)

    @property
    def has_kcore(self) -> bool:
        return self.at_least(5, 5)


def perf_env() -> dict[str, str]:
    """Environment for perf subprocesses: no pager, C locale for stable text."""
    env = dict(os.environ)
    env["PAGER"] = "cat"
    env["LC_ALL"] = "C"
    return env


@functools.cache
def find_perf() -> PerfTool:
    """Locate perf and read its version, or raise :class:`ToolMissingError`."""
    name = os.environ.get("PTSCOPE_PERF", "perf")
    path = shutil.which(name) if os.sep not in name else (name if Path(name).exists() else None)
    hint = "install it with: sudo apt-get install linux-perf (or set PTSCOPE_PERF)"
    if path is None:
        raise ToolMissingError(f"perf not found ({name})", hint=hint)
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, env=perf_env(), timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissingError(f"cannot run {path}: {e}", hint=hint) from e
    text = (out.stdout or out.stderr).strip()
    m = _VERSION_RE.search(text)
    if out.returncode != 0 or not m:
        raise ToolMissingError(
            f"{path} does not look like perf (`perf --version` said: {text[:80]!r})",
            details=out.stderr,
            hint=hint,
        )
    version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    return PerfTool(path=path, version=version, version_text=text)
