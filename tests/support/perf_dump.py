"""perf's own reading of Intel PT packets: ``perf script -D`` (its packet dump), parsed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ptscope.perftool import find_perf, perf_env

__all__ = ["packet_dump"]

_DATA = ". ... Intel Processor Trace data: size"
_PACKET = re.compile(r"^\.\s+([0-9a-f]{8}):\s+((?:[0-9a-f]{2} )+)\s*(.*?)\s*$")


def packet_dump(perf_data: Path) -> list[list[tuple[int, int, str]]]:
    """Each AUX buffer's packets as perf's dump lists them: (offset in the buffer, size,
    description), in file order."""
    dump = subprocess.run(
        [str(find_perf().path), "script", "-D", "-i", str(perf_data)],
        capture_output=True,
        text=True,
        env=perf_env(),
        timeout=300,
        check=True,
    ).stdout
    buffers: list[list[tuple[int, int, str]]] = []
    packets: list[tuple[int, int, str]] | None = None
    for line in dump.splitlines():
        if line.startswith(_DATA):
            packets = []
            buffers.append(packets)
            continue
        if packets is None:
            continue
        m = _PACKET.match(line)
        if m is None:
            packets = None  # (the buffer's packets end with the first other line)
            continue
        packets.append((int(m.group(1), 16), len(m.group(2).split()), m.group(3)))
    return buffers
