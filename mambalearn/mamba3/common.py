"""What every Mamba-3 SISO kernel computes for one chunk of one (batch, head), and their settings.

**Local frames.** Inside chunk c the angles are θ_t = θ_c + φ_t, with θ_c the angle before the
chunk and φ_t = Σ_{s≤t in c} Δ_s π tanh(Angles_s) the chunk's own turn so far. Rotations of pairs
commute, so q_t·k_s = (R(φ_t) q̃_t)·(R(φ_s) k̃_s): everything inside a chunk only needs the
*local* angles φ. The starting angle θ_c only turns the state handed between chunks, which is
therefore kept in the frame of the chunk it enters,

    H^L_c = H_c R(θ_c)       (each row's pairs turned by −θ_c)

and ``state_passing`` turns it on by the chunk's total Φ_c. So no chunk waits for the angles of
the chunks before it, and every kernel but the state passing runs a program per chunk.

A (q, n) tile of Q or K is loaded contiguously and split into its even and odd columns by a
reshape (q, n/2, 2): the pairs (2j, 2j+1) are the real and imaginary parts of n/2 complex
numbers (chapter 15), so a rotation is four multiplies on registers and every product over n is
one ``tl.dot``. The n columns are taken BN at a time (``col_block``; pairs never straddle a block),
which halves what a program holds at n = 128 and lets blocks without turning pairs skip the
angles. Layouts are mamba_ssm's: Q, K (b, l, g, n); V, Z (b, l, h, p); ADT, DT, Trap
(b, h, l); Q_bias, K_bias (h, n); Angles (b, l, h, na).

**Names inside the kernels** follow the glossary (``mambalearn.mamba3``: Q = C, K = B, V = x):
``C_ptr``, ``B_ptr``, ``X_ptr`` and the biases ``Cb_ptr``, ``Bb_ptr`` (their tiles keep the
paper's q, k, v), so that ``Q`` is the chunk length, as in Mamba-2's kernels; ``c2_ptr`` holds the
log-decays c_t log₂e; the program ids are ``pid_b``, ``pid_h``, ``pid_c``.
"""

import triton
import triton.language as tl

from mambalearn import device
from mambalearn.triton.common import GRID_Y, LOG2E  # noqa: F401  (the kernels' constants)
from mambalearn.triton.common import exp2_ftz as exp2  # 2^x: MUFU.EX2, denormals flushed

PI = tl.constexpr(3.141592653589793)  # a global a kernel may read
TWO_PI = tl.constexpr(6.283185307179586)
LOG_DECAY_FLOOR = tl.constexpr(-128.0)  # the least ADT a step keeps (``floor_log_decay``)
# The length is a run-time int Triton should not specialise on (it would compile again for every
# l that is or is not a multiple of 16); the model's sizes (h, g, p, n, na) are compiled in
# (tl.constexpr): strides become constants and the masks of full tiles fold away.
SIZES = ["l", "n_chunks"]

# On a GPU, cos, sin and 2^x come straight from the special-function unit (one MUFU instruction
# each; |error| < 2⁻²⁰ for cos/sin on |x| ≤ 100π, relative 2⁻²² for 2^x) instead of libdevice's
# ~40-instruction cos/sin and tl.exp's five (range checks for denormals, which we flush to 0).
if device.interpreted():
    @triton.jit
    def cos_sin(x):
        """(cos x, sin x) in float32."""
        return tl.cos(x), tl.sin(x)
else:
    @triton.jit
    def cos_sin(x):
        """(cos x, sin x) in float32, by MUFU.COS / MUFU.SIN."""
        c = tl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
        s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
        return c, s


@triton.jit
def exp(x):
    """e^x = 2^{x log₂e}."""
    return exp2(x * LOG2E)


@triton.jit
def mod_two_pi(x):
    """x mod 2π in [0, 2π): cos and sin stay accurate however far the angles run."""
    return x - TWO_PI * tl.floor(x / TWO_PI)


@triton.jit
def wrap(x):
    """x mod 2π in [−π, π): half the magnitude of ``mod_two_pi``, so twice the precision when
    stored in float16, and the range where MUFU's cos/sin are most accurate."""
    return x - TWO_PI * tl.floor(x / TWO_PI + 0.5)


@triton.jit
def floor_log_decay(adt):
    """ADT floored at −128. ADT = −∞ (forget at once) would make c_t = Σ_{s≤t} ADT_s = −∞ and
    every decay e^{c_t − c_s} a NaN, −∞ − (−∞). Floored, c stays finite and the decays are the
    recurrence's: 1 from a step to itself, and across a floored step e^{≤ −128} = 0 in float32,
    as e^{ADT} was (below −104 it underflows). So no output changes for a finite input, and c
    stays small enough that c_t − c_s keeps its precision. A NaN stays NaN."""
    return tl.where(adt < LOG_DECAY_FLOOR, LOG_DECAY_FLOOR, adt)


@triton.jit
def chunk_scalars(dt_ptr, adt_ptr, trap_ptr, offs_t, l):
    """Per-step scalars of a chunk: Δ, ADT (floored: ``floor_log_decay``), λ, γ = λΔ and
    w = γ + (1 − λ_{t+1})Δ_{t+1}.

    ``dt_ptr`` etc. point at the (batch, head) row; positions ≥ l read as Δ = ADT = 0 (no step).
    """
    mask_t = offs_t < l
    dt = tl.load(dt_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32)
    adt = floor_log_decay(tl.load(adt_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32))
    lam = tl.sigmoid(tl.load(trap_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32))
    # the next step's (1 − λ)Δ: the left half of x_t's trapezoid, paid by step t + 1
    ahead = offs_t + 1 < l
    dt_next = tl.load(dt_ptr + offs_t + 1, mask=ahead, other=0.0).to(tl.float32)
    lam_next = tl.sigmoid(tl.load(trap_ptr + offs_t + 1, mask=ahead, other=0.0).to(tl.float32))
    gamma = lam * dt
    w = gamma + (1.0 - lam_next) * dt_next
    return dt, adt, lam, gamma, w


@triton.jit
def tanh(x):
    """tanh x = 1 − 2 / (e^{2x} + 1) (exact at ±∞: e^{2x} → ∞ or 0)."""
    return 1.0 - 2.0 / (exp(2.0 * x) + 1.0)


@triton.jit
def local_angles(ang_ptr, stride_t, offs_t, offs_j, l, na, dt):
    """φ_t = Σ_{s≤t in chunk} Δ_s π tanh(a_s) mod 2π (in [−π, π)), a (Q, J) tile, and the chunk's
    turn Φ (J,) mod 2π.

    Pairs j ≥ na (not rotated) and steps ≥ l read a = 0, so they do not turn.
    """
    mask = (offs_t[:, None] < l) & (offs_j[None, :] < na)
    a = tl.load(ang_ptr + offs_t[:, None] * stride_t + offs_j[None, :], mask=mask,
                other=0.0).to(tl.float32)
    rate = PI * tanh(a) * dt[:, None]  # (Q, J): the angle step t turns each pair by
    return wrap(tl.cumsum(rate, axis=0)), mod_two_pi(tl.sum(rate, axis=0))


@triton.jit
def load_steps(c2_ptr, w_ptr, g_ptr, offs_t, l):
    """The per-step values the forward's first pass stored, for rows ``offs_t`` of one
    (batch, head): c_t log₂e (c_t = Σ_{s≤t in chunk} ADT_s), w_t and γ_t; 0 beyond l."""
    mask_t = offs_t < l
    c2 = tl.load(c2_ptr + offs_t, mask=mask_t, other=0.0)
    w = tl.load(w_ptr + offs_t, mask=mask_t, other=0.0)
    gamma = tl.load(g_ptr + offs_t, mask=mask_t, other=0.0)
    return c2, w, gamma


@triton.jit
def load_angles(phi_ptr, offs_t, nb, l, na, Q: tl.constexpr, BN: tl.constexpr):
    """(cos φ, sin φ), (Q, BN/2), of the pairs of column block ``nb`` from the stored local angles
    φ (rows t, na per row); (1, 0) where nothing turns, and no load if no pair of the block does."""
    offs_j = nb * (BN // 2) + tl.arange(0, BN // 2)
    if nb * (BN // 2) < na:
        phi = tl.load(phi_ptr + offs_t[:, None] * na + offs_j[None, :],
                      mask=(offs_t[:, None] < l) & (offs_j[None, :] < na), other=0.0).to(tl.float32)
        cos, sin = cos_sin(phi)
    else:
        cos = tl.full([Q, BN // 2], 1.0, tl.float32)
        sin = tl.zeros([Q, BN // 2], dtype=tl.float32)
    return cos, sin


@triton.jit
def turn(x, cos, sin, Q: tl.constexpr, N: tl.constexpr):
    """x_e + i x_o ↦ e^{iφ}(x_e + i x_o) for every pair of a (Q, N) tile; cos, sin are (Q, N/2).

    Pass −sin to turn back (R(φ)ᵀ).
    """
    xe, xo = tl.split(tl.reshape(x, [Q, N // 2, 2]))
    return tl.reshape(tl.join(xe * cos - xo * sin, xe * sin + xo * cos), [Q, N])


@triton.jit
def pair_cross(dx, x, Q: tl.constexpr, N: tl.constexpr):
    """dx_o x_e − dx_e x_o per pair, (Q, N/2): ∂/∂φ of dx·R(φ)x̃ where x = R(φ)x̃."""
    dxe, dxo = tl.split(tl.reshape(dx, [Q, N // 2, 2]))
    xe, xo = tl.split(tl.reshape(x, [Q, N // 2, 2]))
    return dxo * xe - dxe * xo


@triton.jit
def load_biased(ptr, bias_ptr, stride_t, offs_t, offs_n, l, n):
    """X + bias: a (Q, N) tile of rows t of X, float32; 0 outside."""
    mask = (offs_t[:, None] < l) & (offs_n[None, :] < n)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < n, other=0.0).to(tl.float32)
    x = tl.load(ptr + offs_t[:, None] * stride_t + offs_n[None, :], mask=mask,
                other=0.0).to(tl.float32)
    return tl.where(mask, x + bias[None, :], 0.0)  # bias only where a step exists


@triton.jit
def load_turned(ptr, bias_ptr, stride_t, offs_t, offs_n, l, n, cos, sin, Q: tl.constexpr,
                N: tl.constexpr):
    """R(φ)(X + bias): a (Q, N) tile of rows t of X, bias added, pairs turned; 0 outside."""
    x = load_biased(ptr, bias_ptr, stride_t, offs_t, offs_n, l, n)
    return turn(x, cos, sin, Q, N)


@triton.jit
def load_qk(C_ptr, B_ptr, Cb_ptr, Bb_ptr, stride_t, offs_t, offs_n, l, n, cos, sin,
            Q: tl.constexpr, N: tl.constexpr):
    """q = R(φ)(C + C_bias), k = R(φ)(B + B_bias): (Q, N) tiles of rows t, pairs turned by the
    local angles; 0 outside. The pointers are at the head's group (C, B) and row (the biases)."""
    q = load_turned(C_ptr, Cb_ptr, stride_t, offs_t, offs_n, l, n, cos, sin, Q, N)
    k = load_turned(B_ptr, Bb_ptr, stride_t, offs_t, offs_n, l, n, cos, sin, Q, N)
    return q, k


@triton.jit
def causal_decay(c2, Q: tl.constexpr):
    """M_ts = exp(c_t − c_s) for s < t, 0 on and above the diagonal: a (Q, Q) tile, from
    c2 = c log₂e (Q,)."""
    rows = tl.arange(0, Q)
    # min(·, 0) keeps 2^x from overflowing where the mask throws the value away anyway
    M = exp2(tl.minimum(c2[:, None] - c2[None, :], 0.0))
    return tl.where(rows[:, None] > rows[None, :], M, 0.0)


def blocks(n, p, chunk_size, col_block):
    """(BN, NB, P, Q): the column block (at most ``col_block``) and how many cover n, the channel
    tile (≥ p) and the chunk; all powers of two ≥ 16 (``tl.dot``), and BN even so that pairs stay
    in one block. ``chunk_size`` as the entry point checked it (``args.check_chunk``)."""
    N = max(16, triton.next_power_of_2(n))
    BN = min(N, int(col_block))
    P = max(16, triton.next_power_of_2(p))
    return BN, N // BN, P, chunk_size


def warps(n, chunk):
    """``n`` warps (a config's, for chunks of 64) for chunks of 64 or less, twice as many per
    doubling beyond: the (q × q) tiles grow with q², the registers of a thread must not."""
    return n * max(1, int(chunk) // 64)


def dot_dtype(t):
    """The operand dtype of ``tl.dot`` for inputs like ``t``: bf16/fp16 as is, else float32."""
    import torch

    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}.get(t.dtype, tl.float32)


def new_steps(V, b, h, l, c, na):
    """The per-step values' tensors (``chunk_state.chunk_states``), empty, on V's device."""
    import torch

    new = lambda *s: torch.empty(*s, device=V.device, dtype=torch.float32)
    # φ ∈ [−π, π) in float16 for bf16 inputs: its rounding (≤ 2⁻¹⁰ rad) is below theirs
    phi = torch.empty(b, h, l, na, device=V.device,
                      dtype=torch.float16 if V.dtype == torch.bfloat16 else torch.float32)
    return dict(C2=new(b, h, l), W=new(b, h, l), G=new(b, h, l), Phi=phi,
                Turn=new(b, h, c, na), Cend=new(b, h, c))
