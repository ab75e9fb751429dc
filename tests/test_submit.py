"""`make submit`: a notebook is checked without running it, then packaged for handing in."""

import nbformat
import pytest
from _grading_cases import ROOT, edited

from course.classroom import submit


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

    config = ROOT / "course" / "classroom" / "jupyter"
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


def test_a_later_submission_never_loses_an_earlier_one(tmp_path, capsys):
    """Submitting again keeps the earlier copy numbered; the untouched exercise does not replace a
    finished one unless --replace; the grader's class folder grades the latest."""
    from course.classroom import gradebook
    from course.classroom import pristine as P

    out = tmp_path / "out"
    done = tmp_path / "work" / "ex01_discretization.ipynb"
    done.parent.mkdir()
    done.write_bytes((ROOT / "solutions" / "01_discretization.ipynb").read_bytes())
    nb = nbformat.read(done, as_version=4)
    nb.metadata["mambalearn"] = {"exercise": "01_discretization"}
    nbformat.write(nb, done)
    stub = tmp_path / "ex01_discretization.ipynb"
    stub.write_bytes((ROOT / "exercises" / "ex01_discretization.ipynb").read_bytes())
    target = out / "ada" / "ex01_discretization.ipynb"

    assert submit.main([str(done), "--student", "ada", "--out", str(out)]) == 0
    first = target.read_bytes()
    capsys.readouterr()
    assert submit.main([str(stub), "--student", "ada", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "task(s) attempted" in err and "--replace" in err and "nothing written" in err
    assert target.read_bytes() == first
    assert not (out / "ada" / "ex01_discretization.1.ipynb").exists()
    assert submit.main([str(stub), "--student", "ada", "--out", str(out), "--replace"]) == 0
    kept = out / "ada" / "ex01_discretization.1.ipynb"
    assert kept.read_bytes() == first and f"kept as {kept}" in capsys.readouterr().out
    assert submit.main([str(done), "--student", "ada", "--out", str(out)]) == 0
    assert (out / "ada" / "ex01_discretization.2.ipynb").exists()
    assert submit.main([str(done), "--student", "ada", "--out", str(out)]) == 0  # same work
    assert not (out / "ada" / "ex01_discretization.3.ipynb").exists()
    found, _ = gradebook.find_submissions(out, P.shipped())
    assert found["ada"]["01_discretization"] == target


@pytest.mark.parametrize("given, said", [
    ("notebooks/12_inference.ipynb", "is chapter 12's notebook, not its exercise: the exercise is "
                                     "exercises/ex12_inference.ipynb"),
    ("exercises/ex12_infrence.ipynb", "(did you mean exercises/ex12_inference.ipynb?)"),
    ("exercises", "is a folder: NB= takes one notebook"),
])
def test_a_wrong_notebook_gets_the_right_one_named(given, said, capsys, monkeypatch):
    from course.classroom import grade

    monkeypatch.chdir(ROOT)
    assert submit.main([given]) == 2
    assert said in capsys.readouterr().err
    assert grade.main([given]) == 2
    err = capsys.readouterr().err
    assert said in err and "save it from JupyterLab" not in err
    if given == "exercises":
        assert "CLASS=exercises" in err


def test_make_passes_names_as_typed(tmp_path):
    """`make submit`/`make grade`: a `$`, quotes, spaces and parentheses reach the program as
    typed (make's recipe, run against a stand-in python)."""
    import shutil
    import subprocess

    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    for f in ("pyproject.toml", "constraints.txt"):
        (tmp_path / f).touch()
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    py = tmp_path / ".venv" / "bin" / "python"
    py.write_text('#!/bin/sh\nfor a in "$@"; do printf "[%s]" "$a"; done\n')
    py.chmod(0o755)
    (tmp_path / ".venv" / ".installed").touch()
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "browser-deps.sh").write_text("true\n")
    name = "my $HOME 'copy' $(x) (1).ipynb"

    def make(*args):
        return subprocess.run(["make", "-s", *args], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60)

    done = make("submit", f"NB={name}", "STUDENT=a$b", "REPLACE=1")
    assert done.stdout == f"[-m][mambalearn][submit][{name}][--student][a$b][--replace]", done
    assert make("grade", f"NB={name}").stdout == f"[-m][mambalearn][grade][{name}]"
    assert make("grade", "CLASS=c $d", "EXERCISES=all").stdout.startswith(
        "[-m][mambalearn][grade][--class][c $d][--exercises][all][--out][grades.csv]")
    assert make("submit").returncode == 2 and make("grade").returncode == 2
