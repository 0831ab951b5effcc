"""Fuzz target ``archive``: damaged and forged archives (``ptscope archive``'s .tar.gz) fed to
``ptscope decode ARCHIVE``, which unpacks them (``record.archive.unpack_archive``) into a
temporary directory and decodes the recording they hold.

Inputs start from the members of a real archive (a recording of ``/bin/true`` and the
binaries it ran; the large ones cut to a few KiB), then: a member renamed (absolute,
``..``, a name another member has, a long one), made another kind (a symbolic or hard
link, a directory, a FIFO, a device), its link pointed elsewhere (out of the archive, to
itself, to a member after it or none), its contents damaged (the manifest and the
metadata too), members dropped, repeated or moved; the tar written plain or gzipped in
each tar format, sometimes its bytes damaged; sometimes a small ``PTSCOPE_UNPACK_LIMIT``.
Names and link targets may point at the input's own directory (``@ROOT@``), where the
check looks for anything written outside the unpacking directory. The check: no internal
error, one error line, nothing written outside, nothing left in TMPDIR.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gzip
import io
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from fuzz.mutations import damaged_bytes, edge_numbers
from fuzz.recovery import STALL_SECONDS
from fuzz.target import FuzzTarget, changed_environment, quick

QUICK_EXAMPLES = 100
"""Inputs in ``make test`` (most are refused while unpacking; a decode takes 0.1 s)."""

KEEP_BYTES = 4096
"""Each large member's contents are cut to this (unpacking does not read them)."""

KINDS = ("file", "dir", "sym", "lnk", "fifo", "chr")
_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "sym": tarfile.SYMTYPE,
    "lnk": tarfile.LNKTYPE,
    "fifo": tarfile.FIFOTYPE,
    "chr": tarfile.CHRTYPE,
}
HOSTILE = [
    "@ROOT@/escaped",
    "/etc/passwd",
    "../escaped",
    "../../escaped",
    "recording/../../escaped",
    "./recording/perf.data",
    "recording//perf.data",
    "recording",
    "recording/perf.data/x",
    "ptscope-archive.json",
    "recording/ptscope-recording.json",
    ".",
    "",
    "a" * 300,
    "/",
    "@ROOT@",
]


@functools.cache
def members() -> list[dict[str, Any]]:
    """The real archive's members, as :func:`build` takes them."""
    from ptscope.cli import main
    from ptscope.record.emulated import record

    root = Path(tempfile.mkdtemp(prefix="ptscope-fuzz-archive-"))
    atexit.register(shutil.rmtree, root, True)
    record(["/bin/true"], root / "rec")
    archive = root / "rec.tar.gz"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["archive", str(root / "rec"), "-o", str(archive)]) == 0
    found = []
    with tarfile.open(archive) as tar:
        for info in tar:
            data = b""
            if info.isfile():
                f = tar.extractfile(info)
                assert f is not None
                data = f.read()
                if len(data) > 128 * 1024:  # the libraries (the recording and true: whole)
                    data = data[:KEEP_BYTES]
            kind = next(k for k, t in _TYPES.items() if t == info.type)
            found.append({"name": info.name, "kind": kind, "data": data, "link": info.linkname})
    return found


@st.composite
def archives(draw: st.DrawFn) -> dict[str, Any]:
    entries = [dict(m) for m in members()]
    names = [m["name"] for m in entries]
    for _ in range(draw(st.integers(0, 4))):
        if not entries:
            break
        at = draw(st.integers(0, len(entries) - 1))
        entry = entries[at]
        edit = draw(
            st.sampled_from(["name", "kind", "link", "data", "data", "drop", "repeat", "move"])
        )
        if edit == "name":
            entry["name"] = draw(st.sampled_from([*HOSTILE, *names]))
        elif edit == "kind":
            entry["kind"] = draw(st.sampled_from(KINDS))
            if entry["kind"] in ("sym", "lnk") and not entry["link"]:
                entry["link"] = draw(st.sampled_from([*HOSTILE, *names]))
        elif edit == "link":
            entry["link"] = draw(st.sampled_from([*HOSTILE, *names, entry["name"]]))
        elif edit == "data" and entry["data"]:
            entry["data"] = draw(damaged_bytes([entry["data"]]))
        elif edit == "drop":
            del entries[at]
        elif edit == "repeat":
            entries.insert(draw(st.integers(0, len(entries))), dict(entry))
        elif edit == "move":
            entries.insert(draw(st.integers(0, len(entries) - 1)), entries.pop(at))
    archive = {
        "members": entries,
        "format": draw(st.sampled_from(["gnu", "pax", "ustar"])),
        "gzip": draw(st.integers(0, 5)) > 0,
        "damage": None,
        "limit": draw(st.sampled_from([None] * 8 + ["0", "100k", "1M"])),
    }
    if not draw(st.integers(0, 3)):  # (offset, value, width): a header's field, say
        offset = draw(st.one_of(st.integers(0, 1023), st.integers(0, 1 << 20)))
        archive["damage"] = (offset, draw(edge_numbers()), draw(st.integers(1, 8)))
    return archive


def build(archive: dict[str, Any], root: str) -> bytes:
    """The archive's bytes (``@ROOT@`` in names and links made ``root``)."""
    formats = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=formats[archive["format"]]) as tar:
        for entry in archive["members"]:
            info = tarfile.TarInfo(entry["name"].replace("@ROOT@", root))
            info.type = _TYPES[entry["kind"]]
            info.linkname = entry["link"].replace("@ROOT@", root)
            data = entry["data"] if entry["kind"] == "file" else b""
            info.size = len(data)
            info.mode = 0o755 if entry["kind"] == "dir" else 0o644
            try:
                tar.addfile(info, io.BytesIO(data) if data else None)
            except ValueError:  # a name or link this format cannot hold
                continue
    data = bytearray(raw.getvalue())
    if archive["damage"] is not None:  # (offset, value, width): a header's number damaged
        offset, value, width = archive["damage"]
        offset %= max(1, len(data))
        data[offset : offset + width] = value.to_bytes(8, "little")[:width]
    if archive["gzip"]:
        return gzip.compress(bytes(data), compresslevel=1)
    return bytes(data)


def check(archive: dict[str, Any]) -> None:
    from ptscope.cli import main
    from ptscope.perftool import STALL_ENV
    from ptscope.record.archive import UNPACK_LIMIT_ENV

    with tempfile.TemporaryDirectory(prefix="ptscope-fuzz-archive-") as name:
        root = Path(name)
        path = root / "in.tar.gz"
        path.write_bytes(build(archive, str(root)))
        private = root / "tmpdir"
        private.mkdir()
        out, err = io.StringIO(), io.StringIO()
        saved_tempdir = tempfile.tempdir
        try:
            tempfile.tempdir = str(private)  # where the archive is unpacked
            with (
                changed_environment(
                    **{UNPACK_LIMIT_ENV: archive["limit"], STALL_ENV: STALL_SECONDS}
                ),
                contextlib.redirect_stdout(out),
                contextlib.redirect_stderr(err),
            ):
                try:
                    code: Any = main(["decode", str(path), "-o", str(root / "out.fxt.gz")])
                except SystemExit as e:
                    code = e.code
        finally:
            tempfile.tempdir = saved_tempdir
        stderr = err.getvalue()
        assert code != 70 and "internal error" not in stderr, stderr
        assert "Traceback" not in stderr, stderr
        assert isinstance(code, int) and code >= 0, code
        if code:
            errors = [line for line in stderr.splitlines() if ": error: " in line]
            assert len(errors) == 1, stderr
        left = sorted(p.name for p in root.iterdir())
        assert set(left) <= {"in.tar.gz", "out.fxt.gz", "tmpdir"}, left
        assert not list(private.iterdir()), list(private.iterdir())


TARGET = FuzzTarget("archive", archives(), check)

test_archive_quick = quick(TARGET, QUICK_EXAMPLES)
