"""The Mamba-3 SISO backward: five launches, the forward's three run backwards, plus the steps.

The forward kept the inputs, the state entering every chunk H^L_c (its frame), the chunks' turns
and log-decays, the final angle and (with Z) the output before the gate. Everything inside a
chunk is recomputed (chapter 07's recomputation); what couples chunks backwards is the state's
gradient alone (chapter 10's state passing, reversed):

    1. state gradients   dS^L_c = Σ_t e^{c_t} dy_t q_tᵀ, and the gate's dz     (``chunk_state``)
    2. passing them      D_c = G^L_{c+1} R(Φ_c)ᵀ,  G^L_c = dS^L_c + a_c D_c      (``state_passing``)
    3. dv, dw, dγ, dD and the inputs' part of dc, every chunk at once             (``backward_v``)
    4. dq and dk, dθ per step and the state's part of dc                           (``backward_qk``)
    5. dAngles, dDT, dTrap, dADT: what couples steps                             (``_steps_kernel``)

Step 5: θ_t = θ_in + Σ_{s≤t} Δ_s π tanh(a_s), so ∂θ flows back as a reverse cumsum over the whole
sequence (inside chunks from step 4, across chunks a cumsum over c here), and the trapezoid's
w_t = γ_t + (1 − λ_{t+1})Δ_{t+1} mixes steps t and t + 1 (γ_t = λ_tΔ_t):

    dAngles_t = Σ_{s≥t} dθ_s · Δ_t π (1 − tanh² a_t),   dΔ_t ∋ Σ_j (Σ_{s≥t} dθ_s) π tanh a_t
    dΔ_t = (dγ_t + dw_t) λ_t + dw_{t−1} (1 − λ_t) + …,   dλ_t = (dγ_t + dw_t − dw_{t−1}) Δ_t
    dADT_t = Σ_{r ≥ t in chunk} dc_r    (c_t = Σ_{s≤t} ADT_s restarts with every chunk)
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.backward_qk import bwd_qk_kernel
from mambalearn.mamba3.backward_v import bwd_v_kernel
from mambalearn.mamba3.chunk_state import state_grads
from mambalearn.mamba3.common import (
    GRID_Y,
    PI,
    SIZES,
    blocks,
    dot_dtype,
    tanh,
    warps,
)
from mambalearn.mamba3.reference import final_k, rotate_pairs
from mambalearn.mamba3.state_passing import pass_state_grads, walk_state_grads


@triton.jit(do_not_specialize=SIZES)
def _steps_kernel(
    Ang_ptr, DT_ptr, Trap_ptr,  # (b, l, h, na), (b, h, l) ×2
    dth_ptr,  # (b, l, h, na): dθ_t
    dth_tot_ptr,  # (b, h, c, na): Σ_{s in chunk} dθ_s
    dth_F_ptr,  # (b, h, na) or None: the gradient of the final angle (θ after the last step)
    dW_ptr, dG_ptr,  # (b, h, l): the gradients of w and γ
    d_owe_ptr,  # (b, h) or None: of the (1 − λ₀)Δ₀ the first step owes Input_States' last input
    dcv_ptr, dcq_ptr,  # (b, h, l), (b, h, NB, l): the two parts of dc
    dAng_ptr, dDT_ptr, dTrap_ptr, dADT_ptr,  # out (b, l, h, na), (b, h, l) ×3
    l, n_chunks, h: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, NA: tl.constexpr,  # chunk, angles (power of two ≥ na)
    NB: tl.constexpr,  # column blocks of dCq
    CB: tl.constexpr,  # chunks summed at once
):
    # (head, chunk) on grid axis 0, head fastest (axis 1 stops at 65 535 chunks)
    pid_h, pid_c = tl.program_id(0) % h, tl.program_id(0) // h
    pid_b = tl.program_id(1).to(tl.int64)
    row = pid_b * h + pid_h
    offs_t, offs_j = pid_c * Q + tl.arange(0, Q), tl.arange(0, NA)
    mask_t = offs_t < l
    mask = mask_t[:, None] & (offs_j[None, :] < na)
    # a 64-bit base at the chunk's first step, 32-bit offsets inside it: past 2³¹ elements
    tj0 = ((pid_b * l + pid_c * Q) * h + pid_h) * na  # at (pid_b, pid_c·Q, pid_h, 0)
    tj = tl.arange(0, Q)[:, None] * h * na + offs_j[None, :]  # (Q, NA) offsets from there
    # 1. the angles: the full reverse cumsum of dθ (this chunk's, the later chunks' totals, the
    # final angle's), through θ's rate Δ π tanh(a)
    later = tl.zeros([NA], dtype=tl.float32)
    if dth_F_ptr is not None:
        later = tl.load(dth_F_ptr + row * na + offs_j, mask=offs_j < na, other=0.0)
    for c0 in range(pid_c + 1, n_chunks, CB):
        cc = c0 + tl.arange(0, CB)
        later += tl.sum(tl.load(dth_tot_ptr + (row * n_chunks + cc)[:, None] * na + offs_j[None, :],
                                mask=(cc < n_chunks)[:, None] & (offs_j[None, :] < na),
                                other=0.0), axis=0)
    dcum = tl.cumsum(tl.load(dth_ptr + tj0 + tj, mask=mask, other=0.0), axis=0, reverse=True) \
        + later[None, :]
    th = tanh(tl.load(Ang_ptr + tj0 + tj, mask=mask, other=0.0).to(tl.float32))
    dt = tl.load(DT_ptr + row * l + offs_t, mask=mask_t, other=0.0).to(tl.float32)
    tl.store(dAng_ptr + tj0 + tj, (dcum * dt[:, None] * PI * (1.0 - th * th)).to(
        dAng_ptr.dtype.element_ty), mask=mask)
    dDT = tl.sum(dcum * PI * th, axis=1)  # (Q,)
    # 2. the trapezoid: ∂/∂((1 − λ_t)Δ_t) is w_{t−1}'s gradient (the owed half's at t = 0)
    lam = tl.sigmoid(tl.load(Trap_ptr + row * l + offs_t, mask=mask_t, other=0.0).to(tl.float32))
    d_gamma = tl.load(dG_ptr + row * l + offs_t, mask=mask_t, other=0.0) + tl.load(
        dW_ptr + row * l + offs_t, mask=mask_t, other=0.0)
    d_prev = tl.load(dW_ptr + row * l + offs_t - 1, mask=mask_t & (offs_t > 0), other=0.0)
    if d_owe_ptr is not None:
        d_prev += tl.where(offs_t == 0, tl.load(d_owe_ptr + row), 0.0)
    dDT += d_gamma * lam + d_prev * (1.0 - lam)
    tl.store(dDT_ptr + row * l + offs_t, dDT.to(dDT_ptr.dtype.element_ty), mask=mask_t)
    dTrap = (d_gamma - d_prev) * dt * lam * (1.0 - lam)
    tl.store(dTrap_ptr + row * l + offs_t, dTrap.to(dTrap_ptr.dtype.element_ty), mask=mask_t)
    # 3. the decays: dc summed, then its reverse cumsum inside the chunk
    dc = tl.load(dcv_ptr + row * l + offs_t, mask=mask_t, other=0.0)
    for nb in tl.static_range(NB):
        dc += tl.load(dcq_ptr + (row * NB + nb) * l + offs_t, mask=mask_t, other=0.0)
    tl.store(dADT_ptr + row * l + offs_t, tl.cumsum(dc, axis=0, reverse=True).to(
        dADT_ptr.dtype.element_ty), mask=mask_t)


def heads_per_program(r, programs, cfg):
    """How many heads of a Q/K group one dq/dk program walks: the largest divisor d of r = h/g
    (at most cfg's bound) that still leaves cfg's ``min_programs`` programs, ``programs`` being
    how many there are with d = 1; 1 if none does."""
    ok = [d for d in range(1, min(r, cfg.heads_per_program) + 1)
          if r % d == 0 and programs // d >= cfg.min_programs]
    return max(ok, default=1)


def _final_k_grads(x, d_k, theta_final):
    """The final k state k_F = R(θ_F)(K_{l−1} + K_bias) per head: (dk̃ (b, h, n), its dθ_F)."""
    na = theta_final.shape[-1]
    d_k = d_k.float()
    k_F = final_k(x["K"], x["K_bias"], theta_final)  # (b, h, n)
    even, odd = slice(0, 2 * na, 2), slice(1, 2 * na, 2)  # the turning pairs
    cross = d_k[..., odd] * k_F[..., even] - d_k[..., even] * k_F[..., odd]
    return rotate_pairs(d_k, -theta_final), cross  # (b, h, n), (b, h, na)


def _state_grads(x, dH_in, dth_in):
    """Input_States' gradients from dH_in, H_in = S_in + (1 − λ₀)Δ₀ v_in k_inᵀ; and d owe."""
    _, _, k, v = x["states"]
    owe = ((1 - torch.sigmoid(x["Trap"][..., 0].float())) * x["DT"][..., 0].float())[..., None]
    d_owe = torch.einsum("bhpn,bhp,bhn->bh", dH_in, v, k).contiguous()
    return (dth_in, dH_in, owe * torch.einsum("bhpn,bhp->bhn", dH_in, v),
            owe * torch.einsum("bhpn,bhn->bhp", dH_in, k)), d_owe


def launch_backward(x, saved, d_out, finals, chunk_size, cfg):
    """All five launches; returns a dict of gradients by argument name (and "states").
    ``chunk_size`` as the entry point checked it, ``cfg`` the `config.Config` it resolved."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    BN, NB, P, Qc = blocks(n, p, chunk_size, cfg.col_block)
    c = triton.cdiv(l, Qc)
    dev, f32, dot = V.device, torch.float32, dot_dtype(V)
    new = lambda *s: torch.empty(*s, device=dev, dtype=f32)
    d_out = (d_out if d_out is not None else torch.zeros_like(V)).contiguous()
    cont = lambda t: None if t is None else t.float().contiguous()
    theta_in = None if x["states"] is None else x["states"][0]
    # 1., 2. the state's gradient, chunk by chunk, then passed backwards
    st = saved["steps"]  # the per-step values of the forward (``chunk_state.chunk_states``)
    if cfg.state_grad_launches == 1:  # 1. and 2. in one reverse walk over the chunks
        D, dH_in, HD, dY, dZ = walk_state_grads(x, st, d_out, saved["y_pre"], saved["H"],
                                                saved["theta_final"], theta_in,
                                                cont(finals["ssm"]), Qc, cfg)
    else:
        dS, dY, dZ = state_grads(x, st, d_out, saved["y_pre"], Qc, cfg)
        D, dH_in, HD = pass_state_grads(dS, st["Turn"], st["Cend"], saved["H"],
                                        saved["theta_final"], theta_in, cont(finals["ssm"]),
                                        cfg)
    # 3. the values and the weights, a program per chunk
    dV, dW, dG, dCv, dD = torch.empty_like(V), new(b, h, l), new(b, h, l), new(b, h, l), \
        new(b, h, c)
    BNv, NBv, _, _ = blocks(n, p, chunk_size, cfg.bwd_v_col_block or cfg.col_block)
    bwd_v_kernel[(h * c, b)](
        x["Q"], x["K"], V, x["Q_bias"], x["K_bias"], x["D"], st["C2"], st["W"], st["G"],
        st["Phi"], dY, D, HD, dV, dW, dG, dCv, dD,
        l, c, h, g, p, n, na,
        Q=Qc, BN=BNv, NB=NBv, P=P, TILES=HD.shape[-1], HAS_D=x["D"] is not None, DOT=dot,
        UNROLL=cfg.bwd_v_unroll == 1, num_warps=warps(cfg.bwd_v_warps, Qc),
        **({} if cfg.bwd_v_maxnreg is None else dict(maxnreg=cfg.bwd_v_maxnreg)),
    )
    # 4. the queries and the keys: a column block and a head block per program; a block of all
    # the heads of a Q/K head writes dQ and dK themselves, smaller ones float32 partial sums
    hpp = heads_per_program(h // g, NB * h * c * b, cfg)
    part = lambda like: torch.empty(b, l, h // hpp, n, device=dev,
                                    dtype=like.dtype if hpp == h // g else f32)
    dQ, dK, dQb, dKb = part(x["Q"]), part(x["K"]), new(b, c, h, n), new(b, c, h, n)
    dCq, dth, dth_tot = new(b, h, NB, l), new(b, l, h, na), new(b, h, c, na)
    if c > GRID_Y:  # (a chunk offset argument for slabs of launches costs this kernel spills)
        raise ValueError(f"the Mamba-3 backward runs at most {GRID_Y} chunks (grid axis 1): "
                         f"l = {l} at chunk_size {Qc} is {c}; use a larger chunk_size")
    bwd_qk_kernel[(NB * (h // hpp), c, b)](
        x["Q"], x["K"], V, x["Q_bias"], x["K_bias"], st["C2"], st["W"], st["G"], st["Phi"],
        dY, saved["H"], D, dQ, dK, dQb, dKb, dCq, dth, dth_tot,
        l, c, hpp, h, g, p, n, na,
        Q=Qc, BN=BN, NB=NB, P=P, DOT=dot,
        num_warps=warps(cfg.bwd_qk_warps, Qc), num_stages=cfg.bwd_qk_stages,
        **({} if cfg.bwd_qk_maxnreg is None else dict(maxnreg=cfg.bwd_qk_maxnreg)),
    )
    # 5. what couples steps: the angles' cumsum over chunks, the trapezoid's two-step weights
    dth_F, dK_last = cont(finals["angle"]), None
    if finals["k"] is not None:  # the final k state is the last step's rotated k
        dK_last, cross = _final_k_grads(x, finals["k"], saved["theta_final"])
        dth_F = cross if dth_F is None else dth_F + cross
    states, d_owe = None, None
    if x["states"] is not None:
        states, d_owe = _state_grads(x, dH_in, dth_tot.sum(2) + (0 if dth_F is None else dth_F))
    dAng, dDT, dTrap, dADT = (torch.empty_like(x[k]) for k in ("Angles", "DT", "Trap", "ADT"))
    _steps_kernel[(h * c, b)](
        x["Angles"], x["DT"], x["Trap"], dth, dth_tot, dth_F, dW, dG, d_owe, dCv, dCq,
        dAng, dDT, dTrap, dADT,
        l, c, h, na,
        Q=Qc, NA=triton.next_power_of_2(max(na, 1)), NB=NB, CB=cfg.steps_chunks,
        num_warps=cfg.steps_warps,
    )
    return _collect(x, dQ, dK, dV, dADT, dDT, dTrap, dQb, dKb, dAng, dD, dZ, dK_last, finals,
                    states)


def _collect(x, dQ, dK, dV, dADT, dDT, dTrap, dQb, dKb, dAng, dD, dZ, dK_last, finals, states):
    """The head blocks' partial dQ, dK summed per Q/K head, the per-chunk sums reduced, the final
    states' gradients added; everything in its input's dtype."""
    b, l, h, p = x["V"].shape
    g = x["Q"].shape[2]
    per_group = lambda t: t.unflatten(2, (g, -1)).sum(3) if t.shape[2] > g else t  # → (b, l, g, n)
    dQ, dK, dKb = per_group(dQ), per_group(dK), dKb.sum((0, 1))
    if dK_last is not None:
        dK[:, -1] += dK_last.unflatten(1, (g, -1)).sum(2)
        dKb = dKb + dK_last.sum(0)
    if finals["v"] is not None:  # the final v state is V[:, -1]
        dV[:, -1] += finals["v"].to(dV.dtype)
    as_ = lambda t, like: None if like is None else t.to(like.dtype)
    return {
        "Q": as_(dQ, x["Q"]), "K": as_(dK, x["K"]), "V": as_(dV, x["V"]),
        "ADT": as_(dADT, x["ADT"]), "DT": as_(dDT, x["DT"]), "Trap": as_(dTrap, x["Trap"]),
        "Q_bias": as_(dQb.sum((0, 1)), x["Q_bias"]), "K_bias": as_(dKb, x["K_bias"]),
        "Angles": as_(dAng, x["Angles"]), "D": as_(dD.sum((0, 2)), x["D"]),
        "Z": None if dZ is None else as_(dZ, x["Z"]), "states": states,
    }

