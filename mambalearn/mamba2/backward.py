"""The backward of Mamba-2 SSD in Triton kernels (chapter 10), derived from the chunked algorithm.

Per batch b and head h, inside chunk c (steps t, s = 0 … q−1 of the chunk), with Δ the effective
dt and a_t = dA_cs[c, t] = Σ_{k≤t} Δ_k A (the in-chunk cumulative log-decay), the forward is

    P_ts    = CB_ts · exp(a_t − a_s) for s ≤ t (same sequence), else 0      CB = C Bᵀ   (q, q)
    Y_diag  = P (Δ ∘ x)                                                                 (q, p)
    S_c     = Σ_s w_s x_s B_sᵀ,   w_s = exp(a_last − a_s) Δ_s                           (p, n)
    H_{c+1} = α_c H_c + S_c,      α_c = exp(a_last),   H_0 = initial state,  final = H_last+1
    Y_off_t = exp(a_t) H_c C_t                                                          (p,)
    out     = (Y_diag + Y_off + D x) · silu(z)

(seq_idx multiplies terms by 0/1 masks: constants, which pass into the gradients unchanged).
Backwards, with dy = ∂loss/∂(Y_diag + Y_off):

 1. gate      dy = dout · silu(z),  dz = dout · u · σ(z)(1 + z(1 − σ(z))),  u = Y + D x
 2. dstates   dH_c = Σ_t exp(a_t) dy_t C_tᵀ        (what Y_off sends to the state entering c)
 3. state passing reversed over chunks: 𝒢 after the last chunk = dfinal,
              dS_c = 𝒢_{c+1},  𝒢_c = dH_c + α_c 𝒢_{c+1},  dinitial_states = 𝒢_0,
              ∂loss/∂a_last ∋ ⟨α_c H_c, 𝒢_{c+1}⟩   (a_last also scales all of S_c: step 8)
 4. dCB       dCB_ts = Σ_heads (dy_t · x_s) Δ_s exp(a_t − a_s), s ≤ t    (a group's heads)
 5. dC        dC_t = Σ_heads exp(a_t) dy_t H_c + Σ_s dCB_ts B_s
 6. dB        dB_s = Σ_heads w_s x_s dS_c + Σ_t dCB_ts C_t
 7. dx        G_s = Σ_t P_ts dy_t + exp(a_last − a_s) dS_c B_s           (= ∂loss/∂(Δ_s x_s))
              dx_s = Δ_s G_s + D dy_s,  ∂loss/∂Δ_s at fixed a = x_s · G_s,  dD = Σ dy · x
 8. cumsum    a enters only through decays. exp(a_t − a_s) gives +E_ts to a_t and −E_ts to a_s,
              E_ts = dP_ts P_ts (s < t; E_tt would add and take the same number). With Y_off
              and S_c alike (v_s = w_s x_s · (dS_c B_s): −v_s at a_s, Σ_s v_s at a_last):
                ∂loss/∂a_t = Σ_{s<t} E_ts − Σ_{t'>t} E_t't + dy_t · Y_off_t − v_t
                             + [t = last] (⟨α_c H_c, 𝒢_{c+1}⟩ + Σ_s v_s)
              The first pair equals dy_t · Y_diag_t − Δ_t x_t · (Pᵀdy)_t, and v and Σ v are
              parts of Δ_t x_t · G_t and ⟨H_{c+1}, 𝒢_{c+1}⟩, but those are large numbers whose
              difference is small (in the reverse cumsum below only the rectangle
              Σ_{t≥k>s} E_ts and Σ_{s<k} v_s survive): computed from differently rounded
              products (P and H cast to bf16 for tl.dot) they left a 6 % error in dA on a GPU.
              So each pair comes from the same float32 numbers: step 4 takes the row and the
              column sums of one float32 tile of E, step 7 writes v in float32 where it forms
              dS_c B_s, and step 3 gives only ⟨α_c H_c, 𝒢_{c+1}⟩, which cancels nothing.
              Then a_t = Σ_{k≤t} Δ_k A, so with the reverse cumsum R_k = Σ_{t≥k} ∂loss/∂a_t:
                dΔ_k = x_k · G_k + A R_k,   dA = Σ Δ_k R_k,
              and Δ = clamp(softplus(dt + dt_bias)): ddt = dΔ · σ(dt + dt_bias) · 1[not clamped],
              d dt_bias = Σ_{b,l} ddt.

Steps 4–6 sum over the heads of a group (B and C are shared by h/g heads): one program loops over
those heads and owns its output tile, so there are no atomics. The a terms of step 8 are row and
column sums of products steps 4, 5 and 7 already form (E_ts = W_ts CB_ts, Σ_n C_t (dy_t H_c),
dS_c B_s), so Y itself is never recomputed — unless z is given: the gate needs u, which costs one
forward chunk scan.

Like mamba_ssm, the forward saves only its inputs; step 0 recomputes Δ, dA_cs, the passed states
H_c (in x's dtype) and CB with the forward's kernels. Products are ``tl.dot`` with float32
accumulation (bf16 operands on a GPU). The oracle: autograd through
``mambalearn.mamba2.reference.mamba_chunk_scan_ref`` (``mamba_chunk_scan_combined(...,
backward="reference")``). Organised like mamba_ssm's ``ssd_combined._mamba_chunk_scan_combined_bwd``
(not its code).
"""

import torch
import triton

from mambalearn.mamba2 import chunk as fwd
from mambalearn.mamba2.backward_config import blocks, launch_args

# Each step lives in a module of its own, kernel then launcher: 1 and 8 in backward_cumsum, 2–3 in
# backward_states, 4–6 in backward_groups, 7 in backward_dx; launch settings in backward_config.
# Re-exported here, where callers, tests and the benchmark look for them (``SB.dcb``, …).
from mambalearn.mamba2.backward_cumsum import (  # noqa: F401
    _chunk_cumsum_bwd_kernel,
    _gate_bwd_kernel,
    chunk_cumsum_backward,
    gate_backward,
)
from mambalearn.mamba2.backward_dx import dx_backward
from mambalearn.mamba2.backward_groups import (  # noqa: F401
    _dB_kernel,
    _dC_kernel,
    _dcb_kernel,
    dB_backward,
    dC_backward,
    dcb,
)
from mambalearn.mamba2.backward_states import (  # noqa: F401
    _dstates_kernel,
    _state_passing_bwd_kernel,
    dstates,
    state_passing_backward,
)
from mambalearn.mamba2.common import FUSED_MIN_CHUNK
from mambalearn.mamba2.fused.states import chunk_states


# ---------------------------------------------------------------------------------------------
def ssd_backward(dout, dfinal, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                 initial_states=None, seq_idx=None, dt_softplus=False,
                 dt_limit=(0.0, float("inf")), *, config):
    """All gradients of ``mamba_chunk_scan_combined``, steps 0–8 of the module doc.

    Shapes: dout (b, l, h, p); dfinal (b, h, p, n) or None; the rest as the forward's.
    Returns (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states), each in its input's dtype,
    None where the input is None. Matches ``_mamba_chunk_scan_combined_bwd`` of mamba_ssm.

    ``config``: the resolved ``config.Config`` of the forward (``mamba_chunk_scan_combined``
    checks and resolves it once; ``config.default_config`` for the shape is the default): its
    ``backward`` (a launch per kernel, ``nsplit``: programs per group in steps 4–6,
    ``recompute``: step 0 by chapter 11's one-kernel chunk states, ``"states"``, or chapter 10's
    chunk state and state passing, ``"stages"``) and its ``stages`` (the recomputing kernels).
    """
    b, l, h, p = x.shape
    n, q = B.shape[3], chunk_size
    cfg, st = config.backward, config.stages
    x, B, C, dout = x.contiguous(), B.contiguous(), C.contiguous(), dout.contiguous()
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    # 0. recompute what the forward did not keep: Δ, dA_cs, the passed states H, CB
    dt_c, dA_cs = fwd.chunk_cumsum(dt, A, q, dt_bias, dt_softplus, dt_limit,
                                   heads=st.cumsum_heads)  # (b, h, c, q)
    if cfg.recompute == "states" and q >= FUSED_MIN_CHUNK:
        H, final = chunk_states(x, B, dt_c, dA_cs, initial_states, seq_idx,
                                config=cfg.states)  # (b, c, h, p, n)
    else:
        S = fwd.chunk_state(x, B, dt_c, dA_cs, seq_idx, st)  # (b, c, h, p, n) f32
        H, final = fwd.state_passing(S, dA_cs, initial_states, seq_idx, l, out_dtype=x.dtype,
                                     cfg=st)
        del S
    CB = fwd.bmm_chunk(C, B, q, st)  # (b, c, g, q, q) f32
    c = dA_cs.shape[2]
    # 1. gate
    if z is not None:
        u = fwd.chunk_scan(x, C, CB, dt_c, dA_cs, H, D, None, seq_idx, st)  # y + D x
        dy, dz = gate_backward(dout, z, u, cfg)
        del u
    else:
        dy, dz = dout, None
    # 2–3. the state gradients, backwards over chunks (dS holds dH, then dS)
    dS = dstates(dy, C, dA_cs, seq_idx, cfg=cfg)  # (b, c, h, p, n) f32
    dlast, dinit = state_passing_backward(dS, H, final, dA_cs, dfinal, seq_idx, l,
                                          has_init=initial_states is not None, cfg=cfg)
    # 4–6. B and C are shared by a group's heads: one program per output tile loops over them
    nblk = triton.cdiv(q, blocks(q, cfg))
    nblk_n = triton.cdiv(n, launch_args(cfg.dC, n)[0])
    ddA = torch.zeros(b, h, c, q, nblk + nblk_n, device=x.device, dtype=torch.float32)
    dCB = dcb(dy, x, CB, dt_c, dA_cs, ddA, seq_idx, cfg.nsplit, cfg=cfg)  # (b, c, g, nsplit, q, q)
    dC = dC_backward(dy, H, C, B, dCB, dA_cs, ddA, nblk, seq_idx, cfg=cfg)  # (b, l, g, n) f32
    dB = dB_backward(x, dS, C, dCB, dt_c, dA_cs, seq_idx, cfg=cfg)  # (b, l, g, n) f32
    del dCB, H
    # 7. x, x · G for Δ, and v for a
    v = torch.empty(b, h, c, q, device=x.device, dtype=torch.float32)
    dx, ddt_x, dD = dx_backward(x, dy, B, CB, dS, dt_c, dA_cs, D, seq_idx, v, cfg=cfg)
    del dS, CB
    # 8. through the cumsum and the dt transform
    ddt, dA, ddt_bias = chunk_cumsum_backward(ddA.sum(-1), ddt_x, dlast, dt_c, dt, A, dt_bias,
                                              dt_softplus, dt_limit, v, cfg=cfg)
    cast = lambda grad, like: None if like is None else grad.to(like.dtype)
    return (dx, cast(ddt, dt), cast(dA, A), cast(dB, B), cast(dC, C), cast(dD, D), dz,
            cast(ddt_bias, dt_bias), cast(dinit, initial_states))
