"""``mamba_chunk_scan_combined``: the SSD forward (chapter 11's fused kernels by default, or chapter
10's five stages) and its backward, behind ``mamba_ssm``'s signature.

Backward: like mamba_ssm, the forward saves only its inputs. ``backward="triton"`` (the default)
recomputes the states and runs the Triton kernels of ``mambalearn.mamba2.backward`` (the
gradients derived there). ``backward="reference"`` recomputes the chunked PyTorch oracle
(``mambalearn.mamba2.reference.mamba_chunk_scan_ref``) in float32 under autograd instead,
``REFERENCE_HEADS`` heads at a time (so the (b, heads, c, q, q) decay blocks exist for a few heads
at once): the slow oracle of the Triton backward.
"""

import torch

from mambalearn.mamba2 import args as ssd_args
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba2.backward import ssd_backward
from mambalearn.mamba2.chunk import chunk_cumsum, ssd_stages
from mambalearn.mamba2.config import resolve
from mambalearn.mamba2.fused.forward import fused_forward
from mambalearn.mamba2.varlen import varlen_states

BACKWARDS = ("triton", "reference")
REFERENCE_HEADS = 8  # heads the oracle backward recomputes together (memory ∝ this)


class _SSDFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                dt_softplus, dt_limit, fused, backward, config):
        # Δ = clamp(softplus(dt + dt_bias)) and its chunk cumsum, once: the kernels after take Δ
        dt_c, dA_cs = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit,
                                   heads=config.stages.cumsum_heads)  # (b, h, c, q)
        if fused:  # chapter 11's two launches
            out, final = fused_forward(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx,
                                       config)
        else:  # chapter 10's stages 2–5
            out, final = ssd_stages(x, B, C, dt_c, dA_cs, D, z, initial_states, seq_idx,
                                    config.stages)
        ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
        ctx.args = (chunk_size, dt_softplus, dt_limit)
        ctx.config = config
        ctx.backward_kind = backward
        return out, final

    @staticmethod
    def backward(ctx, dout, dfinal):
        if ctx.backward_kind == "reference":
            grads = _reference_backward(ctx, dout, dfinal, REFERENCE_HEADS)
        else:
            x, dt, A, B, C, D, z, dt_bias, h0, seq_idx = ctx.saved_tensors
            chunk_size, dt_softplus, dt_limit = ctx.args
            dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dh0 = ssd_backward(
                dout, dfinal, x, dt, A, B, C, chunk_size, D, z, dt_bias, h0, seq_idx,
                dt_softplus, dt_limit, config=ctx.config)
            grads = (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dh0)
        x, dt, A, B, C, D, z, dt_bias, h0 = grads
        grads = (x, dt, A, B, C, None, D, z, dt_bias, h0, None, None, None, None, None, None)
        return tuple(gr if need else None
                     for gr, need in zip(grads, ctx.needs_input_grad, strict=True))


def _reference_backward(ctx, dout, dfinal, heads):
    """The oracle backward: autograd through ``mambalearn.mamba2.reference.mamba_chunk_scan_ref`` in
    float32, a few heads at a time: heads are independent given B, C, so the (b, heads, c, q, q)
    decay blocks the oracle builds exist for ``heads`` heads at once, not all h.
    Returns the gradients of (x, dt, A, B, C, D, z, dt_bias, initial_states)."""
    saved = ctx.saved_tensors
    chunk_size, dt_softplus, dt_limit = ctx.args
    leaves = [t.detach().float().requires_grad_(t.requires_grad) if t is not None
              and t.is_floating_point() else t for t in saved]
    x, dt, A, B, C, D, z, dt_bias, h0, seq_idx = leaves
    h, g = x.shape[2], B.shape[2]
    step = _head_step(h // g, heads)
    wrt = [t for t in leaves if t is not None and t.requires_grad]
    with torch.enable_grad():
        for i in range(0, h, step):
            hs, gs = slice(i, i + step), slice(i // (h // g), i // (h // g) + 1)
            cut = lambda t, dim, i=i: None if t is None else t.narrow(dim, i, step)
            out, final = ssd.mamba_chunk_scan_ref(
                x[:, :, hs], dt[:, :, hs], A[hs], B[:, :, gs], C[:, :, gs], chunk_size,
                cut(D, 0), cut(z, 2), cut(dt_bias, 0), cut(h0, 1), seq_idx, dt_softplus,
                dt_limit, return_final_states=True)
            outs, grads_out = [out], [dout[:, :, hs].float()]
            if dfinal is not None:
                outs.append(final)
                grads_out.append(dfinal[:, hs].float())
            if wrt:
                torch.autograd.backward(outs, grads_out, inputs=wrt)  # accumulates in .grad
    res = [(t.grad if t.grad is not None else torch.zeros_like(t)).to(s.dtype)
           if t is not None and t.requires_grad else None
           for t, s in zip(leaves, saved, strict=True)]
    return tuple(res[:9])


def _head_step(heads_per_group, heads):
    """The largest divisor of heads_per_group ≤ ``heads``: a slice never straddles two groups."""
    return max(d for d in range(1, min(heads, heads_per_group) + 1) if heads_per_group % d == 0)


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False,
                              fused=True, backward="triton", config=None):
    """out = ((L ∘ C Bᵀ)(Δx) + D x) · silu(z), L = exp(segsum(ΔA)), Δ = softplus(dt + dt_bias).

    Shapes (mamba_ssm's): x, z (b, l, h, p); dt (b, l, h); A, dt_bias (h,); B, C (b, l, g, n)
    with g dividing h; D (h,) or (h, p); initial_states (b, h, p, n); seq_idx (b, l) int32/int64
    → out (b, l, h, p) in x's dtype, plus final states (b, h, p, n) float32 if
    ``return_final_states``. l need not be a multiple of ``chunk_size`` (a power of two).

    ``fused=True`` (the default) runs chapter 11's fused forward (``ssd_fused_forward``; its
    H200 timings against the five stages and the peers: docs/BENCHMARKS.md), ``False`` chapter
    10's five stages. With a float32 state both agree to float32 summation order (rel. 1e-4).
    ``backward`` is ``"triton"`` or ``"reference"`` (module doc). ``config``: the launch
    settings, a ``mambalearn.mamba2.config.Config`` (default: ``default_config`` for the
    shape); every kernel runs at ``chunk_size``.
    Any layout of the tensors gives the contiguous call's answer; an empty batch or sequence an
    empty output (and the final states it was given). Bad input raises a TypeError/ValueError
    naming the argument (``args.check``).
    With ``return_varlen_states`` (batch 1, ``cu_seqlens`` (S + 1,) the packed sequences'
    offsets) also the state after each sequence's last token, (S, h, p, n) float32, last:
    (out, varlen_states) or (out, final_states, varlen_states) (``varlen.varlen_states``: the
    scan's own state there, so with a ``seq_idx`` that restarts at each offset, each sequence's
    state alone; gradients flow through it). ``cu_seqlens`` is read only then, as in mamba_ssm.
    Drop-in for ``mamba_ssm.ops.triton.ssd_combined.mamba_chunk_scan_combined``.

    Non-finite inputs (both forwards, the Triton backward): A = −∞ (a head that forgets at every
    step) gives the recurrence's output and finite gradients, their limit (Δ A is floored at −128
    before the chunk cumsum, ``common.log_decay``: exp(−128) is 0 in float32 as exp(Δ A) was).
    A NaN in dt, B or C at step t of a sequence reaches that sequence's outputs at t and after
    (B and C through every head of their group), never before: the causal masks are
    ``tl.where`` calls. A NaN or ±∞ in x at step t, head h, channel p also reaches out[:, t', h, p]
    for the earlier steps t' of t's tile of the chunk's diagonal block — the block's product
    (L ∘ C Bᵀ)(Δx) is one ``tl.dot``, and there the zero of L_{t't} meets the NaN (0 · NaN = NaN);
    in Triton's interpreter, which walks every block, that is the whole chunk up to t. Never an
    earlier chunk, another sequence of the batch, another head or another channel.
    """
    a = ssd_args.check("mamba_chunk_scan_combined", x, dt, A, B, C, chunk_size, D, z, dt_bias,
                       initial_states, seq_idx, dt_limit)
    if backward not in BACKWARDS:
        raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
    if ssd_args.is_empty(a["shape"]):
        out, final = ssd_args.empty(x, a["initial_states"], a["shape"])
    else:
        config = resolve(config, (*a["shape"], a["chunk_size"]), x.device)
        out, final = _SSDFn.apply(a["x"], a["dt"], a["A"], a["B"], a["C"], a["chunk_size"],
                                  a["D"], a["z"], a["dt_bias"], a["initial_states"],
                                  a["seq_idx"], dt_softplus, tuple(dt_limit), bool(fused),
                                  backward, config)
    if not return_varlen_states:
        return (out, final) if return_final_states else out
    if cu_seqlens is None:
        raise ValueError("return_varlen_states needs cu_seqlens (the packed sequences' offsets)")
    delta = ssd.effective_dt(a["dt"], a["dt_bias"], dt_softplus, tuple(dt_limit))
    states = varlen_states(a["x"], delta, a["A"], a["B"], cu_seqlens, a["seq_idx"],
                           a["initial_states"])
    return (out, final, states) if return_final_states else (out, states)
