"""Grade one submitted notebook: which exercise, restore it, run it boxed, one verdict per task.

The steps, each done by its own module:

1. find the exercise from the notebook's metadata or name (``pristine``) and read its pristine copy
   from the package — never from the file being graded, which may be ``exercises/NN.ipynb`` itself;
2. restore: the pristine notebook with only the student's solution cells put in (``pristine``);
3. build, once per exercise, the library copy in which the functions the exercise rebuilds are
   switched off (``redact``);
4. run it: ``runner`` in a process group of its own, the kernel in a box (``sandbox``), the checks
   in the runner; past the wall-clock limit the whole group is killed;
5. turn the per-cell results into one row per task: passed or not, a short and a full reason.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from mambalearn.classroom import kernel as kernel_mod
from mambalearn.classroom import pristine as P
from mambalearn.classroom import redact, sandbox

# One user id per box when grading as root: far above any real account (a real user of the same id
# could signal or trace the box's processes), a block of them per grading process.
_UIDS = iter(range(1_900_000_000 + (os.getpid() % 100_000) * 1000, 2_000_000_000))


class Workspace:
    """Private folder of one grading run: library copies (shared), one folder per submission."""

    def __init__(self, root=None):
        # short paths: the kernel's Unix sockets live in it (a socket path has ≤ 104 bytes)
        short = "/tmp" if len(tempfile.gettempdir()) > 40 and os.path.isdir("/tmp") else None
        self._tmp = None if root else tempfile.TemporaryDirectory(prefix="mambalearn-grade-",
                                                                  dir=short)
        self.root = Path(root or self._tmp.name)
        os.chmod(self.root, 0o711)  # boxes traverse it to their own folder; nobody lists it
        self.rebuilds = redact.rebuilds()

    def library(self, nb, exercise):
        """The graded library for this exercise: its tasks' REBUILDS switched off."""
        targets = [t for _, gid, _ in P.tasks(nb) for t in self.rebuilds.get(P.task_name(gid), [])]
        return redact.copy_or_build(self.root, targets, exercise)

    def close(self):
        if self._tmp:
            self._tmp.cleanup()


class Unreadable(ValueError):
    """The submission is not a notebook; ``pristine`` is its exercise if the name tells it."""

    def __init__(self, message, pristine):
        super().__init__(message)
        self.pristine = pristine


def prepare(notebook, exercises=None, pristine=None):
    """(exercise id, restored notebook, the student's notebook, pristine) — or raise.

    ``pristine`` forces the shipped exercise (a path); else it is found among ``exercises``
    ({id: path}, default: the package's). A file that is not a notebook raises ``Unreadable``.
    """
    exercises = exercises or P.shipped()
    try:
        submission = nbformat.read(notebook, as_version=4)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same failure
        guess = P.identify(nbformat.v4.new_notebook(), notebook, exercises)
        raise Unreadable(f"unreadable notebook: {str(e).splitlines()[0][:200]}",
                         pristine or exercises.get(guess)) from None
    if pristine:
        exercise, path = Path(pristine).stem, Path(pristine)
    else:
        exercise = P.identify(submission, notebook, exercises)
        if exercise is None:
            raise FileNotFoundError(f"cannot tell which exercise {notebook} is: no exercise id in "
                                    f"its metadata, and neither its name nor its cells match "
                                    f"one of "
                                    f"{sorted(exercises)} (use --pristine)")
        path = exercises[exercise]
    shipped = nbformat.read(path, as_version=4)
    return exercise, P.restore(submission, shipped), submission, shipped


def run(nb, library, workspace, timeout=120, wall=None, limits=None):
    """Run restored notebook ``nb`` boxed; returns (per-cell results, seconds, killed?)."""
    limits = limits or sandbox.Limits()
    sub = Path(tempfile.mkdtemp(prefix="sub-", dir=workspace.root))
    scratch, private = sub / "box", sub / "grader"
    scratch.mkdir()
    private.mkdir(mode=0o700)
    uid = next(_UIDS) if os.geteuid() == 0 else None
    if uid is not None:
        os.chown(scratch, uid, uid)
    os.chmod(sub, 0o711)
    cells = [{"kind": "check" if P.meta(c).get("grade") else "code", "source": c.source}
             for c in P.code_cells(nb)]
    job = dict(cells=cells, timeout=timeout, scratch=str(scratch), library=str(library), uid=uid,
               limits=limits.__dict__, results=str(private / "results.json"),
               log=str(private / "kernel.log"))
    (private / "job.json").write_text(json.dumps(job))
    wall = wall or timeout * 10
    start = time.monotonic()
    # its own process group (killed whole past the wall limit), and SIGKILL if the grader dies
    proc = subprocess.Popen([sys.executable, "-m", "mambalearn.classroom.runner",
                             str(private / "job.json")], cwd=private, start_new_session=True,
                            preexec_fn=kernel_mod.die_with_parent,
                            stdout=subprocess.DEVNULL, stderr=open(private / "runner.log", "wb"))
    try:
        proc.wait(timeout=wall)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the runner and, with it, the box
        proc.wait()
        killed = True
    results = json.loads((private / "results.json").read_text()) if (
        private / "results.json").exists() else []
    if not killed and proc.returncode and not results:
        tail = (private / "runner.log").read_text()[-600:]
        results = [{"index": 0, "status": "grader error", "evalue": tail}]
    return results, time.monotonic() - start, killed


def _cut(text, width):
    if len(text) <= width:
        return text
    at = text.rfind(" ", 0, width - 2)
    return text[: at if at > width // 2 else width - 2] + " …"


def short(reason, width=100):
    """The table's form of a reason: its first line cut at a word near ``width``, and the hint
    (the line that names the likely mistake) when the check gave one."""
    lines = [line.strip() for line in (reason or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    hint = next((line for line in lines[1:] if line.startswith("hint:")), None)
    if hint is None:
        return _cut(lines[0], width)
    return _cut(lines[0], width // 2) + " — " + _cut(hint, width)


def _first(text):
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def _cell_failure(r, label):
    """Why the student's cell ``label`` did not run through, or None if it did."""
    if r is None or r.get("status") == "ok":
        return None
    if r["status"] == "error":
        return f"your {label} cell failed: {r['ename']}: {_first(r['evalue'])}"
    if r["status"] == "died":
        return f"the kernel died in your {label} cell ({r['evalue']})"
    if r["status"] in ("timeout", "stopped"):
        return f"your {label} cell {r['evalue']}"
    return f"your {label} cell was {r['status']}: {r.get('evalue')}"


def _explain(nb, idx, r, deps, results, unchanged, killed, wall):
    """The full reason check cell ``idx`` did not pass."""
    number = lambda i: nb.cells.index(P.code_cells(nb)[i]) + 1  # as the student counts cells
    if deps and all(unchanged.get(d) for d in deps):
        names = ", ".join(f"`{d}`" for d in deps)
        still = "are still the shipped stubs" if len(deps) > 1 else "is still the shipped stub"
        return "not attempted", f"not attempted: {names} {still}"
    sols = {P.meta(c).get("grade_id"): i for i, c in enumerate(P.code_cells(nb))
            if P.meta(c).get("solution")}
    for d in deps:
        why = _cell_failure(results.get(sols.get(d)), d)
        if why:
            if results[sols[d]]["status"] == "died":
                why = f"kernel died in cell {number(sols[d])} (your `{d}` cell)"
            return "fail", why
    if r is None:
        if killed:
            last = max(results) if results else -1
            where = number(last + 1) if last + 1 < len(P.code_cells(nb)) else "?"
            return "fail", (f"not run: grading was stopped at the {wall} s limit for the whole "
                            f"notebook (it was running cell {where})")
        return "fail", "not run"
    status = r.get("status")
    if status == "died":
        return "fail", (f"kernel died in cell {number(idx)} while the check ran your code "
                        f"({r['evalue']})")
    if status in ("timeout", "stopped"):
        return "fail", f"cell {number(idx)} (the check) {r['evalue']}"
    if status == "not run":
        return "fail", f"not run: {r['evalue']}"
    if r.get("ename") == "NotImplementedError":
        return "fail", f"not finished: {r['evalue']}"
    return "fail", r.get("evalue") or status


def verdicts(nb, submission, shipped, results, killed=False, wall=None, rebuilds=None):
    """One row per task: {task, points, passed, status, reason (full), short, flags}."""
    results = {r["index"]: r for r in results}
    stubs = {P.meta(c)["grade_id"]: c for c in shipped.cells if P.meta(c).get("solution")}
    mine = P.solution_cells(submission)
    unchanged = {g: g not in mine or P.unchanged(mine[g], stub) for g, stub in stubs.items()}
    rows = []
    for idx, gid, points in P.tasks(nb):
        task, r = P.task_name(gid), results.get(idx)
        deps = P.solutions_of(nb, idx)
        if r is not None and r.get("status") == "ok":
            status, reason = "pass", ""
        else:
            status, reason = _explain(nb, idx, r, deps, results, unchanged, killed, wall)
        flags = copied(mine, deps, (rebuilds or {}).get(task, []))
        rows.append(dict(task=task, points=points, passed=status == "pass", status=status,
                         reason=reason, short=short(reason), flags=flags))
    return rows


def copied(mine, deps, targets):
    """A note when a solution cell defines a function identical to the library's (ignoring
    comments, layout and docstrings); '' otherwise. Copying by hand is not blocked, only noted."""
    import ast

    notes = []
    for target in targets:
        try:
            path, attrs = redact.locate(target)
        except ValueError:
            continue
        lib = redact._top_level(ast.parse(path.read_text()), attrs[0])
        for d in deps:
            try:
                tree = ast.parse(mine[d].source) if d in mine else None
            except SyntaxError:
                continue
            theirs = tree and redact._top_level(tree, attrs[0])
            if lib is not None and theirs is not None and len(attrs) == 1 and _same(lib, theirs):
                notes.append(f"{d}: identical to {target}")
    return "; ".join(sorted(set(notes)))


MIN_COPY_NODES = 100  # smaller functions (a five-line loop) are written the same way by many


def _same(a, b):
    import ast

    if len(list(ast.walk(a))) < MIN_COPY_NODES:
        return False

    def body(node):
        stmts = list(getattr(node, "body", []))
        if stmts and isinstance(stmts[0], ast.Expr) and isinstance(getattr(stmts[0], "value", None),
                                                                   ast.Constant):
            stmts = stmts[1:]  # the docstring
        return ast.dump(ast.Module(body=stmts, type_ignores=[]))

    return type(a) is type(b) and body(a) == body(b)


def grade(notebook, pristine=None, timeout=120, wall=None, workspace=None, exercises=None,
          limits=None):
    """Grade one submission. Returns [{task, points, passed, status, reason, short, flags}].

    ``timeout`` bounds each cell (seconds), ``wall`` the whole notebook (default 10 × timeout).
    """
    ws = workspace or Workspace()
    try:
        try:
            exercise, nb, submission, shipped = prepare(notebook, exercises, pristine)
        except Unreadable as e:
            if e.pristine is None:
                raise FileNotFoundError(f"{e}, and its name matches no exercise") from None
            return failed_all(nbformat.read(e.pristine, as_version=4), str(e))
        sandbox.warn_if_unboxed()
        results, _, killed = run(nb, ws.library(nb, exercise), ws, timeout, wall, limits)
        return verdicts(nb, submission, shipped, results, killed, wall or timeout * 10, ws.rebuilds)
    finally:
        if workspace is None:
            ws.close()


def failed_all(nb, reason):
    return [dict(task=P.task_name(gid), points=p, passed=False, status="fail", reason=reason,
                 short=short(reason), flags="") for _, gid, p in P.tasks(nb)]
