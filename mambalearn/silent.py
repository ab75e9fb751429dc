"""Silent bugs: kernels that run, return numbers of the right shape, and are wrong (chapter 17).

Each bug comes as a broken function and its fix, small enough to run in Triton's CPU interpreter:

    tile_offsets(rows, stride, length, block, wide)
                      (a) the offsets row·stride + j of a (rows, length) launch: in int32 they
                      wrap past 2³¹ − 1;  wraps_int32(v): what int32 makes of v
    decay_naive(a), decay_matrix(a), decay_floored(a, floor)
                      (b) L = exp(segsum(a)): exp of cumsum differences masked after exp (Inf,
                      NaN gradients) vs masked to −∞ before exp; and the kernels' way, one
                      cumsum of a floored a, its differences masked before exp
    row_sums(x, block, masked), poisoned(rows, n, pad)
                      (d) a tiled reduction with and without its last tile's mask; rows with
                      poison after them
    interpreter_asserts()   (d) ``tl.device_assert`` switched on in the CPU interpreter
    dot_kernel, DOT_SIGNATURE, dot(a, b)
                      (e) one ``tl.dot`` tile, to compile for sm_90 (K < 16, shared memory)
    arrival_scatter_sum(parts, target, arrival, rows), scatter_sum_in_order(parts, target, rows)
                      (f) atomics' order (whoever arrives first adds first) vs a fixed order
    tiled_sum(x, block)
                      (f) a row summed in tiles of ``block``: the tile (an autotuner's choice)
                      decides the order of the additions, hence the last bits

tf32 (c) needs no kernel here: ``machine.round_to_tf32`` is the tensor cores' cut.
"""

import contextlib
import dataclasses

import torch
import triton
import triton.language as tl

from mambalearn import device as _device
from mambalearn import launches
from mambalearn.mamba2.reference import segsum
from mambalearn.utils import check_tensor

INT32_MAX = 2**31 - 1


# --- (a) offsets ----------------------------------------------------------------------------------

@triton.jit
def offsets_kernel(out_ptr, stride, length, BLOCK: tl.constexpr, WIDE: tl.constexpr):
    row = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if WIDE:
        row = row.to(tl.int64)  # the product row·stride is then computed in 64 bits
    offset = row * stride + j  # int32 · int32 wraps silently past 2³¹ − 1
    tl.store(out_ptr + tl.program_id(0) * length + j, offset.to(tl.int64), mask=j < length)


def tile_offsets(rows, stride, length, block=16, wide=True, device=None):
    """The element offset ``row·stride + j`` a kernel computes for row ``row`` < ``rows`` and column
    ``j`` < ``length``, as a (rows, length) int64 tensor, computed *inside* a Triton kernel.

    ``wide=False`` computes it as Triton does by default for a 32-bit ``stride`` (int32: it wraps
    once row·stride passes 2³¹ − 1); ``wide=True`` makes the row index int64 first. No tensor of
    rows·stride elements is allocated: the offsets are computed, not used. ``device``: where the
    kernel runs (default: the GPU when there is one).
    """
    for name, v in (("rows", rows), ("stride", stride), ("length", length), ("block", block)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if stride > INT32_MAX:
        raise ValueError(f"stride must fit in 32 bits (≤ {INT32_MAX}), got {stride}: a larger one "
                         f"is passed to the kernel as int64 and cannot show the wrap")
    if block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    out = torch.empty(rows, length, dtype=torch.int64, device=device or _device.get())
    grid = (rows, -(-length // block))
    offsets_kernel[grid](out, stride, length, BLOCK=block, WIDE=bool(wide))
    return out


def wraps_int32(values):
    """``values`` (an int64 tensor or Python ints) as int32 arithmetic leaves them: v mod 2³²,
    read as a signed number."""
    v = torch.as_tensor(values, dtype=torch.int64)
    return (v + 2**31) % 2**32 - 2**31


# --- (b) the segment sum's exponent ---------------------------------------------------------------

def decay_naive(a):
    """L = exp(segsum(a)) the short way: exp(cumsum_t − cumsum_s), then zero above the diagonal.

    Wrong three ways: above the diagonal cumsum_t − cumsum_s > 0 and exp overflows to Inf (masked
    afterwards by ``torch.where``, whose backward multiplies that Inf by 0: NaN gradients); a = −∞
    (a reset) makes −∞ − (−∞) = NaN below it; and the difference of two large cumsums loses the
    digits of a short segment. Shapes: a (..., T) → (..., T, T).
    """
    check_tensor("a", a)
    cs = torch.cumsum(a, dim=-1)
    T = a.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
    return torch.where(causal, torch.exp(cs[..., :, None] - cs[..., None, :]), 0.0)


def decay_matrix(a):
    """L = exp(segsum(a)): every exponent is a sum over its own segment (never a difference of
    two cumsums), and the entries above the diagonal are −∞ *before* exp, so exp gives exactly 0
    and its gradient there is exp(−∞)·g = 0. Shapes: a (..., T) → (..., T, T)."""
    check_tensor("a", a)
    return torch.exp(segsum(a))


def decay_floored(a, floor=-128.0):
    """L = exp(segsum(a)) the way a chunked kernel affords it: one cumsum c of a per chunk (the
    segment sums cost a (T, T) cumsum), each a_k floored at ``floor`` first, and the differences
    c_t − c_s masked to −∞ *before* exp. The floor keeps c finite at a reset (a_k = −∞), so no
    −∞ − (−∞); below ≈ −104 exp is 0 in float32 anyway, so no finite input changes; and c stays
    small enough that a short segment keeps its digits. Its gradient is 0 where the floor bites
    (the true one, a_k's e^{a_k}·…, is 0 in float32 too). Shapes: a (..., T) → (..., T, T)."""
    check_tensor("a", a)
    cs = torch.cumsum(a.clamp(min=floor), dim=-1)
    T = a.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=a.device).tril()
    return torch.exp(torch.where(causal, cs[..., :, None] - cs[..., None, :], float("-inf")))


# --- (d) masks ------------------------------------------------------------------------------------

@triton.jit
def row_sums_kernel(x_ptr, out_ptr, n, stride_row, BLOCK: tl.constexpr, MASKED: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        j = start + tl.arange(0, BLOCK)
        if MASKED:
            x = tl.load(x_ptr + row * stride_row + j, mask=j < n, other=0.0)
        else:  # the last tile reads past the row's n elements when BLOCK does not divide n
            x = tl.load(x_ptr + row * stride_row + j)
        acc += x
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def row_sums(x, block=16, masked=True):
    """Σ_j x[r, j] for each row, a Triton kernel that walks the row in tiles of ``block``.

    ``masked=False`` leaves the mask off the tiles' loads: the last tile of a row of n elements
    reads block − n mod block elements past it (the next row's, or whatever lies after the
    tensor). Shapes: x (r, n) float32, rows of unit stride → (r,) float32.
    """
    check_tensor("x", x, ndim=2, dtypes=(torch.float32,))
    if x.shape[1] and x.stride(1) != 1:
        raise ValueError(f"x must have unit stride along its rows, got strides {x.stride()}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    r, n = x.shape
    out = torch.empty(r, dtype=torch.float32, device=x.device)
    if r:
        row_sums_kernel[(r,)](x, out, n, x.stride(0), BLOCK=block, MASKED=bool(masked))
    return out


def poisoned(rows, n, pad, value=float("nan"), generator=None, device=None):
    """(x, buffer): x (rows, n) random float32, a view into ``buffer`` (rows, n + pad) whose last
    ``pad`` columns hold ``value``. A kernel that reads past a row's n elements reads the poison.
    ``device``: where the buffer lives (default: the GPU when there is one)."""
    buffer = torch.full((rows, n + pad), value, dtype=torch.float32)
    buffer[:, :n] = torch.randn(rows, n, generator=generator)
    buffer = buffer.to(device or _device.get())
    return buffer[:, :n], buffer


@contextlib.contextmanager
def interpreter_asserts():
    """Inside this block Triton's CPU interpreter checks ``tl.device_assert``.

    On a GPU ``TRITON_DEBUG=1`` compiles the asserts in; the interpreter of Triton 3.6 to 3.9
    ignores that variable (its builder's options say ``debug=False``), so the switch is thrown
    here by hand. Raises RuntimeError where the interpreter does not have that switch.
    """
    from triton.runtime import interpreter

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not dataclasses.is_dataclass(options) or not hasattr(options, "debug"):
        raise RuntimeError("this Triton's interpreter has no debug switch to turn on")
    builder.options = dataclasses.replace(options, debug=True)
    try:
        yield
    finally:
        builder.options = options


# --- (e) the compile only a real GPU refuses ------------------------------------------------------

DOT_SIGNATURE = {"a_ptr": "*fp32", "b_ptr": "*fp32", "c_ptr": "*fp32", "M": "constexpr",
                 "N": "constexpr", "K": "constexpr", "PRECISION": "constexpr"}


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
               PRECISION: tl.constexpr):
    m, n, k = tl.arange(0, M), tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])  # (M, K)
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])  # (K, N)
    tl.store(c_ptr + m[:, None] * N + n[None, :], tl.dot(a, b, input_precision=PRECISION))


# the same kernel for a K below 16: the interpreter runs it, an sm_90 build refuses it (section (e)
# shows both), so its launches are left out of the build check of everything the course launched
_dot_kernel_any_k = launches.interpreter_only(
    triton.jit(dot_kernel.fn), "a tl.dot with K < 16 that the chapter runs in the interpreter")


def dot(a, b, precision="ieee"):
    """a @ b in one ``tl.dot`` tile (fp32 in; ``precision``: "ieee" or "tf32"). Shapes: a (M, K),
    b (K, N), each a power of two; runs in the interpreter for any K, compiles for a GPU only
    with M, N, K ≥ 16."""
    check_tensor("a", a, ndim=2, dtypes=(torch.float32,))
    check_tensor("b", b, ndim=2, dtypes=(torch.float32,))
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2:
        raise ValueError(f"a is (M, K) = {tuple(a.shape)} and b (K, N) = {tuple(b.shape)}: the K "
                         f"must agree")
    kernel = dot_kernel
    if min(M, N, K) < 16:
        if not _device.interpreted():
            raise ValueError(f"a (M, K) = {tuple(a.shape)} and b (K, N) = {tuple(b.shape)}: on a "
                             f"GPU one tl.dot tile needs M, N and K of at least 16")
        kernel = _dot_kernel_any_k
    out = torch.empty(M, N, dtype=torch.float32, device=a.device)
    kernel[(1,)](a.contiguous(), b.contiguous(), out, M=M, N=N, K=K, PRECISION=precision)
    return out


# --- (f) order: atomics and tiles -----------------------------------------------------------------

def _check_scatter(parts, target, rows):
    check_tensor("parts", parts, ndim=2, dtypes=(torch.float32,))
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64 \
            or tuple(target.shape) != (parts.shape[0],):
        raise ValueError(f"target must be an int64 tensor of shape ({parts.shape[0]},): the row "
                         f"of each program")
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive int, got {rows!r}")
    if target.numel() and not (0 <= int(target.min()) and int(target.max()) < rows):
        raise ValueError(f"target must hold rows 0..{rows - 1}")


def arrival_scatter_sum(parts, target, arrival, rows):
    """What ``tl.atomic_add`` does: program k adds its (d,) ``parts[k]`` to row ``target[k]`` of a
    (rows, d) float32 sum, in the order the programs happen to finish (``arrival``: a permutation
    of the program ids, first arrival first). The bits depend on that order."""
    _check_scatter(parts, target, rows)
    out = torch.zeros(rows, parts.shape[1], dtype=torch.float32)
    for k in arrival.tolist():
        out[target[k]] += parts[k]
    return out


def scatter_sum_in_order(parts, target, rows):
    """The deterministic version: each row sums its programs' parts in program order, whatever
    order they finished in — the same bits every run and wherever the row sits."""
    _check_scatter(parts, target, rows)
    out = torch.zeros(rows, parts.shape[1], dtype=torch.float32)
    for k in range(parts.shape[0]):
        out[target[k]] += parts[k]
    return out


def tiled_sum(x, block):
    """Σ x over a 1-D float32 tensor as a tiled kernel adds it: ``block`` running sums (lane i
    adds x[i], x[i + block], …), then those ``block`` lanes added pairwise. Another ``block``
    is another order of the same additions, and float addition is not associative."""
    check_tensor("x", x, ndim=1, dtypes=(torch.float32,))
    if block < 1 or block & (block - 1):
        raise ValueError(f"block must be a power of two, got {block}")
    n = x.shape[0]
    lanes = torch.zeros(block, dtype=torch.float32)
    for start in range(0, n, block):
        tile = torch.zeros(block, dtype=torch.float32)
        tile[: min(block, n - start)] = x[start:start + block]
        lanes = lanes + tile
    while lanes.shape[0] > 1:  # a tree, as tl.sum reduces across a tile
        lanes = lanes[0::2] + lanes[1::2]
    return lanes[0]
