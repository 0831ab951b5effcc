"""Writing slice batches on a thread of their own, beside the engine that makes them.

A decode's process does two jobs in turn: the engine turns branches into slices, and the
trace stream encodes, compresses and writes them (about two fifths of its CPU with the
``drill`` strings). Both spend their time in C that lets other threads run (the slice
encoder, ISA-L's compression, the file's writes), so with a core to spare the writing
can run beside the engine: :class:`BackgroundWrites` hands each batch to a writer thread
through a short queue, in order, and the engine goes on.

It pays only when a core is free for it: on two cores a one-job decode already keeps both
busy (perf's decoding, and this process), and a third busy thread takes time from perf's
(see :func:`wanted`). The writer thread owns the stream between the first batch and
:meth:`BackgroundWrites.finish`; its failure (a full disk, a split with too many parts)
is raised in the decoding thread at its next batch, or at ``finish``, as the same
exception the stream raised.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Final, Protocol

from ptscope.timeline import SliceBatch

__all__ = ["QUEUE_BATCHES", "BackgroundWrites", "BatchSink", "wanted"]

QUEUE_BATCHES: Final = 2
"""Batches waiting for the writer at most (each 32,768 slices, a few MB): enough to keep
it busy while the engine makes the next, and memory stays bounded when the disk is slow."""


class BatchSink(Protocol):
    """What the writer thread writes into (a :class:`~ptscope.fxt.stream.TraceStream`)."""

    def write(self, batch: SliceBatch) -> None: ...


def wanted(busy_threads: int, cpus: int | None = None, load: float | None = None) -> bool:
    """Whether a writer thread has a core of its own: the CPUs this process may run on
    (``cpus``), less the machine's load (``load``, the 1-minute average, rounded down),
    leave one free beside the ``busy_threads`` that the decode keeps running (its perfs,
    and the engine's thread)."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
    return cpus - int(load) > busy_threads


_STOP: Final = None


class BackgroundWrites:
    """Writes batches into ``sink`` on a thread of its own, in the order given."""

    def __init__(self, sink: BatchSink, *, depth: int = QUEUE_BATCHES) -> None:
        self._sink = sink
        self._queue: queue.Queue[SliceBatch | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, name="ptscope-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (batch := self._queue.get()) is not _STOP:
            # After a failure (or once abandoned) the rest is only taken off the queue, so
            # that the decoding thread never waits on a full one.
            if self._error is None and not self._abandoned:
                try:
                    self._sink.write(batch)
                except BaseException as e:  # raised in the decoding thread
                    self._error = e

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            self._abandoned = True
            raise error

    def write(self, batch: SliceBatch) -> None:
        """Queue ``batch`` (waits while the queue is full); raises what an earlier batch's
        write raised."""
        self._raise()
        self._queue.put(batch)

    def finish(self) -> None:
        """Wait until every queued batch is written; raises what a write raised."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._raise()

    def abandon(self) -> None:
        """Stop writing (a decode that failed): what is queued is dropped, the batch being
        written is finished, and the thread has ended when this returns."""
        self._abandoned = True
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self._error = None
