"""The Intel PT backend: which ``perf record`` to run and what to refuse, from the options
and the machine's capabilities."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from ptscope.errors import RecordingError, UsageError
from ptscope.perftool import PerfTool
from ptscope.record import doctor
from ptscope.record.capabilities import Capabilities
from ptscope.record.perf_commands import (
    NORMAL_TIMER,
    Control,
    IntelPtRecordOptions,
    SnapshotMode,
    SnapshotSize,
    Targets,
    TimerResolution,
    TraceScope,
    intel_pt_record_argv,
    parse_timer_resolution,
)

__all__ = ["IntelPtBackend"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IntelPtBackend:
    """Intel PT recording choices (what ``run``/``attach`` options mean for perf)."""

    scope: TraceScope = TraceScope.USER
    timer: TimerResolution = NORMAL_TIMER
    snapshot_size: SnapshotSize | None = None
    full_execution: bool = False
    multi_snapshot: bool = False
    kcore: bool = True
    has_trigger: bool = False

    name = "intel-pt"
    takes_snapshots = True

    def snapshot_mode(self, perf: PerfTool) -> SnapshotMode:
        if self.full_execution:
            return SnapshotMode.FULL
        if self.has_trigger:
            # A function trigger decides when to snapshot: no extra one at exit.
            return SnapshotMode.ON_REQUEST
        return SnapshotMode.AT_EXIT if perf.has_snapshot_on_exit else SnapshotMode.ON_REQUEST

    def needs_snapshot_before_stop(self, perf: PerfTool) -> bool:
        """perf < 5.4 has no ``--snapshot=e``: ptscope asks for the exit snapshot itself."""
        return self.snapshot_mode(perf) is SnapshotMode.ON_REQUEST and not self.has_trigger

    def prepare(self, caps: Capabilities) -> tuple[IntelPtBackend, list[str]]:
        """Refuse what cannot work here; adapt what can (returned with warnings)."""
        doctor.require(caps, "intel-pt", kernel=self.scope.includes_kernel)
        warnings: list[str] = []
        backend = self
        if self.timer.uses_cyc and not caps.intel_pt.psb_cyc:
            warnings.append(
                "this CPU has no cycle-accurate Intel PT timing (older generation): "
                "using --timer-resolution low, timing granularity will be ~1 us"
            )
            backend = _replace(backend, timer=parse_timer_resolution("low"))
        if self.multi_snapshot and self.full_execution:
            raise UsageError("--multi-snapshot and --full-execution cannot be combined")
        if self.multi_snapshot and not self.has_trigger:
            raise UsageError("--multi-snapshot needs --trigger (one snapshot per hit)")
        if self.scope.includes_kernel:
            if not caps.perf_at_least(5, 5):
                warnings.append("perf < 5.5 cannot copy kcore: kernel decoding may be unreliable")
                backend = _replace(backend, kcore=False)
            elif not caps.can_read_kcore:
                backend = _replace(backend, kcore=False)
        else:
            backend = _replace(backend, kcore=False)
        perf = caps.perf
        if perf is not None and not perf.has_snapshot_on_exit and not self.full_execution:
            warnings.append(
                f"perf {perf.version_text} has no --snapshot=e: the snapshot is taken "
                "when ptscope stops perf"
            )
        return backend, warnings

    def record_argv(
        self, perf: PerfTool, output: Path, targets: Targets, control: Control | None
    ) -> list[str]:
        if not perf.has_snapshot_on_exit and self.multi_snapshot:
            raise RecordingError("--multi-snapshot needs perf >= 5.4")
        opts = IntelPtRecordOptions(
            output=output,
            targets=targets,
            scope=self.scope,
            timer=self.timer,
            snapshot=self.snapshot_mode(perf),
            snapshot_size=self.snapshot_size,
            multi_snapshot=self.multi_snapshot,
            control=control,
            kcore=self.kcore and self.scope.includes_kernel,
        )
        return intel_pt_record_argv(perf.path, opts)

    def describe(self) -> dict[str, object]:
        return {
            "scope": self.scope.label,
            "timer_resolution": self.timer.name,
            "pt_config": self.timer.pt_config(),
            "snapshot_size": self.snapshot_size.bytes if self.snapshot_size else None,
            "full_execution": self.full_execution,
            "multi_snapshot": self.multi_snapshot,
            "kcore": self.kcore,
        }


def _replace(backend: IntelPtBackend, **changes: object) -> IntelPtBackend:
    from dataclasses import replace

    return replace(backend, **changes)  # type: ignore[arg-type]
