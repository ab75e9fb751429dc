"""The sm_90 build check of what the interpreter launched (launches, compiled.check_launches).

The kernels below run in a child process that records its launches (the test suite's own record,
`make test`'s, must not see the deliberately bad ones); the check then builds what was recorded
for sm_90 on this CPU and must name exactly the launches an H200 would refuse.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from mambalearn import compiled, launches

pytest.importorskip("triton")

KERNELS = textwrap.dedent('''
    import sys
    import torch
    import mambalearn  # noqa: F401  (the interpreter, and the recorder, before Triton)
    import triton
    import triton.language as tl
    from mambalearn import launches


    @triton.jit
    def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, K: tl.constexpr):
        i, k = tl.arange(0, M), tl.arange(0, K)
        a = tl.load(a_ptr + i[:, None] * K + k[None, :])
        b = tl.load(b_ptr + k[:, None] * M + i[None, :])
        tl.store(c_ptr + i[:, None] * M + i[None, :], tl.dot(a, b))


    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


    @triton.jit
    def grid_kernel(x_ptr):
        tl.store(x_ptr + tl.program_id(1), 1.0)


    @triton.jit
    def strided_kernel(x_ptr, y_ptr, x_strides, n, BLOCK: tl.constexpr):
        stride_r, stride_c = x_strides  # a tuple of strides, one argument
        offs = tl.arange(0, BLOCK)
        v = tl.load(x_ptr + tl.program_id(0) * stride_r + offs * stride_c, mask=offs < n)
        tl.store(y_ptr + tl.program_id(0) * BLOCK + offs, v, mask=offs < n)


    @triton.jit
    def strided_flat_kernel(x_ptr, y_ptr, stride_r, stride_c, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)  # the same kernel, its strides one argument each
        v = tl.load(x_ptr + tl.program_id(0) * stride_r + offs * stride_c, mask=offs < n)
        tl.store(y_ptr + tl.program_id(0) * BLOCK + offs, v, mask=offs < n)


    demo = launches.interpreter_only(triton.jit(dot_kernel.fn), "a counterexample")
    case = sys.argv[1]
    a, b = torch.randn(16, 64), torch.randn(64, 16)
    if case in ("good", "all"):
        dot_kernel[(1,)](a, b, torch.empty(16, 16), M=16, K=16)
        x = torch.randn(1000)
        copy_kernel[(8,)](x, torch.empty_like(x), 1000, BLOCK=128, num_warps=4, num_stages=2)
    if case in ("small_k", "all"):
        dot_kernel[(1,)](a, b, torch.empty(16, 16), M=16, K=8)  # K < 16: no tensor-core tile
        demo[(1,)](a, b, torch.empty(16, 16), M=16, K=8)  # marked: not recorded
    if case in ("shared", "all"):  # 64 × 1024 fp32 operands: far past 227 KB of staging
        a, b = torch.randn(64, 1024), torch.randn(1024, 64)
        dot_kernel[(1,)](a, b, torch.empty(64, 64), M=64, K=1024)
    if case == "tuple":  # rows of a (20, 37) matrix, then of its transpose (stride 1 first)
        x = torch.randn(20, 37)
        for m in (x, x.t()):
            y = torch.empty(m.shape[0], 64)
            strided_kernel[(m.shape[0],)](m, y, m.stride(), m.shape[1], BLOCK=64)
            strided_flat_kernel[(m.shape[0],)](m, y, *m.stride(), m.shape[1], BLOCK=64)
            assert torch.equal(y[:, :m.shape[1]], m)
    if case in ("grid", "all"):
        grid_kernel[(1, 70000, 1)](torch.empty(70000))  # axis 1 stops at 65 535 programs
''')


def run_recorded(tmp_path, case):
    """Run the kernels of ``case`` in a child recording into tmp_path/rec; the directory."""
    script = tmp_path / "kernels.py"
    script.write_text(KERNELS)
    rec = tmp_path / f"rec_{case}"
    env = {**os.environ, launches.ENV: str(rec), "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, str(script), case], env=env, check=True, timeout=300,
                   cwd=tmp_path)
    return rec


def test_the_record_reads_launches_as_triton_would(tmp_path):
    found = list(launches.load(run_recorded(tmp_path, "good")).values())
    by_name = {la["name"]: la for la in found}
    assert set(by_name) == {"dot_kernel", "copy_kernel"}
    cp = by_name["copy_kernel"]
    assert cp["signature"]["x_ptr"] == "*fp32" and cp["signature"]["n"] == "i32"
    assert cp["constexprs"] == {"BLOCK": 128} and cp["grid"] == [8]
    assert cp["options"] == {"num_warps": 4, "num_stages": 2}
    assert "x_ptr" in cp["divisible"] and "n" not in cp["divisible"]  # 1000 % 16 != 0
    assert cp["source"] is not None  # a script's kernel travels as its source


def test_the_check_names_what_an_h200_refuses_and_passes_the_rest(tmp_path):
    rec = run_recorded(tmp_path, "all")
    names = [json.loads(line)["name"] for f in rec.glob("*.jsonl")
             for line in f.read_text().splitlines()]
    assert names.count("dot_kernel") == 3  # the interpreter_only copy is not among them
    problems, builds, fresh = compiled.check_launches(rec)
    assert fresh == len(builds) == 5  # two dots refused, one good, the copy, the grid
    text = "\n".join(problems)
    assert len(problems) == 3, text
    assert "K >= 16" in text and "'K': 8" in text  # the compiler's own words
    assert "more than the 232448 B" in text and "'K': 1024" in text
    assert "grid axis 1 has 70000 programs" in text
    # the same builds from the cache: nothing compiled, the same problems
    again, _, fresh = compiled.check_launches(rec, cache=builds)
    assert fresh == 0 and sorted(again) == sorted(problems)


def test_a_tuple_argument_is_recorded_element_by_element_and_builds_as_its_elements(tmp_path):
    """A tuple of strides is one argument that Triton specializes element by element: the record
    names each element (an integer 1 folded into the build, as Triton does), and the sm_90 build
    is the one of the same kernel taking the elements as separate arguments."""
    found = list(launches.load(run_recorded(tmp_path, "tuple")).values())
    tup = sorted((la for la in found if la["name"] == "strided_kernel"),
                 key=lambda la: la["signature"]["x_strides"][0])  # x.t() first, then x
    flat = sorted((la for la in found if la["name"] == "strided_flat_kernel"),
                  key=lambda la: la["signature"]["stride_r"])
    assert len(tup) == len(flat) == 2  # x.t() (1, 37) and x (37, 1)
    assert [la["signature"]["x_strides"] for la in tup] == [["constexpr", "i32"],
                                                             ["i32", "constexpr"]]
    assert [la["constexprs"] for la in tup] == [{"BLOCK": 64, "x_strides[0]": 1},
                                                {"BLOCK": 64, "x_strides[1]": 1}]
    assert tup[0]["divisible"] == ["x_ptr", "y_ptr"]
    assert launches.leaves("s", ("i32", ("constexpr", "*fp32"))) == [
        ("s[0]", "i32"), ("s[1][0]", "constexpr"), ("s[1][1]", "*fp32")]
    problems, builds, _ = compiled.check_launches(tmp_path / "rec_tuple")
    assert problems == [] and len(builds) == 4
    for t, f in zip(tup, flat, strict=True):
        a, b = (compiled.compile_many(la["module"], la["name"], la["source"], [
            {"constexprs": la["constexprs"], "signature": la["signature"],
             "divisible": la["divisible"], **la["options"]}])[0] for la in (t, f))
        assert (a.registers, a.spill_bytes, a.shared_bytes) == (b.registers, b.spill_bytes,
                                                                 b.shared_bytes)
        assert a.opcodes() == b.opcodes() and a.opcodes()["LDG"] >= 1


def test_no_record_is_a_problem_not_a_pass(tmp_path):
    problems, builds, _ = compiled.check_launches(tmp_path)
    assert len(problems) == 1 and "no launch was recorded" in problems[0] and not builds


def test_interpreter_only_needs_a_reason():
    with pytest.raises(ValueError, match="reason"):
        launches.interpreter_only(object(), "")
