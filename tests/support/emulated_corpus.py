"""The emulated backend's test corpus: programs recorded once per session, with ground truth."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ptscope.decode.parallel import read_trace_layout
from ptscope.errors import PtscopeError
from ptscope.perftool import find_perf, perf_env
from ptscope.record.emulated import EmulatedResult, EmulationOptions, record
from support import programs, qemu_truth


@dataclass(frozen=True)
class Case:
    """One corpus program and how to build and run it."""

    name: str
    static: bool = False
    opt: str = "-O1"
    single_step: bool = False
    link: str = ""
    """``lld``, ``gold``, ``static-pie`` or ``nopie`` (see :func:`support.programs.build`)."""
    args: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        kind = "static" if self.static else "dynamic"
        mode = "-single-step" if self.single_step else ""
        link = f"-{self.link}" if self.link else ""
        args = "".join(f"-{a}" for a in self.args)
        return f"{self.name}{args}-{kind}{self.opt}{link}{mode}"

    def argv(self) -> list[str]:
        exe = programs.build(self.name, static=self.static, opt=self.opt, link=self.link)
        if self.name == "dlopen":
            return [str(exe), str(programs.build("plugin", shared=True))]
        return [str(exe), *self.args]


def _recording_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}


# Every program of tests/programs that runs to completion on its own.
CORPUS = [
    Case("basics", static=True),
    Case("basics"),
    Case("tailcall", opt="-O2"),
    Case("longjmp"),
    Case("signals"),
    Case("dlopen"),
    Case("threads"),
    Case("fork"),
    Case("rep", static=True),
    Case("exceptions"),
    Case("crash"),
    Case("basics", static=True, single_step=True),
    Case("threads", single_step=True),
    # Other linkers lay segments out differently (lld: an executable segment that does not
    # start on a page boundary), and so do static PIEs and Rust programs.
    Case("basics", link="lld"),
    Case("basics", link="gold"),
    Case("basics", link="static-pie"),
    # Dynamically linked but not position-independent (gcc -no-pie): the program at its
    # link-time addresses, its libraries where QEMU maps them.
    Case("basics", link="nopie"),
    # Blocks cut at a page boundary (QEMU leaves the instruction there for the next one).
    Case("page_cross", static=True),
    Case("page_cross"),
    Case("signals", link="nopie"),
    Case("threads", link="nopie"),
    Case("rust_calls"),
    # Signal handlers that leave by siglongjmp (SIGALRM in pause(); SIGSEGV on an altstack).
    Case("siglongjmp"),
    Case("siglongjmp", static=True, args=("segv",)),
]


@dataclass
class Recorded:
    case: Case
    exe: Path
    directory: Path
    result: EmulatedResult
    truth: qemu_truth.Truth
    """Ground truth of the main process (``child_truths`` for forked children)."""
    child_truths: dict[int, qemu_truth.Truth]


_cache: dict[str, Recorded] = {}


def needs_tools() -> None:
    if shutil.which("qemu-x86_64") is None:
        pytest.skip("qemu-x86_64 is not installed")
    try:
        find_perf()
    except Exception:
        pytest.skip("perf is not usable")


def recorded(case: Case, base: Path) -> Recorded:
    """Record ``case`` (once per session) with a copy of QEMU's raw log, and load the truth."""
    needs_tools()
    if case.id in _cache:
        return _cache[case.id]
    argv = case.argv()
    directory = base / case.id
    raw = directory / "qemu.log"
    directory.mkdir(parents=True, exist_ok=True)
    exe = Path(argv[0])
    for attempt in range(3):
        result = record(
            argv,
            directory,
            # Without pytest's name of the test that happens to record it first: the
            # environment's size moves the stack, and so the branches a startup makes.
            options=EmulationOptions(
                raw_log=raw, single_step=case.single_step, env=_recording_environment()
            ),
        )
        try:
            truth = qemu_truth.load(raw, exe)
            break
        except qemu_truth.AmbiguousLog:
            # The truth's log, not ptscope, could not be read (threads' strace lines
            # interleaved): a new run interleaves differently.
            if attempt == 2:
                raise
            shutil.rmtree(directory)
            directory.mkdir()
    children = {}
    for log in sorted(directory.glob("qemu.log.*")):
        pid = int(log.suffix[1:])
        children[pid] = qemu_truth.load(log, exe, parent_log=raw, pid=pid)
    _cache[case.id] = rec = Recorded(case, exe, directory, result, truth, children)
    return rec


_BRANCH_RE = re.compile(r"^\s*(\d+)/(\d+)\s+(.*?)\s+([0-9a-f]+) =>\s+([0-9a-f]+)\s*$")
_KINDS = {
    "call": "call",
    "return": "return",
    "jmp": "jmp",
    "jcc": "jcc",
    "tr end  syscall": "syscall",
    "tr strt": "start",
    "tr end  async": "async",
}


@dataclass
class PerfBranches:
    by_tid: dict[int, list[qemu_truth.Branch]]
    errors: list[str]


def perf_text(perf_data: Path, fields: str) -> str:
    """``perf script --ns --itrace=bep -F FIELDS`` of a recording, as perf prints it."""
    script = ["script", "-i", str(perf_data), "--ns", "--itrace=bep", "-F", fields]
    return subprocess.run(
        [find_perf().path, *script], capture_output=True, text=True, env=perf_env(), check=True
    ).stdout


def perf_branch_stream(perf_data: Path) -> Iterator[tuple[int, qemu_truth.Branch] | str]:
    """``perf script --itrace=be`` of a recording, read as perf prints it (memory does not
    grow with the trace): (tid, taken branch) for each branch, the line for each error."""
    argv = [find_perf().path, "script", "-i", str(perf_data), "--itrace=be"]
    argv += ["-F", "pid,tid,flags,ip,addr"]
    with (
        tempfile.TemporaryFile("w+") as stderr,  # (a pipe could fill while stdout is read)
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=stderr, text=True, env=perf_env()
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            if "instruction trace error" in line:
                yield line.strip()
                continue
            m = _BRANCH_RE.match(line.rstrip("\n"))
            assert m, f"unexpected perf script line: {line!r}"
            kind = _KINDS.get(m.group(3).strip(), m.group(3).strip())
            yield int(m.group(2)), qemu_truth.Branch(kind, int(m.group(4), 16), int(m.group(5), 16))
        proc.wait()
        stderr.seek(0)
        assert proc.returncode == 0, stderr.read()


def perf_branches(perf_data: Path) -> PerfBranches:
    """``perf script --itrace=be`` of a recording: taken branches per thread, and errors."""
    got = PerfBranches({}, [])
    for item in perf_branch_stream(perf_data):
        if isinstance(item, str):
            got.errors.append(item)
        else:
            got.by_tid.setdefault(item[0], []).append(item[1])
    return got


# Small recordings for comparing decoders and engines: key -> (program, static, arguments).
# Each crosses several PSBs, so time windows have somewhere to cut.
DECODE_CASES: dict[str, tuple[str, bool, tuple[str, ...]]] = {
    "basics-static": ("basics", True, ("400",)),
    "basics-pie": ("basics", False, ("100",)),
    "tailcall-static": ("tailcall", True, ()),
    "longjmp-static": ("longjmp", True, ()),
    "signals-static": ("signals", True, ()),
    "exceptions-pie": ("exceptions", False, ()),
    "threads-pie": ("threads", False, ()),
    "rep-static": ("rep", True, ()),
    "fork-pie": ("fork", False, ()),
    "dlopen-pie": ("dlopen", False, ()),
}

_decode_cache: dict[str, Path] = {}


def decode_case_recording(key: str, tmp: pytest.TempPathFactory) -> Path:
    """The perf.data of :data:`DECODE_CASES` ``key``, recorded once per session."""
    if key not in _decode_cache:
        name, static, args = DECODE_CASES[key]
        argv = [str(programs.build(name, static=static)), *args]
        if name == "dlopen":
            argv.append(str(programs.build("plugin", shared=True)))
        try:
            result = record(argv, tmp.mktemp(key), max_instructions=2_000_000)
        except PtscopeError as e:
            pytest.skip(f"the emulated backend cannot record here: {e.message}")
        (_decode_cache[key],) = result.recording.perf_data_paths()
    return _decode_cache[key]


def damaged_copy(perf_data: Path, out: Path) -> Path:
    """``perf_data`` with three bytes of its largest Intel PT span flipped, written to ``out``."""
    layout = read_trace_layout(perf_data)
    assert layout is not None
    data = bytearray(perf_data.read_bytes())
    offset, size = max(layout.spans, key=lambda span: span[1])
    for k in range(1, 4):
        data[offset + k * size // 4] ^= 0x55
    out.write_bytes(bytes(data))
    return out
