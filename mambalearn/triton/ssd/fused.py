"""The whole SSD forward in one launch (chapter 11).

One program per (batch, head, chunk) does all five stages of ``mambalearn.triton.ssd`` for its chunk:

    1. Δ and dA_cs of the chunk (chunk cumsum)            → a small scratch row, L2-resident
    2. S_c = Σ_s exp(dA_end − dA_s) Δ_s x_s B_sᵀ          (chunk state, in registers)
    3. wait for H_c from chunk c−1; H_{c+1} = a_c H_c + S_c; publish H_{c+1}     (state passing)
    4. y = (C Bᵀ ∘ L)(Δx) on the diagonal block (bmm computed on the fly) + exp(dA_cs) C H_c

Only step 3 is ordered across programs. Programs publish through a flag per (b, h, c) with a
release atomic and wait with an acquire spin. **The deadlock to avoid**: a program spinning on a
flag whose producer has not been scheduled yet (the GPU does not promise to run programs in grid
order; if every resident program waits on a non-resident one, nothing moves). So programs do not
use ``program_id`` as their work index: each takes a *ticket* from a global atomic counter and
maps ticket → (b, h, c). Tickets are handed out in the order programs actually start, and the
producer of chunk c−1 always has a smaller ticket, so it is already running or done whenever
chunk c waits: no deadlock. Which order of (b, h, c) the tickets follow decides how long
programs wait:

    chain-major (c fastest)   tickets 0…c−1 are the chunks of one (b, h): the whole chain of one
                              head is resident at once and its programs spin one after another,
                              each holding an SM slot while the states ripple through c links.
    chunk-major (c slowest)   tickets 0…bh−1 are chunk 0 of every head, then chunk 1 of every
                              head, …: the producer of chunk c−1 started b·h tickets earlier and
                              has usually published before chunk c asks. (The default.)

The wait comes after step 2, so a producer that is late costs only the short step 3 per chunk.

C Bᵀ depends on the chunk and the group, not the head: computed in step 4 it is recomputed by every
head of a group (80 times for Mamba-2 2.7B's 80 heads in one group). With ``share_cb=True`` the
first b·c·g tickets go to *producer* programs that compute each chunk's C Bᵀ once, store it
(float32, L2-sized: b·c·g·q² numbers) and publish a flag; the head programs wait for their chunk's
flag before step 4 and read C Bᵀ instead of computing it. Producers hold the smallest tickets, so
the same argument rules out a deadlock.

The passed states H_c live in a buffer (b, h, c+1, p, n) of ``state_dtype`` (float32 or float16:
chapter 11 measures the precision cost of the smaller one). Not supported here: ``seq_idx``
(use the unfused path). Backward: ``mamba_chunk_scan_combined(..., fused=True)`` reuses
chapter 10's backward.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device, ssd
from mambalearn.triton.ssd.forward import _p2

_INTERP = device.interpreted()


@triton.jit
def _diag(acc, k0, C_m, B_base, x_base, dA_row, dt_row, dA_m, offs_m, offs_n, offs_p, pid_c, l,
          p, n, stride_Bl, stride_Bn, stride_xl, stride_xp, CB_row,
          Q: tl.constexpr, BLOCK_K: tl.constexpr, SHARE_CB: tl.constexpr):
    """acc += ((C_m B_kᵀ) ∘ exp(dA_t − dA_s) Δ_s, s ≤ t) @ x_k — bmm fused into the chunk scan."""
    offs_k = k0 + tl.arange(0, BLOCK_K)
    t_k = pid_c * Q + offs_k
    ok_k = (offs_k < Q) & (t_k < l)
    if SHARE_CB:  # this block of C Bᵀ, computed once per (b, c, g) by a producer program
        cb = tl.load(CB_row + offs_m[:, None] * Q + offs_k[None, :], volatile=True)  # (M, K) f32
    else:  # computed here, for this head alone, and never written to HBM
        BkT = tl.load(B_base + t_k[None, :] * stride_Bl + offs_n[:, None] * stride_Bn,
                      mask=ok_k[None, :] & (offs_n[:, None] < n), other=0.0)  # (N, K)
        cb = tl.dot(C_m, BkT)  # (M, K) f32
    dA_k = tl.load(dA_row + offs_k, mask=offs_k < Q, other=0.0)
    dt_k = tl.load(dt_row + offs_k, mask=offs_k < Q, other=0.0)
    decay = tl.exp(tl.minimum(dA_m[:, None] - dA_k[None, :], 0.0))
    cb = tl.where(offs_m[:, None] >= offs_k[None, :], cb * decay * dt_k[None, :], 0.0)
    xk = tl.load(x_base + t_k[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                 mask=ok_k[:, None] & (offs_p[None, :] < p), other=0.0)  # (K, P)
    return acc + tl.dot(cb.to(xk.dtype), xk)


@triton.jit
def _cb_producer(C_ptr, B_ptr, CB_ptr, cbflag_ptr, pid, l, n, g, nchunks,
                 stride_Bb, stride_Bl, stride_Bg, stride_Bn,
                 stride_Cb, stride_Cl, stride_Cg, stride_Cn,
                 Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, INTERP: tl.constexpr):
    """CB[b, c, g] = C Bᵀ of one chunk (t ≥ s blocks), then publish it: flag (b, c, g) = 1."""
    pid_g = pid % g
    pid_c = (pid // g) % nchunks
    pid_b = pid // (g * nchunks)
    offs_n = tl.arange(0, BLOCK_N)
    C_base = C_ptr + pid_b * stride_Cb + pid_g * stride_Cg
    B_base = B_ptr + pid_b * stride_Bb + pid_g * stride_Bg
    for m0 in range(0, Q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        t_m = pid_c * Q + offs_m
        C_m = tl.load(C_base + t_m[:, None] * stride_Cl + offs_n[None, :] * stride_Cn,
                      mask=(t_m[:, None] < l) & (offs_n[None, :] < n), other=0.0)  # (M, N)
        k_end = Q if INTERP else m0 + BLOCK_M  # causal: blocks up to the diagonal
        for k0 in range(0, k_end, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            t_k = pid_c * Q + offs_k
            BkT = tl.load(B_base + t_k[None, :] * stride_Bl + offs_n[:, None] * stride_Bn,
                          mask=(t_k[None, :] < l) & (offs_n[:, None] < n), other=0.0)  # (N, K)
            tl.store(CB_ptr + (pid * Q + offs_m[:, None]) * Q + offs_k[None, :],
                     tl.dot(C_m, BkT))
    tl.debug_barrier()  # every thread's CB stores happen before the release below
    tl.atomic_xchg(cbflag_ptr + pid, 1, sem="release")


@triton.jit
def _ssd_fused_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, out_ptr,
    scratch_ptr,        # (b, h, c, 2, q) f32: Δ and dA_cs of each chunk
    H_ptr,              # (b, h, c+1, p, n) state_dtype: H_0 … H_c
    flag_ptr,           # (b, h, c) int32, 1 once H_{c+1} is published
    ticket_ptr,         # (1,) int32 work counter
    CB_ptr,             # SHARE_CB: (b, c, g, q, q) f32, C Bᵀ per chunk and group
    cbflag_ptr,         # SHARE_CB: (b, c, g) int32, 1 once CB[b, c, g] is published
    l, h, p, n, nchunks, n_bh, g, heads_per_group, dt_min, dt_max,
    stride_xb, stride_xl, stride_xh, stride_xp,
    stride_dtb, stride_dtl, stride_dth,
    stride_Bb, stride_Bl, stride_Bg, stride_Bn,
    stride_Cb, stride_Cl, stride_Cg, stride_Cn,
    stride_zb, stride_zl, stride_zh, stride_zp,
    stride_ob, stride_ol, stride_oh, stride_op,
    stride_Dh, stride_Dp,
    Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr, INTERP: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_LIMIT: tl.constexpr, HAS_INIT: tl.constexpr,
    CHUNK_MAJOR: tl.constexpr, SHARE_CB: tl.constexpr,
):
    # Work index from a ticket, not program_id: the deadlock-free order (module doc).
    ticket = tl.atomic_add(ticket_ptr, 1)
    if SHARE_CB:  # the first b·c·g tickets compute C Bᵀ for everyone, then leave
        n_cb = tl.num_programs(0) - n_bh * tl.cdiv(p, BLOCK_P) * nchunks
        if ticket < n_cb:
            _cb_producer(C_ptr, B_ptr, CB_ptr, cbflag_ptr, ticket, l, n, g, nchunks,
                         stride_Bb, stride_Bl, stride_Bg, stride_Bn,
                         stride_Cb, stride_Cl, stride_Cg, stride_Cn,
                         Q, BLOCK_M, BLOCK_K, BLOCK_N, INTERP)
            return
        ticket -= n_cb
    n_pb = tl.cdiv(p, BLOCK_P)  # p is split over programs; each owns a (BLOCK_P, n) slice of H
    if CHUNK_MAJOR:  # chunk c of every (b, h, p-block), then chunk c + 1, …
        pid_c = ticket // (n_bh * n_pb)
        pid_pb = ticket % n_pb
        pid_bh = (ticket // n_pb) % n_bh
    else:  # every chunk of one (b, h, p-block), then the next
        pid_c = ticket % nchunks
        pid_pb = (ticket // nchunks) % n_pb
        pid_bh = ticket // (nchunks * n_pb)
    pid_h = pid_bh % h
    pid_b = pid_bh // h
    pid_g = pid_h // heads_per_group
    offs_q = tl.arange(0, Q)
    offs_p = pid_pb * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    t_q = pid_c * Q + offs_q
    ok_q = t_q < l
    # 1. chunk cumsum: Δ = softplus(dt + bias), dA_cs = cumsum(Δ A)
    dt = tl.load(dt_ptr + pid_b * stride_dtb + t_q * stride_dtl + pid_h * stride_dth,
                 mask=ok_q, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + pid_h).to(tl.float32)
    if SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    if HAS_LIMIT:
        dt = tl.minimum(tl.maximum(dt, dt_min), dt_max)
    dt = tl.where(ok_q, dt, 0.0)
    A = tl.load(A_ptr + pid_h).to(tl.float32)
    dA_cs = tl.cumsum(dt * A, axis=0)  # (Q,)
    dA_last = tl.sum(dt * A, axis=0)
    # Δ at row[0:Q], dA_cs at row[Q:2Q] of this program's scratch row
    row = scratch_ptr + ((pid_bh * n_pb + pid_pb) * nchunks + pid_c) * 2 * Q
    tl.store(row + offs_q, dt)
    tl.store(row + Q + offs_q, dA_cs)
    tl.debug_barrier()  # every thread's scratch writes are visible to the block below
    # 2. chunk state S (P, N), fp32 in registers
    x_base = x_ptr + pid_b * stride_xb + pid_h * stride_xh
    B_base = B_ptr + pid_b * stride_Bb + pid_g * stride_Bg
    S = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)  # Δ/dA_cs re-read from scratch below
    for k0 in range(0, Q, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        t_k = pid_c * Q + offs_k
        ok_k = t_k < l
        xT = tl.load(x_base + t_k[None, :] * stride_xl + offs_p[:, None] * stride_xp,
                     mask=ok_k[None, :] & (offs_p[:, None] < p), other=0.0)  # (P, K)
        Bk = tl.load(B_base + t_k[:, None] * stride_Bl + offs_n[None, :] * stride_Bn,
                     mask=ok_k[:, None] & (offs_n[None, :] < n), other=0.0)  # (K, N)
        w = tl.exp(dA_last - tl.load(row + Q + offs_k)) * tl.load(row + offs_k)
        S += tl.dot(xT, (Bk.to(tl.float32) * w[:, None]).to(xT.dtype))
    # 3. state passing, ordered across programs: wait for H_c, publish H_{c+1}
    offs_pn = offs_p[:, None] * n + offs_n[None, :]
    ok_pn = (offs_p[:, None] < p) & (offs_n[None, :] < n)
    H_row = H_ptr + (pid_bh * (nchunks + 1) + pid_c) * p * n  # H_c; H_{c+1} follows
    if pid_c == 0:
        if HAS_INIT:
            H = tl.load(init_ptr + pid_bh * p * n + offs_pn, mask=ok_pn, other=0.0).to(tl.float32)
        else:
            H = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
        tl.store(H_row + offs_pn, H.to(H_ptr.dtype.element_ty), mask=ok_pn)
    else:
        flag_prev = flag_ptr + (pid_bh * n_pb + pid_pb) * nchunks + pid_c - 1
        while tl.atomic_add(flag_prev, 0, sem="acquire") == 0:  # spin until chunk c−1 published
            pass
        tl.debug_barrier()
        H = tl.load(H_row + offs_pn, mask=ok_pn, other=0.0, volatile=True).to(tl.float32)
    H_next = tl.exp(dA_last) * H + S
    tl.store(H_row + p * n + offs_pn, H_next.to(H_ptr.dtype.element_ty), mask=ok_pn)
    tl.debug_barrier()  # all threads' stores of H_{c+1} happen before the release below
    tl.atomic_xchg(flag_ptr + (pid_bh * n_pb + pid_pb) * nchunks + pid_c, 1, sem="release")
    # 4. outputs, BLOCK_M rows at a time: off-diagonal C H_cᵀ plus the diagonal block
    C_base = C_ptr + pid_b * stride_Cb + pid_g * stride_Cg
    HT = tl.trans(H.to(x_ptr.dtype.element_ty))  # (N, P): the state entering this chunk
    CB_row = CB_ptr + ((pid_b * nchunks + pid_c) * g + pid_g) * Q * Q
    if SHARE_CB:  # wait for this chunk's C Bᵀ (its producer holds a smaller ticket)
        cbflag = cbflag_ptr + (pid_b * nchunks + pid_c) * g + pid_g
        while tl.atomic_add(cbflag, 0, sem="acquire") == 0:
            pass
        tl.debug_barrier()
    for m0 in range(0, Q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        t_m = pid_c * Q + offs_m
        ok_m = t_m < l
        C_m = tl.load(C_base + t_m[:, None] * stride_Cl + offs_n[None, :] * stride_Cn,
                      mask=ok_m[:, None] & (offs_n[None, :] < n), other=0.0)  # (M, N)
        dA_m = tl.load(row + Q + offs_m)
        acc = tl.dot(C_m, HT) * tl.exp(dA_m)[:, None]  # (M, P)
        if INTERP:
            for k0 in range(0, Q, BLOCK_K):
                acc = _diag(acc, k0, C_m, B_base, x_base, row + Q, row, dA_m, offs_m, offs_n,
                            offs_p, pid_c, l, p, n, stride_Bl, stride_Bn, stride_xl, stride_xp,
                            CB_row, Q, BLOCK_K, SHARE_CB)
        else:  # causal: only k blocks up to this row block
            for k0 in range(0, m0 + BLOCK_M, BLOCK_K):
                acc = _diag(acc, k0, C_m, B_base, x_base, row + Q, row, dA_m, offs_m, offs_n,
                            offs_p, pid_c, l, p, n, stride_Bl, stride_Bn, stride_xl, stride_xp,
                            CB_row, Q, BLOCK_K, SHARE_CB)
        ok_out = ok_m[:, None] & (offs_p[None, :] < p)
        if HAS_D:
            Dv = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=offs_p < p, other=0.0)
            xm = tl.load(x_base + t_m[:, None] * stride_xl + offs_p[None, :] * stride_xp,
                         mask=ok_out, other=0.0)
            acc += Dv.to(tl.float32)[None, :] * xm.to(tl.float32)
        if HAS_Z:
            zm = tl.load(z_ptr + pid_b * stride_zb + t_m[:, None] * stride_zl + pid_h * stride_zh
                         + offs_p[None, :] * stride_zp, mask=ok_out, other=0.0).to(tl.float32)
            acc *= zm * tl.sigmoid(zm)
        o = (out_ptr + pid_b * stride_ob + t_m[:, None] * stride_ol + pid_h * stride_oh
             + offs_p[None, :] * stride_op)
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=ok_out)


def ssd_fused_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                      initial_states=None, seq_idx=None, dt_softplus=False,
                      dt_limit=(0.0, float("inf")), state_dtype=torch.float32,
                      block_m=64, block_k=64, block_p=64, num_warps=4, num_stages=2,
                      chunk_major=True, share_cb=False):
    """Single-launch SSD forward. Returns (out (b, l, h, p), final states (b, h, p, n) float32).

    Same formula and layouts as ``mambalearn.triton.ssd.mamba_chunk_scan_combined``.
    ``chunk_major``: the order tickets take the work in (module doc); False = chain-major.
    ``share_cb``: C Bᵀ computed once per (b, chunk, group) by producer programs instead of once
    per head (module doc).
    """
    if seq_idx is not None:
        raise ValueError("the fused SSD kernel does not support seq_idx; use fused=False")
    b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C)
    ssd.check_extras(b, l, h, p, n, D, z, dt_bias, initial_states, None)
    if state_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"state_dtype must be float32, float16 or bfloat16, got {state_dtype}")
    q, c = chunk_size, triton.cdiv(l, chunk_size)
    if _INTERP:
        block_m = block_k = 16
    block_m, block_k = min(block_m, q), min(block_k, q)
    dev = x.device
    out = torch.empty(b, l, h, p, device=dev, dtype=x.dtype)
    block_p = min(_p2(p), block_p)
    n_pb = triton.cdiv(p, block_p)
    scratch = torch.empty(b, h, n_pb, c, 2, q, device=dev, dtype=torch.float32)
    H = torch.empty(b, h, c + 1, p, n, device=dev, dtype=state_dtype)
    flags = torch.zeros(b * h * n_pb * c + 1, device=dev, dtype=torch.int32)  # last slot: the ticket counter
    n_cb = b * c * g if share_cb else 0
    CB = torch.empty(max(n_cb, 1), q, q, device=dev, dtype=torch.float32)  # (b, c, g, q, q)
    cbflags = torch.zeros(max(n_cb, 1), device=dev, dtype=torch.int32)
    init = initial_states.contiguous() if initial_states is not None else None
    Dst = (0, 0) if D is None else ((D.stride(0), 0) if D.ndim == 1 else tuple(D.stride()))
    has_limit = tuple(dt_limit) != (0.0, float("inf"))
    _ssd_fused_kernel[(n_cb + b * h * n_pb * c,)](
        x, dt, A, B, C, D if D is not None else A, z if z is not None else x,
        dt_bias if dt_bias is not None else A, init if init is not None else A, out, scratch, H,
        flags, flags[-1:], CB, cbflags, l, h, p, n, c, b * h, g, h // g, float(dt_limit[0]),
        float(dt_limit[1]),
        *x.stride(), *dt.stride(), *B.stride(), *C.stride(),
        *(z.stride() if z is not None else (0, 0, 0, 0)), *out.stride(), *Dst,
        Q=q, BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_P=block_p, BLOCK_N=_p2(n), INTERP=_INTERP,
        HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=dt_bias is not None,
        SOFTPLUS=dt_softplus, HAS_LIMIT=has_limit, HAS_INIT=init is not None,
        CHUNK_MAJOR=chunk_major, SHARE_CB=share_cb, num_warps=num_warps, num_stages=1 if _INTERP else num_stages)
    return out, H[:, :, c].float()
