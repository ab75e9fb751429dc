"""What the teaching and the tuned Mamba-1 kernels share (chapter 09): argument checks, memory
layouts, and the autograd Function that runs a pair of launchers.

`check_args` applies ``mamba_ssm.selective_scan_fn``'s argument rules (shapes via
`mambalearn.scan.sequential.check_inputs`: u, delta, z (b, d, l); A (d, n); B, C (b, n, l),
(b, g, n, l) or fixed (d, n); D, delta_bias (d,); initial_state (b, d, n)) and turns
``cu_seqlens`` into a ``seq_idx`` (b = 1, l). `bc_layout` / `bc_strides` hand B and C to a
kernel, `flags` / `optional` build its switches and pointers, `finish_grads` returns the
gradients in the arguments' shapes. `Kernels` names a forward and a backward launcher;
`SelectiveScanFn` is the autograd Function around them, `run` the checked entry point of both
the teaching and the tuned kernels: any layout (strided, expanded, transposed) is made
contiguous there, once, so no launcher depends on a caller's strides, and an empty batch or
sequence returns an empty output without a launch.
"""

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from mambalearn.scan.sequential import check_inputs
from mambalearn.utils import check_kernel_device

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_DSTATE = 256  # mamba_ssm's limit too


class Strides(NamedTuple):
    """Strides of a time-varying B or C (b, g, n, l) for the tuned kernels (l is contiguous);
    zeros for a fixed (d, n) one, which the kernels index as A: contiguous, d·n + n."""

    b: int
    g: int
    n: int


def bc_strides(X):
    """`Strides` (stride_Xb, stride_Xg, stride_Xn) of a kernel-ready B or C (``bc_layout``)."""
    return Strides(0, 0, 0) if X.ndim == 2 else Strides(X.stride(0), X.stride(1), X.stride(2))


def dim_strides(X):
    """The teaching kernel's B/C strides: X's along its dimensions 0, 1, 2 — (b, g, n) of a
    (b, g, n, l) X, (d, n, 0) of a fixed (d, n) one (as the chapter's exercise passes them)."""
    return (X.stride(0), X.stride(1), 0) if X.ndim == 2 else tuple(X.stride()[:3])


def bc_layout(X, upcast=False):
    """B or C ready for a kernel: contiguous, (b, n, l) viewed as (b, 1, n, l); fp32 if upcast."""
    X = X[:, None] if X.ndim == 3 else X  # (b, 1, n, l)
    # (upcast: the few KB of B/C go to fp32 once here, instead of every thread converting the
    # same broadcast values for every state inside the kernel)
    return (X.float() if upcast else X).contiguous()


def seq_idx_from_cu_seqlens(cu_seqlens, l):
    """(1, l) int32 sequence index of each token from cumulative lengths [0, l₀, l₀+l₁, …, l]."""
    if cu_seqlens.ndim != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be 1-D [0, …, l], got shape {tuple(cu_seqlens.shape)}")
    if int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != l:
        raise ValueError(f"cu_seqlens must start at 0 and end at l = {l}, got "
                         f"{cu_seqlens[0].item()} … {cu_seqlens[-1].item()}")
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if (lengths < 0).any():
        raise ValueError("cu_seqlens must be non-decreasing")
    ids = torch.arange(len(lengths), device=cu_seqlens.device, dtype=torch.int32)
    return ids.repeat_interleave(lengths.long())[None]  # (1, l)


def _check_dtypes(u, delta, A, B, C, D, z, delta_bias, initial_state):
    if u.dtype not in DTYPES:
        raise TypeError(f"u must be float32, float16 or bfloat16, got {u.dtype}")
    for name, X in (("delta", delta), ("z", z)):
        if X is not None and X.dtype != u.dtype:
            raise TypeError(f"{name} must have u's dtype {u.dtype}, got {X.dtype}")
    for name, X in (("A", A), ("D", D), ("delta_bias", delta_bias),
                    ("initial_state", initial_state)):
        if X is not None and X.dtype != torch.float32:
            raise TypeError(f"{name} must be float32 (as in mamba_ssm), got {X.dtype}")
    for name, X in (("B", B), ("C", C)):
        ok = (torch.float32,) if X.ndim == 2 else (u.dtype, torch.float32)
        if X.dtype not in ok:
            raise TypeError(f"{name} must have dtype in {list(ok)}, got {X.dtype}")


def restart_index(seq_idx):
    """(b, l) int32 numbering of the runs of equal seq_idx values: 0 until the first change, then
    + 1 at every change. The kernels only ask where seq_idx changes (the state restarts there),
    so this is the same argument in 32 bits, whatever the values (int64 ids ≥ 2³¹ would wrap in
    a plain cast and could merge two sequences)."""
    starts = seq_idx[:, 1:] != seq_idx[:, :-1]  # (b, l − 1): a new sequence begins at t + 1
    ids = torch.cumsum(starts, dim=1, dtype=torch.int32)  # (b, l − 1)
    return torch.cat([ids.new_zeros(seq_idx.shape[0], min(1, seq_idx.shape[1])), ids], dim=1)


def _check_seq(seq_idx, cu_seqlens, b, l, u):
    """seq_idx (b, l) int32 contiguous, from either argument, or None."""
    if cu_seqlens is not None:
        if seq_idx is not None:
            raise ValueError("pass seq_idx or cu_seqlens, not both")
        if b != 1:
            raise ValueError(f"cu_seqlens packs sequences into one row: u must have b = 1, got {b}")
        if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_floating_point():
            raise TypeError("cu_seqlens must be an integer tensor")
        seq_idx = seq_idx_from_cu_seqlens(cu_seqlens.to(u.device), l)
    if seq_idx is not None:
        if not isinstance(seq_idx, torch.Tensor) or seq_idx.is_floating_point() \
                or seq_idx.is_complex() or seq_idx.dtype == torch.bool:
            raise TypeError(f"seq_idx must be an integer tensor (b, l), got "
                            f"{getattr(seq_idx, 'dtype', type(seq_idx).__name__)}")
        if tuple(seq_idx.shape) != (b, l):
            raise ValueError(f"seq_idx must have shape (b, l) = {(b, l)}, "
                             f"got {tuple(seq_idx.shape)}")
        seq_idx = seq_idx.contiguous() if seq_idx.dtype == torch.int32 \
            else restart_index(seq_idx)
    return seq_idx


def check_args(u, delta, A, B, C, D, z, delta_bias, seq_idx, cu_seqlens, initial_state=None):
    """mamba_ssm's argument rules, with clear errors. Returns ((b, d, l, n, g), seq_idx int32)."""
    if isinstance(A, torch.Tensor) and A.is_complex():
        raise TypeError("complex A is not supported: this kernel covers real A (Mamba-1) only")
    b, d, l, n = check_inputs(u, delta, A, B, C, D, z, delta_bias, initial_state=initial_state,
                              allow_empty=True)
    _check_dtypes(u, delta, A, B, C, D, z, delta_bias, initial_state)
    if not 1 <= n <= MAX_DSTATE:
        raise ValueError(f"A has n = {n} states (dstate; A is (d, n)); the kernels take 1 ≤ n ≤ "
                         f"{MAX_DSTATE}")
    gB = B.shape[1] if B.ndim == 4 else 1
    gC = C.shape[1] if C.ndim == 4 else 1
    if B.ndim != 2 and C.ndim != 2 and gB != gC:
        raise ValueError(f"B and C must have the same number of groups, got {gB} and {gC}")
    seq_idx = _check_seq(seq_idx, cu_seqlens, b, l, u)
    check_kernel_device(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias,
                        seq_idx=seq_idx, initial_state=initial_state)
    g = gB if B.ndim != 2 else gC  # groups of B/C (1 if both fixed)
    return (b, d, l, n, g), seq_idx


def flags(D, z, delta_bias, SOFTPLUS, B, C, seq_idx):
    """The compile-time switches every kernel takes: which optional inputs a call has, whether Δ
    goes through softplus, whether B and C vary in time. `run` resolves them once, from the
    checked arguments, and every launcher splats that dict (``**flags``)."""
    return dict(HAS_D=D is not None, HAS_Z=z is not None, HAS_BIAS=delta_bias is not None,
                SOFTPLUS=bool(SOFTPLUS), VAR_B=B.ndim != 2, VAR_C=C.ndim != 2,
                HAS_SEQ=seq_idx is not None)


def optional(*tensors, dummy):
    """Kernels need a pointer for every argument: ``dummy`` stands in for absent ones (unread)."""
    return tuple(dummy if t is None else t for t in tensors)


def finish_grads(du, ddelta, dA, dB, dC, dD, dz, dbias, B, C, D, delta_bias):
    """Gradients in the shapes and dtypes of the arguments (None for absent ones)."""
    dB = dB.reshape(B.shape).to(B.dtype)
    dC = dC.reshape(C.shape).to(C.dtype)
    return (du, ddelta, dA, dB, dC, dD if D is not None else None, dz,
            dbias if delta_bias is not None else None)


def initial_state_grad(g0, delta, delta_bias, SOFTPLUS, A):
    """∂L/∂h_{−1} = Ā_0 ⊙ g_0 (h_0 = Ā_0 h_{−1} + B̄_0 x_0), from the adjoint g_0 at step 0.

    Shapes: g0 (b, d, n) fp32, delta (b, d, l), A (d, n) → (b, d, n) fp32."""
    dt0 = delta[:, :, 0].float()  # (b, d)
    if delta_bias is not None:
        dt0 = dt0 + delta_bias
    if SOFTPLUS:
        dt0 = F.softplus(dt0)  # x itself above 20, as the kernels
    return torch.exp(dt0[..., None] * A) * g0  # (b, d, n)


class Kernels(NamedTuple):
    """A forward and a backward launcher.

    ``forward(u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, initial_state, shape,
    config)`` → (out, states (b, d, c, n) fp32, last state (b, d, n) fp32);
    ``backward(dout, dlast, u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, states,
    shape, config, need_g0)`` → (the eight gradients of `finish_grads`, g_0 (b, d, n) fp32: the
    adjoint at step 0, needed if ``need_g0``). ``dlast``: the last state's gradient, or None."""

    name: str
    forward: Callable
    backward: Callable


class SelectiveScanFn(torch.autograd.Function):
    """Forward saves the inputs and one state per chunk; backward recomputes inside each chunk.
    The last state is differentiable, and so is the initial state."""

    @staticmethod
    def forward(ctx, kernels, config, shape, flags, return_last_state, seq_idx, u, delta, A,
                B, C, D, z, delta_bias, initial_state):
        out, states, last = kernels.forward(u, delta, A, B, C, D, z, delta_bias, flags,
                                            seq_idx, initial_state, shape, config)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, seq_idx, states)
        ctx.kernels, ctx.config, ctx.shape, ctx.flags = kernels, config, shape, flags
        ctx.has_h0 = initial_state is not None
        ctx.set_materialize_grads(False)  # an unused last state brings None, not zeros
        return (out, last) if return_last_state else out

    @staticmethod
    def backward(ctx, dout, dlast=None):
        u, delta, A, B, C, D, z, delta_bias, seq_idx, states = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(u)
        need_g0 = ctx.has_h0 and ctx.needs_input_grad[-1]
        *grads, g0 = ctx.kernels.backward(dout, dlast, u, delta, A, B, C, D, z, delta_bias,
                                          ctx.flags, seq_idx, states, ctx.shape, ctx.config,
                                          need_g0)
        dh0 = initial_state_grad(g0, delta, delta_bias, ctx.flags["SOFTPLUS"], A) \
            if need_g0 else None
        return (None, None, None, None, None, None, *grads, dh0)


def run(kernels, config, u, delta, A, B, C, D=None, z=None, delta_bias=None,
        delta_softplus=False, return_last_state=False, seq_idx=None, cu_seqlens=None,
        initial_state=None):
    """Check the arguments, then run ``kernels`` forward (and backward through autograd).

    ``config``: a function of (n, device, l) returning what both launchers get (None: none).
    Every tensor is made contiguous here (a no-op for those already so; autograd takes the
    gradients back to the caller's views), so the launchers may assume it."""
    shape, seq_idx = check_args(u, delta, A, B, C, D, z, delta_bias, seq_idx, cu_seqlens,
                                initial_state)
    u, delta, A, B, C, D, z, delta_bias, initial_state = (
        None if t is None else t.contiguous()
        for t in (u, delta, A, B, C, D, z, delta_bias, initial_state))
    b, d, l, n, _ = shape
    if b * d * l == 0:  # nothing to scan: an empty output, the state as it came in
        last = u.new_zeros((b, d, n), dtype=torch.float32) if initial_state is None \
            else initial_state.clone()
        out = u * 0  # (b, d, l), empty; on u's graph
        return (out, last) if return_last_state else out
    config = config(n, u.device, l) if config is not None else None
    switches = flags(D, z, delta_bias, delta_softplus, B, C, seq_idx)  # once, for every launch
    return SelectiveScanFn.apply(kernels, config, shape, switches, return_last_state,
                                 seq_idx, u, delta, A, B, C, D, z, delta_bias, initial_state)
