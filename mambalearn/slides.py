"""Slides from the chapter notebooks: execute each one, then nbconvert's reveal.js exporter.

    python -m mambalearn.slides notebooks/*.ipynb --out slides [--offline]

The deck follows each cell's ``slideshow.slide_type`` (slide, subslide, fragment, skip, notes).
``--offline`` points reveal.js, MathJax and require.js at copies under ``<out>/vendor`` (see
``vendor_dir``) so a deck opens without a network.
"""

import argparse
import os
from pathlib import Path

import nbformat


def export(notebook, out_dir, offline=False, timeout=900):
    """Execute ``notebook`` and write ``out_dir/<name>.slides.html``; returns its path."""
    from nbconvert import SlidesExporter
    from nbconvert.preprocessors import ExecutePreprocessor

    notebook, out_dir = Path(notebook), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    nb = nbformat.read(notebook, as_version=4)
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    ExecutePreprocessor(timeout=timeout, kernel_name="python3").preprocess(
        nb, {"metadata": {"path": str(notebook.parent)}})
    exporter = SlidesExporter()
    if offline:
        from mambalearn import slides_offline

        slides_offline.configure(exporter, out_dir)
    body, _ = exporter.from_notebook_node(nb)
    path = out_dir / f"{notebook.stem}.slides.html"
    path.write_text(body)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--out", default="slides")
    p.add_argument("--offline", action="store_true", help="use local reveal.js/MathJax/require.js")
    args = p.parse_args(argv)
    for nb in args.notebooks:
        print(export(nb, args.out, args.offline))


if __name__ == "__main__":
    main()
