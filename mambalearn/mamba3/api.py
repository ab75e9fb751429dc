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

from mambalearn.mamba3 import args
from mambalearn.mamba3.backward import launch_backward
from mambalearn.mamba3.chunk import _initial_state, launch_forward
from mambalearn.mamba3.config import resolve
from mambalearn.mamba3.reference import check_inputs
from mambalearn.mamba3.walk import walk_forward

_NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles", "D", "Z")
# what the forward keeps for the backward besides the inputs (``chunk.launch_forward``, or
# ``walk.walk_forward`` with ``Config.forward_launches`` = 1)
_STEPS = ("C2", "W", "G", "Phi", "Turn", "Cend")  # ``chunk_state.chunk_states``
_SAVED = ("H", "theta_final", "y_pre", *_STEPS)


def _prepare(args, states):
    """Contiguous inputs by name (the entry point has checked them, ``args.check_tensors``)."""
    x = {k: (None if t is None else t.contiguous()) for k, t in zip(_NAMES, args, strict=True)}
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
        if config.forward_launches == 1:  # one walk over the chunks (``walk``)
            H_in, theta_in = _initial_state(x)
            r = walk_forward(x, chunk_size, grad, return_final_states, config, H_in, theta_in)
        else:
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
    """Mamba-3 SISO (formula: ``mambalearn.mamba3.reference``), forward and backward in Triton.

    Shapes: Q, K (b, l, g, n); V, Z (b, l, h, p); ADT, DT, Trap (b, h, l); Q_bias, K_bias (h, n);
    Angles (b, l, h, na), na ≤ n/2; D (h,); Input_States (angle (b, h, na), ssm (b, h, p, n),
    k (b, h, n), v (b, h, p)) → out (b, l, h, p) in V's dtype, or with ``return_final_states``
    (out, angle, ssm, k, v). ``chunk_size`` a power of two, 16 ≤ q ≤ 256, the chunk every kernel
    runs at; ``config``: the launch settings (``mambalearn.mamba3.config.Config``;
    default: ``default_config`` for the shape).
    Any layout of the tensors gives the contiguous call's answer; b, l or h = 0 an empty
    output (and the states given). Bad input raises a TypeError/ValueError naming the argument.
    Matches ``mamba_ssm.ops.triton.mamba3.mamba3_siso_combined.mamba3_siso_combined``.

    Non-finite inputs: ADT = −∞ (a step, or a whole head, that forgets at once) gives the
    recurrence's output and finite gradients, their limit (ADT is floored at −128,
    ``common.floor_log_decay``: e^{−128} is 0 in float32 as e^{ADT} was). A NaN in Q, K, DT or ADT
    at step t of a sequence reaches that sequence's outputs at t and after, never before (the
    causal masks are ``tl.where`` calls). A NaN or ±∞ in V at step t also reaches the steps of t's
    chunk before it: the chunk's product (L ∘ Q Kᵀ) V is one ``tl.dot``, where L_{t′t} = 0
    (t′ < t) meets the NaN (0 · NaN = NaN); never an earlier chunk, another sequence of the
    batch, another head or another channel of V.
    """
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens (packed variable-length sequences) is not supported here; "
                         "pad the batch or call once per sequence with Input_States")
    b, l, h, p, g, n, na = check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z,
                                        Input_States, allow_empty=True)
    q = args.check_chunk(chunk_size)
    args.check_tensors("mamba3_siso_combined", args.with_states(dict(zip(_NAMES, (
        Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z), strict=True)), Input_States))
    kw = dict(Q=Q, K=K, V=V, ADT=ADT, DT=DT, Trap=Trap, Q_bias=Q_bias, K_bias=K_bias,
              Angles=Angles, D=D, Z=Z, Input_States=Input_States)
    if b * l * h == 0:  # nothing to scan: an empty output, the states as they came in
        return _empty(kw, (b, l, h, p, n, na), return_final_states)
    if p == 0:  # no channel: nothing for the kernels' tiles, but θ and k still turn
        return _no_channels(kw, q, return_final_states)
    config = resolve(config, (b, l, h, g, n, p, na, q), V.device)
    st = Input_States or (None,) * 4
    return Mamba3SisoFn.apply(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, *st, q,
                              bool(return_final_states), config)


def _empty(kw, shape, return_final_states):
    """b, l or h is 0: out (b, l, h, p) with no elements; the final states are those given
    (or zeros), in the dtypes the kernels return (angle and ssm float32, k and v V's)."""
    b, l, h, p, n, na = shape
    V = kw["V"]
    out = V * 0  # empty, on V's graph
    if not return_final_states:
        return out
    f32, vd = dict(dtype=torch.float32), dict(dtype=V.dtype)
    zeros = (V.new_zeros((b, h, na), **f32), V.new_zeros((b, h, p, n), **f32),
             V.new_zeros((b, h, n), **vd), V.new_zeros((b, h, p), **vd))
    given = kw["Input_States"] or zeros
    return (out, *(s.to(z.dtype).clone() for s, z in zip(given, zeros, strict=True)))


def _no_channels(kw, chunk_size, return_final_states):
    """p = 0: the PyTorch oracle (no state to scan; the angles and the last k are cheap)."""
    from mambalearn.mamba3.reference_chunked import mamba3_siso_chunked

    r = mamba3_siso_chunked(**kw, chunk_size=chunk_size, return_final_states=True)
    if not return_final_states:
        return r[0]
    out, angle, ssm, k, v = r
    V = kw["V"]
    return out, angle.float(), ssm.float(), k.to(V.dtype), v.to(V.dtype)
