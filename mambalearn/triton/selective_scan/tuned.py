"""The fused Mamba-1 selective scan in Triton, forward and backward (chapter 09): the tuned kernels.

    Δ_t = softplus(delta_t + delta_bias)      Ā_t = exp(Δ_t A)      B̄_t x_t = Δ_t B_t x_t
    h_t = Ā_t h_{t−1} + Δ_t B_t x_t           y_t = C_t h_t + D x_t  out_t = y_t · silu(z_t)

`selective_scan_fn` takes the arguments, layouts and dtypes of ``mamba_ssm.selective_scan_fn``
and adds variable-length sequences packed in one row (``seq_idx`` or ``cu_seqlens``), which
mamba_ssm's Mamba-1 kernel lacks: where the sequence index changes, the state restarts (Ā_t = 0).

This module is the public face: `selective_scan_fn`, the autograd Function, the launchers
(`_forward`, `_backward`) and which configuration applies to which n.
The rest lives next to it, one concept per module, and is re-exported here:

    selective_scan_forward                the forward kernel (one pass, a state stored per chunk)
    selective_scan_backward               the run-time-loop backward kernel (replay + sub-blocks)
    selective_scan_backward_state_outer   the state-outer backward kernel (GPU default, n ≤ 16)
    selective_scan_config                 tiles, measured defaults, named variants, `_launch`
    selective_scan_args                   argument checks, B/C layouts, gradient shapes

The launchers look up `chunk_size`, `_launch`, the kernels and the configs in this module, so
setting them here (``monkeypatch.setattr(tuned, ...)``, the GPU script) changes what runs.
`selective_scan_teaching` (module ``selective_scan_teaching``) is the readable version the
chapter walks through; these modules are the tuned one (autotuned tiles, exp2).
"""

import torch
import triton

from mambalearn.triton.selective_scan.interface import (  # noqa: F401  (re-exported)
    DTYPES,
    MAX_DSTATE,
    _bc_strides,
    bc_layout,
    check_args,
    finish_grads,
    flags,
    optional,
    seq_idx_from_cu_seqlens,
)
from mambalearn.triton.selective_scan.backward import (  # noqa: F401  (re-exported)
    _bwd_delta,
    _bwd_grad_state,
    _bwd_kernel,
    _bwd_replay_state,
    _bwd_state,
    _fwd_state,
    _reverse_scan,
)
from mambalearn.triton.selective_scan.backward_state_outer import (  # noqa: F401
    _bwd_so_kernel,
    _so_atomic,
    _so_load_state,
    _so_state,
)
from mambalearn.triton.selective_scan.config import (  # noqa: F401  (re-exported)
    _ZEROED,
    BWD_RUNTIME_LOOP,
    BWD_RUNTIME_LOOP_LARGE_N,
    BWD_VARIANTS,
    BWD_VARIANTS_LARGE_N,
    CPU_BWD,
    CPU_FWD,
    DEFAULT_BWD,
    DEFAULT_BWD_LARGE_N,
    DEFAULT_FWD,
    DEFAULT_FWD_LARGE_N,
    FWD_MEASURED,
    FWD_PIPELINED,
    FWD_UNMASKED,
    FWD_VARIANTS,
    STATE_OUTER,
    _autotuned,
    _bwd_autotuned,
    _fwd_autotuned,
    _launch,
    _numpy_breaks_range,
    bwd_configs,
    fwd_configs,
    pick,
)
from mambalearn.triton.selective_scan.forward import (  # noqa: F401  (re-exported)
    LOG2E,
    _fwd_block,
    _fwd_kernel,
    _fwd_state_fast,
    _ld,
    _load_bc,
    _st,
)

UNROLL_MAX = 16  # forward: unroll the loop over states up to this n (compile time grows with n)
BWD_UNROLL_MAX = 0  # backward: unrolled, n = 16 took minutes to compile and spilled (sm_90)
MIN_BLOCK_L = 8  # smallest time tile of any configuration (sizes the backward's scratch)


def chunk_size(n):
    """Steps between the states the forward stores for the backward (the backward's time tile).

    Memory of the stored states: b·d·n·⌈l/q⌉·4 bytes; q = 64 at n ≤ 16 keeps fwd+bwd at the
    CUDA kernel's peak (it stores nothing of size l but keeps out), larger n takes longer chunks.
    """
    return 64 if n <= 16 else 128


# a config dict, a function of n returning one, or "auto" (autotune over fwd_/bwd_configs())
FWD_CONFIG = lambda n: DEFAULT_FWD if n <= UNROLL_MAX else DEFAULT_FWD_LARGE_N


def BWD_CONFIG(n):  # (upper case: a module setting like FWD_CONFIG; bench scripts replace it)
    """The default backward: state-outer (n ≤ 16: two channels a program; up to the chunk:
    one), else the run-time state loop (state-outer keeps n row sums in the chunk's columns)."""
    if n <= UNROLL_MAX:
        return DEFAULT_BWD
    return DEFAULT_BWD_LARGE_N if n <= chunk_size(n) else BWD_RUNTIME_LOOP_LARGE_N


# ---------------------------------------------------------------------------------------------
# Launchers: layouts, buffers, the kernel each configuration picks.
# ---------------------------------------------------------------------------------------------
def _forward(u, delta, A, B, C, D, z, delta_bias, softplus, seq_idx, shape, config=None):
    """Launch the forward. Returns (out (b,d,l), states (b,d,c,n) fp32, last state (b,d,n) fp32).

    ``config``: None (FWD_CONFIG, or CPU_FWD in the interpreter), a dict, a function of n, "auto".
    """
    b, d, l, n, g = shape
    u, delta, A = u.contiguous(), delta.contiguous(), A.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)
    q = chunk_size(n)
    out = torch.empty_like(u)
    states = torch.empty((b, d, triton.cdiv(l, q), n), device=u.device, dtype=torch.float32)
    states[:, :, 0] = 0.0  # h_{−1} = 0; the kernel writes the state entering every later chunk
    last = torch.zeros((b, d, n), device=u.device, dtype=torch.float32)  # (carry if n large)
    args = (u, delta, A, Bk, Ck, *optional(D, z, delta_bias, seq_idx, dummy=A),
            out, states, last, l, d, d // g, g, *_bc_strides(Bk), *_bc_strides(Ck))
    consts = dict(N=n, NP=triton.next_power_of_2(n), CHUNK=q, UNROLL=n <= UNROLL_MAX,
                  **flags(D, z, delta_bias, softplus, B, C, seq_idx))
    _launch(_fwd_kernel, _fwd_autotuned, config, FWD_CONFIG, CPU_FWD,
            lambda bd: (b * g, triton.cdiv(d // g, bd)), args, consts, even=(l, d // g))
    return out, states, last


def _backward(dout, u, delta, A, B, C, D, z, delta_bias, softplus, seq_idx, states, shape,
              config=None):
    """Launch the backward. Returns du, ddelta, dA, dB, dC, dD, dz, ddelta_bias.

    Two kernels: the state-outer one (config LAYOUT="state-outer", the GPU default for n ≤ 16:
    the tile is one chunk, BLOCK_L = chunk_size(n) whatever the config says, no replay pass) and
    the run-time-loop one (sub-blocks of a chunk, replayed from the stored state into scratch).
    """
    b, d, l, n, g = shape
    picked = pick(config, BWD_CONFIG, CPU_BWD, n)
    state_outer = isinstance(picked, dict) and picked.get("LAYOUT") == "state-outer"
    q = chunk_size(n)
    if state_outer and n > q:
        raise ValueError(f"LAYOUT='state-outer' keeps the carries in the {q} columns of a tile: "
                         f"needs n ≤ {q}, got n = {n}")
    u, delta, A, dout = u.contiguous(), delta.contiguous(), A.contiguous(), dout.contiguous()
    z = z.contiguous() if z is not None else None
    Bk, Ck = bc_layout(B, upcast=True), bc_layout(C, upcast=True)
    f32 = dict(device=u.device, dtype=torch.float32)
    du, ddelta = torch.empty_like(u), torch.empty_like(delta)
    dz = torch.empty_like(z) if z is not None else None
    # fp32 sums: dB/dC over the channel tiles (atomic adds) if they vary with time; the rest per
    # batch row (each program owns its rows), added over b below
    dB = torch.zeros(Bk.shape if B.ndim != 2 else (1,), **f32)
    dC = torch.zeros(Ck.shape if C.ndim != 2 else (1,), **f32)
    dA_rows = torch.zeros((b, d, n), **f32)
    dBf_rows = torch.zeros((b, d, n) if B.ndim == 2 else (1,), **f32)
    dCf_rows = torch.zeros((b, d, n) if C.ndim == 2 else (1,), **f32)
    dD_rows, dbias_rows = torch.zeros((b, d), **f32), torch.zeros((b, d), **f32)
    gbuf = torch.zeros((b, d, n), **f32)  # the adjoint carried between chunks (or sub-blocks)
    dBs = _bc_strides(dB) if B.ndim != 2 else (0, 0, 0)
    dCs = _bc_strides(dC) if C.ndim != 2 else (0, 0, 0)
    inputs = (u, delta, A, Bk, Ck, *optional(D, z, delta_bias, seq_idx, dummy=A), dout, states)
    outputs = (gbuf, du, ddelta, *optional(dz, dummy=A), dB, dC, dA_rows, dBf_rows, dCf_rows,
               dD_rows, dbias_rows, l, d, d // g, g, *_bc_strides(Bk), *_bc_strides(Ck), *dBs,
               *dCs)
    grid = lambda bd: (b * g, triton.cdiv(d // g, bd))
    fl = flags(D, z, delta_bias, softplus, B, C, seq_idx)
    if state_outer:
        cfg = {k: v for k, v in picked.items() if k not in ("LAYOUT", "STAGES", "UNROLL")}
        _launch(_bwd_so_kernel, None, dict(cfg, BLOCK_L=q), None, None, grid, inputs + outputs,
                dict(N=n, **fl), even=(l, d // g), even_default=False)
    else:
        scr = q // MIN_BLOCK_L  # sub-blocks of the smallest tile in one chunk
        scratch = torch.empty((b, d, scr, n), **f32)
        consts = dict(N=n, NP=triton.next_power_of_2(n), CHUNK=q, SCR=scr,
                      UNROLL=n <= BWD_UNROLL_MAX, **fl)
        _launch(_bwd_kernel, _bwd_autotuned, config, BWD_CONFIG, CPU_BWD, grid,
                inputs + (scratch,) + outputs, consts, even=(l, d // g), even_default=False)
    dB = dBf_rows.sum(0) if B.ndim == 2 else dB
    dC = dCf_rows.sum(0) if C.ndim == 2 else dC
    return finish_grads(du, ddelta, dA_rows.sum(0), dB, dC, dD_rows.sum(0), dz,
                        dbias_rows.sum(0), B, C, D, delta_bias)


class Kernels:
    """A forward and a backward launcher: ``forward(...)`` → (out, states, last),
    ``backward(dout, ..., states, shape)`` → the eight gradients."""

    def __init__(self, name, forward, backward):
        self.name, self.forward, self.backward = name, forward, backward


TUNED = Kernels("tuned", _forward, _backward)


def variant(fwd=None, bwd=None, name="tuned variant"):
    """The tuned kernels with other launch configurations (None: the defaults); see FWD_VARIANTS.

    ``fwd`` / ``bwd``: a dict (BLOCK_D, BLOCK_L, num_warps, maxnreg, STAGES, EVEN; see
    FWD_VARIANTS / BWD_VARIANTS), a function of n returning one, or "auto"."""
    def forward(*args):
        return _forward(*args, config=fwd)

    def backward(*args):
        return _backward(*args, config=bwd)

    return Kernels(name, forward, backward)


class SelectiveScanFn(torch.autograd.Function):
    """Forward saves the inputs and one state per chunk; backward recomputes inside each chunk."""

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
                seq_idx, kernels, shape):
        out, states, last = kernels.forward(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                            seq_idx, shape)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, seq_idx, states)
        ctx.softplus, ctx.kernels, ctx.shape = delta_softplus, kernels, shape
        if return_last_state:
            ctx.mark_non_differentiable(last)
            return out, last
        return out

    @staticmethod
    def backward(ctx, dout, *_):
        u, delta, A, B, C, D, z, delta_bias, seq_idx, states = ctx.saved_tensors
        grads = ctx.kernels.backward(dout, u, delta, A, B, C, D, z, delta_bias, ctx.softplus,
                                     seq_idx, states, ctx.shape)
        return (*grads, None, None, None, None, None)


def run(kernels, u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
        return_last_state=False, seq_idx=None, cu_seqlens=None):
    """Check the arguments, then run ``kernels`` forward (and backward through autograd)."""
    shape, seq_idx = check_args(u, delta, A, B, C, D, z, delta_bias, seq_idx, cu_seqlens)
    return SelectiveScanFn.apply(u, delta, A, B, C, D, z, delta_bias, delta_softplus,
                                 return_last_state, seq_idx, kernels, shape)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, seq_idx=None, cu_seqlens=None, config=None):
    """out = (C·h + D·x)·silu(z),  h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t,  Δ = softplus(δ + bias).

    Shapes (as ``mamba_ssm.selective_scan_fn``):
        u, delta, z:    (b, d, l) float32 / float16 / bfloat16 (one dtype)
        A:              (d, n) float32, real (complex A raises TypeError); n ≤ 256
        B, C:           (b, n, l) or (b, g, n, l) in u's dtype or float32, or fixed (d, n) float32
        D, delta_bias:  (d,) float32
        seq_idx:        (b, l) int, optional: packed sequences; the state restarts where it changes
        cu_seqlens:     (k + 1,) int, optional, b = 1: cumulative lengths [0, …, l] of k sequences
        returns out (b, d, l) in u's dtype; with return_last_state (out, h_{l−1} (b, d, n)
        float32) — for packed sequences, the state of the row's last sequence.

    Gradients flow to every tensor argument (not through last_state, as in mamba_ssm). The tuned
    kernels (tile table / autotune, exp2); ``selective_scan_teaching`` is the readable version.
    Matches ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (real A).
    ``config`` (not in mamba_ssm): None for the defaults, or {"fwd": …, "bwd": …} launch configs
    (see ``variant``), to time alternatives.
    """
    kernels = TUNED
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"fwd", "bwd"}:
            raise ValueError(f"config must be a dict with keys 'fwd'/'bwd', got {config!r}")
        kernels = variant(config.get("fwd"), config.get("bwd"))
    return run(kernels, u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state,
               seq_idx, cu_seqlens)
