"""Driving the C dlfilter without perf: compile it, fake perf's callback table with ctypes.

``FakePerf`` loads a build of the dlfilter (``dlfilter.c`` and its other files), fills its
exported ``perf_dlfilter_fns`` with ctypes callbacks (``resolve_ip``, ``resolve_addr``,
``args``) and calls ``start`` / ``filter_event_early`` / ``stop`` with fabricated
``struct perf_dlfilter_sample``s, the way perf does. The ctypes mirrors of perf's structs
are checked against the system header by ``tests/native/test_record_layout.py``.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ptscope.decode import record_format as rf
from ptscope.model import BranchFlags as F

ROOT = Path(__file__).resolve().parents[2]
NATIVE_SRC = ROOT / "src" / "ptscope" / "_native"
BUILD_DIR = ROOT / "tests" / ".build" / "native"
CFLAGS = ["-O2", "-Wall", "-Werror", "-std=c11"]


def compile_c(
    sources: Sequence[Path],
    name: str,
    *,
    shared: bool,
    extra: Sequence[str] = (),
    depends: Sequence[Path] = (),
) -> Path:
    """Compile C sources into tests/.build/native (cached by content and flags; ``depends``:
    headers outside ``_native`` they include)."""
    h = hashlib.sha256()
    flags = [*CFLAGS, *(["-fPIC", "-shared", "-fvisibility=hidden"] if shared else []), *extra]
    for src in [*sources, *depends]:
        h.update(src.read_bytes())
    for header in sorted(NATIVE_SRC.glob("*.h")):
        h.update(header.read_bytes())
    h.update(" ".join(flags).encode())
    out = BUILD_DIR / f"{name}-{h.hexdigest()[:16]}{'.so' if shared else ''}"
    if not out.exists():
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")  # test workers build in parallel
        subprocess.run(
            ["gcc", *flags, f"-I{NATIVE_SRC}", "-o", str(tmp), *map(str, sources)],
            check=True,
            capture_output=True,
            text=True,
        )
        tmp.replace(out)
    return out


def setup_files(name: str) -> list[Path]:
    """The C files setup.py lists under ``name`` (``DLFILTER_FILES``, ``ENGINE_FILES``)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return [NATIVE_SRC / f"{stem}.c" for stem in ast.literal_eval(node.value)]
    raise AssertionError(f"setup.py has no {name}")


def build_dlfilter() -> Path:
    """A test build of the dlfilter, from the files setup.py builds it from (its flags but
    -flto, which changes no behaviour and would slow every test build)."""
    return compile_c(setup_files("DLFILTER_FILES"), "dlfilter-test", shared=True)


def c_layout(includes: Sequence[str], members: dict[str, Sequence[str]]) -> dict[str, object]:
    """sizeof / offsetof / member sizes as the C compiler sees them, for layout checks.

    ``members`` maps a struct name to the members to report. Returns
    ``{struct: {"size": n, "fields": {member: [offset, size]}}}``.
    """
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += [f"#include {inc}" for inc in includes]
    lines += ["int main(void) {", 'printf("{");']
    for i, (struct, names) in enumerate(members.items()):
        sep = "," if i else ""
        lines.append(
            f'printf("{sep}\\"{struct}\\": {{\\"size\\": %zu, \\"fields\\": {{", '
            f"sizeof(struct {struct}));"
        )
        for j, m in enumerate(names):
            sep2 = "," if j else ""
            lines.append(
                f'printf("{sep2}\\"{m}\\": [%zu, %zu]", offsetof(struct {struct}, {m}), '
                f"sizeof(((struct {struct} *)0)->{m}));"
            )
        lines.append('printf("}}");')
    lines += ['printf("}\\n");', "return 0; }"]
    source = "\n".join(lines) + "\n"
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    src = BUILD_DIR / f"layout-{digest}.c"
    if not src.exists():  # written whole under its name: a test worker may be reading it
        tmp = src.with_name(f".{src.name}.{os.getpid()}")
        tmp.write_text(source)
        tmp.replace(src)
    exe = compile_c([src], "layout", shared=False)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    result: dict[str, object] = json.loads(out)
    return result


# ----------------------------------------------------------- perf's structs


class Sample(ctypes.Structure):
    """``struct perf_dlfilter_sample`` (perf 6.1, with machine_pid/vcpu)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("ins_lat", ctypes.c_uint16),
        ("p_stage_cyc", ctypes.c_uint16),
        ("ip", ctypes.c_uint64),
        ("pid", ctypes.c_int32),
        ("tid", ctypes.c_int32),
        ("time", ctypes.c_uint64),
        ("addr", ctypes.c_uint64),
        ("id", ctypes.c_uint64),
        ("stream_id", ctypes.c_uint64),
        ("period", ctypes.c_uint64),
        ("weight", ctypes.c_uint64),
        ("transaction", ctypes.c_uint64),
        ("insn_cnt", ctypes.c_uint64),
        ("cyc_cnt", ctypes.c_uint64),
        ("cpu", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
        ("data_src", ctypes.c_uint64),
        ("phys_addr", ctypes.c_uint64),
        ("data_page_size", ctypes.c_uint64),
        ("code_page_size", ctypes.c_uint64),
        ("cgroup", ctypes.c_uint64),
        ("cpumode", ctypes.c_uint8),
        ("addr_correlates_sym", ctypes.c_uint8),
        ("misc", ctypes.c_uint16),
        ("raw_size", ctypes.c_uint32),
        ("raw_data", ctypes.c_void_p),
        ("brstack_nr", ctypes.c_uint64),
        ("brstack", ctypes.c_void_p),
        ("raw_callchain_nr", ctypes.c_uint64),
        ("raw_callchain", ctypes.c_void_p),
        ("event", ctypes.c_char_p),
        ("machine_pid", ctypes.c_int32),
        ("vcpu", ctypes.c_int32),
    ]


class Al(ctypes.Structure):
    """``struct perf_dlfilter_al`` (perf 6.1, without the later ``priv``)."""

    _fields_ = [
        ("size", ctypes.c_uint32),
        ("symoff", ctypes.c_uint32),
        ("sym", ctypes.c_void_p),
        ("addr", ctypes.c_uint64),
        ("sym_start", ctypes.c_uint64),
        ("sym_end", ctypes.c_uint64),
        ("dso", ctypes.c_void_p),
        ("sym_binding", ctypes.c_uint8),
        ("is_64_bit", ctypes.c_uint8),
        ("is_kernel_ip", ctypes.c_uint8),
        ("buildid_size", ctypes.c_uint32),
        ("buildid", ctypes.c_void_p),
        ("filtered", ctypes.c_uint8),
        ("comm", ctypes.c_void_p),
    ]


ResolveFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
ArgsFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
ObjectCodeFn = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint32
)


class Fns(ctypes.Structure):
    """``struct perf_dlfilter_fns`` (8 callbacks + 120 reserved pointers)."""

    _fields_ = [
        ("resolve_ip", ResolveFn),
        ("resolve_addr", ResolveFn),
        ("args", ArgsFn),
        ("resolve_address", ctypes.c_void_p),
        ("insn", ctypes.c_void_p),
        ("srcline", ctypes.c_void_p),
        ("attr", ctypes.c_void_p),
        ("object_code", ctypes.c_void_p),
        ("reserved", ctypes.c_void_p * 120),
    ]


PERF_STRUCT_MIRRORS: dict[str, type[ctypes.Structure]] = {
    "perf_dlfilter_sample": Sample,
    "perf_dlfilter_al": Al,
    "perf_dlfilter_fns": Fns,
}


# ---------------------------------------------------------------- the fake


@dataclass
class Sym:
    """What perf would resolve an address to (None fields: unknown)."""

    name: str | None
    dso: str | None
    start: int = 0
    end: int = 0


@dataclass
class Output:
    """A stream split into its records (decoded with the record_format mirror)."""

    header: dict[str, object]
    strings: dict[int, str] = field(default_factory=dict)
    locations: dict[int, dict[str, int]] = field(default_factory=dict)
    branches: list[dict[str, int]] = field(default_factory=list)
    """Each branch record's fields; with instruction detail also ``ranges``: the (first
    line, count) ranges of the lines records before it and its own last range."""
    power: list[dict[str, int]] = field(default_factory=list)
    trailer: dict[str, int] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    """Where each record in ``order`` starts (the header, at 0, is not listed)."""

    def location(self, loc_id: int) -> tuple[int, str | None, int, str | None]:
        loc = self.locations[loc_id]
        return (
            loc["ip"],
            self.strings.get(loc["symbol"]),
            loc["offset"],
            self.strings.get(loc["dso"]),
        )


def split_stream(data: bytes) -> Output:
    """Walk a stream record by record (no text lines expected)."""
    pos = 0
    hdr = rf.HEADER_DTYPE
    h = dict(zip(hdr.names, rf.HEADER.unpack_from(data, 0), strict=True))
    out = Output(header=h)
    pos = rf.HEADER.size
    ranges: list[tuple[int, int]] = []
    insns = bool(h["options"] & rf.OPT_INSNS)
    while pos < len(data):
        tag = data[pos]
        out.offsets.append(pos)
        if tag == rf.TAG_STRING:
            _, sid, length = rf.STRING.unpack_from(data, pos)
            pos += rf.STRING.size
            out.strings[sid] = data[pos : pos + length].decode()
            pos += length
            out.order.append("string")
        elif tag == rf.TAG_LOCATION:
            vals = rf.LOCATION.unpack_from(data, pos)
            rec = dict(zip(rf.LOCATION_DTYPE.names, vals, strict=True))
            out.locations[rec["id"]] = rec
            pos += rf.LOCATION.size
            out.order.append("location")
        elif tag == rf.TAG_BRANCH and insns:
            vals = rf.INSNS_BRANCH.unpack_from(data, pos)
            *fields, first, count = vals
            out.branches.append(dict(zip(rf.BRANCH_DTYPE.names, fields, strict=True)))
            out.branches[-1]["ranges"] = ranges + ([(first, count)] if count else [])  # type: ignore[assignment]
            ranges = []
            pos += rf.INSNS_BRANCH.size
            out.order.append("branch")
        elif tag == rf.TAG_BRANCH:
            vals = rf.BRANCH.unpack_from(data, pos)
            out.branches.append(dict(zip(rf.BRANCH_DTYPE.names, vals, strict=True)))
            pos += rf.BRANCH.size
            out.order.append("branch")
        elif tag == rf.TAG_LINES:
            _, used, *pairs = rf.LINES.unpack_from(data, pos)
            assert 1 <= used <= rf.LINES_PER_RECORD
            ranges += [(pairs[2 * k], pairs[2 * k + 1]) for k in range(used)]
            pos += rf.LINES.size
            out.order.append("lines")
        elif tag == rf.TAG_POWER:
            vals = rf.POWER.unpack_from(data, pos)
            out.power.append(dict(zip(rf.POWER_DTYPE.names, vals, strict=True)))
            pos += rf.POWER.size
            out.order.append("power")
        elif tag == rf.TAG_TRAILER:
            vals = rf.TRAILER.unpack_from(data, pos)
            out.trailer = dict(zip(rf.TRAILER_DTYPE.names, vals, strict=True))
            pos += rf.TRAILER.size
            out.order.append("trailer")
        else:
            raise AssertionError(f"unexpected byte {tag:#x} at {pos}")
    return out


class FakePerf:
    """Plays perf for the dlfilter: one start, samples, one stop."""

    CTX = 0x5EED

    def __init__(
        self, lib_path: Path, args: Sequence[str], code: dict[int, bytes] | None = None
    ) -> None:
        """``code``: the process's code (start address -> bytes) that ``object_code()``
        reads, as perf reads it from the files mapped there."""
        self.lib = ctypes.CDLL(str(lib_path))
        self.code = code if code is not None else {}
        self.object_code_calls: list[tuple[int, int]] = []
        self.lib.start.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        self.lib.filter_event_early.argtypes = [
            ctypes.c_void_p,
            ctypes.POINTER(Sample),
            ctypes.c_void_p,
        ]
        self.lib.stop.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self._argv = (ctypes.c_char_p * (len(args) + 1))(*[a.encode() for a in args], None)
        self._argc = len(args)
        self._strings: dict[str, ctypes.Array[ctypes.c_char]] = {}
        self._keep: list[object] = []
        self._ip_al: Al | None = None
        self._addr_al: Al | None = None
        self.resolve_ip_calls = 0
        self.resolve_addr_calls = 0
        self.in_filter = False
        self.data = ctypes.c_void_p()
        fns = Fns.in_dll(self.lib, "perf_dlfilter_fns")
        self._cb = (ResolveFn(self._resolve_ip), ResolveFn(self._resolve_addr), ArgsFn(self._args))
        self._code_cb = ObjectCodeFn(self._object_code)
        ctypes.memset(ctypes.addressof(fns), 0, ctypes.sizeof(Fns))
        fns.resolve_ip, fns.resolve_addr, fns.args = self._cb
        fns.object_code = ctypes.cast(self._code_cb, ctypes.c_void_p).value

    # perf's callbacks
    def _resolve_ip(self, ctx: int) -> int:
        assert ctx == self.CTX
        self.resolve_ip_calls += 1
        return ctypes.addressof(self._ip_al) if self.in_filter and self._ip_al else 0

    def _resolve_addr(self, ctx: int) -> int:
        assert ctx == self.CTX
        self.resolve_addr_calls += 1
        return ctypes.addressof(self._addr_al) if self.in_filter and self._addr_al else 0

    def _args(self, ctx: int, argc: ctypes._Pointer[ctypes.c_int]) -> int:
        assert ctx == self.CTX
        argc[0] = self._argc
        return ctypes.addressof(self._argv)

    def _object_code(self, ctx: int, ip: int, buf: int, length: int) -> int:
        assert ctx == self.CTX and self.in_filter
        self.object_code_calls.append((ip, length))
        for start, data in self.code.items():
            if start <= ip < start + len(data):
                # As perf: no further than the end of the mapping.
                chunk = data[ip - start : ip - start + length]
                ctypes.memmove(buf, chunk, len(chunk))
                return len(chunk)
        return -1

    # helpers
    def cstr(self, text: str | None, *, fresh: bool = False) -> int | None:
        """A C string; the same text gives the same pointer (as perf's symbols do)."""
        if text is None:
            return None
        buf = self._strings.get(text)
        if buf is None or fresh:
            buf = ctypes.create_string_buffer(text.encode())
            self._strings[text] = buf
            self._keep.append(buf)
        return ctypes.addressof(buf)

    def al(self, addr: int, sym: Sym | None, comm: str | None = "prog") -> Al:
        al = Al(size=ctypes.sizeof(Al))
        al.addr = addr
        if sym is not None:
            al.sym = self.cstr(sym.name)
            al.dso = self.cstr(sym.dso)
            al.sym_start = sym.start
            al.sym_end = sym.end
            al.symoff = (addr - sym.start) & 0xFFFFFFFF if sym.name else 0
        al.comm = self.cstr(comm)
        return al

    # perf's calls
    def start(self) -> int:
        return int(self.lib.start(ctypes.byref(self.data), self.CTX))

    def sample(
        self,
        *,
        ip: int,
        addr: int = 0,
        flags: int = 0,
        event: str = "branches",
        pid: int = 100,
        tid: int = 100,
        time: int = 1000,
        cpu: int = 0,
        insn_cnt: int = 0,
        cyc_cnt: int = 0,
        ip_sym: Sym | None = None,
        addr_sym: Sym | None = None,
        comm: str | None = "prog",
        raw: bytes | None = None,
    ) -> int:
        s = Sample(size=ctypes.sizeof(Sample))
        s.ip, s.addr, s.flags, s.pid, s.tid, s.time, s.cpu = ip, addr, flags, pid, tid, time, cpu
        s.insn_cnt, s.cyc_cnt = insn_cnt, cyc_cnt
        s.addr_correlates_sym = 1
        event_buf = self.cstr(event)
        s.event = ctypes.cast(event_buf, ctypes.c_char_p) if event_buf else None
        if raw is not None:
            raw_buf = ctypes.create_string_buffer(raw, len(raw))
            self._keep.append(raw_buf)
            s.raw_data = ctypes.addressof(raw_buf)
            s.raw_size = len(raw)
        self._ip_al = self.al(ip, ip_sym, comm)
        self._addr_al = self.al(addr, addr_sym, None)
        self.in_filter = True
        try:
            return int(self.lib.filter_event_early(self.data, ctypes.byref(s), self.CTX))
        finally:
            self.in_filter = False
            # perf reuses its structures after the call: scribble over them so that a
            # filter that kept pointers into them would write garbage.
            ctypes.memset(ctypes.addressof(self._ip_al), 0xA5, ctypes.sizeof(Al))
            ctypes.memset(ctypes.addressof(self._addr_al), 0xA5, ctypes.sizeof(Al))
            ctypes.memset(ctypes.addressof(s), 0x5A, ctypes.sizeof(Sample))

    def stop(self) -> int:
        return int(self.lib.stop(self.data, self.CTX))


# ------------------------------------------------- a fake program with code

# Instruction detail tests: a process's code (served through object_code()) and a run of it.
CALL = F.BRANCH | F.CALL
RET = F.BRANCH | F.RETURN
JCC = F.BRANCH | F.CONDITIONAL
JMP = F.BRANCH
START = F.BRANCH | F.TRACE_BEGIN
END_ASYNC = F.BRANCH | F.ASYNC | F.TRACE_END

EXE = "/usr/bin/prog"
MAIN = Sym("main", EXE, 0x1000, 0x1100)
FOO = Sym("foo", EXE, 0x1100, 0x1200)
NOPS = Sym("nops", EXE, 0x2000, 0x2400)

# main: push rbp; mov rbp, rsp; call foo; nop; ret
MAIN_CODE = bytes.fromhex("55 4889e5 e8f7000000 90 c3")
# foo: xor eax, eax; L: add eax, 1; cmp eax, 5; jne L; ret
FOO_CODE = bytes.fromhex("31c0 83c001 83f805 75f8 c3")
CODE = {0x1000: MAIN_CODE, 0x1100: FOO_CODE, 0x2000: b"\x90" * 0x400}


def call_and_loop(tid: int = 100) -> list[dict[str, object]]:
    """main calls foo, foo loops 5 times (4 jumps back, dropped), returns; then the trace
    ends asynchronously at main's ret (the nop before it ran, the ret did not)."""
    loop = dict(ip=0x1108, addr=0x1102, flags=int(JCC), ip_sym=FOO, addr_sym=FOO, tid=tid)
    return [
        dict(ip=0, addr=0x1000, flags=int(START), addr_sym=MAIN, tid=tid),
        dict(ip=0x1004, addr=0x1100, flags=int(CALL), ip_sym=MAIN, addr_sym=FOO, tid=tid),
        loop,
        loop,
        loop,
        loop,
        dict(ip=0x110A, addr=0x1009, flags=int(RET), ip_sym=FOO, addr_sym=MAIN, tid=tid),
        dict(ip=0x100A, addr=0, flags=int(END_ASYNC), ip_sym=MAIN, tid=tid),
    ]


def scattered_jumps(tid: int = 100) -> list[dict[str, object]]:
    """Seven one-nop blocks on every other code line of ``nops`` (jumps inside it,
    dropped), then a call out: seven line ranges for one kept branch."""
    samples: list[dict[str, object]] = [
        dict(ip=0, addr=0x2000, flags=int(START), addr_sym=NOPS, tid=tid)
    ]
    for k in range(6):
        src, dst = 0x2000 + 0x80 * k, 0x2000 + 0x80 * (k + 1)
        samples.append(dict(ip=src, addr=dst, flags=int(JMP), ip_sym=NOPS, addr_sym=NOPS, tid=tid))
    samples.append(
        dict(ip=0x2300, addr=0x1000, flags=int(CALL), ip_sym=NOPS, addr_sym=MAIN, tid=tid)
    )
    return samples
