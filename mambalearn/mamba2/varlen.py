"""The state at the end of each packed sequence: ``return_varlen_states`` (a prefill's cache).

A serving system packs many prompts into one row (batch 1) and marks where each starts with
``cu_seqlens`` = (0, l_0, l_0 + l_1, …, l); ``seq_idx`` restarts the scan at each start. The
decode step then needs, per prompt i, the state the scan holds after its last token
e = cu_seqlens[i+1] − 1:

    h_e = exp(Σ_{u=r+1}^{e} Δ_u A) h_r + Σ_{s=r+1}^{e} exp(Σ_{u=s+1}^{e} Δ_u A) Δ_s x_s B_sᵀ

from the state h_r at the previous sequence's end r = e_{i−1} (−1: the initial state), restarted at
0 where seq_idx changes in between (the scan's own rule). One pass over the tokens, a matmul per
sequence and head (h, p, s) @ (h, s, n): O(l h p n), as the chunk states cost. Δ A is floored at
−128 as the kernels do (``common.log_decay``: A = −∞ forgets, no NaN) and summed in float64, so
a decay across thousands of tokens keeps its precision. Written in PyTorch with autograd: unlike
mamba_ssm's, gradients flow through these states.
"""

import torch

from mambalearn.mamba2.common import LOG_DECAY_FLOOR


def check_cu_seqlens(cu_seqlens, b, l):
    """cu_seqlens: a 1-D integer tensor (S + 1,), 0 first, l last, non-decreasing; batch 1."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.ndim != 1 \
            or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex \
            or cu_seqlens.dtype == torch.bool or cu_seqlens.numel() < 2:
        got = (f"{tuple(cu_seqlens.shape)} {cu_seqlens.dtype}"
               if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__)
        raise ValueError("cu_seqlens must be a 1-D integer tensor (num_sequences + 1,) of "
                         f"offsets, got {got}")
    if b != 1:
        raise ValueError("return_varlen_states needs the sequences packed into one row "
                         f"(batch 1), got batch {b}")
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or cu[-1] != l or any(a > c for a, c in zip(cu, cu[1:], strict=False)):
        raise ValueError(f"cu_seqlens must start at 0, end at the length {l} and never decrease; "
                         f"got {cu if len(cu) <= 8 else cu[:4] + ['…'] + cu[-3:]}")
    return cu


def varlen_states(x, delta, A, B, cu_seqlens, seq_idx=None, initial_states=None):
    """The scan's state after each sequence's last token: (S, h, p, n) float32.

    x (1, l, h, p); delta (1, l, h) the effective Δ (``reference.effective_dt``); A (h,); B (1, l,
    g, n); cu_seqlens (S + 1,) checked by ``check_cu_seqlens``; seq_idx (1, l) or None;
    initial_states (1, h, p, n) or None. An empty sequence i has the state after token
    cu_seqlens[i] − 1 (its predecessor's end, or the initial state)."""
    _, l, h, p = x.shape
    g, n = B.shape[2], B.shape[3]
    cu = check_cu_seqlens(cu_seqlens, x.shape[0], l)
    X = x[0].float()  # (l, h, p)
    Bh = B[0].float().repeat_interleave(h // g, dim=1)  # (l, h, n): each head's group
    dt = delta[0].float()  # (l, h)
    a = (dt.double() * A.double()).clamp(min=LOG_DECAY_FLOOR.value)  # (l, h): floored Δ A
    restart = torch.zeros(l, dtype=torch.bool, device=x.device)
    if seq_idx is not None and l > 1:
        restart[1:] = seq_idx[0, 1:] != seq_idx[0, :-1]
    state = (torch.zeros(h, p, n, device=x.device) if initial_states is None
             else initial_states[0].float())
    out = []
    for start, end in zip(cu[:-1], cu[1:], strict=True):
        if end > start:
            r = restart[start:end].nonzero()
            if len(r):  # the scan restarts inside: the state from before is forgotten
                start, state = start + int(r[-1]), torch.zeros_like(state)
                # (a restart at the segment's first token also forgets the state carried)
            seg = a[start:end]  # (s, h)
            tail = seg.flip(0).cumsum(0).flip(0) - seg  # Σ_{u=s+1}^{end−1} Δ_u A, (s, h)
            w = (tail.exp().float() * dt[start:end]).T  # (h, s)
            xs = (X[start:end].permute(1, 2, 0) * w[:, None, :])  # (h, p, s)
            state = seg.sum(0).exp().float()[:, None, None] * state \
                + xs @ Bh[start:end].transpose(0, 1)  # (h, p, n)
        out.append(state)
    return torch.stack(out)  # (S, h, p, n)
