"""Golden transcripts: each file is an event script interleaved with the BEGIN/END/INSTANT
lines the engine must produce for it (one file per reconstruction rule)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.event_script import run_transcript

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDENS = sorted(GOLDEN_DIR.glob("*.golden"))


def _header(text: str) -> str:
    return "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))


@pytest.mark.parametrize("path", GOLDENS, ids=[p.stem for p in GOLDENS])
def test_golden(path: Path, update_goldens: bool) -> None:
    expected = path.read_text()
    transcript, _, _ = run_transcript(expected)
    actual = _header(expected) + transcript
    if update_goldens and actual != expected:
        path.write_text(actual)
        pytest.skip("golden updated")
    assert actual == expected


def test_every_rule_has_a_golden() -> None:
    names = {p.stem for p in GOLDENS}
    assert {
        "basic_calls",
        "long_return",
        "returns_to_unseen_callers",
        "return_to_unknown",
        "tail_calls",
        "longjmp",
        "intra_function_jumps",
        "untraced_gap",
        "user_syscall",
        "resume_elsewhere",
        "kernel_stacks",
        "decode_error_stitched",
        "decode_error_fresh",
        "equal_timestamps",
        "plt_header",
    } <= names
