"""Shared generator of realistic branch-event streams for the benchmarks."""

from __future__ import annotations

import random

from ptscope.model import BranchEvent, BranchKind, Location, TraceState


def generate_events(n: int, *, seed: int = 1, threads: int = 1) -> list[BranchEvent]:
    """``n`` call/return/jump events of a random but consistent program.

    Roughly a third each of calls, returns and jumps; jumps are mostly inside a function
    (loops, ifs), some are tail calls. One Location object per address, as decoders share.
    """
    rng = random.Random(seed)
    funcs = [f"fn_{i}" for i in range(400)] + [
        "std::vector<int, std::allocator<int> >::push_back(int const&)",
        "memcpy",
        "malloc",
    ]
    base = {f: 0x400000 + 0x1000 * i for i, f in enumerate(funcs)}
    cache: dict[tuple[str, int], Location] = {}

    def loc(fn: str, off: int) -> Location:
        key = (fn, off)
        found = cache.get(key)
        if found is None:
            found = cache[key] = Location(base[fn] + off, fn, off, "/usr/bin/prog")
        return found

    events: list[BranchEvent] = []
    stacks = {tid: ["main_loop"] for tid in range(1, threads + 1)}
    sites: dict[int, list[int]] = {tid: [] for tid in stacks}  # call sites, as stacks
    base["main_loop"] = 0x300000
    time = 1_000_000
    call, ret, jmp, jcc = (
        BranchKind.CALL,
        BranchKind.RETURN,
        BranchKind.JUMP,
        BranchKind.CONDITIONAL_JUMP,
    )
    none = TraceState.NONE
    while len(events) < n:
        tid = rng.randint(1, threads)
        stack = stacks[tid]
        time += rng.randint(0, 40)
        r = rng.random()
        cur = stack[-1]
        off = rng.randrange(0x10, 0x200, 4)
        if (r < 0.34 and len(stack) < 60) or len(stack) == 1:
            callee = rng.choice(funcs)
            events.append(BranchEvent(1, tid, time, call, none, loc(cur, off), loc(callee, 0)))
            stack.append(callee)
            sites[tid].append(off)
        elif r < 0.68:
            stack.pop()
            # back right after the call (a tail call keeps its caller's call site)
            back = loc(stack[-1], sites[tid].pop() + 5)
            events.append(BranchEvent(1, tid, time, ret, none, loc(cur, off), back))
        elif r < 0.72:
            target = rng.choice(funcs)
            events.append(BranchEvent(1, tid, time, jmp, none, loc(cur, off), loc(target, 0)))
            stack[-1] = target
        else:
            kind = jcc if r < 0.9 else jmp
            events.append(
                BranchEvent(1, tid, time, kind, none, loc(cur, off), loc(cur, off + 0x20))
            )
    return events
