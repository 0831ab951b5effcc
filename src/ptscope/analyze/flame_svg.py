"""Draws a :class:`ptscope.analyze.flame.FlameModel` as one interactive SVG file.

Every box is drawn by this module (so the picture shows in any SVG viewer, script or
not); the embedded script (``flame.js``, ours) adds the details line on hover, zoom on
click (Esc or "Reset zoom" to go back) and the search box (a regular expression,
case-insensitive; the share of time the matches cover is shown, nested matches counted
once). A flame graph grows upwards from the top-level calls; a flame chart reads
top-down like a timeline, one band per thread.
"""

from __future__ import annotations

import colorsys
import re
import zlib
from importlib import resources
from typing import Final

from ptscope.analyze.calls import format_ns
from ptscope.analyze.flame import Box, FlameModel

__all__ = ["render_svg"]

WIDTH: Final = 1200
PAD: Final = 10
ROW: Final = 17
BOX_HEIGHT: Final = 16
HEADER: Final = 56
FOOTER: Final = 34
LANE_LABEL: Final = 18
LANE_GAP: Final = 8
CHAR_WIDTH: Final = 6.6  # 11 px monospace: what the script assumes too

_STYLE: Final = """
text { font-family: monospace; font-size: 11px; fill: #222; }
.title { font-size: 17px; font-weight: bold; }
.subtitle { fill: #555; }
.lane { font-weight: bold; fill: #444; }
.f { cursor: pointer; }
.f text { pointer-events: none; }
.f:hover rect { stroke: #000; stroke-width: 0.8; }
.f.caller rect { opacity: 0.5; }
.f.hit rect { fill: #c81e8c; }
#reset { cursor: pointer; fill: #1a5fb4; text-decoration: underline; }
#search { box-sizing: border-box; width: 100%; height: 22px; font: 12px monospace; }
"""
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: str) -> str:
    """XML character data: escaped, without the characters XML cannot hold."""
    value = value.encode("utf-8", "replace").decode("utf-8")
    value = _CONTROL.sub("\ufffd", value)
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(value: str) -> str:
    return _text(value).replace('"', "&quot;")


def _colour(name: str) -> str:
    """A warm colour from the name (the same name, the same colour, in every file);
    ``[...]`` pseudo-frames (untraced, syscall, decode errors) are grey-blue."""
    if name.startswith("["):
        return "#a9bccf"
    h = zlib.crc32(name.encode("utf-8", "replace"))
    hue = (4 + h % 46) / 360
    light = (56 + (h >> 8) % 14) / 100
    saturation = (72 + (h >> 16) % 22) / 100
    r, g, b = colorsys.hls_to_rgb(hue, light, saturation)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _diff_colour(delta: int, scale: int) -> str:
    """A differential box: red where its self value grew, blue where it shrank, from
    near-white (no change) to full colour at the largest change in the drawing."""
    if delta == 0 or scale <= 0:
        return "#e8e6e1"
    strength = 0.2 + 0.8 * min(abs(delta) / scale, 1.0)
    red, blue = (214, 39, 40), (31, 96, 196)
    target = red if delta > 0 else blue
    r, g, b = (round(250 + (c - 250) * strength) for c in target)
    return f"#{r:02x}{g:02x}{b:02x}"


def _label(name: str, pixels: float) -> str:
    room = int((pixels - 6) // CHAR_WIDTH)
    if room < 3:
        return ""
    return name if len(name) <= room else name[: room - 2] + ".."


def _script() -> str:
    source = resources.files("ptscope.analyze").joinpath("flame.js").read_text("utf-8")
    return source.replace("]]>", "]]]]><![CDATA[>")


def _box_rows(model: FlameModel) -> tuple[list[int], int]:
    """The y of each band's first row (charts) or of the bottom row (graphs), and the
    drawing's height."""
    if model.kind == "graph":
        rows = max(model.lane_depths[0], 1)
        return [HEADER + (rows - 1) * ROW], HEADER + rows * ROW + FOOTER
    tops = []
    y = HEADER
    for depth in model.lane_depths:
        tops.append(y + LANE_LABEL)
        y += LANE_LABEL + max(depth, 1) * ROW + LANE_GAP
    return tops, y + FOOTER


def _amount(model: FlameModel, value: int) -> str:
    return format_ns(value) if model.unit == "ns" else f"{value:,} {model.unit}"


def _describe(model: FlameModel, box: Box) -> str:
    def share(ns: int) -> str:
        return f"{100 * ns / model.base_ns:.1f}%" if model.base_ns else "-"

    when = (
        f"{box.calls} call{'s' * (box.calls != 1)}"
        if model.kind == "graph"
        else f"at {format_ns(model.origin_ns + box.x)}"
    )
    change = ""
    if box.delta is not None:
        before = box.self_ns - box.delta
        relative = f" ({100 * box.delta / before:+.1f}%)" if before else " (new)"
        change = f", self change {box.delta:+,}{relative if box.delta else ''}"
    return (
        f"{box.name.replace(chr(10), ' ')}\n{_amount(model, box.width)} ({share(box.width)}), "
        f"self {_amount(model, box.self_ns)} ({share(box.self_ns)}){change}, {when}"
    )


def render_svg(model: FlameModel, *, title: str, subtitle: str = "") -> str:
    """The whole SVG document."""
    lane_y, height = _box_rows(model)
    scale = (WIDTH - 2 * PAD) / max(model.total, 1)
    out: list[str] = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" data-kind="{model.kind}" '
        f'data-total="{model.total}" data-base="{model.base_ns}" '
        f'data-origin="{model.origin_ns}" data-pad="{PAD}" data-char="{CHAR_WIDTH}" '
        f'data-unit="{_attr(model.unit)}">\n',
        f"<style>{_STYLE}</style>\n",
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fbfaf5"/>\n',
        f'<text class="title" x="{PAD}" y="22">{_text(title)}</text>\n',
        f'<text class="subtitle" x="{PAD}" y="40">{_text(subtitle)}</text>\n',
        f'<text id="reset" x="{WIDTH - 430}" y="27" text-anchor="end" '
        'style="visibility:hidden">Reset zoom</text>\n',
        f'<foreignObject x="{WIDTH - 420}" y="10" width="{410}" height="26">'
        '<input xmlns="http://www.w3.org/1999/xhtml" id="search" type="search" '
        'placeholder="search: a regular expression (Ctrl-F or /)" spellcheck="false"/>'
        "</foreignObject>\n",
        f'<text id="details" x="{PAD}" y="{height - 12}">'
        "hover a box for details, click it to zoom</text>\n",
        f'<text id="matched" x="{WIDTH - PAD}" y="{height - 12}" text-anchor="end"></text>\n',
    ]
    if model.kind == "chart":
        for lane, (label, top) in enumerate(zip(model.lanes, lane_y, strict=True)):
            out.append(
                f'<text class="lane" x="{PAD}" y="{top - 5}">{_text(label)}'
                f"{'' if model.lane_depths[lane] else ' (no call wide enough to draw)'}"
                "</text>\n"
            )
    out.append('<g id="boxes">\n')
    scale_delta = max((abs(b.delta) for b in model.boxes if b.delta is not None), default=0)
    for box in model.boxes:
        colour = _colour(box.name) if box.delta is None else _diff_colour(box.delta, scale_delta)
        changed = "" if box.delta is None else f' data-dd="{box.delta}"'
        if model.kind == "graph":
            y = lane_y[0] - box.depth * ROW
        else:
            y = lane_y[box.lane] + box.depth * ROW
        left = PAD + box.x * scale
        pixels = box.width * scale
        out.append(
            f'<g class="f" data-x="{box.x}" data-w="{box.width}" data-d="{box.depth}" '
            f'data-l="{box.lane}" data-s="{box.self_ns}" data-c="{box.calls}"{changed}>'
            f"<title>{_text(_describe(model, box))}</title>"
            f'<rect x="{left:.2f}" y="{y}" width="{max(pixels, 0.3):.2f}" '
            f'height="{BOX_HEIGHT}" rx="1.5" fill="{colour}"/>'
            f'<text x="{left + 3:.2f}" y="{y + 12}">{_text(_label(box.name, pixels))}</text>'
            "</g>\n"
        )
    out.append("</g>\n")
    out.append(f"<script><![CDATA[\n{_script()}]]></script>\n</svg>\n")
    return "".join(out)
