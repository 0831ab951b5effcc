"""DWARF inline-information readers compared: read time and peak memory on big binaries.

Issue 41 asks for the reader of ``DW_TAG_inlined_subroutine`` entries to be chosen by
measurement. The candidates, each giving the same table (checked here):

* ``own``: ``ptscope.decode.inline_info`` (our reader: abbreviations compiled into skip
  plans, subtrees without code jumped over by ``DW_AT_sibling``), with its cache off;
* ``own-cached``: the same reading its cache (written by the first of its rounds, so the
  best round is a cache hit);
* ``own-every-die``: the same without the jumps (every DIE visited);
* ``pyelftools``: pyelftools (a dependency already), walking the same subtrees
  (``iter_DIE_children`` jumps by ``DW_AT_sibling`` too), names through its DIE objects;
* ``pyelftools-all``: pyelftools the plain way, ``iter_DIEs()`` over every DIE;
* ``libdw``: elfutils' libdw (Debian's ``libdw1``; no Python binding exists in Debian or
  on PyPI, so through ctypes), walking the same subtrees with ``dwarf_child`` /
  ``dwarf_siblingof``, ``dwarf_ranges``, names by ``dwarf_attr_integrate``.

The binaries: a generated C++ program (``-O2 -g``, template- and STL-heavy, about 50 MB,
built once into ``bench/cache/``) and, where their debug files are installed, the system's
libc (``libc6-dbg``) and Python interpreter. Each reader reads each binary in a fresh child
process (best of ``--rounds``; peak RSS from ``getrusage(RUSAGE_CHILDREN)`` in a process
that runs only that child; the baseline row is the interpreter with the readers' imports
and nothing read). Slow readers get one round.

Usage: ``python bench/inline_dwarf.py [--rounds N] [--readers own,libdw,...] [BINARY ...]``
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ptscope.decode import inline_info  # noqa: E402
from ptscope.decode.inline_info import InlineTable, RawInlines, build_table  # noqa: E402
from ptscope.decode.perf_symbols import ElfImage  # noqa: E402

CACHE = ROOT / "bench" / "cache"
READERS = ["own", "own-cached", "own-every-die", "libdw", "pyelftools", "pyelftools-all"]
SLOW = {"pyelftools", "pyelftools-all"}

# ------------------------------------------------------------------- the big program

UNITS = 12
FUNCTIONS = 20


def _unit_source(i: int) -> str:
    out = [
        "#include <algorithm>\n#include <functional>\n#include <map>\n#include <numeric>\n"
        "#include <string>\n#include <unordered_map>\n#include <vector>\n",
        f"namespace ns{i} {{\n",
    ]
    for j in range(FUNCTIONS):
        out.append(f"""
struct Item{j} {{
  int a; double b; std::string s;
  bool operator<(const Item{j}& o) const {{ return a < o.a || (a == o.a && b < o.b); }}
}};
template <typename T> static inline T twice{j}(T x) {{ return x + x; }}
__attribute__((noinline)) double work{j}(int n) {{
  std::vector<Item{j}> v;
  std::map<int, Item{j}> m;
  std::unordered_map<std::string, int> h;
  for (int k = 0; k < n; ++k) {{
    v.push_back({{k * {j + 1} % 97, k * 0.5, std::to_string(k)}});
    m[k % 13] = v.back();
    h[v.back().s] += k;
  }}
  std::sort(v.begin(), v.end(), [](const Item{j}& x, const Item{j}& y) {{ return y < x; }});
  double acc = std::accumulate(v.begin(), v.end(), 0.0,
                               [](double t, const Item{j}& x) {{ return t + twice{j}(x.b); }});
  for (auto& [k, it] : m) acc += it.a + twice{j}(k);
  for (auto& [s, c] : h) acc += s.size() * c;
  std::function<double(double)> f = [&](double z) {{ return z * acc; }};
  return f(1.5);
}}
""")
    out.append(f"}}\ndouble run{i}(int n) {{\n  double t = 0;\n")
    out += [f"  t += ns{i}::work{j}(n);\n" for j in range(FUNCTIONS)]
    out.append("  return t;\n}\n")
    return "".join(out)


def big_program() -> Path:
    """The generated C++ program (built once: a few minutes on two cores)."""
    sources = {f"tu{i}.cpp": _unit_source(i) for i in range(UNITS)}
    main = "".join(f"double run{i}(int);\n" for i in range(UNITS))
    main += "int main(int c, char**) {\n  double t = 0;\n"
    main += "".join(f"  t += run{i}(c);\n" for i in range(UNITS)) + "  return (int)t;\n}\n"
    sources["main.cpp"] = main
    flags = ["-O2", "-g"]
    key = hashlib.sha256(repr((sorted(sources.items()), flags)).encode()).hexdigest()[:12]
    out = CACHE / f"inline-big-{key}"
    if out.exists():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"building {out.name} ({UNITS} C++ units, -O2 -g) ...", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in sources.items():
            (Path(tmp) / name).write_text(text)
        jobs = [
            subprocess.Popen(["g++", *flags, "-c", name], cwd=tmp)
            for name in sorted(sources)[: os.cpu_count() or 2]
        ]
        pending = sorted(sources)[len(jobs) :]
        while jobs:
            jobs.pop(0).wait()
            if pending:
                jobs.append(subprocess.Popen(["g++", *flags, "-c", pending.pop(0)], cwd=tmp))
        objects = [n.replace(".cpp", ".o") for n in sorted(sources)]
        tmp_out = out.with_name(f".{out.name}.tmp")
        subprocess.run(["g++", "-o", str(tmp_out), *objects], cwd=tmp, check=True)
        tmp_out.replace(out)
    return out


def system_binaries() -> list[Path]:
    """The system's binaries whose separate debug files are installed."""
    out = []
    for candidate in ("/lib/x86_64-linux-gnu/libc.so.6", sys.executable, "/usr/bin/python3"):
        path = Path(candidate).resolve()
        image = ElfImage.open(str(path))
        if image is None:
            continue
        found = inline_info._debug_image(image, path)
        image.close()
        if found is not None:
            found.close()
            if path not in out:
                out.append(path)
    return out


# ------------------------------------------------------------------- the readers


def read_own(path: Path, *, cached: bool = False) -> InlineTable | None:
    if cached:
        os.environ.pop("PTSCOPE_NO_INLINE_CACHE", None)  # (XDG_CACHE_HOME: the bench's)
    else:
        os.environ["PTSCOPE_NO_INLINE_CACHE"] = "1"
    return inline_info.read_inline_table(path)


def read_own_every_die(path: Path) -> InlineTable | None:
    """Our reader without its jumps over subtrees that hold no code."""
    image = ElfImage.open(str(path))
    assert image is not None, path
    dwarf = ElfImage.open(str(_dwarf_file(path)))
    assert dwarf is not None
    dw = inline_info._Dwarf(inline_info._Sections(dwarf))
    raw = RawInlines()
    inline_info.walk(dw, raw, jump=False)
    table = build_table(raw, _code(path))
    image.close()
    dwarf.close()
    return table


def _code(path: Path) -> list[tuple[int, int]] | None:
    """The executable sections' spans, which every reader cuts its ranges to."""
    image = ElfImage.open(str(path))
    assert image is not None, path
    spans = inline_info._code_spans(image)
    image.close()
    return spans or None


def _dwarf_file(path: Path) -> Path:
    """The file holding ``path``'s DWARF (itself, or its separate debug file)."""
    image = ElfImage.open(str(path))
    assert image is not None, path
    try:
        if inline_info._Sections(image).has(".debug_info"):
            return path
        debug = inline_info._debug_image(image, path)
        assert debug is not None, f"{path}: no DWARF"
        debug.close()
        return Path(debug.path)
    finally:
        image.close()


_DATA_FORMS = {"DW_FORM_data1", "DW_FORM_data2", "DW_FORM_data4", "DW_FORM_data8",
               "DW_FORM_udata", "DW_FORM_sdata", "DW_FORM_implicit_const"}  # fmt: skip
_C_LANGS = {0x01, 0x02, 0x04, 0x0C, 0x10, 0x11, 0x19, 0x1A, 0x1D, 0x21, 0x2A, 0x2B, 0x2C}
_NO_CODE = {
    "DW_TAG_array_type", "DW_TAG_enumeration_type", "DW_TAG_formal_parameter",
    "DW_TAG_imported_declaration", "DW_TAG_label", "DW_TAG_member", "DW_TAG_pointer_type",
    "DW_TAG_reference_type", "DW_TAG_subroutine_type", "DW_TAG_typedef",
    "DW_TAG_subrange_type", "DW_TAG_base_type", "DW_TAG_const_type", "DW_TAG_enumerator",
    "DW_TAG_template_type_param", "DW_TAG_template_value_param", "DW_TAG_variable",
    "DW_TAG_volatile_type", "DW_TAG_restrict_type", "DW_TAG_rvalue_reference_type",
    "DW_TAG_call_site", "DW_TAG_GNU_call_site", "DW_TAG_call_site_parameter",
    "DW_TAG_GNU_call_site_parameter", "DW_TAG_GNU_template_parameter_pack",
    "DW_TAG_GNU_formal_parameter_pack", "DW_TAG_inheritance", "DW_TAG_ptr_to_member_type",
    "DW_TAG_unspecified_parameters", "DW_TAG_imported_module",
}  # fmt: skip
_TYPES = {"DW_TAG_structure_type", "DW_TAG_class_type", "DW_TAG_union_type"}


def read_pyelftools(path: Path, *, every_die: bool = False) -> InlineTable | None:
    from elftools.elf.elffile import ELFFile

    with open(_dwarf_file(path), "rb") as f:
        dwarf = ELFFile(f).get_dwarf_info()
        ranges = dwarf.range_lists()
        raw = RawInlines()
        for cu in dwarf.iter_CUs():
            top = cu.get_top_DIE()
            lang = top.attributes.get("DW_AT_language")
            c_like = lang is not None and lang.value in _C_LANGS
            low = top.attributes.get("DW_AT_low_pc")
            base = low.value if low is not None else 0
            program = dwarf.line_program_for_CU(cu)
            files = program["file_entry"] if program is not None else []
            first = 0 if program is not None and program.header["version"] >= 5 else 1
            if every_die:
                scopes: dict[int, int] = {}
                for die in cu.iter_DIEs():
                    if die.tag != "DW_TAG_inlined_subroutine":
                        continue
                    parent = die.get_parent()
                    while parent is not None and parent.offset not in scopes:
                        parent = parent.get_parent()
                    scopes[die.offset] = len(raw.parents)
                    owner = scopes[parent.offset] if parent is not None else -1
                    _pyelftools_inline(die, owner, raw, ranges, base, files, first)
                continue
            stack = [(top, -1)]  # preorder: DIE order, as the other readers
            while stack:
                die, scope = stack.pop()
                tag = die.tag
                if tag == "DW_TAG_inlined_subroutine":
                    index = len(raw.parents)
                    _pyelftools_inline(die, scope, raw, ranges, base, files, first)
                    scope = index
                if die.has_children and not (tag in _NO_CODE or (c_like and tag in _TYPES)):
                    stack.extend((child, scope) for child in reversed(list(die.iter_children())))
        return build_table(raw, _code(path))


def _pyelftools_inline(
    die: Any, parent: int, raw: RawInlines, ranges: Any, base: int, files: Any, first: int
) -> None:
    index = len(raw.parents)
    raw.parents.append(parent)
    attrs = die.attributes
    name, linkage = b"?", False
    origin = die
    for _ in range(16):
        a = origin.attributes
        link = a.get("DW_AT_linkage_name") or a.get("DW_AT_MIPS_linkage_name")
        if link is not None:
            name, linkage = link.value, True
            break
        if name == b"?" and "DW_AT_name" in a:
            name = a["DW_AT_name"].value
        nxt = "DW_AT_abstract_origin" if "DW_AT_abstract_origin" in a else "DW_AT_specification"
        if nxt not in a:
            break
        origin = origin.get_DIE_from_attribute(nxt)
    raw.names.append(name)
    raw.linkage.append(linkage)
    call_file = attrs.get("DW_AT_call_file")
    line = attrs["DW_AT_call_line"].value if "DW_AT_call_line" in attrs else 0
    file = "?"
    if call_file is not None and 0 <= call_file.value - first < len(files):
        entry = files[call_file.value - first].name
        file = entry.decode("utf-8", "replace").rsplit("/", 1)[-1]
    raw.sites.append(f"{file}:{line}")
    spans: list[tuple[int, int]] = []
    if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
        lo = attrs["DW_AT_low_pc"].value
        high = attrs["DW_AT_high_pc"]
        spans.append((lo, lo + high.value if high.form in _DATA_FORMS else high.value))
    elif "DW_AT_ranges" in attrs:
        at = base
        for entry in ranges.get_range_list_at_offset(attrs["DW_AT_ranges"].value, cu=die.cu):
            if hasattr(entry, "base_address"):
                at = entry.base_address
            elif entry.is_absolute:
                spans.append((entry.begin_offset, entry.end_offset))
            else:
                spans.append((at + entry.begin_offset, at + entry.end_offset))
    for lo, hi in spans:
        if lo < hi < 1 << 64:
            raw.lo.append(lo)
            raw.hi.append(hi)
            raw.owner.append(index)


class _Die(ctypes.Structure):
    _fields_ = [("addr", ctypes.c_void_p), ("cu", ctypes.c_void_p),
                ("abbrev", ctypes.c_void_p), ("padding", ctypes.c_long)]  # fmt: skip


class _Attr(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint), ("form", ctypes.c_uint),
                ("valp", ctypes.c_void_p), ("cu", ctypes.c_void_p)]  # fmt: skip


def _libdw() -> Any:
    name = ctypes.util.find_library("dw") or "libdw.so.1"
    lib = ctypes.CDLL(name)
    die_p, attr_p = ctypes.POINTER(_Die), ctypes.POINTER(_Attr)
    u64p = ctypes.POINTER(ctypes.c_uint64)
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "dwarf_begin": (ctypes.c_void_p, [ctypes.c_int, ctypes.c_int]),
        "dwarf_end": (ctypes.c_int, [ctypes.c_void_p]),
        "dwarf_get_units": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint16),
                            ctypes.POINTER(ctypes.c_uint8), die_p, die_p]),
        "dwarf_child": (ctypes.c_int, [die_p, die_p]),
        "dwarf_siblingof": (ctypes.c_int, [die_p, die_p]),
        "dwarf_haschildren": (ctypes.c_int, [die_p]),
        "dwarf_tag": (ctypes.c_int, [die_p]),
        "dwarf_ranges": (ctypes.c_ssize_t, [die_p, ctypes.c_ssize_t, u64p, u64p, u64p]),
        "dwarf_attr": (attr_p, [die_p, ctypes.c_uint, attr_p]),
        "dwarf_attr_integrate": (attr_p, [die_p, ctypes.c_uint, attr_p]),
        "dwarf_formudata": (ctypes.c_int, [attr_p, u64p]),
        "dwarf_formstring": (ctypes.c_char_p, [attr_p]),
        "dwarf_getsrcfiles": (ctypes.c_int, [die_p, ctypes.POINTER(ctypes.c_void_p),
                              ctypes.POINTER(ctypes.c_size_t)]),
        "dwarf_filesrc": (ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_size_t, u64p, u64p]),
    }  # fmt: skip
    for fn, (res, args) in sigs.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


_TAG_INLINED = 0x1D
_NO_CODE_TAGS = inline_info._NO_CODE_TAGS
_TYPE_TAGS = inline_info._TYPE_TAGS


def read_libdw(path: Path) -> InlineTable | None:
    lib = _libdw()
    fd = os.open(_dwarf_file(path), os.O_RDONLY)
    dbg = lib.dwarf_begin(fd, 0)
    assert dbg, "dwarf_begin failed"
    raw = RawInlines()
    pending: list[_Die] = []  # the inlined DIEs, named late (those kept only)
    units: list[tuple[int, _Die]] = []
    try:
        cu = ctypes.c_void_p(None)
        nxt = ctypes.c_void_p()
        version, unit_type = ctypes.c_uint16(), ctypes.c_uint8()
        attr = _Attr()
        value = ctypes.c_uint64()
        base, start, end = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        tag_of, child_of, sibling_of = lib.dwarf_tag, lib.dwarf_child, lib.dwarf_siblingof
        while True:
            cudie, sub = _Die(), _Die()
            if lib.dwarf_get_units(dbg, cu, ctypes.byref(nxt), ctypes.byref(version),
                                   ctypes.byref(unit_type), ctypes.byref(cudie),
                                   ctypes.byref(sub)) != 0:  # fmt: skip
                break
            cu = ctypes.c_void_p(nxt.value)
            if unit_type.value not in (1, 3):
                continue
            lang = lib.dwarf_attr(ctypes.byref(cudie), 0x13, ctypes.byref(attr))
            c_like = bool(lang) and (
                lib.dwarf_formudata(ctypes.byref(attr), ctypes.byref(value)) == 0
                and value.value in inline_info._C_LANGUAGES
            )
            unit_index = len(units)
            units.append((0, cudie))
            stack: list[tuple[_Die, int]] = [(cudie, -1)]  # preorder: DIE order
            while stack:
                die, scope = stack.pop()
                tag = tag_of(ctypes.byref(die))
                if tag == _TAG_INLINED:
                    index = len(raw.parents)
                    raw.parents.append(scope)
                    pending.append(die)
                    raw.sites.append(str(unit_index))  # (the unit, for the call site)
                    off = 0
                    while True:
                        off = lib.dwarf_ranges(ctypes.byref(die), off, ctypes.byref(base),
                                               ctypes.byref(start), ctypes.byref(end))  # fmt: skip
                        if off <= 0:
                            break
                        if end.value > start.value:  # (libdw's values: 64 bits)
                            raw.lo.append(start.value)
                            raw.hi.append(end.value)
                            raw.owner.append(index)
                    scope = index
                if tag in _NO_CODE_TAGS or (c_like and tag in _TYPE_TAGS):
                    continue
                child = _Die()
                if child_of(ctypes.byref(die), ctypes.byref(child)) != 0:
                    continue
                kids = []
                while True:
                    kids.append((_Die.from_buffer_copy(child), scope))
                    if sibling_of(ctypes.byref(child), ctypes.byref(child)) != 0:
                        break
                stack.extend(reversed(kids))
        files_of: dict[int, list[str]] = {}

        def late(indexes: Any) -> list[tuple[bytes, bool, str]]:
            out = []
            for i in indexes:
                die = pending[i]
                name, linkage = b"?", False
                for code in (0x6E, 0x2007):
                    if lib.dwarf_attr_integrate(ctypes.byref(die), code, ctypes.byref(attr)):
                        s = lib.dwarf_formstring(ctypes.byref(attr))
                        if s is not None:
                            name, linkage = s, True
                            break
                if not linkage and lib.dwarf_attr_integrate(
                    ctypes.byref(die), 0x03, ctypes.byref(attr)
                ):
                    name = lib.dwarf_formstring(ctypes.byref(attr)) or b"?"
                unit = int(raw.sites[i])
                if unit not in files_of:
                    files = ctypes.c_void_p()
                    count = ctypes.c_size_t()
                    names = []
                    if lib.dwarf_getsrcfiles(ctypes.byref(units[unit][1]), ctypes.byref(files),
                                             ctypes.byref(count)) == 0:  # fmt: skip
                        for k in range(count.value):
                            src = lib.dwarf_filesrc(files, k, None, None) or b"?"
                            names.append(src.decode("utf-8", "replace").rsplit("/", 1)[-1])
                    files_of[unit] = names
                line = 0
                if lib.dwarf_attr(ctypes.byref(die), 0x59, ctypes.byref(attr)):
                    lib.dwarf_formudata(ctypes.byref(attr), ctypes.byref(value))
                    line = value.value
                file = "?"
                if lib.dwarf_attr(ctypes.byref(die), 0x58, ctypes.byref(attr)):
                    lib.dwarf_formudata(ctypes.byref(attr), ctypes.byref(value))
                    table = files_of[unit]
                    if 0 <= value.value < len(table):
                        file = table[value.value]
                out.append((name, linkage, f"{file}:{line}"))
            return out

        raw.late = late
        return build_table(raw, _code(path))
    finally:
        lib.dwarf_end(dbg)
        os.close(fd)


def run_reader(reader: str, path: Path) -> InlineTable | None:
    if reader == "own":
        return read_own(path)
    if reader == "own-cached":
        return read_own(path, cached=True)
    if reader == "own-every-die":
        return read_own_every_die(path)
    if reader == "pyelftools":
        return read_pyelftools(path)
    if reader == "pyelftools-all":
        return read_pyelftools(path, every_die=True)
    if reader == "libdw":
        return read_libdw(path)
    if reader == "none":
        return None
    raise SystemExit(f"unknown reader {reader}")


# ------------------------------------------------------------------- measuring


def _child(reader: str, path: str, dump: str | None) -> None:
    """Run in the grandchild: read, print the figures as JSON."""
    wall, cpu = time.perf_counter(), time.process_time()
    table = run_reader(reader, Path(path))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    runs = len(table.starts) if table is not None else 0
    scopes = len(table.scopes) if table is not None else 0
    if dump and table is not None:
        np.savez(
            dump, starts=table.starts, ends=table.ends, scope=table.scope,
            parents=np.array([s.parent for s in table.scopes], dtype=np.int64),
            names=np.array([s.name for s in table.scopes], dtype=object),
            sites=np.array([s.call_site for s in table.scopes], dtype=object),
        )  # fmt: skip
    print(json.dumps({"wall": wall, "cpu": cpu, "runs": runs, "scopes": scopes}))


def _measure(reader: str, path: str, dump: str | None) -> None:
    """Run in the child: run the reader in a grandchild of its own, report its peak RSS."""
    cmd = [sys.executable, __file__, "--run", reader, path] + (["--dump", dump] if dump else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        print(json.dumps({"error": done.stderr.strip()[-2000:]}))
        return
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["maxrss_kb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps(out))


def measure(reader: str, path: Path, dump: Path | None = None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--measure", reader, str(path)]
    if dump is not None:
        cmd += ["--dump", str(dump)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def same_tables(a: Path, b: Path) -> str:
    """'same' when two dumped tables agree (names: a plain DWARF name may be qualified in
    ours), else what differs."""
    with np.load(a, allow_pickle=True) as x, np.load(b, allow_pickle=True) as y:
        for key in ("starts", "ends", "scope", "parents", "sites"):
            if not np.array_equal(x[key], y[key]):
                return f"{key} differ"
        for n, m in zip(x["names"].tolist(), y["names"].tolist(), strict=True):
            if n != m and not n.endswith("::" + m) and not m.endswith("::" + n):
                return f"names differ: {n!r} / {m!r}"
    return "same"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binaries", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--readers", default=",".join(READERS))
    parser.add_argument("--run", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        _child(args.run[0], args.run[1], args.dump)
        return
    if args.measure:
        _measure(args.measure[0], args.measure[1], args.dump)
        return
    readers = args.readers.split(",")
    if "libdw" in readers and ctypes.util.find_library("dw") is None:
        print("libdw is not installed (apt-get install libdw1): skipping it")
        readers.remove("libdw")
    binaries = list(args.binaries) or [big_program(), *system_binaries()]
    base = measure("none", binaries[0])
    print(f"baseline (interpreter and imports, nothing read): peak RSS "
          f"{base['maxrss_kb'] / 1024:.0f} MiB\n")  # fmt: skip
    header = f"{'reader':<16}{'wall s':>9}{'CPU s':>9}{'peak RSS MiB':>14}{'runs':>9}{'scopes':>9}"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")  # (own-cached's, fresh)
        for binary in binaries:
            dwarf = _dwarf_file(binary)
            image = ElfImage.open(str(dwarf))
            assert image is not None
            size_info = len(inline_info._Sections(image).get(".debug_info"))
            image.close()
            debug = f" (debug file {dwarf.stat().st_size / 2**20:.1f} MB)"
            print(f"{binary}: {binary.stat().st_size / 2**20:.1f} MB"
                  + (debug if dwarf != binary else "")
                  + f", .debug_info {size_info / 2**20:.1f} MB")  # fmt: skip
            print(header)
            dumps: dict[str, Path] = {}
            for reader in readers:
                rounds = 1 if reader in SLOW else args.rounds
                if reader == "own-cached":
                    rounds = max(rounds, 2)
                dumps[reader] = Path(tmp) / f"{reader}.npz"
                results = [measure(reader, binary, dumps[reader] if r == 0 else None)
                           for r in range(rounds)]  # fmt: skip
                if any("error" in r for r in results):
                    print(f"{reader:<16}failed: {results[0].get('error', '')[-300:]}")
                    dumps.pop(reader)
                    continue
                best = min(results, key=lambda r: r["wall"])
                print(f"{reader:<16}{best['wall']:>9.2f}{min(r['cpu'] for r in results):>9.2f}"
                      f"{min(r['maxrss_kb'] for r in results) / 1024:>14.0f}"
                      f"{best['runs']:>9}{best['scopes']:>9}"
                      + (f"   (best of {rounds})" if rounds > 1 else ""))  # fmt: skip
            if "own" in dumps:
                for reader, dump in dumps.items():
                    if reader != "own":
                        print(f"  {reader} vs own: {same_tables(dumps['own'], dump)}")
            print()


if __name__ == "__main__":
    if shutil.which("g++") is None:
        sys.exit("g++ is needed to build the big program")
    main()
