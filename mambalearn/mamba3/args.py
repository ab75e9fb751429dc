"""The Mamba-3 kernels' argument rules beyond the oracle's (chapter 15), written once for the
three entry points ``mamba3_siso_combined``, ``mamba3_siso_step`` and ``mamba3_mimo_step``.

The layouts are checked by the oracles' own functions (``mambalearn.mamba3.reference.
check_inputs``, ``mambalearn.mamba3.step_reference.check_siso_step`` / ``check_mimo_step``); here:
the kernels take float32, float16 or bfloat16 tensors, on a CUDA GPU or (in Triton's interpreter)
the CPU, bf16 only where the interpreter's matmul is right, and a power-of-two chunk of at most
``MAX_CHUNK`` steps.
"""

import torch

from mambalearn.triton.interpreter import check_bf16
from mambalearn.utils import check_chunk_size, check_kernel_device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
STATES = ("Input_States angle", "Input_States ssm", "Input_States k", "Input_States v")
# (q × q) tiles per chunk, and 4 warps per 64 steps of it (common.warps): 256 is 16 warps;
# mamba_ssm's Mamba-3 uses 64
MIN_CHUNK, MAX_CHUNK = 16, 256


def check_tensors(function, named):
    """Raise unless every tensor of ``named`` ({name: tensor or None}) is float32/16/bf16 on a
    device the kernels read."""
    for name, t in named.items():
        if t is not None and t.dtype not in DTYPES:
            raise TypeError(f"{name} is {t.dtype}; the Triton kernels take float32, float16 or "
                            f"bfloat16 (the oracles of mambalearn.mamba3 compute in float64)")
    check_kernel_device(**named)
    check_bf16(function, **named)


def check_chunk(chunk_size):
    """The chunk of ``mamba3_siso_combined``: a power of two, MIN_CHUNK ≤ q ≤ MAX_CHUNK."""
    return check_chunk_size(chunk_size, power_of_two=True, minimum=MIN_CHUNK, maximum=MAX_CHUNK)


def with_states(named, Input_States):
    """``named`` plus the four cache tensors (None if absent) under their names in messages."""
    return dict(named, **dict(zip(STATES, Input_States or (None,) * 4, strict=True)))
