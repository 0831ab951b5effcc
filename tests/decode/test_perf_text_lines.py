"""The text parser on every line shape perf 5.x-6.x prints, written by hand in perf's layout."""

from __future__ import annotations

import pytest

from ptscope.decode.perf_text import (
    MAX_EXAMPLES,
    PerfTextParser,
    parse_error_line,
    parse_flags,
    parse_lines,
)
from ptscope.model import (
    NOWHERE,
    UNKNOWN_SYMBOL,
    BranchEvent,
    BranchFlags,
    BranchKind,
    CommEvent,
    DecodeError,
    Event,
    Location,
    PowerEvent,
    StackSample,
    TraceState,
)

K, S = BranchKind, TraceState
HEAD = "  1234/1234  12345.678901234:          1  branches:uH:"
T = 12345_678901234
MAIN = "401136 main+0x26 (/tmp/a.out)"
F = "401106 f+0x0 (/tmp/a.out)"
MAIN_LOC = Location(0x401136, "main", 0x26, "/tmp/a.out")
F_LOC = Location(0x401106, "f", 0, "/tmp/a.out")


def branch(flags: str, src: str = MAIN, dst: str = F, head: str = HEAD) -> str:
    return f"{head}   {flags:<21}  {src:>40} =>  {dst:>40}"


def parse_one(line: str, *, keep_all: bool = True) -> Event:
    events, stats = parse_lines([line], keep_all=keep_all)
    assert stats.unknown_lines == 0, stats.unknown_examples
    assert len(events) == 1, events
    return events[0]


def parse_branch(line: str) -> BranchEvent:
    event = parse_one(line)
    assert isinstance(event, BranchEvent)
    return event


# ------------------------------------------------------------------- branch kinds


@pytest.mark.parametrize(
    ("flags", "kind", "state"),
    [
        ("call", K.CALL, S.NONE),
        ("return", K.RETURN, S.NONE),
        ("jmp", K.JUMP, S.NONE),
        ("jcc", K.CONDITIONAL_JUMP, S.NONE),
        ("syscall", K.SYSCALL, S.NONE),
        ("sysret", K.SYSRET, S.NONE),
        ("hw int", K.HARDWARE_INTERRUPT, S.NONE),
        ("int", K.SOFTWARE_INTERRUPT, S.NONE),
        ("iret", K.IRET, S.NONE),
        ("async", K.ASYNC, S.NONE),
        ("tx abrt", K.TX_ABORT, S.NONE),
        ("vmentry", K.VMENTRY, S.NONE),
        ("vmexit", K.VMEXIT, S.NONE),
        ("tr strt", K.JUMP, S.START),
        ("tr end", K.JUMP, S.END),
        ("tr strt jmp", K.JUMP, S.START),  # perf >= 6.x spells the jump out
        ("tr end  jmp", K.JUMP, S.END),
        ("tr end  async", K.ASYNC, S.END),
        ("tr strt tr end", K.NONE, S.NONE),
        ("tr end  call", K.CALL, S.END),
        ("tr end  return", K.RETURN, S.END),
        ("tr end  syscall", K.SYSCALL, S.END),
        ("tr end  sysret", K.SYSRET, S.END),
        ("tr end  iret", K.IRET, S.END),
        ("tr end  hw int", K.HARDWARE_INTERRUPT, S.END),
        ("tr strt call", K.CALL, S.START),
        ("bcBE", K.NONE, S.NONE),  # a combination perf has no name for: letters
        ("bcsB", K.SYSCALL, S.START),
        ("raw flags:0x3", K.CALL, S.NONE),
        ("", K.NONE, S.NONE),  # no flags at all: 21 spaces
    ],
)
def test_branch_kinds(flags: str, kind: BranchKind, state: TraceState) -> None:
    event = parse_branch(branch(flags))
    assert (event.kind, event.state, event.in_tx) == (kind, state, False)
    assert (event.pid, event.tid, event.time) == (1234, 1234, T)
    assert event.src == MAIN_LOC
    assert event.dst == F_LOC


@pytest.mark.parametrize(
    ("flags", "kind", "state"),
    [
        ("jcc                 (x)", K.CONDITIONAL_JUMP, S.NONE),  # perf 6.1: "%-15s%6s"
        ("call              (xD)", K.CALL, S.NONE),
        ("tr end  return     (x)", K.RETURN, S.END),
        ("tr strt jmp (x)", K.JUMP, S.START),  # newer perf: one space before the suffix
        ("bryx", K.ASYNC, S.NONE),  # letters form carries x itself
    ],
)
def test_in_transaction_flag(flags: str, kind: BranchKind, state: TraceState) -> None:
    event = parse_branch(branch(flags))
    assert (event.kind, event.state, event.in_tx) == (kind, state, True)


def test_interrupt_state_suffix_without_transaction() -> None:
    event = parse_branch(branch("jmp                 (Dt)"))
    assert (event.kind, event.in_tx) == (K.JUMP, False)
    assert parse_flags("jmp   (Dt)") == (
        BranchFlags.BRANCH | BranchFlags.INTR_DISABLE | BranchFlags.INTR_TOGGLE,
        True,
    )


def test_unknown_flag_words_keep_the_line_and_are_reported() -> None:
    events, stats = parse_lines([branch("call frobnicated"), branch("call frobnicated")])
    assert [e.kind for e in events if isinstance(e, BranchEvent)] == [K.CALL, K.CALL]
    assert stats.unknown_lines == 0
    assert stats.unknown_flags == ["call frobnicated"]
    assert "frobnicated" in stats.summary()


def test_trace_start_and_end_use_nowhere() -> None:
    start = parse_branch(branch("tr strt", src="0 [unknown] ([unknown])"))
    end = parse_branch(branch("tr end  syscall", dst="0 [unknown] ([unknown])"))
    assert start.src is NOWHERE and start.state is S.START
    assert end.dst is NOWHERE and end.kind is K.SYSCALL and end.state is S.END


# -------------------------------------------------------------------- symbols


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "7f0a1234 std::vector<int, std::allocator<int> >::push_back(int const&)+0x1f "
            "(/usr/lib/libfoo.so)",
            Location(
                0x7F0A1234,
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
                0x1F,
                "/usr/lib/libfoo.so",
            ),
        ),
        (
            "401000 operator+(Vec const&, Vec const&)+0x8 (/tmp/a.out)",
            Location(0x401000, "operator+(Vec const&, Vec const&)", 8, "/tmp/a.out"),
        ),
        (
            "401000 a => b+0x8 (/tmp/a.out)",
            Location(0x401000, "a => b", 8, "/tmp/a.out"),
        ),
        (
            "401000 (anonymous namespace)::run() [clone .isra.0]+0x8 (/tmp/a.out)",
            Location(0x401000, "(anonymous namespace)::run() [clone .isra.0]", 8, "/tmp/a.out"),
        ),
        (
            "401000 main+0x8 (/home/me/my project (copy)/a.out)",
            Location(0x401000, "main", 8, "/home/me/my project (copy)/a.out"),
        ),
        (
            "401000 main+0x8 (/tmp/unbalanced(dir/a.out)",
            Location(0x401000, "main", 8, "/tmp/unbalanced(dir/a.out"),
        ),
        (
            "ffffffff81000130 entry_SYSCALL_64_after_hwframe+0x76 ([kernel.kallsyms])",
            Location(
                0xFFFFFFFF81000130, "entry_SYSCALL_64_after_hwframe", 0x76, "[kernel.kallsyms]"
            ),
        ),
        (
            "7f34572728a8 [unknown] (/usr/lib/libc.so.6)",
            Location(0x7F34572728A8, UNKNOWN_SYMBOL, -1, "/usr/lib/libc.so.6"),
        ),
        (
            "7f34572728a8 [unknown] ([unknown])",
            Location(0x7F34572728A8, UNKNOWN_SYMBOL, -1, "[unknown]"),
        ),
        (
            # perf's map-relative offset past a symbol's end: truncated to 32 bits, as
            # perf hands it to a dlfilter.
            "401030 memcpy@plt+0xffffffffff22f000 (/tmp/a.out)",
            Location(0x401030, "memcpy@plt", 0xFF22F000, "/tmp/a.out"),
        ),
        (
            "401030 f+0x10+0x4 (/tmp/a.out)",  # a symbol that itself ends in +0x...
            Location(0x401030, "f+0x10", 4, "/tmp/a.out"),
        ),
    ],
)
def test_symbols_and_dsos(text: str, expected: Location) -> None:
    as_source = parse_branch(branch("call", src=text))
    as_target = parse_branch(branch("call", dst=text))
    assert as_source.src == expected
    assert as_target.dst == expected
    assert as_source.src.function == expected.function


def test_symbol_with_arrow_in_both_source_and_target() -> None:
    src = "401000 x => y::operator()+0x4 (/tmp/a b.out)"
    dst = "402000 lambda => z+0x0 (/tmp/a b.out)"
    event = parse_branch(branch("call", src=src, dst=dst))
    assert event.src == Location(0x401000, "x => y::operator()", 4, "/tmp/a b.out")
    assert event.dst == Location(0x402000, "lambda => z", 0, "/tmp/a b.out")


def test_unknown_symbols_are_grouped_per_dso() -> None:
    event = parse_branch(
        branch(
            "jmp",
            src="7f0000001000 [unknown] (/lib/x.so)",
            dst="7f0000002000 [unknown] (/lib/x.so)",
        )
    )
    assert event.src.offset == -1 and event.src.function == "[unknown] (/lib/x.so)"
    assert event.src.function == event.dst.function


# ---------------------------------------------------------------- header fields


@pytest.mark.parametrize(
    ("head", "pid", "tid", "time"),
    [
        ("     0/0      12345.678901234:          1  branches:u:", 0, 0, T),
        ("  1234/1300   12345.678901234:          7  branches:uH:", 1234, 1300, T),
        ("  1234/1300   12345.678901234:          1  branches:k:", 1234, 1300, T),
        ("  1234/1300   12345.678901234:          1 intel_pt//u/branches:", 1234, 1300, T),
        ("    -1/-1     12345.678901234:          1  branches:uH:", -1, -1, T),
        # No pid/tid fields: unknown thread.
        ("12345.678901234:          1  branches:uH:", -1, -1, T),
        # One id only (-F pid or -F tid).
        ("  1234  12345.678901234:          1  branches:uH:", 1234, 1234, T),
        # No period field.
        ("  1234/1234  12345.678901234:  branches:uH:", 1234, 1234, T),
        # No --ns: microseconds.
        ("  1234/1234  12345.678901:          1  branches:uH:", 1234, 1234, 12345_678901000),
        ("  1234/1234      0.000000001:          1  branches:uH:", 1234, 1234, 1),
    ],
)
def test_header_fields(head: str, pid: int, tid: int, time: int) -> None:
    event = parse_branch(branch("call", head=head))
    assert (event.pid, event.tid, event.time, event.kind) == (pid, tid, time, K.CALL)
    assert event.src == MAIN_LOC and event.dst == F_LOC


# ------------------------------------------------------------ power, psb, errors


@pytest.mark.parametrize(
    ("line", "cbr", "freq"),
    [
        (
            "  1234/1234  12345.678901234:          0          cbr:                          "
            "cbr: 36 freq: 3600 MHz (100%)                  0           401136 main+0x26 "
            "(/tmp/a.out)",
            36,
            3600,
        ),
        (
            "  1234/1234  12345.678901234:          0          cbr:   syscall                "
            " cbr:  8 freq:  800 MHz ( 22%)                 0 ffffffff81000130 x+0x1 "
            "([kernel.kallsyms])",
            8,
            800,
        ),
        (
            "  1234/1234  12345.678901234:          0  cbr:  tr end   cbr: 45 freq: 4500 MHz",
            45,
            4500,
        ),
    ],
)
def test_cbr_lines(line: str, cbr: int, freq: int) -> None:
    assert parse_one(line) == PowerEvent(1234, 1234, T, cbr, freq)


def test_psb_lines_are_counted_without_events() -> None:
    line = (
        "  1234/1234  12345.678901234:          0          psb:                        "
        "psb offs: 0x4b0000                    0           401136 main+0x26 (/tmp/a.out)"
    )
    events, stats = parse_lines([line, line])
    assert events == [] and stats.psb == 2 and stats.unknown_lines == 0


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            " instruction trace error type 1 time 12345.678901234 cpu 3 pid 1234 tid 1235 "
            "ip 0x401136 code 6: Trace doesn't match instruction",
            DecodeError(1234, 1235, T, 0x401136, "Trace doesn't match instruction", 6),
        ),
        (  # perf < 4.16: no time field
            " instruction trace error type 1 cpu 3 pid 1234 tid 1234 ip 0x401136 code 5: "
            "Lost trace data",
            DecodeError(1234, 1234, None, 0x401136, "Lost trace data", 5),
        ),
        (
            " instruction trace error type 1 time 0 cpu -1 pid -1 tid -1 ip 0 code 9: "
            "Overflow packet",
            DecodeError(None, None, None, None, "Overflow packet", 9),
        ),
        (
            " instruction trace error type 1 time 12345.678901234 machine_pid 77 vcpu 1 cpu 0 "
            "pid 1234 tid 1234 ip 0x10 code 7: Never-ending loop (refer perf config "
            "intel-pt.max-loops)",
            DecodeError(
                1234,
                1234,
                T,
                0x10,
                "Never-ending loop (refer perf config intel-pt.max-loops)",
                7,
            ),
        ),
        (  # pid and ip left out altogether
            " instruction trace error type 1 time 12345.678901234 cpu 0 code 6: Bad packet",
            DecodeError(None, None, T, None, "Bad packet", 6),
        ),
        (
            " unknown error type 2 time 12345.678901234 cpu 0 pid 1 tid 1 ip 0 code 1: odd",
            DecodeError(1, 1, T, None, "odd", 1),
        ),
    ],
)
def test_decode_error_lines(line: str, expected: DecodeError) -> None:
    assert parse_one(line) == expected
    assert parse_error_line(line) == expected


# ------------------------------------------------------------- stack samples


SAMPLE = [
    " 8144/8145   2462.958987888:     250000 cpu-clock:u: ",
    "\tffffffff82203877 _raw_spin_lock+0x17 ([kernel.kallsyms])",
    "\tffffffff81000c82 asm_exc_page_fault+0x22 ([kernel.kallsyms])",
    "\t            11af leaf(long)+0x16 (/tmp/a.out)",
    "\t            1290 main+0x50 (/tmp/a.out)",
    "\t           2724a __libc_start_call_main+0x7a (/usr/lib/x86_64-linux-gnu/libc.so.6)",
    "\t               0 [unknown] ([unknown])",
    "",
]


def test_callchain_sample_runs_root_to_leaf() -> None:
    sample = parse_one(SAMPLE[0])  # a header alone: a sample with no frames
    assert isinstance(sample, StackSample) and sample.frames == ()
    events, stats = parse_lines(SAMPLE)
    assert stats.unknown_lines == 0 and stats.samples == 1
    (sample,) = events
    assert isinstance(sample, StackSample)
    assert (sample.pid, sample.tid, sample.time) == (8144, 8145, 2462_958987888)
    assert (sample.event, sample.period) == ("cpu-clock:u", 250000)
    # Leaf last; the chain's terminating address 0 is not a frame.
    assert [f.symbol for f in sample.frames] == [
        "__libc_start_call_main",
        "main",
        "leaf(long)",
        "asm_exc_page_fault",
        "_raw_spin_lock",
    ]
    assert sample.frames[-1] == Location(
        0xFFFFFFFF82203877, "_raw_spin_lock", 0x17, "[kernel.kallsyms]"
    )
    assert sample.frames[2] == Location(0x11AF, "leaf(long)", 0x16, "/tmp/a.out")


def test_samples_one_after_another_and_before_a_branch() -> None:
    second = [
        " 8144/8144   2462.958990000:     250000 cycles:u: ",
        "\t  401136 main+0x26 (/tmp/a.out)",
    ]
    lines = SAMPLE[:-1] + second + [branch("call")]  # no blank line before the branch
    events, stats = parse_lines(lines, keep_all=True)
    assert [type(e) for e in events] == [StackSample, StackSample, BranchEvent]
    assert isinstance(events[1], StackSample)
    assert events[1].frames == (MAIN_LOC,) and events[1].event == "cycles:u"
    assert stats.unknown_lines == 0


def test_sample_on_one_line_without_callchain() -> None:
    line = (
        " 8144/8144   2462.958489194:     250000 cpu-clock:      7f345725262a handle_amd+0xa "
        "(/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2)"
    )
    sample = parse_one(line)
    assert isinstance(sample, StackSample)
    assert sample.frames == (
        Location(
            0x7F345725262A, "handle_amd", 0xA, "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
        ),
    )


def test_sample_split_across_batches() -> None:
    whole, _ = parse_lines(SAMPLE)
    parser = PerfTextParser()
    events = []
    for line in SAMPLE[:-1]:  # one line per batch, and no closing blank line
        events += parser.feed([line])
    assert events == []
    events += parser.finish()
    assert events == whole


# ------------------------------------------------------------------ task events


def test_comm_events() -> None:
    lines = [
        "    0/0         0.000000000: PERF_RECORD_COMM: perf-exec:8144/8144",
        " 8144/8144   2462.958241725: PERF_RECORD_COMM exec: my prog: v2:8144/8144",
        " 8144/8144   2463.006308719: PERF_RECORD_EXIT(8144:8144):(8142:8142)",
        " 8144/8144   2462.958280263: PERF_RECORD_MMAP2 8144/8144: [0x5631ea687000(0x1000) @ "
        "0x1000 fe:00 2171642 1003474072]: r-xp /tmp/pt/a.out",
    ]
    events, stats = parse_lines(lines)
    assert events == [
        CommEvent(8144, 8144, None, "perf-exec", False),
        CommEvent(8144, 8144, 2462_958241725, "my prog: v2", True),
    ]
    assert (stats.comms, stats.task_events, stats.unknown_lines) == (2, 2, 0)


# ------------------------------------------------------------- instruction counts


def test_ipc_counts_and_dropped_jumps_carry_them() -> None:
    lines = [
        branch("jcc", src="401136 main+0x26 (/tmp/a.out)", dst="401140 main+0x30 (/tmp/a.out)")
        + " \t IPC: 0.50 (5/10) ",
        branch("call") + " \t IPC: 1.00 (7/7) ",
        branch("return", src="401108 f+0x2 (/tmp/a.out)", dst="40113b main+0x2b (/tmp/a.out)"),
    ]
    events, stats = parse_lines(lines)
    assert stats.branches_dropped == 1 and stats.unknown_lines == 0
    call, ret = events
    assert isinstance(call, BranchEvent) and isinstance(ret, BranchEvent)
    assert (call.kind, call.insn_count, call.cycle_count) == (K.CALL, 12, 17)
    assert (ret.kind, ret.insn_count, ret.cycle_count) == (K.RETURN, 0, 0)


# --------------------------------------------------------------- dropping jumps


def test_jumps_inside_one_function_are_dropped_like_the_dlfilter() -> None:
    inside = branch("jcc", src=MAIN, dst="401140 main+0x30 (/tmp/a.out)")
    inside_jmp = branch("jmp", src=MAIN, dst="401140 main+0x30 (/tmp/a.out)")
    tail_call = branch("jmp", src=MAIN, dst=F)
    cold = branch("jmp", src=MAIN, dst="402000 main.cold+0x0 (/tmp/a.out)")
    in_tx = branch("jcc                 (x)", src=MAIN, dst="401140 main+0x30 (/tmp/a.out)")
    lines = [inside, inside_jmp, tail_call, cold, in_tx]
    kept, stats = parse_lines(lines)
    assert [(e.kind, e.dst.symbol) for e in kept if isinstance(e, BranchEvent)] == [
        (K.JUMP, "f"),
        (K.CONDITIONAL_JUMP, "main"),  # only plain jumps are dropped, as in the dlfilter
    ]
    assert stats.branches == 2 and stats.branches_dropped == 3  # main.cold is main's frame
    every, stats = parse_lines(lines, keep_all=True)
    assert len(every) == 5 and stats.branches_dropped == 0


# ---------------------------------------------------------- sharing and robustness


def test_locations_and_names_are_shared() -> None:
    lines = [
        branch("call"),
        branch("call", head="  1234/1234  12345.678901299:          1  branches:uH:"),
        branch("return", src="401108 f+0x2 (/tmp/a.out)", dst=MAIN),
        branch("jmp", src="401200 f+0xfa (/tmp/a.out)", dst="40110a f+0x4 (/tmp/a.out)"),
    ]
    events, _ = parse_lines(lines, keep_all=True)
    a, b, ret, jmp = (e for e in events if isinstance(e, BranchEvent))
    assert a.src is b.src and a.dst is b.dst
    assert ret.dst is a.src  # same address printed as a target and as a source
    assert ret.src.function is a.dst.function is jmp.src.function
    assert ret.src.dso is a.src.dso


def test_unknown_lines_are_counted_and_the_decode_goes_on() -> None:
    garbage = [f"garbage line {i}" for i in range(MAX_EXAMPLES + 3)]
    lines = [
        branch("call"),
        *garbage[:5],
        "  1234/1234  12345.678901234:          1  branches:uH:   call   zzz => yyy",
        " instruction trace error type 1 time x.y cpu 0 pid 1 tid 1 ip 0 code 1: bad time",
        "\tan indented line with no sample above it",
        *garbage[5:],
        branch("return", src="401108 f+0x2 (/tmp/a.out)", dst="40113b main+0x2b (/tmp/a.out)"),
        "",
    ]
    events, stats = parse_lines(lines, keep_all=True)
    assert [e.kind for e in events if isinstance(e, BranchEvent)] == [K.CALL, K.RETURN]
    assert stats.unknown_lines == len(garbage) + 3
    assert stats.unknown_examples == [*garbage[:5], lines[6], lines[7], lines[8]][:MAX_EXAMPLES]
    assert stats.lines == len(lines)
    summary = stats.summary()
    assert f"{len(garbage) + 3} lines not understood" in summary and "garbage line 0" in summary


def test_ignored_events_are_counted_not_unknown() -> None:
    line = f"  1234/1234  12345.678901234:          1  instructions:u:      {MAIN}"
    events, stats = parse_lines([line])
    assert events == [] and stats.ignored_events == {"instructions": 1} and stats.unknown_lines == 0


def test_crlf_and_newlines_are_tolerated() -> None:
    events, stats = parse_lines([branch("call") + "\r\n", branch("call") + "\n"], keep_all=True)
    assert len(events) == 2 and stats.unknown_lines == 0
