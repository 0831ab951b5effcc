"""Capability probing, doctor advice, and the Intel PT path up to where hardware is needed.

This machine has no Intel PT, so a PT machine is described as a sysfs/procfs tree in a
temporary directory (the files perf and the kernel document); everything else is probed
for real.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from ptscope.errors import RecordingError, ToolMissingError, UsageError
from ptscope.perftool import PerfTool, find_perf
from ptscope.record import doctor
from ptscope.record.capabilities import Capabilities, probe
from ptscope.record.intel_pt import IntelPtBackend
from ptscope.record.perf_commands import Control, Targets, TraceScope, parse_timer_resolution
from ptscope.record.sampling import SamplingBackend, choose_callgraph


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def intel_machine(tmp_path: Path, *, psb_cyc: bool = True, paranoid: int = 2) -> tuple[Path, Path]:
    sys_root, proc_root = tmp_path / "sys", tmp_path / "proc"
    pt = "bus/event_source/devices/intel_pt"
    for cap, value in {
        "psb_cyc": "1" if psb_cyc else "0",
        "mtc": "1",
        "ip_filtering": "1",
        "num_address_ranges": "2",
    }.items():
        write(sys_root, f"{pt}/caps/{cap}", value + "\n")
    for term in ("cyc", "mtc_period", "noretcomp", "psb_period", "tsc"):
        write(sys_root, f"{pt}/format/{term}", "config:1\n")
    write(sys_root, f"{pt}/nr_addr_filters", "2\n")
    (sys_root / "bus/event_source/devices/cpu").mkdir(parents=True)
    (sys_root / "bus/event_source/devices/breakpoint").mkdir(parents=True)
    write(proc_root, "sys/kernel/perf_event_paranoid", f"{paranoid}\n")
    write(proc_root, "sys/kernel/kptr_restrict", "1\n")
    write(proc_root, "sys/kernel/perf_event_max_sample_rate", "50000\n")
    write(proc_root, "sys/kernel/perf_event_mlock_kb", "516\n")
    cpu = "vendor_id\t: GenuineIntel\nflags\t\t: fpu pdcm pt\n\n"
    write(proc_root, "cpuinfo", cpu * 4)
    write(proc_root, "self/status", "Name:\tx\nCapEff:\t0000000000000000\n")
    return sys_root, proc_root


PERF_61 = PerfTool("/usr/bin/perf", (6, 1, 0), "perf version 6.1")


def test_intel_pt_machine_is_read_from_sysfs(tmp_path: Path) -> None:
    sys_root, proc_root = intel_machine(tmp_path)
    caps = probe(sys_root=sys_root, proc_root=proc_root, perf=PERF_61)
    assert caps.intel_pt.present
    assert caps.intel_pt.psb_cyc and caps.intel_pt.mtc and caps.intel_pt.cyc
    assert caps.intel_pt.address_filters == 2
    assert "noretcomp" in caps.intel_pt.config_terms
    assert caps.hardware_events and caps.breakpoints and caps.lbr
    assert (caps.paranoid, caps.kptr_restrict, caps.max_sample_rate) == (2, 1, 50000)
    assert caps.cpu_vendor == "GenuineIntel"


def test_intel_pt_argv_on_a_pt_machine(tmp_path: Path) -> None:
    sys_root, proc_root = intel_machine(tmp_path)
    caps = probe(sys_root=sys_root, proc_root=proc_root, perf=PERF_61)
    backend, warnings = IntelPtBackend(timer=parse_timer_resolution("high")).prepare(caps)
    assert warnings == []
    control = Control(tmp_path / "ctl", tmp_path / "ack")
    argv = backend.record_argv(PERF_61, tmp_path / "perf.data", Targets((10,)), control)
    assert argv == [
        "/usr/bin/perf",
        "record",
        "-o",
        str(tmp_path / "perf.data"),
        "--timestamp",
        "--event=intel_pt/cyc=1,cyc_thresh=1,mtc_period=0,noretcomp=1/u",
        "--per-thread",
        "-t",
        "10",
        "--snapshot=e",
        f"--control=fifo:{tmp_path / 'ctl'},{tmp_path / 'ack'}",
    ]


def test_trigger_means_snapshot_on_request_and_old_perf_has_no_exit_snapshot(
    tmp_path: Path,
) -> None:
    sys_root, proc_root = intel_machine(tmp_path)
    caps = probe(sys_root=sys_root, proc_root=proc_root, perf=PERF_61)
    backend, _ = IntelPtBackend(has_trigger=True, multi_snapshot=True).prepare(caps)
    argv = backend.record_argv(PERF_61, tmp_path / "p", Targets((1,)), None)
    assert "--snapshot" in argv and "--switch-output=signal" in argv
    old = PerfTool("/usr/bin/perf", (5, 3, 0), "perf version 5.3")
    backend_old, warnings = IntelPtBackend().prepare(dataclasses.replace(caps, perf=old))
    assert "--snapshot" in backend_old.record_argv(old, tmp_path / "p", Targets((1,)), None)
    assert backend_old.needs_snapshot_before_stop(old)
    assert any("--snapshot=e" in w for w in warnings)


def test_older_cpu_drops_cycle_timing_with_a_warning(tmp_path: Path) -> None:
    sys_root, proc_root = intel_machine(tmp_path, psb_cyc=False)
    caps = probe(sys_root=sys_root, proc_root=proc_root, perf=PERF_61)
    backend, warnings = IntelPtBackend().prepare(caps)
    assert backend.timer.name == "low"
    assert any("~1 us" in w for w in warnings)


def test_kernel_tracing_refused_without_privileges(tmp_path: Path) -> None:
    sys_root, proc_root = intel_machine(tmp_path, paranoid=2)
    caps = probe(sys_root=sys_root, proc_root=proc_root, perf=PERF_61)
    user = dataclasses.replace(caps, euid=1000, effective_caps=0)
    with pytest.raises(RecordingError, match="need root") as err:
        IntelPtBackend(scope=TraceScope.BOTH).prepare(user)
    assert err.value.hint and "perf_event_paranoid=1" in err.value.hint
    root = dataclasses.replace(caps, euid=0)
    backend, _ = IntelPtBackend(scope=TraceScope.BOTH).prepare(root)
    assert "--kcore" in backend.record_argv(PERF_61, tmp_path / "p", Targets((1,)), None)
    # paranoid 1 allows kernel tracing to a user, but kcore stays root-only.
    lowered = dataclasses.replace(user, paranoid=1)
    backend, _ = IntelPtBackend(scope=TraceScope.KERNEL).prepare(lowered)
    assert "--kcore" not in backend.record_argv(PERF_61, tmp_path / "p", Targets((1,)), None)


def test_multi_snapshot_needs_a_trigger_and_snapshot_mode(tmp_path: Path) -> None:
    sys_root, proc_root = intel_machine(tmp_path)
    caps = probe(sys_root=sys_root, proc_root=proc_root, perf=PERF_61)
    with pytest.raises(UsageError):
        IntelPtBackend(multi_snapshot=True).prepare(caps)
    with pytest.raises(UsageError):
        IntelPtBackend(multi_snapshot=True, full_execution=True, has_trigger=True).prepare(caps)


def test_this_machine_refuses_intel_pt_clearly() -> None:
    caps = probe(perf=find_perf())
    if caps.intel_pt.present:
        pytest.skip("this machine has Intel PT")
    with pytest.raises(RecordingError, match="no Intel PT on this machine") as err:
        IntelPtBackend().prepare(caps)
    assert err.value.hint is not None and "--backend emulated" in err.value.hint


def test_missing_perf_is_a_tool_error(tmp_path: Path) -> None:
    caps = dataclasses.replace(probe(perf=find_perf()), perf=None, perf_problem="perf not found")
    with pytest.raises(ToolMissingError) as err:
        doctor.require(caps, "sampling")
    assert err.value.hint == doctor.INSTALL_PERF
    findings = {f.topic: f for f in doctor.diagnose(caps)}
    assert findings["perf"].status is doctor.Status.MISSING
    assert findings["perf"].fix == doctor.INSTALL_PERF


def test_paranoid_3_refuses_users(tmp_path: Path) -> None:
    caps = dataclasses.replace(probe(perf=find_perf()), euid=1000, effective_caps=0, paranoid=3)
    with pytest.raises(RecordingError, match="perf_event_paranoid is 3"):
        doctor.require(caps, "sampling")


def test_doctor_on_this_machine_matches_the_system() -> None:
    """Each finding agrees with an independent look at the same files and tools."""
    caps = probe(perf=find_perf())
    findings = {f.topic: f for f in doctor.diagnose(caps)}
    has_pt = Path("/sys/bus/event_source/devices/intel_pt").exists()
    assert (findings["intel_pt"].status is doctor.Status.MISSING) is not has_pt
    if not has_pt:
        assert findings["intel_pt"].fix and "--backend sampling" in findings["intel_pt"].fix
    assert findings["qemu"].status is (
        doctor.Status.OK if os.path.exists("/usr/bin/qemu-x86_64") else doctor.Status.MISSING
    )
    paranoid = int(Path("/proc/sys/kernel/perf_event_paranoid").read_text())
    assert str(paranoid) in findings["perf_event_paranoid"].detail
    assert caps.perf is not None
    version = ".".join(map(str, caps.perf.version))
    assert version in findings["perf"].detail
    text = doctor.render(list(findings.values()))
    assert len(text.splitlines()) >= len(findings)


def test_doctor_names_the_fix_for_each_gap() -> None:
    caps = dataclasses.replace(
        probe(perf=find_perf()),
        euid=1000,
        effective_caps=0,
        paranoid=2,
        kptr_restrict=2,
        qemu=None,
        dlfilter_built=False,
        ptrace_scope=3,
    )
    fixes = {f.topic: f.fix for f in doctor.diagnose(caps)}
    assert (
        fixes["perf_event_paranoid"]
        and "kernel.perf_event_paranoid=1" in fixes["perf_event_paranoid"]
    )
    assert fixes["kptr_restrict"] == doctor.KPTR
    assert fixes["qemu"] == doctor.INSTALL_QEMU
    assert fixes["dlfilter"] == doctor.BUILD_DLFILTER
    assert fixes["ptrace"] == doctor.PTRACE_SCOPE


def test_sampling_callgraph_choice() -> None:
    base = probe(perf=find_perf())
    lbr = dataclasses.replace(base, lbr=True, hardware_events=True)
    assert choose_callgraph(lbr, {})[0].value == "lbr"
    plain = dataclasses.replace(base, lbr=False)
    assert choose_callgraph(plain, {"libunwind": True})[0].value == "dwarf"
    assert (
        choose_callgraph(plain, {"libunwind": False, "libdw-dwarf-unwind": False})[0].value == "fp"
    )
    with pytest.raises(RecordingError, match="no last-branch records"):
        from ptscope.record.perf_commands import CallgraphMode

        SamplingBackend(callgraph=CallgraphMode.LBR).prepare(plain)


def test_sampling_on_this_vm_uses_cpu_clock_when_no_counters() -> None:
    caps: Capabilities = probe(perf=find_perf())
    backend, _ = SamplingBackend().prepare(caps)
    assert backend.hardware_events is caps.hardware_events
    argv = backend.record_argv(caps.perf, Path("/x/perf.data"), Targets((1,)), None)  # type: ignore[arg-type]
    event = "cycles" if caps.hardware_events else "cpu-clock"
    assert f"--event={event}:u" in argv
