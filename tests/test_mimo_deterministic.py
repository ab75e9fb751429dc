"""The MIMO backward's deterministic sums of dQ, dK over a group's heads (``config.det_sum``):
"heads" (every head's own copy, added in head order by ``sum_heads_kernel``) and "tree" (the
last head of a chunk adds them), against the float64 oracle, and the fixed order itself.
(tests/test_determinism.py holds the default mode's bits over runs and batch positions.)"""

import pytest
import torch

from mambalearn import testing
from mambalearn.mamba3 import mamba3_mimo_combined
from mambalearn.mamba3.config import MIMO_DEFAULT
from mambalearn.mamba3.fused.mimo_backward import sum_heads_kernel
from mambalearn.mamba3.mimo_reference import mamba3_mimo_chunked

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(b, l, h, g, p, n, na, r, seed):
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s: torch.randn(*s, generator=gen)
    DT = torch.nn.functional.softplus(rr(b, h, l) - 2.0)
    x = dict(Q=rr(b, l, r, g, n) / n ** 0.5, K=rr(b, l, r, g, n) / n ** 0.5, V=rr(b, l, h, p),
             ADT=-torch.nn.functional.softplus(rr(b, h, l)) * DT, DT=DT, Trap=rr(b, h, l),
             Q_bias=1 + 0.1 * rr(h, r, n), K_bias=1 + 0.1 * rr(h, r, n), MIMO_V=rr(h, r, p) / r,
             MIMO_Z=rr(h, r, p), MIMO_Out=rr(h, r, p) / r, Angles=rr(b, l, h, na), D=rr(h),
             Z=rr(b, l, h, p))
    return {k: v.to(DEV) for k, v in x.items()}


def fwd_bwd(x, dout, **kw):
    xs = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    f = mamba3_mimo_chunked if not kw else mamba3_mimo_combined
    out = f(**xs, chunk_size=8, **kw)
    out.backward(dout)
    return dict(out=out.detach(), **{f"d{k}": xs[k].grad for k in x})


@pytest.mark.parametrize("det_sum", ["heads", "tree"])
def test_both_fixed_orders_match_the_oracle(det_sum):
    """l 13 (a partial chunk of 8), 3 heads a group of GQA (g 2 of h 6), rank 2."""
    x = inputs(2, 13, 6, 2, 5, 8, 3, 2, seed=3)
    dout = torch.randn(2, 13, 6, 5, generator=torch.Generator().manual_seed(4)).to(DEV)
    want = fwd_bwd({k: v.double() for k, v in x.items()}, dout.double())
    cfg = MIMO_DEFAULT.replace(det_sum=det_sum, tree_fan=2)
    runs = [fwd_bwd(x, dout, config=cfg, deterministic=True)
            for _ in range(2 if det_sum == "heads" else 1)]  # (the interpreter runs programs
    # one after another: bits over runs are the GPU script's question; one run of the old tree)
    for k, v in want.items():
        testing.assert_close(runs[0][k], v, dtype="dot", grad=k != "out", msg=f"{k}, {det_sum}")
        assert torch.equal(runs[0][k], runs[-1][k]), f"{k} changed between two runs"


def test_the_heads_are_added_in_head_order():
    """The sum kernel's result is, bit for bit, ((c₀ + c₁) + c₂) + … in float32, at a size that
    is not a multiple of its block, for dQ (copies 0 … T−1) and dK (T … 2T−1) alike."""
    T, size = 5, 2 * 1024 + 37
    gen = torch.Generator().manual_seed(5)
    parts = (torch.randn(2, T, size, generator=gen) * torch.logspace(-6, 6, size)).to(DEV)
    out = torch.empty(2, size, device=DEV)
    sum_heads_kernel[(3, 2)](parts, out, size, T, BLOCK=1024)
    want = parts[:, 0].clone()
    for j in range(1, T):
        want = want + parts[:, j]
    assert torch.equal(out, want)
    assert not torch.equal(out, parts.flip(1).sum(1))  # another order gives other bits here


def test_a_bad_det_sum_names_the_field():
    with pytest.raises(ValueError, match="config.det_sum must be one of"):
        MIMO_DEFAULT.replace(det_sum="atomics")
