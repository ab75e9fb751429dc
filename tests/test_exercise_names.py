"""Exercise file names: `exercises/exNN_name.ipynb`, never the chapter's own name (two JupyterLab
tabs both reading `01_discretization.ipynb` cannot be told apart), and what a file's name says
when its metadata is gone: `exNN_…`, the older `NN_…`, a downloaded `ex03 (1).ipynb`."""

from pathlib import Path

import nbformat
import pytest

from course.classroom import gradebook, pristine
from mambalearn import chapters

ROOT = Path(__file__).resolve().parent.parent
NUMBERS = sorted({n for n in chapters.CHAPTERS.values() if n > 0})


@pytest.mark.parametrize("number", NUMBERS, ids=[f"{n:02d}" for n in NUMBERS])
def test_an_exercise_is_not_named_like_its_chapter(number):
    [chapter] = (ROOT / "notebooks").glob(f"{number:02d}_*.ipynb")
    assert not (ROOT / "exercises" / chapter.name).exists(), \
        f"exercises/{chapter.name} has its chapter's name: it must be exercises/ex{chapter.name}"
    if (ROOT / "solutions" / chapter.name).exists():
        assert (ROOT / "exercises" / pristine.exercise_file(chapter.stem)).exists(), \
            f"chapter {number:02d} has a solution but no exercises/ex{chapter.name}"


def test_no_exercise_shares_a_file_name_with_a_chapter():
    names = lambda folder: {p.name for p in (ROOT / folder).glob("*.ipynb")}
    assert names("exercises") and not names("exercises") & names("notebooks")
    assert all(n.startswith("ex") for n in names("exercises")), names("exercises")


SHIPPED = pristine.shipped()
NAMED = {  # file name → the exercise it says (the notebook has no metadata and no cells)
    "ex01_discretization.ipynb": "01_discretization",
    "ex01_discretization-Copy1.ipynb": "01_discretization",  # JupyterLab's Duplicate
    "ex03 (1).ipynb": "03_operator",  # downloaded twice
    "ex03_operator (2).ipynb": "03_operator",
    "EX03.ipynb": "03_operator",
    "03_operator.ipynb": "03_operator",  # the name exercises had before
    "01_discretization (1).ipynb": "01_discretization",
    "03.ipynb": "03_operator",
    "ex031.ipynb": None,  # not chapter 03 (nor 31)
    "ex3.ipynb": None,
    "03b.ipynb": None,
    "next03.ipynb": None,
    "ex99_nothing.ipynb": None,
    "homework.ipynb": None,
}


@pytest.mark.parametrize("name", NAMED)
def test_without_metadata_the_file_name_says_which_exercise(name):
    assert pristine.identify(nbformat.v4.new_notebook(), Path("somewhere") / name,
                             SHIPPED) == NAMED[name]


def test_the_metadata_wins_over_the_file_name():
    nb = nbformat.v4.new_notebook(metadata={"mambalearn": {"exercise": "03_operator"}})
    assert pristine.identify(nb, "ex01_discretization.ipynb", SHIPPED) == "03_operator"


def test_names_in_and_out():
    assert pristine.exercise_file("01_discretization") == "ex01_discretization.ipynb"
    assert pristine.exercise_id("exercises/ex01_discretization.ipynb") == "01_discretization"
    assert pristine.exercise_id("01_discretization.ipynb") == "01_discretization"
    assert pristine.exercise_id("exam.ipynb") == "exam"
    assert pristine.shipped(ROOT / "exercises").keys() == SHIPPED.keys(), \
        "grading against exercises/ (--pristine exercises/) must know the same ids"
    assert gradebook.assignment("ex03_operator,ex01,10", SHIPPED) == [
        "01_discretization", "03_operator", "10_ssd"]


def test_a_class_folder_grades_the_exactly_named_copy(tmp_path):
    """Two copies of one exercise: the one named exactly (new name before old, old before a
    download) is graded, and the other is noted."""
    exercise = ROOT / "exercises" / "ex01_discretization.ipynb"
    for student, files in {"ada": ["ex01 (1).ipynb", "ex01_discretization.ipynb"],
                           "bo": ["01_discretization.ipynb", "ex01_discretization.ipynb"],
                           "cy": ["01_discretization.ipynb", "ex01_discretization (1).ipynb"]
                           }.items():
        (tmp_path / student).mkdir()
        for f in files:
            (tmp_path / student / f).write_bytes(exercise.read_bytes())
    found, notes = gradebook.find_submissions(tmp_path, SHIPPED, {"01_discretization"})
    assert {s: mine["01_discretization"].name for s, mine in found.items()} == {
        "ada": "ex01_discretization.ipynb", "bo": "ex01_discretization.ipynb",
        "cy": "01_discretization.ipynb"}
    assert len(notes) == 3 and all("ignored" in n for n in notes), notes
