"""Chapter 17 checks: the right fixes pass, and every fix that only hides the symptom fails.

Offsets: int32 throughout, int64 on the row term only, on the column term only, and the sum cast
to int64 after the products wrapped. Decay: the naive where-after-exp, a clamp before exp of the
cumsum difference, NaN turned into −∞. Row sums: no mask, a mask right only for multiples of the
block, a mask of the first tile only. Scatter sums: arrival order, and a float64 sum in arrival
order rounded to float32.
"""

# isort: off
from mambalearn import device  # first: sets TRITON_INTERPRET=1 on a CPU before triton is imported
# isort: on
import pytest
import torch
import triton
import triton.language as tl

from mambalearn import check, silent

DEV = device.get()


# --- tile_offsets ---------------------------------------------------------------------------------

@triton.jit
def _offsets(out_ptr, length, stride_row, stride_col, BLOCK: tl.constexpr, WIDE_ROW: tl.constexpr,
             WIDE_COL: tl.constexpr, WIDE_SUM: tl.constexpr):
    row = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    if WIDE_ROW:
        row = row.to(tl.int64)
    if WIDE_COL:
        j = j.to(tl.int64)
    first, second = row * stride_row, j * stride_col
    if WIDE_SUM:
        offset = first.to(tl.int64) + second.to(tl.int64)  # widened after the products wrapped
    else:
        offset = first + second
    tl.store(out_ptr + tl.program_id(0) * length + j, offset.to(tl.int64), mask=j < length)


def _launcher(wide_row, wide_col, wide_sum=False):
    def tile_offsets(rows, length, stride_row, stride_col, block=16):
        out = torch.empty(rows, length, dtype=torch.int64, device=DEV)
        _offsets[(rows, triton.cdiv(length, block))](out, length, stride_row, stride_col,
                                                      BLOCK=block, WIDE_ROW=wide_row,
                                                      WIDE_COL=wide_col, WIDE_SUM=wide_sum)
        return out
    return tile_offsets


def test_tile_offsets_passes_int64_offsets(capsys):
    check.tile_offsets(_launcher(True, True))
    assert capsys.readouterr().out.startswith("✓ tile_offsets")


@pytest.mark.parametrize("wrong", [(False, False), (True, False), (False, True),
                                   (False, False, True)],
                         ids=["int32", "row-only", "column-only", "sum-widened-late"])
def test_tile_offsets_rejects_narrow_arithmetic(wrong):
    with pytest.raises(AssertionError, match="tile_offsets is wrong"):
        check.tile_offsets(_launcher(*wrong))


def test_tile_offsets_rejects_pytorch_arithmetic():
    def tile_offsets(rows, length, stride_row, stride_col, block=16):
        return torch.arange(rows)[:, None] * stride_row + torch.arange(length) * stride_col
    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        check.tile_offsets(tile_offsets)


# --- decay_matrix ---------------------------------------------------------------------------------

def _clamped(a):
    cs = torch.cumsum(a, dim=-1)
    diff = (cs[..., :, None] - cs[..., None, :]).clamp(max=0.0)  # the clamp before exp …
    return torch.exp(diff).tril()  # … of a difference that is NaN after a reset


def _nan_to_minus_inf(a):
    cs = torch.cumsum(a, dim=-1)
    diff = torch.nan_to_num(cs[..., :, None] - cs[..., None, :], nan=float("-inf"))
    T = a.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.exp(diff.masked_fill(~causal, float("-inf")))


def test_decay_matrix_passes_the_segment_sums(capsys):
    check.decay_matrix(silent.decay_matrix)
    assert capsys.readouterr().out.startswith("✓ decay_matrix")


@pytest.mark.parametrize("wrong", [silent.decay_naive, _clamped, _nan_to_minus_inf],
                         ids=["where-after-exp", "clamped-difference", "nan-to-minus-inf"])
def test_decay_matrix_rejects_hidden_symptoms(wrong):
    with pytest.raises(AssertionError, match="decay_matrix"):
        check.decay_matrix(wrong)


def test_decay_matrix_names_a_nan_gradient():
    """Where-after-exp passes the forward until a reset; before that, the gradient gives it away."""
    with pytest.raises(AssertionError, match="gradient of decay_matrix"):
        check.decay_matrix(silent.decay_naive)


# --- row_sums -------------------------------------------------------------------------------------

@triton.jit
def _sums(x_ptr, out_ptr, n, stride_row, BLOCK: tl.constexpr, MODE: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    start = 0
    while start < n:
        j = start + tl.arange(0, BLOCK)
        if MODE == 0:
            mask = j < n
        elif MODE == 1:
            mask = j >= 0  # no mask
        elif MODE == 2:
            mask = j < (n // BLOCK) * BLOCK  # right only for multiples of the block
        else:
            mask = tl.arange(0, BLOCK) < n  # the first tile's mask, reused
        acc += tl.load(x_ptr + row * stride_row + j, mask=mask, other=0.0)
        start += BLOCK
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def _row_sums(mode):
    def row_sums(x, block=16):
        out = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        _sums[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=block, MODE=mode)
        return out
    return row_sums


def test_row_sums_passes_the_masked_kernel(capsys):
    check.row_sums(_row_sums(0))
    check.row_sums(lambda x, block=16: silent.row_sums(x, block))
    assert capsys.readouterr().out.count("✓ row_sums") == 2


@pytest.mark.parametrize("mode", [1, 2, 3], ids=["no-mask", "multiples-only", "first-tile-mask"])
def test_row_sums_rejects_wrong_masks(mode):
    with pytest.raises(AssertionError, match="row_sums"):
        check.row_sums(_row_sums(mode))


def test_row_sums_rejects_pytorch():
    with pytest.raises(AssertionError, match="launched no Triton kernel"):
        check.row_sums(lambda x, block=16: x.sum(1))


# --- deterministic_scatter_sum --------------------------------------------------------------------

def _float64_in_arrival_order(parts, target, arrival, rows):
    out = torch.zeros(rows, parts.shape[1], dtype=torch.float64)
    for k in arrival.tolist():
        out[target[k]] += parts[k].double()
    return out.float()


def test_scatter_sum_passes_fixed_orders(capsys):
    check.deterministic_scatter_sum(
        lambda parts, target, arrival, rows: silent.scatter_sum_in_order(parts, target, rows))
    check.deterministic_scatter_sum(  # another fixed order: index_add_ adds in program order
        lambda parts, target, arrival, rows: torch.zeros(rows, parts.shape[1]).index_add_(
            0, target, parts))
    assert capsys.readouterr().out.count("✓ deterministic_scatter_sum") == 2


@pytest.mark.parametrize("wrong", [silent.arrival_scatter_sum, _float64_in_arrival_order],
                         ids=["atomics-order", "float64-in-arrival-order"])
def test_scatter_sum_rejects_order_dependence(wrong):
    with pytest.raises(AssertionError, match="arrival orders gave results that differ"):
        check.deterministic_scatter_sum(wrong)


def test_hints_and_rebuilds_cover_every_task():
    from mambalearn.check import ch17_silent_bugs as c
    assert set(c.HINTS) == set(c.REBUILDS) == set(c.__all__)
