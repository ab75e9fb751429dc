"""Exercise notebooks: generate them from solutions, and grade a student's copy.

    python -m mambalearn.grade make-exercise solutions/01_x.ipynb exercises/01_x.ipynb
    python -m mambalearn grade my_01_x.ipynb [--pristine exercises/01_x.ipynb] [--timeout 120]

Generation runs nbgrader's ``ClearSolutions`` through nbconvert: code between
``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes ``raise NotImplementedError()``, outputs
are cleared.

Grading never trusts the submission's non-solution cells. It rebuilds the notebook from the
shipped (pristine) exercise, taking from the submission only the cells marked as solutions
(nbgrader ``solution: true``, matched by ``grade_id``); a check cell the student edited, emptied or
deleted comes back as shipped. Then ``pytest --nbval-lax`` executes it with a per-cell timeout,
and every check cell (nbgrader ``grade: true``) is one task: passed or failed, with the reason.
"""

import argparse
import copy
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent


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


def restore(submission, pristine):
    """The pristine notebook with the submission's solution cells put in (matched by grade_id)."""
    student = {_meta(c)["grade_id"]: c for c in submission.cells
               if _meta(c).get("solution") and "grade_id" in _meta(c)}
    out = copy.deepcopy(pristine)
    for i, cell in enumerate(out.cells):
        gid = _meta(cell).get("grade_id")
        if _meta(cell).get("solution") and gid in student:
            out.cells[i] = copy.deepcopy(student[gid])
            out.cells[i].metadata["nbgrader"] = copy.deepcopy(_meta(cell))  # keep the shipped labels
        if cell.cell_type == "code":
            out.cells[i].outputs, out.cells[i].execution_count = [], None
    return out


def tasks(nb):
    """[(code-cell index, grade_id, points)] of the check cells, in notebook order."""
    found, code_idx = [], 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if _meta(cell).get("grade"):
            found.append((code_idx, _meta(cell)["grade_id"], _meta(cell).get("points", 1)))
        code_idx += 1
    return found


def run_nbval(path, timeout, junit):
    """Execute notebook ``path`` under ``pytest --nbval-lax``; results go to the JUnit XML file."""
    env = dict(os.environ, MAMBALEARN_PROGRESS="0", MPLBACKEND="Agg", PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-q",
           f"--nbval-cell-timeout={timeout}", "-p", "no:cacheprovider", f"--junitxml={junit}",
           "-o", "addopts=", str(path)]
    return subprocess.run(cmd, cwd=Path(path).parent, env=env, capture_output=True, text=True,
                          timeout=timeout * 50)


def _cell_results(junit):
    """{code-cell index: failure text or None} from nbval's JUnit report."""
    results = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith("Cell "):
            continue
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        results[int(name.split()[1])] = None if bad is None else (bad.text or bad.get("message") or "failed")
    return results


def _reason(text):
    """The exception line of a failure (e.g. 'AssertionError: zoh: B_bar is wrong on ...')."""
    lines = [re.sub(r"\x1b\[[0-9;]*m|#x1B\[[0-9;]*m", "", l).strip() for l in (text or "").splitlines()]
    lines = [l for l in lines if l]
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


def grade(notebook, pristine=None, timeout=120):
    """Grade one submission. Returns [{task, points, passed, reason}] in notebook order."""
    notebook = Path(notebook)
    pristine = Path(pristine) if pristine else REPO / "exercises" / notebook.name
    if not pristine.exists():
        raise FileNotFoundError(f"no shipped exercise to restore checks from: {pristine} (use --pristine)")
    try:
        submission = nbformat.read(notebook, as_version=4)
    except Exception as e:  # noqa: BLE001 - a broken file is a failed submission, not a crash
        return [{"task": t[1], "points": t[2], "passed": False, "reason": f"unreadable notebook: {e}"}
                for t in tasks(nbformat.read(pristine, as_version=4))]
    nb = restore(submission, nbformat.read(pristine, as_version=4))
    with tempfile.TemporaryDirectory() as tmp:
        path, junit = Path(tmp) / notebook.name, Path(tmp) / "junit.xml"
        nbformat.write(nb, path)
        proc = run_nbval(path, timeout, junit)
        cells = _cell_results(junit) if junit.exists() else {}
    rows = []
    for idx, gid, points in tasks(nb):
        failure = cells.get(idx, f"not run ({proc.stdout[-300:]})")
        rows.append({"task": gid.removeprefix("check_"), "points": points, "passed": failure is None,
                     "reason": "" if failure is None else _reason(failure)})
    return rows


def report(rows):
    width = max([4] + [len(r["task"]) for r in rows])
    lines = [f"{'task'.ljust(width)}  result  reason"]
    for r in rows:
        lines.append(f"{r['task'].ljust(width)}  {'pass' if r['passed'] else 'FAIL'}    {r['reason']}")
    got = sum(r["points"] for r in rows if r["passed"])
    lines.append(f"score: {got} / {sum(r['points'] for r in rows)}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="mambalearn grade", description=__doc__.split("\n\n")[0])
    p.add_argument("notebook", help="the student's exercise notebook")
    p.add_argument("--pristine", help="shipped exercise to restore check cells from "
                   "(default: exercises/<same name> of this repository)")
    p.add_argument("--timeout", type=int, default=120, help="seconds per cell (default 120)")
    args = p.parse_args(argv)
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
