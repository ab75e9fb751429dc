"""`pytest --nbval-lax exercises/exNN_name.ipynb` is the grader, cell by cell: exercises/conftest.py
sends exercise notebooks through the grader's nbval plugin, so an honest solution passes every
cell and a wrong one fails exactly its check cell, as `make grade` says; the report is printed."""

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

from _grading_cases import ROOT, edited

from course.classroom import grade

EULER = '''def zoh(A, B, delta):
    delta = torch.as_tensor(delta, dtype=A.dtype)
    if A.ndim == 1:
        return 1 + delta[..., None] * A, delta[..., None] * B
    return torch.eye(len(B), dtype=A.dtype) + delta[..., None, None] * A, delta[..., None] * B
'''


def test_the_self_check_is_the_grader(tmp_path):
    folder = tmp_path / "exercises"
    folder.mkdir()
    shutil.copy(ROOT / "exercises" / "conftest.py", folder / "conftest.py")
    honest = folder / "ex01_discretization.ipynb"
    honest.write_bytes((ROOT / "solutions" / "01_discretization.ipynb").read_bytes())
    wrong = edited("solutions/01_discretization.ipynb",
                   folder / "ex01_discretization-Copy1.ipynb", replace={"zoh": EULER})
    xml = tmp_path / "cells.xml"
    run = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", "-p", "no:cacheprovider",
                          "-q", f"--junitxml={xml}", str(honest), str(wrong)], cwd=folder,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr  # the wrong notebook fails
    failed = {(case.get("classname"), case.get("name")) for case in ET.parse(xml).iter("testcase")
              if case.find("failure") is not None}
    assert failed == {("ex01_discretization-Copy1.ipynb", "Cell 2")}, failed  # check.zoh alone
    assert "as `make grade` grades it" in run.stdout and "score: 3 / 3" in run.stdout
    assert "score: 2 / 3" in run.stdout and "zoh: A_bar is wrong" in run.stdout
    rows = {r["task"]: r["passed"] for r in grade.grade(wrong, timeout=120)}
    assert rows == {"zoh": False, "bilinear": True, "ssm_kernel": True}
