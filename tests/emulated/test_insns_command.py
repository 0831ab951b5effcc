"""`ptscope insns` (the drill-down) against QEMU's instruction log.

The time range of one call of the 100-instruction leaf (its call and return branches'
perf times, as a slice's ``drill`` arg gives them) must list a contiguous run of the
instructions QEMU executed, address for address, holding the whole call, indented one
level deeper than its caller, with source lines where the binary has them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ptscope.decode.dlfilter_stream import decode_with_dlfilter
from ptscope.decode.perf_script import format_time
from ptscope.model import BranchEvent, BranchKind
from support.cli import one_line_error, ptscope
from support.emulated_corpus import Case, Recorded, recorded

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def leaf(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    return recorded(Case("leaf100"), tmp_path_factory.mktemp("insns"))


def _call_times(rec: Recorded, k: int) -> tuple[int, int, int]:
    """tid and perf times of the k-th call of the leaf and of its return."""
    events = [
        e
        for b in decode_with_dlfilter(rec.directory / "perf.data")
        for e in b
        if isinstance(e, BranchEvent)
    ]
    calls = [e for e in events if e.kind == BranchKind.CALL and e.dst.symbol == "leaf100"]
    returns = [e for e in events if e.kind == BranchKind.RETURN and e.src.symbol == "leaf100"]
    return calls[k].tid, calls[k].time, returns[k].time


@pytest.mark.parametrize("k", [0, 499, 999])
def test_a_calls_instructions_are_qemus(leaf: Recorded, k: int) -> None:
    tid, start, end = _call_times(leaf, k)
    result = ptscope(
        "insns",
        str(leaf.directory),
        "--tid",
        str(tid),
        "--time",
        f"{format_time(start)},{format_time(end)}",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    addresses = [int(line.split()[1], 16) for line in lines]
    # Where the listing meets QEMU's log: the k-th entry into the leaf.
    run = leaf.truth.thread(tid)
    pcs = [i.pc for i in run.insns]
    entry = next(line for line in lines if line.split()[2] == "leaf100+0x0")
    entry_ip = int(entry.split()[1], 16)
    entries = [n for n, pc in enumerate(pcs) if pc == entry_ip]
    at = addresses.index(entry_ip)
    first = entries[k] - at
    assert first >= 0
    assert addresses == pcs[first : first + len(addresses)]
    # The whole call is there: 99 nops and the ret, one level deeper than the call.
    body = lines[at : at + 100]
    assert [line.split()[2] for line in body] == [f"leaf100+{n:#x}" for n in range(100)]
    assert body[-1].split()[3] == "ret"
    call = lines[at - 1]
    assert call.split()[3] == "call"
    indent = len(call) - len(call.split(maxsplit=2)[2])
    assert all(len(line) - len(line.split(maxsplit=2)[2]) == indent + 2 for line in body)
    # main has debug information.
    assert call.rstrip().endswith(tuple(f"leaf100.c:{n}" for n in range(1, 30)))


def test_bad_input_is_one_line(leaf: Recorded, tmp_path: Path) -> None:
    tid, start, end = _call_times(leaf, 0)
    window = f"{format_time(start)},{format_time(end)}"
    rec = str(leaf.directory)
    for args, words in (
        (("insns", str(tmp_path / "nothing"), "--tid", str(tid), "--time", window), "no such"),
        (("insns", rec, "--tid", str(tid), "--time", "1.5"), "START,END"),
        (("insns", rec, "--tid", str(tid), "--time", "a,b"), "START,END"),
        (("insns", rec, "--tid", str(tid), "--time", "2,1"), "ends before it starts"),
        (("insns", rec, "--tid", "1", "--time", window), "thread 1 is not in"),
        (("insns", rec, "--tid", str(tid), "--time", "99,100"), "no traced instruction"),
    ):
        line = one_line_error(ptscope(*args))
        assert words in line, line


def test_without_metadata_an_unknown_thread_is_reported(leaf: Recorded, tmp_path: Path) -> None:
    # A bare perf.data: perf itself says which threads it has.
    bare = tmp_path / "perf.data"
    bare.symlink_to(leaf.directory / "perf.data")
    line = one_line_error(ptscope("insns", str(bare), "--tid", "1", "--time", "0,100"))
    assert "thread 1 is not in" in line
