"""The reading copy: chapters executed into static HTML with their figures, the frame a reader
expects around them (chapter list, outline, search, prev/next, links), offline, and an index."""

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course.classroom import site, slides_offline

ROOT = Path(__file__).resolve().parent.parent
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"


def _nb(title, *cells):
    return new_notebook(cells=[new_markdown_cell(f"# {title}"), *cells])


RESULT = sorted((ROOT / "docs" / "results").glob("*.json"))[0].name  # any file the store has


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A site of chapter 01, a tiny chapter 02 (a widget with printed text after it, a figure, a
    wide printed line, a long code cell, a cited result, a library import) and a chapter that
    raises; (out folder, exit status)."""
    tmp = tmp_path_factory.mktemp("site")
    src = tmp / "notebooks"
    src.mkdir()
    tiny = src / "02_tiny.ipynb"
    long_cell = "\n".join(f"x{i} = {i}" for i in range(40))
    nbformat.write(_nb(
        "02 · Tiny", new_markdown_cell("## A first section\n\nThe word zebrafish. Its exercise: "
                                       "[here](../exercises/ex01_discretization.ipynb)."),
        new_code_cell("print(' '.join(['word'] * 300))"),
        new_code_cell("from ipywidgets import interact\nimport matplotlib.pyplot as plt\n"
                      "def draw(k):\n    plt.plot([0, k])\n    plt.title('The zebra line')\n"
                      "    plt.show()\n_ = interact(draw, k=(1, 5))\n"
                      "print('held-out: accuracy 0.80')"),
        new_code_cell(f"print('as measured (docs/results/{RESULT})')"),
        new_code_cell("from mambalearn.discretize import zoh\nzoh_checked = zoh"),
        new_code_cell(long_cell),
        new_markdown_cell("## A second section\n\nMamba-3 (arXiv 2603.15569).")), tiny)
    broken = src / "99_broken.ipynb"
    nbformat.write(_nb("Broken", new_code_cell("1 / 0")), broken)
    out = tmp / "site"
    code = site.main([str(CH01), str(tiny), str(broken), "--out", str(out), "--jobs", "2",
                      "--colab", "someone/course"])
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
                 "notebooks/01_discretization.py", "exercises/ex01_discretization.ipynb",
                 "api.html", f"docs/results/{RESULT}"):
        assert (out / path).exists(), path
    # the exercise published is the one shipped (the grader's copy), not the checkout's
    from course.classroom import pristine

    assert (out / "exercises" / "ex01_discretization.ipynb").read_bytes() == (
        pristine.shipped()["01_discretization"]).read_bytes()


def test_titles_alt_text_downloads_and_footer(built):
    out, _ = built
    page = (out / "01_discretization.html").read_text()
    title = site.title(nbformat.read(CH01, as_version=4), "")
    assert f"<title>{title}</title>" in page.replace("&#39;", "'") and title[:2] == "01"
    assert "No description has been provided" not in page
    tiny = (out / "02_tiny.html").read_text()
    assert 'alt="Figure: The zebra line"' in tiny
    alts = re.findall(r'<img[^>]*\balt="([^"]+)"', page)
    assert alts and all(len(a) > 10 for a in alts)
    deck = (out / "01_discretization.slides.html").read_text()
    assert f"<title>{title} slides</title>" in deck.replace("&#39;", "'")
    assert 'name="viewport"' in deck and 'class="ml-back" href="01_discretization.html"' in deck
    assert "No description has been provided" not in deck
    assert 'href="../' not in deck.split("<script")[0] + deck.split("</script>")[-1]
    # downloads: the notebook with its outputs and a setup note first, and a script
    nb = nbformat.read(out / "notebooks" / "02_tiny.ipynb", as_version=4)
    assert nb.cells[0].id == "mambalearn-setup" and "make lab" in nb.cells[0].source
    assert "someone/course" in nb.cells[0].source
    assert any(o.get("text", "").startswith("word word") for c in nb.cells
               for o in c.get("outputs", []))
    assert "print(' '.join(['word'] * 300))" in (out / "notebooks" / "02_tiny.py").read_text()
    # papers, the repository, the build's date and commit
    for html in (page, (out / "index.html").read_text(), (out / "api.html").read_text()):
        foot = html.split('<footer class="ml-footer">')[1]
        for paper in ("arxiv.org/abs/2312.00752", "arxiv.org/abs/2405.21060",
                      "arxiv.org/abs/2603.15569", "github.com/state-spaces/mamba",
                      "triton-lang.org", "https://github.com/someone/course"):
            assert paper in foot, paper
        assert re.search(r"Built \d{4}-\d\d-\d\d \d\d:\d\d UTC from commit <code>[0-9a-f]{7,}",
                         foot)
    # a cited result links to its copy, an arXiv number to its abstract, the exercise in the site
    assert f'href="docs/results/{RESULT}">docs/results/{RESULT}</a>' in tiny
    assert 'href="https://arxiv.org/abs/2603.15569">arXiv 2603.15569</a>' in tiny
    assert 'href="exercises/ex01_discretization.ipynb">here</a>' in tiny


def test_api_reference_and_code_links(built):
    from course.classroom import apiref

    out, _ = built
    api = (out / "api.html").read_text()
    mods = apiref.modules()
    names = {m.name for m in mods}
    assert {"mambalearn.discretize", "mambalearn.mamba2.reference",
            "mambalearn.triton.scan"} <= names
    assert not any(n.startswith(("course.classroom", "mambalearn.check", "course.bench"))
                   for n in names), "the instructor's tooling is not the library's API"
    zoh = next(m for m in mods if m.name == "mambalearn.discretize").members
    assert "zoh" in [m.name for m in zoh]
    assert 'id="mambalearn.discretize.zoh"' in api and "<b>zoh</b>(" in api
    import mambalearn.discretize as d

    assert d.zoh.__doc__.split("\n")[0].strip()[:40].replace("``", "") in \
        re.sub(r"</?code>", "", api).replace("&#x27;", "'")
    tiny = (out / "02_tiny.html").read_text()
    assert 'href="api.html#mambalearn.discretize.zoh"><span class="n">zoh</span></a>' in tiny
    assert 'href="api.html#mambalearn.discretize"><span class="nn">mambalearn.discretize' in tiny
    assert 'href="api.html"' in tiny.split("</nav>")[0]  # in the side panel


def test_every_page_has_the_chapter_list_outline_and_links(built):
    out, _ = built
    page = (out / "01_discretization.html").read_text()
    nav = page.split('<nav class="ml-side">')[1].split("</nav>")[0]
    assert re.findall(r'<li[^>]*><a href="([^"]+\.html)"', nav) == ["01_discretization.html",
                                                                   "02_tiny.html", "api.html"]
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
    assert 'href="notebooks/01_discretization.py"' in links
    assert ('href="https://colab.research.google.com/github/someone/course/blob/main/notebooks/'
            '01_discretization.ipynb"') in links
    assert 'href="../exercises/' not in page, "the exercise link points into the site"
    index = (out / "index.html").read_text()
    assert re.findall(r'<tr><td><a href="([^"]+)"', index.split("</nav>")[1]) == [
        "01_discretization.html", "02_tiny.html"]
    assert site.title(nbformat.read(CH01, as_version=4), "") in index
    row = index.split('<tr><td><a href="01_discretization.html"')[1].split("</tr>")[0]
    assert site.summaries()[1] in row, "the README's line on the chapter"
    minutes = site.reading_minutes(nbformat.read(CH01, as_version=4))
    assert f"<td>{minutes} min</td>" in row and minutes > 1


def test_search_index_widgets_and_printed_output(built):
    out, _ = built
    text = (out / "search-index.js").read_text()
    entries = json.loads(text.removeprefix("window.mambalearnIndex = ").rstrip(";\n"))
    tiny = [e for e in entries if e["page"] == "02_tiny.html" and e["kind"] == "prose"]
    assert [e["title"] for e in tiny] == ["02 · Tiny", "A first section", "A second section"]
    assert "zebrafish" in tiny[1]["text"] and "word word" not in tiny[1]["text"]  # prose only
    assert {e["page"] for e in entries} == {"01_discretization.html", "02_tiny.html", "api.html"}
    code = [e for e in entries if e["kind"] == "code" and "zoh_checked" in e["text"]]
    assert len(code) == 1 and code[0]["id"].startswith("cell-id=")
    assert any(e["kind"] == "api" and e["id"] == "mambalearn.discretize.zoh" for e in entries)
    page = (out / "02_tiny.html").read_text()
    assert "Interactive in JupyterLab" in page and "widget-view+json" not in page
    assert "embed-amd" not in page, "no widget code to load once widgets are notes"
    # the widget's cell keeps its printed text and shows the figure it last drew
    cell = [c for c in page.split('id="cell-id=') if ">interact</span>" in c]
    assert len(cell) == 1
    cell = cell[0]
    assert "held-out: accuracy 0.80" in cell and 'src="data:image/png' in cell
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


def test_the_repository_for_colab_is_found(tmp_path, monkeypatch):
    """Colab links are on by default: the repository comes from the setting, else pyproject's
    [project.urls], else `git remote`; none of them, no link (and no guess)."""
    import subprocess

    monkeypatch.delenv("MAMBALEARN_REPOSITORY", raising=False)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert site.repository(tmp_path) is None
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin",
                    "git@github.com:from-git/course.git"], check=True)
    assert site.repository(tmp_path) == "from-git/course"
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.urls]\nRepository = "https://github.com/pyproj/course"\n')
    assert site.repository(tmp_path) == "pyproj/course"
    monkeypatch.setenv("MAMBALEARN_REPOSITORY", "setting/course")
    assert site.repository(tmp_path) == "setting/course"


CONTRAST = """() => {
    const lum = (c) => c.match(/[\\d.]+/g).slice(0, 3).map(Number).map((v) => {
        v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); })
        .reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
    const back = (e) => {
        for (let a = e; a; a = a.parentElement) {
            const m = getComputedStyle(a).backgroundColor.match(/[\\d.]+/g);
            if (m && (m.length < 4 || +m[3] > 0.5)) return getComputedStyle(a).backgroundColor;
        }
        return "rgb(255, 255, 255)";
    };
    return [...document.querySelectorAll("main a, nav a")].filter((a) => {
        const r = a.getBoundingClientRect();
        return r.width && r.height && !a.classList.contains("anchor-link");
    }).map((a) => {
        const [f, b] = [lum(getComputedStyle(a).color), lum(back(a))];
        return [(Math.max(f, b) + 0.05) / (Math.min(f, b) + 0.05), a.textContent.slice(0, 40)];
    }).sort((x, y) => x[0] - y[0]);
}"""


ACTIVE = "t => document.querySelector('ul.ml-outline a.ml-active')?.textContent === t"


def _opener(browser, out):
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
    return open_page


def test_in_a_browser_search_theme_and_phone(built, browser):
    from conftest import require_chromium

    require_chromium()
    out, _ = built
    open_page = _opener(browser, out)

    page, refused, errors = open_page("01_discretization.html",
                                      viewport={"width": 1400, "height": 900})
    assert "$$" not in page.inner_text("main"), "raw TeX left on the page"
    # every displayed formula numbered, (1), (2), … down the page; the papers it names linked
    labels = page.eval_on_selector_all(".mjx-label", "els => els.map(e => e.textContent)")
    assert labels[:3] == ["(1)", "(2)", "(3)"], labels
    page.click("a.ml-ref")
    assert page.evaluate("() => location.hash").startswith("#ref-")
    page.fill(".ml-search input", "zebrafish")
    hits = page.eval_on_selector_all(".ml-search ol a",
                                     "els => els.map(e => e.getAttribute('href'))")
    assert hits == ["02_tiny.html?hl=zebrafish#A-first-section"], hits
    assert page.inner_text(".ml-search ol mark.ml-hit") == "zebrafish"
    light = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert page.evaluate("() => document.querySelector('nav.ml-side details').open")
    # code and API names are searched too: a name inside an identifier, the API entry first
    page.fill(".ml-search input", "checked")
    hits = page.eval_on_selector_all(".ml-search ol a", "els => els.map(e => e.href)")
    assert any("02_tiny.html?hl=checked#cell-id%3D" in h for h in hits), hits
    page.fill(".ml-search input", "zoh")
    hits = page.eval_on_selector_all(".ml-search ol a", "els => els.map(e => e.href)")
    assert any(h.endswith("api.html?hl=zoh#mambalearn.discretize.zoh") for h in hits), hits

    # following a hit: the word marked in its section, scrolled to
    page.set_viewport_size({"width": 1280, "height": 800})
    page.fill(".ml-search input", "zebrafish")
    page.click(".ml-search ol a")
    page.wait_for_url("**/02_tiny.html?hl=zebrafish#A-first-section")
    page.wait_for_load_state("load")
    assert not refused and not errors, (refused, errors)
    marks = page.eval_on_selector_all("main mark.ml-hit", "els => els.map(e => e.textContent)")
    assert marks == ["zebrafish"], marks
    # a copy button on each code cell, a long cell folded, the outline following the scroll
    cells = page.locator(".jp-CodeCell .jp-InputArea-editor").count()
    assert page.locator("button.ml-copy").count() == cells > 0
    page.locator("button.ml-copy").first.click()
    assert page.evaluate("() => window.mambalearnCopied") == "print(' '.join(['word'] * 300))"
    folded = page.locator(".jp-InputArea-editor.ml-folded")
    assert folded.count() == 1
    assert folded.locator("pre").evaluate("e => e.scrollHeight > e.clientHeight + 50")
    page.click("button.ml-fold")
    assert page.locator(".jp-InputArea-editor.ml-folded").count() == 0
    page.evaluate("() => document.getElementById('A-second-section')"
                  ".scrollIntoView({behavior: 'instant'})")
    page.wait_for_function(ACTIVE, arg="A second section", timeout=20_000)
    page.evaluate("() => window.scrollTo({top: 0, behavior: 'instant'})")
    page.wait_for_function(ACTIVE, arg="A first section", timeout=20_000)
    # printed output longer than the text wraps at spaces, not a sideways scroll
    wide = page.locator(".jp-OutputArea-output pre").first
    assert wide.evaluate("e => e.classList.contains('ml-wrap') && e.scrollWidth <= "
                         "e.clientWidth + 1 && e.getBoundingClientRect().height > 60")
    assert not errors, errors
    page.context.close()

    # the index and every page start right of the side panel on a laptop's or projector's width
    page, _, _ = open_page("index.html", viewport={"width": 1120, "height": 800})
    for width in (1120, 1280, 1440, 1503):
        page.set_viewport_size({"width": width, "height": 800})
        nav_right = page.evaluate("() => document.querySelector('nav.ml-side')"
                                  ".getBoundingClientRect().right")
        main_left = page.evaluate("() => document.querySelector('main').getBoundingClientRect()"
                                  ".left")
        assert main_left >= nav_right, (width, main_left, nav_right)
    border = page.evaluate("() => getComputedStyle(document.querySelector("
                           "'.ml-search input')).borderTopColor")
    assert border not in ("rgba(0, 0, 0, 0)", page.evaluate(
        "() => getComputedStyle(document.body).backgroundColor")), "no border on the box"
    page.context.close()

    # every link at least 4.5:1 (WCAG AA) against what is behind it, dark and light
    for scheme, names in (("dark", ("index.html", "01_discretization.html", "02_tiny.html",
                                    "api.html")), ("light", ("01_discretization.html",))):
        page, _, _ = open_page(names[0], color_scheme=scheme,
                               viewport={"width": 1280, "height": 800})
        for name in names:
            page.goto((out / name).resolve().as_uri(), wait_until="load")
            worst = page.evaluate(CONTRAST)
            assert worst and worst[0][0] >= 4.5, (name, scheme, worst[:3])
        page.context.close()

    page, _, _ = open_page("02_tiny.html", color_scheme="dark",
                           viewport={"width": 390, "height": 800})
    dark = page.evaluate("() => getComputedStyle(document.body).backgroundColor")
    assert dark != light and page.evaluate("() => document.body.dataset.jpThemeLight") == "false"
    assert not page.evaluate("() => document.querySelector('nav.ml-side details').open")
    for name in ("index.html", "01_discretization.html", "02_tiny.html", "api.html"):
        page.goto((out / name).resolve().as_uri(), wait_until="load")
        assert page.evaluate("() => document.documentElement.scrollWidth <= "
                             "window.innerWidth + 1"), f"{name} is wider than a phone's screen"
    page.context.close()


def test_the_course_pdf_has_a_title_and_a_bookmark_per_chapter(tmp_path):
    from pypdf import PdfReader, PdfWriter

    from course.classroom import slides

    pdfs = []
    for k, pages in enumerate((2, 3)):
        w = PdfWriter()
        for _ in range(pages):
            w.add_blank_page(width=960, height=700)
        pdfs.append(tmp_path / f"0{k}_x.pdf")
        with open(pdfs[-1], "wb") as f:
            w.write(f)
    deck = tmp_path / "01_a.slides.html"
    deck.write_text("<html><head><title>01 · A &amp; B slides</title></head></html>")
    assert slides.deck_title(deck) == "01 · A & B slides"
    out = slides.join_pdfs(pdfs, tmp_path / "course.pdf", ["01 · One", "02 · Two"])
    reader = PdfReader(out)
    assert reader.metadata.title == slides.COURSE_TITLE and len(reader.pages) == 5
    marks = [(o.title, reader.get_destination_page_number(o)) for o in reader.outline]
    assert marks == [("01 · One", 0), ("02 · Two", 2)]
    assert reader.trailer["/Root"]["/PageMode"] == "/UseOutlines"


def test_speaker_notes_are_folded_on_a_page():
    """A notes cell renders as a closed "Speaker notes" box, its markdown still rendered."""
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_markdown_cell, new_notebook

    from course.classroom import site

    nb = new_notebook(cells=[
        new_markdown_cell("# Title", metadata={"slideshow": {"slide_type": "slide"}}),
        new_markdown_cell("Say: the *decay* first. Ask: why? About 2 min.",
                          metadata={"slideshow": {"slide_type": "notes"}})])
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(site.fold_notes(nb))
    folded = re.search(r'<details class="ml-notes">(.*?)</details>', body, re.S)
    assert folded and "<summary>Speaker notes</summary>" in folded.group(1)
    assert "<em>decay</em>" in folded.group(1)  # markdown inside the box still rendered
    assert nb.cells[0].source == "# Title"


def test_papers_are_cited_where_a_page_names_them_and_figures_are_numbered():
    """The first prose mention of each paper links to its numbered entry; code, printed output,
    headings and links are left alone; no mention, no section; each figure gets "Figure n"."""
    from course.classroom import bibliography

    md = '<div class="jp-RenderedHTMLCommon jp-RenderedMarkdown">{}</div>'
    body = ("<main>" + md.format("<h2>Blelloch</h2><p>Mamba-2, <code>Blelloch</code>, "
                                 "<a href='x'>Mamba-3</a>, then Blelloch's tree; Mamba-2.</p>")
            + '<div class="jp-OutputArea-output"><pre>Hillis–Steele</pre></div>'
            + '<div class="jp-RenderedImage jp-OutputArea-output"><img alt="Error against Δ" '
              'src="a.png"></div><div class="jp-RenderedImage"><img src="b.png"></div>'
            + '<footer class="ml-footer"></footer></main>')
    out = bibliography.number_figures(bibliography.references(body))
    assert re.findall(r'href="#ref-([\w-]+)">\[(\d)\]', out) == [("mamba2", "1"), ("blelloch", "2")]
    assert "<h2>Blelloch</h2>" in out and "<code>Blelloch</code>" in out
    refs = out[out.index('class="ml-references"'):out.index("<footer")]
    assert refs.count("<li") == 2 and "arxiv.org/abs/2405.21060" in refs and "CMU-CS-90-190" in refs
    assert "Hillis" not in refs and "Mamba-3" not in refs  # named only in output and a link
    assert re.findall(r'id="figure-(\d)"><b>Figure \d\.</b>([^<]*)', out) == [
        ("1", " Error against Δ"), ("2", "")]
    assert bibliography.references("<main><p>Mamba-2</p></main>") == "<main><p>Mamba-2</p></main>"
