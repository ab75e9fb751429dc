"""The fused Mamba-1 selective scan in Triton, forward and backward (chapter 09): the tuned kernels.

    Δ_t = softplus(delta_t + delta_bias)      Ā_t = exp(Δ_t A)      B̄_t x_t = Δ_t B_t x_t
    h_t = Ā_t h_{t−1} + Δ_t B_t x_t           y_t = C_t h_t + D x_t  out_t = y_t · silu(z_t)

`selective_scan_fn` takes the arguments, layouts and dtypes of ``mamba_ssm.selective_scan_fn``
and adds what it lacks: variable-length sequences packed in one row (``seq_idx`` or
``cu_seqlens``; where the sequence index changes, the state restarts: Ā_t = 0), a given state
before step 0 (``initial_state``), and gradients through the returned last state — the two a
context-parallel scan needs (chapter 14). Its launch settings are a `config.Config`.

The kernels, one module each in ``fused/``: ``forward`` (a scan along time per state, a state
stored per chunk), ``recurrent`` (one channel a thread, every state in registers, step by step),
``state_outer`` (the default backward up to n = the chunk) and ``backward`` (the sub-block
backward), both launched by ``mambalearn.mamba1.backward``; ``segments`` cuts a sequence into
pieces that run side by side where the batch is too small to fill the GPU (a summary per piece, the
⊗-fold of the summaries before each segment, then the kernels above on every segment at once);
``config`` holds the settings and the plan (`segment_plan`), ``tile`` the jit helpers they share,
``triton.deterministic`` the fixed-order sum that replaces the backward's dB/dC atomics in the
deterministic mode (``Config.deterministic``).
"""

import triton

from mambalearn.mamba1.args import Kernels, run
from mambalearn.mamba1.backward import backward
from mambalearn.mamba1.config import (
    Config,
    default_config,
    segment_plan,
    summary_split,
)
from mambalearn.mamba1.fused import forward as scan
from mambalearn.mamba1.fused import recurrent, segments
from mambalearn.triton.common import sm_count


def forward(u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, initial_state, shape,
            config):
    """Launch the forward ``config.forward.layout`` names, the sequence cut into as many
    segments as `segment_plan` says (with more than one, their summaries and the fold first).
    Returns out (b, d, l), the states entering each chunk (b, d, c, n) fp32 and the last state
    (b, d, n) fp32."""
    b, d, l, n, g = shape
    fc = config.forward
    programs = b * g * triton.cdiv(d // g, fc.block_d)  # a segment's
    sms = sm_count(u.device)  # (0 on the interpreter: not cut unless the config asks)
    S, seg_len = segment_plan(config.segments, programs, fc.per_sm, l, config.segment_unit, sms)
    starts = None
    if S > 1 or initial_state is not None:
        k = summary_split(S, seg_len, b * g * triton.cdiv(d // g, config.summary.block_d)
                          * config.summary.state_split, config.summary, sms)
        starts = segments.forward_starts(u, delta, A, B, delta_bias, flags, seq_idx,
                                         initial_state, shape, S, seg_len, k, config.summary)
    kernel = recurrent if fc.layout == "recurrent" else scan
    return kernel.forward(u, delta, A, B, C, D, z, delta_bias, flags, seq_idx, starts,
                          seg_len, shape, config)


TUNED = Kernels("tuned", forward, backward)


def selective_scan_fn(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                      return_last_state=False, seq_idx=None, cu_seqlens=None, initial_state=None,
                      config=None, deterministic=None):
    """out = (C·h + D·x)·silu(z),  h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t,  Δ = softplus(δ + bias).

    Shapes (as ``mamba_ssm.selective_scan_fn``):
        u, delta, z:    (b, d, l) float32 / float16 / bfloat16 (one dtype)
        A:              (d, n) float32, real (complex A raises TypeError); n ≤ 256
        B, C:           (b, n, l) or (b, g, n, l) in u's dtype or float32, or fixed (d, n) float32
        D, delta_bias:  (d,) float32
        seq_idx:        (b, l) int, optional: packed sequences; the state restarts where it changes
        cu_seqlens:     (k + 1,) int, optional, b = 1: cumulative lengths [0, …, l] of k sequences
        initial_state:  (b, d, n) float32, optional: h_{−1}, the state before step 0 (zeros if
                        None); with packed sequences, the first sequence's (later ones start at 0)
        returns out (b, d, l) in u's dtype; with return_last_state (out, h_{l−1} (b, d, n)
        float32) — for packed sequences, the state of the row's last sequence.

    Gradients flow to every tensor argument, initial_state included, and through the last state
    (its gradient seeds the reverse scan); mamba_ssm has neither. Matches
    ``mamba_ssm.ops.selective_scan_interface.selective_scan_fn`` (real A).
    ``config`` (not in mamba_ssm): a `Config` (None: ``default_config(n, u.device, l)``).
    ``deterministic`` (not in mamba_ssm): True gives the same bits on every run and at every
    position in the batch (the backward's dB/dC summed in a fixed order, not with atomics; what
    it costs and what stays batch-dependent: `Config`); None: the config's (False by default).
    Non-finite inputs: an entry of A at −∞ (a state that forgets at every step) gives the
    recurrence's output and finite gradients, their limit (the backward floors A at −1e30,
    ``tile.floor_A``: no 0 · (−∞)); a NaN in one token of one channel reaches that
    channel's outputs of that sequence at that step and after, and nothing else (in the backward
    the gradients that sum over channels or over the batch, dA, dB, dC, dD, carry it further).
    """
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a mambalearn.mamba1.config.Config (or None), got "
                        f"{type(config).__name__}")
    if deterministic is not None and not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True, False or None, got {deterministic!r}")
    if config is not None and deterministic is not None \
            and deterministic != config.deterministic:
        raise ValueError(f"deterministic={deterministic} contradicts config.deterministic="
                         f"{config.deterministic}: pass one of them")

    def pick(n, device, l):  # the launch settings for n states (after the argument checks)
        if config is None:
            return default_config(n, device, l, deterministic=bool(deterministic))
        config.check(n)
        return config

    return run(TUNED, pick, u, delta, A, B, C, D, z, delta_bias, delta_softplus,
               return_last_state, seq_idx, cu_seqlens, initial_state)
