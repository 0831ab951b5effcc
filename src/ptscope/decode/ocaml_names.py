"""OCaml functions that perf names by a label: ``Module.code_begin``.

``ocamlopt`` marks where each module's code begins and ends with labels
(``camlModule__code_begin``, ``camlModule__code_end``) at the address of the module's first
function (and of the next module's), and perf sometimes prefers the label to the function
symbol at the same address: the first function of every module, ``caml_program`` included,
shows as ``Module.code_begin``. The function's own name comes from the binary's symbol table
(read once per binary), spelt as perf spells OCaml names (``camlStdlib__Printf__fprintf_171``
-> ``Stdlib.Printf.fprintf_171``).
"""

from __future__ import annotations

import functools
import logging
import re
from pathlib import Path
from typing import Final

from ptscope.decode.binary_files import local_binary

__all__ = ["is_ocaml_label", "ocaml_function_name", "perf_ocaml_name"]

log = logging.getLogger("ptscope")

_LABEL: Final = re.compile(r"(?:\.|__)code_(?:begin|end)$")
_ESCAPE: Final = re.compile(r"\$([0-9a-fA-F]{2})")


def is_ocaml_label(symbol: str) -> bool:
    """Is ``symbol`` (as perf prints it) one of ocamlopt's code_begin/code_end labels?"""
    return symbol.endswith(("code_begin", "code_end")) and _LABEL.search(symbol) is not None


def perf_ocaml_name(raw: str) -> str:
    """An OCaml symbol as perf prints it: ``caml`` and an upper-case letter start a mangled
    name, ``__`` separates modules, ``$xx`` escapes a character."""
    if not (raw.startswith("caml") and raw[4:5].isupper()):
        return raw
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), raw[4:].replace("__", "."))


def ocaml_function_name(symbol: str, dso: str) -> str:
    """The function at the address of the label ``symbol`` in ``dso`` (perf's spelling), or
    ``symbol`` when there is none or the binary cannot be read."""
    raw = symbol if "." not in symbol else "caml" + symbol.replace(".", "__")
    path = local_binary(dso)
    found = _functions_at_labels(str(path)).get(raw) if path is not None else None
    return perf_ocaml_name(found) if found else symbol


@functools.lru_cache(maxsize=64)
def _functions_at_labels(path: str) -> dict[str, str]:
    """label -> the function symbol at the label's address (sized, the first one seen), in
    the binary at ``path``."""
    # Imported here: most decodes never look for OCaml labels (pyelftools costs 20 ms).
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        with open(Path(path), "rb") as f:
            labels: dict[int, list[str]] = {}
            functions: dict[int, str] = {}
            for section in ELFFile(f).iter_sections():
                if not isinstance(section, SymbolTableSection):
                    continue
                for sym in section.iter_symbols():
                    kind = sym["st_info"]["type"]
                    if kind == "STT_FUNC" and sym["st_size"]:
                        functions.setdefault(sym["st_value"], sym.name)
                    elif kind == "STT_NOTYPE" and _LABEL.search(sym.name):
                        labels.setdefault(sym["st_value"], []).append(sym.name)
    except (OSError, ELFError, ValueError) as e:
        log.debug("OCaml labels of %s: %s", path, e)
        return {}
    return {
        label: functions[address]
        for address, names in labels.items()
        if address in functions
        for label in names
    }
