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

from course.classroom import execute, pristine, slides_layout

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CH01 = ROOT / "notebooks" / "01_discretization.ipynb"


def _kinds(path):
    return [c.metadata["slideshow"]["slide_type"] for c in nbformat.read(path, as_version=4).cells]


def test_chapter_01_deck(tmp_path):
    # a subprocess, as `make slides` runs it; the kernel is the executed copy's, kept or made now
    done = subprocess.run([sys.executable, "-m", "course.classroom.slides", str(CH01),
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
    from course.classroom import slides, slides_offline

    html = slides.export(CH01, tmp_path, offline=False).read_text()
    remote = slides_offline.remote_urls(html)
    assert any("reveal.js" in u for u in remote) and any("mathjax" in u.lower() for u in remote)
    assert "mermaid" not in html and not (tmp_path / "vendor").exists()


def test_markdown_images_are_embedded_and_a_missing_one_is_an_error(tmp_path):
    from course.classroom import pages, slides

    (tmp_path / "figs").mkdir()
    (tmp_path / "book").mkdir()
    png = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
                        "0000000d4944415478da63f8cfc0f01f0005000201e2a1d0b00000000049454e44ae426082")
    (tmp_path / "figs" / "one.png").write_bytes(png)
    nb = new_notebook(cells=[new_markdown_cell("# Pictures\n\n![a figure](../figs/one.png)",
                                               metadata={"slideshow": {"slide_type": "slide"}})])
    html = slides.export(tmp_path / "book" / "ch.ipynb", tmp_path / "deck", offline=False,
                         nb=nb).read_text()
    assert "../figs/one.png" not in html and 'src="data:image/png;base64,iVBORw0KGgo' in html
    assert nb.cells[0].source.endswith("(../figs/one.png)"), "the notebook itself is not changed"
    nb.cells[0].source = "![gone](../figs/missing.png)"
    with pytest.raises(FileNotFoundError, match="missing.png"):
        pages.prepare(nb, tmp_path / "book" / "ch.ipynb")


def test_a_gpu_cell_shows_its_recording_only_for_the_same_source(tmp_path):
    """pages.prepare puts a recorded GPU output in place of "skipped: no GPU", with its device and
    date, and only for the cell source it was recorded from; the deck leaves out a GPU cell that
    has no recording."""
    import hashlib
    import json

    from course.classroom import pages

    gpu = 'if not device.HAS_GPU:\n    print("skipped: no GPU")\nelse:\n    print(run())'
    other = gpu.replace("run()", "run(2)")
    cells = [new_markdown_cell("# Timing", metadata={"slideshow": {"slide_type": "slide"}})]
    for src in (gpu, other):
        cell = new_code_cell(src, metadata={"slideshow": {"slide_type": "fragment"}})
        cell.outputs = [new_output("stream", name="stdout", text="skipped: no GPU\n")]
        cells.append(cell)
    results = tmp_path / "results"
    results.mkdir()
    row = {"cell": 1, "source_sha256": hashlib.sha256(gpu.encode()).hexdigest(),
           "outputs": [{"output_type": "stream", "name": "stdout", "text": "12.5 ms\n"}]}
    meta = {"device": "Test GPU", "date": "2026-01-02", "commit": "abc1234", "command": "x"}
    for date in ("2026-01-01", "2026-01-02"):  # the newest file is the one read
        (results / f"test_outputs-ch_{date}.json").write_text(json.dumps(
            {"meta": dict(meta, date=date), "rows": [row] if date.endswith("2") else []}))
    nb = pages.prepare(new_notebook(cells=cells), tmp_path / "ch.ipynb", results)
    texts = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells[1:]]
    assert texts[0].startswith("[recorded on Test GPU, 2026-01-02 (commit abc1234;")
    assert texts[0].endswith("12.5 ms\n")
    assert texts[1] == "skipped: no GPU\n", "an edited cell never shows an old recording"
    assert pages.unrecorded(nb) == [nb.cells[2]]
    out = slides_layout.prepare(nb).cells
    assert [c.metadata["slideshow"]["slide_type"] for c in out] == ["slide", "fragment", "skip"]


DISPLAY_MATH = re.compile(r"\$\$|\\begin\{(align|equation)")
DURATION = re.compile(r"\b\d+(?:–\d+)? min\b")


def slides_of(nb):
    """The cells of each (sub)slide: a new group at every ``slide`` or ``subslide`` cell."""
    groups = []
    for cell in nb.cells:
        if not groups or cell.metadata["slideshow"]["slide_type"] in ("slide", "subslide"):
            groups.append([])
        groups[-1].append(cell)
    return groups


def carries_content(cells):
    """A result or a figure (a visible code cell) or a derivation (display math) on the slide."""
    shown = [c for c in cells if c.metadata["slideshow"]["slide_type"] not in ("skip", "notes")]
    return any(c.cell_type == "code" or DISPLAY_MATH.search(c.source) for c in shown)


def missing_notes(nb):
    """Slides (their first line) that carry content but have no note saying what to say, what to
    ask (a question) and how long (``N min``)."""
    missing = []
    for cells in slides_of(nb):
        notes = " ".join(c.source for c in cells
                         if c.metadata["slideshow"]["slide_type"] == "notes")
        if carries_content(cells) and not (len(notes.split()) >= 30 and "?" in notes
                                           and DURATION.search(notes)):
            missing.append(cells[0].source.strip().splitlines()[0][:60] if cells[0].source.strip()
                           else cells[0].id)
    return missing


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_slide_with_a_result_a_figure_or_a_derivation_has_speaker_notes(path):
    nb = nbformat.read(path, as_version=4)
    missing = missing_notes(nb)
    assert not missing, f"{path.name}: {len(missing)} slides without notes: {missing[:5]}"


def test_the_notes_check_sees_a_slide_without_a_note():
    kind = lambda k: {"slideshow": {"slide_type": k}}
    note = ("Say: the loop decays the state, writes the input and reads it out; three lines carry "
            "the whole algorithm, and the oracle of every later chapter. Ask: how many "
            "multiplications per step, in terms of n? About 2 min.")
    nb = new_notebook(cells=[new_markdown_cell("# Deck", metadata=kind("slide")),
                             new_markdown_cell("## Prose only", metadata=kind("subslide")),
                             new_markdown_cell("## Math\n\n$$h_t = a h_{t-1}$$",
                                               metadata=kind("subslide")),
                             new_code_cell("print(1)", metadata=kind("subslide")),
                             new_markdown_cell(note, metadata=kind("notes")),
                             new_code_cell("print(2)", metadata=kind("subslide")),
                             new_markdown_cell("Say it. Ask it? 2 min.", metadata=kind("notes"))])
    assert missing_notes(nb) == ["## Math", "print(2)"]  # no note; a note too short to help


def test_every_deck_has_speaker_notes_and_ends_with_its_exercise():
    done = subprocess.run([sys.executable, "tools/exercise_cells.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout
    for path in CHAPTERS:
        nb = nbformat.read(path, as_version=4)
        notes = [c for c in nb.cells if c.metadata["slideshow"]["slide_type"] == "notes"]
        assert notes and all(len(c.source.split()) >= 20 for c in notes), path.name
        last = nb.cells[-1]
        exercise = pristine.exercise_file(path.stem)
        if (ROOT / "exercises" / exercise).exists():
            assert "exercise-link" in last.metadata.get("tags", []), path.name
            assert f"](../exercises/{exercise})" in last.source, path.name  # the link opens it
            assert f"make grade NB=exercises/{exercise}" in last.source, path.name


def test_every_slide_opens_with_a_title_and_figures_say_their_smallest_font():
    md = lambda text, kind: new_markdown_cell(text, metadata={"slideshow": {"slide_type": kind}})
    cells = [md("# Chapter", "slide"), md("## The scan\n\ntext", "-"),
             new_code_cell("x = 1", metadata={"slideshow": {"slide_type": "subslide"}}),
             md("Prose without a heading", "slide"), md("### Costs", "subslide"),
             md("```\n# not a heading\n```", "skip"),
             md("more", "subslide")]
    out = slides_layout.prepare(new_notebook(cells=cells)).cells
    heads = [(c.source, c.metadata["slideshow"]["slide_type"]) for c in out
             if c.metadata["slideshow"]["slide_type"] in ("slide", "subslide")]
    assert heads == [("# Chapter", "slide"), ("### The scan", "subslide"),
                     ("### The scan", "slide"), ("### Costs", "subslide"),
                     ("### Costs", "subslide")]
    assert len({c.id for c in out}) == len(out)  # the new cells have their own ids
    assert slides_layout.figure_font("ax.legend(fontsize=6)\nax.set_title('t', fontsize=9)",
                                     dpi=72) == 6
    assert slides_layout.figure_font("plt.plot(x)", dpi=144) == 20  # matplotlib's 10 pt
    assert slides_layout.figure_font("ax.legend(fontsize='small')", dpi=72) == 8.3
    fig = _png_cell("ax.legend(fontsize=6)")
    tags = slides_layout.prepare(new_notebook(cells=[md("# T", "slide"), fig])).cells[1]
    assert f"ml-figure-font-{slides_layout.figure_font('fontsize=6'):g}" in tags.metadata["tags"]


def test_an_interactive_figure_shows_as_on_the_site_with_its_line(tmp_path):
    """A skipped interact() cell: the deck shows the figure the cell before it drew and the site's
    line "Interactive in JupyterLab: …" under it (one approach, ``pages.static_widgets``), and no
    live widget."""
    from course.classroom import pages, slides

    kind = lambda k: {"slideshow": {"slide_type": k}}
    fig = _png_cell("plot_errors(deltas)", slide_type="-")
    live = new_code_cell("_ = interact(plot_errors, delta=FloatSlider())", metadata=kind("skip"))
    live.outputs = [new_output("display_data", data={
        pages.WIDGET_VIEW: {"model_id": "box", "version_major": 2, "version_minor": 0},
        "text/plain": "interactive(...)"})]
    state = {"box": {"model_name": "VBoxModel",
                     "state": {"children": ["IPY_MODEL_s", "IPY_MODEL_o"]}},
             "s": {"model_name": "FloatSliderModel", "state": {"description": "delta"}},
             "o": {"model_name": "OutputModel", "state": {"outputs": []}}}
    nb = new_notebook(cells=[new_markdown_cell("# Errors", metadata=kind("slide")), fig, live],
                      metadata={"widgets": {pages.WIDGET_STATE: {"state": state}}})
    html = slides.export(tmp_path / "w.ipynb", tmp_path, offline=False, nb=nb).read_text()
    assert "Interactive in JupyterLab" in html and "change delta" in html
    assert pages.WIDGET_VIEW not in html and html.count('src="data:image/png') == 1
