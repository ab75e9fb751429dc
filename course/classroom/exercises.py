"""``python -m mambalearn exercises``: exercises/ made from solutions/, a student's work kept.

    python -m mambalearn exercises [--dry-run] [--force] [SOLUTION ...]     # make exercises

For each solution notebook ``solutions/NN_name.ipynb`` (default: every ``solutions/*.ipynb``) the
student version is made (``pristine.make_exercise``: nbgrader's ``ClearSolutions``) and compared
with ``exercises/exNN_name.ipynb`` (``ex``: so that its JupyterLab tab is not named like the
chapter's, ``notebooks/NN_name.ipynb``):

* the same notebook: nothing to do (**unchanged**);
* absent, or with no cell edited since it was last generated (its cells are those of the new
  version, of the grader's copy made before, or of the exercise as the last commit holds it):
  **written**;
* anything else holds someone's work: **kept**, not replaced, and the cells that differ are
  named; ``--force`` replaces it all the same;
* an exercise under its old name, ``exercises/NN_name.ipynb`` (the chapter's), is **left** as it
  is, even with ``--force``: it is said whether it holds changes, and what to do with it.

Cells are compared by type and source: outputs and run counts are not work (they are cleared).
The grader's copies (``course/classroom/pristine/``, never committed: ``pristine.build``) are
brought up to date too: no student edits those. ``--dry-run`` says what would happen and writes
nothing. Exit status 0 when a notebook was kept or left too (keeping a student's work is this
command's job, and ``make slides site exercises`` goes on); 2 for a bad argument.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from course.classroom import cli, pristine

REPO = Path(__file__).resolve().parents[2]


def cells(path):
    """[(cell type, source)] of a notebook: what a student writes."""
    import nbformat

    return [(c.cell_type, c.source.strip()) for c in nbformat.read(path, as_version=4).cells]


def differing(a, b):
    """1-based numbers of the cells where notebooks ``a`` and ``b`` differ (all of the longer
    one's extra cells included)."""
    ca, cb = cells(a), cells(b)
    n = max(len(ca), len(cb))
    pad = lambda c: c + [None] * (n - len(c))
    return [i + 1 for i, (x, y) in enumerate(zip(pad(ca), pad(cb), strict=True)) if x != y]


def changes(target, new, *last):
    """"cells 3, 5 differ" (from the first of ``last`` that exists, the copies generated before,
    else from ``new``), or None where ``target`` holds no one's work: its cells are those of
    ``new`` or of one of ``last``."""
    last = [p for p in last if p is not None and Path(p).exists()]
    if cells(target) in [cells(new)] + [cells(p) for p in last]:
        return None
    diff = differing(target, last[0] if last else new)
    shown = ", ".join(map(str, diff[:8])) + (", …" if len(diff) > 8 else "")
    return f"cells {shown} differ" if len(diff) > 1 else f"cell {shown} differs"


def committed(path, tmp):
    """``path`` as the last commit holds it, copied under folder ``tmp`` (its path), or None where
    git does not track it (or there is no git)."""
    path = Path(path).resolve()
    if not path.is_relative_to(REPO):
        return None
    try:
        done = subprocess.run(["git", "-C", str(REPO), "show",
                               f"HEAD:./{path.relative_to(REPO).as_posix()}"],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    held = Path(tmp) / "committed" / path.name
    held.parent.mkdir(parents=True, exist_ok=True)
    held.write_bytes(done.stdout)
    return held


def plan(new, target, *last):
    """``("unchanged" | "written" | "kept", why)`` for generated notebook ``new`` going to
    ``target``, where ``last`` are the copies generated before (the grader's, the committed)."""
    import nbformat

    if not target.exists():
        return "written", "new"
    if nbformat.read(target, as_version=4) == nbformat.read(new, as_version=4):
        return "unchanged", ""
    work = changes(target, new, *last)
    if work is None:
        return "written", "updated from its solution"
    return "kept", f"it has changes not made here: {work} from the copy last generated"


def old_name(new, old, target, *last):
    """``("left", why)`` for ``old``, an exercise under the name it had before ``target``'s (its
    chapter's): never replaced nor deleted here; ``why`` says what it holds and what to do."""
    work = changes(old, new, *last)
    if work is None:
        return "left", f"the old name of {target.name}, nothing written in it: delete it"
    return "left", (f"the old name of {target.name}, with changes: {work} from the copy last "
                    f"generated; copy your work into {target.name} (or grade this file as it is), "
                    f"then delete this one")


def regenerate(solutions, out_dir, pristine_dir, force=False, dry_run=False):
    """Regenerate each exercise, and the grader's copies in ``pristine_dir`` (``pristine.build``);
    returns [(target, action, why)] (action as in ``plan``, or ``"replaced"`` where ``force``
    overwrote someone's work, or ``"left"`` for an exercise under its old name, ``old_name``)."""
    done = []
    with tempfile.TemporaryDirectory() as tmp:
        for src in solutions:
            src = Path(src)
            new = Path(tmp) / src.name
            pristine.make_exercise(src, new)
            target = Path(out_dir) / pristine.exercise_file(src.stem)
            last = (Path(pristine_dir) / src.name, committed(target, tmp))
            action, why = plan(new, target, *last)
            if action == "kept" and force:
                action = "replaced"
            done.append((target, action, why))
            old = Path(out_dir) / src.name  # the name exercises had before: their chapter's
            if old.exists():
                done.append((old, *old_name(new, old, target, *last)))
            if not dry_run and action in ("written", "replaced"):
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(new, target)
    if not dry_run:
        pristine.build(solutions, into=pristine_dir)
    return done


def main(argv=None):
    p = cli.parser("exercises", description="Regenerate exercises/ (and the grader's pristine "
                   "copies) from solutions/, never over a student's work.")
    p.add_argument("solutions", nargs="*", type=Path, metavar="SOLUTION",
                   help="solution notebooks (default: every solutions/*.ipynb)")
    p.add_argument("--out", type=Path, default=REPO / "exercises", metavar="DIR",
                   help="where the exercises go (default: exercises/)")
    p.add_argument("--force", action="store_true",
                   help="replace an exercise even where it has someone's changes (they are lost)")
    p.add_argument("--dry-run", action="store_true", help="say what would happen, write nothing")
    args = p.parse_args(argv)
    solutions = args.solutions or sorted((REPO / "solutions").glob("*.ipynb"))
    missing = [str(s) for s in solutions if not Path(s).is_file()]
    if missing or not solutions:
        p.error(f"no such solution notebook: {', '.join(missing) or 'solutions/*.ipynb'}")
    done = regenerate(solutions, args.out, pristine.PRISTINE, args.force, args.dry_run)
    would = "would be " if args.dry_run else ""
    for target, action, why in done:
        shown = target.relative_to(REPO) if target.is_relative_to(REPO) else target
        print(f"{shown}: {would}{action}" + (f" ({why})" if why else ""))
    kept = [t for t, action, _ in done if action == "kept"]
    if kept:
        print(f"{len(kept)} exercise(s) kept as they are. Save your work elsewhere first (or "
              "grade it: make grade NB=…), then `make exercises FORCE=1` replaces them.",
              file=sys.stderr)
    left = [t for t, action, _ in done if action == "left"]
    if left:
        print(f"{len(left)} exercise(s) under their old names (NN_name.ipynb, now exNN_name.ipynb) "
              "left as they are: nothing was replaced or deleted. Copy your work into the new "
              "file (or grade the old one: make grade NB=…), then delete the old one.",
              file=sys.stderr)
    return 0  # keeping a student's work is what this command should do, not a failure


if __name__ == "__main__":
    sys.exit(main())
