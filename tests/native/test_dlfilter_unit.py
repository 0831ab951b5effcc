"""The dlfilter's logic, driven through its perf entry points with fabricated samples."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from ptscope.decode import record_format as rf
from ptscope.model import BranchFlags as F
from ptscope.model import function_key
from support.dlfilter_harness import FakePerf, Output, Sym, build_dlfilter, split_stream

CALL = F.BRANCH | F.CALL
RET = F.BRANCH | F.RETURN
JMP = F.BRANCH
JCC = F.BRANCH | F.CONDITIONAL

EXE = "/usr/bin/prog"
LIBC = "/lib/libc.so.6"
MAIN = Sym("main", EXE, 0x1000, 0x1100)
FOO = Sym("foo", EXE, 0x1100, 0x1200)
FOO_COLD = Sym("foo.cold", EXE, 0x1800, 0x1840)
BAR = Sym("bar", LIBC, 0x7000, 0x7100)
UNK_EXE = Sym(None, EXE)
UNK_LIBC = Sym(None, LIBC)


@pytest.fixture(scope="module")
def lib() -> Path:
    return build_dlfilter()


class Run:
    def __init__(self, lib: Path, out: Path, *extra: str) -> None:
        self.out = out
        self.perf = FakePerf(lib, [str(out), *extra])
        assert self.perf.start() == 0

    def finish(self) -> Output:
        assert self.perf.stop() == 0
        return split_stream(self.out.read_bytes())


@pytest.fixture
def run(lib: Path, tmp_path: Path) -> Iterator[Run]:
    yield Run(lib, tmp_path / "stream.bin")


def branch(
    r: Run, ip: int, addr: int, flags: int, src: Sym | None, dst: Sym | None, **kw: int
) -> int:
    return r.perf.sample(ip=ip, addr=addr, flags=int(flags), ip_sym=src, addr_sym=dst, **kw)


def test_header_and_trailer(run: Run) -> None:
    out = run.finish()
    assert out.header["tag"] == rf.TAG_HEADER
    assert out.header["magic"] == rf.MAGIC
    assert out.header["version"] == rf.STREAM_VERSION
    assert out.header["branch_size"] == rf.BRANCH.size
    assert out.header["options"] == 0
    assert out.order == ["trailer"]
    assert out.trailer["samples"] == 0


def test_same_function_jumps_are_dropped_and_everything_else_kept(run: Run) -> None:
    r = run
    results = [
        branch(r, 0x1010, 0x1020, JCC, MAIN, MAIN),  # dropped
        branch(r, 0x1020, 0x1008, JMP, MAIN, MAIN),  # dropped
        branch(r, 0x1030, 0x1100, CALL, MAIN, FOO),
        branch(r, 0x1110, 0x1100, JMP, FOO, FOO),  # a jump to our own start: dropped
        branch(r, 0x1120, 0x1130, CALL, FOO, FOO),  # `call next`: a call, kept
        branch(r, 0x1140, 0x1810, JCC, FOO, FOO_COLD),  # into foo.cold: same function
        branch(r, 0x1820, 0x1150, JMP, FOO_COLD, FOO),  # back: same function
        branch(r, 0x1160, 0x7000, JMP, FOO, BAR),  # tail call: kept
        branch(r, 0x7010, 0x1035, RET, BAR, MAIN),
        branch(r, 0x1040, 0x1050, JCC | F.IN_TX, MAIN, MAIN),  # in a transaction: kept
        branch(r, 0x1050, 0x1060, JMP | F.TRACE_END, MAIN, MAIN),  # trace state: kept
        branch(r, 0x1060, 0x1070, F.BRANCH | F.ASYNC, MAIN, MAIN),  # async: kept
        branch(r, 0x1070, 0x1080, JMP | (1 << 20), MAIN, MAIN),  # an unknown bit: kept
        branch(r, 0x1080, 0, CALL | F.SYSCALLRET | F.TRACE_END, MAIN, None),
        branch(r, 0, 0x1082, F.BRANCH | F.TRACE_BEGIN, None, MAIN),
    ]
    assert results == [1] * len(results), "the filter always returns 1 (perf prints nothing)"
    out = run.finish()
    kept = [(b["ip"], b["addr"], b["flags"]) for b in out.branches]
    assert kept == [
        (0x1030, 0x1100, CALL),
        (0x1120, 0x1130, CALL),
        (0x1160, 0x7000, JMP),
        (0x7010, 0x1035, RET),
        (0x1040, 0x1050, JCC | F.IN_TX),
        (0x1050, 0x1060, JMP | F.TRACE_END),
        (0x1060, 0x1070, F.BRANCH | F.ASYNC),
        (0x1070, 0x1080, JMP | (1 << 20)),
        (0x1080, 0, CALL | F.SYSCALLRET | F.TRACE_END),
        (0, 0x1082, F.BRANCH | F.TRACE_BEGIN),
    ]
    assert out.trailer["branches_kept"] == 10
    assert out.trailer["branches_dropped"] == 5
    assert out.trailer["samples"] == 15


def test_unknown_code_is_one_function_per_dso(run: Run) -> None:
    r = run
    branch(r, 0x5000, 0x5010, JMP, UNK_EXE, UNK_EXE)  # dropped: both [unknown] in EXE
    branch(r, 0x5010, 0x9000, JMP, UNK_EXE, UNK_LIBC)  # kept: different DSOs
    branch(r, 0x9000, 0x9010, JMP, UNK_LIBC, None)  # kept: [unknown] vs no mapping
    branch(r, 0xA000, 0xA010, JMP, None, None)  # dropped: both in no mapping
    branch(r, 0x1010, 0x5000, JMP, MAIN, UNK_EXE)  # kept
    out = run.finish()
    assert [(b["ip"], b["addr"]) for b in out.branches] == [
        (0x5010, 0x9000),
        (0x9000, 0x9010),
        (0x1010, 0x5000),
    ]


def test_locations_and_strings(run: Run) -> None:
    r = run
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO)
    branch(r, 0x1110, 0x7000, CALL, FOO, BAR)
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO)
    branch(r, 0x1080, 0, CALL | F.TRACE_END, MAIN, None)
    out = run.finish()
    # Each string once, before its first use; each location once, before its first use.
    assert sorted(out.strings.values()) == sorted(["main", "foo", "bar", EXE, LIBC])
    assert len(set(out.strings.values())) == len(out.strings)
    b = out.branches
    assert out.location(b[0]["ip_loc"]) == (0x1030, "main", 0x30, EXE)
    assert out.location(b[0]["addr_loc"]) == (0x1100, "foo", 0, EXE)
    assert out.location(b[1]["addr_loc"]) == (0x7000, "bar", 0, LIBC)
    assert (b[2]["ip_loc"], b[2]["addr_loc"]) == (b[0]["ip_loc"], b[0]["addr_loc"])
    assert out.location(b[3]["addr_loc"]) == (0, None, rf.NO_OFFSET, None)
    assert len(out.locations) == 6  # 4 distinct sources and 4 targets, 2 seen twice
    assert out.trailer["locations"] == 6
    assert out.trailer["strings"] == 5
    seen: set[str] = set()
    for kind in out.order:  # records come before the branches that use them
        seen.add(kind)
        if kind == "branch":
            assert {"string", "location"} <= seen


def test_each_target_is_resolved_once(run: Run) -> None:
    r = run
    for i in range(50):
        branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, time=1000 + i)
        branch(r, 0x1110, 0x1035, RET, FOO, MAIN, time=1001 + i)
    assert r.perf.resolve_addr_calls == 2
    out = run.finish()
    assert len(out.branches) == 100
    assert len(out.locations) == 4


def test_ip_and_target_are_cached_separately(run: Run) -> None:
    # perf resolves a sample's ip and its addr differently (cpumode vs fallback); the
    # same address must keep whatever each side resolved to.
    r = run
    branch(r, 0x1100, 0x1200, CALL, FOO, Sym("other", EXE, 0x1200, 0x1300))
    branch(r, 0x1200, 0x1100, CALL, Sym("kernel_view", "[kernel.kallsyms]", 0x1200, 0x1300), FOO)
    out = run.finish()
    assert out.location(out.branches[0]["addr_loc"])[1] == "other"
    assert out.location(out.branches[1]["ip_loc"])[1] == "kernel_view"


def test_processes_resolve_separately(run: Run) -> None:
    r = run
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, pid=1, tid=1)
    branch(
        r, 0x1030, 0x1100, CALL, Sym("other_main", "/bin/other", 0x1000, 0x1100), BAR, pid=2, tid=2
    )
    out = run.finish()
    b = out.branches
    assert out.location(b[1]["ip_loc"])[1] == "other_main"
    assert out.location(b[1]["addr_loc"])[1] == "bar"


def test_exec_flushes_the_process_cache(run: Run) -> None:
    r = run
    r.perf.sample(ip=0x1030, addr=0x1100, flags=CALL, ip_sym=MAIN, addr_sym=FOO, comm="sh")
    # execve: a syscall (trace end), then the new program starts (trace begin) in the same
    # pid at the same addresses, and perf's comm for the thread changes.
    r.perf.sample(
        ip=0x1080, addr=0, flags=CALL | F.SYSCALLRET | F.TRACE_END, ip_sym=MAIN, comm="sh"
    )
    new_main = Sym("main", "/usr/bin/new", 0x1000, 0x1100)
    new_f = Sym("f", "/usr/bin/new", 0x1100, 0x1200)
    r.perf.sample(ip=0, addr=0x1000, flags=F.BRANCH | F.TRACE_BEGIN, addr_sym=new_main, comm="new")
    r.perf.sample(ip=0x1030, addr=0x1100, flags=CALL, ip_sym=new_main, addr_sym=new_f, comm="new")
    assert r.perf.resolve_ip_calls == 4  # first sample of the thread, 2 boundaries, 1 miss
    out = run.finish()
    assert out.location(out.branches[3]["ip_loc"]) == (0x1030, "main", 0x30, "/usr/bin/new")
    assert out.location(out.branches[3]["addr_loc"]) == (0x1100, "f", 0, "/usr/bin/new")


def test_resolve_ip_is_called_only_on_misses_and_boundaries(run: Run) -> None:
    r = run
    for i in range(20):
        branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, time=i)
        branch(r, 0x1110, 0x1120, JCC, FOO, FOO, time=i)
        branch(r, 0x1130, 0x1035, RET, FOO, MAIN, time=i)
    assert r.perf.resolve_ip_calls == 3
    assert r.perf.resolve_addr_calls == 3
    run.finish()


def test_remapped_code_is_resolved_again_at_a_boundary(run: Run) -> None:
    r = run
    lib1 = Sym("f", "/lib/one.so", 0x7000, 0x7100)
    branch(r, 0x7010, 0x1035, RET, lib1, MAIN)
    # dlclose + dlopen of another library at the same address: perf's symbol changes.
    r.perf.cstr("f", fresh=True)
    lib2 = Sym("f", "/lib/two.so", 0x7000, 0x7100)
    branch(r, 0x7010, 0, F.BRANCH | F.TRACE_END, lib2, None)
    branch(r, 0x7010, 0x1035, RET, lib2, MAIN)
    out = run.finish()
    assert out.location(out.branches[1]["ip_loc"])[3] == "/lib/two.so"
    assert out.location(out.branches[2]["ip_loc"])[3] == "/lib/two.so"


def test_counts_of_dropped_branches_go_to_the_next_kept_one_of_the_thread(run: Run) -> None:
    r = run
    branch(r, 0x1010, 0x1020, JCC, MAIN, MAIN, tid=1, insn_cnt=5, cyc_cnt=7)
    branch(r, 0x1010, 0x1020, JCC, MAIN, MAIN, tid=2, insn_cnt=100, cyc_cnt=100)
    branch(r, 0x1020, 0x1008, JMP, MAIN, MAIN, tid=1, insn_cnt=3, cyc_cnt=4)
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, tid=1, insn_cnt=2, cyc_cnt=1)
    branch(r, 0x1110, 0x1035, RET, FOO, MAIN, tid=1)
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, tid=2, insn_cnt=1)
    out = run.finish()
    got = [(b["tid"], b["insn_cnt"], b["cyc_cnt"]) for b in out.branches]
    assert got == [(1, 10, 12), (1, 0, 0), (2, 101, 100)]


def test_every_field_is_copied(run: Run) -> None:
    run.perf.sample(
        ip=0x1030,
        addr=0x1100,
        flags=int(CALL),
        pid=-1,
        tid=77,
        time=123456789012,
        cpu=3,
        insn_cnt=11,
        cyc_cnt=22,
        ip_sym=MAIN,
        addr_sym=FOO,
    )
    out = run.finish()
    (b,) = out.branches
    assert (b["pid"], b["tid"], b["time"], b["cpu"]) == (-1, 77, 123456789012, 3)
    assert (b["insn_cnt"], b["cyc_cnt"], b["flags"]) == (11, 22, CALL)


def test_power_and_other_events(run: Run) -> None:
    # perf's raw cbr data: flags (cbr in the low byte, max non-turbo ratio in the third),
    # the frequency in kHz (printed rounded to MHz).
    raw = struct.pack("<III", 0x200000 | 36, 3_599_600, 0)
    assert run.perf.sample(ip=0x1030, event="cbr", raw=raw, time=5, tid=9, pid=8) == 1
    assert run.perf.sample(ip=0x1030, event="psb", raw=b"\0" * 16) == 1
    assert run.perf.sample(ip=0x1030, event="instructions:u") == 1
    assert run.perf.sample(ip=0x1030, event="cbr", raw=b"\1") == 1  # too short: ignored
    out = run.finish()
    assert [(p["pid"], p["tid"], p["time"], p["cbr"], p["freq_mhz"]) for p in out.power] == [
        (8, 9, 5, 36, 3600)
    ]
    assert out.branches == []
    assert out.trailer["other"] == 3
    assert out.trailer["power"] == 1


def test_branch_events_with_modifiers_are_branches(run: Run) -> None:
    branch(run, 0x1030, 0x1100, CALL, MAIN, FOO, event="branches:u")  # type: ignore[arg-type]
    out = run.finish()
    assert len(out.branches) == 1


def test_keep_all(lib: Path, tmp_path: Path) -> None:
    r = Run(lib, tmp_path / "s.bin", "keep-all")
    branch(r, 0x1010, 0x1020, JCC, MAIN, MAIN, insn_cnt=4)
    out = r.finish()
    assert out.header["options"] == rf.OPT_KEEP_ALL
    assert [(b["ip"], b["insn_cnt"]) for b in out.branches] == [(0x1010, 4)]


def test_until_keeps_each_threads_first_kept_branch_past_the_end(lib: Path, tmp_path: Path) -> None:
    # A window ending at time 50: perf decodes past it; the next window needs each thread's
    # first kept branch after 50 (its counts, with the dropped jumps' before it), no more.
    r = Run(lib, tmp_path / "s.bin", "until=50")
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, tid=1, time=40)
    branch(r, 0x1110, 0x1120, JMP, FOO, FOO, tid=1, time=50, insn_cnt=3)  # dropped
    branch(r, 0x1120, 0x1110, JMP, FOO, FOO, tid=1, time=60, insn_cnt=4)  # dropped, late
    branch(r, 0x1130, 0x1035, RET, FOO, MAIN, tid=1, time=70, insn_cnt=5)  # first kept late
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, tid=2, time=75)  # tid 2's first late
    branch(r, 0x1030, 0x1100, CALL, MAIN, FOO, tid=1, time=80)  # ignored
    branch(r, 0x1110, 0x1035, RET, FOO, MAIN, tid=1, time=90)  # ignored
    branch(r, 0x1110, 0x1035, RET, FOO, MAIN, tid=2, time=95)  # ignored
    out = r.finish()
    got = [(b["tid"], b["time"], b["insn_cnt"]) for b in out.branches]
    assert got == [(1, 40, 0), (1, 70, 12), (2, 75, 0)]
    assert out.trailer["other"] == 3
    assert out.trailer["branches_dropped"] == 2
    for bad in ("until=", "until=x", "until=-5", "until=5x"):
        assert FakePerf(lib, [str(tmp_path / "x"), bad]).start() < 0, bad


def test_symbol_offsets(run: Run) -> None:
    big = Sym("big", EXE, 0x100000000, 0x300000000)
    branch(run, 0x2_0000_0010, 0x1100, CALL, big, FOO)  # offset beyond 32 bits: exact
    out = run.finish()
    assert out.location(out.branches[0]["ip_loc"])[2] == 0x1_0000_0010


def test_bad_arguments_fail_start(lib: Path, tmp_path: Path) -> None:
    assert FakePerf(lib, [str(tmp_path / "x"), "bogus"]).start() < 0
    assert FakePerf(lib, [str(tmp_path / "no" / "such" / "dir")]).start() < 0
    assert FakePerf(lib, ["fd:x"]).start() < 0
    # ring=MEMFD,FREEFD,CHUNKS,BYTES: malformed, out of range, or with an output file
    for ring in ("ring=", "ring=1,2,3", "ring=1,2,3,4096,5", "ring=a,2,3,4096", "ring=1,2,1,4096",
                 "ring=1,2,16,100", "ring=-1,2,16,4096", "ring=1,2,2000,4096"):  # fmt: skip
        assert FakePerf(lib, ["-", ring]).start() < 0, ring
    assert FakePerf(lib, [str(tmp_path / "x"), "ring=0,1,16,4096"]).start() < 0


def test_pure_helpers(lib: Path) -> None:
    so = ctypes.CDLL(str(lib))
    so.ptscope_droppable_flags.argtypes = [ctypes.c_uint32]
    assert so.ptscope_droppable_flags(JMP) == 1
    assert so.ptscope_droppable_flags(JCC) == 1
    for flags in (0, CALL, RET, JMP | F.TRACE_BEGIN, JMP | F.IN_TX, F.BRANCH | F.ASYNC):
        assert so.ptscope_droppable_flags(int(flags)) == 0, flags
    so.ptscope_function_key.argtypes = [ctypes.c_char_p] * 2 + [ctypes.c_char_p, ctypes.c_size_t]
    so.ptscope_function_key.restype = ctypes.c_size_t

    def key(sym: str | None, dso: str | None) -> str:
        buf = ctypes.create_string_buffer(64)
        n = so.ptscope_function_key(
            sym.encode() if sym else None, dso.encode() if dso else None, buf, 64
        )
        assert n == len(buf.value)
        return buf.value.decode()

    cases = [
        ("main", EXE),
        ("foo.cold", EXE),
        ("x.cold.cold", EXE),
        (".cold", EXE),
        ("[unknown]", EXE),
        ("", LIBC),
        ("[unknown]", ""),
    ]
    for sym, dso in cases:
        assert key(sym, dso) == function_key(sym, dso), (sym, dso)
    assert key(None, None) == "[unknown]"
    small = ctypes.create_string_buffer(4)
    assert so.ptscope_function_key(b"longname", None, small, 4) == 8  # needed length
