"""Every chapter's deck in headless Chromium: every slide fits reveal's 960 x 700 box with all its
fragments shown, measured as a presenter sees it (a 960 x 700 window; the slide section's own
scrollWidth and scrollHeight, and the box of what it shows), the arrow key reaches every slide,
and the print view has all its math.

The chapters are found, not listed (every ``notebooks/*.ipynb``). Each deck is built as
``make slides`` builds it (``slides.export``: images embedded, so the temporary folder sees every
figure) from the executed copy the other slide and site tests share
(``mambalearn.classroom.execute``). The print view must lay out one page per slide; the first
chapter's is printed to a PDF (its pages counted; kept for an instructor to skim in
``build/test-artifacts/slides/``, ``MAMBALEARN_ARTIFACTS`` moves it), the others' pages are
counted in the page (printing every deck took a quarter of this test's time), and
``make slides`` prints any deck.
"""

import os
import re
from pathlib import Path

import pytest

from conftest import require_chromium
from mambalearn.classroom import deck, slides, slides_offline

require_chromium()

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = Path(os.environ.get("MAMBALEARN_ARTIFACTS", ROOT / "build" / "test-artifacts"))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("decks")


WHERE = """() => [Reveal.getIndices().h, Reveal.getIndices().v,
                   Reveal.isLastSlide() && !Reveal.availableFragments().next]"""


def _arrow_through(page, presses):
    """Press → until the deck's end (at most ``presses`` times): every [h, v] shown, in order."""
    seen = []
    for _ in range(presses):
        h, v, end = page.evaluate(WHERE)
        if not seen or seen[-1] != [h, v]:
            seen.append([h, v])
        if end:
            break
        page.keyboard.press("ArrowRight")
    return seen


MATH = """() => {
    const sources = [...document.querySelectorAll('script[type^="math/tex"]')];
    const missing = sources.filter((s) => {
        const f = document.getElementById(s.id + '-Frame');
        return !f || f.getBoundingClientRect().width === 0;
    });
    return [sources.length, missing.map((s) => s.textContent.slice(0, 40))];
}"""


@pytest.mark.parametrize("notebook", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_deck_fits_navigates_and_prints(notebook, out, browser):
    path = slides.export(notebook, out)
    # measured as a presenter sees it: a 960 x 700 window, every fragment shown, the size of
    # each slide section (scrollWidth x scrollHeight) and of what it shows
    page, _ = slides_offline.open_deck(browser, path, "?transition=none",
                                       slides_offline.PRESENTER)
    rows = slides_offline.measure_page(page)
    assert rows and all(r["shown"] for r in rows), "a fragment left hidden while measuring"
    # then, on the same page (measuring ends on the first slide), the right arrow as a presenter
    # presses it: every slide and subslide in order
    fragments = page.evaluate("() => document.querySelectorAll('.reveal .fragment').length")
    seen = _arrow_through(page, len(rows) + fragments + 5)
    page.context.close()
    over = [slides_offline.describe(r) for r in rows if not r["fits"]]
    assert not over, f"{notebook.stem}: {len(over)} of {len(rows)} slides do not fit: {over}"
    small = [slides_offline.describe(r) for r in rows if r["font"] < 12]
    assert not small, f"{notebook.stem}: text smaller than 12 px on {small}"
    assert seen == [[r["h"], r["v"]] for r in rows], f"{notebook.stem}: → showed {seen}"

    # the print view: every formula typeset (none left blank), one page per slide
    page, refused = slides_offline.open_deck(browser, path, "?print-pdf")
    n_math, missing = page.evaluate(MATH)
    text = page.inner_text(".reveal .slides")
    pages = page.evaluate("() => document.querySelectorAll('.reveal .pdf-page').length")
    if notebook == CHAPTERS[0]:  # printed: the page count of the PDF is the print view's
        pdf = ARTIFACTS / "slides" / f"{notebook.stem}.pdf"
        pdf.parent.mkdir(parents=True, exist_ok=True)
        page.pdf(path=str(pdf), prefer_css_page_size=True, print_background=True)
        assert len(re.findall(rb"/Type\s*/Page\b", pdf.read_bytes())) == pages
    page.context.close()
    assert not refused, f"the deck asked the network for {refused[:3]}"
    assert not missing, f"{notebook.stem}: {len(missing)} of {n_math} formulas not shown: {missing}"
    assert "$$" not in text, "raw TeX left on the slides"
    assert pages == len(rows), (pages, len(rows))


@pytest.mark.parametrize("kind", ["-", "fragment"])
def test_a_slide_that_cannot_fit_is_reported(kind, out, browser, tmp_path):
    """The check fails where it should: an output with an unbreakable 400-character token, on the
    slide itself or in a fragment (measured with every fragment shown)."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    cell = new_code_cell("print(token)", metadata={"slideshow": {"slide_type": kind}})
    cell.outputs = [new_output("stream", name="stdout", text="x" * 400 + "\n")]
    nb = new_notebook(cells=[new_markdown_cell("# Too wide", metadata={
        "slideshow": {"slide_type": "slide"}}), cell])
    path = slides.export(tmp_path / "wide.ipynb", out, nb=nb)
    rows = slides_offline.measure(browser, path)
    assert [r["fits"] for r in rows] == [False]
    assert rows[0]["right"] > deck.WIDTH and "Too wide" in slides_offline.describe(rows[0])


def test_the_slide_sections_own_size_is_measured(out, browser, tmp_path):
    """What a presenter sees is the slide section: room it takes below its last line (padding,
    a margin; no text box reaches there) fails the check; a slide whose content had to be
    zoomed keeps the section 960 px wide."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    tall = new_markdown_cell('<div style="height: 690px"></div><p>bottom line</p>',
                             metadata={"slideshow": {"slide_type": "-"}})
    wide = new_code_cell("print(row)", metadata={"slideshow": {"slide_type": "subslide"}})
    wide.outputs = [new_output("stream", name="stdout", text=" ".join(["w" * 60] * 3) + "\n")]
    nb = new_notebook(cells=[new_markdown_cell("# Tall", metadata={
        "slideshow": {"slide_type": "slide"}}), tall, wide])
    path = slides.export(tmp_path / "tall.ipynb", out, nb=nb)
    page, _ = slides_offline.open_deck(browser, path, "?transition=none",
                                       slides_offline.PRESENTER)
    rows = slides_offline.measure_page(page)
    assert rows and all(r["fits"] and r["width"] <= deck.WIDTH for r in rows), rows
    assert page.evaluate("() => document.querySelectorAll('section > .ml-zoom').length") >= 1
    page.evaluate("() => { Reveal.getSlides()[0].style.paddingBottom = '400px'; }")
    again = slides_offline.measure_page(page)
    page.context.close()
    assert not again[0]["fits"] and again[0]["height"] > deck.HEIGHT
    assert again[0]["bottom"] == rows[0]["bottom"], "the text boxes did not move"
    assert f"x{again[0]['height']} px" in slides_offline.describe(again[0])
