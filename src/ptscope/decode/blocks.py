"""Instruction detail for the text decoder: exact instruction counts and code lines.

The dlfilter counts the instructions of every basic block in C (``_native/dlfilter.c``,
``--dlarg insns``); this module does the same for ``perf script``'s text, so that both
decoders give identical events. A thread's instructions between two branch samples are the
straight run from the first one's target to the second one's source (perf writes a sample
for every taken branch; a branch not taken falls through). Each such block is split into
instructions once, with capstone, over the code bytes of the file the process mapped there.

Where code comes from: perf's ``PERF_RECORD_MMAP``/``MMAP2`` lines (``--show-mmap-events``)
give each process's executable mappings (address, length, file offset, path), and
``PERF_RECORD_FORK`` / ``COMM exec`` lines (``--show-task-events``) copy them to a forked
child or drop them at ``exec``. This is exact wherever perf's own view is (the mapping perf
resolves symbols with), whatever the load bias, the linker's segment layout or a
position-independent binary; symbol addresses would not do for code without symbols. The
files are read where perf names them (under ``--symfs`` when given): a recording decoded on
another machine needs its binaries there, as perf does.

Rules shared with the C filter (see "Instruction detail" in ``docs/file-formats.md``): the
source instruction of an asynchronous branch (``ASYNC`` flag: an interrupt, the end of the
trace) did not run and is not counted; a branch with source 0 (tracing starts) ends no
block; a block that cannot be read or split exactly up to the branch counts nothing (and is
counted in :attr:`InstructionDetail.unknown_blocks`).
"""

from __future__ import annotations

import bisect
import functools
import mmap
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from ptscope.decode.inline_runs import InlineRuns

__all__ = [
    "BLOCK_MAX_BYTES",
    "CodeMap",
    "InstructionDetail",
    "split_block",
]

BLOCK_MAX_BYTES: Final = 1 << 20
"""Longest block split (as the C filter): longer straight code is a stale start."""
_MAX_INSN: Final = 15

# " PERF_RECORD_MMAP2 PID/TID: [0xSTART(0xLEN) @ PGOFF ...]: PROT PATH"
_MMAP_RE: Final = re.compile(
    r"PERF_RECORD_MMAP2? (-?\d+)/-?\d+: \[0x([0-9a-f]+)\(0x([0-9a-f]+)\) @ (0x[0-9a-f]+|0)"
    r"(?: [^\]]*)?\]: (\S+) (.*)$"
)
# " PERF_RECORD_FORK(CHILD_PID:CHILD_TID):(PARENT_PID:PARENT_TID)"
_FORK_RE: Final = re.compile(r"PERF_RECORD_FORK\((-?\d+):-?\d+\):\((-?\d+):-?\d+\)")
_COMM_EXEC_RE: Final = re.compile(r"PERF_RECORD_COMM exec: .*:(-?\d+)/-?\d+\s*$")


@functools.cache
def _disassembler() -> Any:
    """capstone's x86-64 decoder, made on first use (importing capstone costs 20 ms, and
    the dlfilter decoder never needs it)."""
    import capstone

    return capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


def split_block(code: bytes, start: int, size: int) -> tuple[int, int] | None:
    """Split the ``size`` bytes of code at address ``start`` into instructions with
    capstone: (instructions before offset ``size``, length of the one at ``size`` or 0).
    ``code`` may hold more bytes than ``size`` (the instruction at ``size``). None if the
    instructions do not end exactly at ``size``."""
    before = 0
    pos = 0
    end_len = 0
    for address, length, _, _ in _disassembler().disasm_lite(code, start):
        pos = address - start
        if pos == size:
            end_len = length
            break
        before += 1
        pos += length
        if pos > size:
            return None
    else:
        if pos != size:
            return None
    return before, end_len


class CodeMap:
    """Each process's executable mappings, from perf's task and mmap lines, and the bytes
    of code they hold (files read with ``resolve``: perf's path → a readable file)."""

    def __init__(self, resolve: Callable[[str], Path | None]) -> None:
        self._resolve = resolve
        # pid -> sorted starts, and (start, end, file offset, path) per start
        self._starts: dict[int, list[int]] = {}
        self._maps: dict[int, list[tuple[int, int, int, str]]] = {}
        self._files: dict[str, mmap.mmap | bytes | None] = {}
        self.generation: dict[int, int] = {}
        """Bumped whenever a process's mappings change (cached blocks are then stale)."""

    def task_line(self, line: str) -> bool:
        """Take a ``PERF_RECORD_*`` line; whether it changed some process's mappings."""
        if "PERF_RECORD_MMAP" in line:
            m = _MMAP_RE.search(line)
            if m is None or "x" not in m.group(5):
                return False
            pid, start, length = int(m.group(1)), int(m.group(2), 16), int(m.group(3), 16)
            self.map(pid, start, start + length, int(m.group(4), 16), m.group(6).strip())
            return True
        if "PERF_RECORD_FORK" in line:
            m = _FORK_RE.search(line)
            if m is None or m.group(1) == m.group(2):
                return False  # a new thread shares its process's mappings
            child, parent = int(m.group(1)), int(m.group(2))
            self._starts[child] = list(self._starts.get(parent, []))
            self._maps[child] = list(self._maps.get(parent, []))
            self._changed(child)
            return True
        if "PERF_RECORD_COMM exec" in line:
            m = _COMM_EXEC_RE.search(line)
            if m is None:
                return False
            pid = int(m.group(1))
            self._starts.pop(pid, None)
            self._maps.pop(pid, None)
            self._changed(pid)
            return True
        return False

    def map(self, pid: int, start: int, end: int, offset: int, path: str) -> None:
        """``path`` at ``offset`` is mapped executable at ``start``..``end`` in ``pid``
        (replacing what overlapped it, as mmap does)."""
        starts = self._starts.setdefault(pid, [])
        maps = self._maps.setdefault(pid, [])
        keep = [m for m in maps if m[1] <= start or m[0] >= end]
        keep.append((start, end, offset, path))
        keep.sort()
        maps[:] = keep
        starts[:] = [m[0] for m in keep]
        self._changed(pid)

    def _changed(self, pid: int) -> None:
        self.generation[pid] = self.generation.get(pid, 0) + 1

    def locate(self, pid: int, address: int) -> tuple[str, int, int] | None:
        """(file path, file offset, bytes mapped from there on) of ``address`` in ``pid``;
        None if no file is mapped executable there."""
        starts = self._starts.get(pid)
        if not starts:
            return None
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            return None
        start, end, offset, path = self._maps[pid][i]
        if address >= end:
            return None
        return path, offset + address - start, end - address

    def file_offset(self, path: str, address: int) -> int | None:
        """Where ``address`` is in the file ``path`` as some process maps it executable
        (None: no process does): what a location's inlined body is looked up by."""
        for maps in self._maps.values():
            for start, end, offset, mapped in maps:
                if mapped == path and start <= address < end:
                    return offset + address - start
        return None

    def code(self, pid: int, address: int, size: int) -> bytes | None:
        """Up to ``size`` bytes of code at ``address`` in ``pid`` (fewer at the end of its
        mapping); None if no readable file is mapped there."""
        found = self.locate(pid, address)
        if found is None:
            return None
        path, at, mapped = found
        data = self._file(path)
        if data is None:
            return None
        return bytes(data[at : at + min(size, mapped)])

    def close(self) -> None:
        """Release the files read so far."""
        for data in self._files.values():
            if isinstance(data, mmap.mmap):
                data.close()
        self._files.clear()

    def _file(self, path: str) -> mmap.mmap | bytes | None:
        if path in self._files:
            return self._files[path]
        data: mmap.mmap | bytes | None = None
        found = self._resolve(path)
        if found is not None:
            try:
                with open(found, "rb") as f:
                    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                data = None
        self._files[path] = data
        return data


def _node_at(runs: tuple[list[int], list[int], list[int]], a: int) -> tuple[int, int]:
    """inline_runs.h: the body at file address ``a`` (0: none) and the next run boundary."""
    start, end, node = runs
    i = bisect.bisect_right(end, a)
    if i < len(start) and start[i] <= a:
        return node[i], end[i]
    return 0, start[i] if i < len(start) else 1 << 64


class InstructionDetail:
    """Per thread: the instructions and code lines since its last kept branch, from the
    basic blocks between its branches (see the module's docstring)."""

    def __init__(self, code: CodeMap, runs: Mapping[str, InlineRuns] | None = None) -> None:
        self.code = code
        self.runs = runs or {}
        """Inlined code by the file perf names (decode/inline_runs.py): with any, a block
        that enters or leaves an inlined body is split there, as the C decoders split it."""
        self.on_split: Callable[[tuple[int, int], int, int], None] | None = None
        """Called with (thread, address, node) where a block enters or leaves an inlined
        body, once the instructions and lines before it are counted (the parser writes its
        row and takes them)."""
        self._run_lists: dict[str, tuple[list[int], list[int], list[int]]] = {}
        # (pid, mapping generation, start, last) -> where the block enters or leaves bodies
        self._splits: dict[tuple[int, int, int, int], list[tuple[int, int, int]]] = {}
        self.unknown_blocks = 0
        """Blocks that could not be counted (no start known, code unreadable...)."""
        self.decoded_blocks = 0
        # (pid, mapping generation, start, end) -> (before, end_len), None if not splittable
        self._blocks: dict[tuple[int, int, int, int], tuple[int, int] | None] = {}
        self._start: dict[tuple[int, int], int] = {}
        self._count: dict[tuple[int, int], int] = {}
        self._lines: dict[tuple[int, int], set[int]] = {}

    def branch(self, thread: tuple[int, int], src: int, dst: int, is_async: bool) -> None:
        """A branch sample of ``thread`` (pid, tid) from ``src`` to ``dst``, kept or not."""
        start = self._start.get(thread, 0)
        self._start[thread] = dst
        if not src:
            return
        if not start:
            self.unknown_blocks += 1
            return
        pid = thread[0]
        key = (pid, self.code.generation.get(pid, 0), start, src)
        if key in self._blocks:
            found = self._blocks[key]
        else:
            found = self._blocks[key] = self._split(pid, start, src)
        if found is None or (not is_async and not found[1]):
            self.unknown_blocks += 1
            return
        before, end_len = found
        count = before if is_async else before + 1
        if not count:
            return
        last = src - 1 if is_async else src + end_len - 1
        done, first = 0, start
        if self.runs and self.on_split is not None:
            done, first = self._split_inlined(thread, start, src - 1 if is_async else src)
        self._count[thread] = self._count.get(thread, 0) + count - done
        self._lines.setdefault(thread, set()).update(range(first >> 6, (last >> 6) + 1))

    def _split_inlined(self, thread: tuple[int, int], start: int, last: int) -> tuple[int, int]:
        """pt_feed.c's split_inlined: each place from ``start`` to the last instruction run
        (at ``last``) where another inlined body begins, its instructions and lines before
        it counted and handed to :attr:`on_split`. Returns (instructions counted, where the
        lines left begin)."""
        pid = thread[0]
        key = (pid, self.code.generation.get(pid, 0), start, last)
        splits = self._splits.get(key)
        if splits is None:
            splits = self._splits[key] = self._find_splits(pid, start, last)
        done, first = 0, start
        for at, before, node in splits:
            self._count[thread] = self._count.get(thread, 0) + before - done
            self._lines.setdefault(thread, set()).update(range(first >> 6, ((at - 1) >> 6) + 1))
            done, first = before, at
            assert self.on_split is not None
            self.on_split(thread, at, node)
        return done, first

    def _find_splits(self, pid: int, start: int, last: int) -> list[tuple[int, int, int]]:
        """Where the block from ``start`` to ``last`` enters or leaves an inlined body:
        (address, instructions before it, the body there), in address order."""
        out: list[tuple[int, int, int]] = []
        found = self.code.locate(pid, start)
        if found is None:
            return out
        path, a0, _ = found
        runs = self._lists(path)
        if runs is None:
            return out
        end = a0 + (last - start)
        node, nxt = _node_at(runs, a0)
        done, from_at = 0, start  # (counted from the last place split: see pt_feed.c)
        while nxt <= end:
            b = nxt
            now, nxt = _node_at(runs, b)
            if now == node:
                continue
            at = start + (b - a0)
            code = self.code.code(pid, from_at, at - from_at + _MAX_INSN)
            split = split_block(code, from_at, at - from_at) if code is not None else None
            if split is None:
                continue
            node, done, from_at = now, done + split[0], at
            out.append((at, done, now))
        return out

    def _lists(self, path: str) -> tuple[list[int], list[int], list[int]] | None:
        found = self._run_lists.get(path)
        if found is None:
            r = self.runs.get(path)
            if r is None:
                return None
            found = self._run_lists[path] = (r.start.tolist(), r.end.tolist(), r.node.tolist())
        return found

    def node(self, path: str | None, address: int) -> int:
        """The inlined body at ``address`` of the file perf names ``path`` (0: none)."""
        if not path or not self.runs:
            return 0
        runs = self._lists(path)
        if runs is None:
            return 0
        at = self.code.file_offset(path, address)
        return 0 if at is None else _node_at(runs, at)[0]

    def pending(self, thread: tuple[int, int]) -> int:
        """The instructions of ``thread`` counted since the last take."""
        return self._count.get(thread, 0)

    def take(self, thread: tuple[int, int]) -> tuple[int, tuple[int, ...]]:
        """The instructions and code lines of ``thread`` since the last take (for a branch
        that is kept)."""
        count = self._count.pop(thread, 0)
        lines = self._lines.pop(thread, None)
        return count, tuple(sorted(lines)) if lines else ()

    def _split(self, pid: int, start: int, end: int) -> tuple[int, int] | None:
        if end < start or end - start > BLOCK_MAX_BYTES:
            return None
        code = self.code.code(pid, start, end - start + _MAX_INSN)
        if code is None or len(code) < end - start:
            return None
        found = split_block(code, start, end - start)
        if found is not None:
            self.decoded_blocks += 1
        return found
