"""The fused SSD forward (chapter 11): chapter 10's five kernels in two launches, or in one.

``launches=2`` (the default): ``states.chunk_states`` walks the chunks of each (batch, head) with
the state in float32 registers (chunk cumsum, chunk state and state passing in one kernel), then
``outputs.chunk_outputs`` computes every chunk's outputs in parallel with C Bᵀ formed on chip
(bmm and chunk scan in one kernel). What still crosses memory between them is the state entering
each chunk, in x's dtype, and Δ, dA_cs: about a quarter of what chapter 10 moves between its stages.

``launches=1``: one program per (batch, head, chunk) does all of it for its chunk:

    1. Δ and dA_cs of the chunk                          → a scratch row, L2-resident
    2. S_c = Σ_s exp(a_last − a_s) Δ_s x_s B_sᵀ           (in registers)
    3. wait for H_c from chunk c−1; publish H_{c+1} = exp(a_last) H_c + S_c     (ordered)
    4. the outputs, BLOCK_M rows at a time, as ``outputs._output_rows``

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

Rounding: both designs round where chapter 10 rounds (w B_s and the decayed C Bᵀ tile to x's
dtype before their products, the entering state to x's dtype before C Hᵀ), so with a float32
state they agree with ``forward.ssd_forward`` to float32 summation order.
"""

import torch
import triton
import triton.language as tl

from mambalearn import ssd
from mambalearn.triton.ssd import outputs, states
from mambalearn.triton.ssd.common import INTERP, _delta, launch_options, p2
from mambalearn.triton.ssd.forward import chunk_cumsum
from mambalearn.triton.ssd.outputs import _output_rows

# launch settings of each design's kernels (tiles, warps, pipeline stages); measured in
# bench/NOTES_ssd.md. ``ssd_fused_forward(config=...)`` overrides any of them.
CONFIG = dict(
    states=dict(states.CONFIG),
    outputs=dict(outputs.CONFIG),
    one=dict(BLOCK_M=64, BLOCK_K=64, BLOCK_P=64, num_warps=4, num_stages=2, EXP2=False, maxnreg=None),
)


@triton.jit
def _ssd_one_launch_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, init_ptr, out_ptr,
    dtc_ptr, dacs_ptr,  # scratch: Δ and dA_cs, (b, h, c, q) float32
    H_ptr,              # (b, c+1, h, p, n) state_dtype: H_0 … H_c
    flag_ptr,           # (b, h, c) int32, 1 once H_{c+1} is published
    ticket_ptr,         # (1,) int32 work counter
    l, h, p, nchunks, heads_per_group, dt_min, dt_max,
    stride_xb, stride_xl, stride_xh, stride_xp,
    stride_dtb, stride_dtl, stride_dth,
    stride_zb, stride_zl, stride_zh, stride_zp,
    stride_Cb, stride_Cl, stride_Cg, stride_Cn,
    stride_Bb, stride_Bl, stride_Bg, stride_Bn,
    stride_ob, stride_ol, stride_oh, stride_op,
    stride_seqb, stride_seql, stride_Dh, stride_Dp,
    N: tl.constexpr, Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, EXP2: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    HAS_LIMIT: tl.constexpr, HAS_INIT: tl.constexpr, EVEN: tl.constexpr,
):
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
    d_q = _delta(tl.load(dt_base + t_q * stride_dtl, mask=t_q < l, other=0.0), bias, dt_min,
                 dt_max, HAS_BIAS, SOFTPLUS, HAS_LIMIT)
    d_q = tl.where(t_q < l, d_q, 0.0)
    a_q = tl.cumsum(d_q * A, axis=0)  # (Q,)
    a_last = tl.sum(d_q * A, axis=0)
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
                     stride_xb, stride_xl, stride_xh, stride_xp,
                     stride_zb, stride_zl, stride_zh, stride_zp,
                     stride_Cb, stride_Cl, stride_Cg, stride_Cn,
                     stride_Bb, stride_Bl, stride_Bg, stride_Bn,
                     stride_ob, stride_ol, stride_oh, stride_op,
                     stride_seqb, stride_seql, stride_Dh, stride_Dp,
                     N, Q, BLOCK_M, BLOCK_K, BLOCK_P, BLOCK_N, EXP2, HAS_D, HAS_Z, False, EVEN,
                     True)


def _one_launch(x, dt, A, B, C, q, D, z, dt_bias, initial_states, dt_softplus, dt_limit,
                state_dtype, cfg):
    """``launches=1``: the kernel above. Returns (out, final states float32)."""
    b, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    c = triton.cdiv(l, q)
    BM, BK, _ = outputs.output_tiles(q, p, cfg)
    dev = x.device
    out = torch.empty(b, l, h, p, device=dev, dtype=x.dtype)
    dt_c = torch.empty(b, h, c, q, device=dev, dtype=torch.float32)
    dA_cs = torch.empty_like(dt_c)
    H = torch.empty(b, c + 1, h, p, n, device=dev, dtype=state_dtype)
    flags = torch.zeros(b * h * c + 1, device=dev, dtype=torch.int32)  # last: the ticket counter
    init = initial_states.contiguous() if initial_states is not None else None
    _ssd_one_launch_kernel[(b * h * c,)](
        x, dt, A, B, C, D if D is not None else A, z if z is not None else x,
        dt_bias if dt_bias is not None else A, init if init is not None else A, out,
        dt_c, dA_cs, H, flags, flags[-1:], l, h, p, c, h // g,
        float(dt_limit[0]), float(dt_limit[1]), *x.stride()[:4], *dt.stride(),
        *outputs.launch_strides(x, z, C, B, out, D, None)[4:],
        N=n, Q=q, BLOCK_M=BM, BLOCK_K=BK, BLOCK_P=p2(p), BLOCK_N=p2(n), EXP2=bool(cfg["EXP2"]),
        HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=dt_bias is not None,
        SOFTPLUS=bool(dt_softplus), HAS_LIMIT=tuple(dt_limit) != (0.0, float("inf")),
        HAS_INIT=init is not None, EVEN=outputs.is_even(l, q, n, p, p2(p)), num_warps=cfg["num_warps"],
        num_stages=1 if INTERP else cfg["num_stages"], **launch_options(cfg))
    return out, H[:, c].float()


def ssd_fused_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                      initial_states=None, seq_idx=None, dt_softplus=False,
                      dt_limit=(0.0, float("inf")), launches=2, state_dtype=None,
                      config=None):
    """The SSD forward in ``launches`` = 2 or 1 kernel launches (module doc).

    out = ((L ∘ C Bᵀ)(Δx) + D x) · silu(z), L = exp(segsum(ΔA)), Δ = softplus(dt + dt_bias).
    Shapes as ``mamba_chunk_scan_combined``: x, z (b, l, h, p); dt (b, l, h); A, dt_bias (h,);
    B, C (b, l, g, n); D (h,) or (h, p); initial_states (b, h, p, n); seq_idx (b, l)
    → (out (b, l, h, p) in x's dtype, final states (b, h, p, n) float32).

    ``state_dtype`` (``launches=1`` only; default float32): the dtype of the states passed
    between programs (with ``launches=2`` the chain stays in float32 registers).
    ``config``: {"states" | "outputs" | "one": launch settings} overriding ``CONFIG``.
    """
    b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C)
    ssd.check_extras(b, l, h, p, n, D, z, dt_bias, initial_states, seq_idx)
    if launches not in (1, 2):
        raise ValueError(f"launches must be 1 or 2, got {launches!r}")
    if launches == 2 and state_dtype is not None:
        raise ValueError("state_dtype is for launches=1: with launches=2 the states stay in "
                         "float32 registers")
    state_dtype = state_dtype or torch.float32
    if state_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"state_dtype must be float32, float16 or bfloat16, got {state_dtype}")
    if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a power-of-two int, got {chunk_size!r}")
    cfg = {k: dict(v, **(config or {}).get(k, {})) for k, v in CONFIG.items()}
    if launches == 1:
        if seq_idx is not None:
            raise ValueError("the one-launch SSD kernel does not support seq_idx; use launches=2")
        return _one_launch(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                           dt_softplus, dt_limit, state_dtype, cfg["one"])
    dt_c, dA_cs = chunk_cumsum(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)  # (b, h, c, q)
    H, final = states.chunk_states(x, B, dt_c, dA_cs, initial_states, seq_idx,
                                   config=cfg["states"])  # (b, c, h, p, n), (b, h, p, n)
    out = outputs.chunk_outputs(x, C, B, dt_c, dA_cs, H, D, z, seq_idx, config=cfg["outputs"])
    return out, final
