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


@pytest.mark.parametrize("backend", ["emulated", "sampling"])
@pytest.mark.parametrize(
    ("how", "said", "status"),
    [("7", "exited with status 7", 7), ("-15", "was killed by SIGTERM", 128 + 15)],
)
def test_it_says_how_the_program_ended_and_exits_with_its_status(
    backend: str, how: str, said: str, status: int, tmp_path: Path
) -> None:
    """As ``time`` does: the program's status (a signal as 128+N), the trace still written."""
    out = tmp_path / "t.fxt.gz"
    work = "0" if backend == "emulated" else "300"
    done = ptscope(
        "run", "--backend", backend, "-o", str(out), "--", str(build("exit_status")), how, work
    )
    assert done.returncode == status, done.stderr
    assert f"ptscope: the program {said}" in done.stderr.splitlines()
    assert "Traceback" not in done.stderr and "error" not in done.stderr
    assert done.stdout == OWN_LINE and f"wrote {out}" in done.stderr
    assert any(s.name == "main" for rows in read_trace(out).slices.values() for s in rows)
