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
``mambalearn.ssd.mamba_chunk_scan_ref`` (``mambalearn.triton.ssd.BACKWARD = "reference"``).
Organised like mamba_ssm's ``ssd_combined._mamba_chunk_scan_combined_bwd`` (not its code).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device
from mambalearn.triton import ssd as fwd
from mambalearn.triton.ssd import _p2

_INTERP = device.interpreted()

# GPU launch settings per kernel, for the benchmark shape (q 256, p 64, n 128). Chosen from the
# sm_90 build's register counts (`cuobjdump -res-usage`): no spills, ≥ 8 warps per SM
# (_dcb with 4 warps spills; _dx with n in one 128-wide tile spills). Not yet swept on a GPU.
CONFIGS = dict(
    dstates=dict(BLOCK_N=128, num_warps=8, num_stages=3),
    dcb=dict(num_warps=8, num_stages=2),
    dC=dict(BLOCK_N=64, num_warps=8, num_stages=2),
    dB=dict(BLOCK_N=64, num_warps=8, num_stages=2),
    dx=dict(BLOCK_N=64, num_warps=8, num_stages=2),
)
HEAD_SPLITS = None  # steps 4–6: a group's heads split over this many programs (None: heuristic)


def _cfg(name, n=None):
    """(BLOCK_N, launch options) of one kernel; the interpreter takes the whole n and one stage."""
    c = dict(CONFIGS[name])
    bn = c.pop("BLOCK_N", None)
    if _INTERP:
        return (_p2(n) if n else None), dict(num_warps=4, num_stages=1)
    return (min(bn, _p2(n)) if n and bn else bn), c


def _blocks(q):
    """The tile of the q×q blocks (steps t and s); steps 4–7 share it, so they agree on which
    blocks of dCB exist (those on or below the diagonal)."""
    return 16 if _INTERP else min(64, _p2(q))


# ---------------------------------------------------------------------------------------------
# helpers: tiles of contiguous (…, steps, features) tensors, program ids
@triton.jit
def _tile(ptr, rows, rows_ok, row_stride, cols, ncols):
    """ptr[rows · row_stride + cols] as a (rows, cols) tile, 0 where masked."""
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :],
                   mask=rows_ok[:, None] & (cols[None, :] < ncols), other=0.0)


@triton.jit
def _tile_T(ptr, rows, rows_ok, row_stride, cols, ncols):
    """The same tile transposed: (cols, rows)."""
    return tl.load(ptr + rows[None, :] * row_stride + cols[:, None],
                   mask=rows_ok[None, :] & (cols[:, None] < ncols), other=0.0)


@triton.jit
def _row(ptr, offs, Q: tl.constexpr):
    """Steps ``offs`` of one chunk's (q,) row of Δ or dA_cs (float32); 0 past the chunk."""
    return tl.load(ptr + offs, mask=offs < Q, other=0.0)


@triton.jit
def _bch(pid, h, nchunks):
    """(b, c, head) of a program over b·c·h, head fastest: the layout of S, H and dS."""
    return pid // (h * nchunks), (pid // h) % nchunks, pid % h


@triton.jit
def _bcgs(pid, g, nchunks, nsplit):
    """(b, c, group, split) of a program over b·c·g·nsplit, split fastest."""
    bcg = pid // nsplit
    return bcg // (g * nchunks), (bcg // g) % nchunks, bcg % g, pid % nsplit


# ---------------------------------------------------------------------------------------------
# 1. gate: dy = dout · silu(z), dz = dout · u · silu'(z)
@triton.jit
def _gate_bwd_kernel(dout_ptr, z_ptr, u_ptr, dy_ptr, dz_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    g = tl.load(dout_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)  # y + D x, before the gate
    sig = tl.sigmoid(z)
    tl.store(dy_ptr + offs, (g * z * sig).to(dy_ptr.dtype.element_ty), mask=ok)
    dz = g * u * sig * (1.0 + z * (1.0 - sig))  # silu'(z) = σ(z) + z σ(z)(1 − σ(z))
    tl.store(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask=ok)


def gate_backward(dout, z, u):
    """Step 1. (dy, dz), both (b, l, h, p): dy in u's dtype, dz in z's."""
    dout, z = dout.contiguous(), z.contiguous()
    dy, dz = torch.empty_like(u), torch.empty_like(z)
    BLOCK = 1024
    _gate_bwd_kernel[(triton.cdiv(u.numel(), BLOCK),)](dout, z, u, dy, dz, u.numel(), BLOCK=BLOCK)
    return dy, dz


# ---------------------------------------------------------------------------------------------
# 2. dstates: dH_c = Σ_t exp(a_t) dy_t C_tᵀ, what Y_off sends back to the state entering chunk c
@triton.jit
def _dstates_kernel(
    dy_ptr, C_ptr, dA_cs_ptr, seq_ptr,  # dy (b, l, h, p); C (b, l, g, n); dA_cs (b, h, c, q)
    dH_ptr,                             # out: (b, c, h, p, n) float32
    l, h, p, g, n, nchunks, heads_per_group,
    Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_SEQ: tl.constexpr,
):
    pid_pn, pid_bch = tl.program_id(0), tl.program_id(1)
    pid_p, pid_n = pid_pn // tl.cdiv(n, BLOCK_N), pid_pn % tl.cdiv(n, BLOCK_N)
    pid_b, pid_c, pid_h = _bch(pid_bch, h, nchunks)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dy_base = dy_ptr + pid_b.to(tl.int64) * l * h * p + pid_h * p  # step t: + t·h·p
    C_base = C_ptr + pid_b.to(tl.int64) * l * g * n + (pid_h // heads_per_group) * n
    cs = dA_cs_ptr + ((pid_b * h + pid_h) * nchunks + pid_c) * Q  # this chunk's row of a
    if HAS_SEQ:  # Y_off only reaches steps that continue the sequence of the entering state
        seq_prev = tl.load(seq_ptr + pid_b * l + pid_c * Q - 1, mask=pid_c > 0, other=0)
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):  # reduce over the steps t of the chunk
        offs_k = k0 + tl.arange(0, BLOCK_K)
        t = pid_c * Q + offs_k
        ok = (offs_k < Q) & (t < l)
        scale = tl.exp(_row(cs, offs_k, Q))  # exp(a_t)
        if HAS_SEQ:
            seq_t = tl.load(seq_ptr + pid_b * l + t, mask=ok, other=-1)
            scale = tl.where(seq_t == seq_prev, scale, 0.0)
        dyT = _tile_T(dy_base, t, ok, h * p, offs_p, p)  # (P, K)
        C_k = _tile(C_base, t, ok, g * n, offs_n, n)  # (K, N)
        acc += tl.dot((dyT.to(tl.float32) * scale[None, :]).to(C_k.dtype), C_k)  # (P, N)
    out = dH_ptr + (pid_bch.to(tl.int64) * p + offs_p[:, None]) * n + offs_n[None, :]
    tl.store(out, acc, mask=(offs_p[:, None] < p) & (offs_n[None, :] < n))


def dstates(dy, C, dA_cs, seq_idx=None):
    """Step 2. dH (b, c, h, p, n) float32: ∂loss/∂H_c through Y_off only."""
    dy, C = dy.contiguous(), C.contiguous()  # the kernels index contiguous tensors
    b, l, h, p = dy.shape
    g, n = C.shape[2], C.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    dH = torch.empty(b, c, h, p, n, device=dy.device, dtype=torch.float32)
    BN, opts = _cfg("dstates", n)
    BP = _p2(p) if _INTERP else min(64, _p2(p))
    grid = (triton.cdiv(p, BP) * triton.cdiv(n, BN), b * c * h)
    _dstates_kernel[grid](dy, C, dA_cs, seq_idx if seq_idx is not None else dA_cs, dH,
                          l, h, p, g, n, c, h // g, Q=q, BLOCK_P=BP, BLOCK_N=BN,
                          BLOCK_K=_blocks(q), HAS_SEQ=seq_idx is not None, **opts)
    return dH


# ---------------------------------------------------------------------------------------------
# 3. state passing reversed: 𝒢_c = dH_c + α_c 𝒢_{c+1}, a sequential scan over chunks backwards
@triton.jit
def _state_passing_bwd_kernel(
    dS_ptr,             # in: dH (b, c, h, p·n) f32; out, in place: dS_c = 𝒢_{c+1}
    H_ptr, final_ptr,   # H_c entering each chunk (b, c, h, p·n), x's dtype; final (b, h, p·n) f32
    dA_cs_ptr, dfinal_ptr, seq_ptr,
    dinit_ptr,          # out: 𝒢_0 (b, h, p·n) f32
    dlast_ptr,          # out: (b, h, c, nblocks) f32: this block's share of ⟨α_c H_c, 𝒢_{c+1}⟩
    l, h, dim, nchunks, nblocks,
    Q: tl.constexpr, BLOCK: tl.constexpr,
    HAS_DFINAL: tl.constexpr, HAS_INIT: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid_d, pid_b, pid_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs = pid_d * BLOCK + tl.arange(0, BLOCK)
    ok = offs < dim
    bh = pid_b * h + pid_h
    if HAS_DFINAL:  # 𝒢 after the last chunk: the gradient of the final state
        G = tl.load(dfinal_ptr + bh.to(tl.int64) * dim + offs, mask=ok, other=0.0).to(tl.float32)
    else:
        G = tl.zeros((BLOCK,), dtype=tl.float32)
    c = nchunks - 1
    while c >= 0:  # `while`: the interpreter rejects range() over run-time bounds
        row = ((pid_b * nchunks + c) * h + pid_h).to(tl.int64)  # (b, c, h) row of dS and H
        H_c = tl.load(H_ptr + row * dim + offs, mask=ok, other=0.0).to(tl.float32)
        dH = tl.load(dS_ptr + row * dim + offs, mask=ok, other=0.0)
        tl.store(dS_ptr + row * dim + offs, G, mask=ok)  # dS_c = 𝒢_{c+1}
        alpha = tl.exp(tl.load(dA_cs_ptr + (bh * nchunks + c) * Q + Q - 1))  # exp(a_last)
        if HAS_SEQ:  # the forward cut the chain where chunk c ends in a new sequence
            seq_end = tl.load(seq_ptr + pid_b * l + tl.minimum((c + 1) * Q, l) - 1)
            seq_before = tl.load(seq_ptr + pid_b * l + c * Q - 1, mask=c > 0, other=0)
            alpha = tl.where(seq_end == seq_before, alpha, 0.0)
        # a_last's path through α_c H_c (its path through S_c is step 7's Σ_s v_s)
        tl.store(dlast_ptr + (bh * nchunks + c) * nblocks + pid_d, alpha * tl.sum(H_c * G, axis=0))
        G = dH + alpha * G  # 𝒢_c
        c -= 1
    if HAS_INIT:
        tl.store(dinit_ptr + bh.to(tl.int64) * dim + offs, G, mask=ok)


def state_passing_backward(dS, H, final, dA_cs, dfinal=None, seq_idx=None, l=None,
                           has_init=False):
    """Step 3, in place: dS (b, c, h, p, n) holds dH on entry and dS_c = 𝒢_{c+1} on return.

    Returns (dlast (b, h, c) float32 = ⟨α_c H_c, 𝒢_{c+1}⟩, ∂loss/∂a_last of each chunk through
             α_c H_c (the part through S_c is Σ_s v_s of step 7),
             dinitial_states (b, h, p, n) float32, or None without initial states).
    ``final`` is not read (kept for the callers); H_c is the state entering chunk c.
    """
    b, c, h, p, n = dS.shape
    q, dim = dA_cs.shape[-1], p * n
    BLOCK = 256 if _INTERP else 1024
    nblocks = triton.cdiv(dim, BLOCK)
    dlast = torch.empty(b, h, c, nblocks, device=dS.device, dtype=torch.float32)
    dinit = torch.empty(b, h, p, n, device=dS.device, dtype=torch.float32) if has_init else None
    dfin = dfinal.contiguous() if dfinal is not None else None
    _state_passing_bwd_kernel[(nblocks, b, h)](
        dS, H, final, dA_cs, dfin if dfin is not None else dS,
        seq_idx if seq_idx is not None else dS, dinit if has_init else dS, dlast,
        l if l is not None else c * q, h, dim, c, nblocks,
        Q=q, BLOCK=BLOCK, HAS_DFINAL=dfin is not None, HAS_INIT=has_init,
        HAS_SEQ=seq_idx is not None, num_warps=4)
    return dlast.sum(-1), dinit


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
    pid_ts, pid = tl.program_id(0), tl.program_id(1)
    pid_t, pid_s = pid_ts // tl.cdiv(Q, BLOCK_Q), pid_ts % tl.cdiv(Q, BLOCK_Q)
    if pid_s > pid_t:
        return  # strictly above the diagonal: L is zero there
    pid_b, pid_c, pid_g, split = _bcgs(pid, g, nchunks, nsplit)
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
    cb = tl.load(CB_ptr + (((pid_b * nchunks + pid_c) * g + pid_g) * Q + offs_t[:, None]) * Q
                 + offs_s[None, :], mask=(offs_t[:, None] < Q) & (offs_s[None, :] < Q),
                 other=0.0)  # (T, S) f32
    xdy_base = pid_b.to(tl.int64) * l * h * p
    acc = tl.zeros((BLOCK_Q, BLOCK_Q), dtype=tl.float32)
    for i in range(HEADS):  # the heads of this group (and split): they all share CB
        head = pid_g * heads_per_group + split * HEADS + i
        dy_t = _tile(dy_ptr + xdy_base + head * p, t_t, ok_t, h * p, offs_p, p)  # (T, P)
        xT_s = _tile_T(x_ptr + xdy_base + head * p, t_s, ok_s, h * p, offs_p, p)  # (P, S)
        dyx = tl.dot(dy_t, xT_s)  # (T, S): dy_t · x_s
        cs = ((pid_b * h + head) * nchunks + pid_c) * Q
        a_t, a_s = _row(dA_cs_ptr + cs, offs_t, Q), _row(dA_cs_ptr + cs, offs_s, Q)
        # exp(a_t − a_s) where kept (clamped to ≤ 0 as in the forward), exp(−∞) = 0 elsewhere
        decay = tl.exp(tl.where(keep, tl.minimum(a_t[:, None] - a_s[None, :], 0.0), -float("inf")))
        W = dyx * (decay * _row(dt_ptr + cs, offs_s, Q)[None, :])  # (T, S): this head's dCB
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
    out = dCB_ptr + (pid * Q + offs_t[:, None]) * Q + offs_s[None, :]
    tl.store(out, acc, mask=(offs_t[:, None] < Q) & (offs_s[None, :] < Q))


def _head_splits(heads_per_group, programs):
    """Split a group's heads over programs while the grid has fewer than 2 programs per SM."""
    if HEAD_SPLITS is not None:
        return HEAD_SPLITS
    if _INTERP:
        return 1
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    split = 1
    while programs * split < 2 * sms and heads_per_group % (2 * split) == 0:
        split *= 2
    return split


def dcb(dy, x, CB, dt_c, dA_cs, ddA, seq_idx=None, nsplit=1):
    """Step 4. dCB (b, c, g, nsplit, q, q) float32: its sum over the split axis is ∂loss/∂CB
    (blocks above the diagonal are not written). Fills ddA[..., :#blocks]: their sum over the
    slots is Σ_{s<t} E_ts − Σ_{t'>t} E_t't = ∂⟨Y_diag, dy⟩/∂a_t (step 8)."""
    dy, x = dy.contiguous(), x.contiguous()
    b, l, h, p = x.shape
    c, g, q = CB.shape[1], CB.shape[2], CB.shape[3]
    if nsplit < 1 or (h // g) % nsplit:
        raise ValueError(f"nsplit = {nsplit} must divide the {h // g} heads of a group")
    BQ = _blocks(q)
    nblk = triton.cdiv(q, BQ)
    dCB = torch.empty(b, c, g, nsplit, q, q, device=x.device, dtype=torch.float32)
    _dcb_kernel[(nblk * nblk, b * c * g * nsplit)](
        dy, x, CB, dt_c, dA_cs, seq_idx if seq_idx is not None else dt_c, dCB, ddA,
        l, h, p, g, c, h // g, nsplit, ddA.shape[-1],
        Q=q, HEADS=h // g // nsplit, BLOCK_Q=BQ, BLOCK_P=_p2(p), HAS_SEQ=seq_idx is not None,
        **_cfg("dcb")[1])
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
    n: tl.constexpr, Q: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid_tn, pid = tl.program_id(0), tl.program_id(1)
    pid_t, pid_n = pid_tn // tl.cdiv(n, BLOCK_N), pid_tn % tl.cdiv(n, BLOCK_N)
    pid_b, pid_c, pid_g, split = _bcgs(pid, g, nchunks, nsplit)
    offs_t = pid_t * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    t_t = pid_c * Q + offs_t
    ok_t = (offs_t < Q) & (t_t < l)
    BC_base = pid_b.to(tl.int64) * l * g * n + pid_g * n  # step t of this group: + t·g·n
    C_t = _tile(C_ptr + BC_base, t_t, ok_t, g * n, offs_n, n).to(tl.float32)  # (T, N)
    if HAS_SEQ:  # steps that continue the sequence of the entering state
        seq_prev = tl.load(seq_ptr + pid_b * l + pid_c * Q - 1, mask=pid_c > 0, other=0)
        same_prev = tl.load(seq_ptr + pid_b * l + t_t, mask=ok_t, other=-1) == seq_prev
    dy_base = dy_ptr + pid_b.to(tl.int64) * l * h * p
    acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    # off-diagonal part, head by head: exp(a_t) dy_t H_c
    for i in range(HEADS):
        head = pid_g * heads_per_group + split * HEADS + i
        dy_t = _tile(dy_base + head * p, t_t, ok_t, h * p, offs_p, p)  # (T, P)
        H_base = H_ptr + ((pid_b * nchunks + pid_c) * h + head).to(tl.int64) * p * n
        H_c = _tile(H_base, offs_p, offs_p < p, n, offs_n, n)  # (P, N)
        cs = ((pid_b * h + head) * nchunks + pid_c) * Q
        scale = tl.exp(_row(dA_cs_ptr + cs, offs_t, Q))
        if HAS_SEQ:
            scale = tl.where(same_prev, scale, 0.0)
        Z = tl.dot(dy_t, H_c.to(dy_t.dtype)) * scale[:, None]  # (T, N): this head's dC_t
        acc += Z
        # Σ_n C_t Z_t = this head's dy_t · Y_off_t (this n-block's share): step 8's a_t term
        tl.store(ddA_ptr + (cs + offs_t) * slots + slot0 + pid_n, tl.sum(Z * C_t, axis=1),
                 mask=offs_t < Q)
    # diagonal part: Σ_{s ≤ t} dCB_ts B_s, over the blocks left of and on the diagonal
    dCB_base = dCB_ptr + pid * Q * Q
    k0 = 0
    while k0 <= pid_t * BLOCK_Q:
        offs_s = k0 + tl.arange(0, BLOCK_Q)
        t_s = pid_c * Q + offs_s
        ok_s = (offs_s < Q) & (t_s < l)
        dcb = tl.load(dCB_base + offs_t[:, None] * Q + offs_s[None, :],
                      mask=(offs_t[:, None] < Q) & (offs_s[None, :] < Q), other=0.0)  # (T, S)
        B_s = _tile(B_ptr + BC_base, t_s, ok_s, g * n, offs_n, n).to(tl.float32)  # (S, N)
        acc += tl.dot(dcb, B_s)  # float32 operands (tf32 on a GPU): dCB sums many heads
        k0 += BLOCK_Q
    out = dC_ptr + split.to(tl.int64) * nb * l * g * n + BC_base + t_t[:, None] * g * n
    tl.store(out + offs_n[None, :], acc, mask=ok_t[:, None] & (offs_n[None, :] < n))


def dC_backward(dy, H, C, B, dCB, dA_cs, ddA, slot0, seq_idx=None):
    """Step 5. dC (b, l, g, n) float32. Fills ddA[..., slot0 + n-block] (dy_t · Y_off_t)."""
    dy, C, B = dy.contiguous(), C.contiguous(), B.contiguous()
    b, l, h, p = dy.shape
    g, n = C.shape[2], C.shape[3]
    c, nsplit, q = dCB.shape[1], dCB.shape[3], dCB.shape[-1]
    BQ = _blocks(q)
    BN, opts = _cfg("dC", n)
    dC = torch.empty(nsplit, b, l, g, n, device=dy.device, dtype=torch.float32)
    _dC_kernel[(triton.cdiv(q, BQ) * triton.cdiv(n, BN), b * c * g * nsplit)](
        dy, H, C, B, dCB, dA_cs, seq_idx if seq_idx is not None else dA_cs, dC, ddA,
        b, l, h, p, g, c, h // g, nsplit, ddA.shape[-1], slot0,
        n=n, Q=q, HEADS=h // g // nsplit, BLOCK_Q=BQ, BLOCK_N=BN, BLOCK_P=_p2(p),
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
    n: tl.constexpr, Q: tl.constexpr, HEADS: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    pid_sn, pid = tl.program_id(0), tl.program_id(1)
    pid_s, pid_n = pid_sn // tl.cdiv(n, BLOCK_N), pid_sn % tl.cdiv(n, BLOCK_N)
    pid_b, pid_c, pid_g, split = _bcgs(pid, g, nchunks, nsplit)
    offs_s = pid_s * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_p = tl.arange(0, BLOCK_P)
    t_s = pid_c * Q + offs_s
    ok_s = (offs_s < Q) & (t_s < l)
    if HAS_SEQ:  # only steps of the sequence running at the chunk's end enter S_c
        seq_last = tl.load(seq_ptr + pid_b * l + tl.minimum((pid_c + 1) * Q, l) - 1)
        same_last = tl.load(seq_ptr + pid_b * l + t_s, mask=ok_s, other=-1) == seq_last
    x_base = x_ptr + pid_b.to(tl.int64) * l * h * p
    acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    # chunk-state part, head by head: w_s x_s dS_c
    for i in range(HEADS):
        head = pid_g * heads_per_group + split * HEADS + i
        x_s = _tile(x_base + head * p, t_s, ok_s, h * p, offs_p, p)  # (S, P)
        dS_base = dS_ptr + ((pid_b * nchunks + pid_c) * h + head).to(tl.int64) * p * n
        dS = _tile(dS_base, offs_p, offs_p < p, n, offs_n, n)  # (P, N) f32
        cs = ((pid_b * h + head) * nchunks + pid_c) * Q
        a_last = tl.load(dA_cs_ptr + cs + Q - 1)
        w = tl.exp(tl.minimum(a_last - _row(dA_cs_ptr + cs, offs_s, Q), 0.0))
        w *= _row(dt_ptr + cs, offs_s, Q)
        if HAS_SEQ:
            w = tl.where(same_last, w, 0.0)
        acc += tl.dot(x_s, dS.to(x_s.dtype)) * w[:, None]  # (S, N)
    # diagonal part: Σ_{t ≥ s} dCB_ts C_t, over the blocks on and below the diagonal
    BC_base = pid_b.to(tl.int64) * l * g * n + pid_g * n
    dCB_base = dCB_ptr + pid * Q * Q
    k0 = pid_s * BLOCK_Q
    while k0 < Q:
        offs_t = k0 + tl.arange(0, BLOCK_Q)
        t_t = pid_c * Q + offs_t
        ok_t = (offs_t < Q) & (t_t < l)
        dcbT = tl.load(dCB_base + offs_t[None, :] * Q + offs_s[:, None],
                       mask=(offs_t[None, :] < Q) & (offs_s[:, None] < Q), other=0.0)  # (S, T)
        C_t = _tile(C_ptr + BC_base, t_t, ok_t, g * n, offs_n, n).to(tl.float32)  # (T, N)
        acc += tl.dot(dcbT, C_t)
        k0 += BLOCK_Q
    out = dB_ptr + split.to(tl.int64) * nb * l * g * n + BC_base + t_s[:, None] * g * n
    tl.store(out + offs_n[None, :], acc, mask=ok_s[:, None] & (offs_n[None, :] < n))


def dB_backward(x, dS, C, dCB, dt_c, dA_cs, seq_idx=None):
    """Step 6. dB (b, l, g, n) float32."""
    x, C = x.contiguous(), C.contiguous()
    b, l, h, p = x.shape
    g, n = C.shape[2], C.shape[3]
    c, nsplit, q = dCB.shape[1], dCB.shape[3], dCB.shape[-1]
    BQ = _blocks(q)
    BN, opts = _cfg("dB", n)
    dB = torch.empty(nsplit, b, l, g, n, device=x.device, dtype=torch.float32)
    _dB_kernel[(triton.cdiv(q, BQ) * triton.cdiv(n, BN), b * c * g * nsplit)](
        x, dS, C, dCB, dt_c, dA_cs, seq_idx if seq_idx is not None else dA_cs, dB,
        b, l, h, p, g, c, h // g, nsplit,
        n=n, Q=q, HEADS=h // g // nsplit, BLOCK_Q=BQ, BLOCK_N=BN, BLOCK_P=_p2(p),
        HAS_SEQ=seq_idx is not None, **opts)
    return dB.sum(0) if nsplit > 1 else dB[0]


# ---------------------------------------------------------------------------------------------
# 7. dx: G_s = Σ_{t≥s} P_ts dy_t + exp(a_last − a_s) dS_c B_s,  dx_s = Δ_s G_s + D dy_s
@triton.jit
def _dx_kernel(
    x_ptr, dy_ptr, B_ptr,           # x, dy (b, l, h, p); B (b, l, g, n)
    CB_ptr, dS_ptr,                 # CB (b, c, g, q, q) f32; dS (b, c, h, p, n) f32
    dt_ptr, dA_cs_ptr, D_ptr, seq_ptr,
    dx_ptr,                         # out: (b, l, h, p) in x's dtype
    ddt_ptr,                        # out: (b, h, c, q) f32: x_s · G_s
    dD_ptr,                         # out: (b, c, h, s-blocks, p) f32: Σ_s dy_s x_s
    v_ptr,                          # out: (b, h, c, q) f32: v_s = w_s x_s · (dS_c B_s) (step 8)
    l, h, p, g, nchunks, heads_per_group, stride_Dh, stride_Dp,
    n: tl.constexpr, Q: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_D: tl.constexpr, HAS_SEQ: tl.constexpr, HAS_V: tl.constexpr,
):
    pid_s, pid_bch = tl.program_id(0), tl.program_id(1)
    pid_b, pid_c, pid_h = _bch(pid_bch, h, nchunks)
    pid_g = pid_h // heads_per_group
    offs_s = pid_s * BLOCK_Q + tl.arange(0, BLOCK_Q)  # the steps s this program differentiates
    offs_p = tl.arange(0, BLOCK_P)  # the whole head dim: x_s · G_s needs all of it
    t_s = pid_c * Q + offs_s
    ok_s = (offs_s < Q) & (t_s < l)
    cs = ((pid_b * h + pid_h) * nchunks + pid_c) * Q
    a_s, dt_s = _row(dA_cs_ptr + cs, offs_s, Q), _row(dt_ptr + cs, offs_s, Q)
    a_last = tl.load(dA_cs_ptr + cs + Q - 1)
    xdy_base = pid_b.to(tl.int64) * l * h * p + pid_h * p  # step t of this head: + t·h·p
    BC_base = pid_b.to(tl.int64) * l * g * n + pid_g * n
    if HAS_SEQ:
        seq_s = tl.load(seq_ptr + pid_b * l + t_s, mask=ok_s, other=-2)
    # 1. chunk state (S_c = Σ_s w_s x_s B_sᵀ): exp(a_last − a_s) B_s dS_cᵀ, first, so that v_s
    # is taken from it before the diagonal block is added (fewer live registers)
    dS_base = dS_ptr + pid_bch.to(tl.int64) * p * n
    G = tl.zeros((BLOCK_Q, BLOCK_P), dtype=tl.float32)
    for n0 in range(0, n, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        B_s = _tile(B_ptr + BC_base, t_s, ok_s, g * n, offs_n, n)  # (S, N)
        dST = _tile_T(dS_base, offs_p, offs_p < p, n, offs_n, n)  # (N, P) f32
        G += tl.dot(B_s, dST.to(B_s.dtype))
    decay_out = tl.exp(tl.minimum(a_last - a_s, 0.0))
    if HAS_SEQ:
        seq_last = tl.load(seq_ptr + pid_b * l + tl.minimum((pid_c + 1) * Q, l) - 1)
        decay_out = tl.where(seq_s == seq_last, decay_out, 0.0)
    G *= decay_out[:, None]
    if HAS_V:  # the chunk state's share of ∂a, from these very float32 numbers: −v_s at a_s,
        # +Σ_s v_s at a_last (step 8)
        x_v = _tile(x_ptr + xdy_base, t_s, ok_s, h * p, offs_p, p).to(tl.float32)  # (S, P)
        tl.store(v_ptr + cs + offs_s, dt_s * tl.sum(x_v * G, axis=1), mask=offs_s < Q)
    # 2. diagonal block: Σ_{t ≥ s} P_ts dy_t with P_ts = CB_ts exp(a_t − a_s), read as Pᵀ (S, T)
    CB_base = CB_ptr + ((pid_b * nchunks + pid_c) * g + pid_g) * Q * Q
    k0 = pid_s * BLOCK_Q
    while k0 < Q:
        offs_t = k0 + tl.arange(0, BLOCK_Q)
        t_t = pid_c * Q + offs_t
        ok_t = (offs_t < Q) & (t_t < l)
        cbT = tl.load(CB_base + offs_t[None, :] * Q + offs_s[:, None],
                      mask=(offs_t[None, :] < Q) & (offs_s[:, None] < Q), other=0.0)  # (S, T)
        keep = offs_t[None, :] >= offs_s[:, None]
        if HAS_SEQ:
            seq_t = tl.load(seq_ptr + pid_b * l + t_t, mask=ok_t, other=-1)
            keep = keep & (seq_t[None, :] == seq_s[:, None])
        a_t = _row(dA_cs_ptr + cs, offs_t, Q)
        expo = tl.where(keep, tl.minimum(a_t[None, :] - a_s[:, None], 0.0), -float("inf"))
        PT = cbT * tl.exp(expo)  # (S, T): Pᵀ, 0 where not kept
        dy_t = _tile(dy_ptr + xdy_base, t_t, ok_t, h * p, offs_p, p)  # (T, P)
        G += tl.dot(PT.to(dy_t.dtype), dy_t)  # (S, P)
        k0 += BLOCK_Q
    # 3. dx, x · G (for Δ, step 8) and dD;  G_s = ∂loss/∂(Δ_s x_s)
    x_s = _tile(x_ptr + xdy_base, t_s, ok_s, h * p, offs_p, p).to(tl.float32)  # (S, P)
    dx = G * dt_s[:, None]
    if HAS_D:  # out = y + D x
        dy_s = _tile(dy_ptr + xdy_base, t_s, ok_s, h * p, offs_p, p).to(tl.float32)
        Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p, other=0.0)
        dx += Dv.to(tl.float32)[None, :] * dy_s
        dD_row = (pid_bch * tl.cdiv(Q, BLOCK_Q) + pid_s).to(tl.int64) * p
        tl.store(dD_ptr + dD_row + offs_p, tl.sum(dy_s * x_s, axis=0), mask=offs_p < p)
    dx_ptrs = dx_ptr + xdy_base + t_s[:, None] * h * p + offs_p[None, :]
    tl.store(dx_ptrs, dx.to(dx_ptr.dtype.element_ty), mask=ok_s[:, None] & (offs_p[None, :] < p))
    tl.store(ddt_ptr + cs + offs_s, tl.sum(x_s * G, axis=1), mask=offs_s < Q)


def dx_backward(x, dy, B, CB, dS, dt_c, dA_cs, D=None, seq_idx=None, v=None):
    """Step 7. (dx (b, l, h, p) in x's dtype, x·G (b, h, c, q) float32, dD (D's shape) or None).
    If ``v`` (b, h, c, q) float32 is given, fills it with v_s = w_s x_s · (dS_c B_s) (step 8)."""
    x, dy, B = x.contiguous(), dy.contiguous(), B.contiguous()
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    BQ = _blocks(q)
    BN, opts = _cfg("dx", n)
    nblk = triton.cdiv(q, BQ)
    dx = torch.empty_like(x)
    ddt_x = torch.empty(b, h, c, q, device=x.device, dtype=torch.float32)
    dD = None if D is None else torch.empty(b, c, h, nblk, p, device=x.device, dtype=torch.float32)
    Dst = (0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else tuple(D.stride()))
    _dx_kernel[(nblk, b * c * h)](
        x, dy, B, CB, dS, dt_c, dA_cs, D if D is not None else dt_c,
        seq_idx if seq_idx is not None else dt_c, dx, ddt_x, dD if D is not None else dt_c,
        v if v is not None else dt_c, l, h, p, g, c, h // g, *Dst,
        n=n, Q=q, BLOCK_Q=BQ, BLOCK_P=_p2(p), BLOCK_N=BN,
        HAS_D=D is not None, HAS_SEQ=seq_idx is not None, HAS_V=v is not None, **opts)
    if D is not None:
        dD = dD.sum((0, 1, 3))  # (h, p)
        dD = dD.sum(-1) if D.ndim == 1 else dD
    return dx, ddt_x, dD


# ---------------------------------------------------------------------------------------------
# 8. chunk cumsum backward: ∂loss/∂a → reverse cumsum → dΔ, dA → softplus, clamp → ddt
@triton.jit
def _chunk_cumsum_bwd_kernel(
    ddA_ptr,        # (b, h, c, q) f32: ∂loss/∂a_t through Y_diag and Y_off
    ddt_x_ptr,      # (b, h, c, q) f32: x_t · G_t = ∂loss/∂Δ_t at fixed a
    dlast_ptr,      # (b, h, c) f32: ⟨α_c H_c, 𝒢_{c+1}⟩
    v_ptr,          # (b, h, c, q) f32: v_t = w_t x_t · (dS_c B_t), through S_c
    dt_c_ptr, dt_ptr, A_ptr, bias_ptr,   # Δ (b, h, c, q) f32; dt (b, l, h); A, dt_bias (h,)
    ddt_ptr,        # out: (b, l, h) f32, ∂loss/∂dt
    dA_ptr,         # out: (b, c, h) f32, this chunk's share of ∂loss/∂A
    l, h, nchunks, dt_min, dt_max,
    stride_dt_b, stride_dt_l, stride_dt_h,
    Q: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_V: tl.constexpr,
):
    pid_b, pid_c, pid_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_t = tl.arange(0, Q)  # the whole chunk: the reverse cumsum runs along it
    t = pid_c * Q + offs_t
    ok_h = offs_h < h
    rows = ((pid_b * h + offs_h[:, None]) * nchunks + pid_c) * Q + offs_t[None, :]  # (H, Q)
    delta = tl.load(dt_c_ptr + rows, mask=ok_h[:, None], other=0.0)
    g_delta = tl.load(ddt_x_ptr + rows, mask=ok_h[:, None], other=0.0)
    da = tl.load(ddA_ptr + rows, mask=ok_h[:, None], other=0.0)  # ∂loss/∂a_t …
    dlast = tl.load(dlast_ptr + (pid_b * h + offs_h) * nchunks + pid_c, mask=ok_h, other=0.0)
    if HAS_V:  # … through S_c: −v_t at a_t and +Σ v at a_last (a sum with no rounded partner)
        v = tl.load(v_ptr + rows, mask=ok_h[:, None], other=0.0)
        da -= v
        dlast += tl.sum(v, axis=1)
    da += tl.where(offs_t[None, :] == Q - 1, dlast[:, None], 0.0)  # a_last = a_{q−1}: Δ = 0 past l
    R = tl.cumsum(da, axis=1, reverse=True)  # R_k = Σ_{t ≥ k} ∂loss/∂a_t = ∂loss/∂(Δ_k A)
    A = tl.load(A_ptr + offs_h, mask=ok_h, other=0.0).to(tl.float32)
    dA_out = dA_ptr + (pid_b * nchunks + pid_c) * h + offs_h
    tl.store(dA_out, tl.sum(delta * R, axis=1), mask=ok_h)
    d_delta = g_delta + A[:, None] * R  # ∂loss/∂Δ
    # back through Δ = clamp(softplus(dt + dt_bias)), recomputing the pre-activation
    ok = ok_h[:, None] & (t[None, :] < l)
    v = tl.load(dt_ptr + pid_b * stride_dt_b + t[None, :] * stride_dt_l
                + offs_h[:, None] * stride_dt_h, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        v += tl.load(bias_ptr + offs_h, mask=ok_h, other=0.0).to(tl.float32)[:, None]
    if SOFTPLUS:  # softplus' = σ below mamba_ssm's threshold of 20, the identity above
        sp = tl.where(v <= 20.0, tl.log(1.0 + tl.exp(v)), v)
        d_delta = tl.where(v <= 20.0, d_delta * tl.sigmoid(v), d_delta)
    else:
        sp = v
    if HAS_LIMIT:  # clamp passes the gradient only inside [dt_min, dt_max], as torch.clamp
        d_delta = tl.where((sp >= dt_min) & (sp <= dt_max), d_delta, 0.0)
    tl.store(ddt_ptr + (pid_b * l + t[None, :]) * h + offs_h[:, None], d_delta, mask=ok)


def chunk_cumsum_backward(ddA, ddt_x, dlast, dt_c, dt, A, dt_bias=None, dt_softplus=False,
                          dt_limit=(0.0, float("inf")), v=None):
    """Step 8. (ddt (b, l, h) float32, dA (h,) float32, ddt_bias (h,) float32 or None).

    ∂loss/∂a_t = ddA_t − v_t + [t = last](dlast + Σ_s v_s); ddt_x is ∂loss/∂Δ at fixed a."""
    b, l, h = dt.shape
    c, q = dt_c.shape[2], dt_c.shape[3]
    ddt = torch.empty(b, l, h, device=dt.device, dtype=torch.float32)
    dA = torch.empty(b, c, h, device=dt.device, dtype=torch.float32)
    BLOCK_H = 1 if _INTERP else min(4, _p2(h, 1))
    _chunk_cumsum_bwd_kernel[(b, c, triton.cdiv(h, BLOCK_H))](
        ddA, ddt_x, dlast, v if v is not None else ddA, dt_c, dt, A,
        dt_bias if dt_bias is not None else A, ddt, dA,
        l, h, c, float(dt_limit[0]), float(dt_limit[1]), *dt.stride(),
        Q=q, BLOCK_H=BLOCK_H, HAS_BIAS=dt_bias is not None, SOFTPLUS=dt_softplus,
        HAS_LIMIT=tuple(dt_limit) != (0.0, float("inf")), HAS_V=v is not None, num_warps=4)
    return ddt, dA.sum((0, 1)), ddt.sum((0, 1)) if dt_bias is not None else None


# ---------------------------------------------------------------------------------------------
def ssd_backward(dout, dfinal, x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                 initial_states=None, seq_idx=None, dt_softplus=False,
                 dt_limit=(0.0, float("inf"))):
    """All gradients of ``mamba_chunk_scan_combined``, steps 0–8 of the module doc.

    Shapes: dout (b, l, h, p); dfinal (b, h, p, n) or None; the rest as the forward's.
    Returns (dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states), each in its input's dtype,
    None where the input is None. Matches ``_mamba_chunk_scan_combined_bwd`` of mamba_ssm.
    """
    b, l, h, p = x.shape
    g, n, q = B.shape[2], B.shape[3], chunk_size
    x, B, C, dout = x.contiguous(), B.contiguous(), C.contiguous(), dout.contiguous()
    seq_idx = seq_idx.contiguous() if seq_idx is not None else None
    # 0. recompute what the forward did not keep: Δ, dA_cs, the passed states H, CB
    dt_c, dA_cs = fwd.chunk_cumsum(dt, A, q, dt_bias, dt_softplus, dt_limit)  # (b, h, c, q)
    S = fwd.chunk_state(x, B, dt_c, dA_cs, seq_idx)  # (b, c, h, p, n) f32
    H, final = fwd.state_passing(S, dA_cs, initial_states, seq_idx, l, out_dtype=x.dtype)
    del S
    CB = fwd.bmm_chunk(C, B, q)  # (b, c, g, q, q) f32
    c = dA_cs.shape[2]
    # 1. gate
    if z is not None:
        u = fwd.chunk_scan(x, C, CB, dt_c, dA_cs, H, D, None, seq_idx)  # (b, l, h, p): y + D x
        dy, dz = gate_backward(dout, z, u)
        del u
    else:
        dy, dz = dout, None
    # 2–3. the state gradients, backwards over chunks (dS holds dH, then dS)
    dS = dstates(dy, C, dA_cs, seq_idx)  # (b, c, h, p, n) f32
    dlast, dinit = state_passing_backward(dS, H, final, dA_cs, dfinal, seq_idx, l,
                                          has_init=initial_states is not None)
    # 4–6. B and C are shared by a group's heads: one program per output tile loops over them
    nblk = triton.cdiv(q, _blocks(q))
    nblk_n = triton.cdiv(n, _cfg("dC", n)[0])
    ddA = torch.zeros(b, h, c, q, nblk + nblk_n, device=x.device, dtype=torch.float32)
    nsplit = _head_splits(h // g, b * c * g * nblk * (nblk + 1) // 2)
    dCB = dcb(dy, x, CB, dt_c, dA_cs, ddA, seq_idx, nsplit)  # (b, c, g, nsplit, q, q)
    dC = dC_backward(dy, H, C, B, dCB, dA_cs, ddA, nblk, seq_idx)  # (b, l, g, n) f32
    dB = dB_backward(x, dS, C, dCB, dt_c, dA_cs, seq_idx)  # (b, l, g, n) f32
    del dCB, H
    # 7. x, x · G for Δ, and v for a
    v = torch.empty(b, h, c, q, device=x.device, dtype=torch.float32)
    dx, ddt_x, dD = dx_backward(x, dy, B, CB, dS, dt_c, dA_cs, D, seq_idx, v)
    del dS, CB
    # 8. through the cumsum and the dt transform
    ddt, dA, ddt_bias = chunk_cumsum_backward(ddA.sum(-1), ddt_x, dlast, dt_c, dt, A, dt_bias,
                                              dt_softplus, dt_limit, v)
    cast = lambda grad, like: None if like is None else grad.to(like.dtype)
    return (dx, cast(ddt, dt), cast(dA, A), cast(dB, B), cast(dC, C), cast(dD, D), dz,
            cast(ddt_bias, dt_bias), cast(dinit, initial_states))
