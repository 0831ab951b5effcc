"""A recording: what a record backend leaves on disk, and the metadata that lets
``ptscope decode`` turn it into a trace again later (the contract between record and decode).

Layout of a recording directory::

    DIR/perf.data                  one perf.data per snapshot (perf.data, perf.data.<ts>...)
    DIR/ptscope-recording.json     this module's metadata (JSON, versioned)
    DIR/perf-PID.map               JIT perf maps of the recorded processes, when they wrote one
    DIR/jitted-code.bin            emulated backend: the bytes of code no file holds (JIT)

``ptscope decode`` accepts the directory or a bare perf.data (then without metadata).

The metadata is checked against a schema when it is read (:func:`check_metadata`, with
pydantic): every value of the wrong type, out of range or missing is one line naming the
field, and the perf.data files it names are plain names in the directory (no path
outside it, no symbolic link that leads out). What ptscope opens to repair or keep in a
recording (:func:`open_regular`) is a regular file, never reached through a symbolic link
and never a FIFO or a device, and a file it writes there is written under a new name and
renamed (:func:`write_new`), so a prepared directory cannot make it write anywhere else.
Metadata as ptscope writes it is read
without pydantic (:func:`_plain_fields`, which accepts only what the schema accepts):
importing it and building the schema cost 0.2 s on every command that reads a recording.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from ptscope.errors import BadInputError

__all__ = [
    "METADATA_NAME",
    "RECORDING_FORMAT_VERSION",
    "Recording",
    "TriggerHit",
    "check_metadata",
    "is_archive",
    "keep_perf_maps",
    "open_regular",
    "plain_name",
    "require_format",
    "schema_error",
    "shown",
    "write_new",
]

log = logging.getLogger("ptscope")

METADATA_NAME: Final = "ptscope-recording.json"
RECORDING_FORMAT: Final = "ptscope-recording"
RECORDING_FORMAT_VERSION: Final = 1
BACKENDS: Final = ("", "intel-pt", "emulated", "sampling")
"""``""``: a bare perf.data (an archive writes metadata for one)."""
SCOPES: Final = ("user", "kernel", "user+kernel")
MAX_ID: Final = (1 << 32) - 1
"""Process and thread IDs: perf's are 32 bits."""
MAX_TIME: Final = (1 << 63) - 1
MAX_ADDRESS: Final = (1 << 64) - 1


def shown(value: object, limit: int = 40) -> str:
    """A JSON value as the file spells it, cut to ``limit`` characters (for messages)."""
    try:
        text = json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def require_format(data: object, name: str, version: int, path: Path | str, what: str) -> None:
    """Refuse, in one line, JSON whose ``format`` is not ``name``, whose ``version`` is not
    a whole number from 1, or is newer than ``version`` (the versioned JSON files ptscope
    writes)."""
    if not isinstance(data, dict) or data.get("format") != name:
        raise BadInputError(f"{path} is not ptscope {what}")
    if "version" not in data:
        raise BadInputError(f"{path}: field 'version' is missing")
    found = data["version"]
    if type(found) is not int or found < 1:
        raise BadInputError(
            f"{path}: field 'version' must be a whole number from 1, not {shown(found)}"
        )
    if found > version:
        raise BadInputError(f"{path} was written by a newer ptscope ({what} version {found})")


def plain_name(text: str) -> str:
    """A schema check: ``text`` names an entry of the directory itself (no ``/``, not
    ``.`` or ``..``), so that a file can never lead the reader outside it."""
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise ValueError("must be a file name inside the recording directory")
    return text


def _id_key(text: str) -> int:
    """A schema check: a JSON object key that is a process or thread ID, written as
    ``json.dumps`` writes an int key (``"1"``, never ``"01"``, ``"+1"`` or ``"1.0"``)."""
    if not (text.isascii() and text.isdigit() and str(int(text)) == text) or int(text) > MAX_ID:
        raise ValueError(f"must be a process or thread ID (a decimal number, 0 to {MAX_ID})")
    return int(text)


def schema_error(path: Path | str, error: Any) -> BadInputError:
    """One line for a pydantic ``ValidationError``: the first field that is wrong and
    what is wrong with it (every problem with ``-v``)."""
    problems = [_problem(e) for e in error.errors()]
    more = f" (and {len(problems) - 1} more problem{'s' * (len(problems) > 2)})"
    return BadInputError(
        f"{path}: {problems[0]}{more if len(problems) > 1 else ''}",
        details="\n".join(problems) if len(problems) > 1 else None,
    )


def _problem(error: Any) -> str:
    loc = list(error["loc"])
    if not loc:  # the document as a whole (JSON that pydantic's parser refuses)
        return str(error["msg"])
    key = loc[-1] == "[key]"
    if key:  # a JSON object's key: the location ends with the key itself, then "[key]"
        loc = loc[:-2]
    where = ""
    for part in loc:
        if isinstance(part, int):
            where += f"[{part}]"
        else:
            where += f".{part}" if where else str(part)
    if error["type"] == "missing":
        return f"field '{where}' is missing"
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    if key:
        return f"field '{where}' has the key {shown(error['input'])}: {message}"
    return f"field '{where}': {message}, not {shown(error['input'])}"


@functools.cache
def _metadata_schema() -> Callable[[bytes], Any]:
    """The validator of ``ptscope-recording.json`` (pydantic, strict: no number taken for a
    string or the reverse; JSON object keys are the one place a number is read from a
    string). Built on first use: importing pydantic and building the models costs a tenth
    of a second, which ``ptscope run`` must not pay before the program starts."""
    from typing import Annotated, Literal

    from pydantic import AfterValidator, BaseModel, ConfigDict, Field

    Id = Annotated[int, Field(ge=0, le=MAX_ID)]
    IdKey = Annotated[str, AfterValidator(_id_key)]  # a JSON key: the ID in decimal
    Name = Annotated[str, AfterValidator(plain_name)]

    class Model(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")

    class Hit(Model):
        time: Annotated[int, Field(ge=0, le=MAX_TIME)]
        pid: Id
        tid: Id
        ip: Annotated[int, Field(ge=0, le=MAX_ADDRESS)]
        symbol: str = ""

    class Notes(Model):
        model_config = ConfigDict(strict=True, extra="allow")
        state: str = ""
        recorder_pid: Id = 0

    class Metadata(Model):
        format: Literal["ptscope-recording"]
        version: Annotated[int, Field(ge=1, le=RECORDING_FORMAT_VERSION)]
        backend: Literal["", "intel-pt", "emulated", "sampling"] = ""
        perf_data: list[Name] = Field(default_factory=lambda: ["perf.data"], min_length=1)
        command: list[str] = Field(default_factory=list)
        processes: dict[IdKey, str] = Field(default_factory=dict)
        threads: dict[IdKey, str] = Field(default_factory=dict)
        hits: list[Hit] = Field(default_factory=list)
        perf_version: str = ""
        scope: Literal["user", "kernel", "user+kernel"] = "user"
        notes: Notes = Field(default_factory=Notes)

    def check(text: bytes) -> Any:
        return Metadata.model_validate_json(text)

    return check


def check_metadata(text: bytes, path: Path | str) -> dict[str, Any]:
    """The fields of a ``ptscope-recording.json`` (its bytes), checked against the schema;
    one :class:`BadInputError` line for the first field that is wrong."""
    constants: list[str] = []  # NaN, Infinity: Python's parser takes them, pydantic's not

    def constant(name: str) -> float:
        constants.append(name)
        return float(name)

    try:
        data = json.loads(text, parse_constant=constant)
    except (ValueError, RecursionError) as e:
        raise BadInputError(f"cannot read {path}: not JSON ({e})") from None
    require_format(data, RECORDING_FORMAT, RECORDING_FORMAT_VERSION, path, "recording metadata")
    plain = None if constants or text.startswith(b"\xef\xbb\xbf") else _plain_fields(data)
    if plain is not None:
        return plain
    from pydantic import ValidationError

    try:
        model = _metadata_schema()(text)
    except ValidationError as e:
        raise schema_error(path, e) from None
    # Field by field (not model_dump): the ID keys were read from strings into ints.
    fields: dict[str, Any] = {name: getattr(model, name) for name in type(model).model_fields}
    fields["hits"] = [hit.model_dump() for hit in model.hits]
    fields["notes"] = model.notes.model_dump(exclude_unset=True)
    return fields


def _plain_fields(data: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`check_metadata`'s fields without pydantic, for metadata as ptscope writes
    it; None for anything else, which the schema then judges (and words the error).

    Importing pydantic and building the schema cost 0.2 s, before perf could start, on
    every command that reads a recording (a decode, each drill-down). This accepts only
    what the schema accepts and gives what it gives (``tests/record/test_metadata_fast.py``
    compares the two); the schema stays the definition and the only source of messages.
    """

    def ids(value: object) -> dict[int, str] | None:
        if type(value) is not dict:
            return None
        out: dict[int, str] = {}
        for key, name in value.items():
            if type(name) is not str:
                return None
            try:
                out[_id_key(key)] = name
            except ValueError:
                return None
        return out

    def number(value: object, high: int) -> bool:
        return type(value) is int and 0 <= value <= high

    def file_name(value: object) -> bool:
        try:
            return type(value) is str and bool(plain_name(value))
        except ValueError:
            return False

    def strings(value: object) -> bool:
        return type(value) is list and all(type(v) is str for v in value)

    fields: dict[str, Any] = {
        "format": data["format"],
        "version": data["version"],
        "backend": data.get("backend", ""),
        "perf_data": data.get("perf_data", ["perf.data"]),
        "command": data.get("command", []),
        "perf_version": data.get("perf_version", ""),
        "scope": data.get("scope", "user"),
    }
    # format and version: require_format() has checked them.
    if not (
        type(fields["backend"]) is str
        and fields["backend"] in BACKENDS
        and type(fields["perf_data"]) is list
        and fields["perf_data"]
        and all(file_name(n) for n in fields["perf_data"])
        and strings(fields["command"])
        and type(fields["perf_version"]) is str
        and type(fields["scope"]) is str
        and fields["scope"] in SCOPES
    ):  # fmt: skip
        return None
    processes, threads = ids(data.get("processes", {})), ids(data.get("threads", {}))
    if processes is None or threads is None:
        return None
    fields["processes"], fields["threads"] = processes, threads
    hits = data.get("hits", [])
    if type(hits) is not list:
        return None
    fields["hits"] = []
    for hit in hits:
        if type(hit) is not dict:
            return None
        kept = {k: hit.get(k) for k in ("time", "pid", "tid", "ip")}
        kept["symbol"] = hit.get("symbol", "")
        if not (
            number(kept["time"], MAX_TIME)
            and number(kept["pid"], MAX_ID)
            and number(kept["tid"], MAX_ID)
            and number(kept["ip"], MAX_ADDRESS)
            and type(kept["symbol"]) is str
        ):
            return None
        fields["hits"].append(kept)
    notes = data.get("notes", {})
    if type(notes) is not dict:
        return None
    if "state" in notes and type(notes["state"]) is not str:
        return None
    if "recorder_pid" in notes and not number(notes["recorder_pid"], MAX_ID):
        return None
    fields["notes"] = dict(notes)
    try:  # a lone surrogate (``"\\ud800"``) anywhere: pydantic's parser refuses the file
        json.dumps(data, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return None
    return fields


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

    @property
    def unfinished(self) -> bool:
        """Its recorder never finished it: the notes still say it is being recorded (the
        emulated recorder's, killed while it ran; ``record.emulated.recover``)."""
        return self.notes.get("state") == "recording"

    def metadata_json(self) -> str:
        """The contents of ``ptscope-recording.json`` for this recording."""
        data = asdict(self)
        del data["directory"]
        data = {"format": RECORDING_FORMAT, "version": RECORDING_FORMAT_VERSION, **data}
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def save(self) -> Path:
        path = self.directory / METADATA_NAME
        write_new(path, self.metadata_json().encode())
        return path

    @classmethod
    def load(cls, directory: Path) -> Recording:
        """The recording in ``directory``, its metadata checked (:func:`check_metadata`):
        a bad value, or a perf.data that leads outside the directory, is one line."""
        path = directory / METADATA_NAME
        try:
            fd = open_regular(path, follow=True)
            with open(fd, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            raise BadInputError(
                f"{directory} is not a ptscope recording (no {METADATA_NAME})"
            ) from None
        except OSError as e:
            raise BadInputError(f"cannot read {path}: {e.strerror or e}") from e
        data = check_metadata(text, path)
        _inside(directory, data["perf_data"], path)
        return cls(
            directory=directory,
            backend=data["backend"],
            perf_data=data["perf_data"],
            command=data["command"],
            processes=data["processes"],
            threads=data["threads"],
            hits=[TriggerHit(**h) for h in data["hits"]],
            perf_version=data["perf_version"],
            scope=data["scope"],
            notes=data["notes"],
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


def _inside(directory: Path, names: Sequence[str], path: Path) -> None:
    """Refuse a perf.data entry that is a symbolic link leading out of ``directory`` (the
    schema already made each a plain name in it)."""
    try:
        root = directory.resolve()
        for name in names:
            entry = directory / name
            if entry.is_symlink() and not entry.resolve().is_relative_to(root):
                raise BadInputError(
                    f"{path}: field 'perf_data': {name} is a link to "
                    f"{os.readlink(entry)}, outside the recording directory"
                )
    except (OSError, RuntimeError) as e:  # a loop of links, an unreadable directory
        raise BadInputError(f"cannot read {directory}: {e}") from e


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(
    path: Path, flags: int = os.O_RDONLY, *, follow: bool = False, sole: bool = False
) -> int:
    """Open ``path``, a file of a recording, as a regular file, or refuse in one line
    (:class:`BadInputError`): a FIFO or a device is never opened for real (no hang, no
    side effect), and a symbolic link is never followed unless ``follow``. ``sole``: the
    file must have no other hard link (it is about to be written: it could be anyone's).
    Returns the descriptor (blocking); an ``OSError`` (no such file...) is left to the
    caller."""
    info = os.stat(path, follow_symlinks=follow)
    if not stat.S_ISREG(info.st_mode):
        what = _kind(info.st_mode)
        if stat.S_ISLNK(info.st_mode):
            what += f" (to {os.readlink(path)}), which ptscope does not follow here"
        raise BadInputError(f"{path} is {what}, not a regular file")
    nofollow = 0 if follow else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | nofollow | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # replaced since: a link, a FIFO
            raise BadInputError(f"{path} changed while it was opened") from None
        raise
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
            info.st_dev,
            info.st_ino,
        ):
            raise BadInputError(f"{path} changed while it was opened")
        if sole and now.st_nlink != 1:
            raise BadInputError(
                f"{path} has {now.st_nlink} hard links: ptscope writes only a file "
                "that no other name shares"
            )
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_new(path: Path, data: bytes) -> None:
    """Replace ``path`` with a new regular file holding ``data``: written under a temporary
    name created for it (``O_EXCL``: whatever had that name, a link included, is removed,
    never written through), then renamed over ``path`` (a link there is replaced, not
    followed). A failure (a full disk) leaves ``path`` as it was and no temporary file."""
    tmp = path.with_name(path.name.rsplit(".", 1)[0] + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    try:
        with open(fd, "wb") as f:
            f.write(data)
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()  # a full disk leaves no empty temporary file behind
        raise


def keep_perf_maps(directory: Path, pids: Iterable[int]) -> list[str]:
    """Copy the JIT perf maps of ``pids`` (``/tmp/perf-PID.map``) into the recording, where
    a later decode finds them: /tmp does not last. Returns the names of those kept. A map
    that is not a regular file is not read, and the copy never writes through a link in
    the recording (:func:`open_regular`, :func:`write_new`)."""
    kept: list[str] = []
    for pid in pids:
        source = Path(f"/tmp/perf-{pid}.map")
        try:
            fd = open_regular(source)
            with open(fd, "rb") as f:
                data = f.read()
            write_new(directory / source.name, data)
        except FileNotFoundError:
            continue
        except BadInputError as e:
            log.warning("%s: not kept", e.message)
            continue
        except OSError as e:
            log.warning("cannot keep %s: %s", source, e.strerror)
            continue
        kept.append(source.name)
    return kept


def is_archive(path: Path) -> bool:
    """A recording packed by ``ptscope archive`` (``record/archive.py``): a gzip file or a
    tar file (a perf.data is neither), told by its first bytes: a damaged archive still
    counts, to be refused as one. Here, not with the archive's code, so that a decode can
    tell before it imports that (tarfile, ISA-L) and starts perf."""
    try:
        with open(path, "rb") as f:
            head = f.read(262)
    except OSError:
        return False
    return head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar"
