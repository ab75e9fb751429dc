"""The SSD forward in one launch (chapter 11): one program per (batch, head, chunk) does it all.

    1. Δ and dA_cs of the chunk                          → a scratch row, L2-resident
    2. S_c = Σ_s exp(a_last − a_s) Δ_s x_s B_sᵀ           (in registers)
    3. wait for H_c from chunk c−1; publish H_{c+1} = exp(a_last) H_c + S_c     (ordered)
    4. the outputs, BLOCK_M rows at a time (``_output_rows``: C Bᵀ on chip, as ``outputs``)

Only step 3 is ordered across programs: each publishes through a flag per (b, h, c) with a release
atomic; the next waits with an acquire spin. **The deadlock to avoid**: a program spinning on a
flag whose producer has not been scheduled yet (the GPU does not promise to run programs in grid
order; if every resident program waits on a non-resident one, nothing moves). So programs do not
use ``program_id`` as their work index: each takes a *ticket* from a global atomic counter and maps
ticket → (b, h, c), chunk-major (chunk 0 of every head, then chunk 1, …). Tickets are handed out in
the order programs actually start, and the producer of chunk c−1 holds a smaller ticket, so it is
running or done whenever chunk c waits: no deadlock; and it started b·h tickets earlier, so it has
usually published by then. The passed states live in a buffer (b, c+1, h, p, n) of ``state_dtype``
(float32, or float16 to halve that traffic: chapter 11's precision table). No ``seq_idx`` here.
Deterministic all the same: the ticket and flag atomics decide which program does which chunk
and when, never the order of an addition — every (b, h, c) is computed by the same instructions
whoever runs it, and H_{c+1} = exp(a_last) H_c + S_c is formed in chunk order — so the result
does not depend on the order programs start or finish (no floating-point atomics here).

It holds the chunk state, the entering state and the output tile of one chunk in one program:
255 registers with spills on sm_90, one program per SM — measured slower than the two launches of
``fused.forward`` (bench/NOTES_ssd.md); it stays as chapter 11's lesson in ordering work across
programs. Loads are plain pointer loads (tensor descriptors would have to read states another
program of the same launch has just written).
"""

import torch
import triton
import triton.language as tl

from mambalearn.mamba2.common import (
    check_dot_k,
    delta_of,
    launch_options,
    log_decay,
    p2,
    stages,
)
from mambalearn.triton.common import LOG2E, exp2_ftz

LIMIT = 2**31  # elements of x, z, out it addresses with 32-bit offsets


@triton.jit
def _diag_tile(acc, C_m, a_m, seq_m, offs_m, k0, B_base, x_base, dtc_row, dacs_row, seq_base,
               pid_c, l, p, offs_n, offs_p, stride_Bl, stride_Bn, stride_xl, stride_xp,
               stride_seql, N: tl.constexpr, Q: tl.constexpr, BLOCK_K: tl.constexpr,
               CAUSAL: tl.constexpr, EXP2: tl.constexpr, HAS_SEQ: tl.constexpr,
               EVEN: tl.constexpr):
    """acc += ((C_m B_kᵀ) ∘ exp(a_t − a_s) Δ_s [s ≤ t]) x_k for the BLOCK_K steps from k0.
    ``EVEN``: no tile reaches past l, n or p, so no load needs a mask."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    t_k = pid_c * Q + offs_k
    ok_k = t_k < l
    B_ptrs = B_base + t_k[None, :] * stride_Bl + offs_n[:, None] * stride_Bn
    x_ptrs = x_base + t_k[:, None] * stride_xl + offs_p[None, :] * stride_xp
    if EVEN:
        BkT = tl.load(B_ptrs)  # (BLOCK_N, BLOCK_K)
        xk = tl.load(x_ptrs)  # (BLOCK_K, BLOCK_P)
    else:
        BkT = tl.load(B_ptrs, mask=ok_k[None, :] & (offs_n[:, None] < N), other=0.0)
        xk = tl.load(x_ptrs, mask=ok_k[:, None] & (offs_p[None, :] < p), other=0.0)
    s = tl.dot(C_m, BkT)  # (BLOCK_M, BLOCK_K) float32: C_t · B_s
    a_k = tl.load(dacs_row + offs_k)
    dt_k = tl.load(dtc_row + offs_k)
    if EXP2:  # a_m arrives scaled by log2 e: 2^(a_t log2 e − a_s log2 e), one multiply less
        pm = s * exp2_ftz(a_m[:, None] - (a_k * LOG2E)[None, :]) * dt_k[None, :]
    else:  # chapter 10's exp(a_t − a_s) · Δ_s, the same roundings
        pm = s * exp2_ftz((a_m[:, None] - a_k[None, :]) * LOG2E) * dt_k[None, :]
    if CAUSAL:  # the diagonal block: s ≤ t only (the where also drops any inf above it)
        keep = offs_m[:, None] >= offs_k[None, :]
        if HAS_SEQ:
            seq_k = tl.load(seq_base + t_k * stride_seql, mask=ok_k, other=-2)
            keep = keep & (seq_m[:, None] == seq_k[None, :])
        pm = tl.where(keep, pm, 0.0)
    elif HAS_SEQ:  # earlier steps of another packed sequence do not reach t
        seq_k = tl.load(seq_base + t_k * stride_seql, mask=ok_k, other=-2)
        pm = tl.where(seq_m[:, None] == seq_k[None, :], pm, 0.0)
    return acc + tl.dot(pm.to(xk.dtype), xk)


@triton.jit
def _output_rows(m0, pid_b, pid_c, pid_h, pid_p, H_base,
                 x_ptr, z_ptr, D_ptr, C_ptr, B_ptr, dtc_ptr, dacs_ptr, seq_ptr, out_ptr,
                 l, h, p, nchunks, heads_per_group,
                 x_strides, z_strides, C_strides, B_strides, out_strides,  # (b, l, h or g, p or n)
                 seq_strides, D_strides,  # (b, l), (h, p)
                 N: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr,
                 HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr,
                 EVEN: tl.constexpr, VOLATILE_H: tl.constexpr):
    """Outputs of rows m0 … m0 + BLOCK_M of chunk c for one head (and p-block): the module doc.
    ``H_base`` points at the (p, n) state entering the chunk; ``VOLATILE_H``: it was written by
    another program of this launch (read it past the L1 cache)."""
    stride_xb, stride_xl, stride_xh, stride_xp = x_strides
    stride_zb, stride_zl, stride_zh, stride_zp = z_strides
    stride_Cb, stride_Cl, stride_Cg, stride_Cn = C_strides
    stride_Bb, stride_Bl, stride_Bg, stride_Bn = B_strides
    stride_ob, stride_ol, stride_oh, stride_op = out_strides
    stride_seqb, stride_seql = seq_strides
    stride_Dh, stride_Dp = D_strides
    pid_g = pid_h // heads_per_group
    offs_m = m0 + tl.arange(0, BLOCK_M)  # steps t of the chunk
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    t_m = pid_c * Q + offs_m
    ok_m = t_m < l
    cs = ((pid_b * h + pid_h) * nchunks + pid_c).to(tl.int64) * Q  # this chunk's row of Δ, a
    a_m = tl.load(dacs_ptr + cs + offs_m)  # (BLOCK_M,)
    C_base = C_ptr + pid_b.to(tl.int64) * stride_Cb + pid_g * stride_Cg
    C_ptrs = C_base + t_m[:, None] * stride_Cl + offs_n[None, :] * stride_Cn
    H_ptrs = H_base + offs_p[None, :] * N + offs_n[:, None]
    if EVEN:
        C_m = tl.load(C_ptrs)  # (BLOCK_M, BLOCK_N)
        HT = tl.load(H_ptrs, volatile=VOLATILE_H)  # (BLOCK_N, BLOCK_P): H_cᵀ
    else:
        C_m = tl.load(C_ptrs, mask=ok_m[:, None] & (offs_n[None, :] < N), other=0.0)
        HT = tl.load(H_ptrs, mask=(offs_p[None, :] < p) & (offs_n[:, None] < N), other=0.0,
                     volatile=VOLATILE_H)
    # off-diagonal: exp(a_t) · C_t H_cᵀ, the entering state read out by C
    scale_m = tl.exp(a_m)
    seq_base = seq_ptr + pid_b.to(tl.int64) * stride_seqb
    seq_m = offs_m  # a placeholder without seq_idx
    if HAS_SEQ:  # the entering state belongs to the sequence running before the chunk
        seq_m = tl.load(seq_base + t_m * stride_seql, mask=ok_m, other=-1)
        seq_prev = tl.load(seq_base + (pid_c * Q - 1) * stride_seql, mask=pid_c > 0, other=0)
        scale_m = tl.where(seq_m == seq_prev, scale_m, 0.0)
    acc = tl.dot(C_m, HT.to(C_m.dtype)) * scale_m[:, None]  # (BLOCK_M, BLOCK_P)
    if EXP2:
        a_m = a_m * LOG2E
    # diagonal block, BLOCK_K steps at a time: left of the diagonal unmasked, then on it
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb + pid_h * stride_xh
    B_base = B_ptr + pid_b.to(tl.int64) * stride_Bb + pid_g * stride_Bg
    for k0 in range(0, m0, BLOCK_K):
        acc = _diag_tile(acc, C_m, a_m, seq_m, offs_m, k0, B_base, x_base, dtc_ptr + cs,
                         dacs_ptr + cs, seq_base, pid_c, l, p, offs_n, offs_p, stride_Bl,
                         stride_Bn, stride_xl, stride_xp, stride_seql, N, Q, BLOCK_K,
                         False, EXP2, HAS_SEQ, EVEN)
    for k0 in range(m0, m0 + BLOCK_M, BLOCK_K):
        acc = _diag_tile(acc, C_m, a_m, seq_m, offs_m, k0, B_base, x_base, dtc_ptr + cs,
                         dacs_ptr + cs, seq_base, pid_c, l, p, offs_n, offs_p, stride_Bl,
                         stride_Bn, stride_xl, stride_xp, stride_seql, N, Q, BLOCK_K,
                         True, EXP2, HAS_SEQ, EVEN)
    ok_out = ok_m[:, None] & (offs_p[None, :] < p)
    if HAS_D:  # skip connection D x_t, D per head or per (head, p)
        Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p, other=0.0)
        xm = tl.load(x_base + t_m[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                     mask=ok_out, other=0.0)
        acc += Dv.to(tl.float32)[None, :] * xm.to(tl.float32)
    if HAS_Z:  # gate: y · silu(z)
        zm = tl.load(z_ptr + pid_b.to(tl.int64) * stride_zb + t_m[:, None] * stride_zl
                     + pid_h * stride_zh + offs_p[None, :] * stride_zp,
                     mask=ok_out, other=0.0).to(tl.float32)
        acc *= zm * tl.sigmoid(zm)
    o = (out_ptr + pid_b.to(tl.int64) * stride_ob + t_m[:, None] * stride_ol + pid_h * stride_oh
         + offs_p[None, :] * stride_op)
    tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=ok_out)




def output_tiles(q, p, cfg):
    """(BLOCK_M, BLOCK_K, BLOCK_P) for chunk q and head dim p: ``cfg``'s (a
    ``config.OneLaunch``), within the chunk."""
    bm, bk = min(cfg.block_m, q), min(cfg.block_k, q)
    return bm, check_dot_k(min(bk, bm), "config.one.block_k"), min(cfg.block_p, p2(p))


def is_even(l, q, n, p, block_p):
    """True when no tile reaches past l, n or p (loads need no masks)."""
    return l % q == 0 and n == p2(n, 1) and p % block_p == 0


def d_strides(D):
    """D's strides (h, p) as the kernels read them: (0, 0) without D, p's 0 for one D per head."""
    return (0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else D.stride())


@triton.jit
def _ssd_one_launch_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, out_ptr,
    dtc_ptr, dacs_ptr,  # scratch: Δ and dA_cs, (b, h, c, q) float32
    H_ptr,              # (b, c+1, h, p, n) state_dtype: H_0 … H_c
    flag_ptr,           # (b, h, c) int32, 1 once H_{c+1} is published
    ticket_ptr,         # (1,) int32 work counter
    l, h, p, nchunks, heads_per_group, dt_min, dt_max,
    x_strides,  # (b, l, h, p)
    dt_strides,  # (b, l, h)
    z_strides, C_strides, B_strides, out_strides,  # (b, l, h, p), (b, l, g, n) ×2, (b, l, h, p)
    seq_strides, D_strides,  # (b, l): zeros, no seq_idx here; (h, p)
    N: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    HAS_LIMIT: tl.constexpr, HAS_INIT: tl.constexpr, EVEN: tl.constexpr,
):
    stride_xb, stride_xl, stride_xh, stride_xp = x_strides
    stride_dtb, stride_dtl, stride_dth = dt_strides
    stride_Bb, stride_Bl, stride_Bg, stride_Bn = B_strides
    # the work index from a ticket, not program_id: the deadlock-free order (module doc)
    ticket = tl.atomic_add(ticket_ptr, 1)
    n_bh = tl.num_programs(0) // nchunks
    pid_c, pid_bh = ticket // n_bh, ticket % n_bh  # chunk-major
    pid_b, pid_h = pid_bh // h, pid_bh % h
    offs_p = tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    ok_np = (offs_n[:, None] < N) & (offs_p[None, :] < p)
    np_offs = offs_p[None, :] * N + offs_n[:, None]  # (BLOCK_N, BLOCK_P) inside a (p, n) state
    # 1. Δ and dA_cs of the chunk, into this program's scratch row
    t_q = pid_c * Q + tl.arange(0, Q)
    A = tl.load(A_ptr + pid_h).to(tl.float32)
    bias = 0.0
    if HAS_BIAS:
        bias = tl.load(bias_ptr + pid_h).to(tl.float32)
    dt_base = dt_ptr + pid_b.to(tl.int64) * stride_dtb + pid_h * stride_dth
    d_q = delta_of(tl.load(dt_base + t_q * stride_dtl, mask=t_q < l, other=0.0), bias, dt_min,
                 dt_max, HAS_BIAS, SOFTPLUS, HAS_LIMIT)
    d_q = tl.where(t_q < l, d_q, 0.0)
    da_q = log_decay(d_q, A, t_q < l)  # Δ A floored: A = −∞ gives decays, not NaN
    a_q = tl.cumsum(da_q, axis=0)  # (Q,)
    a_last = tl.sum(tl.where(tl.arange(0, Q) == Q - 1, a_q, 0.0), axis=0)  # a_q's last entry
    cs = (pid_bh * nchunks + pid_c).to(tl.int64) * Q
    tl.store(dtc_ptr + cs + tl.arange(0, Q), d_q)
    tl.store(dacs_ptr + cs + tl.arange(0, Q), a_q)
    tl.debug_barrier()  # every thread's scratch writes are visible to the blocks below
    # 2. the chunk state Sᵀ (n, p), float32 in registers
    x_base = x_ptr + pid_b.to(tl.int64) * stride_xb + pid_h * stride_xh
    B_base = B_ptr + pid_b.to(tl.int64) * stride_Bb + (pid_h // heads_per_group) * stride_Bg
    S = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
    for k0 in range(0, Q, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        t = pid_c * Q + offs_k
        ok = t < l
        w = tl.exp(tl.minimum(a_last - tl.load(dacs_ptr + cs + offs_k), 0.0))
        w *= tl.load(dtc_ptr + cs + offs_k)
        BT = tl.load(B_base + t[None, :] * stride_Bl + offs_n[:, None] * stride_Bn,
                     mask=ok[None, :] & (offs_n[:, None] < N), other=0.0)  # (BLOCK_N, BLOCK_K)
        xk = tl.load(x_base + t[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                     mask=ok[:, None] & (offs_p[None, :] < p), other=0.0)  # (BLOCK_K, BLOCK_P)
        S += tl.dot((BT.to(tl.float32) * w[None, :]).to(xk.dtype), xk)
    # 3. state passing, ordered across programs: wait for H_c, publish H_{c+1}
    H_c = H_ptr + ((pid_b * (nchunks + 1) + pid_c) * h + pid_h).to(tl.int64) * p * N
    H_next = H_c + h * p * N  # slot c + 1 of the same (b, h)
    if pid_c == 0:
        if HAS_INIT:
            H = tl.load(init_ptr + pid_bh.to(tl.int64) * p * N + np_offs, mask=ok_np,
                        other=0.0).to(tl.float32)
        else:
            H = tl.zeros((BLOCK_N, BLOCK_P), dtype=tl.float32)
        tl.store(H_c + np_offs, H.to(H_ptr.dtype.element_ty), mask=ok_np)
    else:
        flag_prev = flag_ptr + pid_bh * nchunks + pid_c - 1
        while tl.atomic_add(flag_prev, 0, sem="acquire") == 0:  # spin until chunk c−1 published
            pass
        tl.debug_barrier()
        H = tl.load(H_c + np_offs, mask=ok_np, other=0.0, volatile=True).to(tl.float32)
    tl.store(H_next + np_offs, (tl.exp(a_last) * H + S).to(H_ptr.dtype.element_ty), mask=ok_np)
    tl.debug_barrier()  # all threads' stores of H_{c+1} happen before the release below
    tl.atomic_xchg(flag_ptr + pid_bh * nchunks + pid_c, 1, sem="release")
    # 4. the outputs, BLOCK_M rows at a time
    for m0 in range(0, Q, BLOCK_M):
        _output_rows(m0, pid_b, pid_c, pid_h, 0, H_c,
                     x_ptr, z_ptr, D_ptr, C_ptr, B_ptr, dtc_ptr, dacs_ptr, x_ptr, out_ptr,
                     l, h, p, nchunks, heads_per_group,
                     x_strides, z_strides, C_strides, B_strides, out_strides, seq_strides,
                     D_strides,
                     N, Q, BLOCK_M, BLOCK_K, BLOCK_P, BLOCK_N, EXP2, HAS_D, HAS_Z, False, EVEN,
                     True)


def ssd_one_launch(x, dt, A, B, C, q, D=None, z=None, dt_bias=None, initial_states=None,
                   dt_softplus=False, dt_limit=(0.0, float("inf")), state_dtype=torch.float32,
                   *, config):
    """The whole forward in one launch (module doc). Returns (out (b, l, h, p), final states
    (b, h, p, n) float32); shapes as ``ssd_fused_forward``, arguments as its checks return them
    (``initial_states`` contiguous), ``q`` ≥ ``FUSED_MIN_CHUNK`` (``forward.fused_forward``
    sends shorter chunks to chapter 10's kernels). ``config``: a ``config.OneLaunch``."""
    cfg = config
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    c = triton.cdiv(l, q)
    if max(x.numel(), b * (c + 1) * h * p * n) >= LIMIT:
        raise ValueError(f"the one-launch SSD kernel addresses x and its states with 32-bit "
                         f"offsets: at most {LIMIT - 1} elements each, got x {x.numel()} and "
                         f"{b * (c + 1) * h * p * n} states; use launches=2")
    BM, BK, _ = output_tiles(q, p, cfg)
    dev = x.device
    out = torch.empty(b, l, h, p, device=dev, dtype=x.dtype)
    dt_c = torch.empty(b, h, c, q, device=dev, dtype=torch.float32)
    dA_cs = torch.empty_like(dt_c)
    H = torch.empty(b, c + 1, h, p, n, device=dev, dtype=state_dtype)
    flags = torch.zeros(b * h * c + 1, device=dev, dtype=torch.int32)  # last: the ticket counter
    init = initial_states
    _ssd_one_launch_kernel[(b * h * c,)](
        x, dt, A, B, C, D if D is not None else A, z if z is not None else x,
        dt_bias if dt_bias is not None else A, init if init is not None else A, out,
        dt_c, dA_cs, H, flags, flags[-1:], l, h, p, c, h // g,
        float(dt_limit[0]), float(dt_limit[1]), x.stride(), dt.stride(),
        z.stride() if z is not None else (0, 0, 0, 0), C.stride(), B.stride(), out.stride(),
        (0, 0), d_strides(D),  # no seq_idx
        N=n, Q=q, BLOCK_M=BM, BLOCK_K=BK, BLOCK_P=p2(p), BLOCK_N=p2(n), EXP2=bool(cfg.exp2),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=dt_bias is not None,
        SOFTPLUS=bool(dt_softplus), HAS_LIMIT=tuple(dt_limit) != (0.0, float("inf")),
        HAS_INIT=init is not None, EVEN=is_even(l, q, n, p, p2(p)), num_warps=cfg.num_warps,
        num_stages=stages(cfg.num_stages), **launch_options(cfg.maxnreg))
    return out, H[:, c].float()
