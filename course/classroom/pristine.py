"""The shipped exercises, built from solutions/ where a student's edits cannot reach them.

``make_exercise`` writes the student version of a solution notebook: ``make exercises`` writes it
to ``exercises/exNN_name.ipynb``, the copy students open and edit (``ex``: its JupyterLab tab is
not named like its chapter's, ``notebooks/NN_name.ipynb``). The grader restores check cells from
its own copy, ``course/classroom/pristine/NN_name.ipynb``, which no one commits or edits: `build`
makes it from ``solutions/NN_name.ipynb`` with the same ``make_exercise``, when it is missing or
when its solution (or this generator) has changed since it was made, and `shipped` builds before
it answers. The exercise's id (``NN_name``) goes into the notebook's metadata
(``metadata.mambalearn.exercise``), which JupyterLab keeps on Duplicate, Rename and Download, so a
submission is matched to its exercise by that id, whatever its file is called or wherever it lies
— ``exercises/exNN_name.ipynb`` graded in place included. Without the metadata the file name
decides (``exNN_name-Copy1.ipynb``, ``exNN (1).ipynb``, the older ``NN_name.ipynb``: the chapter
number), then the names of its solution cells.
"""

import copy
import functools
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

PRISTINE = Path(__file__).resolve().parent / "pristine"  # built, never committed (.gitignore)
SOLUTIONS = Path(__file__).resolve().parents[2] / "solutions"
MADE = "made.json"  # in the built folder: {exercise id: [solution's digest, copy's digest]}
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


def make_exercise(src, dst=None):
    """The student version of solution notebook ``src``, written to ``dst`` when given.

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
    if dst is not None:
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, dst)
    return nb


def _digest(data):
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def _generator():
    """What else decides the copy's bytes: this file (``make_exercise``) and the versions of the
    libraries it calls."""
    from importlib.metadata import PackageNotFoundError, version

    def v(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    own = Path(__file__).read_bytes()
    return own + "".join(f"{n}={v(n)};" for n in ("nbformat", "nbconvert", "nbgrader")).encode()


def _write(path, data):
    """``data`` to ``path`` at once (a temporary file renamed): a reader running at the same
    time sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # (mkstemp's file is the owner's alone; a notebook is not secret)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build(solutions=None, into=PRISTINE):
    """Bring the grader's copies in ``into`` up to date with ``solutions`` (paths; default:
    every ``solutions/*.ipynb``, and then a copy whose solution is gone is removed). A copy is
    made again when it is missing, when its bytes are not those it was made with, or when its
    solution or the generator changed; else it is left alone (hashing is all a fresh folder
    costs). Returns ``{exercise id: path}`` of ``solutions``' copies."""
    every = solutions is None
    solutions = sorted(Path(SOLUTIONS).glob("*.ipynb")) if every else [Path(s) for s in solutions]
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    try:
        made = json.loads((into / MADE).read_text())
    except (OSError, ValueError):
        made = {}
    generator, out, changed = None, {}, False
    for src in solutions:
        stem, target = src.stem, into / f"{src.stem}.ipynb"
        if generator is None:
            generator = _digest(_generator())  # (once a call, when there is a solution)
        source = _digest(src.read_bytes() + generator.encode())
        held = target.read_bytes() if target.exists() else None
        if held is None or made.get(stem) != [source, _digest(held)]:
            import nbformat

            data = nbformat.writes(make_exercise(src)).encode()
            data += b"" if data.endswith(b"\n") else b"\n"  # as nbformat.write ends a file
            _write(target, data)
            made[stem], changed = [source, _digest(data)], True
        out[stem] = target
    if every:
        for stray in set(shipped(into)) - set(out):
            (into / f"{stray}.ipynb").unlink(missing_ok=True)
            made.pop(stray, None)
            changed = True
    if changed:
        _write(into / MADE, json.dumps(made, indent=1, sort_keys=True).encode())
    return out


def shipped(pristine_dir=None):
    """{exercise id: path} of the pristine exercises, built first where solutions/ is at hand
    (`build`), or of the notebooks in folder ``pristine_dir`` (like exercises/)."""
    if pristine_dir is None:
        if Path(SOLUTIONS).is_dir():
            return build()
        pristine_dir = PRISTINE  # a copy without solutions/: the copies it was given
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
