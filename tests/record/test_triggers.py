"""Trigger selections, their resolution (PIE, shared libraries, FILE:LINE), and hardware
breakpoints on every thread of real programs.

Ground truth is independent of our code: the program prints its own function's address,
``nm`` and ``addr2line`` read the ELF, and the kernel reports where breakpoints fired.
"""

from __future__ import annotations

import ctypes
import os
import re
import select
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ptscope.errors import BadInputError, RecordingError, UsageError
from ptscope.record.breakpoints import Breakpoint, BreakpointSet
from ptscope.record.launch import StoppedProgram
from ptscope.record.session import Hit
from ptscope.record.symbols import (
    ElfImage,
    check_selection,
    load_bias,
    needs_libraries,
    parse_selection,
    read_maps,
    resolve_selection,
)

Build = Callable[..., Path]


@pytest.mark.parametrize(
    ("text", "kind", "detail"),
    [
        ("main", "symbol", "main"),
        ("symbol:ns::f(int)", "symbol", "ns::f(int)"),
        ("0x1139", "address", 0x1139),
        ("addr:1139", "address", 0x1139),
        ("demo.c:42", "line", ("demo.c", 42, None)),
        ("line:src/a b.c:7:3", "line", ("src/a b.c", 7, 3)),
        ("?", "pick", "all"),
        ("symbol:?", "pick", "symbol"),
        ("line:?", "pick", "line"),
        ("operator new", "symbol", "operator new"),
    ],
)
def test_parse_selection(text: str, kind: str, detail: object) -> None:
    sel = parse_selection(text)
    assert sel.kind == kind
    got = {
        "symbol": sel.text,
        "address": sel.address,
        "line": (sel.file, sel.line, sel.column),
        "pick": sel.pick,
    }[kind]
    assert got == detail


@pytest.mark.parametrize("text", ["", "addr:zz", "0xnothex", "line:nofile"])
def test_parse_selection_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_selection(text)


def nm_address(path: Path, name: str) -> int:
    out = subprocess.run(["nm", str(path)], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise AssertionError(f"{name} not in nm output")


def printed_address(process: subprocess.Popen[bytes]) -> int:
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    m = re.match(r"trigger_target (0x[0-9a-f]+)", line)
    assert m, line
    return int(m.group(1), 16)


@pytest.fixture(scope="module")
def nm() -> None:
    if shutil.which("nm") is None or shutil.which("addr2line") is None:
        pytest.skip("binutils (nm, addr2line) not installed")


def collect(
    source: BreakpointSet, process: subprocess.Popen[bytes], limit: float = 20
) -> list[Hit]:
    hits: list[Hit] = []
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        select.select(source.fds(), [], [], 0.05)
        hits += source.read_hits()
        if process.poll() is not None:
            hits += source.read_hits()
            break
    return hits


def held_with_stdout(path: Path, *args: str) -> StoppedProgram:
    """Like StoppedProgram.spawn, with the program's stdout readable by the test."""

    def hold() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ptrace(ctypes.c_long(0), 0, None, None)  # PTRACE_TRACEME: stop at exec

    process = subprocess.Popen([str(path), *args], stdout=subprocess.PIPE, preexec_fn=hold)
    os.waitpid(process.pid, 0x40000000)
    return StoppedProgram(process, "ptrace")


@pytest.fixture(scope="module")
def breakpoints_work(program: Build) -> None:
    """This VM delivers breakpoint events: check it still does (else skip with why)."""
    path = program("threads")
    held = held_with_stdout(path, "0")
    try:
        bp = resolve_selection(parse_selection("trigger_target"), str(path), read_maps(held.pid))
        with BreakpointSet(bp) as source:
            source.arm([held.pid])
            held.release()
            hits = collect(source, held.process)
    except RecordingError as e:
        held.kill()
        pytest.skip(f"hardware breakpoints unavailable here: {e.message}")
    held.process.wait()
    if not hits:
        pytest.skip("this machine does not deliver hardware breakpoint events")


@pytest.mark.parametrize("pie", [True, False], ids=["pie", "non-pie"])
def test_symbol_resolves_to_the_running_address(program: Build, pie: bool, nm: None) -> None:
    path = program("threads", pie=pie)
    image = ElfImage(path)
    assert image.position_independent is pie
    assert image.lookup("trigger_target") == [nm_address(path, "trigger_target")]
    held = held_with_stdout(path, "0")
    try:
        maps = read_maps(held.pid)
        [bp] = resolve_selection(parse_selection("trigger_target"), str(path), maps)
        bias = load_bias(image, maps)
        assert (bias != 0) is pie
        held.release()
        assert bp.address == printed_address(held.process)
        assert bp.label == "trigger_target"
    finally:
        held.process.wait()


def test_address_selection_is_link_time_and_relocated(program: Build, nm: None) -> None:
    path = program("threads")
    link = nm_address(path, "trigger_target")
    held = held_with_stdout(path, "0")
    try:
        [bp] = resolve_selection(parse_selection(hex(link)), str(path), read_maps(held.pid))
        held.release()
        assert bp.address == printed_address(held.process)
        assert bp.label == "trigger_target"  # named after the function at that address
    finally:
        held.process.wait()


def test_file_line_resolves_to_code_of_that_line(program: Build, nm: None) -> None:
    path = program("threads")
    source = Path(__file__).parent / "programs" / "threads.c"
    line = next(
        i for i, text in enumerate(source.read_text().splitlines(), 1) if "counter += x" in text
    )
    image = ElfImage(path)
    addresses = image.line_addresses("threads.c", line, None)
    assert addresses
    for address in addresses:
        out = subprocess.run(
            ["addr2line", "-e", str(path), hex(address)], capture_output=True, text=True
        ).stdout.strip()
        assert out.endswith(f"threads.c:{line}"), out
    # A longer path suffix matches too; a wrong file or line does not.
    assert image.line_addresses("record/programs/threads.c", line, None) == addresses
    assert image.line_addresses("other.c", line, None) == []
    with pytest.raises(BadInputError, match="no code for that line"):
        resolve_selection(parse_selection("threads.c:1"), str(path), [])


def test_unknown_symbol_is_one_clear_error(program: Build) -> None:
    path = program("threads")
    with pytest.raises(BadInputError, match="no function of that name"):
        resolve_selection(parse_selection("no_such_function_xyz"), str(path), [])


def test_an_address_in_no_function_is_refused_as_an_unknown_symbol_is(
    program: Build, nm: None, tmp_path: Path
) -> None:
    """An address trigger must lie in a function of the program (link-time addresses, as
    nm shows them): data or an address outside the code would never fire. A stripped
    program has few function symbols: there any address in its code is taken."""
    path = program("threads")
    function = nm_address(path, "trigger_target")
    data = nm_address(path, "counter")
    for address in (function, function + 1):
        check_selection(parse_selection(hex(address)), str(path))
    stripped = tmp_path / "threads-stripped"
    shutil.copy(path, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    check_selection(parse_selection(hex(function + 1)), str(stripped))
    for exe in (path, stripped):
        for address in (data, 0x10):
            selection = parse_selection(hex(address))
            with pytest.raises(BadInputError, match=r"no function of .* contains that address"):
                check_selection(selection, str(exe))
            with pytest.raises(BadInputError, match=r"no function of .* contains that address"):
                resolve_selection(selection, str(exe), [])


def test_hits_on_every_thread_including_one_created_later(
    program: Build, breakpoints_work: None
) -> None:
    path = program("threads")
    held = held_with_stdout(path, "20")
    try:
        bps = resolve_selection(parse_selection("trigger_target"), str(path), read_maps(held.pid))
        with BreakpointSet(bps) as source:
            source.arm([held.pid])
            held.release()
            expected = printed_address(held.process)
            hits = collect(source, held.process)
    finally:
        held.process.wait()
    assert held.process.returncode == 0
    assert [h.ip for h in hits] == [expected, expected]
    assert {h.pid for h in hits} == {held.pid}
    main, second = hits
    assert main.tid == held.pid
    assert second.tid != held.pid  # the thread did not exist when the breakpoint was armed
    assert main.time < second.time


def test_hits_on_existing_threads_of_a_running_process(
    program: Build, breakpoints_work: None
) -> None:
    """attach: threads that already run get the breakpoint too."""
    path = program("spin")
    process = subprocess.Popen([str(path), "2", "2"], stdout=subprocess.PIPE)
    assert process.stdout is not None
    process.stdout.readline()
    try:
        time.sleep(0.1)  # its two extra threads are running by now
        bps = resolve_selection(parse_selection("tick"), str(path), read_maps(process.pid))
        with BreakpointSet(bps) as source:
            source.arm([process.pid])
            hits: list[Hit] = []
            deadline = time.monotonic() + 10
            while len({h.tid for h in hits}) < 3 and time.monotonic() < deadline:
                select.select(source.fds(), [], [], 0.05)
                hits += source.read_hits()
            source.disable()
            source.read_hits()
            time.sleep(0.05)
            assert source.read_hits() == []  # disabled: no more hits
    finally:
        process.kill()
        process.wait()
    assert len({h.tid for h in hits}) == 3


def test_shared_library_trigger_after_the_loader_ran(
    program: Build, breakpoints_work: None
) -> None:
    """A libc function: the program is run to its entry point so libc is mapped."""
    path = program("threads")
    selection = parse_selection("pthread_create")
    assert needs_libraries(selection, str(path))
    assert not needs_libraries(parse_selection("trigger_target"), str(path))
    held = held_with_stdout(path, "0")
    try:
        with pytest.raises(BadInputError):
            resolve_selection(selection, str(path), read_maps(held.pid))  # libc not mapped yet
        held.advance_to_entry()
        [bp] = resolve_selection(selection, str(path), read_maps(held.pid))
        libc = [m for m in read_maps(held.pid) if m.start <= bp.address < m.end]
        assert libc and "libc" in libc[0].path and "x" in libc[0].perms
        with BreakpointSet([bp]) as source:
            source.arm([held.pid])
            held.release()
            hits = collect(source, held.process)
    finally:
        held.process.wait()
    assert held.process.returncode == 0  # the int3 at the entry point was undone cleanly
    assert [h.ip for h in hits] == [bp.address]


def test_too_many_breakpoints_refused() -> None:
    with pytest.raises(RecordingError, match="at most 4"):
        BreakpointSet([Breakpoint(i, "x") for i in range(5)])
