"""The shipped exercises, kept inside the package, where a student's edits cannot reach them.

``make-exercise`` (what ``make exercises`` runs) writes the student version of each solution
notebook twice: to ``exercises/exNN_name.ipynb``, the copy students open and edit (``ex``: its
JupyterLab tab is not named like its chapter's, ``notebooks/NN_name.ipynb``), and to
``course/classroom/pristine/NN_name.ipynb``, the copy the grader restores check cells from. The
exercise's id (``NN_name``) goes into the notebook's metadata (``metadata.mambalearn.exercise``),
which JupyterLab keeps on Duplicate, Rename and Download, so a submission is matched to its exercise
by that id, whatever its file is called or wherever it lies — ``exercises/exNN_name.ipynb`` graded
in place included. Without the metadata the file name decides (``exNN_name-Copy1.ipynb``,
``exNN (1).ipynb``, the older ``NN_name.ipynb``: the chapter number), then the names of its
solution cells.
"""

import copy
import re
from pathlib import Path

PRISTINE = Path(__file__).resolve().parent / "pristine"
_EX = re.compile(r"^ex(?=\d\d(?![0-9a-z]))", re.I)  # "ex" before a chapter number: ex03_…, ex03 (1)
_CHAPTER = re.compile(r"^(\d\d)(?![0-9a-z])", re.I)  # 03_operator, 03 (1), 03: not 031 or 03b


def exercise_file(exercise):
    """The file name of exercise ``exercise`` in exercises/: ``"01_discretization"`` →
    ``"ex01_discretization.ipynb"``."""
    return f"ex{exercise}.ipynb"


def exercise_id(path):
    """The exercise a file's name says: ``exercises/ex01_discretization.ipynb`` (or the older name
    ``01_discretization.ipynb``) → ``"01_discretization"``; ``ex03 (1).ipynb`` → ``"03 (1)"``."""
    return _EX.sub("", Path(path).stem)


def meta(cell):
    return cell.metadata.get("nbgrader", {})


def make_exercise(src, dst, pristine_dir=None):
    """Write the student version of solution notebook ``src`` to ``dst`` (and ``pristine_dir``).

    nbgrader's ``ClearSolutions`` replaces the code between ``### BEGIN SOLUTION`` and
    ``### END SOLUTION`` by ``raise NotImplementedError()``; outputs are cleared.
    """
    import nbformat
    from nbconvert.preprocessors import ClearOutputPreprocessor
    from nbgrader.preprocessors import ClearSolutions

    nb = nbformat.read(src, as_version=4)
    nb, _ = ClearSolutions(enforce_metadata=False).preprocess(nb, {})
    nb, _ = ClearOutputPreprocessor().preprocess(nb, {})
    nb.metadata["mambalearn"] = {"exercise": Path(src).stem}
    for target in [Path(dst)] + ([Path(pristine_dir) / f"{Path(src).stem}.ipynb"]
                                 if pristine_dir else []):
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)


def shipped(pristine_dir=PRISTINE):
    """{exercise id: path} of the pristine exercises (or of a folder like exercises/)."""
    return {exercise_id(p): p for p in sorted(Path(pristine_dir).glob("*.ipynb"))}


def _solution_names(nb):
    names = {meta(c)["grade_id"] for c in nb.cells
             if meta(c).get("solution") and "grade_id" in meta(c)}
    for c in nb.cells:
        if c.cell_type == "code":
            names.update(re.findall(r"^(?:def|class) (\w+)", c.source, re.M))
    return names


def identify(submission, path, exercises):
    """The exercise id of ``submission`` (a notebook read from ``path``), or None.

    ``exercises`` is {id: path}. Metadata first, then the file name, then the solution cells.
    """
    declared = submission.metadata.get("mambalearn", {}).get("exercise")
    if declared in exercises:
        return declared
    named = exercise_id(path)
    if named in exercises:
        return named
    m = _CHAPTER.match(named)
    same_chapter = [e for e in exercises if m and e.startswith(m.group(1) + "_")]
    if len(same_chapter) == 1:
        return same_chapter[0]
    import nbformat

    mine = _solution_names(submission)
    scores = {}
    for e, p in exercises.items():
        theirs = {meta(c)["grade_id"] for c in nbformat.read(p, as_version=4).cells
                  if meta(c).get("solution")}
        if theirs and mine & theirs:
            scores[e] = len(mine & theirs) / len(theirs)
    best = sorted(scores.items(), key=lambda kv: -kv[1])
    if best and (len(best) == 1 or best[0][1] > best[1][1]):
        return best[0][0]
    return None


def solution_cells(submission):
    """{grade_id: cell} of the submission's solution cells (by metadata, else by a matching def)."""
    found = {meta(c)["grade_id"]: c for c in submission.cells
             if meta(c).get("solution") and "grade_id" in meta(c)}
    for c in submission.cells:  # metadata lost (e.g. copied into a new cell): find `def <name>(`
        m = re.search(r"^(?:def|class) (\w+)\b", c.source, re.M) if c.cell_type == "code" else None
        if m and m.group(1) not in found and not meta(c).get("grade"):
            found[m.group(1)] = c
    return found


def restore(submission, pristine):
    """The pristine notebook with the submission's solution cells put in (matched by grade_id).

    Every other cell — check cells above all — comes from the pristine copy: editing, emptying or
    deleting a check cell, or adding cells, changes nothing.
    """
    student = solution_cells(submission)
    out = copy.deepcopy(pristine)
    for i, cell in enumerate(out.cells):
        gid = meta(cell).get("grade_id")
        if meta(cell).get("solution") and gid in student:
            out.cells[i] = copy.deepcopy(student[gid])
            out.cells[i].cell_type = "code"
            out.cells[i].metadata["nbgrader"] = copy.deepcopy(meta(cell))  # the shipped labels
        if out.cells[i].cell_type == "code":
            out.cells[i].outputs, out.cells[i].execution_count = [], None
    return out


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def tasks(nb):
    """[(code-cell index, grade_id, points)] of the check cells, in notebook order."""
    return [(i, meta(c)["grade_id"], meta(c).get("points", 1))
            for i, c in enumerate(code_cells(nb)) if meta(c).get("grade")]


def task_name(grade_id):
    return grade_id.removeprefix("check_")


def check_call(source):
    """(check name, argument names) of a check cell ``check.<name>(<arg>, ...)``."""
    m = re.fullmatch(r"\s*check\.(\w+)\(([\w\s,]*)\)\s*", source)
    if not m:
        raise ValueError(f"a check cell must be `check.<name>(<name>, ...)`, got {source!r}")
    return m.group(1), [a.strip() for a in m.group(2).split(",") if a.strip()]


def solutions_of(nb, index):
    """grade_ids of the solution cells check cell ``index`` (a code-cell index) depends on: those
    it passes, and the solution cells before it that no check passes (the kernel a launcher calls).
    """
    cells = code_cells(nb)
    before = [meta(c)["grade_id"] for c in cells[:index] if meta(c).get("solution")]
    passed_anywhere = {a for i, _, _ in tasks(nb) for a in check_call(cells[i].source)[1]}
    args = check_call(cells[index].source)[1]
    return [g for g in before if g in args or g not in passed_anywhere]


def normal(source):
    """``source`` with every run of whitespace one space: edits of layout alone do not count."""
    return re.sub(r"\s+", " ", source).strip()


def unchanged(cell, pristine_cell):
    """True when a solution cell is still the shipped stub."""
    return normal(cell.source) == normal(pristine_cell.source)
