"""Run a program under ``qemu-x86_64``, its trace log streamed through a FIFO; split the log.

QEMU user mode logs (``-d exec,nochain,in_asm,page,strace``) one line per executed
translation block (``Trace CPU: HOST [CS_BASE/PC/FLAGS/CFLAGS] SYMBOL``), the instructions of
every newly translated block (``in_asm``), the initial memory layout (``page``) and every
system call (``strace``). The log goes to a FIFO that this process reads while QEMU runs, so
nothing is written to disk and memory stays bounded.

:class:`LogSplitter` cuts the byte stream into lines with numpy and decodes the block lines
(the vast majority) in bulk, column by column; everything else is handed on as raw lines.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import itertools
import os
import re
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from ptscope.errors import RecordingError, ToolMissingError

__all__ = [
    "REQUIRED_LOG_ITEMS",
    "BlockRun",
    "LogSplitter",
    "QemuProcess",
    "QemuTool",
    "find_qemu",
]

REQUIRED_LOG_ITEMS: Final = ("exec", "nochain", "in_asm", "page", "strace")
_INSTALL_HINT: Final = "install it with: sudo apt-get install qemu-user (or set PTSCOPE_QEMU)"
_F_SETPIPE_SZ: Final = 1031
_PIPE_SIZE: Final = 1 << 20
_READ_SIZE: Final = 1 << 20

U8Array = npt.NDArray[np.uint8]
U64Array = npt.NDArray[np.uint64]
I64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class QemuTool:
    """A located ``qemu-x86_64`` and the spelling of its options."""

    path: str
    version: tuple[int, ...]
    single_step_flag: str
    """``-singlestep`` (QEMU < 8.1) or ``-one-insn-per-tb`` (QEMU >= 8.1)."""
    plugins: bool = False
    """It loads TCG plugins (``-plugin``, ``-d plugin``)."""


def _run_text(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissingError(f"cannot run {args[0]}: {e}", hint=_INSTALL_HINT) from e
    return out.stdout + out.stderr


@functools.cache
def find_qemu() -> QemuTool:
    """Locate qemu-x86_64 and check it can log what the tracer needs, or raise."""
    name = os.environ.get("PTSCOPE_QEMU", "qemu-x86_64")
    path = shutil.which(name) if os.sep not in name else (name if os.path.exists(name) else None)
    if path is None:
        raise ToolMissingError(f"qemu-x86_64 not found ({name})", hint=_INSTALL_HINT)
    version_text = _run_text([path, "--version"])
    m = re.search(r"version (\d+)\.(\d+)(?:\.(\d+))?", version_text)
    if not m:
        raise ToolMissingError(
            f"{path} does not look like qemu-x86_64 (`--version` said {version_text[:60]!r})",
            hint=_INSTALL_HINT,
        )
    version = tuple(int(g) for g in m.groups() if g is not None)
    help_text = _run_text([path, "-h"])
    if re.search(r"^-one-insn-per-tb\b", help_text, re.M):
        flag = "-one-insn-per-tb"
    elif re.search(r"^-singlestep\b", help_text, re.M):
        flag = "-singlestep"
    else:
        raise ToolMissingError(
            f"{path} (QEMU {'.'.join(map(str, version))}) has neither -singlestep nor "
            "-one-insn-per-tb",
            hint=_INSTALL_HINT,
        )
    items = set(re.findall(r"^(\w+)\s", _run_text([path, "-d", "help"]), re.M))
    missing = [i for i in REQUIRED_LOG_ITEMS if i not in items]
    if missing:
        raise ToolMissingError(
            f"{path} (QEMU {'.'.join(map(str, version))}) cannot log {', '.join(missing)} "
            "(`-d help` does not list them)",
            hint=_INSTALL_HINT,
        )
    plugins = bool(re.search(r"^-plugin\b", help_text, re.M)) and "plugin" in items
    return QemuTool(path=path, version=version, single_step_flag=flag, plugins=plugins)


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ptscope"


def _built_helper(source_name: str, flags: Sequence[str] = ()) -> Path | None:
    """A C file next to this module compiled into a shared object with the C compiler on
    first use (cached in ~/.cache/ptscope by content and flags), or None if it cannot be."""
    source = Path(__file__).with_name(source_name)
    try:
        code = source.read_bytes()
    except OSError:
        return None
    digest = hashlib.sha256(code + "".join(flags).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{source.stem}-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        res = subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", *flags, "-o", str(tmp), str(source)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        if res.returncode != 0:
            return None
        tmp.replace(target)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return target


@functools.cache
def fork_shim() -> Path | None:
    """The compiled fork shim (built with the C compiler on first use), or None."""
    return _built_helper("qemu_fork_shim.c")


@functools.cache
def thread_plugin(tool: QemuTool) -> Path | None:
    """The thread plugin (``qemu_thread_plugin.c``) built for the plugin API version this
    QEMU accepts, or None (no plugin support, no C compiler): thread ids then come from
    QEMU's strace lines alone. A plugin declares the one API version it was built for, and
    QEMU refuses one outside its range: the likely version is tried on a program that does
    not exist (QEMU loads plugins first), then its neighbours."""
    if not tool.plugins:
        return None
    version = tool.version[:2]
    likely = 1 if version < (9, 0) else 2 if version < (9, 1) else 3 if version < (9, 2) else 4
    for api in (likely, likely + 1, likely - 1):
        plugin = _built_helper("qemu_thread_plugin.c", [f"-DPTSCOPE_PLUGIN_API={api}"])
        if plugin is None:
            return None
        probe = [tool.path, "-plugin", str(plugin), "-d", "plugin", "-D", os.devnull]
        try:
            said = _run_text([*probe, "/nonexistent/ptscope-probe"])
        except ToolMissingError:
            return None
        if "plugin" not in said.lower():
            return plugin
    return None


class QemuProcess:
    """QEMU running one program; its log (and each forked child's) readable as byte chunks."""

    def __init__(
        self,
        tool: QemuTool,
        program: Path,
        argv: Sequence[str],
        *,
        single_step: bool,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        print_command: Callable[[str], None] | None = None,
    ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="ptscope-qemu-")
        fifo = os.path.join(self._tmp.name, "log")
        os.mkfifo(fifo, 0o600)
        # Our own write end keeps the FIFO from reporting end-of-file before QEMU opens it;
        # the end of the stream is "QEMU exited and the FIFO is empty".
        self._fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self._keepalive = os.open(fifo, os.O_WRONLY)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        environment = dict(os.environ if env is None else env)
        shim = fork_shim()
        self._listener: socket.socket | None = None
        self.separates_forks = shim is not None
        if shim is not None:
            path = os.path.join(self._tmp.name, "forks")
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
            self._listener.listen(64)
            self._listener.setblocking(False)
            if "LD_PRELOAD" in environment:
                environment["PTSCOPE_GUEST_LD_PRELOAD"] = environment["LD_PRELOAD"]
            environment.update(LD_PRELOAD=str(shim), PTSCOPE_QEMU_LOG=fifo, PTSCOPE_QEMU_FORKS=path)
        cmd = [tool.path]
        if single_step:
            cmd.append(tool.single_step_flag)
        items = list(REQUIRED_LOG_ITEMS)
        plugin = thread_plugin(tool)
        self.names_threads = plugin is not None
        """The thread plugin says which tid each vCPU runs (else strace results tell)."""
        if plugin is not None:
            cmd += ["-plugin", str(plugin)]
            items.append("plugin")
        cmd += ["-d", ",".join(items), "-D", fifo, "-0", argv[0], str(program)]
        cmd += list(argv[1:])
        self.command = cmd
        if print_command is not None:
            print_command(shlex.join(cmd))
        try:
            self.proc = subprocess.Popen(cmd, env=environment, cwd=cwd)
        except OSError as e:
            self.close()
            raise RecordingError(f"cannot start {tool.path}: {e.strerror or e}") from e
        self.killed = False
        self.children: set[int] = set()
        """Forked children of the program (each its own QEMU process)."""

    def chunks(self, idle: Callable[[], None] | None = None) -> Iterator[tuple[int, bytes]]:
        """``(0, data)`` from the program's log, ``(pid, data)`` from a forked child's, as
        it arrives, until QEMU has exited and everything it wrote is read. ``idle`` is
        called at every turn (at least every 50 ms)."""
        sel = selectors.DefaultSelector()
        sel.register(self._fd, selectors.EVENT_READ, 0)
        if self._listener is not None:
            sel.register(self._listener, selectors.EVENT_READ, -1)
        hello: dict[socket.socket, bytes] = {}
        exited = False
        try:
            while True:
                if idle is not None:
                    idle()
                events = sel.select(timeout=0 if exited else 0.05)
                got = False
                for key, _ in events:
                    tag = key.data
                    if tag == -1:
                        assert self._listener is not None
                        with contextlib.suppress(BlockingIOError):
                            conn, _ = self._listener.accept()
                            conn.setblocking(False)
                            hello[conn] = b""
                            sel.register(conn, selectors.EVENT_READ, -2)
                        continue
                    conn = cast(socket.socket, key.fileobj)
                    try:
                        data = os.read(self._fd, _READ_SIZE) if tag == 0 else conn.recv(_READ_SIZE)
                    except (BlockingIOError, InterruptedError):
                        continue
                    if not data:
                        if tag != 0:  # a child closed its log
                            sel.unregister(conn)
                            conn.close()
                        continue
                    got = True
                    if tag == -2:  # a child's first bytes: "PTSCOPE-FORK pid ppid\n"
                        buf = hello[conn] + data
                        line, nl, rest = buf.partition(b"\n")
                        if not nl:
                            hello[conn] = buf
                            continue
                        del hello[conn]
                        pid = int(line.split()[1])
                        self.children.add(pid)
                        sel.modify(conn, selectors.EVENT_READ, pid)
                        if rest:
                            yield pid, rest
                        continue
                    yield tag, data
                if exited and not got:
                    return
                if not exited and self.proc.poll() is not None:
                    exited = True  # drain what is left, then stop
        finally:
            for key in list(sel.get_map().values()):
                if key.data not in (0, -1):
                    cast(socket.socket, key.fileobj).close()
            sel.close()

    def stop(self) -> None:
        """Kill QEMU and its forked children (the program has run long enough)."""
        if self.proc.poll() is None:
            self.killed = True
        self.send_signal(signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` to the program and its forked children (QEMU passes it on)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def wait(self) -> int:
        return self.proc.wait()

    def close(self) -> None:
        for fd in (getattr(self, "_fd", -1), getattr(self, "_keepalive", -1)):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._keepalive = -1
        if getattr(self, "_listener", None) is not None:
            assert self._listener is not None
            self._listener.close()
            self._listener = None
        self._tmp.cleanup()


# -- splitting the log -------------------------------------------------------------------

_HEX = np.full(256, 255, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX[_c] = 10 + _i
_PC_COLUMNS: Final = np.arange(18, 34)
_CFLAGS_COLUMNS: Final = np.arange(44, 52)


def _hex_columns(buf: U8Array, starts: I64Array, columns: npt.NDArray[np.int64]) -> U8Array:
    digits = _HEX[buf[starts[:, None] + columns[None, :]]]
    if digits.size and digits.max() == 255:
        raise ValueError("not a hex digit")
    packed = (digits[:, 0::2] << 4) | digits[:, 1::2]
    return np.ascontiguousarray(packed)


@dataclass(frozen=True)
class BlockRun:
    """Consecutive ``Trace`` lines: which CPU (thread slot) ran which block."""

    cpu: I64Array
    pc: U64Array
    cflags: npt.NDArray[np.uint32]


class LogFormatError(RecordingError):
    """QEMU's log does not look like what this version of ptscope understands."""


class LogSplitter:
    """Cuts the log stream into :class:`BlockRun` arrays and other (raw) lines, in order."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, data: bytes) -> list[BlockRun | bytes]:
        data = self._tail + data
        end = data.rfind(b"\n") + 1
        self._tail = data[end:]
        return self._split(data[:end]) if end else []

    def finish(self) -> list[BlockRun | bytes]:
        data, self._tail = self._tail, b""
        return self._split(data + b"\n") if data else []

    def _split(self, data: bytes) -> list[BlockRun | bytes]:
        buf = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(buf == 10)
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts
        first = buf[starts]
        second = buf[np.minimum(starts + 1, len(buf) - 1)]
        is_block = (first == ord("T")) & (second == ord("r")) & (lengths > 60)
        out: list[BlockRun | bytes] = []
        if not is_block.any():
            out.extend(data[s:e] for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
            return out
        # Runs of equal is_block values.
        change = np.flatnonzero(np.diff(is_block.astype(np.int8))) + 1
        bounds = [0, *change.tolist(), len(starts)]
        brackets = np.flatnonzero(buf == ord("["))
        for lo, hi in itertools.pairwise(bounds):
            if not is_block[lo]:
                out.extend(
                    data[s:e]
                    for s, e in zip(starts[lo:hi].tolist(), ends[lo:hi].tolist(), strict=True)
                )
                continue
            out.append(self._blocks(data, buf, starts[lo:hi], ends[lo:hi], brackets))
        return out

    @staticmethod
    def _blocks(
        data: bytes, buf: U8Array, starts: I64Array, ends: I64Array, brackets: I64Array
    ) -> BlockRun:
        b = brackets[np.searchsorted(brackets, starts)]
        ok = (
            (b + 52 < ends)
            & (buf[np.minimum(b + 17, len(buf) - 1)] == ord("/"))
            & (buf[np.minimum(b + 34, len(buf) - 1)] == ord("/"))
            & (buf[np.minimum(b + 43, len(buf) - 1)] == ord("/"))
            & (buf[np.minimum(b + 52, len(buf) - 1)] == ord("]"))
        )
        if not ok.all():
            bad = int(np.flatnonzero(~ok)[0])
            line = data[starts[bad] : ends[bad]].decode(errors="replace")
            raise LogFormatError(f"QEMU's exec log line is not in the expected format: {line!r}")
        try:
            pc = _hex_columns(buf, b, _PC_COLUMNS).view(">u8").ravel().astype(np.uint64)
            cflags = _hex_columns(buf, b, _CFLAGS_COLUMNS).view(">u4").ravel().astype(np.uint32)
        except ValueError:
            raise LogFormatError("QEMU's exec log has a non-hex program counter") from None
        # "Trace N:" - N is QEMU's CPU index (one per guest thread alive at the same time).
        colon = buf[starts + 7] == ord(":")
        cpu = buf[starts + 6].astype(np.int64) - ord("0")
        if not colon.all():
            for i in np.flatnonzero(~colon).tolist():
                head = data[starts[i] : starts[i] + 24]
                m = re.match(rb"Trace (\d+):", head)
                if not m:
                    raise LogFormatError(
                        f"QEMU's exec log line is not in the expected format: {head!r}"
                    )
                cpu[i] = int(m.group(1))
        return BlockRun(cpu=cpu, pc=pc, cflags=cflags)


def read_errno_name(code: int) -> str:
    return errno.errorcode.get(code, str(code))
