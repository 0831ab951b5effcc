"""A decode that finds nothing says so: nothing at all decoded (zeroed trace data, only
decode errors, a selection that matches no thread) is a one-line error with exit code 3
and no trace left behind; branches that made no call are a warning, and the trace stays."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from ptscope.pipeline import DecodeOptions, DecodeSummary, _check_decoded
from ptscope.record.emulated import record
from support.cli import one_line_error, ptscope
from support.programs import build
from support.pt_corrupt import auxtrace_buffers


def test_branches_that_make_no_call_are_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    summary = DecodeSummary(Path("t.fxt"), "text", "")
    summary.branches = 3
    with caplog.at_level(logging.WARNING, logger="ptscope"):
        _check_decoded(summary, "rec", DecodeOptions(region=("start", "stop")))
    [message] = caplog.messages
    assert message == (
        "warning: 3 branches from rec decoded to no call: the trace is empty "
        "(nothing inside --filter start,stop)"
    )


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("rec")
    record([str(build("basics"))], directory)
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["dlfilter", "text"])
def test_a_recording_whose_trace_data_is_zeroed_is_an_error(
    recording: Path, tmp_path: Path, decoder: str
) -> None:
    zeroed = tmp_path / "zeroed"
    shutil.copytree(recording, zeroed)
    perf_data = zeroed / "perf.data"
    data = bytearray(perf_data.read_bytes())
    buffers = auxtrace_buffers(perf_data)
    assert buffers
    for offset, size, _queue, _tid in buffers:
        data[offset : offset + size] = bytes(size)
    perf_data.write_bytes(data)
    out = tmp_path / "t.fxt.gz"
    result = ptscope("decode", str(zeroed), "-o", str(out), "--decoder", decoder)
    line = one_line_error(result, code=3)
    assert f"nothing could be decoded from {zeroed}: no branch or sample in it" in line
    assert "all zero bytes" in result.stderr
    assert not out.exists()


@pytest.mark.slow
def test_a_selection_that_matches_no_thread_is_an_error(recording: Path, tmp_path: Path) -> None:
    out = tmp_path / "t.fxt.gz"
    result = ptscope("decode", str(recording), "-o", str(out), "--pid", "999999")
    line = one_line_error(result, code=3)
    assert "no branch or sample of the selected processes or threads" in line
    assert not out.exists()


def _output_node(tmp_path: Path, kind: str) -> Path:
    node = tmp_path / "out.fxt.gz"
    if kind == "fifo":
        os.mkfifo(node)
    else:
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
    return node


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "device", "link to a fifo"])
def test_an_output_that_is_no_regular_file_survives(
    recording: Path, tmp_path: Path, kind: str
) -> None:
    """A decode that finds nothing removes the trace only where it created one: an output
    that is a device or a FIFO (written in place), or a link to one, stays."""
    node = _output_node(tmp_path, "fifo" if "fifo" in kind else kind)
    out = node
    if kind.startswith("link"):
        out = tmp_path / "link.fxt.gz"
        out.symlink_to(node)
    reader = (
        subprocess.Popen(["cat", str(node)], stdout=subprocess.DEVNULL) if "fifo" in kind else None
    )
    try:
        result = ptscope("decode", str(recording), "-o", str(out), "--pid", "999999")
    finally:
        if reader is not None:  # a reader still waiting for a writer gets one, then EOF
            with contextlib.suppress(OSError):  # ENXIO: it had one and is gone
                os.close(os.open(node, os.O_WRONLY | os.O_NONBLOCK))
            reader.wait(timeout=30)
    assert "no branch or sample" in one_line_error(result, code=3)
    mode = os.lstat(node).st_mode
    assert stat.S_ISFIFO(mode) if "fifo" in kind else stat.S_ISCHR(mode)
    assert out.is_symlink() == kind.startswith("link")
