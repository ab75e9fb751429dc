"""Grade a whole class: one folder per student, every exercise notebook in it, one CSV.

    python -m mambalearn grade --class submissions/ --out grades.csv [--jobs 2] [--timeout 120]

Layout: ``submissions/<student>/**/*.ipynb`` (nbgrader's ``submitted/<student>/<assignment>/``
works too). Each notebook is matched to its exercise by the id in its metadata, else by its name
(``01_discretization-Copy1.ipynb``, ``01_discretization (1).ipynb``), else by its solution cells.
Every exercise that any student submitted is graded for every student; a missing one scores 0,
"not submitted".

Before any submission runs, every pristine exercise is read and every submission restored in
memory, and the graded library copies are built. Then ``jobs`` submissions run at once, each in its
own process group and box (``mambalearn.classroom.submission``): one that hangs, crashes its kernel,
writes elsewhere or is not valid JSON fails its own tasks and nothing else.

The CSV has one row per student: ``student``, one column per task (points earned), ``total``,
``max``, then ``<task> reason`` per task (the full reason; empty when passed) and ``notes`` (code
identical to the library's). Task columns are the bare task names (``zoh``), or ``NN_name:task``
when two exercises share a task name.
"""

import csv
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from mambalearn.classroom import pristine as P
from mambalearn.classroom import sandbox, submission

# Python 3.11's ast can raise "SystemError: AST constructor recursion depth mismatch" when two
# threads parse at once (seen grading a class with 3 test workers): the verdicts take turns.
AST_LOCK = threading.Lock()


def find_submissions(class_dir, exercises):
    """{student: {exercise id: notebook path}} and notes on files that match nothing."""
    found, notes = {}, []
    folders = [p for p in Path(class_dir).iterdir() if p.is_dir() and not p.name.startswith(".")]
    for folder in sorted(folders):
        mine = found.setdefault(folder.name, {})
        for nb in sorted(folder.rglob("*.ipynb")):
            if ".ipynb_checkpoints" in nb.parts:
                continue
            try:
                content = nbformat.read(nb, as_version=4)
            except Exception:  # noqa: BLE001 - graded (and failed) by name below
                content = nbformat.v4.new_notebook()
            name = P.identify(content, nb, exercises)
            if name is None:
                notes.append(f"{folder.name}: {nb.name} matches no exercise, ignored")
            elif name in mine and nb.stem != name:  # an exact name wins over other matches
                notes.append(f"{folder.name}: {nb.name} ignored, {mine[name].name} graded")
            else:
                if name in mine:
                    notes.append(f"{folder.name}: {mine[name].name} ignored, {nb.name} graded")
                mine[name] = nb
    return found, notes


def _prepare(nb_path, exercise, exercises):
    try:
        return submission.prepare(nb_path, exercises, exercises[exercise])
    except submission.Unreadable as e:
        return str(e)


def grade_class(class_dir, exercises=None, jobs=2, timeout=120, wall=None, log=None,
                limits=None):
    """Grade every student folder under ``class_dir``.

    Returns (rows, columns, spans): ``rows`` is one dict per student with ``student``, ``total``,
    ``max``, ``notes`` and per task ``(column, points, passed, reason)`` under ``"tasks"``;
    ``columns`` lists the task columns in exercise then notebook order; ``spans`` maps
    (student, exercise) to the (start, end) seconds of its grading.
    """
    exercises = P.shipped(exercises) if exercises else P.shipped()
    limits = limits or sandbox.Limits()
    found, notes = find_submissions(class_dir, exercises)
    graded = sorted({name for mine in found.values() for name in mine})
    shipped = {name: nbformat.read(exercises[name], as_version=4) for name in graded}
    plan = {name: P.tasks(shipped[name]) for name in graded}
    names = [P.task_name(gid) for name in graded for _, gid, _ in plan[name]]
    column = {(name, gid): P.task_name(gid) if names.count(P.task_name(gid)) == 1
              else f"{name}:{P.task_name(gid)}" for name in graded for _, gid, _ in plan[name]}

    ws = submission.Workspace()
    try:
        prepared = {(s, name): _prepare(nb, name, exercises)
                    for s, mine in found.items() for name, nb in mine.items()}
        libraries = {name: ws.library(shipped[name], name) for name in graded}
        sandbox.warn_if_unboxed()
        t0 = time.monotonic()
        spans = {}

        def one(key):
            start, job = time.monotonic() - t0, prepared[key]
            if isinstance(job, str):  # unreadable
                rows = submission.failed_all(shipped[key[1]], job)
            else:
                _, nb, sub, pristine = job
                try:
                    results, _, killed = submission.run(nb, libraries[key[1]], ws, timeout, wall,
                                                        limits)
                    with AST_LOCK:  # the verdicts parse code (see AST_LOCK)
                        rows = submission.verdicts(nb, sub, pristine, results, killed,
                                                   wall or timeout * 10, ws.rebuilds)
                except Exception as e:  # noqa: BLE001 - one broken submission must not stop all
                    rows = submission.failed_all(shipped[key[1]], f"grader error: {e!r}"[:500])
            spans[key] = (start, time.monotonic() - t0)
            if log:
                log(f"graded {key[0]}/{key[1]}")
            return rows

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each job: its own group
            results = dict(zip(prepared, pool.map(one, prepared), strict=True))
    finally:
        ws.close()

    rows = []
    for student in found:
        row = {"student": student, "tasks": [], "total": 0, "max": 0, "notes": []}
        for name in graded:
            got = {f"check_{r['task']}": r for r in results.get((student, name), [])}
            for _, gid, points in plan[name]:
                r = got.get(gid, {"passed": False, "reason": "not submitted", "flags": ""})
                row["tasks"].append((column[(name, gid)], points, r["passed"], r["reason"]))
                row["total"] += points if r["passed"] else 0
                row["max"] += points
                if r.get("flags"):
                    row["notes"].append(r["flags"])
        rows.append(row)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    return rows, list(column.values()), spans


def write_csv(rows, columns, out):
    """One row per student: student, points per task, total, max, a full reason per task, notes."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", *columns, "total", "max", *[f"{c} reason" for c in columns],
                    "notes"])
        for row in rows:
            pts = [p if ok else 0 for _, p, ok, _ in row["tasks"]]
            why = ["" if ok else reason for _, _, ok, reason in row["tasks"]]
            w.writerow([row["student"], *pts, row["total"], row["max"], *why,
                        "; ".join(row["notes"])])


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
    rows, columns, _ = grade_class(args.class_dir, args.exercises, args.jobs, args.timeout,
                                   log=lambda m: print(m, file=sys.stderr, flush=True),
                                   limits=getattr(args, "limits", None))
    if not rows:
        print(f"error: no student folders under {args.class_dir}", file=sys.stderr)
        return 2
    write_csv(rows, columns, args.out)
    print(table(rows, columns))
    print(f"wrote {args.out}: {len(rows)} students, {len(columns)} tasks "
          f"in {time.perf_counter() - start:.0f} s with {args.jobs} jobs "
          f"({'each in a bubblewrap sandbox' if sandbox.mode() == 'bwrap' else 'NOT sandboxed'})")
    return 0
