"""Writing slice batches on a thread of their own, beside the engine that makes them.

A decode's process does two jobs in turn: the engine turns branches into slices, and the
trace stream encodes, compresses and writes them (about two fifths of its CPU with the
``drill`` strings). Both spend their time in C that lets other threads run (the engine's
feed, the slice encoder, ISA-L's compression, the file's writes), so the writing can run
beside the engine: :class:`BackgroundWrites` hands each batch to a writer thread, and the
engine goes on.

The writer thread runs at the lowest priority (nice 19): it takes the time no other
thread wants, and never perf's. When it falls behind (no core is idle for it: perf's
thread and the engine's fill two cores), the decoding thread writes the oldest waiting
batches itself, so that the decode is never slower than without the thread by more than
the hand-over, and a busy machine cannot starve it. Batches are written in the order
given, whichever thread writes them (one at a time, the oldest first).

A write's failure (a full disk, a split with too many parts) is raised in the decoding
thread at its next batch, or at :meth:`BackgroundWrites.finish`, as the stream raised it.

It pays when a core is idle for it (the pipeline asks
:func:`ptscope.decode.perf_launch.core_idle_beside`): on two cores a one-job decode keeps
both busy (perf's decoding, and this process), and there the thread cost 1-4 % of the
wall time (bench/decode.py --writer-thread).
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from typing import Final, Protocol

from ptscope.timeline import SliceBatch

__all__ = ["QUEUE_BATCHES", "WRITER_NICE", "BackgroundWrites", "BatchSink"]

QUEUE_BATCHES: Final = 2
"""Batches that may wait for the writer thread (each 32,768 slices, a few MB); with more,
the decoding thread writes the oldest itself."""

WRITER_NICE: Final = 19
"""The writer thread's niceness: it runs when a core is idle, never in perf's way."""


class BatchSink(Protocol):
    """What the batches are written into (a :class:`~ptscope.fxt.stream.TraceStream`)."""

    def write(self, batch: SliceBatch) -> None: ...


class BackgroundWrites:
    """Writes batches into ``sink`` in the order given, on a thread of its own when it
    keeps up and in the caller's thread when it does not."""

    def __init__(self, sink: BatchSink, *, depth: int = QUEUE_BATCHES) -> None:
        self._sink = sink
        self._depth = depth
        self._pending: collections.deque[SliceBatch] = collections.deque()
        self._changed = threading.Condition()  # guards _pending and _closing
        self._closing = False
        self._writing = threading.Lock()  # held by the thread writing a batch
        self._error: BaseException | None = None
        self._abandoned = False
        self.batches = 0
        """Batches handed over."""
        self.written_here = 0
        """Of those, how many the decoding thread wrote itself (the writer was behind)."""
        self._thread = threading.Thread(target=self._run, name="ptscope-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Linux: a thread's niceness is its own (the tid is a process id here).
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        while True:
            with self._changed:
                while not self._pending and not self._closing:
                    self._changed.wait()
                if not self._pending:
                    return
            with self._writing:
                self._write_oldest()

    def _write_oldest(self) -> bool:
        """Write the oldest waiting batch, if any (the caller holds ``_writing``, so that
        batches are taken and written one at a time, in order)."""
        with self._changed:
            if not self._pending:
                return False
            batch = self._pending.popleft()
        # After a failure (or once abandoned) batches are only taken off.
        if self._error is None and not self._abandoned:
            try:
                self._sink.write(batch)
            except BaseException as e:  # raised in the decoding thread
                self._error = e
        return True

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            self._abandoned = True
            raise error

    def write(self, batch: SliceBatch) -> None:
        """Hand ``batch`` over; when more than ``depth`` wait, write the oldest here.
        Raises what an earlier batch's write raised."""
        self._raise()
        self.batches += 1
        with self._changed:
            self._pending.append(batch)
            self._changed.notify()
            behind = len(self._pending) > self._depth
        if behind:
            with self._writing:
                while len(self._pending) > self._depth and self._write_oldest():
                    self.written_here += 1
            self._raise()

    def _close(self, *, drop: bool) -> None:
        """No more batches come: the thread ends once none waits (``drop``: now)."""
        with self._changed:
            if drop:
                self._pending.clear()
            self._closing = True
            self._changed.notify()

    def finish(self) -> None:
        """Write every batch still waiting (here, not waiting for the thread) and end the
        thread; raises what a write raised."""
        self._close(drop=False)
        with self._writing:
            while self._write_oldest():
                self.written_here += 1
        self._thread.join()
        self._raise()

    def abandon(self) -> None:
        """Stop writing (a decode that failed): what waits is dropped, a batch being
        written is finished, and the thread has ended when this returns."""
        self._abandoned = True
        self._close(drop=True)
        self._thread.join()
        self._error = None
