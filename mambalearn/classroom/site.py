"""A rendered reading copy: every chapter executed and written as static HTML, figures included.

    python -m mambalearn site [NOTEBOOK | NN ...] [--out site] [--pdf] [--online] [--colab O/R]

For students who want to read before they run anything. ``site/index.html`` lists the chapters;
``site/NN_name.html`` is each one executed top to bottom (nbconvert's ``lab`` template, one file:
figures and markdown images embedded, ``mambalearn.classroom.pages``). Every page has the list of
chapters with the open chapter's outline, a search box (over a prebuilt index,
``search-index.js``), previous / next / home links, and each chapter's links: its exercise and
how to grade it, its deck (``NN_name.slides.html``, made here too), its PDF (``--pdf``, through
Chromium), the notebook to download and, given ``--colab``, "open in Colab". The theme follows
the system's light or dark setting; printed output is never wrapped inside a word; a widget cell
says it is interactive in JupyterLab instead of showing dead sliders.

Offline by default: MathJax, require.js and reveal.js come from ``site/vendor``
(``mambalearn.classroom.slides_offline``, pinned versions); ``--online`` loads the same pinned
versions from CDNs. A chapter that raises stops nothing else, but the build reports it and exits
1: the site never shows a traceback. The executed chapters are the copies ``make slides`` made
where they are current (``mambalearn.classroom.execute``); ``--fresh`` runs them again.
"""

import html
import json
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from nbformat.v4 import new_output

from mambalearn.classroom import cli, pages, pristine, slides, slides_offline
from mambalearn.classroom.execute import executed

HERE = Path(__file__).resolve().parent
WIDGET = "application/vnd.jupyter.widget-view+json"
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block notebook_css %}{{ super() }}
<style type="text/css">@media (prefers-color-scheme: dark) {
{{ resources.mambalearn.dark }}
}</style>
<link rel="stylesheet" href="site.css">
<script src="search-index.js"></script><script src="site.js"></script>
{% endblock notebook_css %}
{%- block body_header -%}
<body class="jp-Notebook ml-page" data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
{{ resources.mambalearn.nav }}
<main>
{{ resources.mambalearn.top }}
{%- endblock body_header -%}
{% block body_footer %}
{{ resources.mambalearn.bottom }}
</main>
</body>
{% endblock body_footer %}
"""
ONLINE = {  # the pinned versions of what a page loads, from CDNs (--online)
    "mathjax_url": "https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/MathJax.js"
                   "?config=TeX-AMS_CHTML-full,Safe",
    "require_js_url": "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.1.10/require.min.js",
    "html_manager_semver_range": slides_offline.PACKAGES["@jupyter-widgets/html-manager"][0],
}


@dataclass
class Chapter:
    """One page of the site: its notebook, title, and what is linked from it."""

    notebook: Path
    title: str
    exercise: Path | None = None
    deck: str | None = None
    pdf: str | None = None

    @property
    def page(self):
        return f"{self.notebook.stem}.html"


def title(nb, default):
    """The first Markdown heading of the notebook (without #), else ``default``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return default


def widgets_to_notes(nb):
    """A widget cell's output becomes one line saying where it is interactive; the saved widget
    state goes (nothing left to load the widget code for)."""
    note = ('<p class="ml-widget">Interactive in JupyterLab: open this chapter with '
            "<code>make lab</code> and move the sliders.</p>")
    for cell in nb.cells:
        if any(WIDGET in o.get("data", {}) for o in cell.get("outputs", [])):
            cell.outputs = [new_output("display_data", data={"text/html": note})]
    nb.metadata.pop("widgets", None)
    return nb


def _link(href, text):
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def nav(chapters, current=None, outline=""):
    """The side panel: home, search, every chapter (the current one with its outline)."""
    items = []
    for c in chapters:
        here = c is current
        items.append(f'<li{" class=ml-current" if here else ""}>{_link(c.page, c.title)}'
                     + (outline if here else "") + "</li>")
    return (f'<nav class="ml-side"><details open><summary><a href="index.html"><b>mambalearn</b>'
            '</a> · chapters and search</summary><div class="ml-search"><h2>Search</h2><input '
            'type="search" placeholder="e.g. Blelloch, tf32, chunk" aria-label="search the '
            f'course"><ol></ol></div><h2>Chapters</h2><ol class="ml-toc">{"".join(items)}</ol>'
            '</details></nav>')


def bar(chapters, i, where):
    """Previous / home / next, at the ``where`` ("top" or "bottom") of chapter ``i``."""
    prev = _link(chapters[i - 1].page, "← " + chapters[i - 1].title) if i > 0 else "<span></span>"
    nxt = (_link(chapters[i + 1].page, chapters[i + 1].title + " →") if i + 1 < len(chapters)
           else "<span></span>")
    return f'<div class="ml-bar ml-{where}">{prev}{_link("index.html", "all chapters")}{nxt}</div>'


def links(c, colab=None):
    """The chapter's exercise, deck, PDF, download and Colab links (those that exist)."""
    parts = []
    if c.exercise:
        ex = f"exercises/{c.exercise.name}"
        parts.append(f"✎ Exercise: {_link(ex, ex)} (download it, or open it in JupyterLab "
                     f"beside this chapter; grade it with <code>make grade NB={html.escape(ex)}"
                     "</code>)")
    shown = [_link(c.deck, "slides")] if c.deck else []
    shown += [_link(c.pdf, "slides as PDF")] if c.pdf else []
    shown += [_link(f"notebooks/{c.notebook.name}", "download the notebook")]
    if colab:  # Colab has a GPU, but not the course's library: the first cell installs it
        shown.append(_link(f"https://colab.research.google.com/github/{colab}/blob/main/"
                           f"notebooks/{c.notebook.name}", "open in Colab")
                     + f' (a GPU; first run <code>!pip install "mambalearn[lab] @ '
                       f'git+https://github.com/{html.escape(colab)}"</code>)')
    parts.append(" · ".join(shown))
    return '<div class="ml-links">' + "<br>".join(parts) + "</div>"


HEADING = re.compile(r'<h([1-3]) id="([^"]+)">(.*?)(?:<a class="anchor-link".*?</a>)?</h\1>', re.S)
TAGS = re.compile(r"<[^>]+>")


def outline(body):
    """``<ul>`` of the page's level-2 headings, linked to their anchors."""
    items = [f'<li><a href="#{i}">{TAGS.sub("", t).strip()}</a></li>'
             for level, i, t in HEADING.findall(body) if level == "2"]
    return f'<ul class="ml-outline">{"".join(items)}</ul>' if items else ""


def sections(body, c):
    """Search entries of a page: one per heading of its prose, with the prose under it (code and
    printed output are not searched)."""
    from bs4 import BeautifulSoup

    out = []
    for md in BeautifulSoup(body, "html.parser").select(".jp-MarkdownCell .jp-RenderedMarkdown"):
        for el in md.children:
            if getattr(el, "name", None) is None:
                continue
            if re.fullmatch(r"h[1-3]", el.name) and el.get("id"):
                for a in el.select("a.anchor-link"):
                    a.decompose()
                out.append({"page": c.page, "id": el["id"], "chapter": c.title,
                            "title": el.get_text(" ", strip=True), "text": ""})
            elif out:
                out[-1]["text"] = (out[-1]["text"] + " " + el.get_text(" ", strip=True)).strip()
    for e in out:
        e["text"] = re.sub(r"\s+", " ", e["text"])[:1500]
    return out


def exporter(online):
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    ex = HTMLExporter(template_name="lab", embed_images=True)
    for trait, value in (ONLINE if online else {}).items():
        setattr(ex, trait, value)
    ex.extra_loaders = [DictLoader({"mambalearn_site.html.j2": TEMPLATE})]
    ex.template_file = "mambalearn_site.html.j2"
    return ex


def render(chapters, i, nb, out_dir, online=False, colab=None):
    """Write chapter ``i``'s page from its executed notebook ``nb``; its search entries."""
    c = chapters[i]
    ex = exporter(online)
    if not online:
        for trait, url in slides_offline.URLS.items():
            if ex.has_trait(trait):
                setattr(ex, trait, url)
    resources = {"metadata": {"name": c.notebook.stem},
                 "mambalearn": {"dark": _theme("dark"), "nav": "<!--ml-nav-->",
                                "top": bar(chapters, i, "top") + links(c, colab),
                                "bottom": bar(chapters, i, "bottom")}}
    body, _ = ex.from_notebook_node(widgets_to_notes(pages.prepare(nb, c.notebook)),
                                    resources=resources)
    body = body.replace("<!--ml-nav-->", nav(chapters, c, outline(body)), 1)
    for folder in ("exercises", "notebooks"):  # the chapter's own links, to the site's copies
        body = body.replace(f'href="../{folder}/', f'href="{folder}/')
    if not online and slides_offline.remote_urls(body):
        raise RuntimeError(f"page {c.page} still loads {slides_offline.remote_urls(body)}")
    (Path(out_dir) / c.page).write_text(body)
    return sections(body, c)


def _theme(name):
    """JupyterLab's ``name`` ("light" or "dark") theme variables, from nbconvert's lab template
    (a page applies the dark ones when the system is dark)."""
    from jupyter_core.paths import jupyter_path

    for css in jupyter_path("nbconvert", "templates", "lab", "static", f"theme-{name}.css"):
        if Path(css).exists():
            return Path(css).read_text()
    raise FileNotFoundError(f"nbconvert's lab template has no static/theme-{name}.css")


def write_index(chapters, out_dir, colab=None):
    """``out_dir/index.html``: every chapter with its links, in file-name order.

    The titles carry the chapter's number ("05 · Memory"), so the list is not numbered again.
    """
    items = "\n".join(f"<li>{_link(c.page, c.title)}<br><span>" + " · ".join(
        ([_link(f"exercises/{c.exercise.name}", "exercise")] if c.exercise else [])
        + ([_link(c.deck, "slides")] if c.deck else []) + ([_link(c.pdf, "PDF")] if c.pdf else [])
        + [_link(f"notebooks/{c.notebook.name}", "notebook")]) + "</span></li>"
        for c in chapters)
    course = ('<p>All the slides in one file: <a href="course.pdf">course.pdf</a>.</p>'
              if (Path(out_dir) / "course.pdf").exists() else "")
    colab = (f"<p>No GPU here? Each chapter opens in Colab (github.com/{html.escape(colab)}).</p>"
             if colab else "")
    path = Path(out_dir) / "index.html"
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>mambalearn: chapters</title>
<style>{_theme("light")}
@media (prefers-color-scheme: dark) {{ {_theme("dark")} }}</style>
<link rel="stylesheet" href="site.css">
<script src="search-index.js"></script><script src="site.js"></script>
</head><body class="ml-index" data-jp-theme-light="true">
{nav(chapters)}
<main>
<h1>mambalearn</h1>
<p>How Mamba's parallel scan is made fast. Each chapter below was executed top to bottom on a
CPU; open it in JupyterLab (<code>make lab</code>) to run and change it. Each has an exercise in
<code>exercises/</code>, graded with <code>make grade NB=exercises/exNN_name.ipynb</code>.</p>
{course}{colab}
<ul class="ml-chapters">
{items}
</ul>
</main>
</body></html>
""")
    return path


def chapters(n):
    """``"1 chapter"``, ``"13 chapters"``."""
    return f"{n} chapter{'' if n == 1 else 's'}"


def build(notebooks, out_dir, online=False, jobs=2, timeout=300, fresh=False, pdf=False,
          colab=None, exercises=pages.REPO / "exercises"):
    """Render every notebook (``jobs`` executed at once), its deck, the index and the search
    index. Returns (chapters written, failures as (file name, why))."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not online:  # the vendor folder once, before the workers need it
        slides_offline.install(out_dir)

    def run(i_nb):
        i, nb = i_nb
        try:
            return executed(nb, timeout=timeout, position=i, fresh=fresh), None
        except Exception as e:  # noqa: BLE001 - report every broken chapter, not just the first
            why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else repr(e)
            return None, (Path(nb).name, why)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(run, enumerate(map(Path, notebooks))))
    failures = [f for _, f in results if f]
    done = [(Path(p), nb) for p, (nb, _) in zip(notebooks, results, strict=True) if nb]
    chapters_ = [Chapter(p, title(nb, p.stem)) for p, nb in done]
    for c, (p, nb) in zip(chapters_, done, strict=True):
        c.deck = slides.export(p, out_dir, offline=not online, nb=nb).name
        ex = Path(exercises) / pristine.exercise_file(p.stem)
        if ex.exists():
            c.exercise = ex
            _copy(ex, out_dir / "exercises")
        _copy(p, out_dir / "notebooks")
    if pdf and chapters_:
        slides.print_decks([out_dir / c.deck for c in chapters_], out_dir / "course.pdf"
                           if len(chapters_) > 1 else None)
        for c in chapters_:
            made = (out_dir / c.deck).with_suffix("").with_suffix(".pdf")  # NN_name.pdf
            c.pdf = made.name if made.exists() else None
    index = []
    for i, (_, nb) in enumerate(done):
        index += render(chapters_, i, nb, out_dir, online, colab)
    for asset in ("site.css", "site.js"):
        shutil.copyfile(HERE / asset, out_dir / asset)
    (out_dir / "search-index.js").write_text(
        "window.mambalearnIndex = " + json.dumps(index, ensure_ascii=False) + ";\n")
    write_index(chapters_, out_dir, colab)
    return chapters_, failures


def _copy(path, folder):
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, folder / Path(path).name)


def main(argv=None):
    p = cli.parser("site", description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="chapter notebooks (.ipynb) or "
                   "chapter numbers (default: every notebooks/NN_*.ipynb)")
    p.add_argument("--out", default="site", type=Path, help="folder of the site (default site/)")
    p.add_argument("--online", action="store_true", help="MathJax and the rest from CDNs (pinned "
                   "versions) instead of site/vendor")
    p.add_argument("--pdf", action="store_true", help="also each deck as PDF and course.pdf "
                   "(needs Chromium: make browser)")
    p.add_argument("--colab", metavar="OWNER/REPO", help="the course's GitHub repository: each "
                   "chapter gets an 'open in Colab' link")
    p.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    p.add_argument("--fresh", action="store_true", help="execute even where a copy is kept")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.timeout < 1:
        p.error("--jobs and --timeout must be at least 1")
    if args.colab and not re.fullmatch(r"[\w.-]+/[\w.-]+", args.colab):
        p.error(f"--colab must be OWNER/REPO (a GitHub repository), got {args.colab!r}")
    try:
        notebooks = slides.chapter_files(args.notebooks)
    except FileNotFoundError as e:
        p.error(str(e))
    done, failures = build(notebooks, args.out, args.online, args.jobs, args.timeout, args.fresh,
                           args.pdf, args.colab)
    for c in done:
        print(args.out / c.page)
    for name, why in failures:
        print(f"error: {name} did not run: {why}", file=sys.stderr)
    print(f"{args.out / 'index.html'}: {chapters(len(done))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
