"""Slides from the chapter notebooks: execute each one, then a reveal.js deck that fits the slide.

    python -m mambalearn.classroom.slides notebooks/*.ipynb --out slides [--pdf] [--online]

The deck follows each cell's ``slideshow.slide_type`` (slide, subslide, fragment, skip, notes).
``mambalearn.classroom.slides_layout`` chooses what a code cell shows (figures without their
code, no plumbing imports, code reflowed to the slide's width), ``mambalearn.classroom.deck``
lays the slides out in the browser (continuation slides, fonts that fit) and starts reveal.js
with linear navigation. Decks are offline: reveal.js, MathJax, require.js, jQuery, fonts and the
widget manager are copies under ``<out>/vendor`` (``mambalearn.classroom.slides_offline``, which
fetches them from the npm registry once); ``--online`` loads them from CDNs instead.
``--pdf`` prints each deck to ``<out>/<name>.pdf`` (one page per slide, for skimming) through
headless Chromium and says for each deck whether every slide fits reveal's 960 x 700 box.
Executed copies of the chapters are kept (``mambalearn.classroom.execute``) and reused by the
site and the tests; ``--fresh`` runs them again.
"""

import argparse
import sys
from pathlib import Path

from mambalearn.classroom import deck, slides_layout
from mambalearn.classroom.execute import executed


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
        from mambalearn.classroom import slides_offline

        slides_offline.configure(exporter, out_dir, template=False)
    body, _ = exporter.from_notebook_node(slides_layout.prepare(nb),
                                          resources=deck.resources(notebook.stem,
                                                                   notebook.parent))
    if offline:
        remote = slides_offline.remote_urls(body)
        if remote:
            raise RuntimeError(f"offline deck {notebook.name} still loads {remote}")
    path = out_dir / f"{notebook.stem}.slides.html"
    path.write_text(body)
    return path


def print_decks(decks):
    """Each deck to PDF in one Chromium; one line per deck saying whether every slide fits."""
    from playwright.sync_api import sync_playwright

    from mambalearn.classroom import slides_offline

    try:
        slides_offline.chromium()
    except RuntimeError as e:
        print(f"decks written, no PDFs: {e}", file=sys.stderr)
        return 0
    bad = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=slides_offline.chromium(),
                                    args=slides_offline.CHROMIUM_ARGS)
        try:
            for path in decks:
                rows = slides_offline.measure(browser, path)
                over = [r for r in rows if not r["fits"]]
                bad += len(over)
                pdf = slides_offline.pdf(path, browser=browser)
                print(f"{pdf}: {len(rows)} slides, " + ("all fit" if not over else
                      f"{len(over)} do not fit: " + "; ".join(slides_offline.describe(r)
                                                           for r in over[:5])))
        finally:
            browser.close()
    return bad


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m mambalearn.classroom.slides",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="+", type=Path, help="chapter notebooks (.ipynb)")
    p.add_argument("--out", default="slides", type=Path, help="folder for the decks")
    p.add_argument("--online", action="store_true",
                   help="load reveal.js and MathJax from CDNs (the deck then needs a network)")
    p.add_argument("--pdf", action="store_true",
                   help="also print each deck to PDF and check that every slide fits")
    p.add_argument("--fresh", action="store_true", help="execute even where a copy is kept")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    args = p.parse_args(argv)
    missing = [str(nb) for nb in args.notebooks if not nb.is_file()]
    if missing:
        p.error(f"no such notebook: {', '.join(missing)}")
    decks = []
    for nb in args.notebooks:
        decks.append(export(nb, args.out, not args.online, args.timeout, fresh=args.fresh))
        print(decks[-1])
    if args.pdf:
        return 1 if print_decks(decks) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
