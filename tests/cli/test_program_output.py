"""What ``ptscope run`` leaves to the traced program (issue 44): its stdout, untouched
(everything ptscope says goes to stderr), on every backend this machine has, and for the
commands that write files (decode, archive) an empty stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.fxt.reader import read_trace
from support.cli import ptscope
from support.programs import build

pytestmark = pytest.mark.slow

OWN_LINE = "the program's own line\n"


@pytest.mark.parametrize("backend", ["emulated", "sampling"])
def test_stdout_is_the_programs_alone(backend: str, tmp_path: Path) -> None:
    program = build("exit_status")
    out, rec = tmp_path / "t.fxt.gz", tmp_path / "rec"
    work = "0" if backend == "emulated" else "300"  # (enough to be sampled)
    done = ptscope(
        "run", "--backend", backend, "--keep-recording", str(rec), "-o", str(out),
        "--", str(program), "0", work,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == OWN_LINE
    assert f"wrote {out}" in done.stderr and "open it in" in done.stderr
    read_trace(out)
    again = ptscope("decode", str(rec), "-o", str(tmp_path / "again.fxt.gz"))
    assert again.returncode == 0, again.stderr
    assert again.stdout == "" and "wrote " in again.stderr
    archive = tmp_path / "rec.tar.gz"
    packed = ptscope("archive", str(rec), "-o", str(archive))
    assert packed.returncode == 0, packed.stderr
    assert packed.stdout == "" and f"wrote {archive}" in packed.stderr
