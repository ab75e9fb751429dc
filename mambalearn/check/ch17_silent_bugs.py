"""Checks for chapter 17: four silent bugs, each a broken function to fix.

    tile_offsets(rows, length, stride_row, stride_col, block)  → (rows, length) int64, from a
        Triton kernel: row·stride_row + j·stride_col, exact past 2³¹ − 1
    decay_matrix(a)          → exp(segsum(a)) (..., T, T), finite, with finite gradients
    row_sums(x, block)       → (r,) Σ_j x[r, j] from a tiled Triton kernel, masked at every length
    deterministic_scatter_sum(parts, target, arrival, rows) → (rows, d): the same bits whatever
        the arrival order, and wherever a row sits

A fix that hides the symptom only for some shapes fails: the offsets are tried with each of the
two products (and only their sum) past 2³¹, the decay with very negative steps and −∞ resets
(where a difference of cumsums is NaN whatever it is clamped to), forward *and* backward; the row
sums at lengths block − 1, block, block + 1 and more, with NaN poison after every row; the
scatter sum under many arrival orders, rows relabelled, and terms that cancel (where a float64
sum rounded to float32 still depends on the order).
"""

import torch

from mambalearn import device
from mambalearn.check import _core, _probes
from mambalearn.check.ch08_triton import triton_evidence
from mambalearn.mamba2 import reference as ssd

__all__ = ["tile_offsets", "decay_matrix", "row_sums", "deterministic_scatter_sum"]
REBUILDS = {
    "tile_offsets": ["mambalearn.silent.tile_offsets", "mambalearn.silent.offsets_kernel"],
    "decay_matrix": ["mambalearn.silent.decay_matrix", "mambalearn.mamba2.reference.segsum"],
    "row_sums": ["mambalearn.silent.row_sums", "mambalearn.silent.row_sums_kernel"],
    "deterministic_scatter_sum": ["mambalearn.silent.scatter_sum_in_order"],
}

HINTS = {
    "tile_offsets": [
        "row and j are int32 in the kernel, and so are strides below 2³¹: every product of two "
        "of them wraps past 2³¹ − 1",
        "make the factors 64-bit before multiplying: row = tl.program_id(0).to(tl.int64), and "
        "j.to(tl.int64) for the column term — both products can pass 2³¹ on their own",
    ],
    "decay_matrix": [
        "cumsum_t − cumsum_s is NaN when a step is −∞ (−∞ − (−∞)), and exp of the positive "
        "differences above the diagonal is Inf: no clamp of that difference fixes both",
        "sum each segment on its own: repeat a along a new axis, keep a_k only for k > s "
        "(masked_fill with 0), cumsum along t; then put −∞ above the diagonal *before* exp",
        "a torch.where after exp keeps the Inf in the graph: its backward multiplies it by 0 (NaN)",
    ],
    "row_sums": [
        "the last tile of a row reaches past its n elements unless the load is masked: "
        "tl.load(ptr, mask=j < n, other=0.0)",
        "the mask is on the column index of *this* tile (j = start + tl.arange(0, BLOCK)), "
        "compared with the row's length n, not with BLOCK or a multiple of it",
    ],
    "deterministic_scatter_sum": [
        "the result must not depend on `arrival`: add each row's parts in an order fixed by the "
        "programs, not by when they finished",
        "loop over k in range(P) (program order), or any fixed order; a float64 sum rounded to "
        "float32 still depends on the order where terms cancel",
    ],
}


# --- tile_offsets ---------------------------------------------------------------------------------

def tile_offsets(fn):
    """Check ``fn(rows, length, stride_row, stride_col, block) -> (rows, length) int64``."""
    g = _core.generator()
    big = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    cases = [  # (rows, length, stride_row, stride_col, block, what overflows)
        (1, 1, 1, 1, 16, "nothing (one element)"),
        (3, 17, big(20, 200), 1, 16, "nothing (small)"),
        (9, 5, big(2**28, 2**29), 1, 4, "row·stride_row"),
        (2, 40, 1, big(2**26, 2**27), 16, "j·stride_col"),
        (4, 33, big(2**29, 2**30), big(2**25, 2**26), 8,
         "the sum only (each product below 2³¹)"),
        (big(2, 6), big(2, 50), big(2**29, 2**31 - 1), big(2**26, 2**27), 16, "both"),
    ]
    for rows, length, sr, sc, block, what in cases:
        case = f"rows={rows}, length={length}, stride_row={sr}, stride_col={sc}, block={block}"
        out, seen = _core.probe(_probes.call_watching_triton, fn, rows, length, sr, sc, block,
                                case=case)
        triton_evidence("tile_offsets", seen, case, "offsets_kernel")
        want = torch.arange(rows)[:, None] * sr + torch.arange(length) * sc  # (rows, length) int64
        if not isinstance(out, torch.Tensor) or out.dtype != torch.int64 \
                or tuple(out.shape) != (rows, length):
            raise AssertionError(f"tile_offsets on {case}: expected a ({rows}, {length}) int64 "
                                 f"tensor, got {_core.kind(out)} "
                                 f"{getattr(out, 'dtype', '')} {tuple(getattr(out, 'shape', ()))}")
        out = out.cpu()
        if not torch.equal(out, want):
            bad = (out != want).nonzero()[0].tolist()
            wrapped = bool(torch.equal(out, (want + 2**31) % 2**32 - 2**31))
            raise AssertionError(
                f"tile_offsets is wrong on {case} (overflows: {what}): offset at {tuple(bad)} is "
                f"{out[tuple(bad)].item()}, expected {want[tuple(bad)].item()}"
                + (" — exactly what int32 arithmetic makes of it (it wrapped)" if wrapped else ""))
    _core.passed("tile_offsets", len(cases))


# --- decay_matrix ---------------------------------------------------------------------------------

def _decay_oracle(a, grad_out):
    a64 = a.detach().double().requires_grad_()
    L = torch.exp(ssd.segsum(a64))  # (..., T, T)
    (grad,) = torch.autograd.grad(L, a64, grad_out.double())
    return L.detach(), grad


def decay_matrix(fn):
    """Check ``fn(a) -> exp(segsum(a))``: values and gradients, finite at extreme inputs."""
    g = _core.generator()
    rand = lambda *shape, scale=1.0: -scale * torch.rand(*shape, generator=g)
    reset = rand(2, 29, scale=3.0)
    reset[0, 11] = reset[1, 0] = float("-inf")  # a reset mid-sequence and at the first step
    cases = [  # (a, what)
        (rand(1), "T = 1"),
        (rand(7, scale=0.5).double(), "T = 7, float64"),
        (rand(3, 16), "batch of 3, T = 16"),
        (rand(64, scale=4.0), "T = 64, cumsums beyond −88 (exp of the differences is Inf)"),
        (reset, "−∞ resets (a state reset)"),
        (rand(2, 3, 37, scale=60.0), "very negative steps, T = 37"),
    ]
    for a, what in cases:
        case = f"{what}: a {tuple(a.shape)} {a.dtype}"
        grad_out = torch.randn(*a.shape, a.shape[-1], generator=g, dtype=a.dtype)
        L, grad = _core.probe(_probes.output_and_grad, fn, a, grad_out, case=case)
        want, want_grad = _decay_oracle(a, grad_out)
        if isinstance(L, torch.Tensor) and not torch.isfinite(L).all():
            raise AssertionError(f"decay_matrix(a) has {(~torch.isfinite(L)).sum().item()} "
                                 f"non-finite entries on {case}: every entry of L is in [0, 1]")
        _core.compare(L, want, what="decay_matrix(a)", case=case, dtype=a.dtype)
        if grad is None or not torch.isfinite(grad).all():
            raise AssertionError(f"the gradient of decay_matrix(a) is "
                                 f"{'missing' if grad is None else 'not finite (NaN or Inf)'} on "
                                 f"{case}, though its forward is right: an Inf masked after exp "
                                 f"still reaches the backward (0 · Inf = NaN)")
        _core.compare(grad, want_grad, what="the gradient of decay_matrix(a)", case=case,
                      dtype=a.dtype, grad=True)
    _core.passed("decay_matrix", len(cases))


# --- row_sums -------------------------------------------------------------------------------------

def _poisoned(rows, n, g, pad=8):
    buffer = torch.full((rows, n + pad), float("nan"))  # NaN after every row's n elements
    buffer[:, :n] = torch.randn(rows, n, generator=g)
    return buffer.to(device.get())[:, :n]  # (rows, n): a view, row stride n + pad


def row_sums(fn):
    """Check ``fn(x, block) -> Σ_j x[:, j]``: lengths around every tile edge, poison after rows."""
    g = _core.generator()
    block = int(2 ** torch.randint(2, 5, (1,), generator=g))  # 4, 8 or 16
    lengths = [block - 1, block, block + 1, 2 * block + 3, 1,
               int(torch.randint(block + 2, 5 * block, (1,), generator=g))]
    for i, n in enumerate(lengths):
        rows = 1 + i % 3
        x = _poisoned(rows, n, g)
        case = f"x ({rows}, {n}) with NaN after each row, block={block}"
        out, seen = _core.probe(_probes.call_watching_triton, fn, x, block, case=case)
        triton_evidence("row_sums", seen, case, "row_sums_kernel")
        if isinstance(out, torch.Tensor) and tuple(out.shape) == (rows,) \
                and not torch.isfinite(out).all():
            raise AssertionError(f"row_sums read past the end of a row on {case}: the sums are "
                                 f"NaN, the poison after each row's {n} elements")
        _core.compare(out, x.double().sum(1), what="row_sums(x, block)", case=case,
                      dtype=torch.float32)
    _core.passed("row_sums", len(lengths))


# --- deterministic_scatter_sum --------------------------------------------------------------------

def _scatter_inputs(g, programs, rows, d, cancel=False):
    """(parts, target, arrival orders to try). With ``cancel``: pairs of ±1e30, each pair in one
    row and every row holding one, around small terms; then one order brings each pair before the
    small terms (they survive) and one brings the small terms between (they are absorbed), so a
    sum that follows the arrival order gives two results whatever else it does."""
    parts = torch.randn(programs, d, generator=g) * torch.logspace(-3, 3, programs)[:, None]
    target = torch.randint(0, rows, (programs,), generator=g)
    orders = [torch.randperm(programs, generator=g) for _ in range(4)]
    if cancel:
        pairs = programs // 3  # parts k and pairs + k: +1e30 and −1e30 in one row
        parts[:pairs], parts[pairs:2 * pairs] = 1e30, -1e30
        target[:rows] = torch.arange(rows)  # every row has a pair
        target[pairs:2 * pairs] = target[:pairs]
        plus, minus, small = (torch.arange(a, b) for a, b in
                              ((0, pairs), (pairs, 2 * pairs), (2 * pairs, programs)))
        orders[:2] = torch.cat([plus, minus, small]), torch.cat([plus, small, minus])
    return parts, target, orders


def deterministic_scatter_sum(fn):
    """Check ``fn(parts, target, arrival, rows)``: bitwise equal over arrival orders and row
    labels; close to the float64 sum."""
    g = _core.generator()
    cases = [  # (programs, rows, d, terms that cancel)
        (1, 1, 1, False), (8, 1, 1, False), (24, 3, 2, False), (40, 5, 3, False),
        (30, 2, 1, True), (31, 4, 2, True)]
    for programs, rows, d, cancel in cases:
        parts, target, orders = _scatter_inputs(g, programs, rows, d, cancel)
        case = (f"{programs} programs into {rows} rows of {d}"
                + (", terms of ±1e30 that cancel" if cancel else ""))
        outs = [_core.call(fn, parts, target, arrival, rows, case=case) for arrival in orders]
        for out in outs:
            if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 \
                    or tuple(out.shape) != (rows, d):
                raise AssertionError(f"deterministic_scatter_sum on {case}: expected a "
                                     f"({rows}, {d}) float32 tensor, got {_core.kind(out)} "
                                     f"{getattr(out, 'dtype', '')}")
        if not all(torch.equal(outs[0], o) for o in outs[1:]):
            raise AssertionError(f"deterministic_scatter_sum on {case}: four arrival orders gave "
                                 f"results that differ in their bits: the sum still follows the "
                                 f"order the programs finished in")
        relabel = torch.randperm(rows, generator=g)  # row r becomes row relabel[r]
        moved = _core.call(fn, parts, relabel[target], torch.randperm(programs, generator=g),
                           rows, case=case + ", rows relabelled")
        if not torch.equal(moved[relabel], outs[0]):
            raise AssertionError(f"deterministic_scatter_sum on {case}: a row's sum changed when "
                                 f"only the row's position changed (the rows were relabelled)")
        if not cancel:
            want = torch.zeros(rows, d, dtype=torch.float64).index_add_(0, target, parts.double())
            _core.compare(outs[0], want, what="deterministic_scatter_sum", case=case,
                          dtype=torch.float32)
    _core.passed("deterministic_scatter_sum", len(cases))
