"""Exercise notebooks: generate them from solutions, and grade a student's copy.

    python -m course.classroom.grade make-exercise solutions/01_x.ipynb exercises/ex01_x.ipynb
    python -m mambalearn grade my_01_x.ipynb [--timeout 120]
    python -m mambalearn grade --class submissions/ --exercises 01,03 --out grades.csv [--jobs 2]
    pytest --nbval-lax exercises/ex01_x.ipynb        (the same grading, cell by cell: a self-check)

Generation (``pristine.make_exercise``) runs nbgrader's ``ClearSolutions``: the code between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes ``raise NotImplementedError()``; the result
goes to ``exercises/``; the grader makes its own copy from ``solutions/`` (``pristine.build``).

Grading (``submission.grade``) trusts nothing in the submission but its solution cells: the
exercise comes from the notebook's metadata (or name), the checks from the grader's pristine
copy, the student's code runs under nbval in a box with the library of its chapter (the exercise's
answers switched off), and the checks run outside it. docs/GRADING.md explains what is defended
and what is not. A whole class (one folder per student) is graded by
``course.classroom.gradebook``. Exit status: 0 full marks, 1 graded below full, 2 an error.
"""

import argparse
import sys

from course.classroom import cli, gradebook, pristine, sandbox, submission

make_exercise = pristine.make_exercise
grade = submission.grade

_WORD = {"pass": "pass", "fail": "FAIL", "not attempted": "not attempted"}


def _positive(text):
    """argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def report(rows, title=None):
    """The verdict for one notebook: a table (short reasons), the full reasons, the score."""
    width = max([4] + [len(r["task"]) for r in rows])
    verdict = max([6] + [len(_WORD[r["status"]]) for r in rows])
    lines = [title] if title else []
    lines.append(f"{'task'.ljust(width)}  {'result'.ljust(verdict)}  reason")
    for r in rows:
        lines.append(f"{r['task'].ljust(width)}  {_WORD[r['status']].ljust(verdict)}  {r['short']}"
                     .rstrip())
    got, total = sum(r["points"] for r in rows if r["passed"]), sum(r["points"] for r in rows)
    lines.append(f"score: {got} / {total}")
    if rows and all(r["status"] == "not attempted" for r in rows):
        lines.append("nothing attempted yet: this is the exercise as shipped. Write your code in "
                     "the cells that say `raise NotImplementedError()`, save, and grade again.")
    long = [r for r in rows if r["reason"] and r["reason"] != r["short"]]
    if long:
        lines += ["", "details:"]
        for r in long:
            first, *rest = r["reason"].strip().splitlines()
            lines += [f"  {r['task']}: {first}", *[f"    {line}" for line in rest]]
    return "\n".join(lines)


def parser():
    p = cli.parser("grade", description="Grade an exercise notebook (the checks run on your code "
                   "in a sandbox), or with --class a whole class into a gradebook.",
                   epilog="Exit status: 0 full marks, 1 graded below full marks, 2 an error. "
                          "docs/GRADING.md has the details.")
    p.add_argument("notebook", nargs="?", help="the student's exercise notebook (any name, any "
                   "folder: the exercise is read from its metadata)")
    p.add_argument("--timeout", type=_positive, default=120, help="seconds per cell (default 120)")
    p.add_argument("--class", dest="class_dir", metavar="DIR",
                   help="grade every student folder under DIR (see course.classroom.gradebook)")
    p.add_argument("--exercises", metavar="LIST", help="with --class: the assignment, chapter "
                   "numbers or exercise names (01,03_operator) or `all`")
    p.add_argument("--out", default="grades.csv", help="with --class: the gradebook CSV "
                   "(default grades.csv)")
    p.add_argument("--feedback", metavar="DIR", help="with --class: one feedback file per "
                   "student (default: feedback/ beside the CSV)")
    p.add_argument("--page", metavar="FILE", help="with --class: the class page (default: the "
                   "CSV's name with .html)")
    p.add_argument("--jobs", type=_positive, default=2, help="with --class: notebooks graded at "
                   "once (default 2)")
    p.add_argument("--pristine", metavar="PATH", help="for instructors: grade against this "
                   "exercise notebook (or, with --class, this folder of them) instead of the ones "
                   "shipped in the package")
    p.add_argument("--nproc", type=_positive, default=sandbox.Limits.nproc,
                   help="processes and threads one submission may run "
                        f"(default {sandbox.Limits.nproc})")
    p.add_argument("--fsize", type=_positive, default=sandbox.Limits.fsize // 2**20,
                   help="MB one file of a submission may reach "
                        f"(default {sandbox.Limits.fsize // 2**20})")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    args.limits = sandbox.Limits(nproc=args.nproc, fsize=args.fsize * 2**20)
    if args.class_dir and args.notebook:
        p.error(f"give a NOTEBOOK or --class DIR, not both (got {args.notebook} and --class "
                f"{args.class_dir})")
    if args.class_dir:
        return gradebook.main(args)
    if not args.notebook:
        p.error("give a NOTEBOOK or --class DIR")
    for option in ("exercises", "feedback", "page"):
        if getattr(args, option):
            p.error(f"--{option} belongs to --class")
    problem = cli.notebook_problem(args.notebook, "grade")
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        rows = grade(args.notebook, args.pristine, args.timeout, limits=args.limits)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    box = "in a bubblewrap sandbox" if sandbox.mode() == "bwrap" else "WITHOUT a sandbox"
    print(report(rows, title=f"{args.notebook} (graded {box})"))
    return 0 if rows and all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "make-exercise":
        if len(sys.argv) != 4:
            sys.exit("usage: python -m course.classroom.grade make-exercise SOLUTION EXERCISE")
        make_exercise(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
