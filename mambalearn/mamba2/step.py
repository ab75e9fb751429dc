"""Chapter 12 — the decode step as one Triton kernel: read the state once, write it once.

    Ā = exp(Δ A)    h ← Ā ⊙ h + Δ B x    y = C·h + D x    out = y · silu(z)

One token's update touches every state value exactly twice (a read and a write) and does a
handful of flops on each, so it is bound by memory bandwidth: the floor is
2 · b·h·p·n · sizeof(state) / bandwidth (b64 h80 p64 n128 fp32: 336 MB, ≈0.08 ms at the reference
H200's copy bandwidth, ``roofline.H200``).
Everything else (x, Δ, B, C, D, z, the output) is b·h·p or b·g·n values: noise next to the state.

The kernel gives each program a (BLOCK_P, n) tile of one (batch, head): it loads the tile, updates
it in registers, stores it back in the state's own dtype (float32 or bfloat16; arithmetic is
always float32), and reduces over n for the output. Tiles are numbered so that programs launched
together touch neighbouring memory (p-block fastest, then head, then batch row).

One sequence is another matter: its state (h80 p64 n128 fp32: 2.6 MB) moves in ≈1.1 µs at the
H200's 4.8 TB/s, less than one launch costs, and stays in L2 from one token to the next. What a
program costs then is how often it waits for memory: a load is a round trip of several hundred
cycles, and a program that loads, uses, then loads again pays one per wait. So every input is
loaded before anything is computed (a load written after the state's store could not move above
it: the compiler cannot tell that they touch different memory), and the tile is small enough
that every SM gets programs (``_tile``: the choice, its floor and its round trips).

Four launch variants shorten that path further (``StepConfig`` fields; the launcher turns them on
for a small state, where the H200 measured them faster, and leaves them off for a large one):
``grid_3d`` launches a (tiles, heads, batch) grid, so a program need not divide its number back
into the three before it can form an address (integer division is a chain of tens of
instructions on a GPU); ``scalar_d`` loads a per-head D once, first, instead of once a row —
left to itself, ptxas issues D's loads after Δ's softplus, and they come back one round trip
after everything else; ``fast_softplus`` computes Δ's softplus from the exp unit's 2ˣ and log₂;
``pdl`` (programmatic dependent launch, Hopper and later) lets the next step's launch overlap the
end of this one: a step in a CUDA graph of many costs a launch gap besides its kernel.

Mamba-2 passes per-head scalars broadcast with stride 0 (A (h, p, n), Δ (b, h, p)); the launcher
detects that (``TIE_HDIM``) and the kernel then loads one A and one Δ per program instead of a
(BLOCK_P, n) tile of A — which would otherwise add a third of the traffic again.

The launcher has the signature of ``mamba_ssm.ops.triton.selective_state_update.
selective_state_update``; the oracle is :func:`mambalearn.inference.decode_step`.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.inference import check_step
from mambalearn.mamba1.fused.tile import softplus_fast
from mambalearn.triton.common import INTERPRETED, softplus
from mambalearn.triton.config import LaunchConfig, resolve
from mambalearn.utils import check_kernel_device, check_writable, refuse_grad

try:  # griddepcontrol (programmatic dependent launch), in triton.language.extra since 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # elsewhere ``pdl`` launches plainly
    gdc_launch_dependents = gdc_wait = None

_INTERPRETED = tl.constexpr(INTERPRETED)


@triton.jit
def _gate_inputs(D_ptr, z_ptr, pid_b, pid_h, offs_p, in_p, D_strides, z_strides,
                 HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    """D and z of one tile's rows, float32 (BLOCK_P,) each (a 0 where the call has none)."""
    stride_Dh, stride_Dp = D_strides
    stride_zb, stride_zh, stride_zp = z_strides
    D = 0.0
    z = 0.0
    if HAS_D:
        D = tl.load(D_ptr + pid_h * stride_Dh + offs_p * stride_Dp, mask=in_p,
                    other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + pid_b * stride_zb + pid_h * stride_zh + offs_p * stride_zp,
                    mask=in_p, other=0.0).to(tl.float32)
    return D, z


@triton.jit
def _state_update_kernel(
    state_ptr, x_ptr, dt_ptr, dt_bias_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, out_ptr, idx_ptr,
    p, n, heads_per_group,  # head dim, state size, heads sharing one B/C group
    tiles_p, n_heads, n_slots,  # ⌈p / BLOCK_P⌉ tiles per head; heads; rows of the state
    state_strides,  # the state's strides (slots, h, p, n)
    x_strides, dt_strides,  # (b, h, p) each
    dt_bias_strides,  # (h, p)
    A_strides,  # (h, p, n)
    B_strides, C_strides,  # (b, g, n) each
    D_strides,  # (h, p)
    z_strides, out_strides,  # (b, h, p) each
    SOFTPLUS: tl.constexpr,  # Δ = softplus(dt + dt_bias)?
    TIE_HDIM: tl.constexpr,  # A and Δ are one scalar per head (Mamba-2)
    HAS_DT_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr,
    BLOCK_P: tl.constexpr,  # rows of the head dim per tile
    BLOCK_N: tl.constexpr,  # n rounded up to a power of two
    STREAM: tl.constexpr,  # evict the state from L2 first (a state larger than L2)
    LOADS_FIRST: tl.constexpr,  # D and z loaded with the other inputs, before the state's store
    GRID_3D: tl.constexpr,  # the grid is (tiles_p, heads, batch): no division to find the tile
    SCALAR_D: tl.constexpr,  # D one value per head (stride 0 along p): one load, first, volatile
    FAST_SP: tl.constexpr,  # softplus from the exp unit's 2^x and log2 (`softplus_fast`)
    PDL: tl.constexpr,  # programmatic dependent launch: start while the previous kernel ends
):
    stride_sb, stride_sh, stride_sp, stride_sn = state_strides
    stride_xb, stride_xh, stride_xp = x_strides
    stride_dtb, stride_dth, stride_dtp = dt_strides
    stride_biash, stride_biasp = dt_bias_strides
    stride_Ah, stride_Ap, stride_An = A_strides
    stride_Bb, stride_Bg, stride_Bn = B_strides
    stride_Cb, stride_Cg, stride_Cn = C_strides
    stride_Dh, stride_Dp = D_strides
    stride_ob, stride_oh, stride_op = out_strides
    # One (BLOCK_P, n) tile per program, numbered p-block fastest, then head, then batch row, so
    # that programs running together touch neighbouring memory.
    if GRID_3D:  # the hardware numbers the blocks: every address is ready at once
        pid_p = tl.program_id(0)
        pid_h = tl.program_id(1)
        pid_b = tl.program_id(2)
    else:  # one axis: two integer divisions (tens of cycles) before the first address
        t = tl.program_id(0)
        pid_p = t % tiles_p
        pid_h = (t // tiles_p) % n_heads
        pid_b = t // (tiles_p * n_heads)
    if PDL and not _INTERPRETED:
        # Launched with programmatic dependent launch, this kernel's programs may start before
        # the previous kernel in the stream has finished: let the next step's launch begin
        # now, then wait for the previous kernel (its writes: the state, x, Δ, B, C, z) before
        # any load. What overlaps is the launch and the programs' start, not memory traffic.
        gdc_launch_dependents()
        gdc_wait()
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)  # (BLOCK_P,)
    offs_n = tl.arange(0, BLOCK_N)  # (BLOCK_N,)
    in_p = offs_p < p  # (BLOCK_P,) bool
    mask_n = offs_n < n  # (BLOCK_N,) bool
    # Every load is written before any result is used, so that the program waits for memory
    # once (``_tile`` counts the waits of the sm_90 build). A load written after a store stays
    # after it (the compiler cannot tell that they touch different memory), and a load written
    # after a layout change (a barrier) waits for it.
    # 0. the state slot, the one load another load's address needs
    slot = pid_b.to(tl.int64)  # (slot · stride_sb passes 2³¹ in a large state)
    if HAS_IDX:
        slot = tl.load(idx_ptr + pid_b).to(tl.int64)
    # 1. the small per-token inputs (they need no slot)
    if SCALAR_D:  # one D per head, loaded first. ptxas issues a load of D written anywhere else
        # after Δ's softplus (it waits for Δ first): the load comes back one round trip after
        # the rest. Volatile loads keep their order among themselves: D's, then Δ's.
        D = tl.load(D_ptr + pid_h * stride_Dh, volatile=True).to(tl.float32)
    x = tl.load(x_ptr + pid_b * stride_xb + pid_h * stride_xh + offs_p * stride_xp,
                mask=in_p, other=0.0).to(tl.float32)  # (BLOCK_P,)
    bias = 0.0
    if TIE_HDIM:  # Mamba-2: one Δ and one A per head
        dt = tl.load(dt_ptr + pid_b * stride_dtb + pid_h * stride_dth,
                     volatile=SCALAR_D).to(tl.float32)
        if HAS_DT_BIAS:
            bias = tl.load(dt_bias_ptr + pid_h * stride_biash).to(tl.float32)
        A = tl.load(A_ptr + pid_h * stride_Ah).to(tl.float32)
    else:  # Mamba-1 (or untied heads): Δ per row (A per row and state: with the state, below)
        dt = tl.load(dt_ptr + pid_b * stride_dtb + pid_h * stride_dth + offs_p * stride_dtp,
                     mask=in_p, other=0.0).to(tl.float32)  # (BLOCK_P,)
        if HAS_DT_BIAS:
            bias = tl.load(dt_bias_ptr + pid_h * stride_biash + offs_p * stride_biasp,
                           mask=in_p, other=0.0).to(tl.float32)
    if LOADS_FIRST:
        D1, z = _gate_inputs(D_ptr, z_ptr, pid_b, pid_h, offs_p, in_p, D_strides, z_strides,
                             HAS_D and not SCALAR_D, HAS_Z)
        if not SCALAR_D:
            D = D1
    # 2. the state tile: the only big read
    mask_p = in_p
    bad = False  # a slot outside the state: nothing is read or written there, out = NaN
    if HAS_IDX:
        # continuous batching: row pid_b uses state slot idx[pid_b]; a slot < 0 is padding
        # (out = 0). The launcher rejects slots ≥ n_slots eagerly; while a CUDA graph is being
        # captured it cannot look, so the kernel masks them here and writes NaN instead.
        bad = slot >= n_slots
        # where, not &: a block mask combined with a scalar condition stays a boolean block
        mask_p = tl.where((slot >= 0) & (slot < n_slots), in_p, False)
        slot = tl.minimum(tl.maximum(slot, 0), n_slots - 1)
    mask_pn = mask_p[:, None] & mask_n[None, :]  # (BLOCK_P, BLOCK_N) bool
    s_ptrs = (state_ptr + slot * stride_sb + pid_h * stride_sh
              + offs_p[:, None] * stride_sp + offs_n[None, :] * stride_sn)
    # A state larger than L2 is read once per token: keep it out of L2's way (STREAM); a small
    # one stays in L2 from one token to the next.
    if STREAM:
        h = tl.load(s_ptrs, mask=mask_pn, other=0.0, eviction_policy="evict_first")
    else:
        h = tl.load(s_ptrs, mask=mask_pn, other=0.0)
    if not TIE_HDIM:
        A = tl.load(A_ptr + pid_h * stride_Ah + offs_p[:, None] * stride_Ap
                    + offs_n[None, :] * stride_An, mask=mask_pn, other=0.0).to(tl.float32)
    # 3. B and C last: spreading an (n,) vector over the tile's rows can go through shared
    # memory and a barrier (``_tile``), and a load written after that would wait for it
    g = pid_h // heads_per_group  # the B/C group this head reads
    B = tl.load(B_ptr + pid_b * stride_Bb + g * stride_Bg + offs_n * stride_Bn,
                mask=mask_n, other=0.0).to(tl.float32)  # (BLOCK_N,)
    C = tl.load(C_ptr + pid_b * stride_Cb + g * stride_Cg + offs_n * stride_Cn,
                mask=mask_n, other=0.0).to(tl.float32)  # (BLOCK_N,)

    # 4. the update, in float32 whatever the state's dtype
    if HAS_DT_BIAS:
        dt += bias
    if SOFTPLUS:
        if FAST_SP:
            dt = softplus_fast(dt)
        else:
            dt = softplus(dt)
    h = h.to(tl.float32)
    if TIE_HDIM:
        A_bar = tl.exp(A * dt)  # a scalar
        h = h * A_bar + x[:, None] * (B * dt)[None, :]  # (BLOCK_P, BLOCK_N)
    else:
        A_bar = tl.exp(A * dt[:, None])  # (BLOCK_P, BLOCK_N)
        h = h * A_bar + (dt * x)[:, None] * B[None, :]  # (BLOCK_P, BLOCK_N)

    # 5. write the new state back (in its own dtype), then read it out: y_t sees x_t
    if STREAM:
        tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty), mask=mask_pn,
                 eviction_policy="evict_first")
    else:
        tl.store(s_ptrs, h.to(state_ptr.dtype.element_ty), mask=mask_pn)
    if not LOADS_FIRST:  # (the first version's order: one more wait for memory, after the store)
        D, z = _gate_inputs(D_ptr, z_ptr, pid_b, pid_h, offs_p, in_p, D_strides, z_strides,
                            HAS_D, HAS_Z)
    y = tl.sum(h * C[None, :], axis=1)  # (BLOCK_P,)
    if HAS_D:
        y += x * D
    if HAS_Z:
        y *= z * tl.sigmoid(z)  # silu(z)
    y = tl.where(mask_p, y, 0.0)  # padding rows write 0 …
    if HAS_IDX:
        y = tl.where(bad, float("nan"), y)  # … and rows pointing past the state NaN
    tl.store(out_ptr + pid_b * stride_ob + pid_h * stride_oh + offs_p * stride_op, y, mask=in_p)


# (state values a tile holds at most, warps, stream) for large states (bandwidth-bound) and small
# ones (latency-bound); the H200 sweeps behind them: bench/NOTES_ssd.md, bench/gpu/step_z.py
TILE_LARGE = (4096, 8, True)
TILE_SMALL = (1024, 1, False)  # a state that stays in L2 from one token to the next: keep it
SMALL_STATE = 1 << 22  # state values (b·h·p·n) up to which a batch counts as small (16 MB fp32)
FILL = 4  # a small state's tiles are halved until the grid has FILL programs per SM (0: never)
SMS = 132  # the reference H200's SMs (the choice does not ask the device: one rule everywhere)
VALUES_PER_WARP = 128  # at most one warp per 128 values: each thread a 16-byte load of fp32
GRID_YZ = 65535  # blocks a CUDA grid holds along its second and third axes


@dataclass(frozen=True)
class StepConfig(LaunchConfig):
    """The decode step's launch, overriding `_tile`'s choice field by field (None: its choice):
    rows of the head dim per tile, warps per program, the state streamed through L2 first, every
    input loaded before the state's store; ``grid_3d``: a (tiles, heads, batch) grid instead of
    one axis divided back into the three; ``scalar_d``: D loaded once a program, first of all
    loads, where it is one value per head (a stride 0 along p, as Mamba-2 passes it), not once a
    row with the gate; ``fast_softplus``: Δ's softplus from the exp unit's 2ˣ and log₂
    (``softplus_fast``, relative error ≤ ~1e-5) instead of the precise log; ``pdl``: launched
    with programmatic dependent launch (Hopper and later; a CUDA graph keeps it): the launch
    overlaps the end of the previous kernel in the stream. These four, None: on for a small
    state (``SMALL_STATE``: latency-bound), off for a large one.
    """

    block_p: int | None = None
    num_warps: int | None = None
    stream: bool | None = None
    loads_first: bool | None = None
    grid_3d: bool | None = None
    scalar_d: bool | None = None
    fast_softplus: bool | None = None
    pdl: bool | None = None

    def __post_init__(self):
        for name in ("block_p", "num_warps"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1
                                  or v & (v - 1)):
                raise ValueError(f"config.{name} must be None or a power of two ≥ 1, got {v!r}")
        for name in ("stream", "loads_first", "grid_3d", "scalar_d", "fast_softplus", "pdl"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, bool):
                raise TypeError(f"config.{name} must be None, True or False, got {v!r}")


DEFAULT = StepConfig()


def _tile(p, n, values):
    """(BLOCK_P, num_warps, stream) for a (…, p, n) state of ``values`` values; no autotuning (it
    would run the in-place update several times).

    Large states (more than ``SMALL_STATE`` values) are bound by bandwidth: 2·values·4 B (fp32)
    over ≈4.8 TB/s (b64 h80 p64 n128: ≈70 µs). They take ``TILE_LARGE``: enough programs per SM
    that while some wait for memory others load, and the state streamed past L2 (read once).

    Small states are bound by latency (b1 h80 p64 n128: 5.2 MB moved, ≈1.1 µs of bandwidth, less
    than a launch): the time is the launch, the programs' waits for memory and the stores'
    drain. Each program makes one round trip for all its loads (two with
    ``state_batch_indices``: the slot first); the sm_90 build of an 8 × 128 tile issues all but
    one scalar load (D's) before its first wait, so two in practice, against four with z
    (three without) in the first version: the state's loads behind Δ's softplus, D and z after
    the state's store (``python -m bench.gpu.step_z --waits`` counts them). The tile
    starts at ``TILE_SMALL`` and is halved until the grid has ``FILL`` programs per SM, so that
    every SM pulls its share of the state in that round trip — but never below one warp's worth
    (``VALUES_PER_WARP``). On the H200 (``bench.gpu.step_z``'s sweep, b1 h80 p64 n128, with z
    and without, one and 20 calls a CUDA graph) the smallest programs won: 4 × 128 tiles over
    one warp, 1 280 programs, each thread four 16-byte loads of the state; 8 × 128 over 8 warps
    and 64 × 128 over 8 warps were slower. With the four launch variants of ``StepConfig`` on
    (no index division, D first, the short softplus, programmatic dependent launch), a later
    sweep put 8 × 128 tiles over one warp ahead (``TILE_SMALL``: 640 programs at b1): with the
    divisions gone a program's work is short enough that fewer, larger ones win.

    Warps: at most one per ``VALUES_PER_WARP`` values of the tile. With n = 128 and 8 warps
    (256 threads, more than n) the compiler gives each thread the B and C values of its own
    columns straight from memory; with fewer threads than n it loads the (n,) vectors once and
    redistributes them through shared memory behind a barrier, and the loads written after
    that wait one more round trip (the B/C vectors load last for that reason).
    """
    small = values <= SMALL_STATE
    per_tile, warps, stream = TILE_SMALL if small else TILE_LARGE
    block_n = triton.next_power_of_2(n)
    block_p = max(1, min(triton.next_power_of_2(p), per_tile // block_n))
    if small and FILL:
        heads = max(1, values // max(1, p * n))  # b·h (sequences × heads)
        while (block_p > 1 and block_p * block_n > VALUES_PER_WARP
               and heads * triton.cdiv(p, block_p) < FILL * SMS):
            block_p //= 2
    return block_p, min(warps, max(1, block_p * block_n // VALUES_PER_WARP)), stream


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None,
                           dt_softplus=False, state_batch_indices=None, *, config=None):
    """h ← exp(ΔA) ⊙ h + Δ B x (in place), out = (C·h + D x)·silu(z), Δ = softplus(dt + dt_bias).

    Shapes (as ``mamba_ssm``):
        state: (b, d, n) or (b, h, p, n), float32 or bfloat16/float16, updated in place
        x, dt, z: (b, d) or (b, h, p)  — dt may also be (b, h) (one Δ per head)
        A: (d, n) or (h, p, n) — or (h,) (one A per head)
        B, C: (b, n) or (b, g, n) with g dividing h
        D, dt_bias: (d,) or (h, p) — or (h,)
        state_batch_indices: (b,) int, row i updates state[idx[i]]; idx < 0 skips the row (out 0);
            idx ≥ the state's batch, or a slot named by two rows, is a ValueError (under
            CUDA-graph capture, which forbids looking: a slot past the state gives out NaN and
            leaves the state untouched)
        returns out shaped like x, in x's dtype.
    ``config``: a `StepConfig` whose fields override ``_tile``'s choice (benchmark sweeps;
    None: the choice).
    The arguments' rules are ``inference.check_step``'s (the oracle's); any strides are read as
    they are. Not differentiable: while autograd records, inputs that require grad are refused
    (the state is updated in place).

    Matches ``mamba_ssm.ops.triton.selective_state_update.selective_state_update``.
    """
    config = resolve(config, StepConfig, lambda: DEFAULT)
    refuse_grad("selective_state_update", "it is an inference step that updates the state in "
                "place: call it under torch.no_grad() (as generate does), or pass detached "
                "tensors", state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias)
    heads, s4, x4, dt4, A3, B3, C3, D2, z4, bias2, idx = check_step(
        state, x, dt, A, B, C, D, z, dt_bias, state_batch_indices)
    check_kernel_device(state=state, x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                        state_batch_indices=idx)
    check_writable("state", state)
    b, h, p, n = s4.shape
    bx = x4.shape[0]
    tie = (A3.stride(1) == 0 and A3.stride(2) == 0 and dt4.stride(2) == 0
           and (bias2 is None or bias2.stride(1) == 0))
    out = torch.empty((bx, h, p), dtype=x.dtype, device=x.device)
    if out.numel() == 0:  # no row, head or channel: nothing to update
        return out if heads else out[:, 0]
    bp, nw, st = _tile(p, n, bx * h * p * n)
    bp, nw = config.block_p or bp, config.num_warps or nw
    st = st if config.stream is None else config.stream
    small = bx * h * p * n <= SMALL_STATE  # latency-bound: the four launch variants on

    def on(field):  # a launch variant's field; None: on for a small state
        return small if field is None else field

    tiles_p = triton.cdiv(p, bp)
    zs = z4.stride() if z4 is not None else (0, 0, 0)
    # a grid's second and third axes hold at most 65 535 blocks: beyond, one axis
    grid_3d = on(config.grid_3d) and h <= GRID_YZ and bx <= GRID_YZ
    # programmatic dependent launch needs Hopper or later (elsewhere: a plain launch); in the
    # interpreter the kernel is built with it but skips its two instructions
    pdl = on(config.pdl) and gdc_wait is not None and (
        INTERPRETED or torch.cuda.get_device_capability(x.device)[0] >= 9)
    per_group, sB, sC = h // B3.shape[1], B3.stride(), C3.stride()
    if grid_3d and B3.shape[1] == 1:  # one B/C group: group = head // 1 · stride 0, and Triton
        per_group, sB, sC = 1, (sB[0], 0, sB[2]), (sC[0], 0, sC[2])  # folds an integer 1
    _state_update_kernel[(tiles_p, h, bx) if grid_3d else (tiles_p * h * bx,)](
        s4, x4, dt4, bias2, A3, B3, C3, D2, z4, out, idx,
        p, n, per_group, tiles_p, h, b,
        s4.stride(), x4.stride(), dt4.stride(),
        bias2.stride() if bias2 is not None else (0, 0),
        A3.stride(), sB, sC,
        D2.stride() if D2 is not None else (0, 0),
        zs, out.stride(),
        SOFTPLUS=bool(dt_softplus), TIE_HDIM=tie, HAS_DT_BIAS=bias2 is not None,
        HAS_D=D2 is not None, HAS_Z=z4 is not None, HAS_IDX=idx is not None,
        BLOCK_P=bp, BLOCK_N=triton.next_power_of_2(n), STREAM=bool(st),
        LOADS_FIRST=config.loads_first is not False, GRID_3D=grid_3d,
        SCALAR_D=on(config.scalar_d) and D2 is not None and D2.stride(1) == 0
        and config.loads_first is not False,
        FAST_SP=on(config.fast_softplus), PDL=pdl, num_warps=nw,
        **({"launch_pdl": True} if pdl and not INTERPRETED else {}),
    )
    return out if heads else out[:, 0]
