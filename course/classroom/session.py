"""One graded notebook's kernel, driven cell by cell: student cells run in the box, checks here.

``Session(job)`` starts the kernel in its box (``kernel``, ``sandbox``) with the graded library and
the bridge (``remote``); ``run_cell(i)`` sends code cell i to the kernel, or, for a check cell, runs
the check *here*: ``check.zoh(zoh)`` becomes ``mambalearn.check.zoh(Remote("zoh"))``, so the checks
and their oracles never run where the student's code could change them. Each cell has the job's
time limit; one that outlives it is interrupted (and killed if it ignores that for ``grace``
seconds), and its result says how long it really ran. ``course.classroom.runner`` drives a
session from nbval, one pytest item per cell. A result is

    {"index": code-cell index (nbval's "Cell N"),
     "status": "ok" | "error" | "timeout" | "stopped" | "died" | "not run",
     "ename", "evalue", "traceback", "output", "seconds"}
"""

import contextlib
import io
import json
import os
import time
from pathlib import Path

from course.classroom import kernel as K
from course.classroom import pristine, remote, sandbox


def judge(source, bridge):
    """Run the check cell ``source`` here, on Remotes of the kernel's objects."""
    name, args = pristine.check_call(source)
    from mambalearn import check

    fn = getattr(check, name)
    out = io.StringIO()
    res = {"status": "ok", "ename": None, "evalue": None, "traceback": [], "output": ""}
    try:
        with contextlib.redirect_stdout(out):
            fn(*[remote.Remote(bridge, (a,)) for a in args])
    except (AssertionError, NotImplementedError) as e:
        kind = "AssertionError" if isinstance(e, AssertionError) else "NotImplementedError"
        res.update(status="error", ename=kind, evalue=str(e))
    except Exception as e:  # noqa: BLE001 - e.g. the kernel returned what no check expects
        res.update(status="error", ename=type(e).__name__,
                   evalue=f"the check could not run your code: {type(e).__name__}: {e}")
    res["output"] = out.getvalue()[-K.TAIL:]
    return res


def grace(timeout):
    """Seconds an interrupted cell has to stop: 5 % of the limit, between 0.5 and 5 s."""
    return min(K.GRACE, max(0.5, 0.05 * timeout))


class Session:
    """The job's kernel in its box; ``run_cell(i)`` runs code cell i and returns its result."""

    def __init__(self, job):
        self.job, self.cells, self.timeout = job, job["cells"], job["timeout"]
        self.kern = K.Kernel(job["scratch"], job["library"], sandbox.Limits(**job["limits"]),
                             job.get("uid"), log=job.get("log"), grace=grace(self.timeout))
        self.gone = None  # why later cells cannot run
        from mambalearn import check  # noqa: F401 - import the checks while the kernel starts

        try:
            self.kern.wait_ready(timeout=max(60, self.timeout))
            deadline = time.monotonic() + max(60, self.timeout)
            self.kern.execute(remote.KERNEL_SHIM, deadline, silent=True)
            self.kern.execute(remote.KERNEL_START, deadline, silent=True)
        except (K.Died, K.Stopped) as e:
            self.gone = f"the kernel could not start ({e})"

    def run_cell(self, index):
        cell, start, limit = self.cells[index], time.monotonic(), self.timeout
        if self.gone:
            return {"index": index, "status": "not run", "evalue": self.gone}
        try:
            if cell["kind"] == "check":
                bridge = remote.Bridge(self.kern, start + limit, off=cell.get("off", ()))
                res = judge(cell["source"], bridge)
            else:
                res = self.kern.execute(cell["source"], start + limit)
                res.pop("data", None)
        except K.Interrupted:
            res = {"status": "timeout", "evalue": f"ran past the {limit} s limit per cell and was "
                   f"interrupted after {time.monotonic() - start:.0f} s"}
        except K.Stopped:
            res = {"status": "stopped", "evalue": f"ran past the {limit} s limit per cell, ignored "
                   f"the interrupt and was stopped after {time.monotonic() - start:.0f} s"}
            self.gone = f"the kernel was stopped in {cell['label']} (it ran past the time limit)"
        except K.Died as e:
            res = {"status": "died", "evalue": str(e)}
            self.gone = f"the kernel died in {cell['label']}"
        res.update(index=index, seconds=round(time.monotonic() - start, 2))
        return res

    def close(self):
        self.kern.close()


class Results:
    """The results file of a job, rewritten after every cell."""

    def __init__(self, path):
        self.path, self.rows = Path(path), []

    def add(self, res):
        self.rows.append(res)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.rows))
        os.replace(tmp, self.path)
