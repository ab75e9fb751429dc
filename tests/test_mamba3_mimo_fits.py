"""The MIMO kernels, built for sm_90 without a GPU, fit one program's shared memory on an H200.

The interpreter never checks shared memory: a tile or pipeline too large for the SM shows only at
the first launch on a GPU. ``mambalearn.compiled`` runs Triton's compiler and ptxas on the CPU, so
the launch settings of ``mamba3_mimo_combined`` (``CONFIG``) are checked here at the shapes the
chapter and the benchmark use: bf16, p 64, n 128, rank 4 at chunk 16 (64 rows a tile).
"""

import inspect

import pytest

from mambalearn import compiled, machine  # first: on a CPU it puts Triton in interpreter mode
from mambalearn.mamba3 import mimo_api as mimo
from mambalearn.mamba3.fused.mimo_backward import mimo_backward_kernel
from mambalearn.mamba3.fused.mimo_forward import mimo_forward_kernel

BF16 = {"C_ptr", "B_ptr", "X_ptr", "Z_ptr", "Out_ptr", "Hs_ptr"}  # the inputs' dtype; else fp32
# pointers the launch passes as None (no initial or final states): compiled in as constants
NONE = {"forward": ("H0_ptr", "Hf_ptr", "Bf_ptr"), "backward": ("dHf_ptr", "dBf_ptr")}


def build(kernel, which, r, q, deterministic=False, fp32=False, n=128):
    """``fp32``: float32 operands, launched with IEEE products (``mimo.dot_precision``)."""
    import triton.language as tl  # after mambalearn (interpreter mode on a CPU)

    names = inspect.signature(kernel.fn).parameters
    N, P = mimo.tiles(n, 64, r, q)
    const = dict(h=32, g=1, p=64, n=n, na=32, Q=q, R=r, P=P, N=N, HAS_D=True, HAS_Z=True,
                 HAS_OUT=True, DOT=tl.float32 if fp32 else tl.bfloat16)
    const |= {name: None for name in NONE[which]}
    if which == "forward":
        const |= dict(HAS_H0=False)  # no initial state (H0_ptr None)
    const |= dict(PRECISION="ieee" if fp32 else "tf32", SPLIT=False)  # (as each launches)
    if which == "backward":  # dQ, dK: atomics, or the deterministic mode's fixed-order sum
        const |= dict(DET=deterministic, FAN=mimo.CONFIG.tree_fan, TREE_BLOCK=1024,
                      QK_DOT=False)
    low = set() if fp32 else BF16  # the pointers of the inputs' dtype
    signature = {name: "constexpr" if name in const else
                 ("*bf16" if name in low else "*i32" if name == "counts_ptr" else "*fp32")
                 if name.endswith("_ptr") else "i32" for name in names}
    cfg = mimo.CONFIG
    return compiled.compile_for(kernel, signature, const,
                                num_warps=mimo.launch_warps(cfg, f"{which}_warps", q * r),
                                num_stages=mimo.launch_stages(cfg, f"{which}_stages", q * r))


@pytest.mark.slow
@pytest.mark.parametrize("which, kernel, det", [("forward", mimo_forward_kernel, False),
                                                ("backward", mimo_backward_kernel, False),
                                                ("backward", mimo_backward_kernel, True)])
def test_the_launch_fits_an_h200(which, kernel, det):
    k = build(kernel, which, r=4, q=16, deterministic=det)
    assert 0 < k.shared_bytes <= machine.H200.shared_per_block, (
        f"the MIMO {which} kernel asks for {k.shared_bytes} bytes of shared memory; one program "
        f"may have {machine.H200.shared_per_block} on an H200")


@pytest.mark.slow
@pytest.mark.parametrize("which, kernel", [("forward", mimo_forward_kernel),
                                           ("backward", mimo_backward_kernel)])
def test_float32_operands_build_for_sm90(which, kernel):
    """float32 inputs at rank 4, p 64, n 64, chunk 16: Triton 3.6 could not build these kernels'
    products in tf32 (an H200 run found the forward's), so float32 launches ask for IEEE."""
    k = build(kernel, which, r=4, q=16, fp32=True, n=64)
    assert 0 < k.shared_bytes <= machine.H200.shared_per_block


def test_tiles_too_tall_for_shared_memory_are_refused():
    mimo.tiles(128, 64, 4, 32)  # 128 rows: the largest that fits
    with pytest.raises(ValueError, match="chunk_size · r = 64 · 4 must be"):
        mimo.tiles(128, 64, 4, 64)
    with pytest.raises(ValueError, match="≥ 16"):
        mimo.tiles(128, 64, 2, 4)
