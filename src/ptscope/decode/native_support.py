"""Which recordings the own decoder (:mod:`ptscope.decode.native`) decodes, and why not.

Light on purpose (the standard library and the perf.data reader only): the CLI asks it
before it imports numpy and the pipeline, to know whether to start perf early (a decode
that perf makes) or not (one the own decoder makes, with no perf at all).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

from ptscope.decode import perf_data as pd
from ptscope.errors import PtscopeError

__all__ = ["holds_stack_samples", "is_built", "native_support", "read_cached", "unsupported_reason"]


def is_built() -> bool:
    """Whether the own decoder's extension was built (without importing it)."""
    return importlib.util.find_spec("ptscope.decode._ptdecode") is not None


def native_support(data: pd.PerfData) -> str | None:
    """None when the own decoder decodes this perf.data, else why not (one phrase)."""
    info = data.intel_pt
    if info is None:
        return "it holds no Intel PT data"
    pt_attrs = [a for a in data.attrs if a.type == info.pmu_type]
    if not pt_attrs or not any(a.ids for a in pt_attrs):
        return "its Intel PT event has no id"
    timeless = (
        not info.tsc_bit
        or not info.cap_user_time_zero
        or any(not a.sample_type & pd.SAMPLE_TIME for a in data.attrs)
        or any(not a.config & info.tsc_bit for a in pt_attrs)
    )
    if timeless:
        return "its trace has no timestamps"
    if any(not a.exclude_kernel for a in pt_attrs):
        return "it traces the kernel"
    if info.per_cpu_mmaps and info.have_sched_switch not in (2, 3):
        return "it is a per-CPU trace without context-switch records"
    if any(a.sample_type & (1 << 20) for a in data.attrs):  # PERF_SAMPLE_AUX
        return "it samples the AUX area"
    return None


@functools.lru_cache(maxsize=8)
def _read(path: str, size: int, mtime_ns: int) -> pd.PerfData:
    del size, mtime_ns  # (the cache's key: a file written again is read again)
    return pd.read_perf_data(Path(path))


def read_cached(path: Path) -> pd.PerfData:
    """The perf.data at ``path`` (read once while it does not change)."""
    target = path / "data" if path.is_dir() else path
    st = os.stat(target)
    return _read(str(path), st.st_size, st.st_mtime_ns)


def holds_stack_samples(path: Path) -> bool:
    """Whether ``path`` is a sampled perf.data (``perf record -g``: call chains, no Intel
    PT), which is decoded as the sampling backend's recordings are."""
    try:
        data = read_cached(path)
    except (pd.Unsupported, PtscopeError, OSError):
        return False
    return data.intel_pt is None and any(a.sample_type & pd.SAMPLE_CALLCHAIN for a in data.attrs)


def unsupported_reason(path: Path) -> str | None:
    """Why the own decoder does not decode ``path`` (None: it does), read cheaply."""
    if not is_built():
        return "it is not built"
    try:
        return native_support(read_cached(path))
    except pd.Unsupported as e:
        return f"it does not read {e}"
    except (PtscopeError, OSError) as e:
        return f"the perf.data cannot be read ({e})"
