"""Bad input and unusual endings: one clear error line, or a recording of what ran."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ptscope.errors import BadInputError, PtscopeError, ToolMissingError, UsageError
from ptscope.record.emulated import qemu as qemu_module
from ptscope.record.emulated import record
from ptscope.recording import Recording
from support import programs
from support.emulated_corpus import needs_tools, perf_branches

pytestmark = pytest.mark.slow


def _one_line(e: PtscopeError) -> str:
    text = str(e)
    assert "\n" not in text and text
    return text


def test_program_not_found(tmp_path: Path) -> None:
    with pytest.raises(BadInputError) as e:
        record([str(tmp_path / "nope")], tmp_path / "rec")
    assert "not found" in _one_line(e.value)
    with pytest.raises(BadInputError) as e:
        record(["ptscope-no-such-program-anywhere"], tmp_path / "rec")
    assert "not found" in _one_line(e.value)
    assert not (tmp_path / "rec" / "perf.data").exists()


def test_no_program(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        record([], tmp_path / "rec")


def test_a_shell_script_is_not_an_x86_64_program(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(BadInputError) as e:
        record([str(script)], tmp_path / "rec")
    assert "not an ELF" in _one_line(e.value)


def _elf_header(machine: int, elf_class: int = 2) -> bytes:
    """A minimal ELF header (no program headers) for another architecture."""
    ident = b"\x7fELF" + bytes((elf_class, 1, 1, 0)) + b"\0" * 8
    if elf_class == 2:
        rest = (2).to_bytes(2, "little") + machine.to_bytes(2, "little") + (1).to_bytes(4, "little")
        rest += b"\0" * 24 + (64).to_bytes(2, "little") + b"\0" * 10
    else:
        rest = (2).to_bytes(2, "little") + machine.to_bytes(2, "little") + (1).to_bytes(4, "little")
        rest += b"\0" * 12 + (52).to_bytes(2, "little") + b"\0" * 10
    return ident + rest


@pytest.mark.parametrize(("machine", "elf_class", "word"), [(183, 2, "aarch64"), (3, 1, "i386")])
def test_another_architecture_is_refused(
    machine: int, elf_class: int, word: str, tmp_path: Path
) -> None:
    exe = tmp_path / "foreign"
    exe.write_bytes(_elf_header(machine, elf_class))
    exe.chmod(0o755)
    with pytest.raises(BadInputError) as e:
        record([str(exe)], tmp_path / "rec")
    message = _one_line(e.value)
    assert word in message and "x86-64" in message


def test_qemu_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = programs.build("basics", static=True)
    monkeypatch.setenv("PTSCOPE_QEMU", str(tmp_path / "no-qemu-here"))
    qemu_module.find_qemu.cache_clear()
    try:
        with pytest.raises(ToolMissingError) as e:
            record([str(exe)], tmp_path / "rec")
    finally:
        qemu_module.find_qemu.cache_clear()
    assert "qemu-x86_64 not found" in _one_line(e.value)
    assert e.value.hint and "apt-get install qemu-user" in e.value.hint


def _fake_qemu(tmp_path: Path, help_text: str, items: str) -> Path:
    fake = tmp_path / "qemu-x86_64"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        "  --version) echo 'qemu-x86_64 version 8.2.0';;\n"
        f"  -h) printf '%s\\n' '{help_text}';;\n"
        f"  -d) printf '%s\\n' {items};;\n"
        "esac\n"
    )
    fake.chmod(0o755)
    return fake


def test_newer_qemu_flag_name_is_detected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QEMU >= 8.1 calls -singlestep -one-insn-per-tb: the tool description adapts."""
    fake = _fake_qemu(
        tmp_path,
        "-one-insn-per-tb      run with one guest instruction per emulated TB\n"
        "-plugin      [file=]<file>[,<argname>=<argvalue>]",
        "'exec  show trace' 'nochain  x' 'in_asm  x' 'page  x' 'strace  x' 'plugin  x'",
    )
    monkeypatch.setenv("PTSCOPE_QEMU", str(fake))
    qemu_module.find_qemu.cache_clear()
    try:
        tool = qemu_module.find_qemu()
    finally:
        qemu_module.find_qemu.cache_clear()
    assert tool.single_step_flag == "-one-insn-per-tb"
    assert tool.version == (8, 2, 0)


def test_qemu_without_plugins_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorder is a TCG plugin: a QEMU built without them cannot record."""
    fake = _fake_qemu(tmp_path, "-singlestep  run in singlestep mode", "'exec  x' 'in_asm  x'")
    monkeypatch.setenv("PTSCOPE_QEMU", str(fake))
    qemu_module.find_qemu.cache_clear()
    try:
        with pytest.raises(ToolMissingError) as e:
            qemu_module.find_qemu()
    finally:
        qemu_module.find_qemu.cache_clear()
    message = _one_line(e.value)
    assert "cannot load TCG plugins" in message
    assert e.value.hint and "plugin support" in e.value.hint


def test_crash_is_recorded_up_to_the_fault(tmp_path: Path) -> None:
    needs_tools()
    exe = programs.build("crash")
    result = record([str(exe)], tmp_path / "rec")
    assert result.crashed and result.signal == 11
    assert "crashed with SIGSEGV" in result.summary
    assert result.instructions > 1000
    got = perf_branches(tmp_path / "rec" / "perf.data")
    assert not got.errors
    # The trace ends inside poke(), the function that faulted.
    (branches,) = got.by_tid.values()
    assert branches[-1].kind == "async" and branches[-1].dst == 0
    Recording.load(tmp_path / "rec")  # the metadata is there for `ptscope decode`


def test_max_instructions_stops_a_runaway_program(tmp_path: Path) -> None:
    needs_tools()
    exe = programs.build("spin", static=True)
    seen: list[int] = []
    result = record([str(exe)], tmp_path / "rec", max_instructions=3_000_000, progress=seen.append)
    assert result.stopped_at_limit
    assert result.exit_code is None and result.signal is None and not result.crashed
    assert 2_900_000 <= result.instructions <= 3_000_000
    assert "stopped after" in result.summary
    assert seen and seen == sorted(seen) and seen[-1] <= 3_000_000
    got = perf_branches(tmp_path / "rec" / "perf.data")
    assert not got.errors
    (branches,) = got.by_tid.values()
    assert len(branches) > 100_000  # about two branches per loop iteration of 8 insns


def test_exit_status_and_metadata(tmp_path: Path) -> None:
    needs_tools()
    exe = programs.build("basics", static=True)
    result = record([str(exe), "7"], tmp_path / "rec")
    assert result.exit_code == 0 and not result.crashed and not result.stopped_at_limit
    loaded = Recording.load(tmp_path / "rec")
    assert loaded.backend == "emulated"
    assert loaded.command == [str(exe), "7"]
    assert list(loaded.processes.values()) == [f"{exe} 7"]
    assert loaded.notes["instructions"] == result.instructions
    assert loaded.notes["mode"] == "block"


def test_ptscope_run_reports_a_bad_program_in_one_line(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ptscope", "run", "--backend", "emulated", "--", "/nonexistent"],
        capture_output=True,
        text=True,
        env={**os.environ, "PTSCOPE_NO_PAGER": "1"},
        check=False,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert any("not found" in line for line in lines), out.stderr
