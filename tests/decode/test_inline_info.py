"""The DWARF inline reader (``decode/inline_info.py``) against ``addr2line -i``.

The programs (``tests/programs/inline_dwarf.c``, ``inline_dwarf_cxx.cpp``,
``inline_dwarf_rs.rs``) are built with gcc -O2 as DWARF 4 and as DWARF 5, with rustc -O,
and with clang -O2 where it is installed. For every instruction of every function in the
symbol table (capstone finds the instructions), ``addr2line -i`` prints the inline stack
(innermost first, the physical function last, each inlined frame followed by its call
site in its caller); the reader's chain at that address (the innermost scope, then its
parents) must have the same names (``c++filt --no-params`` demangles addr2line's) and the
same call sites (``basename:line``). binutils' addr2line reads DWARF with bfd's reader,
LLVM's (the oracle for clang's programs, and a second one for gcc's) with LLVM's; neither
shares anything with ours.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import capstone
import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from ptscope.decode import inline_info
from ptscope.decode.inline_info import InlineTable, read_inline_table
from ptscope.decode.perf_symbols import ElfImage
from support.programs import SOURCES, _cached, build

pytestmark = pytest.mark.skipif(
    shutil.which("addr2line") is None or shutil.which("c++filt") is None,
    reason="binutils (addr2line, c++filt) is not installed",
)

Frame = tuple[str, str]
"""(function name, call site ``file:line``) of one inlined frame."""

CASES = {
    "c-dwarf4": ("inline_dwarf", ["-gdwarf-4"]),
    "c-dwarf5": ("inline_dwarf", ["-gdwarf-5"]),
    "cxx-dwarf4": ("inline_dwarf_cxx", ["-gdwarf-4"]),
    "cxx-dwarf5": ("inline_dwarf_cxx", ["-gdwarf-5"]),
    "rust": ("inline_dwarf_rs", []),
    "clang-c": ("inline_dwarf", []),
    "clang-cxx": ("inline_dwarf_cxx", []),
}
"""gcc -O2 as DWARF 4 and 5, rustc -O (LLVM, DWARF 4), clang -O2 (DWARF 5, with the
indexed forms gcc does not write: addrx, strx, rnglistx)."""
ONLY = {"rust": "inline_dwarf_rs"}
"""Whose functions to check (the Rust program's own, not those of its standard library)."""
CLANG = {"clang-c": ("clang", "clang-14"), "clang-cxx": ("clang++", "clang++-14")}
LLVM_ADDR2LINE = next(
    (t for t in ("llvm-addr2line", "llvm-addr2line-14") if shutil.which(t) is not None), None
)
"""LLVM's addr2line, the oracle for clang's programs: binutils 2.40's reads no range list
of DW_FORM_rnglistx (it finds no inlined frame there)."""


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PTSCOPE_NO_INLINE_CACHE", "1")


def _functions(path: Path, only: str = "") -> Iterator[tuple[int, bytes]]:
    """(address, code) of each function symbol with a size (and ``only`` in its name)."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        symtab = elf.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        for sym in symtab.iter_symbols():
            if sym["st_info"]["type"] != "STT_FUNC" or not sym["st_size"]:
                continue
            if not isinstance(sym["st_shndx"], int) or only not in sym.name:
                continue
            sec = elf.get_section(sym["st_shndx"])
            start = sym["st_value"] - sec["sh_addr"]
            yield sym["st_value"], sec.data()[start : start + sym["st_size"]]


def _instructions(path: Path, only: str = "") -> list[int]:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    out: set[int] = set()
    for addr, code in _functions(path, only):
        out.update(insn[0] for insn in md.disasm_lite(code, addr))
    return sorted(out)


_ADDRESS = re.compile(r"^0x[0-9a-f]+$")
_RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")
_RUST_DISAMBIGUATOR = re.compile(r"\[[0-9a-f]+\]")
_DISCRIMINATOR = re.compile(r" \(discriminator \d+\)$")


def _addr2line(path: Path, addresses: list[int], tool: str = "addr2line") -> dict[int, list[Frame]]:
    """addr -> its inlined frames, innermost first, as addr2line -i sees them (``tool``:
    binutils' or LLVM's, which prints the same way).

    Each address is asked twice, and the second answer kept: the first time bfd meets a
    function whose DWARF name is not a linkage name (a C function in C++, a C++ function
    of internal linkage), it names the innermost frame after the ELF symbol around the
    address instead (the physical function's), and only later by its DWARF name."""
    done = subprocess.run(
        [tool, "-a", "-i", "-f", "-e", str(path)],
        input="".join(f"{a:#x}\n" for a in addresses) * 2,
        capture_output=True,
        text=True,
        check=True,
    )
    blocks: list[list[str]] = []
    for line in done.stdout.splitlines():
        if _ADDRESS.match(line):
            blocks.append([])
        else:
            blocks[-1].append(line)
    assert len(blocks) == 2 * len(addresses)
    blocks = blocks[len(addresses) :]
    mangled = sorted({b[i] for b in blocks for i in range(0, len(b), 2)})
    names = subprocess.run(
        ["c++filt", "--no-params"],
        input="\n".join(mangled) + "\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    # Rust names as perf writes them: without the legacy hash and crate disambiguators
    names = [_RUST_DISAMBIGUATOR.sub("", _RUST_HASH.sub("", n)) for n in names]
    readable = dict(zip(mangled, names, strict=True))
    out: dict[int, list[Frame]] = {}
    for addr, block in zip(addresses, blocks, strict=True):
        frames = [(readable[block[i]], block[i + 1]) for i in range(0, len(block), 2)]
        inlined = []
        for (name, _), (_, caller_place) in itertools.pairwise(frames):
            place = _DISCRIMINATOR.sub("", caller_place)
            file, _, line = place.rpartition(":")
            inlined.append((name, f"{Path(file).name}:{line}"))
        out[addr] = inlined
    return out


def _chain(table: InlineTable | None, addr: int) -> list[Frame]:
    if table is None:
        return []
    return [(s.name, s.call_site) for s in table.chain(table.scope_at(addr))]


def _same(ours: list[Frame], truth: list[Frame]) -> bool:
    """The same frames; a name bfd gives unqualified (a DWARF name, not a linkage name)
    may be qualified in ours (``std::__push_heap<...>`` for ``__push_heap<...>``)."""
    return len(ours) == len(truth) and all(
        site == true_site and (name == true_name or name.endswith("::" + true_name))
        for (name, site), (true_name, true_site) in zip(ours, truth, strict=True)
    )


def _built(case: str) -> Path:
    name, extra = CASES[case]
    if case in CLANG:
        compiler = next((c for c in CLANG[case] if shutil.which(c) is not None), None)
        if compiler is None:
            pytest.skip("clang is not installed")
        source = next(SOURCES.glob(f"{name}.c*"))
        flags = ["-O2", "-g", f"-I{SOURCES}"]
        clang: Path = _cached(
            source, compiler, flags, lambda src, out: [compiler, *flags, "-o", str(out), str(src)]
        )
        return clang
    path: Path = build(name, opt="-O2", extra=extra)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_matches_addr2line_on_every_instruction(case: str) -> None:
    exe = _built(case)
    table = read_inline_table(exe)
    assert table is not None
    addresses = _instructions(exe, ONLY.get(case, ""))
    tool = "addr2line"
    if case in CLANG:
        if LLVM_ADDR2LINE is None:
            pytest.skip("llvm-addr2line is not installed (the oracle for clang's DWARF 5)")
        tool = LLVM_ADDR2LINE
    truth = _addr2line(exe, addresses, tool)
    wrong = [
        (hex(a), _chain(table, a), truth[a])
        for a in addresses
        if not _same(_chain(table, a), truth[a])
    ]
    assert not wrong, f"{len(wrong)} of {len(addresses)} instructions differ: {wrong[:5]}"
    inlined = sum(1 for a in addresses if truth[a])
    assert inlined > len(addresses) // 10  # the programs are mostly inlined code
    assert max(len(truth[a]) for a in addresses) >= 3  # nested three deep at least


@pytest.mark.skipif(LLVM_ADDR2LINE is None, reason="llvm-addr2line is not installed")
@pytest.mark.parametrize("case", ["c-dwarf5", "cxx-dwarf4"])
def test_matches_llvm_addr2line_too(case: str) -> None:
    """A second oracle with a DWARF reader of its own (LLVM's) on gcc's programs."""
    exe = _built(case)
    table = read_inline_table(exe)
    addresses = _instructions(exe)
    assert LLVM_ADDR2LINE is not None
    truth = _addr2line(exe, addresses, LLVM_ADDR2LINE)
    wrong = [a for a in addresses if not _same(_chain(table, a), truth[a])]
    assert not wrong, f"{len(wrong)} of {len(addresses)} instructions differ"


@pytest.mark.parametrize("case", list(CASES))
def test_runs_are_sorted_disjoint_and_merged(case: str) -> None:
    table = read_inline_table(_built(case))
    assert table is not None
    starts, ends, scope = table.starts, table.ends, table.scope
    assert starts.dtype == np.uint64 and ends.dtype == np.uint64 and scope.dtype == np.int32
    assert len(starts) == len(ends) == len(scope) > 0
    assert bool(np.all(ends > starts))
    assert bool(np.all(starts[1:] >= ends[:-1]))
    touching = starts[1:] == ends[:-1]
    assert not bool(np.any(touching & (scope[1:] == scope[:-1])))  # merged
    assert bool(np.all((scope >= 0) & (scope < len(table.scopes))))
    for i, s in enumerate(table.scopes):
        assert -1 <= s.parent < i  # parents come first
    used = set(scope.tolist())
    inner = {s.parent for s in table.scopes}
    for i in range(len(table.scopes)):  # every scope has code, or an inlined one inside
        assert i in used or i in inner


def test_several_call_sites_are_several_scopes() -> None:
    table = read_inline_table(_built("c-dwarf5"))
    assert table is not None
    sites = {s.call_site for s in table.scopes if s.name == "deep" and s.parent == -1}
    assert sites == {"inline_dwarf.c:31", "inline_dwarf.c:53"}  # in walk and in main
    sites = {s.call_site for s in table.scopes if s.name == "bump"}
    assert sites == {"inline_dwarf.c:34", "inline_dwarf.c:36"}  # twice in walk
    nested = [s for s in table.scopes if s.name == "mix" and s.parent >= 0]
    assert nested and all(table.scopes[s.parent].name == "mix2" for s in nested)
    assert all(s.call_site.startswith("inline_dwarf.h:") for s in nested)


def test_cxx_names_are_qualified_and_demangled() -> None:
    table = read_inline_table(_built("cxx-dwarf5"))
    assert table is not None
    names = {s.name for s in table.scopes}
    assert {"geo::Point::norm", "geo::Point::scaled", "geo::weight"} <= names
    assert "std::vector<geo::Point, std::allocator<geo::Point> >::push_back" in names
    assert "score::{lambda}::operator()" in names  # a lambda's, without a linkage name
    # internal linkage (instantiated with a lambda's type): no linkage name, qualified here
    assert any(n.startswith("std::__push_heap<") for n in names)


def test_scope_at_outside_code() -> None:
    table = read_inline_table(_built("c-dwarf4"))
    assert table is not None
    assert table.scope_at(0) == -1
    assert table.scope_at(int(table.ends[-1])) == -1
    assert table.scope_at(int(table.starts[0])) == int(table.scope[0])
    assert table.scope_at(int(table.ends[0]) - 1) == int(table.scope[0])


def test_no_dwarf_no_inlines_damaged(tmp_path: Path) -> None:
    exe = _built("c-dwarf4")
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-g", "-o", str(stripped), str(exe)], check=True)
    assert read_inline_table(stripped) is None
    plain = build("basics", opt="-O0")
    assert read_inline_table(plain) is None  # -O0: DWARF without inlined code
    not_elf = tmp_path / "not-elf"
    not_elf.write_bytes(b"hello")
    assert read_inline_table(not_elf) is None
    assert read_inline_table(tmp_path / "missing") is None
    damaged = tmp_path / "damaged"
    clean = exe.read_bytes()
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        spans = [
            (s["sh_offset"], s["sh_size"])
            for s in elf.iter_sections()
            if s.name in (".debug_info", ".debug_abbrev", ".debug_rnglists", ".debug_line")
        ]
    rng = np.random.default_rng(41)
    damaged.write_bytes(clean[: len(clean) // 2])  # cut short
    assert read_inline_table(damaged) is None
    for _ in range(40):
        data = bytearray(clean)
        at, size = spans[int(rng.integers(0, len(spans)))]
        for _ in range(int(rng.integers(1, 8))):
            data[at + int(rng.integers(0, size))] = int(rng.integers(0, 256))
        damaged.write_bytes(bytes(data))
        found = read_inline_table(damaged)  # no exception, whatever it finds
        if found is not None:
            assert bool(np.all(found.ends > found.starts))
            assert bool(np.all(found.starts[1:] >= found.ends[:-1]))
            assert all(-1 <= s.parent < i for i, s in enumerate(found.scopes))


def test_separate_debug_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exe = _built("c-dwarf5")
    debug = tmp_path / "dbg"
    root = debug / ".build-id"
    monkeypatch.setattr(inline_info, "DEBUG_ROOT", debug)
    with open(exe, "rb") as f:
        note = ELFFile(f).get_section_by_name(".note.gnu.build-id")
        assert isinstance(note, NoteSection)
        build_id = next(iter(note.iter_notes()))["n_desc"]
    stripped = tmp_path / "prog"
    subprocess.run(["strip", "-g", "-o", str(stripped), str(exe)], check=True)
    assert read_inline_table(stripped) is None
    (root / build_id[:2]).mkdir(parents=True)
    debug_file = root / build_id[:2] / f"{build_id[2:]}.debug"
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug_file)], check=True)
    expected = read_inline_table(exe)
    found = read_inline_table(stripped)
    assert expected is not None and found is not None
    assert found.scopes == expected.scopes
    assert np.array_equal(found.starts, expected.starts)
    assert np.array_equal(found.scope, expected.scope)


def test_debuglink_file(tmp_path: Path) -> None:
    exe = _built("c-dwarf4")
    debug = tmp_path / "prog.debug"
    prog = tmp_path / "prog"
    subprocess.run(["objcopy", "--only-keep-debug", str(exe), str(debug)], check=True)
    subprocess.run(
        ["objcopy", "--strip-debug", "--remove-section=.note.gnu.build-id",
         f"--add-gnu-debuglink={debug}", str(exe), str(prog)],
        check=True, cwd=tmp_path,
    )  # fmt: skip
    found = read_inline_table(prog)
    expected = read_inline_table(exe)
    assert found is not None and expected is not None
    assert found.scopes == expected.scopes


def test_compressed_debug_sections(tmp_path: Path) -> None:
    exe = _built("cxx-dwarf5")
    packed = tmp_path / "packed"
    subprocess.run(["objcopy", "--compress-debug-sections=zlib", str(exe), str(packed)], check=True)
    found = read_inline_table(packed)
    expected = read_inline_table(exe)
    assert found is not None and expected is not None
    assert found.scopes == expected.scopes
    assert np.array_equal(found.ends, expected.ends)


def test_walk_without_jumps_finds_the_same(tmp_path: Path) -> None:
    """The jumps over subtrees without code lose nothing."""
    for case in ("cxx-dwarf4", "cxx-dwarf5"):
        exe = _built(case)
        tables = []
        for jump in (True, False):
            image = ElfImage.open(str(exe))
            assert image is not None
            dw = inline_info._Dwarf(inline_info._Sections(image))
            raw = inline_info.RawInlines()
            inline_info.walk(dw, raw, jump=jump)
            tables.append(inline_info.build_table(raw))
            image.close()
        a, b = tables
        assert a is not None and b is not None
        assert a.scopes == b.scopes
        assert np.array_equal(a.starts, b.starts) and np.array_equal(a.scope, b.scope)


def test_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PTSCOPE_NO_INLINE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    exe = _built("cxx-dwarf4")
    first = read_inline_table(exe)
    folder = tmp_path / "ptscope" / "inline"
    files = sorted(p.suffix for p in folder.iterdir())
    assert files == [".json", ".npz"]

    def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("read again, not from the cache")

    monkeypatch.setattr(inline_info, "walk", no_walk)
    second = read_inline_table(exe)
    assert first is not None and second is not None
    assert second.scopes == first.scopes
    assert np.array_equal(second.starts, first.starts)
    assert np.array_equal(second.ends, first.ends)
    assert np.array_equal(second.scope, first.scope)
    assert second.starts.dtype == np.uint64 and second.scope.dtype == np.int32
    # A torn pair (arrays of another writer) is not used.
    (json_file,) = folder.glob("*.json")
    json_file.write_text(json_file.read_text().replace('"token": "', '"token": "x'))
    assert read_inline_table(exe) is None  # (walk is gone: it had to read)
    monkeypatch.setenv("PTSCOPE_NO_INLINE_CACHE", "1")
    assert read_inline_table(exe) is None


@pytest.mark.parametrize("seed", range(30))
def test_flattening_against_every_address(seed: int) -> None:
    """Random trees of scopes with random ranges (children outside their parents, ranges
    of one depth overlapping, zero-length ones): each address goes to the deepest scope
    over it, the later in DIE order among equals."""
    rng = np.random.default_rng(seed)
    raw = inline_info.RawInlines()
    n = int(rng.integers(1, 40))
    depth: list[int] = []
    for i in range(n):
        parent = int(rng.integers(-1, i)) if i and rng.random() < 0.7 else -1
        raw.parents.append(parent)
        depth.append(depth[parent] + 1 if parent >= 0 else 1)
        raw.names.append(f"s{i}".encode())
        raw.linkage.append(False)
        raw.sites.append(f"f.c:{i}")
    for _ in range(int(rng.integers(0, 60))):
        lo = int(rng.integers(0, 200))
        raw.lo.append(lo)
        raw.hi.append(lo + int(rng.integers(1, 30)))
        raw.owner.append(int(rng.integers(0, n)))
    table = inline_info.build_table(raw)
    if not raw.owner:
        assert table is None
        return
    assert table is not None
    assert bool(np.all(table.ends > table.starts))
    assert bool(np.all(table.starts[1:] >= table.ends[:-1]))
    touching = table.starts[1:] == table.ends[:-1]
    assert not bool(np.any(touching & (table.scope[1:] == table.scope[:-1])))
    for x in range(-1, 240):
        over = [o for lo, hi, o in zip(raw.lo, raw.hi, raw.owner, strict=True) if lo <= x < hi]
        got = table.scope_at(x) if x >= 0 else -1
        if not over:
            assert got == -1
            continue
        best = max(over, key=lambda o: (depth[o], o))
        chain = [s.name for s in table.chain(got)]
        expected = []
        i = best
        while i >= 0:
            expected.append(f"s{i}")
            i = raw.parents[i]
        assert chain == expected, x


@pytest.mark.skipif(shutil.which("dwz") is None, reason="dwz is not installed")
def test_dwz_compressed(tmp_path: Path) -> None:
    """dwz moves shared DIEs into partial units, and with -m into a common file that
    ``.gnu_debugaltlink`` names (DW_FORM_GNU_ref_alt, DW_FORM_GNU_strp_alt)."""
    exe = _built("cxx-dwarf4")
    other = build("inline_dwarf_cxx", opt="-O1", extra=["-gdwarf-4"])
    expected = read_inline_table(exe)
    assert expected is not None
    single = tmp_path / "single"
    shutil.copyfile(exe, single)
    subprocess.run(["dwz", str(single)], check=True)
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copyfile(exe, a)
    shutil.copyfile(other, b)
    common = tmp_path / "common.debug"
    subprocess.run(["dwz", "-m", str(common), "-M", str(common), str(a), str(b)], check=True)
    with open(a, "rb") as f:
        assert ELFFile(f).get_section_by_name(".gnu_debugaltlink") is not None
    for path in (single, a):
        found = read_inline_table(path)
        assert found is not None
        assert found.scopes == expected.scopes
        assert np.array_equal(found.starts, expected.starts)
        assert np.array_equal(found.scope, expected.scope)


def test_system_libc_with_its_debug_file() -> None:
    """The system's libc (stripped; its DWARF, compressed, in libc6-dbg's build-id file)
    on a sample of its instructions."""
    lib = Path("/lib/x86_64-linux-gnu/libc.so.6")
    if not lib.exists():
        pytest.skip("no /lib/x86_64-linux-gnu/libc.so.6")
    with open(lib, "rb") as f:
        elf = ELFFile(f)
        note = elf.get_section_by_name(".note.gnu.build-id")
        assert isinstance(note, NoteSection)
        build_id = next(iter(note.iter_notes()))["n_desc"]
        text = elf.get_section_by_name(".text")
        code, base = text.data(), text["sh_addr"]
    debug = inline_info.DEBUG_ROOT / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
    if not debug.exists():
        pytest.skip("libc's debug file is not installed (apt-get install libc6-dbg)")
    table = read_inline_table(lib)
    assert table is not None
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    addresses: list[int] = []
    with open(debug, "rb") as f:
        symtab = ELFFile(f).get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        for sym in symtab.iter_symbols():
            at, size = sym["st_value"], sym["st_size"]
            if sym["st_info"]["type"] == "STT_FUNC" and size and base <= at < base + len(code):
                body = code[at - base : at - base + size]
                addresses += [insn[0] for insn in md.disasm_lite(body, at)]
    rng = np.random.default_rng(6)
    sample = sorted(set(rng.choice(addresses, size=4000, replace=False).tolist()))
    truth = _addr2line(lib, sample)
    wrong = [a for a in sample if not _same(_chain(table, a), truth[a])]
    assert not wrong, f"{len(wrong)} of {len(sample)} instructions differ: {wrong[:5]}"
    assert sum(1 for a in sample if truth[a]) > len(sample) // 20
