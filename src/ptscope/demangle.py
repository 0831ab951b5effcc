"""Readable C++ and Rust names, through binutils' ``c++filt`` (which knows both).

perf demangles the names it prints, but not every one: it gives up on some long names (a
27,000-character template instance stays ``_Z4hugeIJ…``), and a perf built without a
demangler prints every C++ and Rust name mangled. Two ways in, both ``c++filt``:

* :func:`demangle`: many names at once (one process, with and without parameters), for
  picking triggers (``record/symbols.py``);
* :func:`readable_symbol`: one name at a time as a decoder meets it, without parameters as
  perf shows them, through one ``c++filt`` kept running (a line in, a line out), each name
  asked once. Rust names lose their legacy hash (``::h0123…``) and v0 crate
  disambiguators (``crate[1a2b]``), as perf writes them.

Without ``c++filt`` (binutils missing) or when it misbehaves, names stay as they are.

:func:`perf_symbol_names` is the third way, for the own decoder, which names symbols
itself: exactly as perf 6.1 names them (``demangle_sym`` in its ``symbol-elf.c``):
libiberty's ``cplus_demangle`` with no options, which perf links (``ptscope._demangle``,
built where Debian's ``libiberty-dev`` is; ``c++filt --no-params`` in its place
elsewhere, the same for the names seen so far but not guaranteed), then perf's own OCaml
rule for what it leaves (``camlFoo__bar_12`` -> ``Foo.bar_12``), and perf's Rust rule for
a result that still ends in a legacy hash.
"""

from __future__ import annotations

import functools
import re
import select
import shutil
import subprocess
import threading
from collections.abc import Sequence
from typing import Final

__all__ = ["demangle", "is_mangled", "perf_symbol_names", "readable_symbol"]

_TIMEOUT_S: Final = 30.0
# No recursion limit: long template argument lists need more.
_COMMAND: Final = ("c++filt", "--no-params", "--no-recurse-limit")
_LINE_LIMIT: Final = 32_000  # c++filt cuts longer lines from its input
_ARG_LIMIT: Final = 128 * 1024 - 1  # Linux's limit on one argument (MAX_ARG_STRLEN)
_CLONE_SUFFIX: Final = re.compile(
    r"(?:\.(?:cold|part|isra|constprop|lto_priv|localalias)(?:\.\d+)*)+$"
)
_RUST_HASH: Final = re.compile(r"::h[0-9a-f]{16}$")
_RUST_DISAMBIGUATOR: Final = re.compile(r"\[[0-9a-f]+\]")


def is_mangled(name: str) -> bool:
    """Does ``name`` look like an Itanium C++ (or Rust legacy) or a Rust v0 mangled name?"""
    return name.startswith(("_Z", "_R"))


def demangle(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """``mangled -> (with parameters, without)`` for the names ``c++filt`` can demangle
    (none when binutils is missing: such names then match only mangled)."""
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {}
    text = "\n".join(names) + "\n"
    forms = []
    for extra in ([], ["--no-params"]):
        try:
            done = subprocess.run(
                [tool, *extra], input=text, capture_output=True, text=True, timeout=60, check=True
            )
        except (OSError, subprocess.SubprocessError):
            return {}
        forms.append(done.stdout.splitlines())
    full, bare = forms
    if len(full) != len(names) or len(bare) != len(names):
        return {}
    return {m: (f, b) for m, f, b in zip(names, full, bare, strict=True) if f != m}


class _Filter:
    """One ``c++filt --no-params`` process, asked a name per line (started again after a
    name that kills it, up to a few times)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._failed = shutil.which("c++filt") is None
        self._restarts = 3

    def ask(self, name: str) -> str:
        if len(name) > _LINE_LIMIT:
            return _one_off(name)
        with self._lock:
            if self._failed or "\n" in name:
                return name
            try:
                if self._proc is None:
                    self._proc = subprocess.Popen(
                        _COMMAND,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL,
                        text=True,
                        bufsize=1,
                    )
                proc = self._proc
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(name + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], _TIMEOUT_S)
                line = proc.stdout.readline() if ready else ""
            except (OSError, ValueError):
                line = ""
            if not line.endswith("\n"):
                self._stop()
                return name
            return line[:-1]

    def _stop(self) -> None:
        self._restarts -= 1
        self._failed = self._restarts <= 0
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def _one_off(name: str) -> str:
    """``name`` demangled by a ``c++filt`` of its own, given it as an argument (c++filt
    reads at most 32,767 characters a line; an argument may be up to 128 KiB)."""
    if len(name) > _ARG_LIMIT or shutil.which("c++filt") is None:
        return name
    try:
        done = subprocess.run(
            [*_COMMAND, name], capture_output=True, text=True, timeout=_TIMEOUT_S, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return name
    out = done.stdout.removesuffix("\n")
    return out if out and "\n" not in out else name


_filter = _Filter()


@functools.lru_cache(maxsize=65536)
def readable_symbol(name: str) -> str:
    """``name`` demangled the way perf shows names (no parameters), when it is a mangled
    C++ or Rust name that ``c++filt`` knows; else ``name`` itself."""
    if not is_mangled(name):
        return name
    suffix = _CLONE_SUFFIX.search(name)
    base = name[: suffix.start()] if suffix else name
    out = _filter.ask(base)
    if out == base:
        return name
    if base.startswith("_R"):
        out = _RUST_DISAMBIGUATOR.sub("", out)
    else:
        out = _RUST_HASH.sub("", out)  # a Rust legacy name (plain C++ has no such part)
    return out + (suffix.group(0) if suffix else "")


try:  # perf's own demangler: libiberty (built where its headers are)
    from ptscope import _demangle  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover (libiberty-dev missing at install)
    _demangle = None

_OCAML_PREFIX: Final = "caml"
_HEX_DIGITS: Final = frozenset("0123456789abcdefABCDEF")


def _ocaml_name(name: str) -> str | None:
    """perf's ``ocaml_demangle_sym``: ``caml`` and an upper-case letter, then ``__`` is
    ``.`` and ``$xx`` a character."""
    if not (name.startswith(_OCAML_PREFIX) and name[4:5].isupper() and name[4:5].isascii()):
        return None
    out = []
    i, n = 4, len(name)
    while i < n:
        if name[i] == "_" and name[i + 1 : i + 2] == "_":
            out.append(".")
            i += 2
        elif (
            name[i] == "$"
            and name[i + 1 : i + 2] in _HEX_DIGITS
            and name[i + 2 : i + 3] in _HEX_DIGITS
            and i + 2 < n
        ):
            out.append(chr(int(name[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


_RUST_ESCAPES: Final = {
    "$C$": ",", "$SP$": "@", "$BP$": "*", "$RF$": "&", "$LT$": "<", "$GT$": ">",
    "$LP$": "(", "$RP$": ")", "$u20$": " ", "$u27$": "\'", "$u5b$": "[", "$u5d$": "]",
    "$u7e$": "~",
}  # fmt: skip
_RUST_OK: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:.")


def _rust_hashed(name: str) -> bool:
    """perf's ``rust_is_mangled``: ends in ``::h`` and 16 hex digits (5 to 15 distinct)
    after a path of Rust's mangled characters and escapes."""
    if len(name) <= 19 or name[-19:-16] != "::h":
        return False
    digits = name[-16:]
    if any(c not in "0123456789abcdef" for c in digits) or not 5 <= len(set(digits)) <= 15:
        return False
    body = name[:-19]
    i = 0
    while i < len(body):
        c = body[i]
        if c == "$":
            for esc in _RUST_ESCAPES:
                if body.startswith(esc, i):
                    i += len(esc)
                    break
            else:
                return False
        elif c == "." and body.startswith("...", i):
            return False
        elif c in _RUST_OK:
            i += 1
        else:
            return False
    return True


def _rust_unescaped(name: str) -> str:
    """perf's ``rust_demangle_sym``: the escapes, ``..`` and ``.`` undone, the hash cut."""
    body = name[:-19]
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "$":
            for esc, ch in _RUST_ESCAPES.items():
                if body.startswith(esc, i):
                    out.append(ch)
                    i += len(esc)
                    break
            else:
                break  # (perf stops at an unknown escape)
        elif c == "_" and (i == 0 or body[i - 1] == ":") and body[i + 1 : i + 2] == "$":
            i += 1
        elif c == ".":
            if body[i + 1 : i + 2] == ".":
                out.append("::")
                i += 2
            else:
                out.append("-")
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _cplus_names(raw: Sequence[bytes]) -> list[str | None]:
    if _demangle is not None:
        result: list[str | None] = _demangle.demangle(list(raw))
        return result
    # Without libiberty: c++filt without parameters, for the names that look mangled.
    out: list[str | None] = []
    for r in raw:
        name = r.decode("utf-8", "surrogateescape")
        if not is_mangled(name):
            out.append(None)
            continue
        readable = readable_symbol(name)
        out.append(readable if readable != name else None)
    return out


def perf_symbol_names(raw: Sequence[bytes]) -> list[str]:
    """Each symbol name (as the ELF string table has it) as perf 6.1 shows it."""
    out = []
    for r, d in zip(raw, _cplus_names(raw), strict=True):
        if d is None:
            name = r.decode("utf-8", "surrogateescape")
            d = _ocaml_name(name)
            out.append(d if d is not None else name)
        else:
            out.append(_rust_unescaped(d) if _rust_hashed(d) else d)
    return out
