"""The sampling backend: ``perf record -g`` with the best call-graph method and sampling
event this machine supports (for long runs on any CPU, VMs included)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from ptscope.perftool import PerfTool
from ptscope.record import doctor
from ptscope.record.capabilities import Capabilities, probe_perf_build_options
from ptscope.record.perf_commands import (
    DEFAULT_SAMPLING_FREQUENCY,
    NORMAL_TIMER,
    CallgraphMode,
    Control,
    SamplingRecordOptions,
    Targets,
    TimerResolution,
    TraceScope,
    sampling_record_argv,
)

__all__ = ["SamplingBackend", "choose_callgraph"]

log = logging.getLogger(__name__)


def choose_callgraph(
    caps: Capabilities, build_options: dict[str, bool]
) -> tuple[CallgraphMode, str]:
    """LBR where the CPU has it (cheap, exact), else DWARF unwinding when perf can do it
    (works without frame pointers), else frame pointers. Returns (mode, why)."""
    if caps.lbr and caps.hardware_events:
        return CallgraphMode.LBR, "the CPU records last branches (LBR)"
    dwarf = build_options.get("libunwind", False) or build_options.get("libdw-dwarf-unwind", False)
    if dwarf or not build_options:
        return CallgraphMode.DWARF, "no LBR here; perf unwinds stacks with DWARF"
    return CallgraphMode.FP, "no LBR and perf cannot unwind DWARF: frame pointers"


@dataclass(frozen=True)
class SamplingBackend:
    """Stack sampling choices. ``callgraph=None`` means "choose from the machine"."""

    scope: TraceScope = TraceScope.USER
    timer: TimerResolution = NORMAL_TIMER
    callgraph: CallgraphMode | None = None
    frequency: int | None = None
    hardware_events: bool = False

    name = "sampling"
    takes_snapshots = False

    def prepare(self, caps: Capabilities) -> tuple[SamplingBackend, list[str]]:
        doctor.require(caps, "sampling", kernel=self.scope.includes_kernel)
        warnings: list[str] = []
        callgraph = self.callgraph
        if callgraph is None:
            assert caps.perf is not None
            callgraph, why = choose_callgraph(caps, probe_perf_build_options(caps.perf))
            log.info("call graphs: %s (%s)", callgraph.value, why)
        elif callgraph is CallgraphMode.LBR and not (caps.lbr and caps.hardware_events):
            raise doctor.refusal(
                "--callgraph lbr: this CPU has no last-branch records",
                hint="use --callgraph dwarf or --callgraph fp",
            )
        frequency = self.frequency
        if frequency is None:
            frequency = self.timer.sampling_frequency(
                caps.max_sample_rate or DEFAULT_SAMPLING_FREQUENCY
            )
        if caps.max_sample_rate and frequency > caps.max_sample_rate:
            warnings.append(
                f"sampling at {frequency} Hz is above this machine's maximum "
                f"({caps.max_sample_rate} Hz, kernel.perf_event_max_sample_rate): using it"
            )
            frequency = caps.max_sample_rate
        if not caps.hardware_events:
            log.info("no hardware counters here (a VM?): sampling on the cpu-clock timer")
        return (
            replace(
                self,
                callgraph=callgraph,
                frequency=frequency,
                hardware_events=caps.hardware_events,
            ),
            warnings,
        )

    def record_argv(
        self, perf: PerfTool, output: Path, targets: Targets, control: Control | None
    ) -> list[str]:
        opts = SamplingRecordOptions(
            output=output,
            targets=targets,
            callgraph=self.callgraph or CallgraphMode.DWARF,
            hardware_events=self.hardware_events,
            frequency=self.frequency or DEFAULT_SAMPLING_FREQUENCY,
            scope=self.scope,
            control=control,
        )
        return sampling_record_argv(perf.path, opts)

    def needs_snapshot_before_stop(self, perf: PerfTool) -> bool:
        return False

    def describe(self) -> dict[str, object]:
        return {
            "scope": self.scope.label,
            "callgraph": self.callgraph.value if self.callgraph else None,
            "frequency": self.frequency,
            "event": "cycles" if self.hardware_events else "cpu-clock",
        }
