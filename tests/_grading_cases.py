"""Building submissions for the grading tests: edited copies of solutions and exercises."""

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent

# A probe's prologue, run in a child Python on a grader's library copy: blocked(thunk) is True
# when thunk raises the ImportError that names a task ("write it yourself") or its chapter.
BLOCKED = '''
import importlib, inspect, torch
def blocked(thunk, words="write it yourself"):
    try:
        thunk()
    except ImportError as e:
        assert words in str(e), e
        return True
    return False
'''


def edited(src, dst, replace=None, check_source=None, drop_checks=False, strip_metadata=False):
    """Copy notebook ``src`` (a path or ``solutions/NN_x``-style name) to ``dst`` with edits:
    solution cells replaced by grade_id, check cells rewritten or dropped, metadata stripped."""
    src = Path(src) if Path(src).exists() else ROOT / src
    nb = nbformat.read(src, as_version=4)
    cells = []
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and replace and meta["grade_id"] in replace:
            cell.source = replace[meta["grade_id"]]
        if meta.get("grade"):
            if drop_checks:
                continue
            if check_source is not None:
                cell.source = check_source
        if strip_metadata:
            cell.metadata = {}
        cells.append(copy.deepcopy(cell))
    nb.cells = cells
    if strip_metadata:
        nb.metadata = {}
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)
    return Path(dst)


def repo_copy(dest):
    """A copy of the package and the grader (and exercises/) to grade with, so that a submission
    that got out of its box could only damage the copy. Returns the copy's root (for PYTHONPATH)."""
    dest = Path(dest)
    from course.classroom import pristine

    pristine.shipped()  # the grader's copies built (from solutions/), so that they are copied too
    for package in ("mambalearn", "course"):
        shutil.copytree(ROOT / package, dest / package,
                        ignore=shutil.ignore_patterns("__pycache__", "build"))
    shutil.copytree(ROOT / "exercises", dest / "exercises")
    shutil.copytree(ROOT / "solutions", dest / "solutions")
    # the results store the library's measured figures come from (mambalearn.results)
    shutil.copytree(ROOT / "docs" / "results", dest / "docs" / "results")
    return dest


def table(rows):
    """{student: {task column: (passed, reason)}} of ``gradebook.grade_class``'s rows."""
    return {r["student"]: {t["column"]: (t["passed"], t["reason"]) for t in r["tasks"]}
            for r in rows}


def grade_class_in(repo, class_dir, exercises, jobs=2, timeout=60, **limits):
    """``gradebook.grade_class`` on ``exercises`` (ids) run from ``repo`` (a copy) in a subprocess;
    returns ({student: {task: (passed, reason)}}, spans [(start, end)], stderr)."""
    script = (
        "import json, sys\n"
        "from course.classroom import gradebook, sandbox\n"
        f"rows, cols, spans = gradebook.grade_class({str(class_dir)!r}, {list(exercises)!r}, "
        f"jobs={jobs}, timeout={timeout}, limits=sandbox.Limits(**{limits!r}))\n"
        "json.dump({'rows': {r['student']: {t['column']: [t['passed'], t['reason']] "
        "for t in r['tasks']} for r in rows}, 'spans': list(spans.values())}, sys.stdout)\n")
    env = dict(os.environ, PYTHONPATH=str(repo))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         cwd=repo, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    return out["rows"], out["spans"], run.stderr
