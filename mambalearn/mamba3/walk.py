"""The Mamba-3 SISO forward in ONE launch: a program per channel block walks the chunks.

``Config.forward_launches`` = 1. The grid is (⌈p / P_BLK⌉, h, b): a program owns P_BLK channels
(rows of the p × n state) of one (batch, head), keeps that (P_BLK × n) state in float32, in the
frame of the chunk it enters (H^L_c, ``common``), and walks the chunks in order. The n columns are
taken ``walk1_col_block`` at a time in a loop (the whole (q × n) rotated tiles at once spill on
sm_90), so the state lives in a scratch of the program's own, two float32 slots in global memory
(8 KB a slot at P_BLK 16, n 128: L1/L2-resident): chunk c reads slot c mod 2 and writes the other,
and one barrier a chunk makes the writes of every thread visible to the next chunk's reads (a
register tensor cannot be sliced by a loop index).
Per chunk c, with the local angles φ and the step values formed on the spot:

    q, k = R(φ)(C + C_bias), R(φ)(B + B_bias)                                    (Q × n)
    y    = e^{c} (q H^Lᵀ) + (q kᵀ ∘ M ∘ w) v + (D + γ q·k) v,   out = y · silu(z)
    H^L  ← (e^{c_end} H^L + (e^{c_end − c} w v)ᵀ k) R(Φ_c)

— the three launches of ``chunk`` (chunk states, state passing, outputs) in one, with neither the
chunk states S^L nor the entering states H^L written to DRAM and read back. The price:
every channel block of a (batch, head) forms the same q, k, the decay mask and q kᵀ again (the
rotation, a sigmoid pair and a cumsum per step, an (Q × Q) product), so the channel split trades
parallelism for repeated work (bench/NOTES_mamba3.md has the floors of each block size).

When autograd will need the backward (``save``), the walk also writes what the backward reads, in
the layouts the three launches give them (``api._SAVED``): H^L_c (b, h, c, p, n) in the inputs'
dtype, each program its rows; the per-step values C2, W, G, Phi, Turn, Cend
(``chunk_state.chunk_states``) by the first channel block; y before the gate. φ is rounded to
Phi's dtype (float16 for bf16 inputs) before its cos and sin are taken, saved or not, as the
three launches do, so the backward turns q and k exactly as the forward did.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import (
    LOG2E,
    SIZES,
    causal_decay,
    chunk_scalars,
    cos_sin,
    dot_dtype,
    exp2,
    load_qk,
    local_angles,
    mod_two_pi,
    new_steps,
    turn,
    warps,
)
from mambalearn.mamba3.reference import final_k


@triton.jit(do_not_specialize=SIZES)
def _walk_kernel(
    C_ptr, B_ptr, X_ptr, Cb_ptr, Bb_ptr, D_ptr, Z_ptr,  # Q, K, V, Q_bias, K_bias, D, Z
    ADT_ptr, DT_ptr, Trap_ptr, Ang_ptr,  # (b, h, l) ×3 and (b, l, h, na)
    theta_in_ptr, X0_ptr,  # (b, h, na) and (b, h, p, n) absolute frame, or None
    Out_ptr,  # out (b, l, h, p)
    XF_ptr, theta_final_ptr,  # out: the final state (b, h, p, n) float32, angle (b, h, na)
    Hw_ptr, Tw_ptr,  # scratch: the state (2, b, h, p, n) and angle (2, b, h, ⌈p/PB⌉, N/2), fp32
    # out when saving for the backward (else None): y before the gate (b, l, h, p), H^L_c
    # (b, h, c, p, n), and the per-step values as ``chunk_state`` stores them
    Ypre_ptr, H_ptr, c2_ptr, W_ptr, G_ptr, Phi_ptr, Turn_ptr, cend_ptr,
    l, n_chunks,  # run-time sizes, then the model's, compiled in (strides follow from them)
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, PB: tl.constexpr,  # chunk; channel block
    BN: tl.constexpr, NB: tl.constexpr,  # column block, blocks over n
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, SAVE: tl.constexpr, DOT: tl.constexpr,
    PHI: tl.constexpr,  # the dtype φ is stored in (``common.new_steps``), with or without SAVE
    RELOAD: tl.constexpr,  # the step values formed twice a chunk (fewer registers live)
):
    pid_r, pid_h = tl.program_id(0), tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    row = pid_b * h + pid_h  # the (batch, head) row of the (b, h, ·) tensors
    first = pid_r == 0  # the first channel block stores the per-step values
    offs_r = pid_r * PB + tl.arange(0, PB)  # this program's channels
    loc_t, loc_n, loc_j = tl.arange(0, Q), tl.arange(0, BN), tl.arange(0, BN // 2)
    mask_r = offs_r < p
    step = p * n
    # this program's part of the scratch: slot ci % 2 holds the state entering chunk ci
    slot = tl.num_programs(2).to(tl.int64) * h * step  # from one slot to the other
    hw = Hw_ptr + row * step
    n_pb = tl.num_programs(0)
    slot_t = tl.num_programs(2).to(tl.int64) * h * n_pb * (NB * BN // 2)
    tw = Tw_ptr + (row * n_pb + pid_r) * (NB * BN // 2)

    # the initial state in the first chunk's frame, H^L_0 = H_in R(θ_in), and θ_in, into slot 0
    for nb in tl.range(0, NB, num_stages=1):
        offs_n, offs_j = nb * BN + loc_n, nb * (BN // 2) + loc_j
        mask = mask_r[:, None] & (offs_n[None, :] < n)
        tile = offs_r[:, None] * n + offs_n[None, :]
        theta = tl.zeros([BN // 2], dtype=tl.float32)
        if theta_in_ptr is not None:
            theta = tl.load(theta_in_ptr + row * na + offs_j, mask=offs_j < na, other=0.0)
        Hs = tl.zeros([PB, BN], dtype=tl.float32)
        if X0_ptr is not None:
            Hs = tl.load(X0_ptr + row * step + tile, mask=mask, other=0.0).to(tl.float32)
            c, s_ = cos_sin(-theta)
            Hs = turn(Hs, c[None, :], s_[None, :], PB, BN)
        tl.store(hw + tile, Hs, mask=mask)
        tl.store(tw + offs_j, theta)
    tl.debug_barrier()  # (the stores above are read by other threads of the program)

    d = 0.0
    if HAS_D:
        d = tl.load(D_ptr + pid_h).to(tl.float32)
    # no software pipeline over chunks: a load of the scratch must not move above the barrier
    for ci in tl.range(0, n_chunks, num_stages=1):
        offs_t = ci * Q + loc_t
        mask_t = offs_t < l
        l_left = l - ci * Q  # steps left in l from the chunk's first
        # 64-bit bases at the chunk's first step, 32-bit offsets inside it: past 2³¹ elements
        bt = pid_b * l + ci * Q  # the chunk's first (batch, step) row
        tp0 = (bt * h + pid_h) * p  # element (pid_b, ci·Q, pid_h, 0) of X, Z and the outputs
        tp = loc_t[:, None] * h * p + offs_r[None, :]  # (Q, PB) offsets from there
        mask_tp = mask_t[:, None] & mask_r[None, :]
        bc_off = (bt * g + pid_h // (h // g)) * n  # (pid_b, ci·Q, gi, 0) of C and B (GQA)
        now, nxt = (ci % 2) * slot, ((ci + 1) % 2) * slot  # the scratch slots read, written
        now_t, nxt_t = (ci % 2) * slot_t, ((ci + 1) % 2) * slot_t

        # 1. the step values (as ``chunk_state`` forms them) and the weighted inputs
        dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                               Trap_ptr + row * l, offs_t, l)
        c2 = tl.cumsum(adt, axis=0) * LOG2E  # (Q,): c_t log₂e
        c2_end = tl.sum(tl.where(loc_t == Q - 1, c2, 0.0), axis=0)  # as ``chunk_state``
        if SAVE:
            tl.store(c2_ptr + row * l + offs_t, c2, mask=mask_t & first)
            tl.store(W_ptr + row * l + offs_t, w, mask=mask_t & first)
            tl.store(G_ptr + row * l + offs_t, gamma, mask=mask_t & first)
            tl.store(cend_ptr + row * n_chunks + ci, c2_end / LOG2E, mask=first)
        v = tl.load(X_ptr + tp0 + tp, mask=mask_tp, other=0.0)  # (Q, PB)
        vr = (v.to(tl.float32) * (exp2(c2_end - c2) * w)[:, None]).to(DOT)  # e^{c_end − c} w v
        a = exp2(c2_end)
        if RELOAD:  # c, w, γ formed again after the column loop instead of held through it
            c2, w, gamma = 0.0, 0.0, 0.0

        # 2. per column block: the local angles, q and k turned; q·k, q kᵀ, q H^Lᵀ summed; the
        # block's state decayed, its inputs added, turned into the next chunk's frame
        qk = tl.zeros([Q], dtype=tl.float32)
        s = tl.zeros([Q, Q], dtype=tl.float32)
        y = tl.zeros([Q, PB], dtype=tl.float32)
        for nb in tl.range(0, NB, num_stages=1):
            offs_n, offs_j = nb * BN + loc_n, nb * (BN // 2) + loc_j
            mask = mask_r[:, None] & (offs_n[None, :] < n)
            tile = offs_r[:, None] * n + offs_n[None, :]
            if nb * (BN // 2) < na:  # a block with turning pairs
                phi, turned = local_angles(Ang_ptr + (bt * h + pid_h) * na, h * na, loc_t,
                                           offs_j, l_left, na, dt)
                phi = phi.to(PHI)  # rounded as the three launches store it: the backward's φ
                if SAVE:
                    mask_j = offs_j < na
                    tl.store(Phi_ptr + row * l * na + offs_t[:, None] * na + offs_j[None, :],
                             phi, mask=mask_t[:, None] & mask_j[None, :] & first)
                    tl.store(Turn_ptr + (row * n_chunks + ci) * na + offs_j, turned,
                             mask=mask_j & first)
                cos, sin = cos_sin(phi.to(tl.float32))
            else:  # no pair of this block turns
                turned = tl.zeros([BN // 2], dtype=tl.float32)
                cos = tl.full([Q, BN // 2], 1.0, tl.float32)
                sin = tl.zeros([Q, BN // 2], dtype=tl.float32)
            q, k = load_qk(C_ptr + bc_off, B_ptr + bc_off, Cb_ptr + pid_h * n,
                           Bb_ptr + pid_h * n, g * n, loc_t, offs_n, l_left, n, cos, sin, Q,
                           BN)  # (Q, BN) each
            qk += tl.sum(q * k, axis=1)  # q_t·k_t in float32 (the same rotated or not)
            q, k = q.to(DOT), k.to(DOT)
            s = tl.dot(q, tl.trans(k), acc=s)  # (Q, Q)
            Hs = tl.load(hw + now + tile, mask=mask, other=0.0)  # (PB, BN): H^L_c's block
            if SAVE:
                tl.store(H_ptr + (row * n_chunks + ci) * step + tile,
                         Hs.to(H_ptr.dtype.element_ty), mask=mask)
            # the entering state in the inputs' dtype, as the three launches store and read it
            y = tl.dot(q, tl.trans(Hs.to(DOT)), acc=y)  # (Q, PB)
            # S^Lᵀ = kᵀ (w v), with the turned k as the A operand (a tf32 wgmma cannot take it
            # as B: ``chunk_state``)
            S = tl.trans(tl.dot(tl.trans(k), vr))  # (PB, BN)
            c, s_ = cos_sin(-turned)
            Hs = turn(a * Hs + S, c[None, :], s_[None, :], PB, BN)  # (a H + S) R(Φ_c)
            tl.store(hw + nxt + tile, Hs, mask=mask)
            theta = tl.load(tw + now_t + offs_j)
            tl.store(tw + nxt_t + offs_j, mod_two_pi(theta + turned))
        tl.debug_barrier()  # the next chunk reads what other threads stored

        if RELOAD:
            dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                                   Trap_ptr + row * l, offs_t, l)
            c2 = tl.cumsum(adt, axis=0) * LOG2E
        # 3. the entering state decayed to each step; the chunk's inputs, strictly causal with
        # weight w_s (a where, not a product with the mask's zeros: NaN semantics, ``api``);
        # the diagonal γ q·k and D; the gate
        y = y * exp2(c2)[:, None]
        s = tl.where(loc_t[:, None] > loc_t[None, :], s * causal_decay(c2, Q) * w[None, :], 0.0)
        y = tl.dot(s.to(DOT), v.to(DOT), acc=y)
        y += (gamma * qk + d)[:, None] * v.to(tl.float32)
        if SAVE and HAS_Z:
            tl.store(Ypre_ptr + tp0 + tp, y, mask=mask_tp)
        if HAS_Z:
            z = tl.load(Z_ptr + tp0 + tp, mask=mask_tp, other=0.0).to(tl.float32)
            y = y * z * tl.sigmoid(z)  # silu(z)
        tl.store(Out_ptr + tp0 + tp, y.to(Out_ptr.dtype.element_ty), mask=mask_tp)

    # the final state, absolute frame: H^L_C R(θ_final)ᵀ; and θ_final
    last = (n_chunks % 2) * slot
    last_t = (n_chunks % 2) * slot_t
    for nb in tl.range(0, NB, num_stages=1):
        offs_n, offs_j = nb * BN + loc_n, nb * (BN // 2) + loc_j
        mask = mask_r[:, None] & (offs_n[None, :] < n)
        tile = offs_r[:, None] * n + offs_n[None, :]
        theta = tl.load(tw + last_t + offs_j)
        Hs = tl.load(hw + last + tile, mask=mask, other=0.0)
        c, s_ = cos_sin(theta)
        tl.store(XF_ptr + row * step + tile, turn(Hs, c[None, :], s_[None, :], PB, BN),
                 mask=mask)
        tl.store(theta_final_ptr + row * na + offs_j, theta, mask=(offs_j < na) & first)


def walk_forward(x, chunk_size, save, return_final, cfg, H_in, theta_in):
    """The forward in one launch (``_walk_kernel``) on the prepared inputs ``x`` (``api``);
    ``H_in`` (b, h, p, n) and ``theta_in`` (b, h, na) the initial state (``chunk._initial_state``)
    or None. Returns the dict ``chunk.launch_forward`` returns: out, with ``save`` what the
    backward reads (H, steps, theta_final, y_pre), with ``return_final`` the final states."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    Qc = int(chunk_size)
    c = triton.cdiv(l, Qc)
    N = max(16, triton.next_power_of_2(n))
    BN = min(N, cfg.walk1_col_block)
    PB = min(cfg.walk1_p_block, max(16, triton.next_power_of_2(p)))
    n_pb = triton.cdiv(p, PB)
    scratch = dict(device=V.device, dtype=torch.float32)
    Hw = torch.empty(2, b, h, p, n, **scratch)  # the state between chunks (``_walk_kernel``)
    Tw = torch.empty(2, b, h, n_pb, N // 2, **scratch)
    out = torch.empty_like(V)
    final = torch.empty(b, h, p, n, device=V.device, dtype=torch.float32)
    theta_final = torch.empty(b, h, na, device=V.device, dtype=torch.float32)
    steps, H, y_pre = None, None, None
    if save:
        steps = new_steps(V, b, h, l, c, na)
        H = torch.empty(b, h, c, p, n, device=V.device, dtype=V.dtype)
        y_pre = torch.empty_like(V) if x["Z"] is not None else None
    st = steps or {}
    _walk_kernel[(n_pb, h, b)](
        x["Q"], x["K"], V, x["Q_bias"], x["K_bias"], x["D"], x["Z"],
        x["ADT"], x["DT"], x["Trap"], x["Angles"],
        theta_in, H_in, out, final, theta_final, Hw, Tw,
        y_pre, H, *(st.get(k) for k in ("C2", "W", "G", "Phi", "Turn", "Cend")),
        l, c, h, g, p, n, na,
        Q=Qc, PB=PB, BN=BN, NB=N // BN, HAS_D=x["D"] is not None, HAS_Z=x["Z"] is not None,
        SAVE=bool(save), DOT=dot_dtype(V), RELOAD=cfg.walk1_reload == 1,
        PHI=tl.float16 if V.dtype == torch.bfloat16 else tl.float32,
        num_warps=warps(cfg.walk1_warps, Qc),
        **({} if cfg.walk1_maxnreg is None else dict(maxnreg=cfg.walk1_maxnreg)),
    )
    r = dict(out=out, H=H, steps=steps, theta_final=theta_final, y_pre=y_pre)
    if return_final:  # the last step's k, turned by the final angle: the next call's k_prev
        r.update(angle=theta_final, ssm=final, k=final_k(x["K"], x["K_bias"], theta_final))
    return r
