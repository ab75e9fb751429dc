"""Grade a whole class: one folder per student, every exercise notebook in it, one CSV.

    python -m mambalearn grade --class submissions/ --out grades.csv [--jobs 2] [--timeout 120]

Layout: ``submissions/<student>/**/NN_name.ipynb`` (nbgrader's ``submitted/<student>/<assignment>/``
works too). A notebook is matched to the shipped exercise of the same name, else to the one with
the same ``NN_`` chapter number (``01_discretization (1).ipynb`` still counts). Every exercise that
any student submitted is graded for every student; a missing one scores 0, "not submitted".

Each notebook is graded by ``mambalearn.classroom.grade.grade`` in its own process group (pytest and a
kernel), ``jobs`` at a time, with a per-cell timeout and a wall-clock limit per notebook: a
submission that hangs, crashes its kernel or is not valid JSON fails its own tasks and nothing else.

The CSV has one row per student: ``student``, one column per task (points earned), ``total``,
``max``, then ``<task> reason`` per task (empty when passed). Task columns are the bare task names
(``zoh``), or ``NN_name:task`` when two exercises share a task name.
"""

import csv
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from mambalearn.classroom import grade as _grade


def _chapter(name):
    return name.split("_", 1)[0] if "_" in name else None


def find_submissions(class_dir, exercises):
    """{student: {exercise name: notebook path}} and a list of notes (files that match nothing)."""
    shipped = {p.name: p for p in sorted(Path(exercises).glob("*.ipynb"))}
    by_chapter = {_chapter(n): n for n in shipped}
    found, notes = {}, []
    folders = [p for p in Path(class_dir).iterdir() if p.is_dir() and not p.name.startswith(".")]
    for folder in sorted(folders):
        mine = found.setdefault(folder.name, {})
        for nb in sorted(folder.rglob("*.ipynb")):
            if ".ipynb_checkpoints" in nb.parts:
                continue
            name = nb.name if nb.name in shipped else by_chapter.get(_chapter(nb.name))
            if name is None:
                notes.append(f"{folder.name}: {nb.name} matches no exercise, ignored")
            elif name in mine and nb.name != name:  # an exact name wins over a chapter match
                notes.append(f"{folder.name}: {nb.name} ignored, {mine[name].name} graded")
            else:
                mine[name] = nb
    return found, shipped, notes


def _grade_one(notebook, pristine, timeout, wall):
    try:
        return _grade.grade(notebook, pristine, timeout, wall)
    except Exception as e:  # noqa: BLE001 - one broken submission must not stop the class
        shipped = nbformat.read(pristine, as_version=4)
        return _grade._failed_all(shipped, f"grader error: {e!r}"[:240])


def grade_class(class_dir, exercises=None, jobs=2, timeout=120, wall=None, log=None):
    """Grade every student folder under ``class_dir``.

    Returns (rows, columns): ``rows`` is one dict per student with ``student``, ``total``, ``max``
    and per task ``(column, points, passed, reason)`` under ``"tasks"``; ``columns`` lists the
    task columns in exercise then notebook order.
    """
    exercises = Path(exercises) if exercises else _grade.REPO / "exercises"
    found, shipped, notes = find_submissions(class_dir, exercises)
    graded = sorted({name for mine in found.values() for name in mine})
    plan = {name: _grade.tasks(nbformat.read(shipped[name], as_version=4)) for name in graded}
    task = lambda gid: gid.removeprefix("check_")
    names = [task(gid) for name in graded for _, gid, _ in plan[name]]
    column = {(name, gid): task(gid) if names.count(task(gid)) == 1
              else f"{name.removesuffix('.ipynb')}:{task(gid)}"
              for name in graded for _, gid, _ in plan[name]}

    jobs_in = [(s, name, nb) for s, mine in found.items() for name, nb in mine.items()]
    results = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each job is its own process group
        futures = {(s, name): pool.submit(_grade_one, nb, shipped[name], timeout, wall)
                   for s, name, nb in jobs_in}
        for key, fut in futures.items():
            results[key] = fut.result()
            if log:
                log(f"graded {key[0]}/{key[1]}")

    rows = []
    for student in found:
        row = {"student": student, "tasks": [], "total": 0, "max": 0}
        for name in graded:
            got = {f"check_{r['task']}": r for r in results.get((student, name), [])}
            for _, gid, points in plan[name]:
                r = got.get(gid, {"passed": False, "reason": "not submitted"})
                row["tasks"].append((column[(name, gid)], points, r["passed"], r["reason"]))
                row["total"] += points if r["passed"] else 0
                row["max"] += points
        rows.append(row)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return rows, list(column.values())


def write_csv(rows, columns, out):
    """One row per student: student, points per task, total, max, a reason per task."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", *columns, "total", "max", *[f"{c} reason" for c in columns]])
        for row in rows:
            pts = [p if ok else 0 for _, p, ok, _ in row["tasks"]]
            why = ["" if ok else reason for _, _, ok, reason in row["tasks"]]
            w.writerow([row["student"], *pts, row["total"], row["max"], *why])


def table(rows, columns):
    """The verdict table as text: student, pass/FAIL per task, score."""
    width = max([7] + [len(r["student"]) for r in rows])
    cols = [max(4, len(c)) for c in columns]
    head = [c.ljust(n) for c, n in zip(columns, cols, strict=True)]
    lines = ["  ".join(["student".ljust(width), *head, "score"])]
    for r in rows:
        marks = [("pass" if ok else "FAIL").ljust(n)
                 for (_, _, ok, _), n in zip(r["tasks"], cols, strict=True)]
        lines.append("  ".join([r["student"].ljust(width), *marks, f"{r['total']}/{r['max']}"]))
    return "\n".join(lines)


def main(args):
    """``mambalearn grade --class``: parsed arguments from ``mambalearn.classroom.grade.main``."""
    if not Path(args.class_dir).is_dir():
        print(f"error: --class {args.class_dir} is not a folder", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows, columns = grade_class(args.class_dir, args.exercises, args.jobs, args.timeout,
                                log=lambda m: print(m, file=sys.stderr, flush=True))
    if not rows:
        print(f"error: no student folders under {args.class_dir}", file=sys.stderr)
        return 2
    write_csv(rows, columns, args.out)
    print(table(rows, columns))
    print(f"wrote {args.out}: {len(rows)} students, {len(columns)} tasks "
          f"in {time.perf_counter() - start:.0f} s with {args.jobs} jobs")
    return 0
