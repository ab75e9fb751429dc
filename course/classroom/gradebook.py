"""Grade a whole class: one folder per student, the assignment's exercises, one CSV and a page.

    python -m mambalearn grade --class submissions/ --exercises 01,03 --out grades.csv [--jobs 2]

Layout: ``submissions/<student>/**/*.ipynb`` (nbgrader's ``submitted/<student>/<assignment>/``
works too). Each notebook is matched to its exercise by the id in its metadata, else by its name
(``ex01_discretization-Copy1.ipynb``, ``ex01 (1).ipynb``, the older ``01_discretization.ipynb``),
else by its solution cells. The assignment is given explicitly (``--exercises 01,03``, ids or
chapter numbers, or ``all``): each of its exercises is graded for every student, one a student did
not hand in scores 0, "not submitted"; a notebook of another exercise is ignored (noted on stderr).

Before any submission runs, every pristine exercise is read and every submission restored in
memory, and the graded library copies are built. Then ``jobs`` submissions run at once, each in its
own process group and box (``course.classroom.submission``): one that hangs, crashes its kernel,
writes elsewhere or is not valid JSON fails its own tasks and nothing else. Progress goes to
stderr as "graded 3 of 17 … about 2 min left".

The CSV has one row per student: ``student``, one column per task (points earned), ``total``,
``max``, then ``<task> reason`` per task (the full reason; empty when passed) and ``notes`` (code
copied from the library, files ignored). Task columns are the bare task names (``zoh``), or
``NN_name:task`` when two exercises share a task name. ``course.classroom.classpage`` writes
each student's feedback file and the class page from the same rows.
"""

import csv
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from course.classroom import classpage, sandbox, submission
from course.classroom import pristine as P
from course.classroom.classpage import LEGEND, MARK

# Python 3.11's ast can raise "SystemError: AST constructor recursion depth mismatch" when two
# threads parse at once (seen grading a class with 3 test workers): the verdicts take turns.
AST_LOCK = threading.Lock()


def assignment(spec, exercises):
    """The exercise ids of ``spec`` ("all", or "01,03_operator,…"); ValueError names a bad one."""
    if spec is None or not str(spec).strip():
        raise ValueError("give the assignment: --exercises 01,02,… (chapter numbers or exercise "
                         "names) or --exercises all")
    if str(spec).strip() == "all":
        return sorted(exercises)
    chosen = []
    for word in (w.strip() for w in str(spec).split(",") if w.strip()):
        wanted = P.exercise_id(word)  # ex03_operator, ex03: as 03_operator, 03 (the file names)
        match = [e for e in exercises if e == wanted or e.split("_")[0] == wanted.zfill(2)]
        if len(match) != 1:
            raise ValueError(f"--exercises: {word!r} is none of the exercises "
                             f"({', '.join(sorted(exercises))})")
        chosen.append(match[0])
    return sorted(set(chosen))


def find_submissions(class_dir, exercises, chosen=None):
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
            elif chosen is not None and name not in chosen:
                notes.append(f"{folder.name}: {nb.name} is {name}, not in the assignment, ignored")
            elif name in mine and P.exercise_id(nb) != name:  # an exact name wins over others
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


class Progress:
    """"graded 3 of 17 (alice/01_discretization) after 40 s, about 3 min left" on ``log``."""

    def __init__(self, total, log):
        self.total, self.log, self.done, self.start = total, log, 0, time.monotonic()
        self.lock = threading.Lock()

    def step(self, what):
        with self.lock:
            self.done += 1
            spent = time.monotonic() - self.start
            left = spent / self.done * (self.total - self.done)
            eta = "" if self.done == self.total else f", about {_duration(left)} left"
            if self.log:
                self.log(f"graded {self.done} of {self.total} ({what}) after "
                         f"{_duration(spent)}{eta}")


def _duration(seconds):
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def grade_class(class_dir, chosen, exercises=None, jobs=2, timeout=120, wall=None, log=None,
                limits=None):
    """Grade every student folder under ``class_dir`` on the exercises ``chosen`` (ids).

    Returns (rows, columns, spans): ``rows`` is one dict per student with ``student``, ``total``,
    ``max``, ``notes`` and per task a dict (column, exercise, task, points, passed, status, reason,
    hint) under ``"tasks"``; ``columns`` lists the task columns in exercise then notebook order;
    ``spans`` maps (student, exercise) to the (start, end) seconds of its grading.
    """
    exercises = P.shipped(exercises) if exercises else P.shipped()
    limits = limits or sandbox.Limits()
    found, notes = find_submissions(class_dir, exercises, set(chosen))
    shipped = {name: nbformat.read(exercises[name], as_version=4) for name in chosen}
    plan = {name: P.tasks(shipped[name]) for name in chosen}
    names = [P.task_name(gid) for name in chosen for _, gid, _ in plan[name]]
    column = {(name, gid): P.task_name(gid) if names.count(P.task_name(gid)) == 1
              else f"{name}:{P.task_name(gid)}" for name in chosen for _, gid, _ in plan[name]}

    ws = submission.Workspace()
    try:
        prepared = {(s, name): _prepare(nb, name, exercises)
                    for s, mine in found.items() for name, nb in mine.items()}
        libraries = {name: ws.library(shipped[name], name) for name in chosen}
        sandbox.warn_if_unboxed()
        t0, spans, progress = time.monotonic(), {}, Progress(len(prepared), log)

        def one(key):
            start, job = time.monotonic() - t0, prepared[key]
            if isinstance(job, str):  # unreadable
                rows = submission.failed_all(shipped[key[1]], job)
            else:
                _, nb, sub, pristine = job
                try:
                    results, _, killed = submission.run(nb, libraries[key[1]], ws, timeout, wall,
                                                        limits, ws.plans[key[1]])
                    with AST_LOCK:  # the verdicts parse code (see AST_LOCK)
                        rows = submission.verdicts(nb, sub, pristine, results, killed,
                                                   wall or timeout * 10)
                except Exception as e:  # noqa: BLE001 - one broken submission must not stop all
                    rows = submission.failed_all(shipped[key[1]], f"grader error: {e!r}"[:500])
            spans[key] = (start, time.monotonic() - t0)
            progress.step(f"{key[0]}/{key[1]}")
            return rows

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:  # each job: its own group
            results = dict(zip(prepared, pool.map(one, prepared), strict=True))
    finally:
        ws.close()

    rows = []
    for student in found:
        row = {"student": student, "tasks": [], "total": 0, "max": 0, "notes": []}
        for name in chosen:
            got = {f"check_{r['task']}": r for r in results.get((student, name), [])}
            for _, gid, points in plan[name]:
                r = got.get(gid, {"passed": False, "status": "not submitted",
                                  "reason": "not submitted", "flags": "", "hint": ""})
                row["tasks"].append(dict(column=column[(name, gid)], exercise=name,
                                         task=P.task_name(gid), points=points,
                                         passed=r["passed"], status=r["status"],
                                         reason=r["reason"], hint=r.get("hint", "")))
                row["total"] += points if r["passed"] else 0
                row["max"] += points
                if r.get("flags"):
                    row["notes"].append(r["flags"])
        row["notes"] += [n.split(": ", 1)[1] for n in notes if n.startswith(f"{student}: ")]
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
            pts = [t["points"] if t["passed"] else 0 for t in row["tasks"]]
            why = ["" if t["passed"] else t["reason"] for t in row["tasks"]]
            w.writerow([row["student"], *pts, row["total"], row["max"], *why,
                        "; ".join(row["notes"])])


def table(rows, columns):
    """The verdict table as text: student, a mark per task (``MARK``), score; the legend below."""
    width = max([7] + [len(r["student"]) for r in rows])
    cols = [max(4, len(c)) for c in columns]
    head = [c.ljust(n) for c, n in zip(columns, cols, strict=True)]
    lines = ["  ".join(["student".ljust(width), *head, "score"])]
    for r in rows:
        marks = [MARK[t["status"]].ljust(n) for t, n in zip(r["tasks"], cols, strict=True)]
        lines.append("  ".join([r["student"].ljust(width), *marks, f"{r['total']}/{r['max']}"]))
    return "\n".join(lines + [LEGEND])


def main(args):
    """``mambalearn grade --class``: parsed arguments from ``course.classroom.grade.main``."""
    if not Path(args.class_dir).is_dir():
        print(f"error: --class {args.class_dir} is not a folder", file=sys.stderr)
        return 2
    exercises = P.shipped(args.pristine) if args.pristine else P.shipped()
    if not exercises:
        print(f"error: --pristine {args.pristine} holds no exercise notebooks", file=sys.stderr)
        return 2
    try:
        chosen = assignment(args.exercises, exercises)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows, columns, _ = grade_class(args.class_dir, chosen, args.pristine, args.jobs, args.timeout,
                                   log=lambda m: print(m, file=sys.stderr, flush=True),
                                   limits=getattr(args, "limits", None))
    if not rows:
        print(f"error: no student folders under {args.class_dir}", file=sys.stderr)
        return 2
    write_csv(rows, columns, args.out)
    feedback = Path(args.feedback or Path(args.out).parent / "feedback")
    page = Path(args.page or Path(args.out).with_suffix(".html"))
    classpage.write_feedback(rows, feedback)
    classpage.write_page(rows, columns, chosen, page, feedback)
    print(table(rows, columns))
    print(f"wrote {args.out}, {page} and {len(rows)} feedback files in {feedback}/: "
          f"{len(rows)} students, {len(columns)} tasks in {time.perf_counter() - start:.0f} s "
          f"with {args.jobs} jobs "
          f"({'each in a bubblewrap sandbox' if sandbox.mode() == 'bwrap' else 'NOT sandboxed'})")
    return 0
