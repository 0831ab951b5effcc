"""CallPicker, the drill-down's choice of one call out of perf's instruction listing: it
stops as soon as nothing later can change its answer, which is what lets a drill arg name
the call's start time alone (perf then decodes from there to the end of the recording)."""

from __future__ import annotations

from ptscope.decode.instructions import CallPicker, Instruction


def _insn(time: int, ip: int, function: str, *, call: bool = False) -> Instruction:
    return Instruction(time, ip, f"{function}+0x0", b"", "", function=function, is_call=call)


def _fed(picker: CallPicker, listing: list[Instruction]) -> list[int]:
    """The ips the picker took, fed one instruction at a time, and how many it saw."""
    seen = 0
    for insn in listing:
        if picker.done:
            break
        picker.feed([insn])
        seen += 1
    return [seen, *(i.ip for i in picker.instructions())]


# f calls g twice at time 10 (from 0x10), then time moves on.
LISTING = [
    _insn(10, 0x10, "f", call=True),
    _insn(10, 0x100, "g"),
    _insn(10, 0x101, "g"),
    _insn(10, 0x11, "f"),
    _insn(10, 0x10, "f", call=True),
    _insn(10, 0x100, "g"),
    _insn(10, 0x101, "g"),
    _insn(20, 0x12, "f"),
    _insn(20, 0x13, "f"),
    _insn(30, 0x14, "f"),
]


def test_the_kth_call_at_the_time_and_no_further() -> None:
    picker = CallPicker(0x10, 2, 10, 2)
    assert _fed(picker, LISTING) == [7, 0x100, 0x101]
    assert picker.found and picker.complete and not picker.passed


def test_an_anchor_not_there_is_known_once_the_thread_passes_its_time() -> None:
    picker = CallPicker(0x10, 3, 10, 2)  # a third call at time 10: there is none
    assert _fed(picker, LISTING) == [8]  # stopped at the first instruction dated 20
    assert picker.passed and not picker.found


def test_a_jump_out_at_the_time_counts_even_if_its_target_is_dated_later() -> None:
    listing = [_insn(10, 0x20, "f"), _insn(20, 0x200, "h"), _insn(20, 0x201, "h")]
    picker = CallPicker(0x20, 1, 10, 2)
    assert _fed(picker, listing) == [3, 0x200, 0x201]
    assert picker.complete


def test_a_call_cut_short_waits_for_the_end() -> None:
    picker = CallPicker(0x10, 2, 10, 100)
    assert _fed(picker, LISTING) == [len(LISTING), 0x100, 0x101, 0x12, 0x13, 0x14]
    assert picker.found and not picker.complete and not picker.done
