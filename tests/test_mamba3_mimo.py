"""Mamba-3 MIMO prefill (chapter 15): the loop oracle, its chunked form, and the Triton kernels
(the interpreter on a CPU) against it, forward and every gradient, at tiny odd sizes."""

import pytest
import torch

from mambalearn import mamba3
from mambalearn.mamba3 import mimo_reference as mimo
from mambalearn.mamba3 import step_reference as mstep
from mambalearn.testing import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where the kernels run

f64 = torch.float64


def inputs(seed=0, b=2, l=11, r=3, h=4, g=2, p=3, n=8, na=3, states=True, Z=True, out=True,
           D=True, dtype=f64):
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s: torch.randn(*s, generator=gen, dtype=f64)
    DT = torch.nn.functional.softplus(rr(b, h, l)) * 0.5 + 0.05
    x = dict(Q=rr(b, l, r, g, n), K=rr(b, l, r, g, n), V=rr(b, l, h, p),
             ADT=-DT * torch.rand(b, h, l, generator=gen, dtype=f64), DT=DT, Trap=rr(b, h, l),
             Q_bias=rr(h, r, n), K_bias=rr(h, r, n), MIMO_V=rr(h, r, p), MIMO_Z=rr(h, r, p),
             MIMO_Out=rr(h, r, p) if out else None, Angles=rr(b, l, h, na),
             D=rr(h) if D else None, Z=rr(b, l, h, p) if Z else None)
    st = (rr(b, h, na), rr(b, h, p, n), rr(b, r, h, n), rr(b, h, p)) if states else None
    wide = f64 if dtype == f64 else torch.float32
    x = {k: None if v is None else v.to(wide if k in ("Q_bias", "K_bias", "D") or k.startswith(
        "MIMO") else dtype) for k, v in x.items()}
    return x, None if st is None else tuple(s.to(wide) for s in st)


@pytest.mark.parametrize("states, out", [(False, True), (True, True), (True, False)])
def test_chunked_equals_the_loop(states, out):
    x, st = inputs(states=states, out=out)
    want = mimo.mamba3_mimo_sequential(**x, Input_States=st, return_final_states=True)
    for q in (1, 4, 5, 16):  # partial last chunks, one chunk longer than the sequence
        got = mimo.mamba3_mimo_chunked(**x, Input_States=st, chunk_size=q,
                                       return_final_states=True)
        for a, e, name in zip(got, want, ("out", "angle", "ssm", "k", "v"), strict=True):
            assert_close(a, e, msg=f"chunk {q}: {name}")


def test_rank_one_with_unit_weights_is_siso():
    x, st = inputs(r=1)
    for k in ("MIMO_V", "MIMO_Z", "MIMO_Out"):
        x[k] = torch.ones_like(x[k])
    siso = mamba3.mamba3_siso_sequential(
        Q=x["Q"][:, :, 0], K=x["K"][:, :, 0], V=x["V"], ADT=x["ADT"], DT=x["DT"],
        Trap=x["Trap"], Q_bias=x["Q_bias"][:, 0], K_bias=x["K_bias"][:, 0], Angles=x["Angles"],
        D=x["D"], Z=x["Z"], Input_States=(st[0], st[1], st[2][:, 0], st[3]),
        return_final_states=True)
    got = mimo.mamba3_mimo_sequential(**x, Input_States=st, return_final_states=True)
    for i, (a, e) in enumerate(zip(got, siso, strict=True)):
        assert_close(a[:, 0] if i == 3 else a, e)


def test_each_step_is_the_decode_step():
    """The prefill token by token is chapter 15's MIMO decode step (``mamba3_mimo_step_ref``)."""
    x, st = inputs(l=5)
    want = mimo.mamba3_mimo_sequential(**x, Input_States=st, return_final_states=True)
    rot = mimo.prepare(**x, Input_States=st)  # the rotated q, k the step takes
    state, B_prev, X_prev, outs = st[1].clone(), st[2], st[3], []
    hrp = lambda W: W.transpose(0, 1)  # (h, r, p) → the step's (r, h, p)
    for t in range(5):
        outs.append(mstep.mamba3_mimo_step_ref(
            state, B_prev, X_prev, x["ADT"][..., t] / x["DT"][..., t], rot["k"][:, t],
            rot["q"][:, t], x["D"], x["V"][:, t], x["DT"][..., t], torch.sigmoid(x["Trap"][..., t]),
            hrp(x["MIMO_V"]), hrp(x["MIMO_Out"]), x["Z"][:, t], hrp(x["MIMO_Z"])))
        B_prev, X_prev = rot["k"][:, t], x["V"][:, t]
    assert_close(torch.stack(outs, 1), want[0])
    assert_close(state, want[2])


CASES = {  # name: (inputs' arguments, chunk)
    "r2, states, contraction": (dict(r=2, h=2, g=1, p=5, n=12), 8),
    "r2, no states": (dict(r=2, h=2, g=1, p=5, n=12, states=False), 8),
    "r2, every rank's output": (dict(r=2, h=2, g=1, p=5, n=12, out=False), 8),
    "r1, GQA, no Z, no D": (dict(r=1, h=4, g=2, p=5, n=12, Z=False, D=False), 16),
    "r4, three chunks": (dict(r=4, l=9, h=2, g=1, p=5, n=12), 4),
}


@pytest.mark.parametrize("name", CASES)
def test_the_triton_kernels_equal_the_oracle(name):
    from mambalearn.mamba3 import mamba3_mimo_combined

    kw, chunk = CASES[name]
    x, st = inputs(seed=len(name), dtype=torch.float32, **kw)
    leaf = lambda t, dt=None, dev="cpu": (None if t is None else
                                          t.detach().to(dev, dt or t.dtype).requires_grad_())
    ours = {k: leaf(v, dev=DEV) for k, v in x.items()}
    ref = {k: leaf(v, f64) for k, v in x.items()}  # the float64 oracle on the CPU
    st_ours = None if st is None else [leaf(s, dev=DEV) for s in st]
    st_ref = None if st is None else [leaf(s, f64) for s in st]
    got = mamba3_mimo_combined(**ours, Input_States=st_ours, chunk_size=chunk,
                               return_final_states=True)
    want = mimo.mamba3_mimo_sequential(**ref, Input_States=st_ref, return_final_states=True)
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        if i == 1:  # the final angle, mod 2π: compare where it points
            a, e = (torch.stack([t.cos(), t.sin()]) for t in (a, e))
        assert_close(a, e, dtype="dot", msg=f"{name}: result {i}")  # tf32 products on a GPU
    gen = torch.Generator().manual_seed(1)
    cot = [torch.randn(e.shape, generator=gen, dtype=f64) for e in want]
    sum((a * c.to(a)).sum() for a, c in zip(got, cot, strict=True)).backward()
    sum((e * c).sum() for e, c in zip(want, cot, strict=True)).backward()
    pairs = [(k, ours[k], ref[k]) for k in x if x[k] is not None]
    pairs += [] if st is None else [(f"Input_States {i}", a, e)
                                    for i, (a, e) in enumerate(zip(st_ours, st_ref, strict=True))]
    for k, a, e in pairs:
        zero = lambda t: t.grad if t.grad is not None else torch.zeros_like(t)
        assert_close(zero(a), zero(e), dtype="dot", grad=True, msg=f"{name}: d{k}")


def test_bad_input_names_the_argument():
    from mambalearn.mamba3 import mamba3_mimo_combined

    x, st = inputs(r=3, dtype=torch.float32)
    with pytest.raises(ValueError, match="the rank r must be a power of two"):
        mamba3_mimo_combined(**x, chunk_size=8)
    x, st = inputs(r=2, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"chunk_size · r = 4 · 2 must be ≥ 16"):
        mamba3_mimo_combined(**x, chunk_size=4)
    with pytest.raises(ValueError, match="MIMO_V must have shape"):
        mimo.mamba3_mimo_sequential(**{**x, "MIMO_V": x["MIMO_V"][:, :1]})
    with pytest.raises(ValueError, match="Input_States k must have shape"):
        mimo.mamba3_mimo_sequential(**x, Input_States=(st[0], st[1], st[2][:, 0], st[3]))
    with pytest.raises(TypeError, match="V is float64"):
        mamba3_mimo_combined(**{**x, "V": x["V"].double()}, chunk_size=8)
