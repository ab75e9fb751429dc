"""MIMO at rank 1 is SISO's recurrence: the per-rank weights fold into SISO's inputs
(``mimo_api.rank_one_on_siso``). First the algebra on the float64 oracles, then the SISO kernels
behind ``mamba3_mimo_combined`` (the interpreter on a CPU) against the MIMO float64 oracle,
output, final states and every gradient, at odd sizes with partial chunks."""

import pytest
import torch

from mambalearn import mamba3
from mambalearn.mamba3 import mimo_reference as mimo
from mambalearn.mamba3.config import MIMO_DEFAULT
from mambalearn.testing import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"
f64 = torch.float64


def inputs(seed, b=2, l=21, h=4, g=2, p=5, n=10, na=3, states=True, Z=True, out=True,
           zeta=True, D=True, dtype=f64):
    """Rank-1 MIMO inputs; the per-rank weights random (some Φ entries 0: no division by Φ)."""
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s: torch.randn(*s, generator=gen, dtype=f64)
    DT = torch.nn.functional.softplus(rr(b, h, l)) * 0.5 + 0.05
    phi = rr(h, 1, p)
    phi[0, 0, 1] = 0.0
    x = dict(Q=rr(b, l, 1, g, n), K=rr(b, l, 1, g, n), V=rr(b, l, h, p),
             ADT=-DT * torch.rand(b, h, l, generator=gen, dtype=f64), DT=DT, Trap=rr(b, h, l),
             Q_bias=rr(h, 1, n), K_bias=rr(h, 1, n), MIMO_V=rr(h, 1, p),
             MIMO_Z=rr(h, 1, p) if zeta else None, MIMO_Out=phi if out else None,
             Angles=rr(b, l, h, na), D=rr(h) if D else None, Z=rr(b, l, h, p) if Z else None)
    st = (rr(b, h, na), rr(b, h, p, n), rr(b, 1, h, n), rr(b, h, p)) if states else None
    wide = f64 if dtype == f64 else torch.float32
    x = {k: None if v is None else v.to(wide if k in ("Q_bias", "K_bias", "D")
                                        or k.startswith("MIMO") else dtype)
         for k, v in x.items()}
    return x, None if st is None else tuple(s.to(wide) for s in st)


@pytest.mark.parametrize("fold", [True, False])
def test_rank_one_is_siso_with_the_weights_folded(fold):
    """out = Φ ⊙ y ⊙ silu(z ζ) with v = x ⊙ Ψ equals SISO on V ⊙ Ψ ⊙ Φ and Z ⊙ ζ (the state
    then carries Φ on its rows), or SISO on V ⊙ Ψ with Φ on the output (the state unscaled)."""
    x, st = inputs(seed=0)
    want = mimo.mamba3_mimo_sequential(**x, Input_States=st, return_final_states=True)
    psi, zeta, phi = (x[k][:, 0] for k in ("MIMO_V", "MIMO_Z", "MIMO_Out"))
    s = psi * phi if fold else psi
    row = phi[None, :, :, None] if fold else 1.0
    got = mamba3.mamba3_siso_sequential(
        Q=x["Q"][:, :, 0], K=x["K"][:, :, 0], V=x["V"] * s, ADT=x["ADT"], DT=x["DT"],
        Trap=x["Trap"], Q_bias=x["Q_bias"][:, 0], K_bias=x["K_bias"][:, 0], Angles=x["Angles"],
        D=x["D"], Z=x["Z"] * zeta, Input_States=(st[0], st[1] * row, st[2][:, 0], st[3] * s),
        return_final_states=True)
    out = got[0] if fold else got[0] * phi
    assert_close(out, want[0])
    assert_close(got[1], want[1])  # the angle
    assert_close(got[2], want[2] * row)  # the state (Φ on its rows when folded)
    assert_close(got[3], want[3][:, 0])  # the last rotated k


def test_without_a_per_channel_scale_it_is_not_siso():
    """The fold is what makes them equal: SISO on the raw V and Z differs (the check can fail)."""
    x, _ = inputs(seed=1, states=False)
    want = mimo.mamba3_mimo_sequential(**x)
    raw = mamba3.mamba3_siso_sequential(
        Q=x["Q"][:, :, 0], K=x["K"][:, :, 0], V=x["V"], ADT=x["ADT"], DT=x["DT"],
        Trap=x["Trap"], Q_bias=x["Q_bias"][:, 0], K_bias=x["K_bias"][:, 0], Angles=x["Angles"],
        D=x["D"], Z=x["Z"])
    assert (raw - want).abs().max() > 1e-2


CASES = {  # name: (inputs' arguments, chunk); l = 21 or 19: partial last chunks of 16
    "states, final states, contraction": (dict(), 16),
    "states, Φ folded into V": (dict(final=False, l=19), 16),
    "every rank's output, no MIMO_Z": (dict(out=False, zeta=False), 16),
    "no Z, no D, chunk 32": (dict(Z=False, D=False, states=False), 32),
}


def run(x, st, chunk, final, config=None):
    from mambalearn.mamba3 import mamba3_mimo_combined

    return mamba3_mimo_combined(**x, Input_States=st, chunk_size=chunk,
                                return_final_states=final, config=config)



SISO_ROUTE = MIMO_DEFAULT.replace(rank_one="siso")  # (the default is the MIMO kernels)

@pytest.mark.parametrize("name", CASES)
def test_rank_one_on_the_siso_kernels_equals_the_mimo_oracle(name):
    kw, chunk = dict(CASES[name][0]), CASES[name][1]
    final = kw.pop("final", kw.get("states", True))
    x, st = inputs(seed=len(name), dtype=torch.float32, **kw)
    leaf = lambda t, dt=None, dev="cpu": (None if t is None else
                                          t.detach().to(dev, dt or t.dtype).requires_grad_())
    ours = {k: leaf(v, dev=DEV) for k, v in x.items()}
    ref = {k: leaf(v, f64) for k, v in x.items()}
    st_ours = None if st is None else [leaf(s, dev=DEV) for s in st]
    st_ref = None if st is None else [leaf(s, f64) for s in st]
    got = run(ours, st_ours, chunk, final, SISO_ROUTE)
    want = mimo.mamba3_mimo_sequential(**ref, Input_States=st_ref, return_final_states=final)
    got, want = (r if final else (r,) for r in (got, want))
    for i, (a, e) in enumerate(zip(got, want, strict=True)):
        assert a.shape == e.shape and a.dtype == (torch.float32), (i, a.shape, a.dtype)
        if i == 1:  # the final angle, mod 2π: compare where it points
            a, e = (torch.stack([t.cos(), t.sin()]) for t in (a, e))
        assert_close(a, e, dtype="dot", msg=f"{name}: result {i}")
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


def test_the_mimo_kernels_at_rank_one_agree_with_the_siso_route():
    """``config.rank_one = "mimo"`` keeps the MIMO kernels at rank 1 (the device script times
    both): the same output and gradients as the SISO route."""
    x, st = inputs(seed=5, dtype=torch.float32, l=19, h=2, g=1)
    outs = []
    for cfg in (SISO_ROUTE, MIMO_DEFAULT.replace(rank_one="mimo")):
        xs = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in x.items()}
        y = run(xs, st, 16, False, cfg)
        y.backward(torch.ones_like(y))
        outs.append([y.detach()] + [xs[k].grad for k in ("Q", "V", "MIMO_V", "MIMO_Out", "Z")])
    for a, e in zip(*outs, strict=True):
        assert_close(a, e, dtype="dot", grad=True)


def test_a_bad_rank_one_choice_names_the_field():
    with pytest.raises(ValueError, match="config.rank_one must be one of"):
        MIMO_DEFAULT.replace(rank_one="fast")


def test_rank_one_on_siso_in_bf16_with_float32_angles():
    """What the device script checks, small: bf16 activations with float32 Angles and per-rank
    weights, several chunks of 16 and a partial last one (l = 53), 4 of 16 pairs turning, a random
    upstream gradient; the output and the gradient of every input against the float64 MIMO
    oracle, as whole tensors at bf16's 5e-2 (``rel_error``)."""
    from mambalearn.mamba3 import mamba3_mimo_combined
    from mambalearn.testing import rel_error

    gen = torch.Generator().manual_seed(37)
    rr = lambda *s: torch.randn(*s, generator=gen)
    b, l, h, g, p, n, na = 1, 53, 2, 1, 16, 32, 4
    DT = torch.nn.functional.softplus(rr(b, h, l) - 2.0)
    x = dict(Q=rr(b, l, 1, g, n) / n ** 0.5, K=rr(b, l, 1, g, n) / n ** 0.5, V=rr(b, l, h, p),
             ADT=-torch.nn.functional.softplus(rr(b, h, l)) * DT, DT=DT, Trap=rr(b, h, l),
             Q_bias=1 + 0.1 * rr(h, 1, n), K_bias=1 + 0.1 * rr(h, 1, n),
             MIMO_V=1 + 0.1 * rr(h, 1, p), MIMO_Z=1 + 0.1 * rr(h, 1, p),
             MIMO_Out=1 + 0.1 * rr(h, 1, p), Angles=rr(b, l, h, na), D=rr(h), Z=rr(b, l, h, p))
    wide = {"ADT", "DT", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out", "Angles", "D"}
    x = {k: v.to(DEV, torch.float32 if k in wide else torch.bfloat16) for k, v in x.items()}
    ours = {k: v.clone().requires_grad_() for k, v in x.items()}
    ref = {k: v.double().cpu().requires_grad_() for k, v in x.items()}
    out = mamba3_mimo_combined(**ours, chunk_size=16, config=MIMO_DEFAULT.replace(rank_one="siso"))
    want = mimo.mamba3_mimo_sequential(**ref)
    cot = torch.randn(want.shape, generator=torch.Generator().manual_seed(2), dtype=f64)
    (out.float() * cot.to(out.device, torch.float32)).sum().backward()
    (want * cot).sum().backward()
    errs = {"out": rel_error(out, want)}
    errs |= {f"d{k}": rel_error(ours[k].grad, ref[k].grad) for k in x}
    worst = max(errs, key=errs.get)
    assert errs[worst] < 5e-2, f"{worst}: relative error {errs[worst]:.3g} ({errs})"


@pytest.mark.gpu
@pytest.mark.parametrize("rank_one", ["siso", "mimo"])
def test_rank_one_agrees_at_the_benchmark_heads_on_a_gpu(rank_one):
    """The device script's agreement, as a test: b1 l200 (a partial chunk) h32 g1 p64 n128 na32,
    chunk 64, bf16 with float32 Angles, every gradient against the float64 chunked oracle. On an
    H200 (2026-12-03) the SISO route gave dAngles 4.06 here while the interpreter gives 0.015."""
    from bench.gpu.mimo_speed import SHAPE, TOL, agreement

    err, what = agreement(1, 64, MIMO_DEFAULT.replace(rank_one=rank_one), SHAPE,
                          torch.bfloat16, "cuda")
    assert err < TOL[torch.bfloat16], (what, err)
