"""The Mamba-3 MIMO prefill forward in Triton: one program per (head, batch), chunks in order.

The r ranks fold into the rows (``mambalearn.mamba3.mimo_reference``): chunk c is a block of q·r
rows, row i = t·r + ρ holding q_{t,ρ}, k_{t,ρ} (rotated by θ_t, biases added) and v_{t,ρ} = x_t ⊙
Ψ_ρ. Then per chunk, with the state H (p × n, float32) kept in registers from chunk to chunk,

    S = Q Kᵀ                                   (q·r × q·r)  tl.dot: the rank-r products
    y = (S ∘ L) V + e^{c} ∘ (Q Hᵀ) + D V         (q·r × p)    L: e^{c_t − c_s} w_s below the step
                                                             diagonal, γ_t on it (same step)
    out_t = Σ_ρ Φ_ρ ⊙ y_{t,ρ} ⊙ silu(z_t ζ_ρ)     the output contraction, in registers
    H ← e^{c_end} H + (u ∘ V)ᵀ K                 (p × n),     u_s = e^{c_end − c_s} w_s

so every product is a matmul of q·r rows: r = 4 at q = 16 is a 64-row tile, the tensor cores'
shape, where SISO at q = 16 has 16. This is the structure of mamba_ssm's TileLang MIMO kernel
(``mamba_mimo_fwd``: one program per (head, batch), the state carried through the chunks). The
per-step inputs come prepared (``mimo``): θ (b, l, h, na), the trapezoid weights w, γ and ADT
(b, h, l) in float32, the pre-state H0. Matmul operands are in the inputs' dtype, accumulation
float32; the state entering each chunk is stored (in the inputs' dtype) for the backward.

Channels split: row i of the state sees only channel i of v, so the p channels may be cut into
blocks of P, one program each (program axis 2, ``config.forward_p_block``): more programs, and a
smaller state and y per program; S = Q Kᵀ, the loads and the rotations are redone by each block.
"""

import triton
import triton.language as tl

from mambalearn import device  # noqa: F401  (TRITON_INTERPRET before @triton.jit)
from mambalearn.mamba3.common import LOG2E, cos_sin, exp2, floor_log_decay, turn

SIZES = ["l", "n_chunks"]  # run-time sizes (no recompilation per length)


@triton.jit
def rows(c, l, Q: tl.constexpr, R: tl.constexpr):
    """Row i of chunk c: its step t = c·q + i // r, its rank ρ = i % r, and whether t < l."""
    i = tl.arange(0, Q * R)
    t = c * Q + i // R
    return t, i % R, t < l


@triton.jit
def row_scalars(adt_ptr, w_ptr, g_ptr, t, rho, valid):
    """Per row: c_t log₂e (c_t = Σ_{s≤t in chunk} ADT_s, counted once per step), w_t, γ_t; and
    c_end log₂e, the chunk's total."""
    adt = floor_log_decay(tl.load(adt_ptr + t, mask=valid, other=0.0))  # ADT = −∞: no NaN
    w = tl.load(w_ptr + t, mask=valid, other=0.0)
    gamma = tl.load(g_ptr + t, mask=valid, other=0.0)
    once = tl.where(rho == 0, adt, 0.0)  # a step's ADT on its first row only
    c2 = tl.cumsum(once, axis=0) * LOG2E
    # the end is c's last entry (rounded as c is, so e^{c_end − c_t} is 1 there), not a new sum
    return c2, w, gamma, tl.sum(tl.where(tl.arange(0, c2.shape[0]) == c2.shape[0] - 1, c2, 0.0),
                                axis=0)


@triton.jit
def row_angles(th_ptr, stride_t, t, valid, na, N: tl.constexpr):
    """(cos θ_t, sin θ_t) per row and pair, (q·r, N/2); (1, 0) for pairs j ≥ na."""
    offs_j = tl.arange(0, N // 2)
    th = tl.load(th_ptr + t[:, None] * stride_t + offs_j[None, :],
                 mask=valid[:, None] & (offs_j[None, :] < na), other=0.0)
    return cos_sin(th)


@triton.jit
def load_rows(ptr, bias_ptr, row_off, rho, valid, n, cos, sin, QR: tl.constexpr,
              N: tl.constexpr):
    """(X + bias) and R(θ)(X + bias) for the rows (X at ptr + row_off, bias (r, n)), (q·r, N)."""
    offs_n = tl.arange(0, N)
    mask = valid[:, None] & (offs_n[None, :] < n)
    x = tl.load(ptr + row_off[:, None] + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    x = tl.where(mask, x + tl.load(bias_ptr + rho[:, None] * n + offs_n[None, :], mask=mask,
                                   other=0.0), 0.0)
    return x, turn(x, cos, sin, QR, N)


@triton.jit
def step_mask(c2, w, gamma, Q: tl.constexpr, R: tl.constexpr):
    """L of the chunk over rows: e^{c_t − c_s} w_s for step(s) < step(t), γ_t for the same step,
    0 above; (q·r, q·r). min(·, 0) keeps 2^x finite where the mask drops the value."""
    step = tl.arange(0, Q * R) // R
    below = step[:, None] > step[None, :]
    decay = exp2(tl.minimum(c2[:, None] - c2[None, :], 0.0)) * w[None, :]
    return tl.where(below, decay, tl.where(step[:, None] == step[None, :], gamma[:, None], 0.0))


@triton.jit(do_not_specialize=SIZES)
def mimo_forward_kernel(
    C_ptr, B_ptr,  # (b, l, r, g, n): C and B of each rank
    X_ptr, Z_ptr,  # (b, l, h, p); Z may be None
    Cb_ptr, Bb_ptr,  # (h, r, n) float32 biases
    Psi_ptr, Zeta_ptr, Phi_ptr,  # (h, r, p) float32: MIMO_V, MIMO_Z, MIMO_Out (Phi may be None)
    D_ptr,  # (h,) float32 or None
    ADT_ptr, W_ptr, G_ptr,  # (b, h, l) float32: ADT, w, γ
    Th_ptr,  # (b, l, h, na) float32: θ
    H0_ptr,  # (b, h, p, n) float32 or None: the pre-state entering step 0
    Out_ptr,  # out (b, l, h, p), or (b, l, r, h, p) without Phi
    Hs_ptr,  # out (b, h, c, p, n) or None: the state entering each chunk, for the backward
    Hf_ptr, Bf_ptr,  # out (b, h, p, n) float32 final state, (b, r, h, n) last rotated k; or None
    l, n_chunks,  # run-time sizes, then the model's (compiled in)
    h: tl.constexpr, g: tl.constexpr, p: tl.constexpr, n: tl.constexpr, na: tl.constexpr,
    Q: tl.constexpr, R: tl.constexpr,  # steps per chunk, rank (powers of two, 16 ≤ q·r ≤ 128)
    P: tl.constexpr, N: tl.constexpr,  # the channels of a program (program axis 2), state tile
    SPLIT: tl.constexpr,  # more than one channel block (program axis 2 > 1)
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_OUT: tl.constexpr, HAS_H0: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,  # "ieee" for float32 operands: Triton 3.6 cannot build them in tf32
):
    pid_h, pid_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    pid_p = 0  # the channel block: a constant 0 unless the channels are split
    if SPLIT:
        pid_p = tl.program_id(2)
    QR: tl.constexpr = Q * R
    head = pid_b * h + pid_h  # (batch, head) row of the (b, h, ·) tensors
    offs_p, offs_n = pid_p * P + tl.arange(0, P), tl.arange(0, N)
    mask_pn = (offs_p[:, None] < p) & (offs_n[None, :] < n)
    H = tl.zeros([P, N], dtype=tl.float32)  # the state, carried through the chunks
    if HAS_H0:
        H = tl.load(H0_ptr + head * p * n + offs_p[:, None] * n + offs_n[None, :], mask=mask_pn,
                    other=0.0)
    D = 0.0
    if HAS_D:
        D = tl.load(D_ptr + pid_h)
    for c in range(n_chunks):
        if Hs_ptr is not None:
            tl.store(Hs_ptr + ((head * n_chunks + c) * p + offs_p[:, None]) * n
                     + offs_n[None, :], H.to(Hs_ptr.dtype.element_ty), mask=mask_pn)
        t, rho, valid = rows(c, l, Q, R)  # (q·r,) each
        c2, w, gamma, c2_end = row_scalars(ADT_ptr + head * l, W_ptr + head * l,
                                           G_ptr + head * l, t, rho, valid)
        cos, sin = row_angles(Th_ptr + (pid_b * l * h + pid_h) * na, h * na, t, valid, na, N)
        bc_row = (((pid_b * l + t) * R + rho) * g + pid_h // (h // g)) * n  # (q·r,) (b, t, ρ, g, 0)
        _, q = load_rows(C_ptr, Cb_ptr + pid_h * R * n, bc_row, rho, valid, n, cos, sin, QR, N)
        _, k = load_rows(B_ptr, Bb_ptr + pid_h * R * n, bc_row, rho, valid, n, cos, sin, QR, N)
        if Bf_ptr is not None:  # the last step's r rotated rows: the decode cache's k
            tl.store(Bf_ptr + ((pid_b * R + rho) * h + pid_h)[:, None] * n + offs_n[None, :], k,
                     mask=((t == l - 1) & (pid_p + t * 0 == 0))[:, None] & (offs_n[None, :] < n))
        # v_{t,ρ} = x_t ⊙ Ψ_ρ: the token's row read once per rank
        mask_rp = valid[:, None] & (offs_p[None, :] < p)
        # (q·r, P) offsets into (b, l, h, p)
        vt = ((pid_b * l + t) * h + pid_h)[:, None] * p + offs_p[None, :]
        x = tl.load(X_ptr + vt, mask=mask_rp, other=0.0).to(tl.float32)
        v = x * tl.load(Psi_ptr + (pid_h * R + rho)[:, None] * p + offs_p[None, :], mask=mask_rp,
                        other=0.0)
        # 1. the rank-r products and the mask L; 2. outputs; 3. the state to the chunk's end
        s = tl.dot(q.to(DOT), tl.trans(k.to(DOT)), input_precision=PRECISION)  # (q·r, q·r)
        # a where, not a product with the mask's zeros: a NaN in a later step's k (its column of
        # s) must not reach the earlier rows through 0 · NaN
        step = tl.arange(0, Q * R) // R
        s = tl.where(step[:, None] >= step[None, :], s * step_mask(c2, w, gamma, Q, R), 0.0)
        y = tl.dot(q.to(DOT), tl.trans(H.to(DOT)),
                   input_precision=PRECISION) * exp2(c2)[:, None]  # (q·r, P)
        y = tl.dot(s.to(DOT), v.to(DOT), acc=y, input_precision=PRECISION) + D * v
        if HAS_Z:  # silu(z_t ζ_ρ)
            zz = tl.load(Z_ptr + vt, mask=mask_rp, other=0.0).to(tl.float32) * tl.load(
                Zeta_ptr + (pid_h * R + rho)[:, None] * p + offs_p[None, :], mask=mask_rp,
                other=0.0)
            y = y * zz * tl.sigmoid(zz)
        if HAS_OUT:  # the output contraction Σ_ρ Φ_ρ ⊙ y_{t,ρ}: r rows to one, in registers
            y = y * tl.load(Phi_ptr + (pid_h * R + rho)[:, None] * p + offs_p[None, :],
                            mask=mask_rp, other=0.0)
            o = tl.sum(tl.reshape(y, [Q, R, P]), axis=1)  # (q, P)
            ts = c * Q + tl.arange(0, Q)
            tl.store(Out_ptr + ((pid_b * l + ts) * h + pid_h)[:, None] * p + offs_p[None, :],
                     o.to(Out_ptr.dtype.element_ty),
                     mask=(ts < l)[:, None] & (offs_p[None, :] < p))
        else:  # every rank's output: (b, l, r, h, p)
            tl.store(Out_ptr + (((pid_b * l + t) * R + rho) * h + pid_h)[:, None] * p
                     + offs_p[None, :], y.to(Out_ptr.dtype.element_ty), mask=mask_rp)
        u = exp2(c2_end - c2) * w  # (q·r,): each row's input decayed to the chunk's end
        H = H * exp2(c2_end) + tl.dot(tl.trans((v * u[:, None]).to(DOT)), k.to(DOT),
                                       input_precision=PRECISION)
    if Hf_ptr is not None:
        tl.store(Hf_ptr + head * p * n + offs_p[:, None] * n + offs_n[None, :], H, mask=mask_pn)
