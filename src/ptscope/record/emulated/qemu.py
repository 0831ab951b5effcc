"""Find ``qemu-x86_64``, find the recorder plugin it accepts, and run a program under both.

The recording itself is written by the plugin inside QEMU (``plugin/recorder.c``); this
module only builds the command line: ``qemu-x86_64 [-singlestep] -plugin RECORDER,ARGS
[-d LOG -D FILE] -0 ARGV0 PROGRAM ARGS...`` (the plugin reads the program's command line
back from QEMU's, so the program and its arguments come last).

The plugin is built by ``pip install`` for the plugin API of QEMU 7.x/8.x (version 1). A
QEMU that refuses it gets one compiled on first use for the API version it accepts (when
a C compiler is there), cached in ``~/.cache/ptscope``.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Final

from ptscope.errors import RecordingError, ToolMissingError
from ptscope.record.emulated.cycle_model import CycleModel

__all__ = [
    "RAW_LOG_ITEMS",
    "QemuTool",
    "find_qemu",
    "plugin_arguments",
    "recorder_plugin",
    "start_qemu",
]

RAW_LOG_ITEMS: Final = ("exec", "nochain", "in_asm", "page", "strace")
"""What QEMU logs for tests' ground truth (``EmulationOptions.raw_log``)."""
_INSTALL_HINT: Final = "install it with: sudo apt-get install qemu-user (or set PTSCOPE_QEMU)"
_PLUGIN_NAME: Final = "recorder.so"
_PLUGIN_SOURCES: Final = ("recorder", "perf_file", "x86_branch", "elf_facts", "code_pages")


@dataclass(frozen=True)
class QemuTool:
    """A located ``qemu-x86_64`` and what it can do."""

    path: str
    version: tuple[int, ...]
    single_step_flag: str
    """``-singlestep`` (QEMU < 8.1) or ``-one-insn-per-tb`` (QEMU >= 8.1)."""
    plugins: bool = False
    """It loads TCG plugins (``-plugin``)."""
    log_items: frozenset[str] = frozenset()
    """What ``-d`` can log (``-d help``)."""

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def _run_text(args: list[str]) -> str:
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolMissingError(f"cannot run {args[0]}: {e}", hint=_INSTALL_HINT) from e
    return out.stdout + out.stderr


@functools.cache
def find_qemu() -> QemuTool:
    """Locate qemu-x86_64 and check it loads TCG plugins, or raise."""
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
        flag = ""
    items = frozenset(re.findall(r"^(\w+)\s", _run_text([path, "-d", "help"]), re.M))
    if not re.search(r"^-plugin\b", help_text, re.M):
        raise ToolMissingError(
            f"{path} (QEMU {'.'.join(map(str, version))}) cannot load TCG plugins "
            "(`-h` has no -plugin): the recorder runs as one",
            hint="install a QEMU built with plugin support: sudo apt-get install qemu-user "
            "(Debian and Ubuntu's is), or set PTSCOPE_QEMU",
        )
    return QemuTool(
        path=path, version=version, single_step_flag=flag, plugins=True, log_items=items
    )


def installed_plugin() -> Path:
    """Where ``pip install`` put the recorder plugin (it may be missing)."""
    return Path(str(resources.files(__package__) / _PLUGIN_NAME))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ptscope"


def _build_plugin(api: int) -> Path | None:
    """The recorder compiled from the package's sources for plugin API ``api`` (cached by
    content), or None when it cannot be (no compiler, no sources)."""
    folder = Path(str(resources.files(__package__) / "plugin"))
    native = Path(str(resources.files("ptscope") / "_native"))
    try:
        sources = [*sorted(folder.glob("*.[ch]")), *sorted(native.glob("x86_length.[ch]"))]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    except OSError:
        return None
    target = _cache_dir() / f"recorder-api{api}-{digest}.so"
    if target.exists():
        return target
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        res = subprocess.run(
            [
                compiler,
                "-shared",
                "-fPIC",
                "-O2",
                "-std=gnu11",
                "-pthread",
                "-fvisibility=hidden",
                f"-DPTSCOPE_PLUGIN_API={api}",
                f"-I{native}",
                "-o",
                str(tmp),
                *(str(folder / f"{name}.c") for name in _PLUGIN_SOURCES),
                str(native / "x86_length.c"),
            ],
            capture_output=True,
            timeout=300,
            check=False,
        )
        if res.returncode != 0:
            return None
        tmp.replace(target)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return target


def _accepted(tool: QemuTool, plugin: Path) -> bool:
    """QEMU loads plugins before the program, so a program that does not exist tells
    whether it accepts this one (its API version) without running anything."""
    said = _run_text(
        [tool.path, "-plugin", f"file={_escape(str(plugin))},probe=1", "/nonexistent/ptscope-probe"]
    )
    return "plugin" not in said.lower()


@functools.cache
def recorder_plugin(tool: QemuTool) -> Path:
    """The recorder plugin this QEMU accepts, or raise."""
    installed = installed_plugin()
    if installed.is_file() and _accepted(tool, installed):
        return installed
    likely = 1 if tool.version < (9, 0) else 2 if tool.version < (9, 1) else 3
    for api in (likely, likely + 1, likely - 1):
        built = _build_plugin(api)
        if built is not None and _accepted(tool, built):
            return built
    raise ToolMissingError(
        f"QEMU {tool.version_text} does not accept ptscope's recorder plugin"
        + (
            ""
            if installed.is_file()
            else " (it was not built: reinstall ptscope with a C compiler)"
        ),
        hint="ptscope's recorder uses QEMU's plugin API version 1 (QEMU 4.2 to 8.x)",
    )


def _escape(value: str) -> str:
    """A value inside a QEMU option list: commas are doubled."""
    return value.replace(",", ",,")


def plugin_arguments(
    directory: Path,
    command: Sequence[str],
    model: CycleModel,
    *,
    psb_period: int,
    max_instructions: int | None,
    raw_log: Path | None,
    chunk_size: int | None = None,
) -> dict[str, str | int]:
    """The recorder's arguments (``plugin/recorder.c``, ``qemu_plugin_install``)."""
    args: dict[str, str | int] = {
        "dir": str(directory.resolve()),
        "comm": os.path.basename(command[0])[:15],
        "argc": len(command),
        "watch": os.getpid(),
        "watch_start": _start_time(os.getpid()),
        "psb": psb_period,
        "limit": max_instructions or 0,
        "cpi": model.cycles_per_insn,
        "syscall": model.syscall_cycles,
        "start_tsc": model.start_tsc,
        "shift": model.time_shift,
        "mult": model.time_mult,
        "ratio": model.ratio,
        "cycthr": model.cyc_threshold,
    }
    if raw_log is not None:
        args["rawlog"] = str(raw_log.resolve())
    if chunk_size is not None:
        args["chunk"] = chunk_size
    return args


def _start_time(pid: int) -> int:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22): with
    the pid, it names the process even if the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


_ADDR_NO_RANDOMIZE: Final = 0x0040000


def _find_personality() -> Callable[[int], int] | None:
    try:
        function: Callable[[int], int] = ctypes.CDLL(None, use_errno=True).personality
    except (OSError, AttributeError):
        return None
    return function


# Looked up once, here: the child between fork and exec should not load anything.
_PERSONALITY: Final = _find_personality()


def _fixed_layout() -> None:
    """``preexec_fn``: no address-space randomisation for QEMU (what ``setarch -R`` does;
    QEMU places the program, its stack and its mappings with the host's mmap, so the
    guest's layout is then the same every run)."""
    if _PERSONALITY is not None:
        current = _PERSONALITY(0xFFFFFFFF)
        _PERSONALITY(current | _ADDR_NO_RANDOMIZE)


def start_qemu(
    tool: QemuTool,
    plugin: Path,
    program: Path,
    command: Sequence[str],
    arguments: Mapping[str, str | int],
    *,
    single_step: bool = False,
    raw_log: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    print_command: Callable[[str], None] | None = None,
    deterministic: bool = False,
) -> subprocess.Popen[bytes]:
    """Start QEMU running ``command`` (``program`` is its resolved path) with the recorder;
    ``deterministic``: with a fixed seed and without address-space randomisation."""
    cmd = [tool.path]
    if deterministic:
        cmd += ["-seed", "1"]
    if single_step:
        if not tool.single_step_flag:
            raise ToolMissingError(
                f"{tool.path} (QEMU {tool.version_text}) has neither -singlestep nor "
                "-one-insn-per-tb",
                hint=_INSTALL_HINT,
            )
        cmd.append(tool.single_step_flag)
    options = ",".join(
        [f"file={_escape(str(plugin))}"] + [f"{k}={_escape(str(v))}" for k, v in arguments.items()]
    )
    cmd += ["-plugin", options]
    if raw_log is not None:
        missing = [i for i in RAW_LOG_ITEMS if i not in tool.log_items]
        if missing:
            raise ToolMissingError(
                f"{tool.path} (QEMU {tool.version_text}) cannot log {', '.join(missing)} "
                "(`-d help` does not list them)",
                hint=_INSTALL_HINT,
            )
        cmd += ["-d", ",".join(RAW_LOG_ITEMS), "-D", str(raw_log)]
    cmd += ["-0", command[0], str(program), *command[1:]]
    if print_command is not None:
        print_command(shlex.join(cmd))
    try:
        return subprocess.Popen(
            cmd,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            preexec_fn=_fixed_layout if deterministic else None,
        )
    except OSError as e:
        raise RecordingError(f"cannot start {tool.path}: {e.strerror or e}") from e
