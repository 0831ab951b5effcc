"""Fixtures of the emulated backend's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where corpus recordings live for the session (each program is recorded once)."""
    return tmp_path_factory.mktemp("emulated")
