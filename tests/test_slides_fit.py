"""Every chapter's deck in headless Chromium: every slide fits reveal's 960 x 700 box with all its
fragments shown, measured as a presenter sees it (a 960 x 700 window; the slide section's own
scrollWidth and scrollHeight, and the box of what it shows), the arrow key reaches every slide,
and the print view has all its math.

The chapters are found, not listed (every ``notebooks/*.ipynb``). Each deck is built as
``make slides`` builds it (``slides.export``: images embedded, so the temporary folder sees every
figure) from the executed copy the other slide and site tests share
(``course.classroom.execute``). The print view must lay out one page per slide; the first
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
from course.classroom import deck, execute, slides, slides_layout, slides_offline
from course.classroom.pages import prepare as page_copy

require_chromium()

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
ARTIFACTS = Path(os.environ.get("MAMBALEARN_ARTIFACTS", ROOT / "build" / "test-artifacts"))
MIN_FIGURE_FONT = 9  # px on the slide: a figure's smallest label, readable from the back row


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
    cells = page.evaluate(slides_offline.CODE_CELLS)
    # then, on the same page (measuring ends on the first slide), the right arrow as a presenter
    # presses it: every slide and subslide in order
    fragments = page.evaluate("() => document.querySelectorAll('.reveal .fragment').length")
    seen = _arrow_through(page, len(rows) + fragments + 5)
    page.context.close()
    over = [slides_offline.describe(r) for r in rows if not r["fits"]]
    assert not over, f"{notebook.stem}: {len(over)} of {len(rows)} slides do not fit: {over}"
    small = [slides_offline.describe(r) for r in rows if r["font"] < 12]
    assert not small, f"{notebook.stem}: text smaller than 12 px on {small}"
    untitled = [slides_offline.describe(r) for r in rows if not r["title"]]
    assert not untitled, f"{notebook.stem}: slides without a title: {untitled}"
    labels = [(slides_offline.describe(r), round(r["figureFont"], 1)) for r in rows
              if r["figureFont"] < MIN_FIGURE_FONT]
    assert not labels, f"{notebook.stem}: figure labels under {MIN_FIGURE_FONT} px: {labels}"
    broken = [w for r in rows for w in r["broken"]]
    assert not broken, f"{notebook.stem}: output wrapped inside a hyphenated word: {broken[:3]}"
    # each code cell whole on one slide, its output (where it prints or draws) on that slide too
    prepared = slides_layout.prepare(page_copy(execute.executed(notebook), notebook))
    shown = {c.id: c for c in prepared.cells if c.cell_type == "code"}
    for cell in cells:
        source = shown[cell["id"]]
        if cell["code"] is not None:
            assert cell["code"].rstrip() == source.source.rstrip(), \
                f"{notebook.stem}: code cut on slide {cell['slide']}: {cell['code'][:60]!r}"
        prints = any(o.get("text", "").strip() or "image/png" in o.get("data", {})
                     for o in source.get("outputs", []))
        assert cell["output"] or not prints, \
            f"{notebook.stem}: slide {cell['slide']}: code without output: {source.source[:50]!r}"
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


def _figure_png(fontsize, width=10.0):
    """A bar chart ``width`` inches wide with labels at ``fontsize`` points, as the chapters'
    kernel draws it (retina: twice the pixels, shown at its size)."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, 3.4))
    ax.bar(range(3), [1, 2, 3])
    ax.set_title("shapes", fontsize=fontsize)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=2 * fig.dpi)
    plt.close(fig)
    size = [round(width * fig.dpi), round(3.4 * fig.dpi)]
    return base64.b64encode(buf.getvalue()).decode(), size


def test_code_stays_whole_with_its_output_every_slide_has_a_title_and_words_keep_hyphens(
        out, browser, tmp_path):
    """Measured in the deck as a presenter sees it: a code cell that crosses the bottom of a slide
    moves on whole (never cut mid-statement, never parted from its output), a cell taller than
    any slide stays whole (smaller font, or it scrolls inside its slide), a slide that opens with
    code gets its section's title, a wrapped output line never breaks inside a hyphenated file
    name, and a figure's labels are measured in slide pixels (6 pt on a wide chart is too small;
    10 pt is not)."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from course.classroom import slides_layout

    def md(text, kind="-"):
        return new_markdown_cell(text, metadata={"slideshow": {"slide_type": kind}})

    def code(source, text=None, kind="-", png=None, source_font=None):
        cell = new_code_cell(source, metadata={"slideshow": {"slide_type": kind}})
        if text is not None:
            cell.outputs = [new_output("stream", name="stdout", text=text)]
        if png is not None:
            data, (w, h) = png
            cell.outputs = [new_output("display_data", data={"image/png": data,
                                                             "text/plain": "<Figure>"},
                                       metadata={"image/png": {"width": w, "height": h}})]
        return cell

    statement = ("total = combine(\n    first_argument,\n    second_argument,\n"
                 "    third_argument,\n)\n")
    medium = "".join(statement.replace("total", f"total_{i}") for i in range(4))  # 24 lines
    huge = "".join(statement.replace("total", f"value_{i}") for i in range(14))   # 70 lines
    names = " ".join(f"docs/results/ssd-h200-2026-12-0{i}-run.json" for i in range(1, 8))
    cells = [
        md("# A deck", "slide"),
        md("## Section A"),
        md("\n\n".join(f"Paragraph {i} of the slide's prose, long enough to take a line." for i in
                       range(9))),
        code(medium, "".join(f"row {i}\n" for i in range(12))),
        code("print(rows)", "".join(f"line {i}\n" for i in range(6)), kind="subslide"),
        code(huge, "done\n", kind="subslide"),
        code("print(names)", names + "\n", kind="subslide"),
        md("## Figures", "slide"),
        code("ax.set_title('shapes', fontsize=6)", png=_figure_png(6), kind="-"),
        code("ax.set_title('shapes')", png=_figure_png(10), kind="subslide"),
    ]
    nb = new_notebook(cells=cells)
    path = slides.export(tmp_path / "cut.ipynb", out, nb=nb)
    page, _ = slides_offline.open_deck(browser, path, "?transition=none",
                                       slides_offline.PRESENTER)
    rows = slides_offline.measure_page(page)
    found = page.evaluate(slides_offline.CODE_CELLS)
    page.context.close()
    bad = [slides_offline.describe(r) for r in rows if not r["fits"] or r["font"] < 12]
    assert not bad, bad
    assert all(r["title"] for r in rows), [r["title"] for r in rows]
    assert [r["title"] for r in rows].count("Section A") >= 3  # the subslides that open with code
    prepared = {c.id: c for c in slides_layout.prepare(nb).cells if c.cell_type == "code"}
    assert len(found) == len(prepared)  # no cell cut in two: each once, on one slide
    for cell in found:  # every code cell: all its code, and its output on the same slide
        shown = "transient" not in prepared[cell["id"]].metadata  # a figure comes without code
        assert (cell["code"] or "").rstrip() == (prepared[cell["id"]].source.rstrip() if shown
                                                 else ""), cell
        assert cell["output"], f"code and output parted: {cell}"
    assert any(r["scrolls"] for r in rows) or max(r["bottom"] for r in rows) <= deck.HEIGHT
    assert not [r["broken"] for r in rows if r["broken"]]
    fonts = [r["figureFont"] for r in rows if r["figureFont"] < 99]
    assert len(fonts) == 2 and fonts[0] < MIN_FIGURE_FONT <= fonts[1], fonts


def test_a_wrapped_line_broken_at_a_hyphen_is_reported(out, browser, tmp_path):
    """The hyphen measure can fail: a hyphenated word longer than half a line may wrap at a
    hyphen (it could not fit on a line anyway), and the measure reports it."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    word = "-".join(["segment"] * 14)  # 111 characters with no space
    cell = new_code_cell("print(word)", metadata={"slideshow": {"slide_type": "-"}})
    cell.outputs = [new_output("stream", name="stdout", text=("pad " * 10 + word) + "\n")]
    nb = new_notebook(cells=[new_markdown_cell("# Hyphens", metadata={
        "slideshow": {"slide_type": "slide"}}), cell])
    rows = slides_offline.measure(browser, slides.export(tmp_path / "hy.ipynb", out, nb=nb))
    assert rows[0]["broken"], rows
