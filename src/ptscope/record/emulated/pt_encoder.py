"""Encode one thread's control flow as an Intel PT packet stream that perf's decoder accepts.

The caller reports what the thread did, branch by branch (``cond``, ``call``, ``ret``, ...),
after charging the instructions executed since the previous branch with :meth:`advance`.
The encoder writes exactly the packets user-only Intel PT would have written, following the
rules perf's decoder relies on (``docs/emulated-pt.md`` has the full list):

* PSB+ (PSB, TSC, CBR, MODE.Exec, [FUP], PSBEND) at the start and every ``psb_period``
  bytes; last IP and the return stack are reset there, as perf's decoder resets them;
* short TNT packets (oldest bit first), flushed before any other packet;
* TIP / TIP.PGE / TIP.PGD / FUP with last-IP compression;
* return compression: a ``ret`` whose target is the top of a 64-deep call stack is one TNT
  bit, else a TIP; the stack is popped on every ``ret``; ``call +0`` is never pushed;
* a system call is TIP.PGD with the IP suppressed, the return TSC, MODE.Exec, TIP.PGE;
* an asynchronous interruption (a signal) is FUP(interrupted IP) + TIP.PGD;
* CYC packets (cycles since the previous CYC) before TNT, TIP, FUP and TIP.PGD packets,
  and right before every TSC (perf re-bases cycle-counted time only on a CYC+TSC pair).

Time is kept in TSC ticks (one cycle is one tick, see :mod:`.cycle_model`).
"""

from __future__ import annotations

from typing import Final

from ptscope.record.emulated.cycle_model import CycleModel

__all__ = ["PtEncoder"]

_PSB: Final = b"\x02\x82" * 8
_PSBEND: Final = b"\x02\x23"
_MODE_EXEC_64: Final = b"\x99\x01"
_TIP: Final = 0x0D
_TIP_PGE: Final = 0x11
_TIP_PGD: Final = 0x01
_FUP: Final = 0x1D
_RET_STACK_DEPTH: Final = 64
_TNT_MAX_BITS: Final = 6
_MASK48: Final = (1 << 48) - 1


class PtEncoder:
    """The packet stream of one thread (one AUXTRACE queue)."""

    def __init__(self, model: CycleModel, *, psb_period: int = 4096) -> None:
        self.model = model
        self.psb_period = psb_period
        self.out = bytearray()
        self.flushed = 0
        """Bytes already taken out with :meth:`take` (the stream offset of ``out[0]``)."""
        self.now = 0
        """Current time in TSC ticks (= cycles)."""
        self._last_timing = 0
        self._last_ip = 0
        self._tnt_bits = 0
        self._tnt_n = 0
        self._stack: list[int] = []
        self._next_psb = psb_period
        self.enabled = False
        self._cyc_threshold = model.cyc_threshold
        self._ratio = model.ratio

    # -- low-level packets -------------------------------------------------------------

    def _flush_tnt(self) -> None:
        n = self._tnt_n
        if n:
            self.out.append((1 << (n + 1)) | (self._tnt_bits << 1))
            self._tnt_n = 0
            self._tnt_bits = 0

    def _cyc(self, force: bool = False) -> None:
        elapsed = self.now - self._last_timing
        if elapsed >= self._cyc_threshold or force:
            self._flush_tnt()
            out = self.out
            self._last_timing = self.now
            first = ((elapsed & 0x1F) << 3) | 0x03
            elapsed >>= 5
            if not elapsed:
                out.append(first)
                return
            out.append(first | 0x04)
            while True:
                more = elapsed >> 7
                out.append(((elapsed & 0x7F) << 1) | (1 if more else 0))
                if not more:
                    return
                elapsed = more

    def _ip_packet(self, opcode: int, ip: int) -> None:
        last = self._last_ip
        out = self.out
        if (ip ^ last) >> 16 == 0:
            out.append(0x20 | opcode)
            out += (ip & 0xFFFF).to_bytes(2, "little")
        elif (ip ^ last) >> 32 == 0:
            out.append(0x40 | opcode)
            out += (ip & 0xFFFFFFFF).to_bytes(4, "little")
        elif (ip ^ last) >> 48 == 0:
            out.append(0x80 | opcode)
            out += (ip & _MASK48).to_bytes(6, "little")
        elif ip < 1 << 47 or ip >> 47 == (1 << 17) - 1:
            out.append(0x60 | opcode)  # sign-extended 48-bit
            out += (ip & _MASK48).to_bytes(6, "little")
        else:
            out.append(0xC0 | opcode)
            out += ip.to_bytes(8, "little")
        self._last_ip = ip

    def _tsc(self) -> None:
        # perf re-bases its cycle-counted time on a TSC only when a CYC comes right before
        # it; the CYC also carries the cycles spent since the last one (e.g. in the kernel).
        self._cyc(force=True)
        self.out.append(0x19)
        self.out += (self.model.start_tsc + self.now).to_bytes(7, "little")
        self._last_timing = self.now

    def _psb(self, ip: int | None) -> None:
        self._flush_tnt()
        out = self.out
        out += _PSB
        self._tsc()
        out += bytes((0x02, 0x03, self._ratio, 0x00))
        out += _MODE_EXEC_64
        # perf's decoder forgets the last IP and its return stack at every PSB.
        self._last_ip = 0
        self._stack.clear()
        if ip is not None:
            self._ip_packet(_FUP, ip)
        out += _PSBEND
        self._next_psb = self.flushed + len(out) + self.psb_period

    # -- what the thread did -------------------------------------------------------------

    def advance(self, cycles: int) -> None:
        """Charge ``cycles`` to the thread (instructions executed since the last report)."""
        self.now += cycles

    def start(self, ip: int) -> None:
        """Tracing starts (or resumes after a system call or a stop) at ``ip``."""
        if not self.out and not self.flushed:
            self._psb(None)
        else:
            self._flush_tnt()
            self._tsc()
        self.out += _MODE_EXEC_64
        self._ip_packet(_TIP_PGE, ip)
        self.enabled = True

    def request_psb(self) -> None:
        """Make the next :meth:`maybe_psb` write a PSB+ (a point to resynchronise at)."""
        self._next_psb = self.flushed + len(self.out)

    def maybe_psb(self, ip: int) -> None:
        """Write a periodic PSB+ if due; ``ip`` is the next instruction to execute."""
        if self.flushed + len(self.out) >= self._next_psb and self.enabled:
            self._psb(ip)

    def cond(self, taken: bool) -> None:
        self._cyc()
        self._tnt_bits = (self._tnt_bits << 1) | taken
        self._tnt_n += 1
        if self._tnt_n == _TNT_MAX_BITS:
            self._flush_tnt()

    def call(self, return_address: int) -> None:
        """A direct call (no packet); ``return_address`` is pushed for return compression."""
        stack = self._stack
        stack.append(return_address)
        if len(stack) > _RET_STACK_DEPTH:
            del stack[0]

    def indirect(self, target: int) -> None:
        """An indirect jump or call (push separately with :meth:`call`) to ``target``."""
        self._cyc()
        self._flush_tnt()
        self._ip_packet(_TIP, target)

    def ret(self, target: int) -> None:
        stack = self._stack
        if stack and stack.pop() == target:
            self.cond(True)
        else:
            self.indirect(target)

    def disable(self) -> None:
        """Tracing stops at a branch into the kernel (system call): TIP.PGD, IP suppressed."""
        self._cyc()
        self._flush_tnt()
        self.out.append(_TIP_PGD)
        self.enabled = False

    def interrupt(self, ip: int) -> None:
        """Asynchronous exit to the kernel before executing ``ip``: FUP(ip) + TIP.PGD."""
        self._cyc()
        self._flush_tnt()
        self._ip_packet(_FUP, ip)
        self.out.append(_TIP_PGD)
        self.enabled = False

    def checkpoint(self) -> tuple[int, ...]:
        """The encoder's state, to :meth:`restore` if what follows turns out not to happen."""
        return (
            self.flushed,
            len(self.out),
            self.now,
            self._last_timing,
            self._tnt_bits,
            self._tnt_n,
            int(self.enabled),
            self._last_ip,
        )

    def restore(self, state: tuple[int, ...]) -> None:
        """Go back to a :meth:`checkpoint` (only if no bytes were taken out since)."""
        flushed, size, now, last_timing, bits, n, enabled, last_ip = state
        if flushed != self.flushed:
            return
        del self.out[size:]
        self.now, self._last_timing = now, last_timing
        self._tnt_bits, self._tnt_n = bits, n
        self.enabled, self._last_ip = bool(enabled), last_ip

    def take(self) -> bytes:
        """Remove and return the bytes written so far (pending TNT bits stay pending)."""
        data = bytes(self.out)
        self.flushed += len(data)
        self.out.clear()
        return data

    def finish(self) -> bytes:
        """Flush pending TNT bits and return the rest of the stream."""
        self._flush_tnt()
        return self.take()
