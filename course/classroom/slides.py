"""Slides from the chapter notebooks: execute each one, then a reveal.js deck that fits the slide.

    python -m mambalearn slides [NOTEBOOK | NN ...] [--out slides] [--pdf] [--online]  # make slides

The deck follows each cell's ``slideshow.slide_type`` (slide, subslide, fragment, skip, notes).
``course.classroom.slides_layout`` chooses what a code cell shows (figures without their
code, no plumbing imports, code reflowed to the slide's width; an interactive figure as the site
shows it, ``pages.static_widgets``: its last drawing and a line saying it is interactive in
JupyterLab), ``course.classroom.deck``
lays the slides out in the browser (continuation slides, fonts that fit) and starts reveal.js
with linear navigation. Decks are offline: reveal.js, MathJax, require.js, jQuery, fonts and the
widget manager are copies under ``<out>/vendor`` (``course.classroom.slides_offline``, which
fetches them from the npm registry once); ``--online`` loads them from CDNs instead.
``--pdf`` prints each deck to ``<out>/<name>.pdf`` (one page per slide, for skimming) through
headless Chromium, says for each deck whether every slide fits reveal's 960 x 700 box, and puts
all of them in ``<out>/course.pdf`` (one bookmark per deck). A deck is made from
``course.classroom.pages``' copy of the chapter: its images inside, and on a machine without
a GPU the output recorded on one where the chapter has it.
Executed copies of the chapters are kept (``course.classroom.execute``) and reused by the
site and the tests; ``--fresh`` runs them again.
"""

import sys
from pathlib import Path

from course.classroom import cli, deck, pages, slides_layout
from course.classroom.execute import executed


def export(notebook, out_dir, offline=True, timeout=300, nb=None, fresh=False):
    """Write ``out_dir/<name>.slides.html`` for ``notebook`` and return its path.

    ``nb``: the executed notebook, if the caller has it; else the cached or a fresh execution.
    """
    notebook, out_dir = Path(notebook), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if nb is None:
        nb = executed(notebook, timeout=timeout, fresh=fresh)
    exporter = deck.exporter()
    if offline:
        from course.classroom import slides_offline

        slides_offline.configure(exporter, out_dir, template=False)
    body, _ = exporter.from_notebook_node(slides_layout.prepare(
        pages.static_widgets(pages.prepare(nb, notebook))),
                                          resources=deck.resources(notebook.stem,
                                                                   notebook.parent))
    if offline:
        remote = slides_offline.remote_urls(body)
        if remote:
            raise RuntimeError(f"offline deck {notebook.name} still loads {remote}")
    path = out_dir / f"{notebook.stem}.slides.html"
    path.write_text(body)
    return path


def print_decks(decks, course=None, titles=None):
    """Each deck to PDF in one Chromium, one line per deck saying whether every slide fits, and
    ``course`` (a path) the PDFs in one file, a bookmark per deck named by ``titles`` (default:
    each deck's ``<title>``, its chapter's first heading). Returns the number of slides that do
    not fit."""
    from playwright.sync_api import sync_playwright

    from course.classroom import slides_offline

    try:
        slides_offline.chromium()
    except RuntimeError as e:
        print(f"decks written, no PDFs: {e}", file=sys.stderr)
        return 0
    bad, pdfs = 0, []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=slides_offline.chromium(),
                                    args=slides_offline.CHROMIUM_ARGS)
        try:
            for path in decks:
                rows = slides_offline.measure(browser, path)
                over = [r for r in rows if not r["fits"]]
                bad += len(over)
                pdfs.append(slides_offline.pdf(path, browser=browser))
                print(f"{pdfs[-1]}: {len(rows)} slides, " + ("all fit" if not over else
                      f"{len(over)} do not fit: " + "; ".join(slides_offline.describe(r)
                                                           for r in over[:5])))
        finally:
            browser.close()
    if course:
        titles = titles or [deck_title(d) for d in decks]
        print(f"{join_pdfs(pdfs, course, titles)}: the {len(pdfs)} decks in one file")
    return bad


def deck_title(deck):
    """The ``<title>`` of a deck's HTML (its chapter's first heading), else its file name."""
    import html
    import re

    m = re.search(r"<title>(.*?)</title>", Path(deck).read_text(errors="replace"), re.S)
    return html.unescape(m.group(1)).strip() if m and m.group(1).strip() else Path(deck).stem


COURSE_TITLE = "mambalearn: the course's slides"


def join_pdfs(pdfs, out, titles=None, title=COURSE_TITLE):
    """One PDF of ``pdfs`` in order, titled ``title``, each deck a bookmark (``titles``, default
    the file names) that opens at its first page, the bookmarks shown on opening; returns
    ``out``."""
    from pypdf import PdfWriter

    titles = titles or [Path(p).stem.removesuffix(".slides") for p in pdfs]
    writer = PdfWriter()
    for pdf, name in zip(pdfs, titles, strict=True):
        writer.append(str(pdf), outline_item=name)
    writer.add_metadata({"/Title": title, "/Subject": "slides of every chapter",
                         "/Creator": "mambalearn"})
    writer.page_mode = "/UseOutlines"
    with open(out, "wb") as f:
        writer.write(f)
    return Path(out)


def chapter_files(names, folder=pages.REPO / "notebooks"):
    """Notebook paths for ``names``: each a path, or a chapter number (``3``, ``03``) found in
    ``folder``; every chapter of ``folder`` when ``names`` is empty. A name that matches nothing
    raises ``FileNotFoundError``."""
    if not names:
        return sorted(Path(folder).glob("[0-9]*.ipynb"))
    found = []
    for name in map(str, names):
        hits = ([Path(name)] if Path(name).is_file() else
                sorted(Path(folder).glob(f"{int(name):02d}_*.ipynb")) if name.isdigit() else [])
        if len(hits) != 1:
            raise FileNotFoundError(f"no such notebook: {name}")
        found += hits
    return found


def main(argv=None):
    p = cli.parser("slides", description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", metavar="NOTEBOOK", help="chapter notebooks (.ipynb) or "
                   "chapter numbers (default: every notebooks/NN_*.ipynb)")
    p.add_argument("--out", default="slides", type=Path, help="folder for the decks (default "
                   "slides/)")
    p.add_argument("--online", action="store_true",
                   help="load reveal.js and MathJax from CDNs (the deck then needs a network)")
    p.add_argument("--pdf", action="store_true", help="also print each deck to PDF and check that "
                   "every slide fits; with several decks, course.pdf holds them all")
    p.add_argument("--fresh", action="store_true", help="execute even where a copy is kept")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    args = p.parse_args(argv)
    if args.timeout <= 0:
        p.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    try:
        notebooks = chapter_files(args.notebooks)
    except FileNotFoundError as e:
        p.error(str(e))
    decks = []
    for nb in notebooks:
        decks.append(export(nb, args.out, not args.online, args.timeout, fresh=args.fresh))
        print(decks[-1])
    if args.pdf:
        course = args.out / "course.pdf" if len(decks) > 1 else None
        return 1 if print_decks(decks, course) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
