"""What this machine can and cannot record, and the exact command that fixes each gap.

:func:`diagnose` turns :class:`~ptscope.record.capabilities.Capabilities` into findings
for ``ptscope doctor``; :func:`require` raises the same advice as a one-line error when
``run``/``attach`` need something that is missing, before anything is started.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from ptscope.errors import RecordingError, ToolMissingError
from ptscope.record.capabilities import Capabilities

__all__ = ["Finding", "Status", "diagnose", "refusal", "render", "require"]

INSTALL_PERF: Final = "sudo apt-get install linux-perf"
INSTALL_QEMU: Final = "sudo apt-get install qemu-user"
BUILD_RECORDER: Final = "reinstall ptscope with a C compiler (sudo apt-get install gcc; make venv)"
BUILD_DLFILTER: Final = (
    "make venv   (or: pip install -e . with perf's headers: sudo apt-get install linux-perf)"
)
LOWER_PARANOID: Final = "sudo sysctl kernel.perf_event_paranoid=1"
LOWER_PARANOID_USER: Final = "sudo sysctl kernel.perf_event_paranoid=2"
KPTR: Final = "sudo sysctl kernel.kptr_restrict=0"
PTRACE_SCOPE: Final = "sudo sysctl kernel.yama.ptrace_scope=1"
NO_PT: Final = (
    "this CPU (or VM) has no Intel PT: use --backend emulated (exact, under QEMU) or "
    "--backend sampling"
)


class Status(Enum):
    OK = "ok"
    WARN = "warn"
    MISSING = "missing"
    INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One line of the report: what was checked, what was found, and how to fix it."""

    topic: str
    status: Status
    detail: str
    fix: str | None = None


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def diagnose(caps: Capabilities) -> list[Finding]:
    """Every check ``ptscope doctor`` reports, in a stable order."""
    out: list[Finding] = []
    perf = caps.perf
    if perf is None:
        out.append(Finding("perf", Status.MISSING, caps.perf_problem or "not found", INSTALL_PERF))
    else:
        features = (
            f"control fifo {_yes(perf.has_control_fifo)}, "
            f"dlfilter {_yes(perf.has_dlfilter)}, "
            f"snapshot-on-exit {_yes(perf.has_snapshot_on_exit)}, "
            f"kcore {_yes(perf.has_kcore)}"
        )
        version = ".".join(str(v) for v in perf.version)
        old = not (perf.has_control_fifo and perf.has_dlfilter)
        out.append(
            Finding(
                "perf",
                Status.WARN if old else Status.OK,
                f"{perf.path} {version}: {features}",
                f"a newer perf (>= 5.14) adds what is missing: {INSTALL_PERF}" if old else None,
            )
        )
    pt = caps.intel_pt
    if pt.present:
        detail = (
            f"present: psb_cyc {_yes(pt.psb_cyc)}, mtc {_yes(pt.mtc)}, cyc {_yes(pt.cyc)}, "
            f"address filters {pt.address_filters}"
        )
        fix = None
        status = Status.OK
        if not pt.psb_cyc:
            status = Status.WARN
            detail += " (older generation: ~1 us timing)"
        out.append(Finding("intel_pt", status, detail, fix))
    else:
        hint = NO_PT
        if caps.cpu_vendor == "GenuineIntel":
            hint += "; in a VM, ask the hypervisor to pass Intel PT through"
        out.append(Finding("intel_pt", Status.MISSING, "not available on this machine", hint))
    out.append(
        Finding(
            "hardware events",
            Status.OK if caps.hardware_events else Status.INFO,
            "CPU counters available"
            if caps.hardware_events
            else "no CPU counters (a VM?): sampling uses the cpu-clock timer",
        )
    )
    out.append(
        Finding(
            "call graphs",
            Status.OK if caps.lbr else Status.INFO,
            "LBR available" if caps.lbr else "no LBR: sampling unwinds with DWARF",
        )
    )
    paranoid = caps.paranoid
    if paranoid is None:
        out.append(Finding("perf_event_paranoid", Status.WARN, "cannot read it", None))
    elif caps.perf_privileged:
        out.append(
            Finding(
                "perf_event_paranoid",
                Status.OK,
                f"{paranoid} (running privileged: no restriction applies)",
            )
        )
    else:
        if paranoid > 2:
            out.append(
                Finding(
                    "perf_event_paranoid",
                    Status.MISSING,
                    f"{paranoid}: unprivileged users cannot use perf at all",
                    LOWER_PARANOID_USER,
                )
            )
        elif paranoid == 2:
            out.append(
                Finding(
                    "perf_event_paranoid",
                    Status.WARN,
                    "2: your own processes, user space only (no --kernel)",
                    f"for --kernel: {LOWER_PARANOID} (or run as root)",
                )
            )
        else:
            out.append(Finding("perf_event_paranoid", Status.OK, str(paranoid)))
    kptr = caps.kptr_restrict
    if kptr is None:
        out.append(Finding("kptr_restrict", Status.WARN, "cannot read it"))
    elif kptr == 0 or (kptr == 1 and caps.perf_privileged):
        out.append(Finding("kptr_restrict", Status.OK, f"{kptr}: kernel symbols are readable"))
    else:
        out.append(
            Finding(
                "kptr_restrict",
                Status.WARN,
                f"{kptr}: kernel addresses are hidden, kernel frames will be [unknown]",
                KPTR,
            )
        )
    out.append(
        Finding(
            "kcore",
            Status.OK if caps.can_read_kcore else Status.INFO,
            "readable (--kernel traces decode reliably)"
            if caps.can_read_kcore
            else "needs root (--kernel needs privileges anyway)",
        )
    )
    out.append(
        Finding(
            "breakpoints",
            Status.OK if caps.breakpoints else Status.MISSING,
            "hardware breakpoints available (--trigger)"
            if caps.breakpoints
            else "no breakpoint PMU: --trigger cannot work",
        )
    )
    if caps.can_ptrace:
        out.append(Finding("ptrace", Status.OK, "run can hold the program until perf is ready"))
    else:
        out.append(
            Finding(
                "ptrace",
                Status.INFO,
                "Yama ptrace_scope=3: run starts programs through a shell gate instead",
                PTRACE_SCOPE,
            )
        )
    out.append(
        Finding(
            "qemu",
            Status.OK if caps.qemu else Status.MISSING,
            f"{caps.qemu} (--backend emulated)"
            if caps.qemu
            else "qemu-x86_64 not found: --backend emulated cannot run",
            None if caps.qemu else INSTALL_QEMU,
        )
    )
    out.append(
        Finding(
            "recorder",
            Status.OK if caps.recorder_built else Status.WARN,
            "the emulated backend's QEMU plugin is built"
            if caps.recorder_built
            else "the QEMU plugin was not built: --backend emulated compiles it on first use "
            "(a C compiler is needed)",
            None if caps.recorder_built else BUILD_RECORDER,
        )
    )
    out.append(
        Finding(
            "dlfilter",
            Status.OK if caps.dlfilter_built else Status.WARN,
            f"built ({caps.dlfilter_path})"
            if caps.dlfilter_built
            else "not built: decoding falls back to slower perf script text",
            None if caps.dlfilter_built else BUILD_DLFILTER,
        )
    )
    return out


def render(findings: list[Finding]) -> str:
    """Plain text, one finding per line, fixes indented under it."""
    width = max(len(f.topic) for f in findings)
    lines: list[str] = []
    marks = {Status.OK: "ok  ", Status.WARN: "warn", Status.MISSING: "MISS", Status.INFO: "info"}
    for f in findings:
        lines.append(f"[{marks[f.status]}] {f.topic:<{width}}  {f.detail}")
        if f.fix:
            lines.append(f"       {'':<{width}}  fix: {f.fix}")
    return "\n".join(lines)


def refusal(message: str, *, hint: str | None = None) -> RecordingError:
    return RecordingError(message, hint=hint)


def require(caps: Capabilities, backend: str, *, kernel: bool = False) -> None:
    """Raise the doctor's advice as one error if ``backend`` cannot record here."""
    if caps.perf is None:
        raise ToolMissingError(caps.perf_problem or "perf not found", hint=INSTALL_PERF)
    if backend == "intel-pt" and not caps.intel_pt.present:
        raise RecordingError("no Intel PT on this machine", hint=NO_PT)
    if not caps.perf_privileged and caps.paranoid is not None and caps.paranoid > 2:
        raise RecordingError(
            f"perf_event_paranoid is {caps.paranoid}: perf is off for unprivileged users",
            hint=f"run as root, or: {LOWER_PARANOID_USER}",
        )
    if kernel and not caps.can_trace_kernel:
        raise RecordingError(
            "--kernel/--kernel-only need root (or CAP_PERFMON, or perf_event_paranoid <= 1)",
            hint=f"run with sudo, or: {LOWER_PARANOID}",
        )
