"""The fused SSD forward (chapter 11): chapter 10's five kernels in three launches, or in one.

``launches=2`` (the default; with chapter 10's 10 µs chunk cumsum before them):
``states.chunk_states`` walks the chunks of each (batch, head) with the state in float32
registers (chunk state and state passing in one kernel; for a single long sequence the walk is
cut into segments whose carries are folded between two launches), then
``outputs.chunk_outputs`` computes every chunk's outputs in parallel with C Bᵀ formed on chip (bmm
and chunk scan in one kernel).
Between them only the state entering each chunk crosses memory, in x's dtype (as chapter 10 stores
it), plus Δ and dA_cs. A chunk of fewer than 16 steps (``common.FUSED_MIN_CHUNK``) is too short
for a tensor-core tile along the steps, which both kernels multiply over: chapter 10's kernels
run it, and give the same result.

``launches=1``: ``one_launch.ssd_one_launch``, all of it in one kernel whose programs order the
state passing among themselves with atomics (the lesson of that module's doc).

Rounding: both designs round where chapter 10 rounds (w B_s and the decayed C Bᵀ tile to x's
dtype before their products, the entering state to x's dtype before C Hᵀ), so with a float32
state they agree with ``chunk.ssd_forward`` at the same chunk size to float32 summation order
(and to ~1e-4 with ``exp2``). Every kernel runs at the caller's ``chunk_size``; the launch
settings are a ``config.Config`` (``config.default_config`` for the shape by default; the
measurements behind it in bench/NOTES_ssd.md).
"""

import torch

from mambalearn.mamba2 import args as ssd_args
from mambalearn.mamba2.chunk import chunk_cumsum, ssd_stages
from mambalearn.mamba2.common import FUSED_MIN_CHUNK
from mambalearn.mamba2.config import resolve
from mambalearn.mamba2.fused import outputs, states
from mambalearn.mamba2.fused.one_launch import ssd_one_launch
from mambalearn.utils import refuse_grad


def ssd_fused_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                      initial_states=None, seq_idx=None, dt_softplus=False,
                      dt_limit=(0.0, float("inf")), launches=2, state_dtype=None,
                      config=None):
    """The SSD forward in ``launches`` = 2 or 1 kernel launches (module doc).

    out = ((L ∘ C Bᵀ)(Δx) + D x) · silu(z), L = exp(segsum(ΔA)), Δ = softplus(dt + dt_bias).
    Shapes as ``mamba_chunk_scan_combined``: x, z (b, l, h, p); dt (b, l, h); A, dt_bias (h,);
    B, C (b, l, g, n); D (h,) or (h, p); initial_states (b, h, p, n); seq_idx (b, l)
    → (out (b, l, h, p) in x's dtype, final states (b, h, p, n) float32).

    ``state_dtype`` (``launches=1`` only; default float32): the dtype of the states passed
    between programs (with ``launches=2`` the chain stays in float32 registers).
    ``config``: a ``config.Config`` (default: ``config.default_config`` for this shape). Rows of
    x, z, B, C that are not 16-byte aligned (tensor descriptors need that) run chapter 10's
    kernels instead.

    A forward only, with no autograd: inputs that require grad are refused while autograd
    records (``mamba_chunk_scan_combined`` is this forward with its backward). Non-finite
    inputs (A = −∞, a NaN in one token) as ``mamba_chunk_scan_combined`` says.
    """
    refuse_grad("ssd_fused_forward", "mamba_chunk_scan_combined is this forward with a backward "
                "(or call it under torch.no_grad())", x=x, dt=dt, A=A, B=B, C=C, D=D, z=z,
                dt_bias=dt_bias, initial_states=initial_states)
    a = ssd_args.check("ssd_fused_forward", x, dt, A, B, C, chunk_size, D, z, dt_bias,
                       initial_states, seq_idx, dt_limit)
    x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx = (
        a[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states",
                       "seq_idx"))
    b, l, h, p, g, n = a["shape"]
    q = a["chunk_size"]
    if launches not in (1, 2):
        raise ValueError(f"launches must be 1 or 2, got {launches!r}")
    if launches == 2 and state_dtype is not None:
        raise ValueError("state_dtype is for launches=1: with launches=2 the states stay in "
                         "float32 registers")
    state_dtype = state_dtype or torch.float32
    if state_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"state_dtype must be float32, float16 or bfloat16, got {state_dtype}")
    if ssd_args.is_empty(a["shape"]):
        return ssd_args.empty(x, initial_states, a["shape"])
    if launches == 1 and seq_idx is not None:
        raise ValueError("the one-launch SSD kernel does not support seq_idx; use launches=2")
    cfg = resolve(config, (b, l, h, p, g, n, q), x.device)
    if launches == 1 and q >= FUSED_MIN_CHUNK:  # Δ is computed inside the one kernel
        return ssd_one_launch(x, dt, A, B, C, q, D, z, dt_bias, initial_states, dt_softplus,
                              dt_limit, state_dtype, config=cfg.one)
    dt_c, dA_cs = chunk_cumsum(dt, A, q, dt_bias, dt_softplus, dt_limit,
                               heads=cfg.stages.cumsum_heads)  # Δ, dA_cs: (b, h, c, q)
    if launches == 1:  # too few steps for a tensor-core tile: chapter 10's kernels
        return ssd_stages(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx, cfg.stages)
    return fused_forward(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx, cfg)


def fused_forward(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx, cfg):
    """The two launches from stage 1's Δ and dA_cs (b, h, c, q), behind the checks: arguments as
    ``args.check`` returns them (a non-empty call), ``cfg`` a resolved ``config.Config``; the
    chunk size is Δ's last dim. What the public functions call once Δ is known; nothing here
    checks or resolves again, and Δ's inputs (dt, dt_bias, dt_softplus, dt_limit) stay above."""
    x, B, C = x.contiguous(), B.contiguous(), C.contiguous()  # tensor descriptors: contiguous rows
    z = z.contiguous() if z is not None else None
    if dt_c.shape[-1] < FUSED_MIN_CHUNK or not outputs.tma_ok(x, z, B, C):
        # too few steps for a tensor-core tile, or rows not 16-byte aligned: chapter 10's kernels
        return ssd_stages(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx, cfg.stages)
    H, final = states.chunk_states(x, B, dt_c, dA_cs, initial_states, seq_idx,
                                   config=cfg.states)  # (b, c, h, p, n), (b, h, p, n)
    out = outputs.chunk_outputs(x, C, B, dt_c, dA_cs, H, D, z, seq_idx, config=cfg.outputs)
    return out, final
