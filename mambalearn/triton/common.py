"""What every family's kernels share, written once: constants, the fast exponential, softplus,
the device's size and the grid's limits.

    LOG2E        log₂ e: exp(x) = 2^(x · log₂ e), the form the exp unit computes
    exp2_ftz     2^x as one MUFU.EX2 instruction, results below 2⁻¹²⁶ flushed to 0 (the
                 interpreter: tl.exp2)
    softplus     log(1 + eˣ), stable for large |x|, and x itself above 20 (mamba_ssm's threshold)
    sm_count     streaming multiprocessors of a CUDA device (0 elsewhere; `mambalearn.device`'s,
                 which chapter 05's roofline reads too)
    GRID_LIMITS  programs per grid axis (CUDA: 2³¹ − 1, 65535, 65535); GRID_Y, GRID_Z the last two

Mamba-1 (`mambalearn.mamba1`), Mamba-2 (`mambalearn.mamba2`) and Mamba-3 (`mambalearn.mamba3`)
import them from here; a family's own ``common`` module holds only what its kernels share.
"""

import triton
import triton.language as tl

from mambalearn import device
from mambalearn.device import sm_count  # noqa: F401  (the toolkit's name for it)
from mambalearn.launches import GRID_LIMITS

INTERPRETED = device.interpreted()  # Triton's CPU interpreter runs the kernels
_INTERPRETED = tl.constexpr(INTERPRETED)  # the same flag, readable inside @triton.jit functions
LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x · log2 e)
GRID_Y, GRID_Z = GRID_LIMITS[1], GRID_LIMITS[2]  # CUDA's limit on grid axes 1 and 2


@triton.jit
def exp2_ftz(x):
    """2^x, one MUFU.EX2 instruction, results below 2^-126 flushed to 0. (``tl.exp``/``tl.exp2``
    add three instructions per element to handle such denormal results: in the q×q tiles of SSD
    that is a third of the arithmetic, and values below 1e-38 change no output.)"""
    if _INTERPRETED:
        return tl.exp2(x)
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x],
                                         dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def softplus(x):
    """log(1 + e^x), stable for large |x|; mamba_ssm returns x itself above 20."""
    return tl.where(x <= 20.0, tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x))), x)
