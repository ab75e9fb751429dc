"""The MIMO kernels with the channels cut into blocks, one program each
(``config.forward_p_block`` / ``backward_p_block``), and with q, k held as the products' operands
(``qk_live``): the float64 oracle's output, final states and every gradient, at p = 37 (three
blocks of 16, the last partial) and an odd length."""

import pytest
import torch

from mambalearn.mamba3 import mamba3_mimo_combined
from mambalearn.mamba3 import mimo_reference as mimo
from mambalearn.mamba3.config import MIMO_DEFAULT
from mambalearn.testing import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"
f64 = torch.float64


def inputs(seed, b=2, l=11, r=2, h=2, g=1, p=37, n=8, na=3):
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s: torch.randn(*s, generator=gen, dtype=f64)
    DT = torch.nn.functional.softplus(rr(b, h, l)) * 0.5 + 0.05
    x = dict(Q=rr(b, l, r, g, n), K=rr(b, l, r, g, n), V=rr(b, l, h, p),
             ADT=-DT * torch.rand(b, h, l, generator=gen, dtype=f64), DT=DT, Trap=rr(b, h, l),
             Q_bias=rr(h, r, n), K_bias=rr(h, r, n), MIMO_V=rr(h, r, p), MIMO_Z=rr(h, r, p),
             MIMO_Out=rr(h, r, p), Angles=rr(b, l, h, na), D=rr(h), Z=rr(b, l, h, p))
    st = (rr(b, h, na), rr(b, h, p, n), rr(b, r, h, n), rr(b, h, p))
    return x, st


CASES = {  # config changes, deterministic
    "forward and backward in blocks of 16": (dict(forward_p_block=16, backward_p_block=16),
                                             False),
    "backward in blocks, deterministic by heads": (dict(backward_p_block=16), True),
    "forward in blocks, by a tree, q and k as operands": (
        dict(forward_p_block=32, backward_p_block=32, det_sum="tree", tree_fan=2,
             qk_live="dot"), True),
}


@pytest.mark.parametrize("name", CASES)
def test_channel_blocks_equal_the_oracle(name):
    changes, det = CASES[name]
    x, st = inputs(seed=len(name))
    leaf = lambda t, dt: t.detach().to(DEV if dt is None else "cpu", dt or torch.float32) \
        .requires_grad_()
    ours = {k: leaf(v, None) for k, v in x.items()}
    ref = {k: leaf(v, f64) for k, v in x.items()}
    st_ours, st_ref = [leaf(s, None) for s in st], [leaf(s, f64) for s in st]
    got = mamba3_mimo_combined(**ours, Input_States=st_ours, chunk_size=8,
                               return_final_states=True, deterministic=det,
                               config=MIMO_DEFAULT.replace(**changes))
    want = mimo.mamba3_mimo_sequential(**ref, Input_States=st_ref, return_final_states=True)
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        if i == 1:  # the final angle, mod 2π
            a, e = (torch.stack([t.cos(), t.sin()]) for t in (a, e))
        assert_close(a, e, dtype="dot", msg=f"{name}: result {i}")
    gen = torch.Generator().manual_seed(1)
    cot = [torch.randn(e.shape, generator=gen, dtype=f64) for e in want]
    sum((a * c.to(a)).sum() for a, c in zip(got, cot, strict=True)).backward()
    sum((e * c).sum() for e, c in zip(want, cot, strict=True)).backward()
    pairs = [(k, ours[k], ref[k]) for k in x]
    pairs += [(f"Input_States {i}", a, e) for i, (a, e) in enumerate(zip(st_ours, st_ref,
                                                                         strict=True))]
    for k, a, e in pairs:
        assert_close(a.grad, e.grad, dtype="dot", grad=True, msg=f"{name}: d{k}")


def test_a_bad_block_names_the_field():
    with pytest.raises(ValueError, match="config.backward_p_block must be a power of two ≥ 16"):
        MIMO_DEFAULT.replace(backward_p_block=24)
