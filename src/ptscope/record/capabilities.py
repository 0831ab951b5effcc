"""Probing what this machine can record with: perf, Intel PT, privileges, QEMU, as plain data.

One :func:`probe` call reads sysfs, procfs and ``perf --version``; everything that decides
how to record (and what ``ptscope doctor`` reports) reads the resulting
:class:`Capabilities`. The roots of sysfs and procfs are parameters so that machines we
do not have (an Intel CPU with PT) can be described in tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ptscope.errors import PtscopeError
from ptscope.perftool import PerfTool, find_perf, perf_output
from ptscope.record.emulated.qemu import installed_plugin

__all__ = ["Capabilities", "IntelPtCaps", "probe", "probe_perf_build_options"]

CAP_SYS_ADMIN: Final = 21
CAP_SYS_PTRACE: Final = 19
CAP_PERFMON: Final = 38
_PT_CAPS_OF_INTEREST: Final = (
    "psb_cyc",
    "mtc",
    "cyc_thresholds",
    "mtc_periods",
    "psb_periods",
    "ip_filtering",
    "num_address_ranges",
    "ptwrite",
    "power_event_trace",
)


@dataclass(frozen=True)
class IntelPtCaps:
    """The ``intel_pt`` PMU: whether it exists and what its ``caps/`` directory says."""

    present: bool
    caps: dict[str, str] = field(default_factory=dict)
    config_terms: tuple[str, ...] = ()
    nr_addr_filters: int = 0

    def flag(self, name: str) -> bool:
        """A boolean capability (``caps/NAME`` holds a non-zero number)."""
        value = self.caps.get(name, "0").strip()
        try:
            return int(value, 0) != 0
        except ValueError:
            return False

    @property
    def psb_cyc(self) -> bool:
        """CYC packets and configurable PSB period: fine-grained timing (Skylake and later)."""
        return self.flag("psb_cyc")

    @property
    def mtc(self) -> bool:
        return self.flag("mtc")

    @property
    def cyc(self) -> bool:
        # perf exposes CYC support through psb_cyc (CPUID.(EAX=14H,ECX=0):EBX[1]).
        return self.flag("psb_cyc")

    @property
    def address_filters(self) -> int:
        return self.nr_addr_filters


@dataclass(frozen=True)
class Capabilities:
    """What the machine offers for recording. ``None`` means "could not be read"."""

    perf: PerfTool | None
    perf_problem: str | None
    intel_pt: IntelPtCaps
    hardware_events: bool
    breakpoints: bool
    paranoid: int | None
    kptr_restrict: int | None
    mlock_kb: int | None
    max_sample_rate: int | None
    ptrace_scope: int | None
    euid: int
    effective_caps: int
    cpu_vendor: str
    lbr: bool
    qemu: str | None
    dlfilter_built: bool
    dlfilter_path: str
    recorder_built: bool = False
    """The emulated backend's QEMU plugin was built by ``pip install``."""

    @property
    def is_root(self) -> bool:
        return self.euid == 0

    def has_cap(self, bit: int) -> bool:
        return bool(self.effective_caps >> bit & 1)

    @property
    def perf_privileged(self) -> bool:
        """May trace the kernel and any process (root, CAP_PERFMON or CAP_SYS_ADMIN)."""
        return self.is_root or self.has_cap(CAP_PERFMON) or self.has_cap(CAP_SYS_ADMIN)

    @property
    def can_trace_kernel(self) -> bool:
        return self.perf_privileged or (self.paranoid is not None and self.paranoid <= 1)

    @property
    def can_read_kcore(self) -> bool:
        return self.is_root or self.has_cap(CAP_SYS_ADMIN)

    @property
    def can_ptrace(self) -> bool:
        """Whether ``run`` can stop its child at exec (Yama ptrace_scope 3 forbids it)."""
        return self.ptrace_scope is None or self.ptrace_scope < 3

    def perf_at_least(self, major: int, minor: int) -> bool:
        return self.perf is not None and self.perf.at_least(major, minor)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None


def _effective_caps(proc: Path) -> int:
    status = _read(proc / "self" / "status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split()[1], 16)
            except (ValueError, IndexError):
                return 0
    return 0


def _cpu_info(proc: Path) -> tuple[str, bool]:
    """CPU vendor and whether every CPU has ``pdcm`` (what perf needs for LBR call graphs)."""
    text = _read(proc / "cpuinfo") or ""
    vendor = ""
    flag_lines = 0
    pdcm_lines = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and not vendor:
            vendor = value.strip()
        elif key == "flags":
            flag_lines += 1
            pdcm_lines += "pdcm" in value.split()
    return vendor, flag_lines > 0 and pdcm_lines == flag_lines


def _intel_pt(sys_root: Path) -> IntelPtCaps:
    pmu = sys_root / "bus" / "event_source" / "devices" / "intel_pt"
    if not pmu.is_dir():
        return IntelPtCaps(present=False)
    caps: dict[str, str] = {}
    caps_dir = pmu / "caps"
    if caps_dir.is_dir():
        for entry in sorted(caps_dir.iterdir()):
            value = _read(entry)
            if value is not None:
                caps[entry.name] = value.strip()
    formats = pmu / "format"
    terms = tuple(sorted(p.name for p in formats.iterdir())) if formats.is_dir() else ()
    return IntelPtCaps(
        present=True,
        caps=caps,
        config_terms=terms,
        nr_addr_filters=_read_int(pmu / "nr_addr_filters") or 0,
    )


def _has_pmu(sys_root: Path, *names: str) -> bool:
    devices = sys_root / "bus" / "event_source" / "devices"
    return any((devices / n).is_dir() for n in names)


def probe(
    *,
    sys_root: Path = Path("/sys"),
    proc_root: Path = Path("/proc"),
    perf: PerfTool | None = None,
    dlfilter_path: Path | None = None,
) -> Capabilities:
    """Read everything once. Never raises: what is missing is reported in the result.

    ``dlfilter_path`` is where the decode stage's dlfilter would be (the CLI knows it).
    """
    perf_problem: str | None = None
    if perf is None:
        try:
            perf = find_perf()
        except PtscopeError as e:
            perf_problem = e.message
    vendor, lbr = _cpu_info(proc_root)
    kernel = proc_root / "sys" / "kernel"
    return Capabilities(
        perf=perf,
        perf_problem=perf_problem,
        intel_pt=_intel_pt(sys_root),
        # The core PMU is "cpu" (or cpu_core/cpu_atom on hybrid Intel); VMs often lack it.
        hardware_events=_has_pmu(sys_root, "cpu", "cpu_core", "cpu_atom"),
        breakpoints=_has_pmu(sys_root, "breakpoint"),
        paranoid=_read_int(kernel / "perf_event_paranoid"),
        kptr_restrict=_read_int(kernel / "kptr_restrict"),
        mlock_kb=_read_int(kernel / "perf_event_mlock_kb"),
        max_sample_rate=_read_int(kernel / "perf_event_max_sample_rate"),
        ptrace_scope=_read_int(kernel / "yama" / "ptrace_scope"),
        euid=os.geteuid(),
        effective_caps=_effective_caps(proc_root),
        cpu_vendor=vendor,
        lbr=lbr and vendor == "GenuineIntel" and _has_pmu(sys_root, "cpu", "cpu_core"),
        qemu=shutil.which("qemu-x86_64"),
        dlfilter_built=dlfilter_path is not None and dlfilter_path.is_file(),
        dlfilter_path=str(dlfilter_path or ""),
        recorder_built=installed_plugin().is_file(),
    )


def probe_perf_build_options(perf: PerfTool) -> dict[str, bool]:
    """``perf version --build-options`` as {feature: on}; empty when perf does not say."""
    try:
        _, stdout, _ = perf_output(perf.path, "version", "--build-options")
    except (OSError, subprocess.TimeoutExpired):
        return {}
    features: dict[str, bool] = {}
    for line in stdout.splitlines():
        name, colon, rest = line.partition(":")
        if colon and "[" in rest:
            features[name.strip()] = "on" in rest.split("]")[0]
    return features
