"""Portable recordings: a recording plus every binary its trace touches, in one
``.tar.gz`` that ``ptscope decode`` decodes on another machine.

Like ``perf archive`` (the ``perf-archive`` script): ``perf buildid-list -i perf.data
--with-hits`` names every object the samples hit, with its build-id, and each is stored
the way perf's build-id cache stores it, so that perf itself finds them::

    ptscope-archive.json                       manifest (format, version, contents)
    recording/                                 the recording (perf.data*, metadata, maps)
    .debug/.build-id/<id[:2]>/<id[2:]>         -> ../../<path>/<id>   (a relative link)
    .debug/<path>/<id>/elf                     the binary (kallsyms / vdso for those)
    .debug/<path>/<id>/debug                   its separate debug info, when there is one

Decoding passes ``--symfs <archive root>`` to perf: with a symfs, perf looks for its
build-id cache in ``<symfs>/.debug`` and prefixes every other path with the symfs (perf
commit "perf tools: Set buildid dir under symfs when --symfs is provided"), so nothing
from the decoding machine is used: what decodes is what was archived. With a symfs perf
does not look for kernel symbols at all, so the archived kallsyms go in ``--kallsyms``.

For each object the binary is taken from perf's own cache (``~/.debug``, where ``perf
record`` puts it) or from its path when the file there still has the recorded build-id;
debug info from the cache or ``/usr/lib/debug/.build-id/``. Kernel symbols
(``[kernel.kallsyms]``) come from the cache or, when the running kernel is the one
recorded, ``/proc/kallsyms``.

Unpacking (:func:`unpack_archive`) takes only what cannot land outside its directory:
files, directories, links inside it, a hard link only to a file unpacked before it; and at
most :data:`DEFAULT_UNPACK_LIMIT` bytes of files in all (``PTSCOPE_UNPACK_LIMIT`` sets
another size), so that a small archive cannot fill the disk.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import subprocess
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

from ptscope.children import die_with_parent
from ptscope.errors import BadInputError, PtscopeError, ToolMissingError, UsageError
from ptscope.perftool import PerfTool, perf_env
from ptscope.record.build_id import file_build_id, kernel_build_id
from ptscope.record.perf_commands import format_size, parse_size
from ptscope.recording import (
    METADATA_NAME,
    Recording,
    is_archive,
    plain_name,
    require_format,
    schema_error,
)

__all__ = [
    "ARCHIVE_FORMAT",
    "ARCHIVE_VERSION",
    "DEFAULT_UNPACK_LIMIT",
    "UNPACK_LIMIT_ENV",
    "ArchiveSummary",
    "ArchivedObject",
    "UnpackedArchive",
    "create_archive",
    "is_archive",
    "unpack_archive",
]

ARCHIVE_FORMAT: Final = "ptscope-archive"
ARCHIVE_VERSION: Final = 1
MANIFEST: Final = "ptscope-archive.json"
RECORDING_DIR: Final = "recording"
CACHE_DIR: Final = ".debug"
KERNEL: Final = "[kernel.kallsyms]"
_SPECIAL_BASENAMES: Final = {KERNEL: "kallsyms", "[vdso]": "vdso"}
UNPACK_LIMIT_ENV: Final = "PTSCOPE_UNPACK_LIMIT"
DEFAULT_UNPACK_LIMIT: Final = 4 << 30
"""The most bytes an archive's files may hold in all, unpacked (``PTSCOPE_UNPACK_LIMIT``)."""

try:
    from isal.igzip import IGzipFile as _GzipFile  # several times faster than zlib
except ImportError:  # pragma: no cover
    from gzip import GzipFile as _GzipFile  # type: ignore[assignment]


@dataclass
class ArchivedObject:
    build_id: str
    path: str
    """As perf names it: an absolute path, ``[kernel.kallsyms]`` or ``[vdso]``."""
    files: list[str] = field(default_factory=list)
    """Archive members: the object, and its debug info when found."""
    source: str = ""
    """Where the object was taken from."""


@dataclass
class ArchiveSummary:
    output: Path
    objects: list[ArchivedObject]
    missing: list[tuple[str, str, str]]
    """(build-id, path, why) of objects that could not be archived."""
    file_bytes: int


@dataclass
class UnpackedArchive:
    recording: Recording
    symfs: Path
    """The root to give perf as ``--symfs`` (its build-id cache is ``symfs/.debug``)."""
    manifest: dict[str, object]
    kallsyms: Path | None = None
    """The kernel's symbols, for perf's ``--kallsyms`` (with a symfs, perf does not look
    for them itself)."""


def default_cache() -> Path:
    """perf's build-id cache (``buildid.dir``; perf's default is ``~/.debug``)."""
    return Path(os.path.expanduser("~")) / ".debug"


# -- which objects ----------------------------------------------------------------------


def list_build_ids(perf: PerfTool, perf_data: Path, *, with_hits: bool) -> list[tuple[str, str]]:
    """(build-id, path) of the objects ``perf buildid-list`` names: those with samples
    (``with_hits``: what ``perf archive`` takes) or those in the file's build-id table
    (``[vdso]`` is only there)."""
    try:
        done = subprocess.run(
            [perf.path, "buildid-list", "-i", str(perf_data), *(["--with-hits"] * with_hits)],
            capture_output=True,
            text=True,
            env=perf_env(),
            timeout=600,
            preexec_fn=die_with_parent,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissingError(f"cannot run perf buildid-list: {e}") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInputError(f"perf cannot read {perf_data}: {last}")
    found = []
    for line in done.stdout.splitlines():
        if not line or line.startswith(" "):  # perf-archive skips indented lines too
            continue
        build_id, _, path = line.partition(" ")
        if build_id and path and all(c in "0123456789abcdef" for c in build_id):
            found.append((build_id, path.strip()))
    return found


_CALLCHAIN_OBJECT: Final = re.compile(r"\((/[^()]+)\)\s*$")


def callchain_objects(perf: PerfTool, perf_data: Path) -> set[str]:
    """Files named in the samples' call chains. ``--with-hits`` counts only the object
    of each sample's own address, so a library that only a call chain passes through
    (a syscall's sample, with libc under the kernel) needs this to be archived."""
    found: set[str] = set()
    try:
        with subprocess.Popen(
            [perf.path, "script", "-i", str(perf_data), "-F", "ip,dso"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=perf_env(),
            preexec_fn=die_with_parent,
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                m = _CALLCHAIN_OBJECT.search(line)
                if m is not None:
                    found.add(m.group(1))
    except OSError as e:
        raise ToolMissingError(f"cannot run perf script: {e}") from e
    return found


def _wanted(recording: Recording, perf: PerfTool) -> dict[tuple[str, str], None]:
    """(build-id, path) of every object to archive ("" for a file with no build-id)."""
    wanted: dict[tuple[str, str], None] = {}
    for perf_data in recording.perf_data_paths():
        if not perf_data.exists():
            raise BadInputError(f"{perf_data}: no such file (the recording is incomplete)")
        for with_hits in (True, False):
            wanted.update(dict.fromkeys(list_build_ids(perf, perf_data, with_hits=with_hits)))
        if recording.backend == "sampling":
            known = {path for _, path in wanted}
            for path in sorted(callchain_objects(perf, perf_data) - known):
                build_id = file_build_id(path)
                wanted[(build_id.hex() if build_id else "", path)] = None
    if recording.scope != "user":
        running = kernel_build_id()
        if running is not None and not any(path == KERNEL for _, path in wanted):
            wanted[(running.hex(), KERNEL)] = None
    return wanted


def _mirror_name(path: str) -> str | None:
    """Where perf looks for ``path`` under the symfs (None for pseudo-objects)."""
    if not path.startswith("/"):
        return None
    name = str(PurePosixPath(path).relative_to("/"))
    top = name.split("/", 1)[0]
    if top in (CACHE_DIR, RECORDING_DIR, MANIFEST) or ".." in PurePosixPath(name).parts:
        return None
    return name


def _member_dir(build_id: str, path: str) -> str:
    """``.debug/<path>/<build-id>``, as perf's cache names it."""
    parts = [p for p in PurePosixPath(path).parts if p not in ("/", "")]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"unusable object path {path!r}")
    return "/".join([CACHE_DIR, *parts, build_id])


def _find_object(build_id: str, path: str, cache: Path) -> tuple[Path | None, str]:
    """The file that is object ``path`` with ``build_id`` on this machine, and why not
    when there is none."""
    in_cache = cache / ".build-id" / build_id[:2] / build_id[2:]
    basename = _SPECIAL_BASENAMES.get(path, "elf")
    if (in_cache / basename).is_file():
        return in_cache / basename, ""
    if path == KERNEL:
        running = kernel_build_id()
        if running is not None and running.hex() == build_id:
            return Path("/proc/kallsyms"), ""
        return None, "not the running kernel, and not in perf's build-id cache"
    if path.startswith("["):
        return None, "not in perf's build-id cache"
    found = file_build_id(path)
    if found is not None and found.hex() == build_id:
        return Path(path), ""
    if not os.path.exists(path):
        return None, "the file is gone and it is not in perf's build-id cache"
    return None, "the file changed since the recording (another build-id)"


def _find_debug(build_id: str, cache: Path) -> Path | None:
    candidates = [
        cache / ".build-id" / build_id[:2] / build_id[2:] / "debug",
        Path("/usr/lib/debug/.build-id") / build_id[:2] / f"{build_id[2:]}.debug",
    ]
    return next((c for c in candidates if c.is_file()), None)


# -- writing ----------------------------------------------------------------------------


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    tar.addfile(info)


def _add_file(tar: tarfile.TarFile, source: Path, name: str) -> None:
    """The file's contents under ``name`` (links followed: the cache is made of them)."""
    if source == Path("/proc/kallsyms"):  # a proc file: its size reads as 0
        _add_bytes(tar, name, source.read_bytes())
        return
    real = source.resolve()
    info = tar.gettarinfo(str(real), arcname=name)
    info.mode = 0o644
    with open(real, "rb") as f:
        tar.addfile(info, f)


def _recording_files(recording: Recording) -> list[Path]:
    """What to copy of the recording: its perf.data files or directories, the metadata
    and JIT maps."""
    directory = recording.directory
    files = [p for p in recording.perf_data_paths()]
    files += [directory / METADATA_NAME] if (directory / METADATA_NAME).exists() else []
    files += sorted(directory.glob("perf-*.map"))
    return files


class _NotArchived(Exception):
    pass


class _Packer:
    """Adds objects to the archive: each under perf's build-id cache layout, with its
    ``.build-id`` link, and a link at its own path for perf's lookups by path (objects
    perf has no build-id for: libraries only call chains pass through)."""

    def __init__(self, tar: tarfile.TarFile, cache: Path) -> None:
        self.tar = tar
        self.cache = cache
        self.names: set[str] = set()

    def _link(self, name: str, target: str) -> None:
        if name not in self.names:
            _add_link(self.tar, name, os.path.relpath(target, os.path.dirname(name)))
            self.names.add(name)

    def add(self, build_id: str, path: str) -> ArchivedObject:
        mirror = _mirror_name(path)
        if not build_id:
            if mirror is None or not os.path.isfile(path):
                raise _NotArchived("the file is gone (and it has no build-id)")
            _add_file(self.tar, Path(path), mirror)
            self.names.add(mirror)
            return ArchivedObject(build_id, path, [mirror], path)
        source, why = _find_object(build_id, path, self.cache)
        if source is None:
            raise _NotArchived(why)
        try:
            member = _member_dir(build_id, path)
        except ValueError as e:
            raise _NotArchived(str(e)) from e
        item = ArchivedObject(build_id, path, source=str(source))
        name = f"{member}/{_SPECIAL_BASENAMES.get(path, 'elf')}"
        _add_file(self.tar, source, name)
        item.files.append(name)
        debug = _find_debug(build_id, self.cache) if path not in _SPECIAL_BASENAMES else None
        if debug is not None:
            _add_file(self.tar, debug, f"{member}/debug")
            item.files.append(f"{member}/debug")
        # One .build-id link per build-id, as in perf's cache.
        self._link(f"{CACHE_DIR}/.build-id/{build_id[:2]}/{build_id[2:]}", member)
        if mirror is not None:
            self._link(mirror, name)
        return item


def create_archive(
    recording: Recording, output: Path, *, perf: PerfTool, cache: Path | None = None
) -> ArchiveSummary:
    """Write ``recording`` and the objects it needs to ``output`` (a .tar.gz)."""
    cache = cache if cache is not None else default_cache()
    wanted = _wanted(recording, perf)
    objects: list[ArchivedObject] = []
    missing: list[tuple[str, str, str]] = []
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        gz = _GzipFile(tmp, "wb")  # type: ignore[no-untyped-call]
        with gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for part in _recording_files(recording):
                tar.add(part, arcname=f"{RECORDING_DIR}/{part.name}")
            if not (recording.directory / METADATA_NAME).exists():
                # A bare perf.data: say what it is, so that the archive decodes as is.
                meta = Recording(recording.directory, recording.backend, recording.perf_data)
                _add_bytes(tar, f"{RECORDING_DIR}/{METADATA_NAME}", meta.metadata_json().encode())
            packer = _Packer(tar, cache)
            for build_id, path in wanted:
                try:
                    objects.append(packer.add(build_id, path))
                except _NotArchived as e:
                    missing.append((build_id, path, str(e)))
            manifest = {
                "format": ARCHIVE_FORMAT,
                "version": ARCHIVE_VERSION,
                "recording": RECORDING_DIR,
                "perf_version": perf.version_text,
                "objects": [asdict(o) for o in objects],
                "missing": [{"build_id": b, "path": p, "why": w} for b, p, w in missing],
            }
            _add_bytes(tar, MANIFEST, json.dumps(manifest, indent=1).encode())
        tmp.replace(output)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise PtscopeError(f"cannot write {output}: {e.strerror or e}") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return ArchiveSummary(output, objects, missing, output.stat().st_size)


# -- reading ----------------------------------------------------------------------------


def _check_member(member: tarfile.TarInfo) -> None:
    """Refuse anything that could land outside the directory it is unpacked in."""
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise BadInputError(f"archive member {member.name!r} points outside the archive")
    if member.issym() or member.islnk():
        target = PurePosixPath(member.linkname)
        resolved = [*name.parent.parts, *target.parts] if member.issym() else [*target.parts]
        depth = 0
        for part in resolved:
            depth += -1 if part == ".." else (0 if part == "." else 1)
            if depth < 0 or target.is_absolute():
                raise BadInputError(f"archive link {member.name!r} points outside the archive")
    elif not (member.isfile() or member.isdir()):
        raise BadInputError(f"archive member {member.name!r} is not a file or directory")


def _relative(text: str) -> str:
    """A schema check: a member's path inside the archive (relative, no ``..``)."""
    parts = PurePosixPath(text).parts
    if not text or "\0" in text or text.startswith("/") or ".." in parts:
        raise ValueError("must be a path inside the archive")
    return text


@functools.cache
def _manifest_schema() -> Any:
    """The validator of ``ptscope-archive.json`` (pydantic, strict), built on first use."""
    from typing import Annotated

    from pydantic import AfterValidator, BaseModel, ConfigDict, Field

    class Model(BaseModel):
        model_config = ConfigDict(strict=True, extra="ignore")

    class Object(Model):
        build_id: str
        path: str
        files: list[Annotated[str, AfterValidator(_relative)]] = Field(default_factory=list)
        source: str = ""

    class Missing(Model):
        build_id: str
        path: str
        why: str = ""

    class Manifest(Model):
        format: str
        version: int
        recording: Annotated[str, AfterValidator(plain_name)] = RECORDING_DIR
        perf_version: str = ""
        objects: list[Object] = Field(default_factory=list)
        missing: list[Missing] = Field(default_factory=list)

    return Manifest


def _read_manifest(where: Path, archive: Path) -> dict[str, Any]:
    """The archive's manifest, checked against its schema (one line for a bad value)."""
    from pydantic import ValidationError

    try:
        text = where.read_bytes()
        data = json.loads(text)
    except FileNotFoundError:
        raise BadInputError(f"{archive} is a tar file but not a ptscope archive") from None
    except (OSError, ValueError, RecursionError) as e:
        raise BadInputError(f"{archive}: unreadable manifest ({e})") from e
    require_format(data, ARCHIVE_FORMAT, ARCHIVE_VERSION, archive, "archive")
    try:
        manifest: dict[str, Any] = _manifest_schema().model_validate_json(text).model_dump()
    except ValidationError as e:
        raise schema_error(f"{archive}: {MANIFEST}", e) from None
    return manifest


def unpack_limit() -> int:
    """The most bytes :func:`unpack_archive` writes (``PTSCOPE_UNPACK_LIMIT``, a size like
    ``16G``; default :data:`DEFAULT_UNPACK_LIMIT`)."""
    text = os.environ.get(UNPACK_LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_UNPACK_LIMIT
    try:
        return parse_size(text)
    except UsageError:
        raise UsageError(f"{UNPACK_LIMIT_ENV}={text!r}: give a size like 16G") from None


def _unpacked_name(name: str) -> str:
    return str(PurePosixPath(name))


def unpack_archive(path: Path, into: Path) -> UnpackedArchive:
    """Unpack an archive made by :func:`create_archive` into the directory ``into``: one
    line for a member that could land outside it, a hard link to a file it does not hold
    before the link, or files past :func:`unpack_limit` bytes in all."""
    limit = unpack_limit()
    total = 0
    files: set[str] = set()
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = _GzipFile(fileobj=raw, mode="rb") if gzipped else raw  # type: ignore[no-untyped-call]
            # Streamed ("r|"): each member is checked, then unpacked, in one pass.
            with stream, tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    _check_member(member)
                    name = _unpacked_name(member.name)
                    if member.islnk() and _unpacked_name(member.linkname) not in files:
                        raise BadInputError(
                            f"cannot unpack {path}: member {member.name!r} is a hard link to "
                            f"{member.linkname!r}, a file the archive does not hold before it"
                        )
                    if member.isfile():  # a hard link is not one: it adds no bytes
                        total += member.size
                        if total > limit:
                            raise BadInputError(
                                f"cannot unpack {path}: its files hold more than "
                                f"{format_size(limit)}, the most ptscope unpacks "
                                f"({UNPACK_LIMIT_ENV})",
                                hint=f"set {UNPACK_LIMIT_ENV} to a larger size (like 16G) to "
                                "unpack it",
                            )
                    if hasattr(tarfile, "data_filter"):
                        tar.extract(member, into, filter="data")
                    else:  # Python < 3.11.4: checked above
                        tar.extract(member, into)
                    if member.isfile():
                        files.add(name)
                    else:
                        files.discard(name)  # replaced by a link or a directory
    except (tarfile.TarError, EOFError, OSError) as e:
        raise BadInputError(f"cannot unpack {path}: {e}") from e
    manifest = _read_manifest(into / MANIFEST, path)
    recording = Recording.load(into / manifest["recording"])
    kallsyms = next(
        (into / o["files"][0] for o in manifest["objects"] if o["path"] == KERNEL and o["files"]),
        None,
    )
    return UnpackedArchive(recording, into, manifest, kallsyms)
