"""Big synthetic call trees, built with numpy (12 M slices in a few seconds).

Each thread's time is tiled by root calls; every call that lasts long enough gets 0-3
children laid out at random inside it, level after level (so slices nest by
construction). Names follow a Zipf-like popularity over ``functions`` names, and a child
repeats its parent's name now and then (recursion). The last level is thinned at random
to hit the requested count exactly (dropping leaves keeps the nesting valid). Every slice
has an entry address; about one in 500 has a flag, as traces from the engine do, so the
writer takes its scatter path and sizes vary.
"""

from __future__ import annotations

import numpy as np

from ptscope.timeline import ThreadTimeline, Timeline

BASE_TIME = 1_700_000_000_000_000_000
_CHILDREN = np.array([0, 1, 1, 2, 2, 2, 3])  # children per call: deep, rarely dying out


def _forest(
    rng: np.random.Generator, n: int, weights: np.ndarray, origin: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """At most ``n`` nested calls from ``origin`` on: (start, end, depth, name id)."""
    roots = max(1, n // 2000)
    span = n * 100_000  # ns per root call: room for deep trees
    cuts = np.sort(rng.integers(1, span, size=roots - 1))
    start = np.concatenate(([0], cuts)).astype(np.int64) + origin
    end = np.concatenate((cuts, [span])).astype(np.int64) + origin
    name = rng.choice(len(weights), size=roots, p=weights)
    levels = [(start, end, name)]
    total = roots
    while total < n:
        dur = end - start
        children = np.where(dur >= 16, rng.choice(_CHILDREN, size=len(dur)), 0)
        if not children.any():
            break
        parent = np.repeat(np.arange(len(dur)), children)
        # Each parent's time is cut into gap, child, gap, child, ..., gap: children get
        # long random shares and gaps short ones, so children cover ~85% of the parent.
        slot = 2 * np.arange(len(parent)) + parent + 1  # child k's piece
        pieces = rng.exponential(0.15, size=len(parent) * 2 + len(dur))
        pieces[slot] = rng.exponential(1.0, size=len(parent))
        owner = np.repeat(np.arange(len(dur)), 2 * children + 1)
        totals = np.maximum(np.bincount(owner, weights=pieces, minlength=len(dur)), 1e-300)
        before = np.concatenate(([0.0], np.cumsum(totals)[:-1]))
        frac_end = (np.cumsum(pieces) - before[owner]) / totals[owner]
        frac_start = frac_end - pieces / totals[owner]
        room = (end - start - 2)[parent].astype(np.float64)
        first = (start + 1)[parent]
        start = first + (frac_start[slot] * room).astype(np.int64)
        end = first + (frac_end[slot] * room).astype(np.int64)
        recursive = rng.random(len(parent)) < 0.05
        name = np.where(
            recursive, levels[-1][2][parent], rng.choice(len(weights), len(parent), p=weights)
        )
        levels.append((start, end, name))
        total += len(start)
    excess = total - n
    if excess > 0:  # thin the deepest level (leaves only)
        s, e, m = levels[-1]
        keep = np.sort(rng.choice(len(s), len(s) - excess, replace=False))
        levels[-1] = (s[keep], e[keep], m[keep])
    depth = [np.full(len(level[0]), d, dtype=np.int32) for d, level in enumerate(levels)]
    return (
        np.concatenate([level[0] for level in levels]),
        np.concatenate([level[1] for level in levels]),
        np.concatenate(depth),
        np.concatenate([level[2] for level in levels]).astype(np.int32),
    )


def _thread(rng: np.random.Generator, n: int, n_names: int, offset: int) -> ThreadTimeline:
    weights = 1.0 / np.arange(1, n_names + 1)
    weights /= weights.sum()
    parts = []
    origin = BASE_TIME + offset
    made = 0
    while made < n:  # a forest can die out early: grow another one after it
        part = _forest(rng, n - made, weights, origin)
        parts.append(part)
        made += len(part[0])
        origin = int(part[1].max()) + 1
    s, e, d, names = (np.concatenate(column) for column in zip(*parts, strict=True))
    order = np.lexsort((d, s))
    flags = np.where(rng.random(len(s)) < 0.002, 1, 0).astype(np.uint8)
    return ThreadTimeline(
        pid=1000,
        tid=1000 + offset,
        name=f"worker-{offset}",
        start=s[order],
        end=e[order],
        depth=d[order],
        name_id=names[order],
        address=(0x401000 + names[order].astype(np.uint64) * 64),
        instructions=np.full(len(s), -1, dtype=np.int64),
        cycles=np.full(len(s), -1, dtype=np.int64),
        flags=flags,
    )


def random_call_timeline(
    n: int, *, threads: int = 4, functions: int = 2000, seed: int = 1
) -> Timeline:
    """A Timeline of exactly ``n`` properly nested slices over ``threads`` threads."""
    rng = np.random.default_rng(seed)
    names = [f"fn_{i}" for i in range(functions)]
    timeline = Timeline(names=names, processes={1000: "synthetic"})
    for t in range(threads):
        count = n // threads + (1 if t < n % threads else 0)
        timeline.threads.append(_thread(rng, count, functions, t))
    return timeline
