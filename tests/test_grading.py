"""The grading pipeline: exercises are in sync (with the grader's copies, built from solutions/),
every solution scores full marks through the whole boxed path, every shipped exercise is "not
attempted", and the report keeps a short reason in the table and the whole one below it."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course.classroom import grade, pristine, submission, verdict

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
names = lambda paths: [p.name for p in paths]


def test_every_solution_has_an_exercise_and_a_pristine_copy():
    assert SOLUTIONS, "no solution notebooks found"
    assert [pristine.exercise_file(s.stem) for s in SOLUTIONS] == names(EXERCISES)
    assert names(SOLUTIONS) == [f"{e}.ipynb" for e in pristine.shipped()], \
        "the grader's copies (course/classroom/pristine/) are not one a solution"


def test_the_graders_copies_are_built_not_committed(tmp_path, monkeypatch):
    """The grader's copies are made from solutions/ (never committed twice): a missing, edited or
    stale copy is made again, a copy whose solution is gone is removed, a fresh one is kept."""
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "course/classroom/pristine"],
                             capture_output=True, text=True)
    if tracked.returncode == 0:  # (a copy of the repository without git says nothing)
        assert tracked.stdout == "", "course/classroom/pristine/ is built: git rm --cached it"
    solutions, into = tmp_path / "solutions", tmp_path / "pristine"
    solutions.mkdir()
    for name in ("01_discretization.ipynb", "03_operator.ipynb"):
        (solutions / name).write_bytes((ROOT / "solutions" / name).read_bytes())
    into.mkdir()
    (into / "02_gone.ipynb").write_text("{}")
    monkeypatch.setattr(pristine, "SOLUTIONS", solutions)
    built = pristine.build(into=into)
    assert sorted(built) == ["01_discretization", "03_operator"]
    assert not (into / "02_gone.ipynb").exists(), "a copy without its solution was kept"
    ex01 = ROOT / "exercises" / "ex01_discretization.ipynb"
    assert built["01_discretization"].read_bytes() == ex01.read_bytes()
    stamp = built["03_operator"].stat().st_mtime_ns
    checks = built["01_discretization"].read_text().replace("check.", "print  # check.")
    built["01_discretization"].write_text(checks)  # a check cell edited in the grader's copy
    again = pristine.build(into=into)
    assert again["01_discretization"].read_bytes() == ex01.read_bytes(), "an edited copy was used"
    assert again["03_operator"].stat().st_mtime_ns == stamp, "a fresh copy was made again"
    nb = nbformat.read(solutions / "01_discretization.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_markdown_cell("A new closing note."))
    nbformat.write(nb, solutions / "01_discretization.ipynb")  # the solution changed
    moved = nbformat.read(pristine.build(into=into)["01_discretization"], as_version=4)
    assert moved.cells[-1].source == "A new closing note.", "a stale copy was used"


@pytest.mark.parametrize("solution", SOLUTIONS, ids=names(SOLUTIONS))
def test_exercise_is_what_make_exercises_generates(solution, tmp_path):
    fresh = tmp_path / solution.name
    grade.make_exercise(solution, fresh)
    made = nbformat.read(fresh, as_version=4)
    for copy in (ROOT / "exercises" / pristine.exercise_file(solution.stem),
                 pristine.shipped()[solution.stem]):
        assert made == nbformat.read(copy, as_version=4), \
            f"{copy.relative_to(ROOT)} is stale: run `make exercises`"
    assert made.metadata["mambalearn"]["exercise"] == solution.stem
    for cell in made.cells:
        assert "### BEGIN SOLUTION" not in cell.source, "a solution leaked into the exercise"


@pytest.mark.parametrize("exercise", EXERCISES, ids=names(EXERCISES))
def test_exercise_as_shipped_is_not_attempted(exercise, tmp_path):
    copy = tmp_path / exercise.name
    copy.write_bytes(exercise.read_bytes())
    rows = grade.grade(copy, timeout=300)
    assert rows, "an exercise without check cells grades nothing"
    assert [r["status"] for r in rows] == ["not attempted"] * len(rows), rows
    assert "nothing attempted yet" in grade.report(rows)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=names(SOLUTIONS))
def test_solution_grades_full_marks(solution, tmp_path):
    """Restore, the boxed kernel with the library of the exercise's chapter (its answers switched
    off), checks in the grader; and every cell up to the last check runs there, the given ones too
    (none needs what the exercise takes away); later cells are not run (they change no verdict)."""
    copy = tmp_path / solution.name
    copy.write_bytes(solution.read_bytes())
    ws = submission.Workspace()
    try:
        exercise, nb, sub, shipped = submission.prepare(copy)
        assert exercise == solution.stem
        results, _, killed = submission.run(nb, ws.library(shipped, exercise), ws, timeout=300,
                                            plan=ws.plans[exercise])
    finally:
        ws.close()
    last = max(i for i, c in enumerate(nb_code(nb)) if c.metadata.get("nbgrader", {}).get("grade"))
    assert not killed and [r["status"] for r in results] == ["ok"] * (last + 1), \
        [(r["index"], r.get("ename"), r.get("evalue")) for r in results if r["status"] != "ok"]
    rows = submission.verdicts(nb, sub, shipped, results)
    assert rows and all(r["passed"] for r in rows), [(r["task"], r["reason"]) for r in rows]


def nb_code(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_report_short_reason_in_the_table_whole_one_below():
    """Issue 19 §1.5: the table cut reasons mid-word at ~200 characters."""
    long = ("ChunkedScanFn keeps 24576 bytes beyond its inputs for the backward, for l = 64 and "
            "chunk_size = 8: one state per chunk would be 1536 bytes and all the states 12288. "
            "Save a, b and the 8 chunk-entry states only (a slice of h keeps all of h alive).")
    rows = [dict(task="scan_backward", points=1, passed=True, status="pass", reason="", short="",
                 flags=""),
            dict(task="ChunkedScanFn", points=1, passed=False, status="fail", reason=long,
                 short=verdict.short(long), flags="")]
    text = grade.report(rows)
    table_line = next(line for line in text.splitlines() if line.startswith("ChunkedScanFn"))
    assert len(table_line) < 140 and table_line.endswith("…")
    assert not table_line.rstrip("…").rstrip().endswith("chunk_siz"), "cut inside a word"
    assert f"ChunkedScanFn: {long}" in text, "the whole reason is in the details"
    assert "score: 1 / 2" in text


def test_missing_and_unknown_notebooks_are_clear_errors(tmp_path):
    nb = tmp_path / "99_nothing.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), nb)
    cli = [sys.executable, "-m", "mambalearn", "grade"]
    out = subprocess.run(cli + [str(nb)], capture_output=True, text=True)
    assert out.returncode == 2 and "cannot tell which exercise" in out.stderr
    out = subprocess.run(cli + [str(tmp_path / "gone.ipynb")], capture_output=True, text=True)
    assert out.returncode == 2 and "no such notebook" in out.stderr


def test_a_stub_shows_one_short_message_in_the_notebook():
    """Issue 18: a stub's NotImplementedError showed ~25 lines of the checker's frames. Run as a
    student runs it (in the kernel, no grader): the check cell's error is one line."""
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "exercises" / "ex01_discretization.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    check_cell = next(c for c in nb.cells if c.source.strip() == "check.zoh(zoh)")
    error = next(o for o in check_cell.outputs if o.output_type == "error")
    assert error.ename == "NotWrittenYet" and "zoh is not written yet" in error.evalue
    assert len(error.traceback) == 1, error.traceback
    assert "_core.py" not in "".join(error.traceback)


def test_without_bubblewrap_it_warns_and_still_grades(tmp_path):
    """§3: where bwrap is missing the grader says so, loudly, and grades unboxed."""
    import os

    copy = tmp_path / "01_discretization.ipynb"
    copy.write_bytes((ROOT / "solutions" / "01_discretization.ipynb").read_bytes())
    run = subprocess.run([sys.executable, "-m", "mambalearn", "grade", str(copy)],
                         capture_output=True, text=True,
                         env=dict(os.environ, MAMBALEARN_SANDBOX="plain"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "warning: bubblewrap (bwrap) is not available" in run.stderr
    assert "graded WITHOUT a sandbox" in run.stdout and "score: 3 / 3" in run.stdout
