"""A recording: what a record backend leaves on disk, and the metadata that lets
``ptscope decode`` turn it into a trace again later (the contract between record and decode).

Layout of a recording directory::

    DIR/perf.data                  one perf.data per snapshot (perf.data, perf.data.<ts>...)
    DIR/ptscope-recording.json     this module's metadata (JSON, versioned)
    DIR/perf-PID.map               JIT perf maps of the recorded processes, when they wrote one
    DIR/jitted-code.bin            emulated backend: the bytes of code no file holds (JIT)

``ptscope decode`` accepts the directory or a bare perf.data (then without metadata).
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from ptscope.errors import BadInputError

__all__ = [
    "METADATA_NAME",
    "RECORDING_FORMAT_VERSION",
    "Recording",
    "TriggerHit",
    "keep_perf_maps",
    "require_format",
]

log = logging.getLogger("ptscope")

METADATA_NAME: Final = "ptscope-recording.json"
RECORDING_FORMAT: Final = "ptscope-recording"
RECORDING_FORMAT_VERSION: Final = 1


def require_format(
    data: dict[str, Any], name: str, version: int, path: Path | str, what: str
) -> None:
    """Refuse, in one line, JSON whose ``format`` is not ``name`` or whose ``version`` is
    newer than ``version`` (the versioned JSON files ptscope writes)."""
    if not isinstance(data, dict) or data.get("format") != name:
        raise BadInputError(f"{path} is not ptscope {what}")
    if int(data.get("version", 0)) > version:
        raise BadInputError(
            f"{path} was written by a newer ptscope ({what} version {data['version']})"
        )


@dataclass
class TriggerHit:
    """A trigger (breakpoint) fired: when, where, on which thread."""

    time: int
    pid: int
    tid: int
    ip: int
    symbol: str = ""


@dataclass
class Recording:
    """Metadata of one recording. Paths in ``perf_data`` are relative to ``directory``."""

    directory: Path
    backend: str
    perf_data: list[str] = field(default_factory=lambda: ["perf.data"])
    command: list[str] = field(default_factory=list)
    processes: dict[int, str] = field(default_factory=dict)
    threads: dict[int, str] = field(default_factory=dict)
    hits: list[TriggerHit] = field(default_factory=list)
    perf_version: str = ""
    scope: str = "user"
    notes: dict[str, Any] = field(default_factory=dict)

    def perf_data_paths(self) -> list[Path]:
        return [self.directory / p for p in self.perf_data]

    def metadata_json(self) -> str:
        """The contents of ``ptscope-recording.json`` for this recording."""
        data = asdict(self)
        del data["directory"]
        data = {"format": RECORDING_FORMAT, "version": RECORDING_FORMAT_VERSION, **data}
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def save(self) -> Path:
        path = self.directory / METADATA_NAME
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(self.metadata_json())
            tmp.replace(path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()  # a full disk leaves no empty temporary file behind
            raise
        return path

    @classmethod
    def load(cls, directory: Path) -> Recording:
        path = directory / METADATA_NAME
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise BadInputError(
                f"{directory} is not a ptscope recording (no {METADATA_NAME})"
            ) from None
        except (OSError, ValueError) as e:
            raise BadInputError(f"cannot read {path}: {e}") from e
        require_format(data, RECORDING_FORMAT, RECORDING_FORMAT_VERSION, path, "recording metadata")
        return cls(
            directory=directory,
            backend=str(data.get("backend", "")),
            perf_data=list(data.get("perf_data", ["perf.data"])),
            command=list(data.get("command", [])),
            processes={int(k): str(v) for k, v in data.get("processes", {}).items()},
            threads={int(k): str(v) for k, v in data.get("threads", {}).items()},
            hits=[TriggerHit(**h) for h in data.get("hits", [])],
            perf_version=str(data.get("perf_version", "")),
            scope=str(data.get("scope", "user")),
            notes=dict(data.get("notes", {})),
        )

    @classmethod
    def find(cls, path: Path) -> Recording:
        """The recording for a directory, a perf.data inside one, or a bare perf.data."""
        if path.is_dir():
            if (path / METADATA_NAME).exists():
                return cls.load(path)
            if (path / "perf.data").exists() or (path / "data").exists():
                # A bare perf.data directory (perf record --kcore) or a dir with perf.data.
                if (path / "data").exists():
                    return cls(directory=path.parent, backend="", perf_data=[path.name])
                return cls(directory=path, backend="", perf_data=["perf.data"])
            raise BadInputError(f"{path} holds no perf.data")
        if not path.exists():
            raise BadInputError(f"{path}: no such file")
        if (path.parent / METADATA_NAME).exists():
            rec = cls.load(path.parent)
            rec.perf_data = [path.name]
            return rec
        return cls(directory=path.parent, backend="", perf_data=[path.name])


def keep_perf_maps(directory: Path, pids: Iterable[int]) -> list[str]:
    """Copy the JIT perf maps of ``pids`` (``/tmp/perf-PID.map``) into the recording, where
    a later decode finds them: /tmp does not last. Returns the names of those kept."""
    kept: list[str] = []
    for pid in pids:
        source = Path(f"/tmp/perf-{pid}.map")
        if source.is_file():
            try:
                shutil.copyfile(source, directory / source.name)
            except OSError as e:
                log.warning("cannot keep %s: %s", source, e.strerror)
                continue
            kept.append(source.name)
    return kept
