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

``walk_states`` (``Config.forward_launches`` = 2) does the forward's chunk states and this pass
in one kernel, S^L_c formed inside the walk instead of read (``_state_walk_kernel`` below).
"""

import torch
import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import (
    LOG2E,
    SIZES,
    chunk_scalars,
    cos_sin,
    dot_dtype,
    exp,
    exp2,
    load_angles,
    load_turned,
    local_angles,
    mod_two_pi,
    new_steps,
    turn,
)


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


# --------------------------------------------------------------------------------------------
# The forward's first two launches in one (``Config.forward_launches`` = 2): each program owns a
# (R × BN) tile of one (batch, head) state and walks the chunks, forming S^L_c of its tile with
# the tensor cores and adding it to the state it holds in float32 registers, as chapter 11's SSD
# chunk-states kernel does. S^L never reaches memory (at b8 l2048 h32 p64 n128: 134 MB written
# and read again, ≈ 0.08 ms at 3.3 TB/s, and one launch), and S^L_c is not rounded to the
# inputs' dtype before it is added. The per-step values the later kernels read (``chunk_state``'s
# C2, W, G, Phi, Turn, Cend) are stored by the programs of the first row tile (those of the
# first column tile for C2, W, G, Cend); the other programs compute and drop them (a sigmoid
# pair and a cumsum per step: cheap next to the (R × q)·(q × BN) product). The walk is serial
# over chunks, so its parallelism is b · h · ⌈p/R⌉ · ⌈n/BN⌉ programs (b8: 1024 at R 64, BN 32;
# b1: 128, each walking 512 chunks at l 32768); the loads of a trip do not depend on the state,
# so the software pipeline (``walk_stages``) keeps the next chunks' loads in flight.
@triton.jit(do_not_specialize=SIZES)
def _state_walk_kernel(
    X_ptr, Y_ptr, Yb_ptr,  # V (b, l, h, p); K (b, l, g, n) and K_bias (h, n)
    ADT_ptr, DT_ptr, Trap_ptr, Ang_ptr,  # (b, h, l) ×3 and (b, l, h, na)
    c2_ptr, W_ptr, G_ptr, Phi_ptr,  # out: c log₂e, w, γ (b, h, l) float32; φ (b, h, l, na)
    Turn_ptr, cend_ptr,  # out: Φ_c (b, h, c, na), c_end (b, h, c)
    theta_in_ptr, X0_ptr,  # (b, h, na), (b, h, p, n) absolute frame, or None
    Out_ptr,  # out (b, h, c, p, n): H^L_c in V's dtype
    XF_ptr, theta_final_ptr,  # out: the final state (b, h, p, n) float32, angle (b, h, na)
    l, n_chunks,
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, R: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,  # chunk; tile; blocks
    STAGES: tl.constexpr, DOT: tl.constexpr,
):
    pid_t, pid_h = tl.program_id(0), tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    nb, rb = pid_t % NB, pid_t // NB  # column block fastest: neighbours share V's rows
    row = pid_b * h + pid_h
    first_r, first = rb == 0, (rb == 0) & (nb == 0)
    offs_r = rb * R + tl.arange(0, R)
    offs_n = nb * BN + tl.arange(0, BN)
    offs_j = nb * (BN // 2) + tl.arange(0, BN // 2)
    mask_r, mask_j = offs_r < p, offs_j < na
    mask = mask_r[:, None] & (offs_n[None, :] < n)
    loc_t = tl.arange(0, Q)
    tile = offs_r[:, None] * n + offs_n[None, :]
    step = p * n
    base = row * n_chunks * step

    theta = tl.zeros([BN // 2], dtype=tl.float32)
    if theta_in_ptr is not None:
        theta = tl.load(theta_in_ptr + row * na + offs_j, mask=mask_j, other=0.0)
    Hs = tl.zeros([R, BN], dtype=tl.float32)
    if X0_ptr is not None:
        Hs = tl.load(X0_ptr + row * step + tile, mask=mask, other=0.0).to(tl.float32)
        c, s = cos_sin(-theta)
        Hs = turn(Hs, c[None, :], s[None, :], R, BN)  # H^L_0 = H_in R(θ_in)
    for ci in tl.range(0, n_chunks, num_stages=STAGES):
        offs_t = ci * Q + loc_t
        mask_t = offs_t < l
        l_left = l - ci * Q
        bt = pid_b * l + ci * Q  # the chunk's first (batch, step) row
        dt, adt, lam, gamma, w = chunk_scalars(DT_ptr + row * l, ADT_ptr + row * l,
                                               Trap_ptr + row * l, offs_t, l)
        c2 = tl.cumsum(adt, axis=0) * LOG2E
        c2_end = tl.sum(tl.where(loc_t == Q - 1, c2, 0.0), axis=0)  # as ``chunk_state``
        tl.store(c2_ptr + row * l + offs_t, c2, mask=mask_t & first)
        tl.store(W_ptr + row * l + offs_t, w, mask=mask_t & first)
        tl.store(G_ptr + row * l + offs_t, gamma, mask=mask_t & first)
        tl.store(cend_ptr + row * n_chunks + ci, c2_end / LOG2E, mask=first)
        r = exp2(c2_end - c2) * w  # e^{c_end − c_t} w_t
        if nb * (BN // 2) < na:  # a block with turning pairs (a run-time branch: nb is)
            phi, turned = local_angles(Ang_ptr + (bt * h + pid_h) * na, h * na, loc_t, offs_j,
                                       l_left, na, dt)
            phi = phi.to(Phi_ptr.dtype.element_ty)  # the later kernels see the same φ
            tl.store(Phi_ptr + row * l * na + offs_t[:, None] * na + offs_j[None, :], phi,
                     mask=mask_t[:, None] & mask_j[None, :] & first_r)
            tl.store(Turn_ptr + (row * n_chunks + ci) * na + offs_j, turned,
                     mask=mask_j & first_r)
            cos, sin = cos_sin(phi.to(tl.float32))
        else:
            turned = tl.zeros([BN // 2], dtype=tl.float32)
            cos = tl.full([Q, BN // 2], 1.0, tl.float32)
            sin = tl.zeros([Q, BN // 2], dtype=tl.float32)
        y = load_turned(Y_ptr + (bt * g + pid_h // (h // g)) * n, Yb_ptr + pid_h * n, g * n,
                        loc_t, offs_n, l_left, n, cos, sin, Q, BN)  # (Q, BN)
        x = tl.load(X_ptr + (bt * h + pid_h) * p + loc_t[:, None] * h * p + offs_r[None, :],
                    mask=mask_t[:, None] & mask_r[None, :], other=0.0).to(tl.float32)  # (Q, R)
        xr = tl.trans(x * r[:, None]).to(DOT)  # (R, Q)
        if DOT == tl.float32:  # transposed, as in ``chunk_state`` (a tf32 wgmma's B operand)
            S = tl.trans(tl.dot(tl.trans(y), tl.trans(xr)))
        else:
            S = tl.dot(xr, y.to(DOT))  # (R, BN)
        tl.store(Out_ptr + base + ci * step + tile, Hs.to(Out_ptr.dtype.element_ty), mask=mask)
        c, s = cos_sin(-turned)
        Hs = turn(exp2(c2_end) * Hs + S, c[None, :], s[None, :], R, BN)  # (a H + S) R(Φ_c)
        theta = mod_two_pi(theta + turned)
    c, s = cos_sin(theta)
    tl.store(XF_ptr + row * step + tile, turn(Hs, c[None, :], s[None, :], R, BN), mask=mask)
    tl.store(theta_final_ptr + row * na + offs_j, theta, mask=mask_j & first_r)


def walk_states(x, chunk_size, theta_in, H_in, cfg):
    """The forward's chunk states and state passing in one launch (``_state_walk_kernel``):
    (H^L (b, h, c, p, n) in V's dtype, final state (b, h, p, n) and angle (b, h, na) float32,
    steps) with ``steps`` as ``chunk_state.chunk_states`` returns it."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    Qc = int(chunk_size)
    c = triton.cdiv(l, Qc)
    steps = new_steps(V, b, h, l, c, na)
    H = torch.empty(b, h, c, p, n, device=V.device, dtype=V.dtype)
    final = torch.empty(b, h, p, n, device=V.device, dtype=torch.float32)
    theta_final = torch.empty(b, h, na, device=V.device, dtype=torch.float32)
    N = max(16, triton.next_power_of_2(n))
    BN = min(N, cfg.walk_col_block)
    R = min(cfg.walk_rows, max(16, triton.next_power_of_2(p)))
    _state_walk_kernel[(triton.cdiv(p, R) * (N // BN), h, b)](
        V, x["K"], x["K_bias"], x["ADT"], x["DT"], x["Trap"], x["Angles"],
        steps["C2"], steps["W"], steps["G"], steps["Phi"], steps["Turn"], steps["Cend"],
        theta_in, H_in, H, final, theta_final,
        l, c, h, g, p, n, na,
        Q=Qc, R=R, BN=BN, NB=N // BN, STAGES=cfg.walk_stages, DOT=dot_dtype(V),
        num_warps=cfg.walk_warps,
    )
    return H, final, theta_final, steps


# The backward's first two launches in one (``Config.state_grad_launches`` = 1): the reverse walk
# forms dS^L_c = Σ_t e^{c_t} dy_t (R(φ_t) q̃_t)ᵀ of its tile inside the walk (``chunk_state``'s
# GRAD pass) instead of reading it; the gate (dz, dy = dout · silu(z)) is applied by every
# program to its rows and stored by those of the first column block.
@triton.jit(do_not_specialize=SIZES)
def _state_walk_back_kernel(
    dO_ptr, C_ptr, Cb_ptr,  # dout (b, l, h, p); Q (b, l, g, n) and Q_bias (h, n)
    Z_ptr, Ypre_ptr,  # (b, l, h, p) or None: z and the output before the gate
    dZ_ptr, dY_ptr,  # out with a gate: dz and dy = dout·silu(z), (b, l, h, p)
    c2_ptr, Phi_ptr, Turn_ptr, cend_ptr,  # the forward's per-step values (``chunk_state``)
    theta_in_ptr, theta_final_ptr,  # (b, h, na) or None, (b, h, na)
    X0_ptr,  # (b, h, p, n) or None: dH_final, absolute frame
    H_ptr,  # (b, h, c, p, n): H^L_c (the forward's)
    Out_ptr,  # out (b, h, c, p, n): D_c in dout's dtype
    XF_ptr,  # out (b, h, p, n) float32: dH_in, absolute frame
    HD_ptr,  # out (b, h, c, tiles): ⟨D_c, H^L_c⟩, a part per program
    l, n_chunks,
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    tiles: tl.constexpr,
    Q: tl.constexpr, R: tl.constexpr, BN: tl.constexpr, NB: tl.constexpr,
    HAS_Z: tl.constexpr, STAGES: tl.constexpr, DOT: tl.constexpr,
):
    pid_t, pid_h = tl.program_id(0), tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    nb, rb = pid_t % NB, pid_t // NB
    row = pid_b * h + pid_h
    first_c = nb == 0  # stores the gate's dz, dy of its rows
    offs_r = rb * R + tl.arange(0, R)
    offs_n = nb * BN + tl.arange(0, BN)
    offs_j = nb * (BN // 2) + tl.arange(0, BN // 2)
    mask_r, mask_j = offs_r < p, offs_j < na
    mask = mask_r[:, None] & (offs_n[None, :] < n)
    loc_t = tl.arange(0, Q)
    tile = offs_r[:, None] * n + offs_n[None, :]
    step = p * n
    base = row * n_chunks * step

    theta_in = tl.zeros([BN // 2], dtype=tl.float32)
    if theta_in_ptr is not None:
        theta_in = tl.load(theta_in_ptr + row * na + offs_j, mask=mask_j, other=0.0)
    X = tl.zeros([R, BN], dtype=tl.float32)
    if X0_ptr is not None:
        X = tl.load(X0_ptr + row * step + tile, mask=mask, other=0.0).to(tl.float32)
    theta_f = tl.load(theta_final_ptr + row * na + offs_j, mask=mask_j, other=0.0)
    c, s = cos_sin(-theta_f)
    X = turn(X, c[None, :], s[None, :], R, BN)  # G^L_C = dH_final R(θ_final)
    last = n_chunks - 1
    for k in tl.range(0, n_chunks, num_stages=STAGES):
        ci = last - k
        offs_t = ci * Q + loc_t
        mask_t = offs_t < l
        l_left = l - ci * Q
        bt = pid_b * l + ci * Q
        mask_tr = mask_t[:, None] & mask_r[None, :]
        tr = (bt * h + pid_h) * p + loc_t[:, None] * h * p + offs_r[None, :]  # (Q, R)
        x = tl.load(dO_ptr + tr, mask=mask_tr, other=0.0).to(tl.float32)
        if HAS_Z:
            z = tl.load(Z_ptr + tr, mask=mask_tr, other=0.0).to(tl.float32)
            sig = tl.sigmoid(z)
            ypre = tl.load(Ypre_ptr + tr, mask=mask_tr, other=0.0).to(tl.float32)
            tl.store(dZ_ptr + tr, x * ypre * sig * (1.0 + z * (1.0 - sig)),
                     mask=mask_tr & first_c)
            x = x * z * sig  # dy = dout · silu(z)
            tl.store(dY_ptr + tr, x, mask=mask_tr & first_c)
        c2 = tl.load(c2_ptr + row * l + offs_t, mask=mask_t, other=0.0)
        xr = tl.trans(x * exp2(c2)[:, None]).to(DOT)  # (R, Q): e^{c_t} dy_t
        cos, sin = load_angles(Phi_ptr + row * l * na, offs_t, nb, l, na, Q, BN)
        y = load_turned(C_ptr + (bt * g + pid_h // (h // g)) * n, Cb_ptr + pid_h * n, g * n,
                        loc_t, offs_n, l_left, n, cos, sin, Q, BN)  # (Q, BN)
        if DOT == tl.float32:  # transposed, as in ``chunk_state``
            dS = tl.trans(tl.dot(tl.trans(y), tl.trans(xr)))
        else:
            dS = tl.dot(xr, y.to(DOT))  # (R, BN)
        H = tl.load(H_ptr + base + ci * step + tile, mask=mask, other=0.0).to(tl.float32)
        phi = tl.load(Turn_ptr + (row * n_chunks + ci) * na + offs_j, mask=mask_j, other=0.0)
        a = exp(tl.load(cend_ptr + row * n_chunks + ci))
        c, s = cos_sin(phi)
        X = turn(X, c[None, :], s[None, :], R, BN)  # D_c = G^L_{c+1} R(Φ_c)ᵀ
        tl.store(Out_ptr + base + ci * step + tile, X.to(Out_ptr.dtype.element_ty), mask=mask)
        tl.store(HD_ptr + (row * n_chunks + ci) * tiles + pid_t, tl.sum(tl.sum(X * H, 1), 0))
        X = dS + a * X  # G^L_c
    c, s = cos_sin(theta_in)
    tl.store(XF_ptr + row * step + tile, turn(X, c[None, :], s[None, :], R, BN), mask=mask)


def walk_state_grads(x, steps, d_out, y_pre, H, theta_final, theta_in, dH_final, chunk_size,
                     cfg):
    """The backward's state gradients and their passing in one launch
    (``_state_walk_back_kernel``): (D, dH_in, HD) as ``pass_state_grads`` returns them, and
    (dY, dZ) as ``chunk_state.state_grads`` does."""
    V = x["V"]
    b, l, h, p = V.shape
    g, n, na = x["Q"].shape[2], x["Q"].shape[3], x["Angles"].shape[3]
    Qc = int(chunk_size)
    c = triton.cdiv(l, Qc)
    Z = x["Z"]
    dY = torch.empty_like(d_out) if Z is not None else d_out
    dZ = torch.empty_like(d_out) if Z is not None else None
    N = max(16, triton.next_power_of_2(n))
    BN = min(N, cfg.walk_col_block)
    R = min(cfg.walk_rows, max(16, triton.next_power_of_2(p)))
    programs = triton.cdiv(p, R) * (N // BN)
    D = torch.empty_like(H)
    dH_in = torch.empty(b, h, p, n, device=V.device, dtype=torch.float32)
    HD = torch.zeros(b, h, c, triton.next_power_of_2(programs), device=V.device,
                     dtype=torch.float32)
    _state_walk_back_kernel[(programs, h, b)](
        d_out, x["Q"], x["Q_bias"], Z, y_pre, dZ, dY,
        steps["C2"], steps["Phi"], steps["Turn"], steps["Cend"],
        theta_in, theta_final, dH_final, H, D, dH_in, HD,
        l, c, h, g, p, n, na, HD.shape[-1],
        Q=Qc, R=R, BN=BN, NB=N // BN, HAS_Z=Z is not None, STAGES=cfg.walk_stages,
        DOT=dot_dtype(V), num_warps=cfg.walk_warps,
    )
    return D, dH_in, HD, dY, dZ
