"""The emulated clock: how many cycles each instruction and system call takes, and TSC ↔ perf time.

QEMU does not tell how long anything took, so time in an emulated recording is a model:

* every instruction costs ``cycles_per_insn`` core cycles (default 1);
* the core runs at the TSC frequency (the CBR packet says ``tsc_hz / 100 MHz`` and perf is
  told the same maximum non-turbo ratio), so one cycle is one TSC tick;
* a system call costs ``syscall_cycles`` (tracing is off inside the kernel, as on real
  user-only Intel PT, so this is the length of the gap perf shows between ``tr end syscall``
  and ``tr strt``); on return a thread's clock also catches up with the latest clock of any
  thread of the process (see ``docs/emulated-pt.md``: waiting in ``futex`` looks like waiting);
* perf time is ``tsc * time_mult >> time_shift`` nanoseconds (default: TSC / 2, a 2 GHz TSC),
  starting at ``start_tsc``.

The default model makes durations instruction-exact and the whole recording deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_CYCLE_MODEL", "CycleModel"]

_BUS_HZ: Final = 100_000_000  # CBR and the non-turbo ratio count in units of 100 MHz


@dataclass(frozen=True)
class CycleModel:
    """A documented cost model that turns instruction counts into TSC ticks and perf time."""

    cycles_per_insn: int = 1
    syscall_cycles: int = 100
    tsc_hz: int = 2_000_000_000
    start_tsc: int = 2_000_000_000
    """TSC at the first traced instruction (default: perf time 1.000000000 s)."""
    time_shift: int = 31
    cyc_threshold: int = 1
    """A CYC packet is written before a packet once this many cycles passed since the last
    one; 1 times every branch exactly, larger values let TNT packets collect more bits."""

    def __post_init__(self) -> None:
        if self.cycles_per_insn < 1 or self.syscall_cycles < 0 or self.cyc_threshold < 1:
            raise ValueError("cycle model costs must be positive")
        if self.tsc_hz % _BUS_HZ or not 1 <= self.tsc_hz // _BUS_HZ <= 255:
            raise ValueError("tsc_hz must be a multiple of 100 MHz between 100 MHz and 25.5 GHz")
        if not 0 < self.time_mult < 1 << 32:
            raise ValueError("tsc_hz and time_shift give a time_mult that does not fit 32 bits")

    @property
    def ratio(self) -> int:
        """Core-to-bus ratio (CBR packet payload and perf's ``max_non_turbo_ratio``)."""
        return self.tsc_hz // _BUS_HZ

    @property
    def time_mult(self) -> int:
        """perf's ``time_mult``: ``ns = tsc * time_mult >> time_shift``."""
        return (1_000_000_000 << self.time_shift) // self.tsc_hz

    def tsc_to_ns(self, tsc: int) -> int:
        """perf time (ns) of a TSC value, exactly as perf computes it with ``time_zero = 0``."""
        shift, mult = self.time_shift, self.time_mult
        quot, rem = tsc >> shift, tsc & ((1 << shift) - 1)
        return quot * mult + ((rem * mult) >> shift)

    def insn_cycles(self, n: int) -> int:
        """Cycles (= TSC ticks) taken by ``n`` instructions."""
        return n * self.cycles_per_insn


DEFAULT_CYCLE_MODEL: Final = CycleModel()
