"""The SSD kernels' argument rules (chapters 10–11), written once for both public entry points,
``mamba_chunk_scan_combined`` and ``ssd_fused_forward``.

`check` applies mamba_ssm's layouts (``mambalearn.mamba2.reference.check_inputs`` /
``check_extras``: x, z (b, l, h, p); dt (b, l, h); A, dt_bias (h,); B, C (b, l, g, n); D (h,) or (h,
p); initial_states (b, h, p, n); seq_idx (b, l) int; dt_limit a pair) and the kernels' own: float32,
float16 or bfloat16 tensors (x, B and C in one dtype), a power-of-two ``chunk_size`` ≤
``MAX_CHUNK``, n ≥ 1, tensors on the GPU (or the CPU in the interpreter). It returns the
arguments ready for any kernel: the small per-head tensors contiguous (the chunk-cumsum kernel
reads A and dt_bias without strides; D, initial_states and seq_idx are copied for the same
reason, once, here), the large ones (x, dt, z, B, C) as given, since every launcher takes their
strides or copies them itself. `empty` is the answer for an empty batch or sequence.
"""

import torch

from mambalearn.mamba2 import reference as ssd
from mambalearn.triton.interpreter import check_bf16
from mambalearn.utils import check_chunk_size, check_kernel_device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# q×q tiles per chunk (C Bᵀ, the decay): beyond this a chunk does not fit on chip and the
# interpreter would run (q/16)² programs per chunk; mamba_ssm's models use 256
MAX_CHUNK = 1024

_NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx")


def check(function, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
          initial_states=None, seq_idx=None, dt_limit=(0.0, float("inf"))):
    """Raise a clear error for arguments the SSD kernels cannot take; return them normalised
    (module doc) as a dict by name, with ``shape`` = (b, l, h, p, g, n) and ``chunk_size``."""
    b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C, allow_empty=True)
    ssd.check_extras(b, l, h, p, n, D, z, dt_bias, initial_states, seq_idx, dt_limit)
    if n == 0:
        raise ValueError("B and C have n = 0 states (their last dim); the state size must be ≥ 1")
    q = check_chunk_size(chunk_size, power_of_two=True, maximum=MAX_CHUNK)
    args = dict(zip(_NAMES, (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx),
                    strict=True))
    if B.dtype != x.dtype or C.dtype != x.dtype:
        raise TypeError(f"B and C must have x's dtype {x.dtype}, got {B.dtype} and {C.dtype}")
    for name, t in args.items():
        if t is not None and name != "seq_idx" and t.dtype not in DTYPES:
            raise TypeError(f"{name} is {t.dtype}; the SSD kernels take float32, float16 or "
                            f"bfloat16 (mambalearn.mamba2.reference.mamba_chunk_scan_ref "
                            f"computes in float64)")
    check_kernel_device(**args)
    check_bf16(function, x=x)
    small = ("A", "dt_bias", "D", "initial_states", "seq_idx")
    args = {k: (t.contiguous() if k in small and t is not None else t) for k, t in args.items()}
    return dict(args, shape=(b, l, h, p, g, n), chunk_size=q)


def is_empty(shape):
    """True when there is nothing to compute: b, l, h or p is 0."""
    b, l, h, p, _, _ = shape
    return b * l * h * p == 0


def empty(x, initial_states, shape):
    """(out, final states) of an empty input: out (b, l, h, p) with no elements (on x's graph),
    the final states those given (float32), or zeros."""
    b, _, h, p, _, n = shape
    final = x.new_zeros((b, h, p, n), dtype=torch.float32) if initial_states is None \
        else initial_states.float().clone()
    return x * 0, final
