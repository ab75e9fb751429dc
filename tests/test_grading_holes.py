"""Issue 19 §1 and issue 31: the holes a student could grade through, each closed and held by a
test.

1. an exercise edited where it ships (checks disabled) and graded in place;
2. importing the answer from the library, however it is spelled, and back doors through the rest
   of the course (a later chapter's function, an earlier chapter's scan that computes the same
   thing, torch's own version of the answer, the model's block);
3. faked evidence: a loop that reports Blelloch's counts, a dummy Triton launch before a PyTorch
   loop;
4. a kernel that dies is reported as such, in seconds;
6. a JupyterLab duplicate (``-Copy1``) grades;
plus what the old in-kernel checks could not stop: patched checks, patched torch, an IPython input
transformer that blanks every later cell, a forged bridge.

One class run (``imports``) shares the grading of every import, back-door and evidence case.
"""

import ast
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from _grading_cases import BLOCKED, ROOT, edited, repo_copy, table

from course.classroom import grade, gradebook, redact, sandbox
from mambalearn.check import _groups

WRONG_DECODE = '''def decode_step(state, x, delta, A, B, C, D):
    state.copy_(torch.exp(delta[..., None] * A) * state
                + delta[..., None] * B[:, None] * x[..., None])
    return (state * C[:, None, :]).sum(-1)  # forgets D·x
'''
EULER = '''def zoh(A, B, delta):
    delta = torch.as_tensor(delta, dtype=A.dtype)
    if A.ndim == 1:
        return 1 + delta[..., None] * A, delta[..., None] * B
    return torch.eye(len(B), dtype=A.dtype) + delta[..., None, None] * A, delta[..., None] * B
'''


def test_exercise_edited_in_place_with_checks_disabled_fails(tmp_path):
    """§1.1: `grade exercises/ex12_inference.ipynb` after a wrong decode_step and `pass` in its
    check cell. The old grader restored the "pristine" checks from that same edited file."""
    repo = repo_copy(tmp_path / "repo")
    nb = repo / "exercises" / "ex12_inference.ipynb"
    edited(nb, nb, replace={"decode_step": WRONG_DECODE}, check_source="pass  # checks disabled")
    run = subprocess.run([sys.executable, "-m", "mambalearn", "grade", str(nb)], cwd=repo,
                         capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(repo)))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "decode_step  FAIL" in run.stdout and "score: 0 / 1" in run.stdout
    assert "D·x is missing" in run.stdout, run.stdout


def test_jupyterlab_duplicate_grades_by_its_metadata(tmp_path):
    """§1.6: File → Duplicate makes `ex01_discretization-Copy1.ipynb`; the old grader had no
    shipped exercise of that name (exit 2). The id in the metadata says which exercise it is."""
    nb = tmp_path / "somewhere" / "ex01_discretization-Copy1.ipynb"
    edited("exercises/ex01_discretization.ipynb", nb, replace={
        "zoh": EULER, "bilinear": _solution_source("01_discretization", "bilinear")})
    run = subprocess.run([sys.executable, "-m", "mambalearn", "grade", str(nb)],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines() if line.split()}
    assert "FAIL" in lines["zoh"] and "pass" in lines["bilinear"]
    assert "not attempted" in lines["ssm_kernel"]


def _solution_source(exercise, grade_id):
    import nbformat

    nb = nbformat.read(ROOT / "solutions" / f"{exercise}.ipynb", as_version=4)
    return next(c.source for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
                == grade_id)


def test_a_dying_kernel_is_reported_in_seconds(tmp_path):
    """§1.4: `os._exit(0)` in a cell was "Timeout of 120 seconds … Failed to interrupt kernel"
    after 2 min 15 s. Now: the kernel died, in which cell, as soon as it happens."""
    nb = edited("solutions/01_discretization.ipynb", tmp_path / "01_discretization.ipynb",
                replace={"bilinear": "import os\nos._exit(0)\n"})
    start = time.perf_counter()
    rows = {r["task"]: r for r in grade.grade(nb, timeout=120)}
    assert time.perf_counter() - start < 60  # kernel start + two cells, on a loaded 2-core box
    assert rows["zoh"]["passed"]
    assert not rows["bilinear"]["passed"] and "kernel died in your" in rows["bilinear"]["reason"]
    assert "your `bilinear` cell" in rows["bilinear"]["reason"]
    assert "not run" in rows["ssm_kernel"]["reason"] and "died" in rows["ssm_kernel"]["reason"]


# --- importing the answer: one class, each student spells it differently --------------------
IMPORTS = {  # student: (exercise, {solution cell: source}, tasks that must fail)
    "i01_from_import": ("01_discretization", {"zoh": "from mambalearn.discretize import zoh\n"},
                        ["zoh"]),
    "i01_module_attribute": ("01_discretization", {"zoh": textwrap.dedent("""
        import mambalearn.discretize as _d
        def zoh(A, B, delta):
            return _d.zoh(A, B, delta)
        """), "ssm_kernel": "from mambalearn import discretize\n"
                            "ssm_kernel = discretize.ssm_kernel\n"},
        ["zoh", "ssm_kernel"]),
    "i01_importlib_getattr": ("01_discretization", {"bilinear": textwrap.dedent("""
        import importlib
        bilinear = getattr(importlib.import_module("mambalearn.discretize"), "bilinear")
        """)}, ["bilinear"]),
    "i01_module_dict_and_reload": ("01_discretization", {"zoh": textwrap.dedent("""
        import importlib, mambalearn.discretize as _d
        importlib.reload(_d)
        zoh = vars(_d)["zoh"]
        """)}, ["zoh"]),
    "i01_exec_the_source": ("01_discretization", {"zoh": textwrap.dedent("""
        import inspect, mambalearn.discretize as _d
        _ns = {}
        exec(compile(open(_d.__file__).read(), "x", "exec"), _ns)
        zoh = _ns["zoh"]
        """)}, ["zoh"]),
    "i01_the_checks_oracle": ("01_discretization", {"zoh": textwrap.dedent("""
        from mambalearn.check import ch01_discretization as _c
        zoh = _c.discretize.zoh
        """)}, ["zoh"]),
    "i01_patches_checks_and_torch": ("01_discretization", {"zoh": EULER + textwrap.dedent("""
        import torch.testing
        from mambalearn import check as _c
        _c.zoh = lambda fn: print("✓ zoh: all 10 checks passed")
        torch.testing.assert_close = lambda *a, **k: None
        """)}, ["zoh"]),
    "i01_blanks_later_cells": ("01_discretization", {"bilinear": textwrap.dedent("""
        get_ipython().input_transformers_cleanup.append(lambda lines: ["print('✓ passed')\\n"])
        """)}, ["bilinear", "ssm_kernel"]),
    "i01_forges_the_bridge": ("01_discretization", {"ssm_kernel": textwrap.dedent("""
        def ssm_kernel(A_bar, B_bar, C, length):
            raise NotImplementedError()
        __mambalearn_rpc__ = lambda payload: None
        """)}, ["ssm_kernel"]),
    "i02_an_equivalent_scan": ("02_selective_ssm", {"selective_scan_sequential": (
        "from mambalearn.scan.chunked import selective_scan_chunked "
        "as selective_scan_sequential\n")},
        ["selective_scan_sequential"]),
    "i03_ops": ("03_operator", {"combine": "combine = ops.combine\n",
                                "fold": "from mambalearn.ops import fold\n"}, ["combine", "fold"]),
    "i04_lazy_package_export": ("04_parallel_scans", {"hillis_steele_scan": (
        "from mambalearn.scan import hillis_steele_scan\n")}, ["hillis_steele_scan"]),
    "i06_chunked_scan": ("06_chunked_scan", {"chunked_scan": (
        "from mambalearn.scan.chunked import chunked_scan\n")}, ["chunked_scan"]),
    "i07_autograd": ("07_recomputation", {"ChunkedScanFn": (
        "from mambalearn.autograd import ChunkedScanFn\n")}, ["ChunkedScanFn"]),
    "i08_triton_scan": ("08_triton_scan", {"combine_fn": (
        "from mambalearn.triton.scan import combine_fn, scan\n"), "scan_kernel": textwrap.dedent("""
        def scan_kernel(a, b, block_l=16):
            return scan(a, b, block_l=block_l)
        """)}, ["combine_fn", "scan_kernel"]),
    "i10_segsum": ("10_ssd", {"segsum": "segsum = ssd.segsum\n"}, ["segsum", "ssd_chunked"]),
    "i12_decode_step": ("12_inference", {"decode_step": (
        "from mambalearn.inference import decode_step\n")}, ["decode_step"]),
    # back doors through the rest of the course: a later chapter, an earlier scan, torch itself
    "i10_mamba3_with_lambda_1": ("10_ssd", {"ssd_chunked": textwrap.dedent("""
        from mambalearn.mamba3.reference import mamba3_siso_sequential
        def ssd_chunked(x, dt, A, B, C, chunk_size, initial_states=None):
            raise RuntimeError("never reached: the import fails")
        """)}, ["ssd_chunked"]),
    "i12_the_scan_with_l_1": ("12_inference", {"decode_step": textwrap.dedent("""
        from mambalearn.scan.sequential import selective_scan_sequential
        def decode_step(state, x, delta, A, B, C, D):
            y, last = selective_scan_sequential(x[..., None], delta[..., None], A, B[..., None],
                                                C[..., None], D, initial_state=state,
                                                return_last_state=True)
            state.copy_(last)
            return y[..., 0]
        """)}, ["decode_step"]),
    "i13_torchs_rms_norm": ("13_model", {"rms_norm": textwrap.dedent("""
        def rms_norm(x, weight, eps=1e-5):
            return F.rms_norm(x, x.shape[-1:], weight, eps)
        """)}, ["rms_norm", "mamba_block"]),
    "i13_the_models_mixer": ("13_model", {"mamba_block": textwrap.dedent("""
        from torch.func import functional_call
        from mambalearn import model
        def mamba_block(hidden, w):
            raise RuntimeError("never reached: the import fails")
        """)}, ["mamba_block"]),
    # faked evidence: a loop reporting Blelloch's counts, one dummy launch before a PyTorch loop
    "i04_loop_with_blellochs_counts": ("04_parallel_scans", {"blelloch_scan": textwrap.dedent("""
        def blelloch_scan(a, b, dim=-1, reverse=False, pad=True, counter=None):
            A, U, restore = time_first(a, b, dim, reverse)
            l = U.shape[0]
            P = 1 << (l - 1).bit_length()
            if P != l and not pad:
                raise ValueError("not a power of two")
            up = [P >> i for i in range(1, P.bit_length())]
            for n in (up + up[::-1]) if counter is not None else []:
                counter.add(n)
            h, out = torch.zeros_like(U[0]), []
            for t in range(l):
                h = A[t] * h + U[t] if A.ndim == U.ndim else (A[t] @ h[..., None])[..., 0] + U[t]
                out.append(h)
            return restore(torch.stack(out))
        """)}, ["blelloch_scan"]),
    "i08_dummy_launch": ("08_triton_scan", {"scan_kernel": textwrap.dedent("""
        def scan_kernel(a, b, block_l=16):
            h = torch.empty_like(b)
            scan_rows_kernel[(1,)](a, b, h, 0, 1, 1, BLOCK_L=block_l)  # l = 0: computes nothing
            s = torch.zeros_like(b[:, 0])
            for t in range(b.shape[1]):
                s = a[:, t] * s + b[:, t]
                h[:, t] = s
            return h
        """)}, ["scan_kernel"]),
    # results of other kinds: numpy numbers pass as numbers, a numpy array is named as such
    "i05_numpy_numbers": ("05_memory_hierarchy", {"occupancy": _solution_source(
        "05_memory_hierarchy", "occupancy").replace("def occupancy(", "def _occupancy(")
        + textwrap.dedent("""
        import numpy as np
        def occupancy(gpu, num_warps, registers, shared_bytes):
            o = _occupancy(gpu, num_warps, registers, shared_bytes)
            return dict(o, blocks=np.int64(o["blocks"]), warps=np.int64(o["warps"]),
                        limits={k: np.int64(v) for k, v in o["limits"].items()})
        """)}, []),
    "i12_numpy_result": ("12_inference", {"decode_step": _solution_source(
        "12_inference", "decode_step").replace("def decode_step(", "def _step(")
        + textwrap.dedent("""
        def decode_step(state, x, delta, A, B, C, D):
            return _step(state, x, delta, A, B, C, D).numpy()
        """)}, ["decode_step"]),
}
WORDS = {  # student: what the failing tasks' reasons must say, when not "write it yourself"
    "i12_numpy_result": "expected a torch.Tensor, got numpy.ndarray",
    "i10_mamba3_with_lambda_1": "belongs to chapter 15",
    "i13_the_models_mixer": "chapter 13's own library",
    "i04_loop_with_blellochs_counts": "does not combine in Blelloch's tree order",
    "i08_dummy_launch": "computed with PyTorch outside its Triton kernel",
}


@pytest.fixture(scope="module")
def imports(tmp_path_factory):
    root = tmp_path_factory.mktemp("imports")
    for student, (exercise, replace, _) in IMPORTS.items():
        edited(f"solutions/{exercise}.ipynb", root / student / f"{exercise}.ipynb",
               replace=replace)
    chosen = sorted({exercise for exercise, _, _ in IMPORTS.values()})
    rows, _, _ = gradebook.grade_class(root, chosen, jobs=2, timeout=120)
    return table(rows)


@pytest.mark.slow
@pytest.mark.parametrize("student", sorted(IMPORTS))
def test_importing_the_answer_fails_and_the_rest_works(imports, student):
    """§1.2: the library functions an exercise asks for are switched off while grading; every
    other task of the same notebook (the student's own code, the library's other parts) passes."""
    exercise, _, failing = IMPORTS[student]
    got = {task.split(":")[-1]: v for task, v in imports[student].items()
           if v[1] != "not submitted"}
    assert got, imports[student]
    for task, (ok, why) in got.items():
        if task in failing:
            assert not ok, f"{student}/{task} passed with the library's answer"
            if student.startswith("i01_patches") or student in ("i01_forges_the_bridge",
                                                                 "i01_blanks_later_cells"):
                continue
            words = [WORDS[student]] if student in WORDS else ["write it yourself",
                                                                   "is not defined",
                                                                   "while grading"]
            assert any(w in why for w in words), (task, why)
        else:
            assert ok, f"{student}/{task}: {why}"


@pytest.mark.slow
def test_patched_checks_and_torch_do_not_reach_the_grader(imports):
    ok, why = imports["i01_patches_checks_and_torch"]["zoh"]
    assert not ok and "zoh: A_bar is wrong" in why  # the Euler zoh, caught by the real check
    for student, task in (("i01_forges_the_bridge", "ssm_kernel"),
                          ("i01_blanks_later_cells", "ssm_kernel")):
        ok, why = imports[student][task]
        assert not ok and "could not reach" in why, (student, why)


# --- the graded library itself, without a kernel ----------------------------------------------
def test_redacted_library_blocks_the_answers_and_keeps_the_rest(tmp_path):
    """Each REBUILDS entry names a definition; in exercise 03's copy every spelling of its answers
    fails with "write it yourself", later chapters are not there, and the rest of the module and
    of the earlier chapters still imports and runs."""
    import nbformat

    from course.classroom import pristine

    table = redact.rebuilds()
    assert {"zoh", "hillis_steele_scan", "decode_step", "scan_kernel"} <= set(table)
    for targets in table.values():
        for target in targets:
            if not target.startswith("torch."):
                redact.locate(target)  # raises unless defined where named
    nb = nbformat.read(pristine.shipped()["03_operator"], as_version=4)
    lib, _ = redact.build(tmp_path / "lib", "03_operator", nb)
    probe = BLOCKED + textwrap.dedent("""
        import mambalearn.ops as ops
        assert blocked(lambda: __import__("mambalearn.ops", fromlist=["combine"]).combine)
        assert blocked(lambda: exec("from mambalearn.ops import fold"))
        assert blocked(lambda: getattr(ops, "combine"))
        assert blocked(lambda: vars(ops)["combine"]((1, 2), (3, 4)))
        assert blocked(lambda: exec("from mambalearn.scan import hillis_steele_scan"),
                       "belongs to chapter 04")
        assert blocked(lambda: importlib.import_module("mambalearn.triton.scan"),
                       "belongs to chapter 08")
        assert "A_r * A_l" not in inspect.getsource(ops)  # combine's body is not in the copy
        importlib.reload(ops)
        assert blocked(lambda: ops.combine)
        A, u = ops.identity(torch.rand(3), torch.randn(3))               # the rest works
        from mambalearn.scan.sequential import linear_scan_sequential    # and chapter 02
        assert linear_scan_sequential(torch.rand(5), torch.randn(5)).shape == (5,)
        from mambalearn import check
        check.combine(None)                                                 # a stub: prints
        print("ok")
        """)
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(lib)), cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.endswith("ok\n"), run.stdout + run.stderr
    assert "run by the grader" in run.stdout


def test_rebuilds_are_literals_with_a_task_each():
    """The contract of docs/AUTHORING.md: REBUILDS and HINTS are dict literals keyed by
    ``__all__`` names, every task with at least two hints."""
    for path in sorted((ROOT / "mambalearn" / "check").glob("ch*.py")):
        tree = ast.parse(path.read_text())
        names = {n.targets[0].id: n.value for n in tree.body
                 if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
        assert "REBUILDS" in names, f"{path.name} declares no REBUILDS"
        rebuilds, exported = ast.literal_eval(names["REBUILDS"]), ast.literal_eval(names["__all__"])
        assert set(rebuilds) <= set(exported), path.name
        assert all(t.startswith(("mambalearn.", "torch.")) or t[1:] in _groups.GROUPS
                   for v in rebuilds.values() for t in v), path.name
        hints = ast.literal_eval(names["HINTS"])
        assert set(hints) == set(exported), path.name
        assert all(len(h) >= 2 and all(isinstance(x, str) for x in h) for h in hints.values())


def test_sandbox_mode_is_reported():
    assert sandbox.mode() in ("bwrap", "plain")


def test_rebuild_groups_are_defined_once_and_name_real_functions():
    """check/_groups.py: a literal (the grader reads it unimported), each member a definition of
    the library, no group a copy of another, every group named by some check."""
    import importlib

    tree = ast.parse((ROOT / "mambalearn" / "check" / "_groups.py").read_text())
    literal = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                   and getattr(n.targets[0], "id", None) == "GROUPS")
    assert literal == _groups.GROUPS
    members = [tuple(sorted(v)) for v in literal.values()]
    assert len(set(members)) == len(members), "two groups with the same members"
    for group in literal.values():
        assert len(group) == len(set(group))
        for target in group:
            module, name = target.rsplit(".", 1)
            assert hasattr(importlib.import_module(module), name), target
    named = {t[1:] for path in (ROOT / "mambalearn" / "check").glob("ch*.py")
             for t in re.findall(r'"(@[^"]+)"', path.read_text())}
    assert named == set(literal), f"unused groups: {set(literal) - named}"
    with pytest.raises(ValueError, match="nope"):
        _groups.expand(["@nope"])

