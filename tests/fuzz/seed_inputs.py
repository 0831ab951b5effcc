"""Valid inputs the fuzz targets start from: perf script text in every shape the text
decoder reads (written in perf's own layout by ``support.perf_text_format``, not by
ptscope)."""

from __future__ import annotations

from support.perf_text_format import (
    Loc,
    branch_line,
    cbr_line,
    error_line,
    psb_line,
    sample_lines,
)

__all__ = ["FUNCTIONS", "LONG_NAME", "branch_trace_lines", "other_shape_lines", "sampling_lines"]

CALL, RETURN, JUMP, JCC = 1 | 2, 1 | 4, 1, 1 | 8
TRACE_BEGIN, TRACE_END, SYSCALL = 1 | 256, 1 | 512, 1 | 2 | 16
EXE = "/usr/bin/prog"
LONG_NAME = "std::" + "very_long_template_argument_" * 60 + "::run()"
FUNCTIONS = {
    name: Loc(0x401000 + 0x100 * i, name, 0, EXE)
    for i, name in enumerate(["main", "parse", "walk", "emit", LONG_NAME])
}


def _at(name: str, offset: int) -> Loc:
    loc = FUNCTIONS[name]
    return Loc(loc.ip + offset, name, offset, EXE)


def branch_trace_lines(*, ipc: bool = False) -> list[str]:
    """A branch trace: two threads calling down four levels (recursion, a name of 1,600
    characters, jumps inside a function), frequency changes, a PSB, a decode error, a
    gap in tracing, thread names; with ``ipc``, instruction and cycle counts."""
    lines = [
        "    0/0         0.000000000: PERF_RECORD_COMM: perf-exec:100/100",
        "  100/100       4.999990000: PERF_RECORD_COMM exec: prog:100/100",
    ]
    time = 5_000_000_000
    count = 0

    def branch(tid: int, flags: int, src: Loc, dst: Loc) -> None:
        nonlocal count
        line = branch_line(100, tid, time, flags, src, dst)
        count += 1
        if ipc and count % 2:
            line += f" \t IPC: {count % 3 + 0.5:.2f} ({count * 3}/{count * 2}) "
        lines.append(line)

    for tid in (100, 101):
        lines.append(cbr_line(100, tid, time, 20, 2000, _at("main", 1)))
        lines.append(psb_line(100, tid, time, 0x4000, _at("main", 1)))
        branch(tid, TRACE_BEGIN, Loc(0), _at("main", 0))
        for rep in range(3):
            for caller, callee in (("main", "parse"), ("parse", "walk"), ("walk", "walk")):
                time += 7
                branch(tid, CALL, _at(caller, 9), _at(callee, 0))
                time += 1
                branch(tid, JCC, _at(callee, 3), _at(callee, 8))
            time += 3
            branch(tid, CALL, _at("walk", 20), _at(LONG_NAME, 0))
            time += 11
            branch(tid, RETURN, _at(LONG_NAME, 30), _at("walk", 25))
            for callee, caller in (("walk", "walk"), ("walk", "parse"), ("parse", "main")):
                time += 5
                branch(tid, RETURN, _at(callee, 40), _at(caller, 14))
            if rep == 1:
                time += 1
                lines.append(error_line(code=6, message="Trace doesn't match instruction",
                                        time_ns=time, pid=100, tid=tid, ip=0x401010))  # fmt: skip
                time += 2
                branch(tid, SYSCALL | TRACE_END, _at("main", 60), Loc(0))
                time += 100
                branch(tid, TRACE_BEGIN, Loc(0), _at("main", 62))
        time += 2
        branch(tid, JUMP, _at("main", 50), _at("emit", 0))
    return lines


def sampling_lines() -> list[str]:
    """Call-stack samples (``perf record -g``): each a header and its frames, leaf first."""
    lines = ["  200/200       0.999000000: PERF_RECORD_COMM exec: sampled:200/200"]
    stacks = [["walk", "parse", "main"], ["walk", "walk", "parse", "main"], ["emit", "main"]]
    for i in range(9):
        frames = [_at(name, 4 + depth) for depth, name in enumerate(stacks[i % 3])]
        frames.append(Loc(0))  # perf ends frame-pointer chains with 0
        lines += sample_lines(
            200, 200 + i % 2, 1_000_000_000 + i * 1000, 10_000, "cycles:u", frames
        )
    return lines


def other_shape_lines() -> list[str]:
    """Saved text with other ``-F`` fields: a command name first, one id, no period or
    event, times without ``--ns``."""
    return [
        "prog  100/100  5.000000100:  call  401009 main+0x9 (/usr/bin/prog) =>"
        "  401100 parse+0x0 (/usr/bin/prog)",
        "prog  100  5.000000200:  call  401109 parse+0x9 (/usr/bin/prog) =>"
        "  401200 walk+0x0 (/usr/bin/prog)",
        "5.000300:  return  401228 walk+0x28 (/usr/bin/prog) =>  40110e parse+0xe (/usr/bin/prog)",
        "prog 100/100 5.000000400: branches:  return  401128 parse+0x28 =>  40100e main+0xe",
        "  100/100  5.000000500:  return  401028 =>  0",
    ]
