"""The grading pipeline: exercises are in sync, fail as shipped, and tampering gains nothing."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from mambalearn.classroom import grade

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
names = lambda paths: [p.name for p in paths]


def test_every_solution_has_an_exercise():
    assert SOLUTIONS, "no solution notebooks found"
    assert names(SOLUTIONS) == names(EXERCISES)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=names(SOLUTIONS))
def test_exercise_is_what_make_exercises_generates(solution, tmp_path):
    fresh = tmp_path / solution.name
    grade.make_exercise(solution, fresh)
    shipped = nbformat.read(ROOT / "exercises" / solution.name, as_version=4)
    assert nbformat.read(fresh, as_version=4) == shipped, \
        f"exercises/{solution.name} is stale: run `make exercises`"
    for cell in shipped.cells:
        assert "### BEGIN SOLUTION" not in cell.source, "a solution leaked into the exercise"


@pytest.mark.parametrize("exercise", EXERCISES, ids=names(EXERCISES))
def test_exercise_fails_as_shipped(exercise, tmp_path):
    copy = tmp_path / exercise.name
    copy.write_bytes(exercise.read_bytes())
    rows = grade.grade(copy, pristine=exercise, timeout=300)
    assert rows, "an exercise without check cells grades nothing"
    assert not any(r["passed"] for r in rows), [r["task"] for r in rows if r["passed"]]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=names(SOLUTIONS))
def test_solution_grades_full_marks(solution, tmp_path):
    """Through the whole grading path (restore, fresh checks, nbval), the solution scores every task."""
    copy = tmp_path / solution.name
    copy.write_bytes(solution.read_bytes())
    rows = grade.grade(copy, pristine=ROOT / "exercises" / solution.name, timeout=300)
    assert rows and all(r["passed"] for r in rows), [(r["task"], r["reason"]) for r in rows]


def _edit(src, dst, replace=None, check_source=None, drop_check=None):
    """Copy a notebook, replacing solution cells' code and/or tampering with check cells."""
    nb = nbformat.read(src, as_version=4)
    keep = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and replace and meta["grade_id"] in replace:
            cell.source = replace[meta["grade_id"]]
        if meta.get("grade"):
            if drop_check and meta["grade_id"] == drop_check:
                continue
            if check_source is not None:
                cell.source = check_source
        keep.append(cell)
    nb.cells = keep
    nbformat.write(nb, dst)
    return dst


EULER = '''def zoh(A, B, delta):
    delta = torch.as_tensor(delta, dtype=A.dtype)
    if A.ndim == 1:
        return 1 + delta[..., None] * A, delta[..., None] * B
    return torch.eye(len(B), dtype=A.dtype) + delta[..., None, None] * A, delta[..., None] * B
'''
CH01 = "01_discretization.ipynb"


def test_tampered_checks_still_fail_wrong_code(tmp_path):
    sub = _edit(ROOT / "solutions" / CH01, tmp_path / CH01, replace={"zoh": EULER},
                check_source="pass  # checks disabled", drop_check="check_bilinear")
    rows = {r["task"]: r for r in grade.grade(sub, pristine=ROOT / "exercises" / CH01)}
    assert not rows["zoh"]["passed"] and "AssertionError" in rows["zoh"]["reason"]
    assert rows["bilinear"]["passed"] and rows["ssm_kernel"]["passed"]


def test_tampered_checks_pass_right_code_and_cli_exit_codes(tmp_path):
    sub = _edit(ROOT / "solutions" / CH01, tmp_path / CH01, check_source="")
    cli = [sys.executable, "-m", "mambalearn", "grade", str(sub), "--pristine", str(ROOT / "exercises" / CH01)]
    ok = subprocess.run(cli, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "score: 3 / 3" in ok.stdout
    _edit(sub, sub, replace={"ssm_kernel": "def ssm_kernel(A_bar, B_bar, C, length):\n    return C\n"})
    bad = subprocess.run(cli, capture_output=True, text=True)
    assert bad.returncode == 1 and "score: 2 / 3" in bad.stdout


def test_missing_pristine_is_a_clear_error(tmp_path):
    nb = tmp_path / "99_nothing.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), nb)
    out = subprocess.run([sys.executable, "-m", "mambalearn", "grade", str(nb)], capture_output=True, text=True)
    assert out.returncode == 2 and "no shipped exercise" in out.stderr


def test_monkeypatched_checks_do_not_help(tmp_path):
    """A solution cell that replaces the check with a no-op still fails: checks are re-imported."""
    cheat = EULER + "from mambalearn import check as _c\n_c.zoh = lambda fn: print('zoh: all passed')\n"
    sub = _edit(ROOT / "solutions" / CH01, tmp_path / CH01, replace={"zoh": cheat})
    rows = {r["task"]: r for r in grade.grade(sub, pristine=ROOT / "exercises" / CH01)}
    assert not rows["zoh"]["passed"] and "AssertionError" in rows["zoh"]["reason"]
    assert rows["bilinear"]["passed"]
