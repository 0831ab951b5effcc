"""Locating the compiled perf dlfilter (``dlfilter.so``) that ``pip install`` builds."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DLFILTER_NAME", "dlfilter_path", "is_available"]

DLFILTER_NAME = "dlfilter.so"


def dlfilter_path() -> Path:
    """Where the dlfilter shared object is (or would be) installed."""
    return Path(str(resources.files(__name__) / DLFILTER_NAME))


def is_available() -> bool:
    """Whether the dlfilter was built (``pip install`` with perf's headers present)."""
    return dlfilter_path().is_file()
