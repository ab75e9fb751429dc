"""The library an exercise is graded with (``syllabus``, ``redact``), built and probed without a
kernel: the chapter map follows pyproject's layer order; later chapters, the chapter's own modules
its notebook does not hand out and the tooling are left out with a message that says why; each
task's answers are cut out or blocked while its check runs; torch's answers are switched off."""

import os
import re
import subprocess
import sys
import textwrap

import nbformat
import pytest
from _grading_cases import BLOCKED, ROOT

from course.classroom import pristine, redact, syllabus


def test_the_chapter_map_follows_the_layers_of_pyproject():
    """``syllabus.CHAPTER`` and pyproject's import-linter layers (bottom to top, each commented
    with its chapter) give every course module the same chapter, in non-decreasing order."""
    text = (ROOT / "pyproject.toml").read_text()
    block = text[text.index("layers = ["):text.index("]", text.index("layers = ["))]
    last = 0
    for line in reversed(block.splitlines()):  # bottom layer first
        m = re.match(r'\s*"([^"]+)",\s*#\s*(\d+)', line)
        if not m:
            continue
        chapter = int(m.group(2))
        assert chapter >= last, f"layer {m.group(1)} (chapter {chapter}) sits above chapter {last}"
        last = chapter
        for module in (x.strip() for x in m.group(1).split("|")):
            assert syllabus.chapter_of(module) == chapter, (module, chapter)
    for module in syllabus.modules():
        syllabus.chapter_of(module)  # raises for a module in no chapter


@pytest.mark.parametrize("exercise", sorted(pristine.shipped()))
def test_each_exercise_keeps_earlier_chapters_and_what_its_notebook_hands_out(exercise):
    nb = nbformat.read(pristine.shipped()[exercise], as_version=4)
    n = syllabus.exercise_chapter(exercise)
    keep, left_out = syllabus.library_of(exercise, nb)
    given = syllabus.given_imports(nb, syllabus.modules(), syllabus.lazy_exports(
        syllabus.modules()))
    for module in syllabus.modules():
        chapter = syllabus.chapter_of(module)
        if chapter is None:
            assert module in left_out and "tooling" in left_out[module], module
        elif chapter > n:
            assert module in left_out and f"belongs to chapter {chapter:02d}" in left_out[module]
        elif chapter < n or module in given:
            assert module in keep, module
    plan = redact.plan(exercise, nb)
    for target in plan["cut"] + plan["guarded"]:
        redact.locate(target)
    assert set(plan["during"]) <= {pristine.task_name(g) for _, g, _ in pristine.tasks(nb)}


def _probe(lib, code):
    run = subprocess.run([sys.executable, "-c", BLOCKED + textwrap.dedent(code)],
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(lib)),
                         cwd=lib)
    assert run.returncode == 0 and run.stdout.endswith("ok\n"), run.stdout + run.stderr
    return run.stdout




def test_the_ssd_exercise_library(tmp_path):
    """Exercise 10: chapter 15's Mamba-3 (λ = 1 is the SSD) is not there; chapter 10's own
    unrelated modules are not; its answers are cut out however they are spelled; chapter 02's scan,
    which computes the SSD with heads as channels, works until the check calls the student."""
    lib, plan = redact.build(tmp_path / "lib", "10_ssd", nbformat.read(
        pristine.shipped()["10_ssd"], as_version=4))
    assert "mambalearn.scan.sequential.selective_scan_sequential" in plan["during"]["ssd_chunked"]
    _probe(lib, '''
        assert blocked(lambda: importlib.import_module("mambalearn.mamba3"),
                       "belongs to chapter 15")
        assert blocked(lambda: exec("from mambalearn import model"), "belongs to chapter 13")
        assert blocked(lambda: exec("import mambalearn.mamba2.packed"), "chapter 10's own library")
        assert blocked(lambda: exec("import course.bench"), "tooling")
        import mambalearn.mamba2.reference as ssd
        assert blocked(lambda: ssd.ssd_chunked) and blocked(lambda: getattr(ssd, "segsum"))
        assert blocked(lambda: exec("from mambalearn.mamba2.reference import ssd_sequential"))
        assert "torch.tril" not in inspect.getsource(ssd)  # segsum's body is not in the copy
        importlib.reload(ssd)
        assert blocked(lambda: ssd.segsum)
        from mambalearn.scan.sequential import selective_scan_sequential as scan
        r = torch.randn
        args = (r(1, 2, 5), torch.rand(1, 2, 5), -torch.rand(2, 3), r(1, 3, 5), r(1, 3, 5))
        assert scan(*args).shape == (1, 2, 5)                  # given cells may use it
        import mambalearn._grading as g
        g.DURING.update(["mambalearn.scan.sequential.selective_scan_sequential"])
        assert blocked(lambda: scan(*args))                    # not while ssd_chunked's check runs
        g.DURING.clear()
        from mambalearn import check
        check.ssd_chunked(None)                                # a stub: prints
        print("ok")
        ''')


def test_torchs_answers_are_switched_off(tmp_path):
    lib, plan = redact.build(tmp_path / "lib", "13_model", nbformat.read(
        pristine.shipped()["13_model"], as_version=4))
    assert "torch.nn.functional.rms_norm" in plan["torch"]
    _probe(lib, '''
        import torch.nn.functional as F
        import mambalearn._grading as g
        g.switch_off_torch()
        x, w = torch.randn(2, 4), torch.ones(4)
        assert blocked(lambda: F.rms_norm(x, (4,), w))
        assert blocked(lambda: torch.rms_norm(x, (4,), w))
        assert blocked(lambda: torch.nn.RMSNorm(4))
        assert blocked(lambda: exec("import mambalearn.model"), "chapter 13's own library")
        from mambalearn.inference import causal_conv1d          # handed out by the notebook
        from mambalearn.scan.sequential import selective_scan_sequential  # and chapter 02's scan
        assert F.silu(x).shape == (2, 4)
        print("ok")
        ''')
