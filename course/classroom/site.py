"""A rendered reading copy: every chapter executed and written as static HTML, figures included.

    python -m mambalearn site [NOTEBOOK | NN ...] [--out site] [--pdf] [--online] [--colab O/R]

For students who want to read before they run anything. ``site/index.html`` is the table of
chapters (what each is about, from the README's table, and its reading time); ``site/NN_name.html``
is each one executed top to bottom (nbconvert's ``lab`` template, one file: figures and markdown
images embedded, ``course.classroom.pages``), titled by its first heading. Every page has the
list of chapters with the open chapter's outline (the section on screen marked as it scrolls), a
search box over a prebuilt index (``search-index.js``: the prose's sections, every code cell and
the API's names; the hit is highlighted on the page it opens), previous / next / home links, a
copy button on each code cell, long code cells folded (a button shows them), and each chapter's
links: its exercise (the shipped copy, never the checkout's ``exercises/``) and how to grade it,
its deck (``NN_name.slides.html``, made here too, with a link back), its PDF (``--pdf``, through
Chromium; ``course.pdf`` has a bookmark per chapter), the notebook with its outputs and a setup
note, the same as a ``.py`` script, "open in Colab", the papers and code the course builds on, and
the ``docs/results/*.json`` files a page cites (copied into the site). ``api.html`` documents every
public module from its docstrings (``course.classroom.apiref``); library names in the code
link to it. The footer gives the build's date and commit.

The theme follows the system's light or dark setting (links at least 4.5:1 against the background
in both); a long printed line wraps at a space, never inside a word; a widget shows what it last
drew, with a line saying it is interactive in JupyterLab. Displayed formulas are numbered, figures
captioned "Figure n", and the papers a page names (Mamba, Mamba-2, Mamba-3, Blelloch, Hillis and
Steele) are linked from their first mention to a "References" section at its end
(``course.classroom.bibliography``). The decks' speaker notes
are folded into a closed "Speaker notes" box. "Open in Colab" needs the repository on
GitHub: ``--colab OWNER/REPO``, else the ``MAMBALEARN_REPOSITORY`` setting, else pyproject's
``[project.urls]``, else ``git remote``; with none of them the pages say how to set it.

Offline by default: MathJax, require.js and reveal.js come from ``site/vendor``
(``course.classroom.slides_offline``, pinned versions); ``--online`` loads the same pinned
versions from CDNs. A chapter that raises stops nothing else, but the build reports it and exits
1: the site never shows a traceback. The executed chapters are the copies ``make slides`` made
where they are current (``course.classroom.execute``); ``--fresh`` runs them again.
"""

import datetime
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from nbformat.v4 import new_markdown_cell

from course.classroom import apiref, bibliography, cli, pages, pristine, slides, slides_offline
from course.classroom.execute import executed

HERE = Path(__file__).resolve().parent
REPO = pages.REPO
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{% block notebook_css %}{{ super() }}
<style type="text/css">@media (prefers-color-scheme: dark) {
{{ resources.mambalearn.dark }}
}</style>
<link rel="stylesheet" href="site.css">
<script src="search-index.js"></script><script src="site.js"></script>
{% endblock notebook_css %}
{%- block html_head_js_mathjax -%}
{{ super() }}
{{ resources.mambalearn.equations }}
{%- endblock html_head_js_mathjax -%}
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
# what the course builds on, linked from every page (links, not loads: offline pages keep them)
PAPERS = [
    ("Mamba: Linear-Time Sequence Modeling with Selective State Spaces (Gu and Dao, 2023)",
     "https://arxiv.org/abs/2312.00752"),
    ("Transformers are SSMs: Mamba-2 and state space duality (Dao and Gu, 2024)",
     "https://arxiv.org/abs/2405.21060"),
    ("Mamba-3 (Lahoti et al., 2026)", "https://arxiv.org/abs/2603.15569"),
    ("mamba_ssm, the reference implementation", "https://github.com/state-spaces/mamba"),
    ("Triton: documentation and tutorials", "https://triton-lang.org/main/index.html"),
]
WORDS_PER_MINUTE = 200
LONG_CODE = 30  # lines: a longer code cell starts folded
GITHUB = re.compile(r"github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")
RESULT = re.compile(r"(?<![\w/\"'=.-])docs/results/([\w.-]+\.json)")
ARXIV = re.compile(r"arXiv[ :]?(\d{4}\.\d{4,5})")


@dataclass
class Chapter:
    """One page of the site: its notebook, title, and what is linked from it."""

    notebook: Path
    title: str
    exercise: Path | None = None
    deck: str | None = None
    pdf: str | None = None
    minutes: int | None = None
    summary: str = ""

    @property
    def page(self):
        return f"{self.notebook.stem}.html"

    @property
    def number(self):
        m = re.match(r"\d+", self.notebook.stem)
        return int(m.group(0)) if m else None


title = pages.title


def reading_minutes(nb):
    """Minutes to read the notebook's prose at ``WORDS_PER_MINUTE`` (code, output and speaker
    notes not counted)."""
    words = sum(len(re.findall(r"\w+", c.source)) for c in nb.cells if c.cell_type == "markdown"
                and c.metadata.get("slideshow", {}).get("slide_type") != "notes")
    return max(1, math.ceil(words / WORDS_PER_MINUTE))


def summaries(readme=REPO / "README.md"):
    """{chapter number: what it covers} from the README's chapter table (``| 03 ✎ | … |``)."""
    if not Path(readme).is_file():
        return {}
    rows = re.findall(r"^\|\s*(\d\d)\b[^|]*\|\s*([^|]+?)\s*\|", Path(readme).read_text(), re.M)
    return {int(n): text for n, text in rows}


def repository(root=REPO):
    """The course's GitHub repository as ``OWNER/REPO``: the ``MAMBALEARN_REPOSITORY`` setting,
    else pyproject.toml's ``[project.urls]``, else ``git remote get-url origin``; None if none."""
    setting = os.environ.get("MAMBALEARN_REPOSITORY", "").strip()
    if setting:
        return setting
    try:
        import tomllib

        urls = tomllib.loads((Path(root) / "pyproject.toml").read_text()).get(
            "project", {}).get("urls", {})
    except (ImportError, OSError, ValueError):
        urls = {}
    candidates = list(urls.values())
    try:
        candidates.append(subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"],
                                         capture_output=True, text=True, timeout=10).stdout)
    except (OSError, subprocess.SubprocessError):
        pass
    for url in candidates:
        m = GITHUB.search(str(url).strip())
        if m:
            return f"{m.group(1)}/{m.group(2)}"
    return None


def build_info(root=REPO):
    """(UTC date, short commit or "unknown") of this build."""
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return date, commit or "unknown"


def _link(href, text, cls=None):
    c = f' class="{cls}"' if cls else ""
    return f'<a{c} href="{html.escape(href)}">{html.escape(text)}</a>'


def nav(chapters, current=None, outline=""):
    """The side panel: home, search, every chapter (the current one with its outline), the API."""
    items = []
    for c in chapters:
        here = c is current
        items.append(f'<li{" class=ml-current" if here else ""}>{_link(c.page, c.title)}'
                     + (outline if here else "") + "</li>")
    return (f'<nav class="ml-side"><details open><summary><a href="index.html"><b>mambalearn</b>'
            '</a> · chapters and search</summary><div class="ml-search"><h2>Search</h2><input '
            'type="search" placeholder="e.g. Blelloch, tf32, ssd_chunked" aria-label="search the '
            f'course"><ol></ol></div><h2>Chapters</h2><ol class="ml-toc">{"".join(items)}</ol>'
            f'<h2>Reference</h2><ol class="ml-toc"><li>{_link("api.html", "API reference")}</li>'
            '</ol></details></nav>')


def bar(chapters, i, where):
    """Previous / home / next, at the ``where`` ("top" or "bottom") of chapter ``i``."""
    prev = _link(chapters[i - 1].page, "← " + chapters[i - 1].title) if i > 0 else "<span></span>"
    nxt = (_link(chapters[i + 1].page, chapters[i + 1].title + " →") if i + 1 < len(chapters)
           else "<span></span>")
    return f'<div class="ml-bar ml-{where}">{prev}{_link("index.html", "all chapters")}{nxt}</div>'


def colab_url(repo, notebook):
    return (f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/"
            f"{Path(notebook).name}")


def links(c, colab=None):
    """The chapter's exercise, deck, PDF, downloads and Colab links (those that exist)."""
    parts = []
    if c.exercise:
        ex = f"exercises/{pristine.exercise_file(pristine.exercise_id(c.exercise))}"
        parts.append(f"✎ Exercise: {_link(ex, ex)} (download it, or open it in JupyterLab "
                     f"beside this chapter; grade it with <code>make grade NB={html.escape(ex)}"
                     "</code>)")
    shown = [_link(c.deck, "slides")] if c.deck else []
    shown += [_link(c.pdf, "slides as PDF")] if c.pdf else []
    stem = c.notebook.stem
    shown += [f'download: {_link(f"notebooks/{stem}.ipynb", "notebook with outputs")}, '
              f'{_link(f"notebooks/{stem}.py", ".py script")}']
    if colab:  # Colab has a GPU, but not the course's library: the first cell says how
        shown.append(_link(colab_url(colab, c.notebook), "open in Colab", "ml-colab")
                     + f' (a GPU; first run <code>!pip install "mambalearn[lab] @ '
                       f'git+https://github.com/{html.escape(colab)}"</code>)')
    if c.minutes:
        shown.append(f"about {c.minutes} min of reading")
    parts.append(" · ".join(shown))
    return '<div class="ml-links">' + "<br>".join(parts) + "</div>"


def footer(info, colab=None):
    """Papers and code the course builds on, the repository, and when and from what the site was
    built."""
    date, commit = info
    papers = "".join(f"<li>{_link(url, text)}</li>" for text, url in PAPERS)
    repo = (_link(f"https://github.com/{colab}", f"github.com/{colab}") if colab else
            "set <code>MAMBALEARN_REPOSITORY=OWNER/REPO</code> (or <code>make site COLAB=OWNER/"
            "REPO</code>) to link it, and to get “open in Colab”")
    return (f'<footer class="ml-footer"><h2>Papers and code</h2><ul>{papers}</ul>'
            f"<p>The course's repository: {repo}.</p>"
            f'<p class="ml-built">Built {html.escape(date)} from commit <code>'
            f"{html.escape(commit)}</code>.</p></footer>")


HEADING = re.compile(r'<h([1-3]) id="([^"]+)">(.*?)(?:<a class="anchor-link".*?</a>)?</h\1>', re.S)
TAGS = re.compile(r"<[^>]+>")


def outline(body):
    """``<ul>`` of the page's level-2 headings, linked to their anchors."""
    items = [f'<li><a href="#{i}">{TAGS.sub("", t).strip()}</a></li>'
             for level, i, t in HEADING.findall(body) if level == "2"]
    return f'<ul class="ml-outline">{"".join(items)}</ul>' if items else ""


def sections(body, c, nb=None):
    """Search entries of a page: one per heading of its prose, with the prose under it, and one
    per code cell (its source; printed output is not searched)."""
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
                            "title": el.get_text(" ", strip=True), "text": "", "kind": "prose"})
            elif out:
                out[-1]["text"] = (out[-1]["text"] + " " + el.get_text(" ", strip=True)).strip()
    for e in out:
        e["text"] = re.sub(r"\s+", " ", e["text"])[:1500]
    for cell in (nb.cells if nb is not None else []):
        if cell.cell_type != "code" or not cell.source.strip() or not cell.get("id"):
            continue
        first = next((line for line in cell.source.splitlines() if line.strip()
                      and not line.lstrip().startswith("#")), cell.source.splitlines()[0])
        out.append({"page": c.page, "id": f"cell-id={cell.id}", "chapter": c.title,
                    "title": "code: " + first.strip()[:80], "text": cell.source[:1500],
                    "kind": "code"})
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


FIG_TITLE = re.compile(r"""(?:set_title|suptitle|plt\.title)\(\s*[rf]?(["'])(.+?)\1""")


def figure_alts(nb):
    """{cell id: alt text} for the code cells that draw a figure: the plot's title from the code
    (where it is more than placeholders), else the last sentence of the Markdown above the cell,
    else the cell's first line."""
    alts, prose = {}, ""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            prose = cell.source
            continue
        if cell.cell_type != "code" or not any(
                k.startswith("image/") for o in cell.get("outputs", [])
                for k in o.get("data", {})):
            continue
        titles = [m.group(2) for m in FIG_TITLE.finditer(cell.source)
                  if m.group(2).count("{") <= 1
                  and len(re.findall(r"[A-Za-z]{3,}", re.sub(r"\{[^}]*\}", "", m.group(2)))) >= 2]
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", prose)
        text = re.sub(r"[#*_`$\\]", "", text).strip()
        sentences = [x.strip() for x in re.split(r"(?<=[.:!?])\s+", text) if len(x.strip()) > 12]
        alt = ("Figure: " + "; ".join(re.sub(r"\{[^}]*\}", "…", t) for t in titles) if titles
               else "Figure for: " + sentences[-1][:200] if sentences else
               "Figure drawn by: " + cell.source.strip().splitlines()[0][:120])
        alts[cell.get("id", "")] = " ".join(alt.split())
    return alts


NO_ALT = 'alt="No description has been provided for this image"'


def set_alts(body, alts):
    """Replace nbconvert's placeholder alt text, cell by cell (cells carry ``id="cell-id=…"``)."""
    pieces = re.split(r'(?=id="cell-id=)', body)
    out = []
    for piece in pieces:
        m = re.match(r'id="cell-id=([^"]+)"', piece)
        alt = alts.get(m.group(1)) if m else None
        if alt and NO_ALT in piece:
            piece = piece.replace(NO_ALT, f'alt="{html.escape(alt)}"')
        out.append(piece)
    body = "".join(out)
    return body.replace(NO_ALT, 'alt="A figure drawn by the code above"')


def imported_names(nb, api):
    """{name used in the notebook's code: api.html anchor} for ``from mambalearn.X import name``
    and ``import mambalearn.X`` where the API documents it."""
    found = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for mod, names in re.findall(r"^\s*from\s+(mambalearn[\w.]*)\s+import\s+\(?([^)\n]+)",
                                     cell.source, re.M):
            for part in names.split(","):
                bits = part.strip().split(" as ")
                name, local = bits[0].strip(), bits[-1].strip()
                key = f"{mod}.{name}"
                if re.fullmatch(r"\w+", local) and key in api:
                    found[local] = api[key]
    return found


def link_code(body, names, api):
    """Library names in the highlighted code link to the API reference."""
    def name(m):
        target = names.get(m.group(1))
        return (f'<a class="ml-api-link" href="api.html#{html.escape(target)}">{m.group(0)}</a>'
                if target else m.group(0))

    def module(m):
        target = api.get(m.group(1))
        return (f'<a class="ml-api-link" href="api.html#{html.escape(target)}">{m.group(0)}</a>'
                if target else m.group(0))

    body = re.sub(r'<span class="n">(\w+)</span>', name, body)
    return re.sub(r'<span class="nn">(mambalearn[\w.]*)</span>', module, body)


def link_citations(body, out_dir, results=pages.RESULTS):
    """``docs/results/NAME.json`` in the page's text links to a copy in the site; arXiv numbers
    link to their abstract. Returns the page and the result files it cites."""
    cited = set()

    def result(m):
        src = Path(results) / m.group(1)
        if not src.is_file():
            return m.group(0)
        cited.add(src)
        return f'<a class="ml-cite" href="docs/results/{m.group(1)}">{m.group(0)}</a>'

    parts = re.split(r"(<[^>]*>)", body)  # text between tags only, never inside an attribute
    for k in range(0, len(parts), 2):
        parts[k] = RESULT.sub(result, parts[k])
        parts[k] = ARXIV.sub(lambda m: f'<a class="ml-cite" href="https://arxiv.org/abs/'
                             f'{m.group(1)}">{m.group(0)}</a>', parts[k])
    for src in cited:
        _copy(src, Path(out_dir) / "docs" / "results")
    return "".join(parts), cited


def relink(body, out_dir):
    """Links into the repository (``../exercises/…``, ``../docs/…``) point at the site's copies."""
    def local(m):
        rel = m.group(1)
        if rel.startswith(("exercises/", "notebooks/")):
            return f'href="{rel}'
        src = REPO / rel.split("#")[0]
        if src.is_file():
            _copy(src, (Path(out_dir) / rel.split("#")[0]).parent)
            return f'href="{rel}'
        return m.group(0)

    return re.sub(r'href="\.\./([^"]+)', local, body)


def fold_notes(nb):
    """``nb`` with each speaker-notes cell (``slide_type`` notes: what a presenter says, asks and
    how long) folded into a closed "Speaker notes" box, so that a page reads as prose."""
    for cell in nb.cells:
        if cell.metadata.get("slideshow", {}).get("slide_type") == "notes":
            cell.source = ('<details class="ml-notes"><summary>Speaker notes</summary>\n\n'
                           f"{cell.source.strip()}\n\n</details>")
    return nb


def render(chapters, i, nb, out_dir, online=False, colab=None, api=None, info=None):
    """Write chapter ``i``'s page from its executed notebook ``nb``; its search entries."""
    c = chapters[i]
    ex = exporter(online)
    if not online:
        for trait, url in slides_offline.URLS.items():
            if ex.has_trait(trait):
                setattr(ex, trait, url)
    nb = fold_notes(pages.static_widgets(pages.prepare(nb, c.notebook)))
    nb.metadata["title"] = c.title
    resources = {"metadata": {"name": c.title},
                 "mambalearn": {"dark": _theme("dark"), "nav": "<!--ml-nav-->",
                                "equations": bibliography.EQUATIONS,
                                "top": bar(chapters, i, "top") + links(c, colab),
                                "bottom": bar(chapters, i, "bottom")
                                + footer(info or build_info(), colab)}}
    body, _ = ex.from_notebook_node(nb, resources=resources)
    body = set_alts(body, figure_alts(nb))
    body = bibliography.number_figures(bibliography.references(body))
    body = body.replace("<!--ml-nav-->", nav(chapters, c, outline(body)), 1)
    body = relink(body, out_dir)
    body, _ = link_citations(body, out_dir)
    if api:
        body = link_code(body, imported_names(nb, api), api)
    if not online and slides_offline.remote_urls(body):
        raise RuntimeError(f"page {c.page} still loads {slides_offline.remote_urls(body)}")
    (Path(out_dir) / c.page).write_text(body)
    return sections(body, c, nb)


def _theme(name):
    """JupyterLab's ``name`` ("light" or "dark") theme variables, from nbconvert's lab template
    (a page applies the dark ones when the system is dark)."""
    from jupyter_core.paths import jupyter_path

    for css in jupyter_path("nbconvert", "templates", "lab", "static", f"theme-{name}.css"):
        if Path(css).exists():
            return Path(css).read_text()
    raise FileNotFoundError(f"nbconvert's lab template has no static/theme-{name}.css")


def _frame(title_, body, chapters, info, colab, cls):
    """A page of the site that is not a chapter (the index, the API reference)."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(title_)}</title>
<style>{_theme("light")}
@media (prefers-color-scheme: dark) {{ {_theme("dark")} }}</style>
<link rel="stylesheet" href="site.css">
<script src="search-index.js"></script><script src="site.js"></script>
</head><body class="{cls}" data-jp-theme-light="true">
{nav(chapters)}
<main>
{body}
{footer(info, colab)}
</main>
</body></html>
"""


def write_index(chapters, out_dir, colab=None, info=None):
    """``out_dir/index.html``: the table of chapters (what each covers, reading time, links)."""
    rows = []
    for c in chapters:
        got = ([_link(f"exercises/{pristine.exercise_file(pristine.exercise_id(c.exercise))}",
                      "exercise")] if c.exercise else [])
        got += ([_link(c.deck, "slides")] if c.deck else []) + (
            [_link(c.pdf, "PDF")] if c.pdf else [])
        got += [_link(f"notebooks/{c.notebook.stem}.ipynb", "notebook")]
        if colab:
            got.append(_link(colab_url(colab, c.notebook), "Colab", "ml-colab"))
        rows.append(f"<tr><td>{_link(c.page, c.title)}<br><small>{html.escape(c.summary)}"
                    f"</small></td><td>{c.minutes or ''} min</td><td>{' · '.join(got)}</td></tr>")
    course = ('<p>All the slides in one file: <a href="course.pdf">course.pdf</a>.</p>'
              if (Path(out_dir) / "course.pdf").exists() else "")
    colab_note = (f"<p>No GPU here? Each chapter opens in Colab (github.com/{html.escape(colab)})."
                  "</p>" if colab else "")
    body = f"""<h1>mambalearn</h1>
<p>How Mamba's parallel scan is made fast. Each chapter below was executed top to bottom on a
CPU; open it in JupyterLab (<code>make lab</code>) to run and change it. Each has an exercise in
<code>exercises/</code>, graded with <code>make grade NB=exercises/exNN_name.ipynb</code>. The
library's modules are documented in the <a href="api.html">API reference</a>.</p>
{course}{colab_note}
<table class="ml-chapters">
<thead><tr><th>chapter</th><th>reading</th><th>links</th></tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>"""
    path = Path(out_dir) / "index.html"
    path.write_text(_frame("mambalearn: chapters", body, chapters, info or build_info(), colab,
                           "ml-index"))
    return path


def write_api(chapters, out_dir, mods, colab=None, info=None):
    """``out_dir/api.html`` from the library's docstrings."""
    where = {c.number: (c.page, c.title) for c in chapters}
    path = Path(out_dir) / "api.html"
    path.write_text(_frame("mambalearn: API reference", apiref.page(mods, where), chapters,
                           info or build_info(), colab, "ml-index ml-api"))
    return path


def site_deck(path, chapter, nb=None):
    """A deck copied into the site: links to the site's copies, a viewport tag, a way back, and
    (given the executed notebook ``nb``) its figures' alt text."""
    text = Path(path).read_text()
    if nb is not None:
        text = set_alts(text, figure_alts(nb))
    text = re.sub(r'href="\.\./(exercises|notebooks)/', r'href="\1/', text)
    if 'name="viewport"' not in text:
        text = text.replace("<head>", '<head>\n<meta name="viewport" content="width=device-width,'
                            ' initial-scale=1.0">', 1)
    back = (f'<a class="ml-back" href="{html.escape(chapter.page)}" style="position: fixed; '
            "left: 8px; top: 6px; z-index: 40; font: 14px sans-serif; color: #0b5cad; "
            'background: rgba(255,255,255,0.85); padding: 2px 6px; border-radius: 4px">'
            f"← {html.escape(chapter.title)}</a>")
    text = text.replace("</body>", back + "\n</body>", 1)
    Path(path).write_text(text)
    return path


def setup_note(colab, info):
    """The first cell of a downloaded notebook: what it needs to run, and when it was run."""
    where = (f'`pip install "mambalearn[lab] @ git+https://github.com/{colab}"` (in Colab: a GPU '
             "runtime, then the same line starting with `!`)" if colab else
             "`pip install -e \".[lab]\"` inside a copy of the course's repository")
    return new_markdown_cell(
        "**To run this notebook** you need the course's library: in a copy of the repository, "
        f"`make lab` installs everything and opens JupyterLab; or {where}. The outputs below are "
        f"those of the site's build ({info[0]}, commit {info[1]}); on a machine without a GPU the "
        "Triton kernels run in Triton's interpreter.",
        id="mambalearn-setup", metadata={"slideshow": {"slide_type": "skip"}})


def downloads(notebook, nb, out_dir, colab, info):
    """``notebooks/NN_name.ipynb`` (executed, outputs kept, a setup note first) and
    ``notebooks/NN_name.py``."""
    import nbformat
    from nbconvert import PythonExporter

    folder = Path(out_dir) / "notebooks"
    folder.mkdir(parents=True, exist_ok=True)
    copy = pages.prepare(nb, notebook)
    copy.cells.insert(0, setup_note(colab, info))
    nbformat.write(copy, folder / f"{Path(notebook).stem}.ipynb")
    script, _ = PythonExporter().from_notebook_node(nbformat.read(notebook, as_version=4))
    (folder / f"{Path(notebook).stem}.py").write_text(script)


def chapters(n):
    """``"1 chapter"``, ``"13 chapters"``."""
    return f"{n} chapter{'' if n == 1 else 's'}"


def build(notebooks, out_dir, online=False, jobs=2, timeout=300, fresh=False, pdf=False,
          colab=None, exercises=None):
    """Render every notebook (``jobs`` executed at once), its deck, the index, the API page and
    the search index. ``exercises``: the folder of the shipped exercises (``NN_name.ipynb``;
    default: the grader's pristine copies, ``pristine.shipped``), published as
    ``exercises/exNN_name.ipynb``. Returns (chapters
    written, failures as (file name, why))."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not online:  # the vendor folder once, before the workers need it
        slides_offline.install(out_dir)
    info = build_info()
    exercises = pristine.shipped(exercises) if exercises else pristine.shipped()

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
    about = summaries()
    chapters_ = [Chapter(p, title(nb, p.stem), minutes=reading_minutes(nb)) for p, nb in done]
    for c, (p, nb) in zip(chapters_, done, strict=True):
        c.summary = about.get(c.number, "") if c.number is not None else ""
        c.deck = slides.export(p, out_dir, offline=not online, nb=nb).name
        site_deck(out_dir / c.deck, c, nb)
        shipped = exercises.get(p.stem)
        if shipped is not None:
            c.exercise = shipped
            (out_dir / "exercises").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shipped, out_dir / "exercises" / pristine.exercise_file(p.stem))
        downloads(p, nb, out_dir, colab, info)
    if pdf and chapters_:
        slides.print_decks([out_dir / c.deck for c in chapters_], out_dir / "course.pdf"
                           if len(chapters_) > 1 else None, titles=[c.title for c in chapters_])
        for c in chapters_:
            made = (out_dir / c.deck).with_suffix("").with_suffix(".pdf")  # NN_name.pdf
            c.pdf = made.name if made.exists() else None
    mods = apiref.modules()
    api = apiref.names(mods)
    index = []
    for i, (_, nb) in enumerate(done):
        index += render(chapters_, i, nb, out_dir, online, colab, api, info)
    index += apiref.entries(mods)
    for asset in ("site.css", "site.js"):
        shutil.copyfile(HERE / asset, out_dir / asset)
    (out_dir / "search-index.js").write_text(
        "window.mambalearnIndex = " + json.dumps(index, ensure_ascii=False) + ";\n")
    write_api(chapters_, out_dir, mods, colab, info)
    write_index(chapters_, out_dir, colab, info)
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
    p.add_argument("--colab", metavar="OWNER/REPO", help="the course's GitHub repository, for "
                   "'open in Colab' (default: MAMBALEARN_REPOSITORY, pyproject's [project.urls] "
                   "or git remote)")
    p.add_argument("--no-colab", action="store_true", help="no 'open in Colab' links")
    p.add_argument("--jobs", type=int, default=2, help="notebooks executed at once (default 2)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    p.add_argument("--fresh", action="store_true", help="execute even where a copy is kept")
    args = p.parse_args(argv)
    if args.jobs < 1 or args.timeout < 1:
        p.error("--jobs and --timeout must be at least 1")
    colab = None if args.no_colab else (args.colab or repository())
    if colab and not re.fullmatch(r"[\w.-]+/[\w.-]+", colab):
        p.error(f"--colab must be OWNER/REPO (a GitHub repository), got {colab!r}")
    try:
        notebooks = slides.chapter_files(args.notebooks)
    except FileNotFoundError as e:
        p.error(str(e))
    done, failures = build(notebooks, args.out, args.online, args.jobs, args.timeout, args.fresh,
                           args.pdf, colab)
    for c in done:
        print(args.out / c.page)
    for name, why in failures:
        print(f"error: {name} did not run: {why}", file=sys.stderr)
    if not colab and not args.no_colab:
        print("note: no 'open in Colab' links: no GitHub repository found (give --colab "
              "OWNER/REPO, set MAMBALEARN_REPOSITORY, or add it to pyproject.toml's "
              "[project.urls])",
              file=sys.stderr)
    print(f"{args.out / 'index.html'}: {chapters(len(done))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
