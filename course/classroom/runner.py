"""nbval runs a graded notebook: one pytest item per code cell, the kernel boxed, the checks here.

Two ways in, one path:

* the grader: ``python -m course.classroom.runner JOB.json`` (started by
  ``course.classroom.submission`` in a process group of its own, killed past the wall limit)
  runs ``pytest --nbval-lax`` on the restored notebook of the job with this plugin; each cell's
  result is written to the job's results file as it finishes (a killed run still says how far it
  got) and from there becomes the verdicts and the gradebook;
* the student's self-check: ``pytest --nbval-lax exercises/exNN_name.ipynb`` (``exercises/
  conftest.py`` loads this plugin) restores the notebook, builds the same library and runs the
  same box and checks as ``make grade``, one pytest item per cell, and prints the grader's report.

nbval collects the cells and reports them (``Cell N``, a failure's message and source); this
plugin runs them through ``session.Session``, whose kernel, time limits and checks are the
grader's. nbval's cell tags are honoured: ``nbval-skip`` skips a cell, ``raises-exception``
expects it to raise.
"""

import os
import sys
from collections import defaultdict
from pathlib import Path

if __name__ == "__main__":  # the grader's runner: nbformat's schema checks (under nbval) would
    sys.modules.setdefault("rfc3987_syntax", None)  # compile an IRI grammar never used: 1.6 s

import nbformat  # noqa: E402
import pytest  # noqa: E402
from nbval.plugin import IPyNbCell, IPyNbFile, NbCellError, find_metadata_tags  # noqa: E402

SELF_CHECK_TIMEOUT = 120  # seconds per cell, as `make grade` (nbval's --nbval-cell-timeout wins)


class GradedNotebook(IPyNbFile):
    """A notebook whose cells run in a grading session; ``make_job()`` gives (job, record)."""

    make_job = None  # set by :func:`_collector`
    finish = None  # called with the results once every cell ran (the self-check's report)

    def collect(self):
        self.job, self.record = self.make_job()
        self.results, self.grading = [], None
        for index, cell in enumerate(self.job["cells"]):
            node = nbformat.v4.new_code_cell(cell["source"], metadata=cell.get("metadata", {}))
            options = defaultdict(bool, find_metadata_tags(node.metadata))
            yield GradedCell.from_parent(self, name=f"Cell {index}", cell_num=index, cell=node,
                                         options=options)

    def setup(self):
        from course.classroom.session import Session

        self.grading = Session(self.job)

    def teardown(self):
        if self.grading is not None:
            self.grading.close()
        if self.finish is not None:
            self.finish(self.results)


class GradedCell(IPyNbCell):
    """One code cell: run by the session; a failure is nbval's NbCellError with the reason."""

    def setup(self):  # nbval's marks later cells xfail after a timeout: the session says instead
        pass

    def runtest(self):
        notebook = self.parent
        if self.options["skip"]:
            res = {"index": self.cell_num, "status": "ok", "evalue": "skipped (nbval-skip)"}
            self._keep(res)
            pytest.skip("nbval-skip")
        res = notebook.grading.run_cell(self.cell_num)
        if self.options["check_exception"] and res["status"] == "error":
            res = dict(res, status="ok")  # raises-exception: the error was expected
        self._keep(res)
        if res["status"] != "ok":
            # "your `zoh` cell (code cell 3 from the top)": the name a student finds it by (nbval's
            # own "Cell 2" counts from 0 and matches no number JupyterLab shows)
            where = notebook.job["cells"][self.cell_num]["label"]
            what = f"{res['ename']}: {res['evalue']}" if res.get("ename") else res.get("evalue")
            raise NbCellError(self.cell_num, f"{where}: {what}",
                              self.cell.source, "\n".join(res.get("traceback") or []) or None)

    def _keep(self, res):
        self.parent.results.append(res)
        self.parent.record(res)


def _collector(parent, file_path, make_job, finish=None):
    nb = GradedNotebook.from_parent(parent, path=Path(file_path))
    nb.make_job, nb.finish = make_job, finish
    return nb


class GraderPlugin:
    """The grader's use: run the job's restored notebook, each result to ``record``."""

    def __init__(self, job, record):
        self.job, self.record = job, record

    @pytest.hookimpl(hookwrapper=True)
    def pytest_collect_file(self, file_path, parent):
        outcome = yield
        if Path(file_path).resolve() == Path(self.job["notebook"]).resolve():
            outcome.force_result([_collector(parent, file_path, lambda: (self.job, self.record))])


def run_pytest(job, record):
    """``pytest --nbval-lax`` on the job's notebook, in this process, with nothing else loaded."""
    private = Path(job["private"])
    ini = private / "pytest.ini"
    ini.write_text("[pytest]\n")
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # no other plugin of the venv runs here
    args = [job["notebook"], "--nbval-lax", "-p", "nbval", "-p", "no:cacheprovider", "-q",
            "-c", str(ini), "--rootdir", str(private)]
    return pytest.main(args, plugins=[GraderPlugin(job, record)])


# --- the self-check: `pytest --nbval-lax exercises/exNN_name.ipynb` -------------------------------
@pytest.hookimpl(hookwrapper=True)
def pytest_collect_file(file_path, parent):
    """(a conftest hook) Exercise notebooks run through the grader's path under --nbval(-lax)."""
    outcome = yield
    opt = parent.config.option
    if not (getattr(opt, "nbval", False) or getattr(opt, "nbval_lax", False)) \
            or Path(file_path).suffix != ".ipynb":
        return
    from course.classroom import pristine

    try:
        content = nbformat.read(file_path, as_version=4)
    except Exception:  # noqa: BLE001 - the grader reports an unreadable notebook
        content = nbformat.v4.new_notebook()
    if pristine.identify(content, file_path, pristine.shipped()) is None:
        return  # not an exercise: plain nbval
    timeout = int(opt.nbval_cell_timeout)
    timeout = SELF_CHECK_TIMEOUT if timeout == 2000 else timeout  # 2000: nbval's default
    check = SelfCheck(file_path, timeout, parent.config)
    outcome.force_result([_collector(parent, file_path, check.make_job, check.finish)])


class SelfCheck:
    """One exercise notebook graded as ``make grade`` grades it, cell by cell under nbval."""

    def __init__(self, path, timeout, config):
        self.path, self.timeout, self.config = Path(path), timeout, config

    def make_job(self):
        from course.classroom import sandbox, submission

        self.ws = submission.Workspace()
        self.config.add_cleanup(self.ws.close)
        exercise, self.nb, self.submission, self.shipped = submission.prepare(self.path)
        sandbox.warn_if_unboxed()
        library = self.ws.library(self.shipped, exercise)
        spec = submission.job(self.nb, library, self.ws, self.timeout,
                              plan=self.ws.plans[exercise])
        return spec, lambda res: None

    def finish(self, results):
        from course.classroom import grade, submission

        rows = submission.verdicts(self.nb, self.submission, self.shipped, results)
        REPORTS.append(grade.report(rows, title=f"{self.path}, as `make grade` grades it:"))


REPORTS = []  # the self-checks' reports, printed at the end of the pytest run


def pytest_terminal_summary(terminalreporter):
    """(a conftest hook) The grader's report of each exercise notebook self-checked."""
    for text in REPORTS:
        terminalreporter.write_sep("=", "grade")
        for line in text.splitlines():
            terminalreporter.write_line(line)
    REPORTS.clear()


def main(argv=None):
    import json

    from course.classroom.session import Results

    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    results = Results(job["results"])
    code = run_pytest(job, results.add)
    return 0 if results.rows else int(code)


if __name__ == "__main__":
    sys.exit(main())
