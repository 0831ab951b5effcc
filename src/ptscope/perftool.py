"""Finding and running the ``perf`` tool: the one place that knows its path and version.

Shared infrastructure for the record and decode stages. ``PTSCOPE_PERF`` overrides the
binary (default: ``perf`` on ``PATH``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ptscope.errors import ToolMissingError

__all__ = ["PerfTool", "find_perf", "perf_env", "perf_output"]

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
    cached = _cache_get(path, ("--version",))
    if cached is not None:
        m = _VERSION_RE.search(cached[1])
        if m:
            version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
            return PerfTool(path=path, version=version, version_text=cached[1].strip())
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
    _cache_put(path, ("--version",), out.returncode, out.stdout, out.stderr)
    version = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    return PerfTool(path=path, version=version, version_text=text)


# What perf says about itself (version, build options) changes only with the binary, and
# asking costs ~12 ms a call: `ptscope run` must start the workload right after perf is
# ready, so the answers are kept on disk, keyed by the binary's path, size and mtime.


def _cache_file(path: str, args: tuple[str, ...]) -> Path | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{' '.join(args)}"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(base) / "ptscope" / "perf" / f"{digest}.json"


def _cache_get(path: str, args: tuple[str, ...]) -> tuple[int, str, str] | None:
    file = _cache_file(path, args)
    if file is None:
        return None
    try:
        data = json.loads(file.read_text())
        return int(data["rc"]), str(data["stdout"]), str(data["stderr"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_put(path: str, args: tuple[str, ...], rc: int, stdout: str, stderr: str) -> None:
    file = _cache_file(path, args)
    if file is None:
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"rc": rc, "stdout": stdout, "stderr": stderr}))
        tmp.replace(file)
    except OSError:
        pass  # a cache that cannot be written only costs time


def perf_output(path: str, *args: str, timeout: float = 30) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``perf ARGS`` for questions about perf itself (its
    version, build options), answered from the on-disk cache when the binary is unchanged.
    Raises OSError / TimeoutExpired like ``subprocess.run``."""
    cached = _cache_get(path, args)
    if cached is not None:
        return cached
    out = subprocess.run(
        [path, *args], capture_output=True, text=True, env=perf_env(), timeout=timeout
    )
    _cache_put(path, args, out.returncode, out.stdout, out.stderr)
    return out.returncode, out.stdout, out.stderr
