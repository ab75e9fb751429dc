"""Triton kernels compiled for sm_90 on a CPU: registers grow with the block; tl.dot → HGMMA."""

import pytest

from mambalearn import device

device.setup(seed=0)  # interpreter on a CPU: compile_for must still build real machine code
pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from mambalearn import compiled, machine  # noqa: E402


@triton.jit
def _exp_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, tl.exp(x), mask=offs < n)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
    i = tl.arange(0, M)
    a = tl.load(a_ptr + i[:, None] * M + i[None, :])
    b = tl.load(b_ptr + i[:, None] * M + i[None, :])
    tl.store(c_ptr + i[:, None] * M + i[None, :], tl.dot(a, b))


SIG = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def test_registers_grow_with_the_values_each_thread_holds():
    small = compiled.compile_for(_exp_kernel, SIG, {"BLOCK": 512}, num_warps=4)
    big = compiled.compile_for(_exp_kernel, SIG, {"BLOCK": 8192}, num_warps=4)
    assert 0 < small.registers < big.registers <= 255
    assert small.spill_bytes == 0 and small.shared_bytes == 0
    ops = small.opcodes()
    assert ops["MUFU"] == 512 // 128 and ops["LDG"] >= 1 and ops["STG"] >= 1  # exp on the SFU
    occ = machine.occupancy(machine.H200, 4, big.registers)
    assert occ["blocks"] < machine.occupancy(machine.H200, 4, small.registers)["blocks"]


@pytest.mark.parametrize("dtype, kind", [("fp32", "TF32"), ("bf16", "BF16")])
def test_dot_runs_on_tensor_cores(dtype, kind):
    sig = {"a_ptr": f"*{dtype}", "b_ptr": f"*{dtype}", "c_ptr": "*fp32", "M": "constexpr"}
    k = compiled.compile_for(_dot_kernel, sig, {"M": 64}, num_warps=4)
    assert k.opcodes().get("HGMMA", 0) > 0  # Hopper's warpgroup MMA
    assert f".F32.{kind}" in k.sass  # fp32 operands become tf32; bf16 stays bf16
    assert k.shared_bytes > 0  # wgmma reads its operands from shared memory


def test_bad_arguments():
    with pytest.raises(TypeError):
        compiled.compile_for(42, SIG)
    with pytest.raises(TypeError):
        compiled.compile_for(_exp_kernel, ["x_ptr"])
    assert compiled.opcode_counts("        /*0010*/  @P0 MUFU.EX2 R1, R2 ;") == {"MUFU": 1}


def test_a_library_kernel_by_name_scan_becomes_shuffles():
    """tl.associative_scan: warp shuffles inside a warp, shared memory + barriers across warps."""
    from mambalearn.triton import scan as S

    sig = {"a_ptr": "*fp32", "b_ptr": "*fp32", "h_ptr": "*fp32", "l": "i32",
           **{f"stride_{t}{d}": "i32" for t in "abh" for d in "rl"},
           "BLOCK_L": "constexpr", "REVERSE": "constexpr"}
    one, four = compiled.compile_all(S._scan_blocked_kernel, sig, [
        dict(constexprs=dict(BLOCK_L=256, REVERSE=False), num_warps=w) for w in (1, 4)])
    assert one.opcodes()["SHFL"] > 0 and "BAR" not in one.opcodes()
    assert four.opcodes()["BAR"] > 0 and four.opcodes()["STS"] > 0 and four.shared_bytes > 0


def test_a_wrong_signature_names_the_arguments():
    with pytest.raises(RuntimeError, match="kernel's arguments"):
        compiled.compile_for(_exp_kernel, {"x_ptr": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 64})
