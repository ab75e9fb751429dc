"""Grade one submitted notebook: which exercise, restore it, run it boxed, one verdict per task.

The steps, each done by its own module:

1. find the exercise from the notebook's metadata or name (``pristine``) and read its pristine copy
   from the package — never from the file being graded, which may be
   ``exercises/exNN_name.ipynb`` itself;
2. restore: the pristine notebook with only the student's solution cells put in (``pristine``);
   cells after the last check are left out (they cannot change a verdict);
3. build, once per exercise, the library a student of its chapter has, with the exercise's answers
   switched off (``syllabus``, ``redact``);
4. run it: ``runner`` (nbval, one pytest item per cell) in a process group of its own, the kernel
   in a box (``sandbox``), the checks in the runner (``session``); past the wall-clock limit the
   whole group is killed;
5. turn the per-cell results into one row per task (``verdict``).
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

from course.classroom import kernel as kernel_mod
from course.classroom import pristine as P
from course.classroom import redact, sandbox
from course.classroom.verdict import failed_all, verdicts

__all__ = ["Workspace", "Unreadable", "prepare", "job", "run", "grade", "failed_all", "verdicts"]

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
        self.plans = {}

    def library(self, nb, exercise):
        """The graded library for ``exercise`` (pristine notebook ``nb``); its plan in ``plans``."""
        path, self.plans[exercise] = redact.copy_or_build(self.root, exercise, nb)
        return path

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
        exercise, path = P.exercise_id(pristine), Path(pristine)
    else:
        exercise = P.identify(submission, notebook, exercises)
        if exercise is None:
            raise FileNotFoundError(
                f"cannot tell which exercise {notebook} is: it has no exercise id in its metadata "
                f"(it was not made from a notebook in exercises/), its name does not start with a "
                f"chapter number (ex01…, 01…), and its cells define none of the exercises' "
                f"functions. Start from a copy of exercises/exNN_name.ipynb, or name the file "
                f"after its exercise (e.g. "
                f"{P.exercise_file(next(iter(exercises), '01_discretization'))})")
        path = exercises[exercise]
    shipped = nbformat.read(path, as_version=4)
    return exercise, P.restore(submission, shipped), submission, shipped


def _cells(nb, plan):
    """The job's cells: code cells of ``nb`` up to its last check, each with its label."""
    from course.classroom.verdict import label

    cells = P.code_cells(nb)
    last = max([i for i, _, _ in P.tasks(nb)], default=len(cells) - 1)
    out = []
    for i, c in enumerate(cells[: last + 1]):
        check = bool(P.meta(c).get("grade"))
        off = (plan or {}).get("during", {}).get(P.task_name(P.meta(c).get("grade_id", "")), [])
        out.append({"kind": "check" if check else "code", "source": c.source,
                    "label": label(nb, i), "off": off if check else []})
    return out


def job(nb, library, workspace, timeout=120, limits=None, plan=None):
    """Write one run's folders and ``job.json`` (the restored notebook beside it); returns the job.

    The box's scratch folder (the kernel's home, owned by the box's user when grading as root) and
    the grader's private folder (the job, results, logs: the box cannot read it).
    """
    limits = limits or sandbox.Limits()
    sub = Path(tempfile.mkdtemp(prefix="sub-", dir=workspace.root))
    scratch, private = sub / "box", sub / "grader"
    scratch.mkdir()
    private.mkdir(mode=0o700)
    uid = next(_UIDS) if os.geteuid() == 0 else None
    if uid is not None:
        os.chown(scratch, uid, uid)
    os.chmod(sub, 0o711)
    nbformat.write(nb, private / "restored.ipynb")
    spec = dict(cells=_cells(nb, plan), timeout=timeout, scratch=str(scratch),
                library=str(library), uid=uid, limits=limits.__dict__,
                results=str(private / "results.json"), log=str(private / "kernel.log"),
                notebook=str(private / "restored.ipynb"), private=str(private))
    (private / "job.json").write_text(json.dumps(spec))
    return spec


def run(nb, library, workspace, timeout=120, wall=None, limits=None, plan=None):
    """Run restored notebook ``nb`` boxed; returns (per-cell results, seconds, killed?)."""
    spec = job(nb, library, workspace, timeout, limits, plan)
    private = Path(spec["private"])
    wall = wall or timeout * 10
    start = time.monotonic()
    # its own process group (killed whole past the wall limit), and SIGKILL if the grader dies
    with open(private / "runner.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "course.classroom.runner",
                                 str(private / "job.json")], cwd=private, start_new_session=True,
                                preexec_fn=kernel_mod.die_with_parent,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        proc.wait(timeout=wall)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the runner and, with it, the box
        proc.wait()
        killed = True
    results = json.loads((private / "results.json").read_text()) if (
        private / "results.json").exists() else []
    if not killed and proc.returncode not in (0, 1) and not results:
        tail = (private / "runner.log").read_text(errors="replace")[-600:]
        results = [{"index": 0, "status": "grader error", "evalue": tail}]
    return results, time.monotonic() - start, killed


def grade(notebook, pristine=None, timeout=120, wall=None, workspace=None, exercises=None,
          limits=None):
    """Grade one submission. Returns one row per task (``verdict.verdicts``).

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
        library = ws.library(shipped, exercise)
        results, _, killed = run(nb, library, ws, timeout, wall, limits, ws.plans[exercise])
        return verdicts(nb, submission, shipped, results, killed, wall or timeout * 10)
    finally:
        if workspace is None:
            ws.close()
