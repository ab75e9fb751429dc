"""Chapter 12 — the decode step as one Triton kernel: read the state once, write it once.

    Ā = exp(Δ A)    h ← Ā ⊙ h + Δ B x    y = C·h + D x    out = y · silu(z)

One token's update touches every state value exactly twice (a read and a write) and does a
handful of flops on each, so it is bound by memory bandwidth: the floor is
2 · b·h·p·n · sizeof(state) / bandwidth (b64 h80 p64 n128 fp32: 336 MB, ≈0.079 ms at 4.25 TB/s).
Everything else (x, Δ, B, C, D, z, the output) is b·h·p or b·g·n values: noise next to the state.

The kernel gives each program a (BLOCK_P, n) tile of one (batch, head): it loads the tile, updates
it in registers, stores it back in the state's own dtype (float32 or bfloat16; arithmetic is
always float32), and reduces over n for the output. Tiles are numbered so that programs launched
together touch neighbouring memory (p-block fastest, then head, then batch row). Measured on an
H200 (docs/BENCHMARKS.md): 8 rows × 128 states per program with 2 warps runs at 93% of the byte
floor, 0.085 ms vs mamba_ssm's 0.098 ms (4 rows, 4 warps, grid (p-blocks, b, h)).

Mamba-2 passes per-head scalars broadcast with stride 0 (A (h, p, n), Δ (b, h, p)); the launcher
detects that (``TIE_HDIM``) and the kernel then loads one A and one Δ per program instead of a
(BLOCK_P, n) tile of A — which would otherwise add a third of the traffic again.

The launcher has the signature of ``mamba_ssm.ops.triton.selective_state_update.
selective_state_update``; the oracle is :func:`mambalearn.inference.decode_step`.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.inference import _as_heads
from mambalearn.utils import check_same_device, check_tensor


@triton.jit
def _softplus(x):
    # log(1 + e^x), and x itself where e^x would overflow float32's precision anyway
    return tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def _state_update_kernel(
    state_ptr, x_ptr, dt_ptr, dt_bias_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, out_ptr, idx_ptr,
    p, n, heads_per_group,  # head dim, state size, heads sharing one B/C group
    n_tiles, tiles_p, n_heads,  # tiles to update: b · h · ⌈p / BLOCK_P⌉
    stride_state_b, stride_state_h, stride_state_p, stride_state_n,
    stride_x_b, stride_x_h, stride_x_p,
    stride_dt_b, stride_dt_h, stride_dt_p,
    stride_dt_bias_h, stride_dt_bias_p,
    stride_A_h, stride_A_p, stride_A_n,
    stride_B_b, stride_B_g, stride_B_n,
    stride_C_b, stride_C_g, stride_C_n,
    stride_D_h, stride_D_p,
    stride_z_b, stride_z_h, stride_z_p,
    stride_out_b, stride_out_h, stride_out_p,
    DT_SOFTPLUS: tl.constexpr,  # Δ = softplus(dt + dt_bias)?
    TIE_HDIM: tl.constexpr,  # A and Δ are one scalar per head (Mamba-2)
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr,
    BLOCK_P: tl.constexpr,  # rows of the head dim per tile
    BLOCK_N: tl.constexpr,  # n rounded up to a power of two
    NUM_STAGES: tl.constexpr,  # software pipelining depth of the tile loop (1 = none)
):
    # Tiles are numbered with the p-block fastest, then the head, then the batch row, so programs
    # that run together touch neighbouring memory. One tile per program when the grid has n_tiles
    # programs; a persistent grid (a few programs per SM) loops and overlaps one tile's loads with
    # the previous tile's stores.
    for t in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        pid_p = t % tiles_p
        pid_h = (t // tiles_p) % n_heads
        pid_b = t // (tiles_p * n_heads)
        offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)  # (BLOCK_P,)
        offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        mask_p, mask_n = offs_p < p, offs_n < n
        # continuous batching: row pid_b uses state slot idx[pid_b]; a slot < 0 is padding
        slot = pid_b
        if HAS_IDX:
            slot = tl.load(idx_ptr + pid_b)
            mask_p = mask_p & (slot >= 0)  # padding: touch no state, write out = 0
            slot = tl.maximum(slot, 0)
        mask_pn = mask_p[:, None] & mask_n[None, :]  # (BLOCK_P, BLOCK_N)
        s_ptrs = (state_ptr + slot.to(tl.int64) * stride_state_b + pid_h * stride_state_h
                  + offs_p[:, None] * stride_state_p + offs_n[None, :] * stride_state_n)
        # 1. the old state: the only big read. Read once, so keep it out of L2's way.
        h = tl.load(s_ptrs, mask=mask_pn, other=0.0, eviction_policy="evict_first").to(tl.float32)

        # 2. the small per-token inputs
        x = tl.load(x_ptr + pid_b * stride_x_b + pid_h * stride_x_h + offs_p * stride_x_p,
                    mask=mask_p, other=0.0).to(tl.float32)  # (BLOCK_P,)
        g = pid_h // heads_per_group  # the B/C group this head reads
        B = tl.load(B_ptr + pid_b * stride_B_b + g * stride_B_g + offs_n * stride_B_n,
                    mask=mask_n, other=0.0).to(tl.float32)  # (BLOCK_N,)
        C = tl.load(C_ptr + pid_b * stride_C_b + g * stride_C_g + offs_n * stride_C_n,
                    mask=mask_n, other=0.0).to(tl.float32)  # (BLOCK_N,)
        if TIE_HDIM:  # Mamba-2: one Δ and one A per head, loaded once
            dt = tl.load(dt_ptr + pid_b * stride_dt_b + pid_h * stride_dt_h).to(tl.float32)
            if HAS_DT_BIAS:
                dt += tl.load(dt_bias_ptr + pid_h * stride_dt_bias_h).to(tl.float32)
            if DT_SOFTPLUS:
                dt = _softplus(dt)
            A = tl.load(A_ptr + pid_h * stride_A_h).to(tl.float32)
            A_bar = tl.exp(A * dt)  # a scalar
            B_bar = B * dt  # (BLOCK_N,)
            h = h * A_bar + x[:, None] * B_bar[None, :]  # (BLOCK_P, BLOCK_N)
        else:  # Mamba-1 (or untied heads): Δ per row, A per (row, state)
            dt = tl.load(dt_ptr + pid_b * stride_dt_b + pid_h * stride_dt_h + offs_p * stride_dt_p,
                         mask=mask_p, other=0.0).to(tl.float32)  # (BLOCK_P,)
            if HAS_DT_BIAS:
                dt += tl.load(dt_bias_ptr + pid_h * stride_dt_bias_h + offs_p * stride_dt_bias_p,
                              mask=mask_p, other=0.0).to(tl.float32)
            if DT_SOFTPLUS:
                dt = _softplus(dt)
            A = tl.load(A_ptr + pid_h * stride_A_h + offs_p[:, None] * stride_A_p
                        + offs_n[None, :] * stride_A_n, mask=mask_pn, other=0.0).to(tl.float32)
            A_bar = tl.exp(A * dt[:, None])  # (BLOCK_P, BLOCK_N), float32 always
            h = h * A_bar + (dt * x)[:, None] * B[None, :]  # (BLOCK_P, BLOCK_N)

        # 3. write the new state back (in its own dtype), then read it out: y_t sees x_t
        tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty), mask=mask_pn,
                 eviction_policy="evict_first")
        y = tl.sum(h * C[None, :], axis=1)  # (BLOCK_P,)
        if HAS_D:
            y += x * tl.load(D_ptr + pid_h * stride_D_h + offs_p * stride_D_p,
                             mask=mask_p, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(z_ptr + pid_b * stride_z_b + pid_h * stride_z_h + offs_p * stride_z_p,
                        mask=mask_p, other=0.0).to(tl.float32)
            y *= z * tl.sigmoid(z)  # silu(z)
        offs_o = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
        tl.store(out_ptr + pid_b * stride_out_b + pid_h * stride_out_h + offs_o * stride_out_p,
                 y * mask_p, mask=offs_o < p)


def _tile(p, n):
    """(BLOCK_P, num_warps): ~1024 state values (4 KB fp32) per tile, 2 warps, a tile per program.

    From a CUDA-graph-timed sweep on an H200 at b64 h80 p64 n128 fp32 (mambalearn/bench/gpu/step.py tune,
    docs/BENCHMARKS.md, 2026-11-29): BLOCK_P 8 × 2 warps 0.085 ms; 16 × 4 0.088; 32 × 8 0.085;
    persistent grids (2–8 programs per SM, pipelined 1–3 stages) 0.092–0.16 ms. No autotuning:
    autotuning would run the in-place update several times.
    """
    block_n = triton.next_power_of_2(n)
    block_p = max(1, min(triton.next_power_of_2(p), 1024 // block_n))
    return block_p, 2


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None, *, block_p=None,
                           num_warps=None, programs=None, num_stages=None):
    """h ← exp(ΔA) ⊙ h + Δ B x (in place), out = (C·h + D x)·silu(z), Δ = softplus(dt + dt_bias).

    Shapes (as ``mamba_ssm``):
        state: (b, d, n) or (b, h, p, n), float32 or bfloat16/float16, updated in place
        x, dt, z: (b, d) or (b, h, p)  — dt may also be (b, h) (one Δ per head)
        A: (d, n) or (h, p, n) — or (h,) (one A per head)
        B, C: (b, n) or (b, g, n) with g dividing h
        D, dt_bias: (d,) or (h, p) — or (h,)
        state_batch_indices: (b,) int, row i updates state[idx[i]]; idx < 0 skips the row (out 0)
        returns out shaped like x, in x's dtype.
    ``block_p``, ``num_warps``, ``programs`` (grid size; fewer than tiles = persistent loop) and
    ``num_stages`` (pipelining of that loop) override the defaults, for the benchmark sweep.

    Matches ``mamba_ssm.ops.triton.selective_state_update.selective_state_update``.
    """
    check_tensor("state", state, ndim=(3, 4))
    for name, t in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C)):
        check_tensor(name, t)
    check_same_device(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    heads, s4, x4, dt4, A3, B3, C3, D2, z4, bias2 = _as_heads(state, x, dt, A, B, C, D, z, dt_bias)
    b, h, p, n = s4.shape
    if state_batch_indices is not None:
        if state_batch_indices.shape != (x4.shape[0],) or state_batch_indices.is_floating_point():
            raise ValueError(f"state_batch_indices must be an int tensor of shape (b,) = "
                             f"({x4.shape[0]},), got {tuple(state_batch_indices.shape)}")
    elif x4.shape[0] != b:
        raise ValueError(f"x has batch {x4.shape[0]} but state has {b}")
    bx = x4.shape[0]
    tie = (A3.stride(1) == 0 and A3.stride(2) == 0 and dt4.stride(2) == 0
           and (bias2 is None or bias2.stride(1) == 0))
    out = torch.empty((bx, h, p), dtype=x.dtype, device=x.device)
    bp, nw = _tile(p, n)
    bp, nw = block_p or bp, num_warps or nw
    tiles_p = triton.cdiv(p, bp)
    n_tiles = tiles_p * h * bx
    grid = (min(programs or n_tiles, n_tiles),)
    zs = z4.stride() if z4 is not None else (0, 0, 0)
    _state_update_kernel[grid](
        s4, x4, dt4, bias2, A3, B3, C3, D2, z4, out, state_batch_indices,
        p, n, h // B3.shape[1], n_tiles, tiles_p, h,
        *s4.stride(), *x4.stride(), *dt4.stride(),
        *(bias2.stride() if bias2 is not None else (0, 0)),
        *A3.stride(), *B3.stride(), *C3.stride(),
        *(D2.stride() if D2 is not None else (0, 0)),
        *zs, *out.stride(),
        DT_SOFTPLUS=bool(dt_softplus), TIE_HDIM=tie, HAS_DT_BIAS=bias2 is not None,
        HAS_D=D2 is not None, HAS_Z=z4 is not None, HAS_IDX=state_batch_indices is not None,
        BLOCK_P=bp, BLOCK_N=triton.next_power_of_2(n), NUM_STAGES=num_stages or 1, num_warps=nw,
    )
    return out if heads else out[:, 0]
