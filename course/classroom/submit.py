"""Hand in an exercise: check the notebook, then write the copy to hand in.

    make submit NB=exercises/ex01_discretization.ipynb [STUDENT=ada]
    python -m course.classroom.submit NOTEBOOK [--student NAME] [--out submission]

The checks run nothing: the file must be a notebook; it must be one of the course's exercises (its
metadata, its name or its cells say which); every solution cell of the exercise must be there and
be valid Python. Tasks whose cells are still the shipped stubs are listed (handing them in is
allowed, they score 0). Then the notebook is written to ``submission/[NAME/]exNN_name.ipynb``
with its outputs cleared (the grader runs the code anew) and the exercise id, the time and a
SHA-256 of its solution cells in its metadata, the layout ``make grade CLASS=…`` reads (one folder
per student). An earlier submission of the same exercise is never lost: it is kept beside the new
one as ``exNN_name.1.ipynb``, ``.2``… (the grader grades ``exNN_name.ipynb``), and a notebook with
fewer tasks attempted than the one already handed in is refused unless ``--replace`` (``make
submit … REPLACE=1``) says so.
To see the score first: ``make grade NB=…``. Exit status: 0 written, 2 refused.
"""

import ast
import datetime
import hashlib
import re
import sys
from pathlib import Path

import nbformat

from course.classroom import cli
from course.classroom import pristine as P


class Refused(ValueError):
    """The notebook cannot be handed in; the message says why and what to do."""


def validate(path, exercises=None):
    """(exercise id, the notebook, [warnings]) or ``Refused``."""
    exercises = exercises or P.shipped()
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same refusal
        raise Refused(f"{path} is not a readable notebook ({str(e).splitlines()[0][:200]}): "
                      f"save it from JupyterLab, or start again from exercises/") from None
    exercise = P.identify(nb, path, exercises)
    if exercise is None:
        raise Refused(f"cannot tell which exercise {path} is: start from a copy of "
                      f"exercises/exNN_name.ipynb, or name the file after its exercise")
    shipped = nbformat.read(exercises[exercise], as_version=4)
    stubs = {P.meta(c)["grade_id"]: c for c in shipped.cells if P.meta(c).get("solution")}
    mine = P.solution_cells(nb)
    missing = [g for g in stubs if g not in mine]
    if missing:
        raise Refused(f"{path} ({exercise}) has no cell for {', '.join(missing)}: copy the cell "
                      f"from exercises/{P.exercise_file(exercise)} back in and write your code "
                      f"there")
    warnings = []
    for gid, cell in mine.items():
        if gid not in stubs:
            continue
        try:
            ast.parse(re.sub(r"^\s*[%!].*$", "", cell.source, flags=re.M))
        except SyntaxError as e:
            raise Refused(f"the `{gid}` cell is not valid Python (line {e.lineno}: {e.msg}): fix "
                          f"it, run the cell, then submit again") from None
        if P.unchanged(cell, stubs[gid]):
            warnings.append(f"`{gid}` is still the shipped stub: it scores 0")
    return exercise, nb, warnings


def attempted(nb, exercise, exercises=None):
    """The tasks of ``nb`` (exercise ``exercise``) whose cells are no longer the shipped stubs."""
    exercises = exercises or P.shipped()
    shipped = nbformat.read(exercises[exercise], as_version=4)
    stubs = {P.meta(c)["grade_id"]: c for c in shipped.cells if P.meta(c).get("solution")}
    return {g for g, c in P.solution_cells(nb).items()
            if g in stubs and not P.unchanged(c, stubs[g])}


def earlier_name(target):
    """Where the submission at ``target`` is kept when a new one comes: ``exNN_name.K.ipynb``,
    the first K free."""
    k = 1
    while (kept := target.with_name(f"{target.stem}.{k}{target.suffix}")).exists():
        k += 1
    return kept


def package(nb, exercise, out_dir="submission", student=None, replace=False, exercises=None):
    """Write the copy to hand in; returns (its path, where an earlier one was kept or None).

    ``Refused`` where a submission with more tasks attempted is there and ``replace`` is false."""
    nb = nbformat.from_dict(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    digest = hashlib.sha256("\n".join(c.source for c in P.solution_cells(nb).values())
                            .encode()).hexdigest()
    nb.metadata["mambalearn"] = dict(nb.metadata.get("mambalearn", {}), exercise=exercise,
                                     submitted=datetime.datetime.now().isoformat(timespec="seconds"),
                                     solutions_sha256=digest)
    folder = Path(out_dir) / student if student else Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / P.exercise_file(exercise)
    kept = None
    if target.exists():
        try:
            old = nbformat.read(target, as_version=4)
        except Exception:  # noqa: BLE001 - an unreadable old copy is kept, never compared
            old = None
        same = old is not None and old.metadata.get("mambalearn", {}).get(
            "solutions_sha256") == digest
        if old is not None and not replace:
            before, now = attempted(old, exercise, exercises), attempted(nb, exercise, exercises)
            if len(now) < len(before):
                raise Refused(
                    f"{target} (handed in {old.metadata.get('mambalearn', {}).get('submitted')}) "
                    f"has {len(before)} task(s) attempted, this notebook {len(now)}: nothing "
                    f"written. Submit the notebook you worked in, or add --replace (make submit "
                    f"... REPLACE=1) to hand in this one anyway (the earlier one is kept)")
        if not same:
            kept = earlier_name(target)
            target.rename(kept)
    nbformat.write(nb, target)
    return target, kept


def main(argv=None):
    p = cli.parser("submit", description=__doc__.split("\n\n")[0])
    p.add_argument("notebook", help="your exercise notebook")
    p.add_argument("--student", help="your name or id: the copy goes to OUT/NAME/ (the layout "
                   "of a class folder)")
    p.add_argument("--out", default="submission", help="folder of the copy (default submission)")
    p.add_argument("--replace", action="store_true", help="hand this notebook in even where the "
                   "one already handed in has more tasks attempted (that one is kept, numbered)")
    args = p.parse_args(argv)
    if args.student is not None and not re.fullmatch(r"[\w.-]+", args.student):
        p.error(f"--student {args.student!r}: use letters, digits, '.', '-' and '_' only")
    problem = cli.notebook_problem(args.notebook, "submit")
    if problem:
        print(f"not submitted: {problem}", file=sys.stderr)
        return 2
    try:
        exercise, nb, warnings = validate(args.notebook)
        for w in warnings:
            print(f"warning: {w}")
        target, kept = package(nb, exercise, args.out, args.student, args.replace)
    except Refused as e:
        print(f"not submitted: {e}", file=sys.stderr)
        return 2
    if kept:
        print(f"the earlier submission is kept as {kept} (the grader grades {target.name})")
    print(f"{args.notebook} is exercise {exercise}: wrote {target} (outputs cleared); hand in "
          f"that file. Its score: make grade NB={target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
