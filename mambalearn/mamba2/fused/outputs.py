"""Chunk outputs in one kernel (chapter 11): chapter 10's stages 2 and 5, C Bᵀ never in memory.

Given the state H_c entering each chunk and a = dA_cs, the outputs of chunk c are

    y_t = exp(a_t) C_t H_cᵀ                                   (the state read out: off-diagonal)
        + Σ_{s ≤ t} (C_t · B_s) exp(a_t − a_s) Δ_s x_s        (inside the chunk: diagonal block)
        + D x_t,        out = y · silu(z)

Chapter 10 forms C Bᵀ for every chunk in a kernel of its own and writes it (float32, q × q per
chunk) for the chunk scan to read back. Here each program computes its BLOCK_M rows of it on the
fly, BLOCK_K columns at a time, as attention kernels compute Q Kᵀ: the tile S = C_m B_kᵀ comes out
of the tensor cores in registers, is turned into P = S ∘ decay ∘ Δ there, and goes into the next
product P x_k as a register operand. The price: C Bᵀ, which depends on the group and not on the
head, is recomputed by every head of a group — tensor-core work, idle here otherwise.

Tiles arrive through tensor descriptors (Hopper's bulk copy engine, TMA): one instruction moves
a tile into shared memory and zero-fills what lies past the tensor's edge, so there are no
per-element addresses or masks to compute. That is most of what a program spends outside its
arithmetic (bench/NOTES_ssd.md counts it in the SASS); it needs 16-byte aligned rows
(``tma_ok``). Blocks strictly left of the diagonal need no causal mask; only the diagonal blocks
mask s > t. The decay is one MUFU.EX2 per element (``common.exp2_ftz``); ``EXP2``: from
log2-scaled a, one multiply less (rounds a little differently from chapter 10's exp(a_t − a_s)).
When BLOCK_K = BLOCK_M the diagonal block is one tile, and its x tile is x_m: the D x term reuses
it.

``config.Outputs.rows``: row blocks per program — 1 (each its own program, the default), or None
(the whole chunk in one program, its setup and Hᵀ load shared): measured 25 % slower, its 211
registers leave two programs an SM instead of three (bench/NOTES_ssd.md).
"""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from mambalearn.mamba2.common import (
    check_dot_k,
    launch_options,
    p2,
    stages,
)
from mambalearn.triton.common import GRID_Z, LOG2E, exp2_ftz


@triton.jit
def _block(acc, C_m, a_m, seq_m, offs_m, k0, t0, pid_b, pid_g, pid_h, B_desc, x_desc,
           dtc_row, dacs_row, seq_base, l, stride_seql,
           BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
           CAUSAL: tl.constexpr, EXP2: tl.constexpr, HAS_SEQ: tl.constexpr):
    """acc += ((C_m B_kᵀ) ∘ exp(a_t − a_s) Δ_s [s ≤ t]) x_k for the BLOCK_K steps from k0.
    Returns (acc, x_k): the x tile, which the diagonal block shares with the D x term."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    B_k = B_desc.load([pid_b, t0 + k0, pid_g, 0]).reshape(BLOCK_K, BLOCK_N)
    s = tl.dot(C_m, B_k.T)  # (BLOCK_M, BLOCK_K) float32: C_t · B_s
    a_k = tl.load(dacs_row + offs_k)
    dt_k = tl.load(dtc_row + offs_k)
    if EXP2:  # a_m arrives scaled by log2 e
        pm = s * exp2_ftz(a_m[:, None] - (a_k * LOG2E)[None, :]) * dt_k[None, :]
    else:  # chapter 10's exp(a_t − a_s) · Δ_s
        pm = s * exp2_ftz((a_m[:, None] - a_k[None, :]) * LOG2E) * dt_k[None, :]
    if CAUSAL or HAS_SEQ:
        keep = offs_m[:, None] >= offs_k[None, :]
        if HAS_SEQ:  # and inside one packed sequence
            seq_k = tl.load(seq_base + (t0 + offs_k) * stride_seql, mask=t0 + offs_k < l,
                            other=-2)
            keep = keep & (seq_m[:, None] == seq_k[None, :])
        pm = tl.where(keep, pm, 0.0)  # (the where also drops any inf above the diagonal)
    x_k = x_desc.load([pid_b, t0 + k0, pid_h, 0]).reshape(BLOCK_K, BLOCK_P)
    return acc + tl.dot(pm.to(x_k.dtype), x_k), x_k


@triton.jit(do_not_specialize=["l", "nchunks", "bc0"])
def _chunk_outputs_kernel(
    C_desc, B_desc, x_desc, xm_desc, z_desc, out_desc,  # (b, l, g, n), (b, l, h, p) descriptors
    H_desc,             # (b·c·h, p, n): the state entering each chunk
    dtc_ptr, dacs_ptr,  # Δ, dA_cs (b, h, c, q) float32
    D_ptr, seq_ptr,     # D (h,) or (h, p); seq_idx (b, l)
    l, h, p, nchunks, heads_per_group, stride_Dh, stride_Dp, stride_seqb, stride_seql,
    bc0,                # the launch's first (batch, chunk): grid axis 2 stops at 65 535
    Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
    LOOP: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr,
    HAS_D: tl.constexpr, D_PER_HEAD: tl.constexpr, HAS_Z: tl.constexpr, HAS_SEQ: tl.constexpr,
):
    # grid (row-block groups, heads, b · c): a program does ROWS row blocks of BLOCK_M rows of
    # one chunk (ROWS = Q // BLOCK_M: the whole chunk, one setup and one Hᵀ load shared by all);
    # the longest groups first; heads next, so that programs running together share the chunk's
    # B and C (a 3-D grid: no divisions to split a program id)
    N_MB: tl.constexpr = Q // BLOCK_M
    if ROWS == N_MB:
        first = 0  # a compile-time constant: the row loop below is straight-line code
    else:
        first = (N_MB // ROWS - 1 - tl.program_id(0)) * ROWS
    pid_h = tl.program_id(1)
    pid_b, pid_c = (bc0 + tl.program_id(2)) // nchunks, (bc0 + tl.program_id(2)) % nchunks
    pid_g = pid_h // heads_per_group
    t0 = pid_c * Q  # the chunk's first step
    cs = ((pid_b * h + pid_h) * nchunks + pid_c).to(tl.int64) * Q  # its row of Δ and a
    H_row = (pid_b * nchunks + pid_c) * h + pid_h  # the chunk's entering state in H
    seq_base = seq_ptr + pid_b.to(tl.int64) * stride_seqb
    seq_prev = 0
    if HAS_SEQ:  # the entering state belongs to the sequence running before the chunk
        seq_prev = tl.load(seq_base + (t0 - 1) * stride_seql, mask=pid_c > 0, other=0)
    for r in tl.static_range(ROWS):
        m0 = (first + r) * BLOCK_M
        offs_m = m0 + tl.arange(0, BLOCK_M)  # steps t of the chunk
        a_m = tl.load(dacs_ptr + cs + offs_m)  # (BLOCK_M,)
        C_m = C_desc.load([pid_b, t0 + m0, pid_g, 0]).reshape(BLOCK_M, BLOCK_N)
        # off-diagonal: exp(a_t) · C_t H_cᵀ, the entering state read out by C
        scale_m = tl.exp(a_m)
        seq_m = offs_m  # a placeholder without seq_idx
        if HAS_SEQ:
            seq_m = tl.load(seq_base + (t0 + offs_m) * stride_seql, mask=t0 + offs_m < l,
                            other=-1)
            scale_m = tl.where(seq_m == seq_prev, scale_m, 0.0)
        H_c = H_desc.load([H_row, 0, 0]).reshape(BLOCK_P, BLOCK_N)  # (each row block loads it:
        acc = tl.dot(C_m, H_c.to(C_m.dtype).T) * scale_m[:, None]  # L2, and no registers held)
        if EXP2:
            a_m = a_m * LOG2E
        # the diagonal block's columns s ≤ t, BLOCK_K steps at a time
        if LOOP:  # one pipelined loop (the next tiles' loads in flight), masked on every trip
            x_m = tl.zeros((BLOCK_K, BLOCK_P), dtype=x_desc.dtype)
            for k0 in range(0, m0 + BLOCK_M, BLOCK_K):
                acc, x_m = _block(acc, C_m, a_m, seq_m, offs_m, k0, t0, pid_b, pid_g, pid_h,
                                  B_desc, x_desc, dtc_ptr + cs, dacs_ptr + cs, seq_base, l,
                                  stride_seql, BLOCK_K, BLOCK_N, BLOCK_P, True, EXP2, HAS_SEQ)
            if BLOCK_K != BLOCK_M and HAS_D:  # the last trip's x is x_m only if the tiles match
                x_m = xm_desc.load([pid_b, t0 + m0, pid_h, 0]).reshape(BLOCK_M, BLOCK_P)
        else:  # left of the diagonal unmasked, then the diagonal masked
            if ROWS == N_MB:  # m0 is a constant: unrolled
                for kb in tl.static_range(r * BLOCK_M // BLOCK_K):
                    acc, x_k = _block(acc, C_m, a_m, seq_m, offs_m, kb * BLOCK_K, t0, pid_b,
                                      pid_g, pid_h, B_desc, x_desc, dtc_ptr + cs, dacs_ptr + cs,
                                      seq_base, l, stride_seql, BLOCK_K, BLOCK_N, BLOCK_P, False,
                                      EXP2, HAS_SEQ)
            else:
                for k0 in range(0, m0, BLOCK_K):
                    acc, x_k = _block(acc, C_m, a_m, seq_m, offs_m, k0, t0, pid_b, pid_g, pid_h,
                                      B_desc, x_desc, dtc_ptr + cs, dacs_ptr + cs, seq_base, l,
                                      stride_seql, BLOCK_K, BLOCK_N, BLOCK_P, False, EXP2,
                                      HAS_SEQ)
            if BLOCK_K == BLOCK_M:  # one diagonal tile; its x tile is x_m, the D x term's
                acc, x_m = _block(acc, C_m, a_m, seq_m, offs_m, m0, t0, pid_b, pid_g, pid_h,
                                  B_desc, x_desc, dtc_ptr + cs, dacs_ptr + cs, seq_base, l,
                                  stride_seql, BLOCK_K, BLOCK_N, BLOCK_P, True, EXP2, HAS_SEQ)
            else:
                for k0 in range(m0, m0 + BLOCK_M, BLOCK_K):
                    acc, x_k = _block(acc, C_m, a_m, seq_m, offs_m, k0, t0, pid_b, pid_g, pid_h,
                                      B_desc, x_desc, dtc_ptr + cs, dacs_ptr + cs, seq_base, l,
                                      stride_seql, BLOCK_K, BLOCK_N, BLOCK_P, True, EXP2,
                                      HAS_SEQ)
                if HAS_D:
                    x_m = xm_desc.load([pid_b, t0 + m0, pid_h, 0]).reshape(BLOCK_M, BLOCK_P)
        if HAS_D:  # skip connection D x_t, D per head (one scalar) or per (head, p)
            if D_PER_HEAD:
                acc += tl.load(D_ptr + pid_h * stride_Dh).to(tl.float32) * x_m.to(tl.float32)
            else:
                offs_p = tl.arange(0, BLOCK_P)
                Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p,
                             other=0.0)
                acc += Dv.to(tl.float32)[None, :] * x_m.to(tl.float32)
        if HAS_Z:  # gate: y · silu(z)
            z_m = z_desc.load([pid_b, t0 + m0, pid_h, 0]).reshape(BLOCK_M, BLOCK_P)
            z_m = z_m.to(tl.float32)
            acc *= z_m * tl.sigmoid(z_m)
        out_desc.store([pid_b, t0 + m0, pid_h, 0],
                       acc.to(out_desc.dtype).reshape(1, BLOCK_M, 1, BLOCK_P))


def tma_ok(*tensors):
    """True when every tensor can back a tensor descriptor: last dim contiguous, the other
    strides and the base 16-byte aligned (TMA's rule)."""
    for t in tensors:
        if t is None:
            continue
        if t.stride(-1) != 1 or any(s * t.element_size() % 16 for s in t.stride()[:-1]):
            return False
        if t.device.type != "meta" and t.data_ptr() % 16:
            return False
    return True


def chunk_outputs(x, C, B, dt_c, dA_cs, H, D=None, z=None, seq_idx=None, *, config):
    """out = (exp(a) ∘ C Hᵀ + (C Bᵀ ∘ L) (Δ x) + D x) · silu(z) per chunk, C Bᵀ formed on chip.

    Shapes: x, z (b, l, h, p); C, B (b, l, g, n); Δ, dA_cs (b, h, c, q) float32 (as
    ``forward.chunk_cumsum`` returns them); H (b, c, h, p, n) the state entering each chunk; D
    (h,) or (h, p); seq_idx (b, l) → out (b, l, h, p) in x's dtype. x, z, B, C and H must pass
    ``tma_ok``; q ≥ ``FUSED_MIN_CHUNK`` (``forward.fused_forward`` sends shorter chunks to
    chapter 10's kernels). ``config``: a ``config.Outputs``.
    """
    b, l, h, p = x.shape
    g, n = C.shape[2], C.shape[3]
    c, q = dA_cs.shape[2], dA_cs.shape[3]
    if not tma_ok(x, z, B, C, H):
        raise ValueError("chunk_outputs needs x, z, B, C, H with 16-byte aligned rows "
                         "(contiguous last dim): use forward.chunk_scan")
    cfg = config
    BM = min(cfg.block_m, q)
    BK = check_dot_k(min(cfg.block_k, BM), "config.outputs.block_k")  # P x's K: the steps
    # n is the K of C Hᵀ and C Bᵀ: the tensor cores take K ≥ 16 (a tile past n reads TMA's zeros)
    BP, BN = p2(p, 8), p2(n, 16)
    rows = min(cfg.rows or q // BM, q // BM)  # row blocks per program
    if (q // BM) % rows:
        raise ValueError(f"config.outputs.rows = {rows} must divide the {q // BM} row blocks "
                         f"of a chunk")
    out = torch.empty(b, l, h, p, device=x.device, dtype=x.dtype)
    desc = lambda t, m, k: TensorDescriptor.from_tensor(t, [1, m, 1, k])
    Dst = (0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else D.stride())
    for bc0 in range(0, b * c, GRID_Z):  # (batch, chunk) pairs in slabs of grid axis 2's limit
        _chunk_outputs_kernel[(q // BM // rows, h, min(GRID_Z, b * c - bc0))](
            desc(C, BM, BN), desc(B, BK, BN), desc(x, BK, BP), desc(x, BM, BP),
            desc(z, BM, BP) if z is not None else None, desc(out, BM, BP),
            TensorDescriptor.from_tensor(H.view(b * c * h, p, n), [1, BP, BN]),
            dt_c, dA_cs, D if D is not None else dt_c, seq_idx if seq_idx is not None else dt_c,
            l, h, p, c, h // g, *Dst, *(seq_idx.stride() if seq_idx is not None else (0, 0)), bc0,
            Q=q, BLOCK_M=BM, BLOCK_K=BK, ROWS=rows, LOOP=bool(cfg.loop), BLOCK_P=BP, BLOCK_N=BN,
            EXP2=bool(cfg.exp2),
            HAS_D=D is not None, D_PER_HEAD=D is not None and D.ndim == 1, HAS_Z=z is not None,
            HAS_SEQ=seq_idx is not None, num_warps=cfg.num_warps,
            num_stages=stages(cfg.num_stages), **launch_options(cfg.maxnreg))
    return out
