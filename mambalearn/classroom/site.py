"""A rendered reading copy: every chapter executed and written as static HTML, figures included.

    python -m mambalearn.classroom.site notebooks/*.ipynb --out site [--offline] [--jobs 2]

For students who want to read before they run anything: ``site/index.html`` lists the chapters,
``site/NN_name.html`` is each one executed top to bottom (nbconvert's ``lab`` template; figures are
PNGs embedded in the page, so a page is one file). ``--offline`` serves MathJax, require.js and
the widget manager from ``site/vendor`` (``mambalearn.classroom.slides_offline``) instead of CDNs.
A chapter that raises stops nothing else, but the build reports it and exits 1: the site never
shows a traceback.
The executed chapters are the copies ``make slides`` made, where they are current
(``mambalearn.classroom.execute``); ``--fresh`` runs them again.
"""

import argparse
import html
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mambalearn.classroom.execute import executed


def title(nb, default):
    """The first Markdown heading of the notebook (without #), else ``default``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return default


def render(notebook, out_dir, offline=False, timeout=300, nb=None, position=0, fresh=False):
    """Write ``out_dir/<name>.html`` for ``notebook``; returns (path, title).

    ``nb``: the executed notebook, if the caller has it; else the kept or a fresh execution.
    """
    from nbconvert import HTMLExporter

    notebook, out_dir = Path(notebook), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if nb is None:
        nb = executed(notebook, timeout=timeout, position=position, fresh=fresh)
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    if offline:
        from mambalearn.classroom import slides_offline

        slides_offline.configure(exporter, out_dir)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": notebook.stem}})
    path = out_dir / f"{notebook.stem}.html"
    path.write_text(body)
    return path, title(nb, notebook.stem)


def write_index(pages, out_dir):
    """``out_dir/index.html``: one link per chapter, in file-name order.

    The titles carry the chapter's number ("05 · Memory"), so the list is not numbered again.
    """
    items = "\n".join(f'  <li><a href="{html.escape(p.name)}">{html.escape(t)}</a></li>'
                      for p, t in sorted(pages))
    path = Path(out_dir) / "index.html"
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mambalearn: chapters</title>
<style>body {{ font-family: sans-serif; max-width: 44em; margin: 3em auto }}
ul.chapters {{ list-style: none; padding: 0 }} ul.chapters li {{ margin: 0.4em 0 }}</style>
</head><body>
<h1>mambalearn</h1>
<p>How Mamba's parallel scan is made fast. Each chapter below was executed top to bottom on a
CPU; open it in JupyterLab (<code>make lab</code>) to run and change it.</p>
<ul class="chapters">
{items}
</ul>
</body></html>
""")
    return path


def chapters(n):
    """``"1 chapter"``, ``"13 chapters"``."""
    return f"{n} chapter{'' if n == 1 else 's'}"


def build(notebooks, out_dir, offline=False, jobs=2, timeout=300, fresh=False):
    """Render every notebook (``jobs`` at once) and the index. Returns (pages, failures)."""
    def one(i_nb):
        i, nb = i_nb
        try:
            return render(nb, out_dir, offline, timeout, position=i, fresh=fresh), None
        except Exception as e:  # noqa: BLE001 - report every broken chapter, not just the first
            why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else repr(e)
            return None, (Path(nb).name, why)

    if offline:  # copy the vendor folder once, before the workers need it
        from mambalearn.classroom import slides_offline

        slides_offline.install(out_dir)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, enumerate(notebooks)))
    pages = [r for r, _ in results if r]
    failures = [f for _, f in results if f]
    write_index(pages, out_dir)
    return pages, failures


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--out", default="site")
    p.add_argument("--offline", action="store_true", help="MathJax etc. from site/vendor")
    p.add_argument("--jobs", type=int, default=2, help="notebooks executed at once")
    p.add_argument("--timeout", type=int, default=300, help="seconds per cell")
    p.add_argument("--fresh", action="store_true", help="execute even where a copy is kept")
    args = p.parse_args(argv)
    pages, failures = build(args.notebooks, args.out, args.offline, args.jobs, args.timeout,
                            args.fresh)
    for path, _ in sorted(pages):
        print(path)
    for name, why in failures:
        print(f"error: {name} did not run: {why}", file=sys.stderr)
    print(f"{Path(args.out) / 'index.html'}: {chapters(len(pages))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
