"""``mamba3_mimo_combined``: the Mamba-3 MIMO prefill, forward and backward on Triton kernels.

Arguments and layouts are those of ``mambalearn.mamba3.mimo_reference`` (its oracle and chunked
form; mamba_ssm's ``mamba3_mimo`` names), plus ``chunk_size`` (q, steps per chunk: q·r rows per
tile). The per-step preparations run in PyTorch, under autograd: the cumulative angles θ
(``angle_cumsum``), the trapezoid weights w, γ, and the pre-state from Input_States; the kernels
(``mimo_forward``, ``mimo_backward``) take them and give their gradients back.

The autograd function saves its inputs and the state entering every chunk, (b, h, c, p, n) in
the inputs' dtype; the backward recomputes each chunk from it. ``deterministic=True`` sums dQ, dK
over a group's heads in a fixed order instead of with atomics (its cost: ``mimo_backward``): the
same bits on every run and at every position in the batch.

At rank 1 the recurrence is SISO's (``rank_one_on_siso``): with ``config.rank_one = "siso"``
the call runs the SISO kernels, the per-rank weights folded into their inputs. Not the default:
on the H200 that route's dAngles failed its check against the float64 oracle (b1 l200, chunk 64,
bf16), which the interpreter does not reproduce (bench/NOTES_mimo.md).
"""

import torch
import triton

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before any kernel module)
from mambalearn.mamba3.api import mamba3_siso_combined
from mambalearn.mamba3.common import dot_dtype
from mambalearn.mamba3.config import MIMO_DEFAULT, MimoConfig
from mambalearn.mamba3.fused.mimo_backward import mimo_backward_kernel, sum_heads_kernel
from mambalearn.mamba3.fused.mimo_forward import mimo_forward_kernel
from mambalearn.mamba3.mimo_reference import check_inputs, initial_pre_state
from mambalearn.mamba3.reference import angle_cumsum
from mambalearn.mamba3.reference_chunked import trapezoid_weights
from mambalearn.triton.config import resolve as _resolve
from mambalearn.triton.deterministic import TreeSum

CONFIG = MIMO_DEFAULT  # the launch settings (`MimoConfig`: why these)
MAX_ROWS = 128  # q·r: past it no backward fits an H200's shared memory
SUM_BLOCK = 1024  # elements of dQ (dK) a program of the deterministic sum adds


def tiles(n, p, r, chunk_size):
    """(N, P): the state and channel tiles; checks q and r (powers of two, 16 ≤ q·r ≤ 128)."""
    q = int(chunk_size)
    for name, v in (("chunk_size", q), ("the rank r", r)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if not 16 <= q * r <= MAX_ROWS:
        raise ValueError(f"chunk_size · r = {q} · {r} must be ≥ 16 (tl.dot's smallest tile) and "
                         f"≤ {MAX_ROWS} (a tile of more rows does not fit a GPU's shared memory)")
    return max(16, triton.next_power_of_2(n)), max(16, triton.next_power_of_2(p))


def dot_precision(V):
    """``input_precision`` of the forward's and the backward's products: float32 operands in IEEE
    float32 (the CUDA cores), as Triton 3.6's sm_90 pipeline fails on these kernels' tf32
    products (the backward's in its optimize-dot-operands pass; the forward's at rank 4, p 64,
    n 64: the build check of every launch found them); bf16 and fp16 operands on the tensor
    cores, where the setting does not apply."""
    return "ieee" if V.dtype == torch.float32 else "tf32"


def launch_warps(config, key, rows):
    """Warps of a launch: ``config.<key>`` per 64 rows of the (q·r)-row tile."""
    return getattr(config, key) * max(1, rows // 64)


def launch_stages(config, key, rows):
    """Pipeline stages of a launch: ``config.<key>`` up to 64 rows, one beyond (shared memory)."""
    return getattr(config, key) if rows <= 64 else 1


class Mamba3MimoFn(torch.autograd.Function):
    """The kernels on prepared inputs; gradients for every tensor input."""

    @staticmethod
    def forward(ctx, Q, K, V, Z, Q_bias, K_bias, Psi, Zeta, Phi, D, ADT, W, G, theta, H0,
                chunk_size, return_final, cfg, deterministic):
        b, l, r, g, n = Q.shape
        h, p, na = V.shape[2], V.shape[3], theta.shape[3]
        N, P = tiles(n, p, r, chunk_size)
        BP = min(P, cfg.forward_p_block)  # the channels of a program
        c = -(-l // chunk_size)
        out = V.new_empty((b, l, h, p) if Phi is not None else (b, l, r, h, p))
        grad = any(ctx.needs_input_grad)
        Hs = V.new_empty(b, h, c, p, n) if grad else None
        Hf = V.new_empty(b, h, p, n, dtype=torch.float32) if return_final else None
        Kf = V.new_empty(b, r, h, n, dtype=torch.float32) if return_final else None
        mimo_forward_kernel[(h, b, triton.cdiv(p, BP))](
            Q, K, V, Z, Q_bias, K_bias, Psi, Zeta, Phi, D, ADT, W, G, theta, H0, out, Hs, Hf,
            Kf, l, c, h, g, p, n, na, Q=chunk_size, R=r, P=BP, N=N, SPLIT=BP < p,
            HAS_D=D is not None,
            HAS_Z=Z is not None, HAS_OUT=Phi is not None, HAS_H0=H0 is not None,
            DOT=dot_dtype(V), PRECISION=dot_precision(V),
            num_warps=launch_warps(cfg, "forward_warps", chunk_size * r),
            num_stages=launch_stages(cfg, "forward_stages", chunk_size * r))
        if grad:
            ctx.save_for_backward(Q, K, V, Z, Q_bias, K_bias, Psi, Zeta, Phi, D, ADT, W, G,
                                  theta, Hs)
        ctx.chunk_size, ctx.cfg, ctx.has_H0 = chunk_size, cfg, H0 is not None
        ctx.deterministic = deterministic
        return (out, Hf, Kf) if return_final else (out,)

    @staticmethod
    def backward(ctx, d_out, d_Hf=None, d_Kf=None):
        Q, K, V, Z, Q_bias, K_bias, Psi, Zeta, Phi, D, ADT, W, G, theta, Hs = ctx.saved_tensors
        b, l, r, g, n = Q.shape
        h, p, na = V.shape[2], V.shape[3], theta.shape[3]
        N, P = tiles(n, p, r, ctx.chunk_size)
        BP = min(P, ctx.cfg.backward_p_block)  # the channels of a program
        NP = triton.cdiv(p, BP)  # channel blocks: the per-step gradients come in NP parts
        f32 = dict(dtype=torch.float32, device=V.device)
        dQ, dK = torch.zeros(Q.shape, **f32), torch.zeros(K.shape, **f32)
        dV, dZ = torch.empty(V.shape, **f32), torch.zeros(V.shape, **f32)
        dTh, dADT, dW, dG = (torch.empty(NP, *t.shape, **f32) for t in (theta, ADT, W, G))
        dH0 = torch.empty(b, h, p, n, **f32)
        dQb, dKb = torch.empty(NP, b, h, r, n, **f32), torch.empty(NP, b, h, r, n, **f32)
        dPsi, dZeta, dPhi = (torch.zeros(b, h, r, p, **f32) for _ in range(3))
        dD = torch.empty(NP, b, h, **f32)
        c, rows = Hs.shape[2], ctx.chunk_size * r
        # deterministic: dQ, dK over a group's heads in head order, not atomics (mimo_backward)
        tree = parts = None
        heads = h // g * NP  # a copy (a tree tile) per (head of the group, channel block)
        if ctx.deterministic and ctx.cfg.det_sum == "tree":
            tree = TreeSum.allocate(heads, b * g * c, 2 * rows * n, ctx.cfg.tree_fan, V.device)
        elif ctx.deterministic:  # every head's own dQ, dK, added by sum_heads_kernel after
            parts = torch.empty(2, heads, *Q.shape, **f32)
        det = 2 if parts is not None else int(tree is not None)
        slots = tree.slots if tree is not None else parts if parts is not None else dQ
        cont = lambda t: None if t is None else t.contiguous().float()
        mimo_backward_kernel[(h, b, NP)](
            Q, K, V, Z, Q_bias, K_bias, Psi, Zeta, Phi, D, ADT, W, G, theta, Hs,
            d_out.contiguous(), cont(d_Hf), cont(d_Kf), dQ, dK,
            slots, tree.counts if tree is not None else dQ,
            dV, dZ, dTh, dADT, dW, dG, dH0,
            dQb, dKb, dPsi, dZeta, dPhi, dD, l, c, Q.numel() if parts is not None else b * g * c,
            b, h, g, p, n, na,
            Q=ctx.chunk_size, R=r, P=BP, N=N, SPLIT=NP > 1, HAS_D=D is not None,
            HAS_Z=Z is not None,
            HAS_OUT=Phi is not None, DOT=dot_dtype(V), DET=det,
            PRECISION=dot_precision(V),
            FAN=tree.fan if tree is not None else 2,
            TREE_BLOCK=min(1024, triton.next_power_of_2(2 * rows * n)),
            QK_DOT=ctx.cfg.qk_live == "dot",
            num_warps=launch_warps(ctx.cfg, "backward_warps", ctx.chunk_size * r),
            num_stages=launch_stages(ctx.cfg, "backward_stages", ctx.chunk_size * r))
        if parts is not None:  # the heads' copies added in head order
            dQK = torch.empty(2, *Q.shape, **f32)
            sum_heads_kernel[(triton.cdiv(Q.numel(), SUM_BLOCK), 2)](
                parts, dQK, Q.numel(), heads, BLOCK=SUM_BLOCK, num_warps=4)
            dQ, dK = dQK
        if tree is not None:  # root (b·g·c, [dQ, dK], q, r, n) → (b, c·q, r, g, n)[:, :l]
            root = tree.root().view(b, g, c, 2, ctx.chunk_size, r, n).permute(3, 0, 2, 4, 5, 1, 6)
            dQ, dK = root.reshape(2, b, c * ctx.chunk_size, r, g, n)[:, :, :l]
        like = lambda t, x: None if x is None else t.to(x.dtype)
        parts_sum = lambda t: t[0] if NP == 1 else t.sum(0)  # the channel blocks' parts
        dADT, dW, dG, dTh = (parts_sum(t) for t in (dADT, dW, dG, dTh))
        dQb, dKb, dD = (parts_sum(t).sum(0) for t in (dQb, dKb, dD))
        return (like(dQ, Q), like(dK, K), like(dV, V), like(dZ, Z), dQb, dKb,
                dPsi.sum(0), None if Zeta is None else dZeta.sum(0),
                None if Phi is None else dPhi.sum(0), None if D is None else dD,
                dADT, dW, dG, dTh, dH0 if ctx.has_H0 else None, None, None, None, None)


def mamba3_mimo_combined(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out,
                         Angles, D=None, Z=None, Input_States=None, chunk_size=16,
                         return_final_states=False, config=None, deterministic=False):
    """Mamba-3 MIMO prefill (formula: ``mamba3.mimo_reference``), forward and backward in Triton.

    Shapes: Q, K (b, l, r, g, n); V, Z (b, l, h, p); ADT, DT, Trap (b, h, l); Q_bias, K_bias
    (h, r, n); MIMO_V, MIMO_Z, MIMO_Out (h, r, p); Angles (b, l, h, na); D (h,); Input_States
    (angle (b, h, na), ssm (b, h, p, n), k (b, r, h, n), v (b, h, p)) → out (b, l, h, p), or
    (b, l, r, h, p) without MIMO_Out; with ``return_final_states`` (out, angle, ssm, k, v).
    chunk_size q and the rank r powers of two with 16 ≤ q·r ≤ 128; float32, bf16 or fp16 inputs.
    ``deterministic``: dQ, dK summed over a group's heads in a fixed order (not atomics): the same
    bits on every run and at every position in the batch. ``config``: the launch settings, a
    ``mambalearn.mamba3.config.MimoConfig`` (None: ``MIMO_DEFAULT``). At r = 1 (and
    ``config.rank_one = "siso"``) the SISO kernels run (``rank_one_on_siso``; chunk: SISO's rule,
    16 ≤ q ≤ 256).
    Non-finite inputs as ``mamba3_siso_combined``: ADT = −∞ gives the recurrence's output and
    finite gradients; a NaN in Q, K, DT or ADT at step t reaches outputs at t and after; a NaN in
    V at step t also reaches the earlier steps of its chunk (0 · NaN inside the chunk's
    ``tl.dot``), never an earlier chunk, another sequence, head or channel.
    """
    cfg = _resolve(config, MimoConfig, lambda: MIMO_DEFAULT)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    check_inputs(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles, D, Z,
                 Input_States)
    if Q.shape[2] == 1 and cfg.rank_one == "siso":
        return rank_one_on_siso(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z,
                                MIMO_Out, Angles, D, Z, Input_States, chunk_size,
                                return_final_states)
    for name, t in (("Q", Q), ("K", K), ("V", V), ("Z", Z)):
        if t is not None and t.dtype == torch.float64:
            raise TypeError(f"{name} is float64; the Triton kernels take float32, bf16 or fp16 "
                            f"(use mambalearn.mamba3.mimo_reference.mamba3_mimo_sequential "
                            f"for float64)")
    tiles(Q.shape[-1], V.shape[-1], Q.shape[2], chunk_size)
    f = lambda t: None if t is None else t.float().contiguous()
    states = None if Input_States is None else tuple(s.float() for s in Input_States)
    theta = angle_cumsum(f(Angles), f(DT), None if states is None else states[0]).contiguous()
    W, G = (t.contiguous() for t in trapezoid_weights(f(DT), f(Trap)))  # (b, h, l) each
    H0 = None if states is None else initial_pre_state(states, f(DT), f(Trap), f(MIMO_V))
    zeta = MIMO_Z if MIMO_Z is not None or Z is None else torch.ones_like(MIMO_V)
    c = lambda t: None if t is None else t.contiguous()
    out, *finals = Mamba3MimoFn.apply(
        c(Q), c(K), c(V), c(Z), f(Q_bias), f(K_bias), f(MIMO_V), f(zeta), f(MIMO_Out), f(D),
        f(ADT), W, G, theta, None if H0 is None else H0.contiguous(), int(chunk_size),
        bool(return_final_states), cfg, deterministic)
    if not return_final_states:
        return out
    Hf, Kf = finals
    return out, theta[:, -1], Hf, Kf.to(V.dtype), V[:, -1].clone()


def rank_one_on_siso(Q, K, V, ADT, DT, Trap, Q_bias, K_bias, MIMO_V, MIMO_Z, MIMO_Out, Angles,
                     D=None, Z=None, Input_States=None, chunk_size=64, return_final_states=False):
    """Rank 1 of the MIMO prefill on the SISO kernels (``mamba3_siso_combined``).

    At r = 1 the recurrence is SISO's with v_t = x_t ⊙ Ψ: the same α, β, γ, θ, q_t, k_t, one
    rank-1 update a step. Every channel i of the state (its row h_t[i, :]) sees only x_t[i], so
    the output is linear in v channel by channel, the skip term D v included:

        y_t[i](x ⊙ s) = s_i · y_t[i](x)             for any per-channel scale s (p,)

    and out_t = Φ ⊙ y_t ⊙ silu(z_t ⊙ ζ) = SISO(V ⊙ Ψ ⊙ Φ, Z ⊙ ζ). So the weights fold into the
    SISO call's inputs: V′ = V ⊙ (Ψ ⊙ Φ) (one pass over V), Z′ = Z ⊙ ζ (only when MIMO_Z is
    given), Q, K, their biases and the cache's k lose their rank axis; autograd carries the
    gradients back through the folds (dΨ = Σ_{b,l} Φ ⊙ V ⊙ dV′, …).

    The state the SISO kernels carry is then Φ ⊙ h row by row, so an Input_States' ssm and v
    enter scaled by Φ (and Ψ); with ``return_final_states`` Φ is applied to the output instead
    (dividing the final state by Φ would fail where Φ has zeros), one pass more.
    The chunk follows SISO's rule (a power of two, 16 ≤ q ≤ 256). SISO's backward has no
    atomics: its gradients have the same bits on every run with or without ``deterministic``.
    """
    psi = MIMO_V[:, 0]  # (h, p)
    phi = None if MIMO_Out is None else MIMO_Out[:, 0]
    fold = phi is not None and not return_final_states  # Φ into V, not onto the output
    scale = psi * phi if fold else psi
    cast = lambda w, t: w.to(t.dtype)  # the weights in the activations' dtype: one pass
    V1 = V * cast(scale, V)
    Z1 = Z if Z is None or MIMO_Z is None else Z * cast(MIMO_Z[:, 0], Z)
    states = None
    if Input_States is not None:
        ang, ssm, k, v = Input_States
        row = phi[None, :, :, None] if fold else 1.0  # (1, h, p, 1): the state's rows
        states = (ang, ssm * row, k[:, 0], v * cast(scale, v))
    r = mamba3_siso_combined(Q[:, :, 0], K[:, :, 0], V1, ADT, DT, Trap, Q_bias[:, 0],
                             K_bias[:, 0], Angles, D=D, Z=Z1, Input_States=states,
                             chunk_size=chunk_size, return_final_states=return_final_states)
    out = r[0] if return_final_states else r
    if phi is None:
        out = out[:, :, None]  # (b, l, 1, h, p): every rank's output
    elif not fold:
        out = out * cast(phi, out)
    if not return_final_states:
        return out
    _, ang, ssm, k, _ = r
    return out, ang, ssm, k[:, None], V[:, -1].clone()
