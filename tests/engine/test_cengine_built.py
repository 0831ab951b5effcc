"""The C engine is optional for users, but not for the test suite: where a C compiler is
present, a C engine that failed to build (setup.py then installs without it, silently)
would let every C-engine test skip. This test makes that loud."""

from __future__ import annotations

import os
import shutil

import pytest

from ptscope.reconstruct import fast_engine


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.skipif(bool(os.environ.get("PTSCOPE_NO_CENGINE")), reason="PTSCOPE_NO_CENGINE")
def test_the_c_engine_is_built() -> None:
    assert fast_engine.is_available(), (
        "the C engine did not build: run `python setup.py build_ext --inplace` to see why"
    )
