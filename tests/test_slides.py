"""Slide export without a browser: the deck's structure, what a code cell shows on a slide, the
executed copies the decks, the site and these tests share, and the chapters' widget cells."""

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from mambalearn.classroom import execute, slides_layout

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"


def _kinds(path):
    return [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(path, as_version=4).cells]


def test_chapter_01_deck(tmp_path):
    # a subprocess, as `make slides` runs it; the kernel is the executed copy's, kept or made now
    done = subprocess.run([sys.executable, "-m", "mambalearn.classroom.slides", str(CH01),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "without encryption" not in done.stderr and "IPKernelApp" not in done.stderr
    html = (tmp_path / "01_discretization.slides.html").read_text()
    kinds = _kinds(CH01)
    # reveal.js nests: each slide is an outer <section> holding one <section> per (sub)slide
    assert html.count("<section") == 2 * kinds.count("slide") + kinds.count("subslide")
    assert html.count('<aside class="notes"') == kinds.count("notes")
    assert "interact(" not in html  # the live-widget cell is skip
    assert re.search(r'<img[^>]*src="data:image/png', html)  # figures executed and embedded
    assert '"navigationMode": "linear"' in html  # the arrow keys reach every subslide
    assert "vendor/reveal.js/dist/reveal.js" in html  # offline by default


def _png_cell(source, tags=(), slide_type="fragment"):
    cell = new_code_cell(source, metadata={"slideshow": {"slide_type": slide_type},
                                           "tags": list(tags)})
    cell.outputs = [new_output("display_data", data={"image/png": "iVBORw0KGgo=",
                                                     "text/plain": "<Figure>"})]
    return cell


def test_what_a_code_cell_shows_on_a_slide():
    long = "x = some_function(first_argument, second_argument, third_argument)  # " + "why " * 12
    cells = [
        new_markdown_cell("# Title", metadata={"slideshow": {"slide_type": "slide"}}),
        _png_cell("fig = plot(x)\nplt.show()"),                               # 1: figure only
        _png_cell("plot(x)\nplt.show()", tags=[slides_layout.SHOW_CODE]),     # 2: code kept
        new_code_cell("import math\nfrom mambalearn.testing import assert_close\n\n"
                      "from mambalearn.scan import blelloch\nprint(math.pi)"),  # 3
        new_code_cell("def plot_it(a):\n    fig, ax = plt.subplots()\n    return fig"),  # 4
        new_code_cell(long),                                                  # 5
        new_code_cell("print(1)", metadata={"tags": [slides_layout.HIDE_CODE]}),  # 6
    ]
    for c in cells[3:]:
        c.metadata.setdefault("slideshow", {"slide_type": "fragment"})
    out = slides_layout.prepare(new_notebook(cells=cells)).cells
    hidden = [c.metadata.get("transient", {}).get("remove_source", False) for c in out]
    assert hidden == [False, True, False, False, False, False, True]
    assert out[3].source == "from mambalearn.scan import blelloch\nprint(math.pi)"
    assert out[4].metadata["slideshow"]["slide_type"] == "skip"  # plotting plumbing
    assert max(map(len, out[5].source.splitlines())) <= slides_layout.CODE_WIDTH
    assert out[5].source.splitlines()[-1].startswith("x = some_function(")  # comment above it
    assert cells[5].source == long, "the notebook itself is not changed"


def _visible_code():
    for path in CHAPTERS:
        for c in nbformat.read(path, as_version=4).cells:
            if c.cell_type == "code" and c.metadata["slideshow"]["slide_type"] not in ("skip",):
                yield path.name, c.source


def test_reflowed_code_is_the_same_program_and_fits_but_for_strings():
    """Every visible code cell of every chapter: the slide's copy parses to the same syntax tree,
    and a line longer than the slide's width is left only where a string literal makes it so."""
    for name, source in _visible_code():
        fitted = slides_layout.fit_code(source)
        try:
            want = ast.dump(ast.parse(source))
        except SyntaxError:
            assert fitted == source
            continue
        assert ast.dump(ast.parse(fitted)) == want, name
        kinds = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
        strings = {row for t in tokenize.generate_tokens(io.StringIO(fitted).readline)
                   if t.type in kinds for row in range(t.start[0], t.end[0] + 1)}
        for row, line in enumerate(fitted.splitlines(), start=1):
            if len(line) > slides_layout.CODE_WIDTH:
                assert row in strings, f"{name}: {line!r}"


def test_executed_copies_are_kept_and_refreshed(tmp_path, capfd):
    marker = tmp_path / "runs.txt"
    nb_path = tmp_path / "nb.ipynb"
    code = f"open({str(marker)!r}, 'a').write('x')\nprint('hello')"
    nbformat.write(new_notebook(cells=[new_code_cell(code), new_code_cell("1 + 1")]), nb_path)
    cache = tmp_path / "cache"
    first = execute.executed(nb_path, cache)
    again = execute.executed(nb_path, cache)
    assert marker.read_text() == "x", "the kept copy is reused, not run again"
    assert first.cells[0].outputs[0]["text"] == "hello\n" == again.cells[0].outputs[0]["text"]
    nb = nbformat.read(nb_path, as_version=4)
    nb.cells[1].source = "2 + 2"
    nbformat.write(nb, nb_path)
    changed = execute.executed(nb_path, cache)
    assert marker.read_text() == "xx" and changed.cells[1].outputs[0]["data"]["text/plain"] == "4"
    assert len(list(cache.glob("nb-*.ipynb"))) == 1, "the stale copy is removed"
    assert "without encryption" not in capfd.readouterr().err


def test_execution_shows_a_progress_bar_per_notebook(tmp_path, monkeypatch, capfd):
    nb_path = tmp_path / "bar.ipynb"
    nbformat.write(new_notebook(cells=[new_code_cell("1"), new_code_cell(""),
                                       new_code_cell("2")]), nb_path)
    monkeypatch.setenv("MAMBALEARN_PROGRESS", "1")
    execute.executed(nb_path, tmp_path / "cache")
    err = capfd.readouterr().err
    assert re.search(r"bar: 100%.*2/2", err), err[-500:]


def _widget_outputs(nb, cell):
    """The outputs an interact() cell's Output widget holds in the executed notebook."""
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    views = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
             for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in
             o.get("data", {})]
    todo, outs = list(views), []
    while todo:
        model = state[todo.pop()]
        if model["model_name"] == "OutputModel":
            outs += model["state"].get("outputs", [])
        todo += [c.removeprefix("IPY_MODEL_") for c in model["state"].get("children", [])]
    return outs


WIDGET_CHAPTERS = [p for p in CHAPTERS if "interact(" in p.read_text()]


@pytest.mark.parametrize("path", WIDGET_CHAPTERS, ids=[p.stem for p in WIDGET_CHAPTERS])
def test_every_widget_shows_one_figure(path):
    """interact() draws the figure its function makes and displays what it returns: a figure
    function called as is shows every figure twice."""
    nb = execute.executed(path)
    cells = [c for c in nb.cells if c.cell_type == "code" and "interact(" in c.source]
    assert cells
    for cell in cells:
        images = [o for o in _widget_outputs(nb, cell) if "image/png" in o.get("data", {})]
        assert len(images) == 1, (f"{path.name}: {cell.source.splitlines()[-1][:60]!r} shows "
                                  f"{len(images)} figures")


def test_a_cell_that_raises_is_reported_in_one_line(tmp_path):
    nb = new_notebook(cells=[new_code_cell("x = 1"), new_code_cell("1 / 0")])
    with pytest.raises(execute.NotebookError, match=r"^nb: ZeroDivisionError: division by zero$"):
        execute.execute(nb, tmp_path, desc="nb")


def test_a_cell_or_a_child_that_runs_too_long_is_stopped(tmp_path):
    import os
    import time

    nb = new_notebook(cells=[new_code_cell("import time\ntime.sleep(600)")])
    start = time.monotonic()
    with pytest.raises(subprocess.CalledProcessError):  # the cell timeout, in the child
        execute.execute(nb, tmp_path, timeout=3, attempts=1)
    with pytest.raises(subprocess.TimeoutExpired):  # the watchdog on the child itself
        execute._run([sys.executable, "-c", "import time; time.sleep(600)"], dict(os.environ),
                     2, 0, "hangs", 0)
    assert time.monotonic() - start < 120


def test_online_deck_loads_its_assets_from_cdns(tmp_path):
    from mambalearn.classroom import slides, slides_offline

    html = slides.export(CH01, tmp_path, offline=False).read_text()
    remote = slides_offline.remote_urls(html)
    assert any("reveal.js" in u for u in remote) and any("mathjax" in u.lower() for u in remote)
    assert "mermaid" not in html and not (tmp_path / "vendor").exists()
