"""Slides from the chapter notebooks: execute each one, then nbconvert's reveal.js exporter.

    python -m mambalearn.classroom.slides notebooks/*.ipynb --out slides [--offline] [--pdf]

The deck follows each cell's ``slideshow.slide_type`` (slide, subslide, fragment, skip, notes).
``--offline`` points reveal.js, MathJax, require.js, jQuery, fonts and the widget manager at copies
under ``<out>/vendor`` (``mambalearn.classroom.slides_offline``) so a deck opens without a network.
``--pdf`` also prints each deck to ``<out>/<name>.pdf`` through headless Chromium's print view.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat


def execute(nb, cwd, timeout=300, attempts=2):
    """Run every cell of ``nb`` in a fresh python3 kernel started in ``cwd``; returns the executed copy.

    Each notebook is executed by a separate Python process, and a run that fails or exceeds
    ``timeout`` seconds in a cell is tried once more: on this project's 2-core machines a kernel
    has now and then sat idle while its client waited for a reply that never came (seen while
    other kernels and a browser started and stopped next to it), which no chapter cell explains.
    The kernel always draws with matplotlib's inline backend: ``make`` and the tests export
    MPLBACKEND=Agg, under which ``plt.show()`` outputs nothing and a page would lose its figures.
    """
    env = dict(os.environ, MPLBACKEND="module://matplotlib_inline.backend_inline")
    env.setdefault("MAMBALEARN_PROGRESS", "0")  # no progress-bar widgets frozen into a page
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "in.ipynb", Path(tmp) / "out.ipynb"
        nbformat.write(nb, src)
        cmd = [sys.executable, "-m", "mambalearn.classroom.slides", "--run-one", str(src), str(cwd), str(out),
               str(timeout)]
        for attempt in range(1, attempts + 1):
            try:
                subprocess.run(cmd, env=env, check=True, timeout=timeout * 10)
                return nbformat.read(out, as_version=4)
            except subprocess.SubprocessError as e:
                if attempt == attempts:
                    raise
                print(f"executing {cwd} notebook failed ({type(e).__name__}); trying again",
                      file=sys.stderr)


def _run_one(src, cwd, out, timeout):
    """The child process of `execute`: nbclient runs the notebook, the result goes to ``out``."""
    from nbclient import NotebookClient

    nb = nbformat.read(src, as_version=4)
    NotebookClient(nb, timeout=int(timeout), kernel_name="python3",
                   resources={"metadata": {"path": cwd}}).execute()
    nbformat.write(nb, out)


def export(notebook, out_dir, offline=False, timeout=300):
    """Execute ``notebook`` and write ``out_dir/<name>.slides.html``; returns its path."""
    from nbconvert import SlidesExporter

    notebook, out_dir = Path(notebook), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = execute(nbformat.read(notebook, as_version=4), notebook.parent, timeout)
    exporter = SlidesExporter()
    if offline:
        from mambalearn.classroom import slides_offline

        slides_offline.configure(exporter, out_dir)
    body, _ = exporter.from_notebook_node(nb)
    if offline:
        remote = slides_offline.remote_urls(body)
        if remote:
            raise RuntimeError(f"offline deck {notebook.name} still loads {remote}")
    path = out_dir / f"{notebook.stem}.slides.html"
    path.write_text(body)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--out", default="slides")
    p.add_argument("--offline", action="store_true", help="use local reveal.js/MathJax/require.js")
    p.add_argument("--pdf", action="store_true", help="also print each deck to PDF (Chromium)")
    args = p.parse_args(argv)
    for nb in args.notebooks:
        deck = export(nb, args.out, args.offline)
        print(deck)
        if args.pdf:
            from mambalearn.classroom import slides_offline

            print(slides_offline.pdf(deck))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-one"]:
        _run_one(*sys.argv[2:6])
    else:
        main()
