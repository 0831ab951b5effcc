"""Reading a decode's record streams ahead of the engine, on a thread of its own.

With ``--jobs`` windows, every window's records go through one engine after the window
before them, and the windows after the first are read from files once their perfs have
ended: the reading (the record stream parsed into batches, a fifth of the decoding
thread's work) and the engine took turns in one thread while other cores were idle.
:class:`ReadAhead` runs the reading on a thread of its own, a few items ahead of the
engine: the engine's feed and the writer's encoding and compression let other threads
run, and so does the C reader of the stream's branch runs (``decode/_crecords.c``).

The reader thread takes every item of the stream in order, so the stream is read exactly
as without it (the same location table, in the same order) and the trace is the same,
byte for byte. What the consumer does must therefore not add locations to the stream's
table meanwhile (JIT maps do: the pipeline reads ahead only without them). An error of
the stream is raised in the consumer where the stream raised it, after the items before
it; closing stops the thread (``unblock`` stops what it may be waiting for: the perfs).

Off by default (``DecodeOptions.read_ahead``), because it pays only with a core for each
thread, which this project's 2-core machines could not measure. There, ptscope's side
alone (60k calls trace, three windows whose perfs had all ended, 5-7 interleaved rounds,
medians): without the writer thread, reading ahead took the consumer from 0.95 to 0.85 s
(0.91x the wall, 1.11x the CPU); with it, from 0.54 to 0.69 s (1.28x: three threads on two
cores, taking turns with the GIL's 5 ms switches between the engine's glue and the
reader's); a whole ``--jobs 2`` decode 1.54 s against 1.42 s. On 16 cores the serial
consumer is what windows wait for (issue 19: one window's perf 0.8-0.9 s of a 5.3 s
decode at 300k), so ``bench/decode.py --read-ahead`` there says whether to turn it on.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Final, Generic, TypeVar

__all__ = ["READ_AHEAD_ITEMS", "ReadAhead"]

_T = TypeVar("_T")

READ_AHEAD_ITEMS: Final = 8
"""Items read ahead at most (each the batches of one chunk of records, up to 1 MiB of
them): enough to keep the engine fed while the reader parses, few enough not to grow the
decode's memory by more than a few MB."""

_ITEM, _END, _ERROR = range(3)
_POLL_S: Final = 0.05  # how often a reader waiting for room looks whether it should stop


class ReadAhead(Generic[_T]):
    """The items of ``source``, taken from it on a thread of its own, at most ``depth``
    ahead of the caller. ``unblock`` is called on :meth:`close` to end what the source may
    be waiting for."""

    def __init__(
        self,
        source: Iterator[_T],
        *,
        depth: int = READ_AHEAD_ITEMS,
        unblock: Callable[[], None] = lambda: None,
    ) -> None:
        self._source = source
        self._unblock = unblock
        self._queue: queue.Queue[tuple[int, object]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="ptscope-read-ahead", daemon=True)
        self._thread.start()

    def __iter__(self) -> ReadAhead[_T]:
        return self

    def __next__(self) -> _T:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == _ITEM:
            return value  # type: ignore[return-value]
        self._done = True
        self._thread.join()
        if kind == _ERROR:
            assert isinstance(value, BaseException)
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop reading (what was read and not taken is dropped) and wait for the thread,
        which closes the source."""
        self._done = True
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._unblock()
        while self._thread.is_alive():
            # (room for a reader waiting to put an item, which then sees the stop)
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=_POLL_S)

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(_ITEM, item):
                    return
            self._put(_END, None)
        except BaseException as e:  # raised in the consumer, where the stream raised it
            self._put(_ERROR, e)
        finally:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def _put(self, kind: int, value: object) -> bool:
        """Hand an item over once there is room; False if the consumer stopped reading."""
        while not self._stop.is_set():
            try:
                self._queue.put((kind, value), timeout=_POLL_S)
                return True
            except queue.Full:
                pass
        return False
