"""The own Intel PT decoder (``decode/native.py``, ``_native/pt_*.c``) against perf's.

perf with the dlfilter is the reference: on every recording the own decoder must give the
same events, branch for branch (times, counts, code lines, names), with the same decode
errors, power and thread-name events, in every mode the pipeline uses; on damaged data
too. A recording it does not take goes to perf with one line saying why (or is an error
when the own decoder was asked for), and ``ptscope decode --verify`` says whether the two
agree on a recording, or where they first part.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import capstone
import pytest

from ptscope import _native
from ptscope.cli import decode as cli_decode
from ptscope.decode import native, verify
from ptscope.decode.dlfilter_stream import decode_with_dlfilter
from ptscope.decode.native import decode_native
from ptscope.decode.perf_data import REC_MMAP, REC_MMAP2, read_perf_data
from ptscope.model import BranchEvent, DecodeError, Event
from support.cli import one_line_error, ptscope
from support.decoder_parity import assert_same_trace
from support.emulated_corpus import DECODE_CASES, damaged_copy, decode_case_recording
from support.pt_corrupt import auxtrace_buffers
from support.pt_reshape import with_attr_flags

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _native.is_available(), reason="the dlfilter is not built"),
    pytest.mark.skipif(not native.is_available(), reason="the own decoder is not built"),
]

MODES = {
    "engine": {"insns": True},
    "no-insn-detail": {},
    "every-branch": {"keep_all": True},
    "every-branch-insns": {"keep_all": True, "insns": True},
}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {key: decode_case_recording(key, tmp_path_factory) for key in DECODE_CASES}


def _events(batches: Iterator[list[Event]]) -> list[Event]:
    return [e for b in batches for e in b]


def _same(perf_data: Path, *, non_code: bool = False, **mode: bool) -> list[Event]:
    """perf's events, which the own decoder's must equal; with ``non_code``, up to where
    one of them stops at bytes that are not 64-bit code and the other walks on (their one
    documented difference: a damaged trace sends both walks there)."""
    perf = _events(decode_with_dlfilter(perf_data, task_events=True, **mode))
    own = _events(decode_native(perf_data, **mode))
    verdict = verify.first_difference(perf, own)
    if verdict.difference is not None:
        d = verdict.difference
        if non_code and (
            _stops_at_non_code(perf_data, d.own) or _stops_at_non_code(perf_data, d.perf)
        ):
            return perf[: d.index]
        pytest.fail(
            f"{perf_data} {mode}: event {d.index} of {len(perf)}/{len(own)}: "
            f"perf {verify.describe(d.perf)} / own {verify.describe(d.own)} "
            f"({'; '.join(verify.differing_fields(d.perf, d.own))})"
        )
    return perf


def _stops_at_non_code(perf_data: Path, event: Event | None) -> bool:
    """``event`` is a decoder's "Failed to get instruction" at bytes that capstone does
    not decode as 64-bit code either (read from the file mapped there)."""
    if not (isinstance(event, DecodeError) and event.message == "Failed to get instruction"):
        return False
    ip = event.ip or 0
    for r in read_perf_data(perf_data).sideband:
        if r.type not in (REC_MMAP, REC_MMAP2) or not r.fields or not Path(r.name).is_file():
            continue
        addr, length, pgoff = r.fields[:3]
        if addr <= ip < addr + length:
            with open(r.name, "rb") as f:
                f.seek(pgoff + ip - addr)
                code = f.read(15)
            return not list(_CAPSTONE.disasm(code, ip, 1))
    return False


_CAPSTONE = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("key", list(DECODE_CASES))
def test_the_same_events_as_perf(recordings: dict[str, Path], key: str, mode: str) -> None:
    events = _same(recordings[key], **MODES[mode])
    branches = [e for e in events if isinstance(e, BranchEvent)]
    assert len(branches) > 100
    if MODES[mode].get("insns"):
        assert all(e.lines is not None for e in branches)


def test_the_same_events_on_a_recording_perf_finds_damaged(
    recordings: dict[str, Path], tmp_path: Path
) -> None:
    copy = tmp_path / "damaged"
    shutil.copytree(recordings["basics-static"].parent, copy)
    damaged_copy(recordings["basics-static"], copy / "perf.data")
    events = _same(copy / "perf.data", insns=True)
    assert any(isinstance(e, DecodeError) for e in events)


@pytest.mark.parametrize("seed", range(12))
def test_the_same_events_on_damaged_trace(
    recordings: dict[str, Path], tmp_path: Path, seed: int
) -> None:
    """Bits flipped, bytes set and runs of zeros in the trace: the same errors where perf
    finds them, the same branches around them; up to where a wrong path (damage sends both
    walks off) reaches bytes that are not code, where one instruction decoder takes an
    encoding the other refuses (docs/architecture.md)."""
    source = recordings["threads-pie"]
    rng = random.Random(seed)
    data = bytearray(source.read_bytes())
    buffers = auxtrace_buffers(source)
    for _ in range(rng.choice([1, 3, 10])):
        offset, size, _queue, _tid = rng.choice(buffers)
        at = offset + rng.randrange(size)
        if seed % 3 == 0:
            data[at] ^= 1 << rng.randrange(8)
        elif seed % 3 == 1:
            data[at] = rng.randrange(256)
        else:
            n = min(rng.randrange(1, 200), offset + size - at)
            data[at : at + n] = bytes(n)
    damaged = tmp_path / "perf.data"
    damaged.write_bytes(bytes(data))
    for mode in ({"insns": True}, {"keep_all": True}):
        assert len(_same(damaged, non_code=True, **mode)) > 100


# ----------------------------------------------------------------- what it does not take


@pytest.fixture(scope="module")
def kernel_recording(recordings: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A recording whose Intel PT event says it traced the kernel too (exclude_kernel
    cleared): perf decodes it (its trace is the user code's all the same)."""
    source = recordings["threads-pie"]
    copy = tmp_path_factory.mktemp("kernel") / "recording"
    shutil.copytree(source.parent, copy)
    return with_attr_flags(source, copy / source.name, 0, 1 << 5)


def test_a_recording_it_does_not_take_goes_to_perf_with_one_line(
    kernel_recording: Path, recordings: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "t.fxt.gz"
    done = ptscope("decode", str(kernel_recording), "-o", str(out), "--no-drill")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("ptscope:")]
    assert len(lines) == 1, lines
    assert "decoding with perf (dlfilter)" in lines[0] and "it traces the kernel" in lines[0]
    assert "(dlfilter decoder" in done.stderr
    plain = tmp_path / "plain.fxt.gz"
    done = ptscope("decode", str(recordings["threads-pie"]), "-o", str(plain), "--no-drill")
    assert done.returncode == 0 and "(native decoder" in done.stderr, done.stderr
    assert_same_trace(plain, out)  # (the same trace: only the attribute's bit differs)


def test_asking_for_the_own_decoder_on_it_is_one_error(
    kernel_recording: Path, tmp_path: Path
) -> None:
    done = ptscope(
        "decode", str(kernel_recording), "--decoder", "native", "-o", str(tmp_path / "t.fxt.gz")
    )
    line = one_line_error(done, code=3)
    assert "the own decoder does not decode" in line and "it traces the kernel" in line
    assert "--decoder dlfilter" in done.stderr


# ---------------------------------------------------------------------------- --verify


def test_verify_says_identical(recordings: dict[str, Path], tmp_path: Path) -> None:
    done = ptscope("decode", "--verify", str(recordings["threads-pie"].parent))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert line.startswith("identical: ") and "branches" in line, line
    assert not list(tmp_path.iterdir()), "--verify writes no trace"


def test_verify_of_what_it_does_not_take_is_one_error(kernel_recording: Path) -> None:
    line = one_line_error(ptscope("decode", "--verify", str(kernel_recording)), code=3)
    assert "it traces the kernel" in line


def test_verify_shows_where_the_decoders_part(
    recordings: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The 40th event of the own decoder's stream changed (its instruction count): the
    command names that event, shows the ones before it and what differs; exit 1."""
    real = verify.decode_native

    def off_by_one(*args: object, **kwargs: object) -> Iterator[list[Event]]:
        seen = 0
        for batch in real(*args, **kwargs):  # type: ignore[arg-type]
            out = []
            for e in batch:
                seen += 1
                if seen == 40 and isinstance(e, BranchEvent):
                    e = dataclasses.replace(e, insn_count=e.insn_count + 1)
                out.append(e)
            yield out

    monkeypatch.setattr(verify, "decode_native", off_by_one)
    args = argparse.Namespace(
        recording=str(recordings["basics-static"]), perf_script=None, pid=None, tid=None,
        symfs=None, insn_detail=True, inline=True,
    )  # fmt: skip
    assert cli_decode.verify_decoders(args) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("different: ") and "part at event 40" in out[0], out
    assert [line.split(":")[0].strip() for line in out[1:6]] == ["both"] * 3 + ["perf", "own"]
    assert out[6].strip().startswith("insn_count: "), out


@pytest.mark.parametrize("how", [("--split-time", "20us"), ("--split-size", "2k")])
def test_split_parts_are_the_same_as_perfs(
    recordings: dict[str, Path], tmp_path: Path, how: tuple[str, str]
) -> None:
    """Split into parts, each part the same as the one perf's decoder makes."""
    parts = {}
    for decoder in ("native", "dlfilter"):
        out = tmp_path / decoder
        out.mkdir()
        done = ptscope(
            "decode", str(recordings["threads-pie"]), "-o", str(out / "t.fxt.gz"),
            "--decoder", decoder, "--no-drill", *how,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        parts[decoder] = sorted(out.glob("t-*.fxt.gz"))
    assert len(parts["native"]) >= 2
    assert [p.name for p in parts["native"]] == [p.name for p in parts["dlfilter"]]
    for own, perf in zip(parts["native"], parts["dlfilter"], strict=True):
        assert_same_trace(own, perf)
