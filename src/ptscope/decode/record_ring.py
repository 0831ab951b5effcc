"""Ring mode of the dlfilter record stream: the records cross in shared memory, not a pipe.

Through a pipe every record is copied twice by the kernel (into the pipe, out of it), perf
spins on the pipe's lock while ptscope reads, and each buffer takes fresh pages: about a
tenth of a decode's CPU (``bench/decode.py --peers``: ``ptscope -j1`` against ``ptscope -j1
pipe``). In ring mode the dlfilter copies its records into chunks of a memory file
(``memfd``) that both processes map, and writes only a 16-byte *chunk record* into perf's
stdout when a chunk is ready; ptscope parses the chunk where it lies and gives it back
through a pipe of chunk indices (``dlfilter.c``, "Ring mode"). The parser copies whatever
it keeps of a chunk (a record cut at its end, the rows of the runs that the C reader does
not take), so nothing refers to the chunk once it is parsed. The dlfilter cuts no record
at a chunk's end (but one longer than a chunk), so a chunk is usually one run of records.

perf's own text (decode errors, task events) still goes through stdout, and must come out
between the records where it happened: the dlfilter hands its current chunk over as soon
as it sees that perf printed something, so the records before that text are the chunk
named by the *next* chunk record. :class:`RingReader` therefore holds the text it reads
until the next chunk record, and yields the chunk's records first, then the text. What it
yields is the stream the pipe would have carried, in the same order, for the same parser.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator
from typing import Final

from ptscope.errors import BadInputError

__all__ = [
    "RING_CHUNKS",
    "RING_CHUNK_BYTES",
    "RING_HEADROOM_CHUNKS",
    "RingReader",
    "SharedRing",
    "ring_supported",
]

RING_CHUNKS: Final = 16
RING_CHUNK_BYTES: Final = 1 << 19
"""16 chunks of 512 KiB: perf runs 8 MiB (about 25 ms of its records) ahead of ptscope at
most. A chunk is what the parser takes at once: 1 MiB chunks took 8% less CPU than 256 KiB
ones (fewer, larger batches), 4 MiB ones no less again. With 4 chunks of 1 MiB, perf waited
for a free chunk at every other chunk while ptscope wrote a batch of slices (300k calls
trace: 950 waits, 0.3-0.5 s of a 7-9 s decode); with these, 350-500 waits and 25-140 ms,
for 0.6% more instructions in ptscope's process, and no more memory (the trailer's
``ring_waits``; ``ptscope decode -v`` logs them)."""
RING_HEADROOM_CHUNKS: Final = 48
"""Chunks beyond :data:`RING_CHUNKS`: 24 MiB, about 100 ms of perf's records, for perf to
decode while ptscope still imports its decoder (``decode/perf_launch.py`` starts perf
first). The dlfilter takes its free chunks in order, so it fills each of them once at the
start; ptscope gives one back while it is behind (it read more chunk records than this
one), else releases it (its memory goes, ``MADV_REMOVE``), so the ring shrinks back to
:data:`RING_CHUNKS` once ptscope has caught up. With the 16 chunks alone, perf waited for
ptscope 100-150 ms per decode of the 60k calls trace when it was started early."""


def ring_supported() -> bool:
    """Whether this system has memory files (Linux 3.17+) and ring mode is not turned off
    (``PTSCOPE_NO_RING=1``: the records go through the pipe, as before)."""
    return hasattr(os, "memfd_create") and not os.environ.get("PTSCOPE_NO_RING")


class SharedRing:
    """The chunks perf writes into and ptscope reads, and the pipe that gives them back.

    Pass :attr:`perf_fds` to perf's process, :meth:`argument` to the dlfilter, then call
    :meth:`started` (perf holds its own copies of the descriptors)."""

    def __init__(
        self,
        chunks: int = RING_CHUNKS,
        chunk_bytes: int = RING_CHUNK_BYTES,
        headroom: int = RING_HEADROOM_CHUNKS,
    ) -> None:
        self.circulating = chunks  # given back; the `headroom` chunks after them are not
        self.chunks = chunks + headroom
        self.chunk_bytes = chunk_bytes
        self._memfd = os.memfd_create("ptscope-records", os.MFD_CLOEXEC)
        self._free_read = self._free_write = -1
        try:
            os.ftruncate(self._memfd, self.chunks * chunk_bytes)
            self._map = mmap.mmap(self._memfd, self.chunks * chunk_bytes, access=mmap.ACCESS_READ)
            self._free_read, self._free_write = os.pipe2(os.O_CLOEXEC)
        except BaseException:
            self.close()
            raise

    @property
    def perf_fds(self) -> tuple[int, int]:
        return (self._memfd, self._free_read)

    def argument(self) -> str:
        """The dlfilter's ``--dlarg``."""
        return f"ring={self._memfd},{self._free_read},{self.chunks},{self.chunk_bytes}"

    def started(self) -> None:
        """perf has started with its copies of :attr:`perf_fds`: close ours."""
        for fd in (self._memfd, self._free_read):
            if fd >= 0:
                os.close(fd)
        self._memfd = self._free_read = -1

    def view(self, chunk: int, length: int) -> memoryview:
        """The records of a chunk perf handed over, read in place: give the chunk back
        (:meth:`give_back`) once parsed. Copying each chunk out cost 8% of ptscope's CPU
        on a decode (60k calls trace; 3.5% at 300k)."""
        start = chunk * self.chunk_bytes
        return memoryview(self._map)[start : start + length]

    def give_back(self, chunk: int, *, behind: bool = False) -> None:
        """perf may fill the chunk again; a headroom chunk only while ptscope is
        ``behind`` (more chunks wait to be parsed), else it is released."""
        if chunk >= self.circulating:
            # Out of our page tables either way, so that ptscope's RSS holds the
            # circulating chunks only (perf fills a headroom chunk again only while
            # ptscope is behind: its pages are read in again then, 128 faults a chunk).
            advice = mmap.MADV_DONTNEED if behind else mmap.MADV_REMOVE
            self._map.madvise(advice, chunk * self.chunk_bytes, self.chunk_bytes)
            if not behind:
                return
        with contextlib.suppress(BrokenPipeError):  # perf has ended: it takes no more
            os.write(self._free_write, chunk.to_bytes(4, "little"))

    def close(self) -> None:
        with_map = getattr(self, "_map", None)
        if with_map is not None:
            # A decode that stopped part way may still hold a view of a chunk (in a
            # traceback): the map then goes with the last of them.
            with contextlib.suppress(BufferError):
                with_map.close()
        self.started()
        if self._free_write >= 0:
            os.close(self._free_write)
            self._free_write = -1


class RingReader:
    """Turns what perf writes into stdout in ring mode (chunk records and perf's text lines)
    into the record stream the pipe would have carried, in order.

    :meth:`split` takes each piece read from stdout and yields the stream's next pieces;
    :meth:`finish` yields what is left at the end of stdout (text perf printed after the
    dlfilter's last chunk record)."""

    def __init__(self, ring: SharedRing, what: str) -> None:
        # Imported here: record_format's dtypes import numpy, and a decode makes its ring
        # before it imports numpy (decode/perf_launch.py starts perf first).
        from ptscope.decode import record_format as rf

        self._chunk = rf.CHUNK
        self._tag = rf.TAG_CHUNK
        self._none = rf.NO_CHUNK
        self.ring = ring
        self.what = what
        self._rest = b""
        self._text: list[bytes] = []  # perf's lines since the last chunk record

    def split(self, data: bytes) -> Iterator[bytes | memoryview]:
        buf = self._rest + data if self._rest else data
        at = 0
        size = self._chunk.size
        while at < len(buf):
            if buf[at] == self._tag:
                if len(buf) - at < size:
                    break
                _, chunk, length = self._chunk.unpack_from(buf, at)
                self._check(buf, at, chunk, length)
                at += size
                if length:
                    view = self.ring.view(chunk, length)
                    yield view
                    # Parsed: the parser copied what it keeps (release() fails if not).
                    view.release()
                    self.ring.give_back(chunk, behind=at < len(buf))
                if self._text:
                    yield b"".join(self._text)
                    self._text.clear()
            else:
                end = buf.find(b"\n", at)
                if end < 0:
                    break
                self._text.append(buf[at : end + 1])
                at = end + 1
        self._rest = buf[at:]

    def finish(self) -> Iterator[bytes]:
        if self._rest:
            self._text.append(self._rest)
            self._rest = b""
        if self._text:
            yield b"".join(self._text)
            self._text.clear()

    def _check(self, buf: bytes, at: int, chunk: int, length: int) -> None:
        reserved = buf[at + 1 : at + 4] + buf[at + 12 : at + 16]
        none = chunk == self._none and length == 0
        some = chunk < self.ring.chunks and 0 < length <= self.ring.chunk_bytes
        if any(reserved) or not (none or some):
            raise BadInputError(
                f"{self.what}: damaged chunk record (chunk {chunk}, {length} bytes)"
            )
