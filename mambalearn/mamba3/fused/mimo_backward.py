"""The Mamba-3 MIMO prefill backward in Triton: one program per (head, batch), chunks in reverse.

Each chunk is recomputed from the state the forward stored at its start (chapter 07), with the
gradient dH of the state leaving it carried from the chunk after. Over the q·r rows, with
A = S ∘ L the forward's masked scores (``mimo_forward``) and dy the output's gradient per row:

    G = dy Vᵀ                      dS = G ∘ L,  dL = G ∘ S          (q·r × q·r)
    dV = Aᵀ dy + D dy + u ∘ (K dHᵀ)                                  dv per row, then Σ_ρ Ψ_ρ
    dQ = dS K + e^{c} ∘ (dy H)          dK = dSᵀ Q + u ∘ (V dH)      rotated; turned back by −θ
    dH_in = e^{c_end} dH + (e^{c} ∘ dy)ᵀ Q                           the gradient carried back

and the per-step scalars from dL: dw_s (below the step diagonal, and the state's u_s), dγ_t (on
it), and dc_t (every e^{c_t − c_s}, e^{c_t}, u_s), summed into dADT within the chunk. The angle
gradient of a step is Σ_ρ of the pairs' dq × q + dk × k (``common.pair_cross``). dQ and dK are
summed over the heads of a group with atomic adds; the per-head weights' gradients (biases, Ψ,
ζ, Φ, D) are summed per program, then over the batch by the caller.

Deterministic mode: atomic adds arrive in any order, and float addition is not associative, so
dQ, dK can change in the last bits from run to run. Two fixed orders (``config.det_sum``):

- "heads" (DET 2, the default): each head stores its dq, dk rows in its own copy of dQ, dK
  ((2, h/g, b, l, r, g, n) fp32) — plain stores, nothing waits inside the chunk loop — and
  ``sum_heads_kernel`` adds the h/g copies in head order afterwards. Cost at b8 l2048 h32 g1 r4
  n128: 2 × 32 × 8.4 M floats = 2.1 GB written by the backward (the bytes the atomics sent to
  L2) and read once by the sum, ≈ 2 × 0.45 ms at 4.8 TB/s against a backward of tens of ms.
- "tree" (DET 1): each head stores its chunk's rows ((q·r, n) each) in a slot, and the last head
  of the group to finish the chunk adds the slots in head order (``triton.deterministic.
  tree_sum``, fan-in ``tree_fan``): no second launch, but the adds happen inside the serial walk
  over the chunks, on the critical path of the program that arrives last.

Every other output is per program (no atomics) in all modes; an element of dQ, dK sums only its
own sequence's heads, so a sequence's gradients do not depend on its position in the batch.
"""

import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import exp2, pair_cross, turn
from mambalearn.mamba3.fused.mimo_forward import (
    SIZES,
    load_rows,
    row_angles,
    row_scalars,
    rows,
    step_mask,
)
from mambalearn.triton.deterministic import slot_of, tree_sum


@triton.jit
def per_step(x, Q: tl.constexpr, R: tl.constexpr):
    """Σ over the r rows of each step: (q·r,) → (q,)."""
    return tl.sum(tl.reshape(x, [Q, R]), axis=1)


@triton.jit
def per_rank(x, Q: tl.constexpr, R: tl.constexpr, M: tl.constexpr):
    """Σ over the steps of each rank: (q·r, M) → (r, M)."""
    return tl.sum(tl.reshape(x, [Q, R, M]), axis=0)


@triton.jit(do_not_specialize=[*SIZES, "groups", "batch"])
def mimo_backward_kernel(
    C_ptr, B_ptr, X_ptr, Z_ptr, Cb_ptr, Bb_ptr, Psi_ptr, Zeta_ptr, Phi_ptr, D_ptr,
    ADT_ptr, W_ptr, G_ptr, Th_ptr,  # as the forward's
    Hs_ptr,  # (b, h, c, p, n): the state entering each chunk (the forward's)
    dOut_ptr,  # (b, l, h, p), or (b, l, r, h, p) without Phi
    dHf_ptr, dBf_ptr,  # (b, h, p, n), (b, r, h, n) float32 or None: the final states' grads
    dC_ptr, dB_ptr,  # out (b, l, r, g, n) float32, zeroed: atomic sums over a group's heads
    slots_ptr, counts_ptr,  # DET 1: the tree sum's slots (h/g, b·g·c, 2·q·r·n) and counters;
    # DET 2: the heads' copies (2, h/g, b, l, r, g, n) of dQ, dK (counts unused)
    dX_ptr, dZ_ptr,  # out (b, l, h, p) float32
    dTh_ptr,  # out (NP, b, l, h, na) float32: dθ, a part per channel block (summed by the caller)
    dADT_ptr, dW_ptr, dG_ptr,  # out (NP, b, h, l) float32, the same
    dH0_ptr,  # out (b, h, p, n) float32: the gradient of the pre-state entering step 0
    dCb_ptr, dBb_ptr,  # out (NP, b, h, r, n) float32, this program's
    dPsi_ptr, dZeta_ptr, dPhi_ptr,  # out (b, h, r, p) float32, this program's channels
    dD_ptr,  # out (NP, b, h) float32
    l, n_chunks, groups,  # length, chunks; DET 1: b·g·c (the tree sums' groups), 2: b·l·r·g·n
    batch,  # b: the stride of the channel blocks' parts
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, R: tl.constexpr, P: tl.constexpr, N: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_OUT: tl.constexpr, DOT: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 operands: Triton 3.6 cannot build them in tf32
    DET: tl.constexpr,  # dQ, dK over a group's heads: 0 atomics, 1 (True) a tree, 2 by heads
    FAN: tl.constexpr, TREE_BLOCK: tl.constexpr,  # the tree
    QK_DOT: tl.constexpr,  # q, k held in DOT for the products, loaded again for dθ (qk_live)
    SPLIT: tl.constexpr,  # more than one channel block (program axis 2 > 1)
):
    pid_h, pid_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    pid_p = 0  # the channel block: a constant 0 unless the channels are split
    tile = pid_h % (h // g)  # the copy (DET 2) or tree tile (DET 1) of this program
    tiles = h // g
    if SPLIT:
        pid_p = tl.program_id(2)
        blk = pid_p.to(tl.int64) * batch * h  # this channel block's part of the per-step outputs
        dTh_ptr += blk * l * na
        dADT_ptr += blk * l
        dW_ptr += blk * l
        dG_ptr += blk * l
        dCb_ptr += blk * R * n
        dBb_ptr += blk * R * n
        dD_ptr += blk
        tile = tile * tl.num_programs(2) + pid_p  # (head of the group, channel block)
        tiles = tiles * tl.num_programs(2)
    QR: tl.constexpr = Q * R
    SLOT: tl.constexpr = 2 * QR * n  # DET: a head's dq, dk rows of a chunk
    head = pid_b * h + pid_h
    offs_p, offs_n, offs_r = pid_p * P + tl.arange(0, P), tl.arange(0, N), tl.arange(0, R)
    mask_pn = (offs_p[:, None] < p) & (offs_n[None, :] < n)
    pn = offs_p[:, None] * n + offs_n[None, :]
    dH = tl.zeros([P, N], dtype=tl.float32)  # ∂ℒ/∂(the state leaving the chunk)
    if dHf_ptr is not None:
        dH = tl.load(dHf_ptr + head * p * n + pn, mask=mask_pn, other=0.0)
    D = 0.0
    if HAS_D:
        D = tl.load(D_ptr + pid_h)
    acc_qb = tl.zeros([R, N], dtype=tl.float32)  # Σ_{t} over this program's (b, h)
    acc_kb = tl.zeros([R, N], dtype=tl.float32)
    acc_psi = tl.zeros([R, P], dtype=tl.float32)
    acc_zeta = tl.zeros([R, P], dtype=tl.float32)
    acc_phi = tl.zeros([R, P], dtype=tl.float32)
    acc_d = tl.zeros([QR], dtype=tl.float32)  # Σ over p per row: no (q·r × P) tile carried
    for cc in range(n_chunks):
        c = n_chunks - 1 - cc
        # recompute the chunk (the forward's steps)
        t, rho, valid = rows(c, l, Q, R)
        c2, w, gamma, c2_end = row_scalars(ADT_ptr + head * l, W_ptr + head * l,
                                           G_ptr + head * l, t, rho, valid)
        cos, sin = row_angles(Th_ptr + (pid_b * l * h + pid_h) * na, h * na, t, valid, na, N)
        bc_row = (((pid_b * l + t) * R + rho) * g + pid_h // (h // g)) * n
        _, q = load_rows(C_ptr, Cb_ptr + pid_h * R * n, bc_row, rho, valid, n, cos, sin, QR, N)
        _, k = load_rows(B_ptr, Bb_ptr + pid_h * R * n, bc_row, rho, valid, n, cos, sin, QR, N)
        if QK_DOT:  # the products' operands; float32 q, k come again for dθ at the end
            q, k = q.to(DOT), k.to(DOT)
        mask_rp = valid[:, None] & (offs_p[None, :] < p)
        rp = (pid_h * R + rho)[:, None] * p + offs_p[None, :]  # (q·r, P) into (h, r, p)
        vt = ((pid_b * l + t) * h + pid_h)[:, None] * p + offs_p[None, :]
        x = tl.load(X_ptr + vt, mask=mask_rp, other=0.0).to(tl.float32)
        psi = tl.load(Psi_ptr + rp, mask=mask_rp, other=0.0)
        v = x * psi
        H = tl.load(Hs_ptr + (head * n_chunks + c) * p * n + pn, mask=mask_pn,
                    other=0.0).to(tl.float32)
        L = step_mask(c2, w, gamma, Q, R)
        s = tl.dot(q.to(DOT), tl.trans(k.to(DOT)), input_precision=PRECISION)  # (q·r, q·r)
        a = s * L
        y_off = tl.dot(q.to(DOT), tl.trans(H.to(DOT)),
                       input_precision=PRECISION) * exp2(c2)[:, None]  # (q·r, P)
        y = tl.dot(a.to(DOT), v.to(DOT), acc=y_off, input_precision=PRECISION) + D * v
        # the gate and the contraction, backwards: dy per row
        if HAS_OUT:  # every row reads its step's output gradient
            do = tl.load(dOut_ptr + vt, mask=mask_rp, other=0.0).to(tl.float32)
            phi = tl.load(Phi_ptr + rp, mask=mask_rp, other=0.0)
        else:
            do = tl.load(dOut_ptr + (((pid_b * l + t) * R + rho) * h + pid_h)[:, None] * p
                         + offs_p[None, :], mask=mask_rp, other=0.0).to(tl.float32)
            phi = tl.full([QR, P], 1.0, tl.float32)
        dy = do * phi
        if HAS_Z:
            z = tl.load(Z_ptr + vt, mask=mask_rp, other=0.0).to(tl.float32)
            zeta = tl.load(Zeta_ptr + rp, mask=mask_rp, other=0.0)
            zz = z * zeta
            sg = tl.sigmoid(zz)
            dzz = dy * y * sg * (1.0 + zz * (1.0 - sg))  # d silu(zz) / d zz = σ(1 + zz(1 − σ))
            dy = dy * zz * sg
            acc_zeta += per_rank(dzz * z, Q, R, P)
            tl.store(dZ_ptr + ((pid_b * l + c * Q + tl.arange(0, Q)) * h + pid_h)[:, None] * p
                     + offs_p[None, :], tl.sum(tl.reshape(dzz * zeta, [Q, R, P]), axis=1),
                     mask=((c * Q + tl.arange(0, Q)) < l)[:, None] & (offs_p[None, :] < p))
            gate = zz * sg
        else:
            gate = tl.full([QR, P], 1.0, tl.float32)
        if HAS_OUT:
            acc_phi += per_rank(do * y * gate, Q, R, P)
        acc_d += tl.sum(dy * v, axis=1)
        # the core: dv, dq, dk, the carried dH, and the per-step scalars
        G = tl.dot(dy.to(DOT), tl.trans(v.to(DOT)),
                   input_precision=PRECISION)  # (q·r, q·r): dy_i · v_j
        dL = G * s
        kdH = tl.dot(k.to(DOT), tl.trans(dH.to(DOT)),
                     input_precision=PRECISION)  # (q·r, P): dH k_j
        u = exp2(c2_end - c2) * w
        dv = tl.dot(tl.trans(a.to(DOT)), dy.to(DOT), acc=D * dy + u[:, None] * kdH,
                    input_precision=PRECISION)
        dS = (G * L).to(DOT)
        dq = tl.dot(dy.to(DOT), H.to(DOT), input_precision=PRECISION) * exp2(c2)[:, None]
        dq = tl.dot(dS, k.to(DOT), acc=dq, input_precision=PRECISION)
        dk = tl.dot((v * u[:, None]).to(DOT), dH.to(DOT), input_precision=PRECISION)
        dk = tl.dot(tl.trans(dS), q.to(DOT), acc=dk, input_precision=PRECISION)
        vkdH = tl.sum(v * kdH, axis=1)  # (q·r,): ⟨dH, v_j k_jᵀ⟩
        step = tl.arange(0, QR) // R
        below = step[:, None] > step[None, :]
        E = tl.where(below, dL * exp2(tl.minimum(c2[:, None] - c2[None, :], 0.0)), 0.0)
        O = E * w[None, :]  # ∂ℒ/∂c_t (rows, +) and ∂ℒ/∂c_s (columns, −) of e^{c_t − c_s}
        dw = tl.sum(E, axis=0) + exp2(c2_end - c2) * vkdH
        dgam = tl.sum(tl.where(step[:, None] == step[None, :], dL, 0.0), axis=1)
        dc = tl.sum(O, axis=1) - tl.sum(O, axis=0) + tl.sum(dy * y_off, axis=1) - u * vkdH
        dc_end = tl.sum(H * dH) * exp2(c2_end) + tl.sum(u * vkdH, axis=0)
        dc, dw, dgam = per_step(dc, Q, R), per_step(dw, Q, R), per_step(dgam, Q, R)
        ts = c * Q + tl.arange(0, Q)
        mask_t = ts < l
        dadt = tl.cumsum(dc, axis=0, reverse=True) + dc_end  # c_t sums ADT_s for s ≤ t
        tl.store(dADT_ptr + head * l + ts, dadt, mask=mask_t)
        tl.store(dW_ptr + head * l + ts, dw, mask=mask_t)
        tl.store(dG_ptr + head * l + ts, dgam, mask=mask_t)
        dH = dH * exp2(c2_end) + tl.dot(tl.trans((dy * exp2(c2)[:, None]).to(DOT)), q.to(DOT),
                                        input_precision=PRECISION)
        # the final k state is the last step's rotated k: its gradient joins dk there
        if dBf_ptr is not None:
            dk += tl.load(dBf_ptr + ((pid_b * R + rho) * h + pid_h)[:, None] * n + offs_n[None, :],
                          mask=(t == l - 1)[:, None] & (offs_n[None, :] < n)
                          & (pid_p + t * 0 == 0)[:, None],
                          other=0.0)
        # rotations, backwards: dθ per step (Σ over ranks), dC, dB turned back by −θ
        if QK_DOT:  # the angles and the rotated q, k in float32 again: the same loads and
            # turns, the same bits, none of them held through the products above
            cos, sin = row_angles(Th_ptr + (pid_b * l * h + pid_h) * na, h * na, t, valid, na, N)
            _, q = load_rows(C_ptr, Cb_ptr + pid_h * R * n, bc_row, rho, valid, n, cos, sin, QR,
                             N)
            _, k = load_rows(B_ptr, Bb_ptr + pid_h * R * n, bc_row, rho, valid, n, cos, sin, QR,
                             N)
        dth = tl.sum(tl.reshape(pair_cross(dq, q, QR, N) + pair_cross(dk, k, QR, N),
                                [Q, R, N // 2]), axis=1)  # (q, N/2)
        offs_j = tl.arange(0, N // 2)
        tl.store(dTh_ptr + ((pid_b * l + ts) * h + pid_h)[:, None] * na + offs_j[None, :], dth,
                 mask=mask_t[:, None] & (offs_j[None, :] < na))
        dq, dk = turn(dq, cos, -sin, QR, N), turn(dk, cos, -sin, QR, N)
        mask_rn = valid[:, None] & (offs_n[None, :] < n)
        if DET == 2:  # this head's own copy of dQ, dK; ``sum_heads_kernel`` adds them after
            part = slots_ptr + (tile + 0 * pid_b) * groups  # (int64, as pid_b)
            tl.store(part + bc_row[:, None] + offs_n[None, :], dq, mask=mask_rn)
            tl.store(part + (tiles + 0 * pid_b) * groups + bc_row[:, None] + offs_n[None, :],
                     dk, mask=mask_rn)
        elif DET:  # this head's slot, then the group's heads added in head order
            grp = (pid_b * g + pid_h // (h // g)) * n_chunks + c
            slot = slot_of(slots_ptr, tile, grp, groups, SLOT)
            rn = tl.arange(0, QR)[:, None] * n + offs_n[None, :]  # (q·r, N) in a (q·r, n) block
            tl.store(slot + rn, dq, mask=offs_n[None, :] < n)
            tl.store(slot + QR * n + rn, dk, mask=offs_n[None, :] < n)
            tree_sum(slots_ptr, counts_ptr, tile, tiles, grp, groups, SLOT, FAN, TREE_BLOCK)
        else:
            tl.atomic_add(dC_ptr + bc_row[:, None] + offs_n[None, :], dq, mask=mask_rn)
            tl.atomic_add(dB_ptr + bc_row[:, None] + offs_n[None, :], dk, mask=mask_rn)
        acc_qb += per_rank(dq, Q, R, N)
        acc_kb += per_rank(dk, Q, R, N)
        acc_psi += per_rank(dv * x, Q, R, P)
        tl.store(dX_ptr + ((pid_b * l + ts) * h + pid_h)[:, None] * p + offs_p[None, :],
                 tl.sum(tl.reshape(dv * psi, [Q, R, P]), axis=1),
                 mask=mask_t[:, None] & (offs_p[None, :] < p))
    tl.store(dH0_ptr + head * p * n + pn, dH, mask=mask_pn)
    rn = (head * R + offs_r)[:, None] * n + offs_n[None, :]
    mask_n = (offs_r[:, None] < R) & (offs_n[None, :] < n)
    tl.store(dCb_ptr + rn, acc_qb, mask=mask_n)
    tl.store(dBb_ptr + rn, acc_kb, mask=mask_n)
    rpp = (head * R + offs_r)[:, None] * p + offs_p[None, :]
    mask_p = (offs_r[:, None] < R) & (offs_p[None, :] < p)
    tl.store(dPsi_ptr + rpp, acc_psi, mask=mask_p)
    tl.store(dZeta_ptr + rpp, acc_zeta, mask=mask_p)
    tl.store(dPhi_ptr + rpp, acc_phi, mask=mask_p)
    tl.store(dD_ptr + head, tl.sum(acc_d, axis=0))


@triton.jit
def sum_heads_kernel(parts_ptr, out_ptr, size, heads, BLOCK: tl.constexpr):
    """out[i] = Σ_j parts[j, i] over the ``heads`` copies (heads, size), j = 0, 1, … in order:
    the deterministic mode's dQ (program axis 1 = 0) and dK (1) from the heads' copies
    (``DET == 2``). Every element is added in the same order, whoever wrote which copy when, and
    depends only on its own column: the same bits on every run and at every batch position."""
    pid, which = tl.program_id(0), tl.program_id(1)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < size
    src = parts_ptr + which.to(tl.int64) * heads * size + offs
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for _ in range(heads):  # (the pointer steps on: no int32 product j · size to overflow)
        acc += tl.load(src, mask=mask, other=0.0)
        src += size
    tl.store(out_ptr + which.to(tl.int64) * size + offs, acc, mask=mask)
