"""The reading copy: chapters executed into static HTML with their figures, and an index."""

import re
from pathlib import Path

import nbformat

from mambalearn.classroom import site, slides_offline

ROOT = Path(__file__).resolve().parent.parent
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"


def test_site_pages_index_figures_and_failures(tmp_path):
    broken = tmp_path / "99_broken.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Broken"), nbformat.v4.new_code_cell("1 / 0")]), broken)
    out = tmp_path / "site"
    code = site.main([str(CH01), str(broken), "--out", str(out), "--offline", "--jobs", "2"])
    assert code == 1, "a chapter that raises must fail the build"
    assert not (out / "99_broken.html").exists()

    page = (out / "01_discretization.html").read_text()
    nb = nbformat.read(CH01, as_version=4)
    figures = [c for c in nb.cells if "plt.show()" in c.source]
    images = re.findall(r"<img[^>]*src=\"data:image/png", page)
    assert len(images) >= len(figures) > 0, "figures missing from the page"
    assert "Traceback" not in page and "application/vnd.jupyter.error" not in page
    assert "raise NotImplementedError" not in page  # the chapter, not an exercise
    assert slides_offline.remote_urls(page) == []
    assert (out / "vendor" / "mathjax" / "MathJax.js").exists()
    printed = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not printed, "notebooks are committed without outputs; the page must have run them"
    assert page.count("jp-OutputArea-output") >= len(figures)

    index = (out / "index.html").read_text()
    assert re.findall(r'href="([^"]+)"', index) == ["01_discretization.html"]
    assert site.title(nb, "") in index


def test_site_index_numbers_chapters_once(tmp_path):
    """The titles carry the chapter numbers ("05 · Memory"): the list is not numbered again."""
    pages = [(tmp_path / "05_memory.html", "05 · Memory"), (tmp_path / "01_a.html", "01 · A")]
    index = site.write_index(pages, tmp_path).read_text()
    assert "<ol" not in index and "list-style: none" in index
    assert re.findall(r'href="([^"]+)"', index) == ["01_a.html", "05_memory.html"]
    assert [site.chapters(n) for n in (1, 2)] == ["1 chapter", "2 chapters"]
