"""Tables that fit their terminal (``stats``, ``diff``): the function column keeps a
readable width, a name longer than it is shortened in the middle (``…``), and the other
columns give way, the least important first; ``--wide`` keeps everything.

Pure text arithmetic (rich only measures and prints): :func:`fit` chooses what is shown,
:func:`render` prints it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["Fitted", "fit", "render", "shorten_middle"]

NAME_MIN: Final = 30
"""The function column's width, at least (or its longest name, when shorter)."""
GAP: Final = 2
"""Spaces between two columns."""
PIPED_WIDTH: Final = 160
"""The width of a table written into a pipe or a file (no terminal to ask)."""


def shorten_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start and its end with ``…`` between
    (the end kept one longer: it tells overloads and template arguments apart)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = (width - 1) // 2
    tail = width - 1 - head
    return text[:head] + "…" + text[len(text) - tail :]


def _width(text: str) -> int:
    from rich.cells import cell_len

    return int(cell_len(text))


@dataclass
class Fitted:
    """What of a table is shown: the columns kept (indexes, in order), the name column's
    width, the headers of the columns left out."""

    columns: list[int]
    name_width: int
    left_out: list[str]


def fit(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int | None,
    drop_order: Sequence[int],
    labels: Sequence[str] | None = None,
) -> Fitted:
    """Choose the columns of a table whose column 0 is the function's name, to fit in
    ``width`` characters (None: no limit, every column and whole names): the name column
    gets at least :data:`NAME_MIN` (its longest name, if shorter); while the rest does not
    fit beside it, the next column of ``drop_order`` is left out; the name column then
    takes what is left, up to its longest name. ``labels``: how the columns left out are
    named (default their headers)."""
    natural = [max([_width(h), *(_width(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    kept = list(range(len(headers)))
    if width is None:
        return Fitted(kept, natural[0], [])
    name_floor = min(natural[0], NAME_MIN)

    def others(columns: list[int]) -> int:
        return sum(natural[i] + GAP for i in columns if i != 0)

    dropping = [i for i in drop_order if 0 < i < len(headers)]
    while dropping and name_floor + others(kept) > width:
        kept.remove(dropping.pop(0))
    name_width = max(name_floor, min(natural[0], width - others(kept)))
    named = labels or headers
    left_out = [named[i] for i in range(len(headers)) if i not in kept]
    return Fitted(kept, name_width, left_out)


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    drop_order: Sequence[int],
    wide: bool,
    labels: Sequence[str] | None = None,
    piped_width: int = PIPED_WIDTH,
) -> None:
    """Print the table on stdout, fitted to its terminal (``piped_width`` when it is
    none), with a line naming the columns left out."""
    from rich.console import Console
    from rich.table import Table

    terminal = sys.stdout.isatty()
    probe = Console(file=sys.stdout)
    width = None if wide else (probe.width if terminal else piped_width)
    fitted = fit(headers, rows, width, drop_order, labels)
    used = fitted.name_width + sum(
        max([_width(headers[i]), *(_width(r[i]) for r in rows)]) + GAP
        for i in fitted.columns
        if i != 0
    )
    console = Console(
        file=sys.stdout,
        width=max(used, width or 0),
        no_color=not terminal,
        highlight=False,
        markup=False,
    )
    table = Table(header_style="bold", box=None, pad_edge=False, padding=(0, GAP // 2))
    for i in fitted.columns:
        if i == 0:
            table.add_column(headers[0], no_wrap=True, min_width=fitted.name_width)
        else:
            table.add_column(headers[i], justify="right", no_wrap=True)
    for row in rows:
        cells = [
            shorten_middle(row[0], fitted.name_width) if i == 0 else row[i] for i in fitted.columns
        ]
        table.add_row(*cells)
    console.print(table)
    if fitted.left_out:
        console.print(
            f"(left out to fit {width} columns: {', '.join(fitted.left_out)}; --wide for all)"
        )
