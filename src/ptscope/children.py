"""What ptscope leaves behind when it stops: no running child, no temporary directory.

Shared by the record and decode stages (and the CLI):

- :func:`die_with_parent` is the ``preexec_fn`` of every helper process ptscope starts and
  waits for (``perf script``, ``perf buildid-list``): the kernel kills the child when
  ptscope dies, even by ``SIGKILL``, which no handler sees (``PR_SET_PDEATHSIG``). The
  recording processes have their own rule (perf record gets ``SIGINT`` to finish its
  file, QEMU's recorder watches ptscope's process and stops the program).
- :func:`temporary_directory` names its directory ``PREFIX<pid>-XXXXXXXX`` and removes it
  on every way out of the ``with`` (signals included: the CLI turns ``SIGTERM`` and
  ``SIGHUP`` into an exception, :class:`~ptscope.errors.Terminated`). A ptscope killed by
  ``SIGKILL`` cannot remove anything: the next one that makes a directory with the same
  prefix removes those whose process is gone (:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

__all__ = ["die_with_parent", "process_alive", "sweep_stale", "temporary_directory"]

_PR_SET_PDEATHSIG: Final = 1


def _find_prctl() -> Callable[..., Any] | None:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Looked up here, once: a child between fork and exec should do as little as possible
# (no dlopen while another thread might hold the loader's lock).
_PRCTL: Final = _find_prctl()


def die_with_parent() -> None:
    """``preexec_fn``: the child gets ``SIGKILL`` when ptscope dies (runs in the child
    between fork and exec). ``PR_SET_PDEATHSIG`` follows the thread that forked: ptscope
    starts its helpers from the main thread."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not finished (a zombie has)."""
    if pid <= 0:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[-1][:3].strip() not in ("Z", "X")


def _owner(name: str, prefix: str) -> int | None:
    m = re.fullmatch(re.escape(prefix) + r"(\d+)-.+", name)
    return int(m.group(1)) if m else None


def sweep_stale(prefix: str, directory: Path | None = None) -> list[Path]:
    """Remove ``PREFIX<pid>-*`` directories (in ``directory``, default the temporary one)
    whose process is gone: what a ptscope killed by ``SIGKILL`` left. Returns them."""
    base = Path(directory if directory is not None else tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(base.iterdir())
    except OSError:
        return removed
    for entry in entries:
        owner = _owner(entry.name, prefix)
        if owner is None or owner == os.getpid() or process_alive(owner):
            continue
        with contextlib.suppress(OSError):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def temporary_directory(prefix: str) -> Iterator[Path]:
    """A new directory ``$TMPDIR/PREFIX<pid>-XXXXXXXX``, removed when the ``with`` ends,
    however it ends. Stale ones of dead processes are removed first."""
    sweep_stale(prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
