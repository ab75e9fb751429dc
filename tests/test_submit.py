"""`make submit`: a notebook is checked without running it, then packaged for handing in."""

import nbformat
from _grading_cases import ROOT, edited

from mambalearn.classroom import submit


def test_a_good_notebook_is_packaged_with_outputs_cleared(tmp_path, capsys):
    nb = nbformat.read(ROOT / "solutions" / "01_discretization.ipynb", as_version=4)
    nb.cells[3].outputs = [nbformat.v4.new_output("stream", text="a lot of output\n")]
    src = tmp_path / "my copy (1).ipynb"
    nb.metadata["mambalearn"] = {"exercise": "01_discretization"}
    nbformat.write(nb, src)
    assert submit.main([str(src), "--student", "ada", "--out", str(tmp_path / "out")]) == 0
    target = tmp_path / "out" / "ada" / "ex01_discretization.ipynb"
    assert f"wrote {target}" in capsys.readouterr().out
    made = nbformat.read(target, as_version=4)
    assert all(not c.get("outputs") for c in made.cells if c.cell_type == "code")
    meta = made.metadata["mambalearn"]
    assert meta["exercise"] == "01_discretization" and len(meta["solutions_sha256"]) == 64


def test_stubs_are_listed_and_broken_notebooks_refused(tmp_path, capsys):
    shipped = tmp_path / "ex01_discretization.ipynb"
    shipped.write_bytes((ROOT / "exercises" / "ex01_discretization.ipynb").read_bytes())
    assert submit.main([str(shipped), "--out", str(tmp_path / "out")]) == 0
    assert "`zoh` is still the shipped stub" in capsys.readouterr().out
    broken = edited("solutions/01_discretization.ipynb", tmp_path / "b" / "01_discretization.ipynb",
                    replace={"zoh": "def zoh(A, B, delta)\n    return A\n"})
    assert submit.main([str(broken)]) == 2
    assert "the `zoh` cell is not valid Python" in capsys.readouterr().err
    (tmp_path / "notes.ipynb").write_text("{ not json")
    assert submit.main([str(tmp_path / "notes.ipynb")]) == 2
    assert "not a readable notebook" in capsys.readouterr().err
    deleted = edited("solutions/01_discretization.ipynb",
                     tmp_path / "d" / "01_discretization.ipynb")
    nb = nbformat.read(deleted, as_version=4)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "bilinear"]
    nbformat.write(nb, deleted)
    assert submit.main([str(deleted)]) == 2
    assert "has no cell for bilinear" in capsys.readouterr().err


def test_make_lab_switches_nbgrader_off():
    """nbgrader's Validate and its menus grade in the student's kernel with the whole library;
    `make lab` loads the course's Jupyter config, which switches every nbgrader extension off."""
    import json
    import sys
    from pathlib import Path

    config = ROOT / "mambalearn" / "classroom" / "jupyter"
    assert f"JUPYTER_CONFIG_PATH=$(CURDIR)/{config.relative_to(ROOT)}" in \
        (ROOT / "Makefile").read_text()
    page = json.loads((config / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"]["@jupyter/nbgrader"] is True
    off = json.loads((config / "jupyter_server_config.json").read_text())
    off = off["ServerApp"]["jpserver_extensions"]
    shipped = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "nbgrader.json"
    on = json.loads(shipped.read_text())["ServerApp"]["jpserver_extensions"] if shipped.exists() \
        else {}
    assert {name for name, enabled in on.items() if enabled} <= {n for n, v in off.items() if not v}
