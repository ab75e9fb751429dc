"""Steps 4–6 of the SSD backward (chapter 10): dCB, dC and dB, the gradients of C Bᵀ, C and B.
B and C are shared by a group's heads, so one program loops over those heads and owns its output
tile (no atomics). The derivation is the docstring of ``mambalearn.mamba2.backward``.
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba2.backward_config import blocks, launch_args
from mambalearn.mamba2.common import bcgs_of, load_row, load_tile, load_tile_t, p2


# ---------------------------------------------------------------------------------------------
# 4. dCB_ts = Σ_heads (dy_t · x_s) Δ_s exp(a_t − a_s), s ≤ t: the gradient of C Bᵀ per group
@triton.jit
def _dcb_kernel(
    dy_ptr, x_ptr, CB_ptr,          # dy, x (b, l, h, p); CB (b, c, g, q, q) f32
    dt_ptr, dA_cs_ptr, seq_ptr,     # Δ, dA_cs (b, h, c, q) f32
    dCB_ptr,                        # out: (b, c, g, nsplit, q, q) f32, blocks s ≤ t only
    ddA_ptr,                        # out: (b, h, c, q, slots) f32; Σ_s E_ts − Σ_t E_ts by block
    l, h, p, g, nchunks, heads_per_group, nsplit, slots,
    Q: tl.constexpr, HEADS: tl.constexpr,   # HEADS: heads per program = (h / g) / nsplit
    BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid, pid_ts = tl.program_id(0), tl.program_id(1)  # (b, c, g, split) on the unlimited axis
    pid_t, pid_s = pid_ts // tl.cdiv(Q, BLOCK_Q), pid_ts % tl.cdiv(Q, BLOCK_Q)
    if pid_s > pid_t:
        return  # strictly above the diagonal: L is zero there
    pid_b, pid_c, pid_g, split = bcgs_of(pid, g, nchunks, nsplit)
    offs_t = pid_t * BLOCK_Q + tl.arange(0, BLOCK_Q)  # rows t (outputs)
    offs_s = pid_s * BLOCK_Q + tl.arange(0, BLOCK_Q)  # columns s (inputs)
    offs_p = tl.arange(0, BLOCK_P)  # the whole head dim: dy_t · x_s needs all of it
    t_t, t_s = pid_c * Q + offs_t, pid_c * Q + offs_s
    ok_t, ok_s = (offs_t < Q) & (t_t < l), (offs_s < Q) & (t_s < l)
    keep = (offs_t[:, None] >= offs_s[None, :]) & ok_t[:, None] & ok_s[None, :]  # causal
    strict = offs_t[:, None] > offs_s[None, :]  # E_tt adds to a_t and takes from a_t: left out
    if HAS_SEQ:  # … and inside one packed sequence
        seq_t = tl.load(seq_ptr + pid_b * l + t_t, mask=ok_t, other=-1)
        seq_s = tl.load(seq_ptr + pid_b * l + t_s, mask=ok_s, other=-2)
        keep = keep & (seq_t[:, None] == seq_s[None, :])
    cb = load_tile(CB_ptr + ((pid_b * nchunks + pid_c) * g + pid_g) * Q * Q, offs_t, offs_t < Q, Q,
               offs_s, Q)  # (T, S) f32
    xdy_base = (pid_b * l + pid_c * Q) * h * p  # the chunk's first step (64-bit: past 2³¹)
    acc = tl.zeros((BLOCK_Q, BLOCK_Q), dtype=tl.float32)
    for i in range(HEADS):  # the heads of this group (and split): they all share CB
        head = pid_g * heads_per_group + split * HEADS + i
        dy_t = load_tile(dy_ptr + xdy_base + head * p, offs_t, ok_t, h * p, offs_p, p)  # (T, P)
        xT_s = load_tile_t(x_ptr + xdy_base + head * p, offs_s, ok_s, h * p, offs_p, p)  # (P, S)
        dyx = tl.dot(dy_t, xT_s)  # (T, S): dy_t · x_s
        cs = ((pid_b * h + head) * nchunks + pid_c) * Q
        a_t, a_s = load_row(dA_cs_ptr + cs, offs_t, Q), load_row(dA_cs_ptr + cs, offs_s, Q)
        # exp(a_t − a_s) where kept (clamped to ≤ 0 as in the forward), exp(−∞) = 0 elsewhere
        decay = tl.exp(tl.where(keep, tl.minimum(a_t[:, None] - a_s[None, :], 0.0), -float("inf")))
        W = dyx * (decay * load_row(dt_ptr + cs, offs_s, Q)[None, :])  # (T, S): this head's dCB
        acc += W
        # step 8: E_ts = W_ts CB_ts = dP_ts P_ts (s < t) goes to a_t with + and to a_s with −.
        # Row and column sums of this one float32 tile, so that they cancel exactly where they
        # should (in the reverse cumsum). Row r of block j: slot k < j holds the row sum over
        # s-block k, slot k > j minus the column sum over t-block k, slot j both (diagonal block).
        E = tl.where(strict, W * cb, 0.0)
        rows, cols = tl.sum(E, axis=1), tl.sum(E, axis=0)  # Σ_s E_ts (at t), Σ_t E_ts (at s)
        if pid_t == pid_s:
            tl.store(ddA_ptr + (cs + offs_t) * slots + pid_t, rows - cols, mask=offs_t < Q)
        else:
            tl.store(ddA_ptr + (cs + offs_t) * slots + pid_s, rows, mask=offs_t < Q)
            tl.store(ddA_ptr + (cs + offs_s) * slots + pid_t, -cols, mask=offs_s < Q)
    out = dCB_ptr + (pid.to(tl.int64) * Q + offs_t[:, None]) * Q + offs_s[None, :]
    tl.store(out, acc, mask=(offs_t[:, None] < Q) & (offs_s[None, :] < Q))


def dcb(dy, x, CB, dt_c, dA_cs, ddA, seq_idx=None, nsplit=1, *, cfg):
    """Step 4. dCB (b, c, g, nsplit, q, q) float32: its sum over the split axis is ∂loss/∂CB
    (blocks above the diagonal are not written). Fills ddA[..., :#blocks]: their sum over the
    slots is Σ_{s<t} E_ts − Σ_{t'>t} E_t't = ∂⟨Y_diag, dy⟩/∂a_t (step 8)."""
    dy, x = dy.contiguous(), x.contiguous()
    b, l, h, p = x.shape
    c, g, q = CB.shape[1], CB.shape[2], CB.shape[3]
    if nsplit < 1 or (h // g) % nsplit:
        raise ValueError(f"nsplit = {nsplit} must divide the {h // g} heads of a group")
    BQ = blocks(q, cfg)
    nblk = triton.cdiv(q, BQ)
    dCB = torch.empty(b, c, g, nsplit, q, q, device=x.device, dtype=torch.float32)
    _dcb_kernel[(b * c * g * nsplit, nblk * nblk)](
        dy, x, CB, dt_c, dA_cs, seq_idx if seq_idx is not None else dt_c, dCB, ddA,
        l, h, p, g, c, h // g, nsplit, ddA.shape[-1],
        Q=q, HEADS=h // g // nsplit, BLOCK_Q=BQ, BLOCK_P=p2(p), HAS_SEQ=seq_idx is not None,
        **launch_args(cfg.dcb)[1])
    return dCB


# ---------------------------------------------------------------------------------------------
# 5. dC_t = Σ_heads exp(a_t) dy_t H_c + Σ_{s≤t} dCB_ts B_s
@triton.jit
def _dC_kernel(
    dy_ptr, H_ptr, C_ptr, B_ptr,    # dy (b, l, h, p); H (b, c, h, p, n); C, B (b, l, g, n)
    dCB_ptr, dA_cs_ptr, seq_ptr,    # dCB (b, c, g, nsplit, q, q) f32; dA_cs (b, h, c, q)
    dC_ptr,                         # out: (nsplit, b, l, g, n) f32
    ddA_ptr,                        # out: (b, h, c, q, slots) f32; slot0 + n-block: dy_t·Y_off_t
    nb, l, h, p, g, nchunks, heads_per_group, nsplit, slots, slot0,
    N: tl.constexpr, Q: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid, pid_tn = tl.program_id(0), tl.program_id(1)  # (b, c, g, split) on the unlimited axis
    pid_t, pid_n = pid_tn // tl.cdiv(N, BLOCK_N), pid_tn % tl.cdiv(N, BLOCK_N)
    pid_b, pid_c, pid_g, split = bcgs_of(pid, g, nchunks, nsplit)
    offs_t = pid_t * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    t_t = pid_c * Q + offs_t
    ok_t = (offs_t < Q) & (t_t < l)
    bt0 = pid_b * l + pid_c * Q  # the chunk's first step (64-bit: past 2³¹)
    BC_base = bt0 * g * N + pid_g * N  # step k of the chunk, this group: + k·g·n
    C_t = load_tile(C_ptr + BC_base, offs_t, ok_t, g * N, offs_n, N).to(tl.float32)  # (T, N)
    if HAS_SEQ:  # steps that continue the sequence of the entering state
        seq_prev = tl.load(seq_ptr + pid_b * l + pid_c * Q - 1, mask=pid_c > 0, other=0)
        same_prev = tl.load(seq_ptr + pid_b * l + t_t, mask=ok_t, other=-1) == seq_prev
    dy_base = dy_ptr + bt0 * h * p
    acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    # off-diagonal part, head by head: exp(a_t) dy_t H_c
    for i in range(HEADS):
        head = pid_g * heads_per_group + split * HEADS + i
        dy_t = load_tile(dy_base + head * p, offs_t, ok_t, h * p, offs_p, p)  # (T, P)
        H_base = H_ptr + ((pid_b * nchunks + pid_c) * h + head).to(tl.int64) * p * N
        H_c = load_tile(H_base, offs_p, offs_p < p, N, offs_n, N)  # (P, N)
        cs = ((pid_b * h + head) * nchunks + pid_c) * Q
        scale = tl.exp(load_row(dA_cs_ptr + cs, offs_t, Q))
        if HAS_SEQ:
            scale = tl.where(same_prev, scale, 0.0)
        Z = tl.dot(dy_t, H_c.to(dy_t.dtype)) * scale[:, None]  # (T, N): this head's dC_t
        acc += Z
        # Σ_n C_t Z_t = this head's dy_t · Y_off_t (this n-block's share): step 8's a_t term
        tl.store(ddA_ptr + (cs + offs_t) * slots + slot0 + pid_n, tl.sum(Z * C_t, axis=1),
                 mask=offs_t < Q)
    # diagonal part: Σ_{s ≤ t} dCB_ts B_s, over the blocks left of and on the diagonal
    dCB_base = dCB_ptr + pid.to(tl.int64) * Q * Q
    k0 = 0
    while k0 <= pid_t * BLOCK_Q:
        offs_s = k0 + tl.arange(0, BLOCK_Q)
        t_s = pid_c * Q + offs_s
        ok_s = (offs_s < Q) & (t_s < l)
        dcb = load_tile(dCB_base, offs_t, offs_t < Q, Q, offs_s, Q)  # (T, S)
        B_s = load_tile(B_ptr + BC_base, offs_s, ok_s, g * N, offs_n, N).to(tl.float32)  # (S, N)
        acc += tl.dot(dcb, B_s)  # float32 operands (tf32 on a GPU): dCB sums many heads
        k0 += BLOCK_Q
    out = dC_ptr + split.to(tl.int64) * nb * l * g * N + BC_base + offs_t[:, None] * g * N
    tl.store(out + offs_n[None, :], acc, mask=ok_t[:, None] & (offs_n[None, :] < N))


def dC_backward(dy, H, C, B, dCB, dA_cs, ddA, slot0, seq_idx=None, *, cfg):
    """Step 5. dC (b, l, g, n) float32. Fills ddA[..., slot0 + n-block] (dy_t · Y_off_t)."""
    dy, C, B = dy.contiguous(), C.contiguous(), B.contiguous()
    b, l, h, p = dy.shape
    g, n = C.shape[2], C.shape[3]
    c, nsplit, q = dCB.shape[1], dCB.shape[3], dCB.shape[-1]
    BQ = blocks(q, cfg)
    BN, opts = launch_args(cfg.dC, n)
    dC = torch.empty(nsplit, b, l, g, n, device=dy.device, dtype=torch.float32)
    _dC_kernel[(b * c * g * nsplit, triton.cdiv(q, BQ) * triton.cdiv(n, BN))](
        dy, H, C, B, dCB, dA_cs, seq_idx if seq_idx is not None else dA_cs, dC, ddA,
        b, l, h, p, g, c, h // g, nsplit, ddA.shape[-1], slot0,
        N=n, Q=q, HEADS=h // g // nsplit, BLOCK_Q=BQ, BLOCK_N=BN, BLOCK_P=p2(p),
        HAS_SEQ=seq_idx is not None, **opts)
    return dC.sum(0) if nsplit > 1 else dC[0]


# ---------------------------------------------------------------------------------------------
# 6. dB_s = Σ_heads w_s x_s dS_c + Σ_{t≥s} dCB_ts C_t,   w_s = exp(a_last − a_s) Δ_s
@triton.jit
def _dB_kernel(
    x_ptr, dS_ptr, C_ptr,           # x (b, l, h, p); dS (b, c, h, p, n) f32; C (b, l, g, n)
    dCB_ptr, dt_ptr, dA_cs_ptr, seq_ptr,
    dB_ptr,                         # out: (nsplit, b, l, g, n) f32
    nb, l, h, p, g, nchunks, heads_per_group, nsplit,
    N: tl.constexpr, Q: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid, pid_sn = tl.program_id(0), tl.program_id(1)  # (b, c, g, split) on the unlimited axis
    pid_s, pid_n = pid_sn // tl.cdiv(N, BLOCK_N), pid_sn % tl.cdiv(N, BLOCK_N)
    pid_b, pid_c, pid_g, split = bcgs_of(pid, g, nchunks, nsplit)
    offs_s = pid_s * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    t_s = pid_c * Q + offs_s
    ok_s = (offs_s < Q) & (t_s < l)
    if HAS_SEQ:  # only steps of the sequence running at the chunk's end enter S_c
        seq_last = tl.load(seq_ptr + pid_b * l + tl.minimum((pid_c + 1) * Q, l) - 1)
        same_last = tl.load(seq_ptr + pid_b * l + t_s, mask=ok_s, other=-1) == seq_last
    bt0 = pid_b * l + pid_c * Q  # the chunk's first step (64-bit: past 2³¹)
    x_base = x_ptr + bt0 * h * p
    acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    # chunk-state part, head by head: w_s x_s dS_c
    for i in range(HEADS):
        head = pid_g * heads_per_group + split * HEADS + i
        x_s = load_tile(x_base + head * p, offs_s, ok_s, h * p, offs_p, p)  # (S, P)
        dS_base = dS_ptr + ((pid_b * nchunks + pid_c) * h + head).to(tl.int64) * p * N
        dS = load_tile(dS_base, offs_p, offs_p < p, N, offs_n, N)  # (P, N) f32
        cs = ((pid_b * h + head) * nchunks + pid_c) * Q
        a_last = tl.load(dA_cs_ptr + cs + Q - 1)
        w = tl.exp(tl.minimum(a_last - load_row(dA_cs_ptr + cs, offs_s, Q), 0.0))
        w *= load_row(dt_ptr + cs, offs_s, Q)
        if HAS_SEQ:
            w = tl.where(same_last, w, 0.0)
        acc += tl.dot(x_s, dS.to(x_s.dtype)) * w[:, None]  # (S, N)
    # diagonal part: Σ_{t ≥ s} dCB_ts C_t, over the blocks on and below the diagonal
    BC_base = bt0 * g * N + pid_g * N
    dCB_base = dCB_ptr + pid.to(tl.int64) * Q * Q
    k0 = pid_s * BLOCK_Q
    while k0 < Q:
        offs_t = k0 + tl.arange(0, BLOCK_Q)
        t_t = pid_c * Q + offs_t
        ok_t = (offs_t < Q) & (t_t < l)
        dcbT = load_tile_t(dCB_base, offs_t, offs_t < Q, Q, offs_s, Q)  # (S, T)
        C_t = load_tile(C_ptr + BC_base, offs_t, ok_t, g * N, offs_n, N).to(tl.float32)  # (T, N)
        acc += tl.dot(dcbT, C_t)
        k0 += BLOCK_Q
    out = dB_ptr + split.to(tl.int64) * nb * l * g * N + BC_base + offs_s[:, None] * g * N
    tl.store(out + offs_n[None, :], acc, mask=ok_s[:, None] & (offs_n[None, :] < N))


def dB_backward(x, dS, C, dCB, dt_c, dA_cs, seq_idx=None, *, cfg):
    """Step 6. dB (b, l, g, n) float32."""
    x, C = x.contiguous(), C.contiguous()
    b, l, h, p = x.shape
    g, n = C.shape[2], C.shape[3]
    c, nsplit, q = dCB.shape[1], dCB.shape[3], dCB.shape[-1]
    BQ = blocks(q, cfg)
    BN, opts = launch_args(cfg.dB, n)
    dB = torch.empty(nsplit, b, l, g, n, device=x.device, dtype=torch.float32)
    _dB_kernel[(b * c * g * nsplit, triton.cdiv(q, BQ) * triton.cdiv(n, BN))](
        x, dS, C, dCB, dt_c, dA_cs, seq_idx if seq_idx is not None else dA_cs, dB,
        b, l, h, p, g, c, h // g, nsplit,
        N=n, Q=q, HEADS=h // g // nsplit, BLOCK_Q=BQ, BLOCK_N=BN, BLOCK_P=p2(p),
        HAS_SEQ=seq_idx is not None, **opts)
    return dB.sum(0) if nsplit > 1 else dB[0]
