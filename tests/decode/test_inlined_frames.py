"""Inlined frames end to end: programs built at -O2 with inlined calls of every shape,
recorded under QEMU and decoded by the CLI, against oracles that share nothing with the
engine or the DWARF reader:

* the compiler's hooks (``-finstrument-functions``): gcc calls them around inlined bodies
  too, from inside the body, so at every hook call ptscope's stack (the slices open around
  the hook's own slice) must be the hooks' stack, inlined functions included;
* ``addr2line -i`` (binutils' DWARF reader): each inlined slice begins at an address whose
  inline chain, read by addr2line, is the slice's own chain of inlined frames up to its
  function, with the call site of each.

And: the own decoder and perf's (the dlfilter) give the same trace, every inlined slice
nests in its function's slice, and ``--no-inline`` gives the trace without them.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from fxt.models import DurationCompleteEventRecord
from fxt.reader import parse_records

from ptscope.fxt.columns import read_columns
from support import fidelity, oracles, progen, programs
from support.cli import ptscope
from support.decoder_parity import first_trace_difference, perf_decodes_the_same

pytestmark = pytest.mark.skipif(
    shutil.which("qemu-x86_64") is None or shutil.which("addr2line") is None,
    reason="needs qemu-user and binutils",
)

_HOOKS = ("__cyg_profile_func_enter", "__cyg_profile_func_exit")


def _record(exe: Path, where: Path, *args: str, env: dict[str, str] | None = None) -> Path:
    """``exe`` recorded and decoded (the own decoder): the trace; the recording is kept in
    ``where/rec``, and perf's decoder must give the same trace of it."""
    trace = where / "trace.fxt.gz"
    done = ptscope(
        *("run", "--backend", "emulated", "--keep-recording", str(where / "rec")),
        *("-o", str(trace), *args, "--", str(exe)),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return trace


@dataclass(frozen=True)
class _Slice:
    start: int
    end: int
    name: str
    args: dict[str, Any]


def _slices(trace: Path) -> dict[int, list[_Slice]]:
    """Every slice of a trace per thread, in file order, with its args: the ``fxt`` PyPI
    reader's."""
    with gzip.open(trace, "rb") as f:
        result = parse_records(f)
    out: dict[int, list[_Slice]] = {}
    for records in result.records_by_provider.values():
        for r in records.records:
            if isinstance(r, DurationCompleteEventRecord):
                # (the reader calls the end tick a duration)
                row = _Slice(r.timestamp_ns, r.duration_ns, r.name, dict(r.args))
                out.setdefault(r.thread.thread_id, []).append(row)
    return out


def _stacks(
    trace: Path, keep: Callable[[str], bool]
) -> dict[int, list[tuple[_Slice, list[_Slice]]]]:
    """Per thread, every slice in start order with the slices open around it (outermost
    first; those ``keep`` keeps, and inlined ones), nested as Perfetto nests them: by start
    time, ties in file order, a slice inside the latest one still open at its start."""
    out = {}
    for tid, slices in _slices(trace).items():
        rows = []
        stack: list[_Slice] = []
        for s in sorted(slices, key=lambda s: s.start):  # (stable: ties in file order)
            while stack and stack[-1].end <= s.start and s.start != stack[-1].start:
                stack.pop()
            rows.append((s, [a for a in stack if keep(a.name) or _inlined(a)]))
            stack.append(s)
        out[tid] = rows
    return out


def _inlined(s: _Slice) -> bool:
    return "inlined" in str(s.args.get("flags", ""))


def _hook_stacks_agree(exe: Path, where: Path) -> set[str]:
    """``exe`` (built with the hooks) traced: at each hook call, the functions open around
    the hook's slice in ptscope's trace (physical and inlined) are those the hooks' log has
    open (a program without longjmp, exceptions or signals: exits pop what entered).
    Returns the names of the inlined slices."""
    log = where / "cyg.log"
    trace = _record(exe, where, env={"PTSCOPE_CYG_LOG": str(log)})
    load, records = oracles.read_cyg_log(log)
    names = oracles.function_symbols(exe, load)
    own = {oracles.base_name(names[r.function]) for r in records}
    expected: list[list[str]] = []
    stack: list[str] = []
    for r in records:
        name = oracles.base_name(names[r.function])
        if r.kind == 1:
            stack.append(name)
            expected.append(list(stack))
        else:
            assert stack and stack[-1] == name, (name, stack)
            expected.append(list(stack))
            stack.pop()
    (rows,) = _stacks(trace, lambda n: oracles.base_name(n) in own).values()
    got = [
        [oracles.base_name(a.name) for a in around if oracles.base_name(a.name) in own]
        for s, around in rows
        if s.name in _HOOKS
    ]
    assert len(got) == len(expected)
    for k, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have == want, f"hook call {k}: ptscope has {have}, the hooks {want}"
    perf_decodes_the_same(where / "rec", trace)
    return {s.name for s, _ in rows if _inlined(s)} & own


def test_stacks_at_every_hook_are_the_hooks_stacks(tmp_path: Path) -> None:
    """gcc's hooks log every enter and exit of the program's functions, inlined ones too,
    and call the hook from inside the body: the stacks must agree at every hook call."""
    source = (programs.SOURCES / "inline_calls.c").read_text()
    exe = fidelity.build_source(source, cxx=False, variant="instrumented", opt="-O2")
    inlined = _hook_stacks_agree(exe, tmp_path)
    assert {"square", "sum_squares", "with_call", "tail_inline"} <= inlined


@pytest.mark.parametrize("seed", [0, 3, 5, 7])
def test_generated_programs_with_inlining_agree_with_the_hooks(tmp_path: Path, seed: int) -> None:
    """Generated programs (tests/support/progen.py; plain shapes) built with the hooks and
    their inlinable functions made ``static inline always_inline`` (the fidelity oracles'
    instrumented builds mark every function noinline; these seeds' inlinable functions
    are not recursive): the stacks agree at every hook call."""
    program = progen.generate(seed)
    assert program.features == ("plain",) and program.language == "c"
    source = program.source(inline=True)
    for f in program.functions:
        if f.inline_ok:
            always = f"static inline __attribute__((always_inline)) long {f.name}(long x)"
            source = re.sub(rf"(?m)^long {f.name}\(long x\)", always, source)
    exe = fidelity.build_source(
        source, cxx=False, variant="instrumented", opt="-O2", static=program.static_link
    )
    assert _hook_stacks_agree(exe, tmp_path), "nothing was inlined: the test proves nothing"


def _addr2line(exe: Path, addresses: list[int]) -> dict[int, list[tuple[str, str]]]:
    """``addr2line -i -f -C``: for each address its chain, innermost first, of (function,
    its place: file basename:line)."""
    done = subprocess.run(
        ["addr2line", "-i", "-f", "-C", "-a", "-e", str(exe)],
        input="\n".join(f"{a:#x}" for a in addresses) + "\n",
        capture_output=True,
        text=True,
        check=True,
    )
    out: dict[int, list[tuple[str, str]]] = {}
    at = None
    lines = done.stdout.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("0x"):
            at = int(lines[i], 16)
            out[at] = []
            i += 1
            continue
        assert at is not None
        name, place = lines[i], lines[i + 1].split(" (discriminator")[0]
        file, _, line = place.rpartition(":")
        out[at].append((name, f"{Path(file).name}:{line}"))
        i += 2
    return out


def _short(name: str) -> str:
    """A function as both sides may spell it: without parameters, template arguments or
    the return type addr2line gives a template function."""
    while True:
        shorter = re.sub(r"<[^<>]*>", "", name)
        if shorter == name:
            break
        name = shorter
    name = oracles.base_name(name)  # (parameters, clone suffixes)
    return name.split()[-1] if name.split() else name


def _code_maps(recording: Path) -> list[tuple[int, int, int, str]]:
    """The recording's executable mappings: (start, end, file offset, path), from its
    perf.data's MMAP2 records (where each file was mapped; no decoder comes into it)."""
    from ptscope.decode import perf_data as pd

    data = pd.read_perf_data(recording / "perf.data")
    out = []
    for r in data.sideband:
        if r.type == pd.REC_MMAP2 and r.fields[3] & 4 and r.name.startswith("/"):
            addr, length, pgoff = r.fields[:3]
            out.append((addr, addr + length, pgoff, r.name))
    return out


def _link_address(binary: Path, offset: int) -> int:
    """The link-time address of file offset ``offset`` of ``binary`` (its PT_LOAD)."""
    with open(binary, "rb") as f:
        for seg in ELFFile(f).iter_segments():
            lo = seg["p_offset"]
            if seg["p_type"] == "PT_LOAD" and lo <= offset < lo + seg["p_filesz"]:
                return int(offset - lo + seg["p_vaddr"])
    raise AssertionError(f"offset {offset:#x} is in no segment of {binary}")


def _check_against_addr2line(
    trace: Path, recording: Path, binaries: set[Path], at_least: int, functions: bool = True
) -> None:
    """Every inlined slice in ``binaries`` begins where addr2line puts it: inside its
    inlined function, inlined into the slices around it, at their call sites, in the
    function of the slice around them all (with ``functions``: the symbol table's name of
    the function is DWARF's; glibc's aliases are not)."""
    (rows,) = _stacks(trace, lambda n: True).values()
    maps = [m for m in _code_maps(recording) if Path(m[3]).resolve() in binaries]
    where: dict[int, tuple[str, int]] = {}  # run-time address -> (binary, file address)
    mine = []
    for s, around in rows:
        if not _inlined(s):
            continue
        a = int(s.args["address"])
        for lo, hi, pgoff, path in maps:
            if lo <= a < hi:
                where[a] = (path, _link_address(Path(path), a - lo + pgoff))
                mine.append((s, around))
                break
    assert len(mine) >= at_least, f"{len(mine)} inlined slices in {binaries}"
    chains: dict[int, list[tuple[str, str]]] = {}
    for path in {p for p, _ in where.values()}:
        at = {a: f for a, (p, f) in where.items() if p == path}
        found = _addr2line(Path(path), sorted(set(at.values())))
        chains.update({a: found[f] for a, f in at.items()})
    for s, around in mine:
        chain = chains[int(s.args["address"])]  # innermost first; the last: the function
        k = len(around) - 1
        while k >= 0 and _inlined(around[k]):
            k -= 1
        mine_chain = [*around[k + 1 :], s]  # the inlined frames, outermost first
        physical = around[k].name if k >= 0 else ""
        want = list(reversed(chain))  # outermost first: the function, then inlined ones
        if functions:
            assert _short(want[0][0]) == _short(physical), (s, physical, chain)
        assert len(want) > len(mine_chain), (s, chain)
        for depth, frame in enumerate(mine_chain, start=1):
            assert _same_function(frame.name, want[depth][0]), (s, frame.name, chain)
            site = want[depth - 1][1].removesuffix(":?")  # (line 0: unknown; shown without)
            assert frame.args.get("call_site") == site, (s, frame.args, chain)


def _same_function(ours: str, theirs: str) -> bool:
    """Our name of a function is addr2line's, or its qualified form: addr2line gives some
    template instances without their namespace (``apply_twice<...>`` for
    ``geo::apply_twice<...>``), which the DWARF scopes around them give, and a lambda
    the name of the function it is in (``work`` for ``work::{lambda}::operator()``)."""
    a, b = _short(ours), _short(theirs)
    return a == b or a.endswith("::" + b) or a.startswith(b + "::{lambda")


@pytest.mark.parametrize("name", ["inline_calls.c", "inline_calls_cxx.cpp", "inline_calls_rs.rs"])
def test_inlined_slices_are_what_addr2line_reads_there(tmp_path: Path, name: str) -> None:
    """Each language's inlined shapes: C, C++ (lambdas, templates, methods), Rust."""
    stem, ext = name.split(".")
    if ext == "rs":
        if shutil.which("rustc") is None:
            pytest.skip("rustc is not installed")
        exe = programs.build(stem, opt="-O2")
    else:
        exe = programs.build(stem, opt="-O2")
    trace = _record(exe, tmp_path)
    _check_against_addr2line(trace, tmp_path / "rec", {exe.resolve()}, 10)
    perf_decodes_the_same(tmp_path / "rec", trace)


def test_a_real_program_s_inlined_code_is_what_addr2line_reads(tmp_path: Path) -> None:
    """``sort -n``: glibc's inlined code, from its separate debug file (libc6-dbg)."""
    libc = Path("/lib/x86_64-linux-gnu/libc.so.6").resolve()
    build_id = subprocess.run(
        ["readelf", "-n", str(libc)], capture_output=True, text=True, check=False
    ).stdout
    found = re.search(r"Build ID: ([0-9a-f]+)", build_id)
    debug = found and Path(f"/usr/lib/debug/.build-id/{found[1][:2]}/{found[1][2:]}.debug")
    sort = shutil.which("sort")
    if not debug or not debug.exists() or sort is None:
        pytest.skip("glibc's debug file is not installed (apt-get install libc6-dbg)")
    numbers = tmp_path / "numbers.txt"
    numbers.write_text("".join(f"{(k * 7919) % 1000}\n" for k in range(300)))
    trace = tmp_path / "trace.fxt.gz"
    done = ptscope(
        *("run", "--backend", "emulated", "--keep-recording", str(tmp_path / "rec")),
        *("-o", str(trace), "--", sort, "-n", "-o", os.devnull, str(numbers)),
    )
    assert done.returncode == 0, done.stderr
    _check_against_addr2line(trace, tmp_path / "rec", {libc}, 100, functions=False)
    perf_decodes_the_same(tmp_path / "rec", trace)


def test_no_inline_leaves_them_out(tmp_path: Path) -> None:
    exe = programs.build("inline_calls", opt="-O2")
    trace = _record(exe, tmp_path)
    plain = tmp_path / "plain.fxt.gz"
    done = ptscope("decode", str(tmp_path / "rec"), "--no-inline", "-o", str(plain))
    assert done.returncode == 0, done.stderr
    with_inline = _slices(trace)
    without = _slices(plain)
    assert any(_inlined(s) for sl in with_inline.values() for s in sl)
    assert not any(_inlined(s) or "call_site" in s.args for sl in without.values() for s in sl)
    # The same calls, with the same instructions (times may move by the nanosecond every
    # inlined slice's start takes).
    for tid, slices in without.items():
        calls = [(s.name, s.args.get("instructions")) for s in with_inline[tid] if not _inlined(s)]
        assert calls == [(s.name, s.args.get("instructions")) for s in slices]


def test_an_archive_brings_the_inline_information(tmp_path: Path) -> None:
    """The inlined frames of an archived recording come from the archive's copies of the
    binaries: the same trace with the program gone (built into a directory then removed)."""
    where = tmp_path / "build"
    where.mkdir()
    exe = where / "inline_calls"
    shutil.copy(programs.build("inline_calls", opt="-O2"), exe)
    trace = _record(exe, tmp_path)
    archive = tmp_path / "rec.tar.gz"
    done = ptscope("archive", str(tmp_path / "rec"), "-o", str(archive))
    assert done.returncode == 0, done.stderr
    shutil.rmtree(where)
    again = tmp_path / "again.fxt.gz"
    done = ptscope("decode", str(archive), "-o", str(again))
    assert done.returncode == 0, done.stderr

    def inlined(path: Path) -> list[tuple[int, int, str, str]]:
        return [
            (s.start, s.end, s.name, str(s.args.get("call_site")))
            for sl in _slices(path).values()
            for s in sl
            if _inlined(s) and "inline_calls.c" in str(s.args.get("call_site"))
        ]

    assert inlined(trace) and inlined(again) == inlined(trace)


@pytest.mark.parametrize("name", ["inline_calls", "inline_calls_cxx"])
def test_the_text_decoder_gives_the_same_inlined_frames(tmp_path: Path, name: str) -> None:
    """The three decoders split blocks at the same places: perf's text, read with the
    recording's runs (decode/blocks.py), gives the own decoder's trace."""
    trace = _record(programs.build(name, opt="-O2"), tmp_path)
    text = tmp_path / "text.fxt.gz"
    done = ptscope("decode", str(tmp_path / "rec"), "--decoder", "text", "-o", str(text))
    assert done.returncode == 0, done.stderr
    assert first_trace_difference(read_columns(trace), read_columns(text)) is None
    assert any(_inlined(s) for sl in _slices(text).values() for s in sl)
