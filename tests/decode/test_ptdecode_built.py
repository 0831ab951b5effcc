"""The own decoder and the demangler are optional for users (without them perf decodes,
and c++filt demangles), but not for the test suite: where a C compiler is present, one
that failed to build (setup.py then installs without it, silently) would send every decode
to perf and let the own decoder's tests skip. This test makes that loud."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from ptscope.decode import native


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.skipif(bool(os.environ.get("PTSCOPE_NO_PTDECODE")), reason="PTSCOPE_NO_PTDECODE")
def test_the_own_decoder_is_built() -> None:
    assert native.is_available(), (
        "the own decoder did not build: run `python setup.py build_ext --inplace` to see why"
    )


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler")
@pytest.mark.skipif(bool(os.environ.get("PTSCOPE_NO_DEMANGLE")), reason="PTSCOPE_NO_DEMANGLE")
def test_the_demangler_is_built() -> None:
    assert importlib.util.find_spec("ptscope._demangle") is not None, (
        "the demangler did not build (libiberty-dev?): run `python setup.py build_ext "
        "--inplace` to see why"
    )
