"""Offline decks: every asset local, opens in Chromium with the network blocked, math typeset.

Needs Debian's chromium (`make browser`) and npm (reveal.js, MathJax... come from the npm registry
into build/vendor). The screenshot of a slide with rendered math is kept as a test artifact in
build/test-artifacts/slides_offline.png.
"""

import os
import re
from pathlib import Path

import nbformat
import pytest

from conftest import require_chromium
from course.classroom import slides, slides_offline

require_chromium()

ROOT = Path(__file__).resolve().parent.parent
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"
ARTIFACTS = Path(os.environ.get("MAMBALEARN_ARTIFACTS", ROOT / "build" / "test-artifacts"))


@pytest.fixture(scope="module")
def deck(tmp_path_factory):
    return slides.export(CH01, tmp_path_factory.mktemp("slides"), offline=True)


def _kinds():
    return [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(CH01, as_version=4).cells]


def test_every_asset_is_local_and_present(deck):
    html = deck.read_text()
    assert slides_offline.remote_urls(html) == []
    urls = re.findall(r"<(?:script|link)\b[^>]*?(?:src|href)=\"([^\"#:]+)\"", html)
    urls += re.findall(r"[\"'](vendor/[^\"']+)[\"']", html)  # require() and the widget manager
    paths = {u.split("?")[0] for u in urls}
    assert {"vendor/reveal.js/dist/reveal.js", "vendor/reveal.js/plugin/notes/notes.js",
            "vendor/reveal.js/dist/theme/simple.css", "vendor/requirejs/require.js",
            "vendor/mathjax/MathJax.js", "vendor/jquery/dist/jquery.min.js"} <= paths, paths
    # widgets are drawn statically, as on the site (pages.static_widgets): no live widget manager
    assert not any("html-manager" in p for p in paths), paths
    missing = [p for p in paths if not (deck.parent / p).exists()]
    assert not missing, missing
    vendor = deck.parent / "vendor"
    assert list((vendor / "mathjax/fonts/HTML-CSS/TeX/woff").glob("*.woff"))
    theme = (vendor / "reveal.js/dist/theme/simple.css").read_text()
    assert "googleapis" not in theme and "@fontsource/lato/400.css" in theme
    assert html.count('<aside class="notes"') == _kinds().count("notes") > 0  # speaker notes
    figures = [c for c in nbformat.read(CH01, as_version=4).cells if "plt.show()" in c.source
               and c.metadata["slideshow"]["slide_type"] != "skip"]
    images = re.findall(r"<img[^>]*src=\"data:image/png", html)
    assert len(images) >= len(figures) > 0, "figures missing (executed with MPLBACKEND=Agg?)"


def test_deck_opens_offline_with_math_rendered(deck, browser):
    page, refused = slides_offline.open_deck(browser, deck)
    failed = []
    page.on("requestfailed", lambda r: failed.append(r.url))
    assert refused == [], f"the deck asked the network for {refused}"
    kinds = _kinds()
    n_slides = page.evaluate("() => document.querySelectorAll('.reveal .slides > section').length")
    assert n_slides == kinds.count("slide")
    math = page.evaluate("() => document.querySelectorAll('.reveal .MathJax_CHTML').length")
    assert math > 10, "MathJax typeset (almost) nothing"
    text = page.inner_text(".reveal .slides")
    assert "$$" not in text and "\\bar" not in text, "raw TeX left on the slides"
    errors = page.evaluate("() => document.querySelectorAll('.MathJax_Error, .mjx-merror').length")
    assert errors == 0
    assert page.evaluate("() => document.fonts.check('40px \"News Cycle\"')")  # theme font, local

    # go to the first slide with display math (reveal's URL history: #/h/v) and keep a picture
    hv = page.evaluate("""() => {
        const top = [...document.querySelectorAll('.reveal .slides > section')];
        for (let h = 0; h < top.length; h++) {
            const inner = [...top[h].querySelectorAll(':scope > section')];
            for (let v = 0; v < inner.length; v++)
                if (inner[v].querySelector('.MJXc-display')) return [h, v];
        } return null; }""")
    assert hv is not None, "no slide has display math"
    page.evaluate("hv => { location.hash = `#/${hv[0]}/${hv[1]}`; }", hv)
    page.wait_for_selector("section.present .MJXc-display", timeout=10_000)
    page.wait_for_timeout(800)  # the slide transition
    assert page.evaluate("() => !!document.querySelector('section.present .MJXc-display')")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "slides_offline.png"
    page.screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000
    assert failed == [], f"local files failed to load: {failed}"
    page.context.close()


def test_pdf_through_print_view(deck, browser):
    out = slides_offline.pdf(deck, browser=browser)
    data = out.read_bytes()
    assert data.startswith(b"%PDF")
    pages = len(re.findall(rb"/Type\s*/Page\b", data))
    n = _kinds().count("slide") + _kinds().count("subslide")
    assert pages >= n, (pages, n)  # one page per slide, more where fragments split one


def test_fetch_rejects_a_tarball_that_does_not_match(tmp_path, monkeypatch):
    bad = {"requirejs": ("2.1.10", "A" * 86 + "==", ["require.js"])}
    monkeypatch.setattr(slides_offline, "PACKAGES", bad)
    monkeypatch.setattr(slides_offline, "VENDOR", tmp_path)
    with pytest.raises(RuntimeError, match="does not match the pinned sha512"):
        slides_offline.fetch()
    assert not (tmp_path / "npm" / "requirejs").exists()
