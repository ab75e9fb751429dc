"""Grade one restored notebook: its cells run in a boxed kernel, its checks run here.

    python -m mambalearn.classroom.runner JOB.json

The grader (``mambalearn.classroom.submission``) writes the job — the restored cells, the box's
folders and limits, the per-cell timeout — starts this in a process group of its own and kills the
group past the wall-clock limit. This process runs with the grader's rights and the untouched
library: it starts the kernel in its box, sends every non-check cell to it, and runs every check
cell *itself*: ``check.zoh(zoh)`` becomes ``mambalearn.check.zoh(Remote("zoh"))``, so the checks and
their oracles never run where the student's code could change them. After each cell it rewrites
the results file (so a killed run still says how far it got):

    [{"index": code-cell index,
      "status": "ok" | "error" | "timeout" | "stopped" | "died" | "not run",
      "ename", "evalue", "traceback", "output", "seconds"}, ...]
"""

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

from mambalearn.classroom import kernel as K
from mambalearn.classroom import pristine, remote, sandbox


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


def run(job):
    """Execute every code cell of the job; yields one result per cell as it finishes."""
    cells, timeout = job["cells"], job["timeout"]
    kern = K.Kernel(job["scratch"], job["library"], sandbox.Limits(**job["limits"]), job.get("uid"),
                    log=job.get("log"))
    gone = None  # why later cells cannot run
    try:
        from mambalearn import check  # noqa: F401 - import the checks while the kernel starts

        try:
            kern.wait_ready(timeout=max(60, timeout))
            kern.execute(remote.KERNEL_SHIM, time.monotonic() + timeout, silent=True)
        except (K.Died, K.Stopped) as e:
            gone = f"the kernel could not start ({e})"
        for index, cell in enumerate(cells):
            start = time.monotonic()
            if gone:
                yield {"index": index, "status": "not run", "evalue": gone}
                continue
            try:
                if cell["kind"] == "check":
                    res = judge(cell["source"], remote.Bridge(kern, start + timeout))
                else:
                    res = kern.execute(cell["source"], start + timeout)
                    res.pop("data", None)
            except K.Interrupted:
                res = {"status": "timeout", "evalue": f"ran past the {timeout} s limit per cell "
                                                      "and was interrupted"}
            except K.Stopped:
                res = {"status": "stopped", "evalue": f"ran past the {timeout} s limit per cell, "
                                                      "ignored the interrupt and was stopped"}
                gone = f"the kernel was stopped in cell {index} (it ran past the time limit)"
            except K.Died as e:
                res = {"status": "died", "evalue": str(e)}
                gone = f"the kernel died in cell {index}"
            res.update(index=index, seconds=round(time.monotonic() - start, 2))
            yield res
    finally:
        kern.close()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    results, out = [], Path(job["results"])
    for res in run(job):
        results.append(res)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results))
        os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
