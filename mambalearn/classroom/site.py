"""A rendered reading copy: every chapter executed and written as static HTML, figures included.

    python -m mambalearn.classroom.site notebooks/*.ipynb --out site [--offline] [--jobs 2]

For students who want to read before they run anything: ``site/index.html`` lists the chapters,
``site/NN_name.html`` is each one executed top to bottom (nbconvert's ``lab`` template; figures are
PNGs embedded in the page, so a page is one file). ``--offline`` serves MathJax, require.js and the
widget manager from ``site/vendor`` (``mambalearn.classroom.slides_offline``) instead of CDNs. A chapter that
raises stops nothing else, but the build reports it and exits 1: the site never shows a traceback.
"""

import argparse
import html
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat


def title(nb, default):
    """The first Markdown heading of the notebook (without #), else ``default``."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return default


def render(notebook, out_dir, offline=False, timeout=300):
    """Execute ``notebook`` and write ``out_dir/<name>.html``; returns (path, title)."""
    from nbconvert import HTMLExporter

    from mambalearn.classroom.slides import execute

    notebook, out_dir = Path(notebook), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = execute(nbformat.read(notebook, as_version=4), notebook.parent, timeout)
    exporter = HTMLExporter(template_name="lab", embed_images=True)
    if offline:
        from mambalearn.classroom import slides_offline

        slides_offline.configure(exporter, out_dir)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": notebook.stem}})
    path = out_dir / f"{notebook.stem}.html"
    path.write_text(body)
    return path, title(nb, notebook.stem)


def write_index(pages, out_dir):
    """``out_dir/index.html``: one link per chapter, in file-name order."""
    items = "\n".join(f'  <li><a href="{html.escape(p.name)}">{html.escape(t)}</a></li>'
                      for p, t in sorted(pages))
    path = Path(out_dir) / "index.html"
    path.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mambalearn: chapters</title>
<style>body {{ font-family: sans-serif; max-width: 44em; margin: 3em auto }}</style>
</head><body>
<h1>mambalearn</h1>
<p>How Mamba's parallel scan is made fast. Each chapter below was executed top to bottom on a
CPU; open it in JupyterLab (<code>make lab</code>) to run and change it.</p>
<ol>
{items}
</ol>
</body></html>
""")
    return path


def build(notebooks, out_dir, offline=False, jobs=2, timeout=300):
    """Render every notebook (``jobs`` at once) and the index. Returns (pages, failures)."""
    def one(nb):
        try:
            return render(nb, out_dir, offline, timeout), None
        except Exception as e:  # noqa: BLE001 - report every broken chapter, not just the first
            why = str(e).strip().splitlines()[-1][:300] if str(e).strip() else repr(e)
            return None, (Path(nb).name, why)

    if offline:  # copy the vendor folder once, before the workers need it
        from mambalearn.classroom import slides_offline

        slides_offline.install(out_dir)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, notebooks))
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
    args = p.parse_args(argv)
    pages, failures = build(args.notebooks, args.out, args.offline, args.jobs, args.timeout)
    for path, _ in sorted(pages):
        print(path)
    for name, why in failures:
        print(f"error: {name} did not run: {why}", file=sys.stderr)
    print(f"{Path(args.out) / 'index.html'}: {len(pages)} chapters")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
