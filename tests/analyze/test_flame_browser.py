"""The flame graph and flame chart SVGs in a real browser (headless Chromium): boxes are
drawn, the script runs without an error, and hover, click-to-zoom, Esc and search do what
they say. Skipped, saying why, where Chromium is not installed (`make test` installs
Debian's `chromium` when run as root)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ptscope.fxt import write_timeline
from ptscope.timeline import Timeline
from support.cli import ptscope
from support.headless_browser import HeadlessChromium, Page, find_chromium, open_file
from support.timeline_strategies import thread_of_rows

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (apt-get install chromium; `make test` does it as root)",
)

NAMES = ["main", "parse_input", "compute", "leaf_multiply", "leaf_add", "[syscall]", "log"]


def program_trace(path: Path) -> None:
    """Two threads: main > parse_input > leaf_add; main > compute > compute (recursion)
    > leaf_multiply; a syscall; a second thread running log > leaf_add."""
    rows = [
        (0, 10_000, 0, 0),
        (100, 3_000, 1, 1),
        (200, 1_200, 2, 4),
        (1_500, 2_500, 2, 5),
        (3_200, 9_500, 1, 2),
        (3_400, 8_000, 2, 2),
        (3_600, 7_000, 3, 3),
        (8_200, 9_300, 2, 4),
    ]
    other = [(1_000, 6_000, 0, 6), (1_500, 5_000, 1, 4)]
    timeline = Timeline(
        names=NAMES,
        threads=[thread_of_rows(7, 7, rows), thread_of_rows(7, 8, other)],
        processes={7: "demo"},
    )
    timeline.threads[0].name = "demo"
    timeline.threads[1].name = "logger"
    write_timeline(timeline, path)


@pytest.fixture(scope="module")
def browser() -> HeadlessChromium:
    with HeadlessChromium(width=1200, height=500) as chromium:
        yield chromium  # type: ignore[misc]


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(np.int32)


def warm(image: np.ndarray) -> int:
    """Pixels in the boxes' colours (reds to yellows), not the page's near-white."""
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    return int(((r > 180) & (b < 150) & (r >= g)).sum())


def magenta(image: np.ndarray) -> int:
    """Pixels of search hits."""
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    return int(((r > 150) & (g < 80) & (b > 100)).sum())


def box_width(page: Page, name: str) -> float:
    return float(
        page.evaluate(
            "(function(){for (const g of document.querySelectorAll('g.f')) {"
            f"if (g.querySelector('title').textContent.split('\\n')[0] === {name!r}) "
            "return g.getBoundingClientRect().width;} return -1;})()"
        )
    )


@pytest.mark.parametrize("chart", [False, True], ids=["graph", "chart"])
def test_svg_draws_and_reacts_in_chromium(
    tmp_path: Path, browser: HeadlessChromium, chart: bool
) -> None:
    trace, svg = tmp_path / "t.fxt.gz", tmp_path / "flame.svg"
    program_trace(trace)
    done = ptscope("flame", str(trace), "-o", str(svg), *(["--chart"] if chart else []))
    assert done.returncode == 0, done.stderr
    page = open_file(browser, svg)
    boxes = page.evaluate("document.querySelectorAll('g.f').length")
    assert boxes >= 8
    # The script ran to its end (it says how many boxes it manages).
    assert page.evaluate("document.documentElement.getAttribute('data-ready')") == str(boxes)
    before = pixels(page.screenshot())
    (tmp_path / "before.png").write_bytes(page.screenshot())
    assert warm(before) > 20_000, "no boxes drawn"
    assert magenta(before) == 0

    # Hover: the details line names the box, its time and its share.
    details = page.evaluate(
        "(function(){const g = [...document.querySelectorAll('g.f')].find(g => "
        "g.querySelector('title').textContent.startsWith('compute\\n'));"
        "g.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
        "return document.getElementById('details').textContent;})()"
    )
    assert details.startswith("compute \u2014 ") and "%" in details and "self" in details

    # Click zooms: the clicked box spans the width; others outside it disappear.
    full = 1200 - 2 * 10
    wide_before = box_width(page, "parse_input")
    page.evaluate(
        "[...document.querySelectorAll('g.f')].find(g => g.querySelector('title')"
        ".textContent.startsWith('parse_input\\n')).dispatchEvent("
        "new MouseEvent('click', {bubbles: true}))"
    )
    assert box_width(page, "parse_input") == pytest.approx(full, abs=1)
    assert box_width(page, "leaf_multiply") <= 0  # outside parse_input: hidden
    assert page.evaluate("getComputedStyle(document.getElementById('reset')).visibility") == (
        "visible"
    )
    zoomed = pixels(page.screenshot())
    (tmp_path / "zoomed.png").write_bytes(page.screenshot())
    assert warm(zoomed) > warm(before) / 4
    # Esc goes back.
    page.evaluate("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape'}))")
    assert box_width(page, "parse_input") == pytest.approx(wide_before, abs=0.5)

    # Search: the boxes that match turn magenta, and their share is shown (leaf_add and
    # leaf_multiply never nest in each other: their times add up).
    matched = page.evaluate(
        "(function(){const s = document.getElementById('search'); s.value = 'LEAF_';"
        "s.dispatchEvent(new Event('input')); "
        "return [document.querySelectorAll('g.f.hit').length, "
        "document.getElementById('matched').textContent];})()"
    )
    # leaf_add 1000 + 1100 + 3500 ns, leaf_multiply 3400 ns, of 10000 + 5000 ns.
    assert matched == [4, "matched: 60.0% of the time, 4 boxes"]
    found = pixels(page.screenshot())
    (tmp_path / "search.png").write_bytes(page.screenshot())
    assert magenta(found) > 500
    page.evaluate(
        "(function(){const s = document.getElementById('search'); s.value = '';"
        "s.dispatchEvent(new Event('input'));})()"
    )
    assert page.evaluate("document.querySelectorAll('g.f.hit').length") == 0
    assert page.errors() == []


def test_differential_graph_in_chromium(tmp_path: Path, browser: HeadlessChromium) -> None:
    """flame --diff on two emulated runs (an extra loop in `work`): the grown boxes are
    red, nothing is blue, and hover and search speak in instructions."""
    from support.programs import build

    traces = []
    for name, extra in (("before", []), ("after", ["-DEXTRA_LOOP"])):
        out = tmp_path / f"{name}.fxt.gz"
        done = ptscope(
            "run", "--backend", "emulated", "--deterministic", "-o", str(out), "--",
            str(build("diff_work", extra=extra)), "20",
        )  # fmt: skip
        if "emulated backend" in done.stderr and done.returncode not in (0, 1):
            pytest.skip(done.stderr.strip())
        assert done.returncode in (0, 1), done.stderr
        traces.append(str(out))
    svg = tmp_path / "diff.svg"
    done = ptscope("flame", "--diff", *traces, "-o", str(svg))
    assert done.returncode == 0, done.stderr
    page = open_file(browser, svg)
    boxes = page.evaluate("document.querySelectorAll('g.f').length")
    assert page.evaluate("document.documentElement.getAttribute('data-ready')") == str(boxes)
    image = pixels(page.screenshot())
    r, g, b = image[..., 0], image[..., 1], image[..., 2]
    assert int(((r > 180) & (g < 120) & (b < 120)).sum()) > 300, "no red box"
    assert int(((b > 150) & (r < 120)).sum()) == 0, "a blue box, though nothing shrank"
    details = page.evaluate(
        "(function(){const g = [...document.querySelectorAll('g.f')].find(g => "
        "g.querySelector('title').textContent.startsWith('work\\n'));"
        "g.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));"
        "return document.getElementById('details').textContent;})()"
    )
    assert details.startswith("work \u2014 ") and " instructions (" in details
    assert "self change +" in details
    matched = page.evaluate(
        "(function(){const s = document.getElementById('search'); s.value = '^work$';"
        "s.dispatchEvent(new Event('input')); "
        "return document.getElementById('matched').textContent;})()"
    )
    assert matched.startswith("matched: ") and "of the instructions, 1 box" in matched
    assert page.errors() == []
