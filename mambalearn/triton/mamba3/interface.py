"""``mamba3_siso_combined``: mamba_ssm's Mamba-3 SISO entry point, on this package's kernels.

Same arguments, layouts and outputs as ``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined``
(the oracle is ``mambalearn.mamba3.mamba3_siso_sequential``), with two differences where they
are cheap: inputs keep their dtype (mamba_ssm casts Q, K, V, Z, Trap and Angles to bf16, and its
cumulative angles too, so its results are bf16-accurate even for float32 inputs), and bad input
raises a ValueError/TypeError naming the argument. ``cu_seqlens`` is not supported.

The autograd function saves the inputs, the state entering every chunk in its frame
(b, h, c, p, n, in the inputs' dtype), the chunks' turns and log-decays, the final angle and, with
Z, the output before the gate; the backward recomputes everything inside a chunk (chapter 07).
"""

import torch

from mambalearn.mamba3.sequential import check_inputs
from mambalearn.triton.mamba3.backward import launch_backward
from mambalearn.triton.mamba3.config import resolve
from mambalearn.triton.mamba3.forward import launch_forward
from mambalearn.utils import check_chunk_size

_NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles", "D", "Z")
# what the forward keeps for the backward besides the inputs (``forward.launch_forward``)
_STEPS = ("C2", "W", "G", "Phi", "Turn", "Cend")  # ``chunk_state.chunk_states``
_SAVED = ("H", "theta_final", "y_pre", *_STEPS)


def _prepare(args, states):
    """Contiguous inputs by name; float64 is refused (Triton's matmuls are float32 at most)."""
    x = {k: (None if t is None else t.contiguous()) for k, t in zip(_NAMES, args, strict=True)}
    for k, t in x.items():
        if t is not None and t.dtype == torch.float64:
            raise TypeError(f"{k} is float64; the Triton kernels take float32, bf16 or fp16 "
                            f"(use mambalearn.mamba3.mamba3_siso_sequential for float64)")
    x["states"] = None if states is None else tuple(s.contiguous().float() for s in states)
    return x


class Mamba3SisoFn(torch.autograd.Function):
    """Forward launches + recomputing backward launches; gradients for every tensor input."""

    @staticmethod
    def forward(ctx, Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, ang0, S0, k0, v0,
                chunk_size, return_final_states, config):
        states = None if S0 is None else (ang0, S0, k0, v0)
        x = _prepare((Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z), states)
        grad = any(ctx.needs_input_grad)
        r = launch_forward(x, chunk_size, save=grad, return_final=return_final_states,
                           cfg=config)
        ctx.chunk_size, ctx.has_states, ctx.config = chunk_size, states is not None, config
        ctx.return_final = return_final_states
        if grad:
            saved = [x[k] for k in _NAMES] + list(x["states"] or (None,) * 4)
            kept = dict(r, **r["steps"])
            ctx.save_for_backward(*saved, *(kept[k] for k in _SAVED))
        if not return_final_states:
            return r["out"]
        return r["out"], r["angle"], r["ssm"], r["k"].to(V.dtype), x["V"][:, -1].clone()

    @staticmethod
    def backward(ctx, d_out, *d_finals):
        saved = ctx.saved_tensors
        x = dict(zip(_NAMES, saved[:11], strict=True))
        x["states"] = tuple(saved[11:15]) if ctx.has_states else None
        kept = dict(zip(_SAVED, saved[15:], strict=True))
        kept["steps"] = {k: kept[k] for k in _STEPS}
        finals = dict(zip(("angle", "ssm", "k", "v"), d_finals or (None,) * 4, strict=True))
        g = launch_backward(x, kept, d_out, finals, ctx.chunk_size, ctx.config)
        grads = [g[k] for k in _NAMES]
        st = g["states"] if ctx.has_states else (None,) * 4
        return (*grads, *st, None, None, None)


def mamba3_siso_combined(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D=None, Z=None,
                         Input_States=None, chunk_size=64, return_final_states=False,
                         cu_seqlens=None, config=None):
    """Mamba-3 SISO (formula: ``mambalearn.mamba3.sequential``), forward and backward in Triton.

    Shapes: Q, K (b, l, g, n); V, Z (b, l, h, p); ADT, DT, Trap (b, h, l); Q_bias, K_bias (h, n);
    Angles (b, l, h, na), na ≤ n/2; D (h,); Input_States (angle (b, h, na), ssm (b, h, p, n),
    k (b, h, n), v (b, h, p)) → out (b, l, h, p) in V's dtype, or with ``return_final_states``
    (out, angle, ssm, k, v). ``chunk_size`` a power of two ≥ 16, the chunk every kernel runs
    at; ``config``: the launch settings (``mambalearn.triton.mamba3.config.Config``; default:
    ``default_config`` for the shape).
    Matches ``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined.mamba3_siso_combined``.
    """
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens (packed variable-length sequences) is not supported here; "
                         "pad the batch or call once per sequence with Input_States")
    check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, Input_States)
    q = check_chunk_size(chunk_size, minimum=16)
    (b, l, g, n), (h, p), na = Q.shape, V.shape[2:], Angles.shape[3]
    config = resolve(config, (b, l, h, g, n, p, na, q), V.device)
    st = Input_States or (None,) * 4
    return Mamba3SisoFn.apply(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, *st,
                              q, bool(return_final_states), config)
