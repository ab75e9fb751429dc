"""Exercise notebooks: generate them from solutions, and grade a student's copy.

    python -m mambalearn.classroom.grade make-exercise solutions/01_x.ipynb exercises/01_x.ipynb
    python -m mambalearn grade my_01_x.ipynb [--pristine exercises/01_x.ipynb] [--timeout 120]
    python -m mambalearn grade --class submissions/ --out grades.csv [--jobs 2]

Generation runs nbgrader's ``ClearSolutions`` through nbconvert: code between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes ``raise NotImplementedError()``, outputs
are cleared.

Grading never trusts the submission's non-solution cells. It rebuilds the notebook from the
shipped (pristine) exercise, taking from the submission only the cells marked as solutions
(nbgrader ``solution: true``, matched by ``grade_id``); a check cell the student edited, emptied or
deleted comes back as shipped. Then ``pytest --nbval-lax`` executes it with a per-cell timeout,
and every check cell (nbgrader ``grade: true``) is one task: passed or failed, with the reason.
The whole run also has a wall-clock limit; past it, pytest and the kernel are killed together.
A whole class (one folder per student) is graded by ``mambalearn.classroom.gradebook``.
"""

import argparse
import copy
import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]


def make_exercise(src, dst):
    """Write the student version of solution notebook ``src`` to ``dst``."""
    from nbconvert.preprocessors import ClearOutputPreprocessor
    from nbgrader.preprocessors import ClearSolutions

    nb = nbformat.read(src, as_version=4)
    resources = {}
    nb, resources = ClearSolutions(enforce_metadata=False).preprocess(nb, resources)
    nb, resources = ClearOutputPreprocessor().preprocess(nb, resources)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)


def _meta(cell):
    return cell.metadata.get("nbgrader", {})


def _solution_cells(submission):
    """{grade_id: cell} of the submission's solution cells (by metadata, else by a matching def)."""
    found = {_meta(c)["grade_id"]: c for c in submission.cells
             if _meta(c).get("solution") and "grade_id" in _meta(c)}
    for c in submission.cells:  # metadata lost (e.g. copied into a new cell): find `def <name>(`
        m = re.search(r"^def (\w+)\(", c.source, re.M) if c.cell_type == "code" else None
        if m and m.group(1) not in found and not _meta(c).get("grade"):
            found[m.group(1)] = c
    return found


# Run before every check cell while grading: a solution cell that monkeypatches the checks
# (`check.zoh = lambda f: None`) patched module objects; dropping every mambalearn module and
# importing `check` afresh undoes that. (Code that patches torch or builtins is not stopped: no
# in-process grader can; nbgrader has the same limit.)
FRESH_CHECKS = ("import sys as _sys\n"
                "for _m in [m for m in _sys.modules if m.split('.')[0] == 'mambalearn']:\n"
                "    del _sys.modules[_m]\n"
                "from mambalearn import check  # graded with freshly imported checks\n")


def restore(submission, pristine):
    """The pristine notebook with the submission's solution cells put in (matched by grade_id);
    every check cell first re-imports the checks (``FRESH_CHECKS``)."""
    student = _solution_cells(submission)
    out = copy.deepcopy(pristine)
    for i, cell in enumerate(out.cells):
        gid = _meta(cell).get("grade_id")
        if _meta(cell).get("solution") and gid in student:
            out.cells[i] = copy.deepcopy(student[gid])
            out.cells[i].cell_type = "code"
            out.cells[i].metadata["nbgrader"] = copy.deepcopy(_meta(cell))  # the shipped labels
        if _meta(cell).get("grade"):
            out.cells[i].source = FRESH_CHECKS + cell.source
        if cell.cell_type == "code":
            out.cells[i].outputs, out.cells[i].execution_count = [], None
    return out


def tasks(nb):
    """[(code-cell index, grade_id, points)] of the check cells, in notebook order."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    return [(i, _meta(c)["grade_id"], _meta(c).get("points", 1))
            for i, c in enumerate(code) if _meta(c).get("grade")]


def _solution_index(nb):
    """{grade_id: code-cell index} of the solution cells."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    return {_meta(c)["grade_id"]: i for i, c in enumerate(code)
            if _meta(c).get("solution") and "grade_id" in _meta(c)}


def run_nbval(path, timeout, junit, wall=None):
    """Execute notebook ``path`` under ``pytest --nbval-lax``; results go to the JUnit XML file.

    ``timeout`` bounds each cell (nbval interrupts the kernel); ``wall`` (default: 10 cells' worth)
    bounds the whole run: past it, pytest and its kernel are killed as one process group, so a
    submission that ignores interrupts cannot hang the grader. Returns (exit code, output tail);
    the exit code is None when the run was killed.
    """
    env = dict(os.environ, MAMBALEARN_PROGRESS="0", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-q",
           f"--nbval-cell-timeout={timeout}", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", "addopts=", str(path)]
    proc = subprocess.Popen(cmd, cwd=Path(path).parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=wall or timeout * 10)
        return proc.returncode, out[-2000:]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # pytest and the kernel it started
        out, _ = proc.communicate()
        return None, out[-2000:]


def _cell_results(junit):
    """{code-cell index: failure text or None} from nbval's JUnit report.

    A cell nbval did not run (xfail/skip: its kernel was stopped after an earlier cell timed out
    or died) is a failure too, never a pass.
    """
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("Cell "):
            continue
        bad = next((case.find(t) for t in ("failure", "error") if case.find(t) is not None), None)
        text = None if bad is None else (bad.text or bad.get("message") or "failed")
        if bad is None and case.find("skipped") is not None:
            text = ("not run: the kernel was stopped after an earlier cell timed out or crashed "
                    f"({case.find('skipped').get('message', '')[:80]})")
        results[int(name.split()[1])] = text
    return results


def _reason(text):
    """The exception line of a failure (e.g. 'AssertionError: zoh: B_bar is wrong on ...')."""
    ansi = re.compile(r"\x1b\[[0-9;]*m|#x1B\[[0-9;]*m")
    lines = [ansi.sub("", l).strip() for l in (text or "").splitlines()]
    lines = [l for l in lines if l]
    for l in lines:  # nbval's own words for a cell it had to stop, or one it never ran
        if "Timeout of" in l:
            return l[l.index("Timeout of"):][:240]
        if l.startswith("not run:"):
            return l[:240]
    for l in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", l) and "Traceback" not in l:
            # the first line of the exception message; an AssertionError's details follow it
            i = lines.index(l)
            if l.startswith("NotImplementedError"):
                return "NotImplementedError: not written yet"
            return " ".join(lines[i:i + 2])[:240] if l.endswith(":") else l[:240]
    for l in lines:
        if "Timeout" in l or "timed out" in l.lower():
            return l[:240]
    return (lines[-1] if lines else "failed")[:240]


def _failed_all(nb, reason):
    return [{"task": gid.removeprefix("check_"), "points": p, "passed": False, "reason": reason}
            for _, gid, p in tasks(nb)]


def grade(notebook, pristine=None, timeout=120, wall=None):
    """Grade one submission. Returns [{task, points, passed, reason}] in notebook order.

    ``timeout`` is the per-cell limit in seconds; ``wall`` the limit for the whole notebook
    (default ``10 * timeout``).
    """
    notebook = Path(notebook)
    pristine = Path(pristine) if pristine else REPO / "exercises" / notebook.name
    if not pristine.exists():
        raise FileNotFoundError(f"no shipped exercise to restore checks from: {pristine} "
                                "(use --pristine)")
    shipped = nbformat.read(pristine, as_version=4)
    try:
        submission = nbformat.read(notebook, as_version=4)
    except Exception as e:  # noqa: BLE001 - a broken file is a failed submission, not a crash
        return _failed_all(shipped, f"unreadable notebook: {str(e).splitlines()[0][:200]}")
    nb = restore(submission, shipped)
    wall = wall or timeout * 10
    with tempfile.TemporaryDirectory() as tmp:
        path, junit = Path(tmp) / notebook.name, Path(tmp) / "junit.xml"
        nbformat.write(nb, path)
        code, tail = run_nbval(path, timeout, junit, wall)
        cells = _cell_results(junit) if junit.exists() else {}
    if code is None:
        return _failed_all(nb, f"notebook ran past the {wall} s limit and was stopped")
    solutions, rows = _solution_index(nb), []
    for idx, gid, points in tasks(nb):
        task = gid.removeprefix("check_")
        failure = cells.get(idx, f"not run ({tail[-300:]})")
        reason = "" if failure is None else _reason(failure)
        own = cells.get(solutions.get(task))  # the student's cell for this task failed itself
        if failure is not None and own is not None and not own.startswith("not run:"):
            reason = f"your {task} cell failed: {_reason(own)}"
        rows.append({"task": task, "points": points, "passed": failure is None, "reason": reason})
    return rows


def report(rows):
    width = max([4] + [len(r["task"]) for r in rows])
    lines = [f"{'task'.ljust(width)}  result  reason"]
    for r in rows:
        verdict = "pass" if r["passed"] else "FAIL"
        lines.append(f"{r['task'].ljust(width)}  {verdict}    {r['reason']}")
    got = sum(r["points"] for r in rows if r["passed"])
    lines.append(f"score: {got} / {sum(r['points'] for r in rows)}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="mambalearn grade", description=__doc__.split("\n\n")[0])
    p.add_argument("notebook", nargs="?", help="the student's exercise notebook")
    p.add_argument("--pristine", help="shipped exercise to restore check cells from "
                   "(default: exercises/<same name> of this repository)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    p.add_argument("--class", dest="class_dir", metavar="DIR",
                   help="grade every student folder under DIR (see mambalearn.classroom.gradebook)")
    p.add_argument("--out", default="grades.csv", help="gradebook CSV (default grades.csv)")
    p.add_argument("--jobs", type=int, default=2, help="notebooks graded at once with --class")
    p.add_argument("--exercises", metavar="DIR", help="shipped exercises for --class "
                   "(default: exercises/ of this repository)")
    args = p.parse_args(argv)
    if args.class_dir:
        from mambalearn.classroom import gradebook

        return gradebook.main(args)
    if not args.notebook:
        p.error("give a NOTEBOOK or --class DIR")
    try:
        rows = grade(args.notebook, args.pristine, args.timeout)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report(rows))
    return 0 if rows and all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "make-exercise":
        make_exercise(*sys.argv[2:4])
    else:
        sys.exit(main())
