"""The only sequential part: the state handed from chunk to chunk, forward and backward.

Each chunk is one affine step of the state (chapter 03's ⊗), written in the frames of the chunks
(``common``): with a_c = e^{c_end}, Φ_c the chunk's turn and S^L_c its own inputs (``chunk_state``),

    forward    H^L_{c+1} = (a_c H^L_c + S^L_c) R(Φ_c),        H^L_0 = H_in R(θ_in)
    backward   D_c = G^L_{c+1} R(Φ_c)ᵀ,   G^L_c = dS^L_c + a_c D_c,   G^L_C = dH_final R(θ_final)

where H^L_c is the (pre-)state entering chunk c and D_c the gradient of the state leaving it, both
in chunk c's frame, which is what the chunk kernels read. "X R(θ)" turns the pairs of every row of
X by −θ. The final state is H^L_C R(θ_final)ᵀ, the gradient of the initial one G^L_0 R(θ_in)ᵀ.
The backward pass also forms ⟨D_c, H^L_c⟩ (the decay a_c's gradient is a_c times it), per program.

A program owns ``state_rows`` rows of one (batch, head) state (all n columns) and walks the
chunks; its loop is software-pipelined (``state_stages``): the loads of the next chunks go out
before the work on chunk c, so the chain waits on one load latency, not one per chunk. The
pass moves two (b, h, c, p, n) tensors and does no matmul: it is bound by memory bandwidth.
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import SIZES, cos_sin, exp, mod_two_pi, turn


@triton.jit
def _turn_rows(X, theta, R: tl.constexpr, N: tl.constexpr):
    """X R(θ)ᵀ for an (R, N) tile: every row's pairs turned by +θ (J,)."""
    c, s = cos_sin(theta)
    return turn(X, c[None, :], s[None, :], R, N)


@triton.jit(do_not_specialize=SIZES)
def _state_passing_kernel(
    S_ptr,  # (b, h, c, p, n): S^L_c (forward) or dS^L_c (backward)
    Phi_ptr, cend_ptr,  # (b, h, c, na) the chunks' turns, (b, h, c) their log-decays
    theta_in_ptr,  # (b, h, na) or None: the angle before the first step
    theta_final_ptr,  # (b, h, na): out (forward) or in (backward) the angle after the last step
    X0_ptr,  # (b, h, p, n) or None: H_in (forward) or dH_final (backward), absolute frame
    Out_ptr,  # out (b, h, c, p, n): H^L_c (forward) or D_c (backward)
    XF_ptr,  # out (b, h, p, n): the final state (forward) or dH_in (backward), absolute, float32
    H_ptr, HD_ptr,  # backward: H^L_c (the forward's Out) and out ⟨D_c, H^L_c⟩ (b, h, c, tiles)
    n_chunks, h: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    tiles: tl.constexpr,  # the parts of ⟨D_c, H^L_c⟩ per chunk (≥ the programs per state)
    R: tl.constexpr, N: tl.constexpr,  # rows per program, state columns (power of two)
    REVERSE: tl.constexpr,  # False: forward; True: backward
    STAGES: tl.constexpr,  # the loop's pipeline: each chunk's loads go out STAGES − 1 trips ahead
):
    pid_r, pid_h = tl.program_id(0), tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    row = pid_b * h + pid_h
    offs_r = pid_r * R + tl.arange(0, R)
    offs_n, offs_j = tl.arange(0, N), tl.arange(0, N // 2)
    mask = (offs_r[:, None] < p) & (offs_n[None, :] < n)
    mask_j = offs_j < na
    tile = offs_r[:, None] * n + offs_n[None, :]  # (R, N) offsets inside one (p, n) state
    step = p * n  # from one chunk's state to the next
    base = row * n_chunks * step

    theta_in = tl.zeros([N // 2], dtype=tl.float32)
    if theta_in_ptr is not None:
        theta_in = tl.load(theta_in_ptr + row * na + offs_j, mask=mask_j, other=0.0)
    X = tl.zeros([R, N], dtype=tl.float32)
    if X0_ptr is not None:
        X = tl.load(X0_ptr + row * step + tile, mask=mask, other=0.0).to(tl.float32)

    if not REVERSE:
        X = _turn_rows(X, -theta_in, R, N)  # H^L_0 = H_in R(θ_in)
        theta = theta_in
        for ci in tl.range(0, n_chunks, num_stages=STAGES):
            S = tl.load(S_ptr + base + ci * step + tile, mask=mask, other=0.0).to(tl.float32)
            phi = tl.load(Phi_ptr + (row * n_chunks + ci) * na + offs_j, mask=mask_j, other=0.0)
            a = exp(tl.load(cend_ptr + row * n_chunks + ci))
            tl.store(Out_ptr + base + ci * step + tile, X.to(Out_ptr.dtype.element_ty), mask=mask)
            X = _turn_rows(a * X + S, -phi, R, N)  # (a_c H^L_c + S^L_c) R(Φ_c)
            theta = mod_two_pi(theta + phi)
        tl.store(XF_ptr + row * step + tile, _turn_rows(X, theta, R, N), mask=mask)
        if pid_r == 0:
            tl.store(theta_final_ptr + row * na + offs_j, theta, mask=mask_j)
    else:
        theta_f = tl.load(theta_final_ptr + row * na + offs_j, mask=mask_j, other=0.0)
        X = _turn_rows(X, -theta_f, R, N)  # G^L_C = dH_final R(θ_final)
        last = n_chunks - 1
        for k in tl.range(0, n_chunks, num_stages=STAGES):
            ci = last - k
            dS = tl.load(S_ptr + base + ci * step + tile, mask=mask, other=0.0).to(tl.float32)
            H = tl.load(H_ptr + base + ci * step + tile, mask=mask, other=0.0).to(tl.float32)
            phi = tl.load(Phi_ptr + (row * n_chunks + ci) * na + offs_j, mask=mask_j, other=0.0)
            a = exp(tl.load(cend_ptr + row * n_chunks + ci))
            X = _turn_rows(X, phi, R, N)  # D_c = G^L_{c+1} R(Φ_c)ᵀ
            tl.store(Out_ptr + base + ci * step + tile, X.to(Out_ptr.dtype.element_ty), mask=mask)
            tl.store(HD_ptr + (row * n_chunks + ci) * tiles + pid_r, tl.sum(tl.sum(X * H, 1), 0))
            X = dS + a * X  # G^L_c
        tl.store(XF_ptr + row * step + tile, _turn_rows(X, theta_in, R, N), mask=mask)


def _launch(S, Phi, Cend, theta_in, theta_final, X0, Out, XF, H, HD, reverse, cfg):
    b, h, c, p, n = S.shape
    na = Phi.shape[3]
    R = min(cfg.state_rows, triton.next_power_of_2(p))
    _state_passing_kernel[(triton.cdiv(p, R), h, b)](
        S, Phi, Cend, theta_in, theta_final, X0, Out, XF, H, HD,
        c, h, p, n, na, 1 if HD is None else HD.shape[-1],
        R=R, N=max(16, triton.next_power_of_2(n)), REVERSE=reverse,
        STAGES=cfg.state_stages, num_warps=cfg.state_warps,
    )


def pass_states(S, Phi, Cend, theta_in, H_in, cfg):
    """Forward: (H^L (b, h, c, p, n) in S's dtype, final state (b, h, p, n) and final angle
    (b, h, na), float32). ``H_in`` (b, h, p, n) in the absolute frame, ``theta_in`` (b, h, na),
    or None; ``cfg`` a `config.Config`."""
    b, h, c, p, n = S.shape
    H = torch.empty_like(S)
    final = torch.empty(b, h, p, n, device=S.device, dtype=torch.float32)
    theta_final = torch.empty(b, h, Phi.shape[3], device=S.device, dtype=torch.float32)
    _launch(S, Phi, Cend, theta_in, theta_final, H_in, H, final, None, None, False, cfg)
    return H, final, theta_final


def pass_state_grads(dS, Phi, Cend, H, theta_final, theta_in, dH_final, cfg):
    """Backward: (D (b, h, c, p, n) in dS's dtype, dH_in (b, h, p, n) float32, ⟨D_c, H^L_c⟩
    (b, h, c, T) float32, a part per program of rows (T a power of two, the rest 0))."""
    b, h, c, p, n = dS.shape
    D = torch.empty_like(dS)
    dH_in = torch.empty(b, h, p, n, device=dS.device, dtype=torch.float32)
    R = min(cfg.state_rows, triton.next_power_of_2(p))
    HD = torch.zeros(b, h, c, triton.next_power_of_2(triton.cdiv(p, R)), device=dS.device,
                     dtype=torch.float32)
    _launch(dS, Phi, Cend, theta_in, theta_final, dH_final, D, dH_in, H, HD, True, cfg)
    return D, dH_in, HD
