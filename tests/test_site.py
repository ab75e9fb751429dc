"""The reading copy: chapters executed into static HTML with their figures, the frame a reader
expects around them (chapter list, outline, search, prev/next, links), offline, and an index."""

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from mambalearn.classroom import site, slides_offline

ROOT = Path(__file__).resolve().parent.parent
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"


def _nb(title, *cells):
    return new_notebook(cells=[new_markdown_cell(f"# {title}"), *cells])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A site of chapter 01, a tiny chapter 02 with a widget and a wide printed line, and a
    chapter that raises; (out folder, exit status, folder of the notebooks)."""
    tmp = tmp_path_factory.mktemp("site")
    src = tmp / "notebooks"
    src.mkdir()
    tiny = src / "02_tiny.ipynb"
    nbformat.write(_nb("02 · Tiny", new_markdown_cell("## A first section\n\nThe word zebrafish."),
                       new_code_cell("print('w' * 300)"),
                       new_code_cell("from ipywidgets import interact\n_ = interact(lambda k: k, "
                                     "k=(1, 5))"),
                       new_markdown_cell("## A second section")), tiny)
    broken = src / "99_broken.ipynb"
    nbformat.write(_nb("Broken", new_code_cell("1 / 0")), broken)
    out = tmp / "site"
    code = site.main([str(CH01), str(tiny), str(broken), "--out", str(out), "--jobs", "2"])
    return out, code


def test_pages_figures_offline_and_failures(built):
    out, code = built
    assert code == 1, "a chapter that raises must fail the build"
    assert not (out / "99_broken.html").exists()
    page = (out / "01_discretization.html").read_text()
    nb = nbformat.read(CH01, as_version=4)
    figures = [c for c in nb.cells if "plt.show()" in c.source]
    images = re.findall(r"<img[^>]*src=\"data:image/png", page)
    assert len(images) >= len(figures) > 0, "figures missing from the page"
    assert "Traceback" not in page and "application/vnd.jupyter.error" not in page
    assert "raise NotImplementedError" not in page  # the chapter, not an exercise
    assert not re.search(r"<img[^>]*src=\"(?!data:)", page), "an image linked, not embedded"
    printed = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not printed, "notebooks are committed without outputs; the page must have run them"
    for name in ("01_discretization.html", "02_tiny.html", "index.html"):
        html = (out / name).read_text()
        assert slides_offline.remote_urls(html) == [], name  # offline by default
        viewport = re.search(r'<meta[^>]*name="viewport"[^>]*>', html)
        assert viewport and "width=device-width" in viewport.group(0), name
        assert 'href="site.css"' in html and 'src="search-index.js"' in html, name
        assert "prefers-color-scheme: dark" in html, name
    for path in ("vendor/mathjax/MathJax.js", "site.css", "site.js", "search-index.js",
                 "01_discretization.slides.html", "notebooks/01_discretization.ipynb",
                 "exercises/ex01_discretization.ipynb"):
        assert (out / path).exists(), path


def test_every_page_has_the_chapter_list_outline_and_links(built):
    out, _ = built
    page = (out / "01_discretization.html").read_text()
    nav = page.split('<nav class="ml-side">')[1].split("</nav>")[0]
    assert re.findall(r'<li[^>]*><a href="([^"]+\.html)"', nav) == ["01_discretization.html",
                                                                   "02_tiny.html"]
    outline = re.findall(r'<ul class="ml-outline">(.*?)</ul>', nav)[0]
    anchors = re.findall(r'href="#([^"]+)"', outline)
    ids = set(re.findall(r'<h2 id="([^"]+)"', page))
    assert anchors and set(anchors) <= ids, "the outline links the page's own headings"
    bars = re.findall(r'<div class="ml-bar ml-(top|bottom)">(.*?)</div>', page)
    assert [w for w, _ in bars] == ["top", "bottom"]
    assert all('href="02_tiny.html"' in b and 'href="index.html"' in b for _, b in bars)
    tiny = (out / "02_tiny.html").read_text()
    assert 'href="01_discretization.html"' in tiny.split('class="ml-bar ml-top"')[1][:400]
    links = page.split('<div class="ml-links">')[1].split("</div>")[0]
    assert 'href="exercises/ex01_discretization.ipynb"' in links
    assert "make grade NB=exercises/ex01_discretization.ipynb" in links
    assert 'href="01_discretization.slides.html"' in links
    assert 'href="notebooks/01_discretization.ipynb"' in links
    assert "colab" not in links.lower()  # no repository given, no link to a guess
    assert 'href="../exercises/' not in page, "the exercise link points into the site"
    index = (out / "index.html").read_text()
    assert re.findall(r'<li><a href="([^"]+)"', index.split("</nav>")[1]) == [
        "01_discretization.html", "02_tiny.html"]
    assert site.title(nbformat.read(CH01, as_version=4), "") in index


def test_search_index_widgets_and_printed_output(built):
    out, _ = built
    text = (out / "search-index.js").read_text()
    entries = json.loads(text.removeprefix("window.mambalearnIndex = ").rstrip(";\n"))
    tiny = [e for e in entries if e["page"] == "02_tiny.html"]
    assert [e["title"] for e in tiny] == ["02 · Tiny", "A first section", "A second section"]
    assert "zebrafish" in tiny[1]["text"] and "wwww" not in tiny[1]["text"]  # prose, not output
    assert {e["page"] for e in entries} == {"01_discretization.html", "02_tiny.html"}
    page = (out / "02_tiny.html").read_text()
    assert "Interactive in JupyterLab" in page and "widget-view+json" not in page
    assert "embed-amd" not in page, "no widget code to load once widgets are notes"
    css = (out / "site.css").read_text()
    assert re.search(r"\.jp-OutputArea-output pre[^{]*\{[^}]*white-space: pre;[^}]*word-break: "
                     r"normal", css)


def test_colab_link_when_the_repository_is_given(tmp_path):
    c = site.Chapter(Path("notebooks/03_x.ipynb"), "03 · X")
    links = site.links(c, colab="someone/course")
    assert ("https://colab.research.google.com/github/someone/course/blob/main/notebooks/"
            "03_x.ipynb") in links
    with pytest.raises(SystemExit):
        site.main(["--colab", "not a repo", "--out", str(tmp_path)])


def test_in_a_browser_search_theme_and_phone(built, browser):
    from conftest import require_chromium

    require_chromium()
    out, _ = built

    def open_page(name, **context):
        ctx = browser.new_context(offline=True, **context)
        refused = []
        ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                  else (refused.append(r.request.url), r.abort()))
        page = ctx.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto((out / name).resolve().as_uri(), wait_until="load")
        page.wait_for_function("() => !window.MathJax || !MathJax.Hub || "
                               "MathJax.Hub.queue.pending === 0", timeout=60_000)
        return page, refused, errors

    page, refused, errors = open_page("01_discretization.html",
                                      viewport={"width": 1400, "height": 900})
    assert "$$" not in page.inner_text("main"), "raw TeX left on the page"
    page.fill(".ml-search input", "zebrafish")
    hits = page.eval_on_selector_all(".ml-search ol a",
                                     "els => els.map(e => e.getAttribute('href'))")
    assert hits == ["02_tiny.html#A-first-section"], hits
    light = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert page.evaluate("() => document.querySelector('nav.ml-side details').open")
    page.context.close()
    assert not refused and not errors, (refused, errors)

    page, _, _ = open_page("02_tiny.html", color_scheme="dark",
                           viewport={"width": 390, "height": 800})
    dark = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert dark != light and page.evaluate("() => document.body.dataset.jpThemeLight") == "false"
    assert not page.evaluate("() => document.querySelector('nav.ml-side details').open")
    pre = page.locator(".jp-OutputArea-output pre").first
    assert pre.evaluate("e => getComputedStyle(e).whiteSpace") == "pre"
    assert pre.evaluate("e => e.getClientRects().length === 1 && e.scrollWidth > e.clientWidth")
    assert page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth + 1"), \
        "the page is wider than a phone's screen"
    page.context.close()
