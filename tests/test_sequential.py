"""The sequential oracle against an independent closed form, in float64; layouts, dtypes, errors."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close

f64 = torch.float64


def closed_form(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                initial_state=None):
    """h_t = Σ_{s≤t} exp(A·Σ_{r=s+1..t} Δ_r) Δ_s B_s x_s (+ exp(A·Σ_{r≤t} Δ_r) h_{−1}), no loop."""
    b, d, l = u.shape
    n = A.shape[1]
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)

    def per_channel(X):  # -> (b, d, n, l), written with explicit index arithmetic
        if X.ndim == 2:
            return X[None, :, :, None].expand(b, d, n, l)
        if X.ndim == 3:
            return X[:, None].expand(b, d, n, l)
        g = X.shape[1]
        return X[:, torch.arange(d) // (d // g)]

    B, C = per_channel(B), per_channel(C)
    cum = delta.cumsum(-1)  # (b, d, l)
    gap = cum[..., :, None] - cum[..., None, :]  # Σ_{r=s+1..t} Δ_r: (b, d, t, s)
    causal = torch.ones(l, l, dtype=torch.bool).tril()
    decay = torch.exp(torch.einsum("dn,bdts->bdnts", A, gap)).masked_fill(~causal, 0)
    h = torch.einsum("bdnts,bdns->bdnt", decay, delta[:, :, None] * B * u[:, :, None])
    if initial_state is not None:
        h = h + torch.exp(torch.einsum("dn,bdt->bdnt", A, cum)) * initial_state[..., None]
    y = torch.einsum("bdnt,bdnt->bdt", C, h)
    if D is not None:
        y = y + D[:, None] * u
    if z is not None:
        y = y * z * torch.sigmoid(z)
    return y, h[..., -1]


def make(b=2, d=4, n=3, l=7, B_kind="bnl", C_kind="bnl", g=2, dtype=f64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=f64)
    shapes = {"dn": (d, n), "bnl": (b, n, l), "bgnl": (b, g, n, l)}
    args = dict(u=r(b, d, l), delta=torch.rand(b, d, l, generator=gen, dtype=f64) * 0.5,
                A=-torch.rand(d, n, generator=gen, dtype=f64) * 2 - 0.1,
                B=r(*shapes[B_kind]), C=r(*shapes[C_kind]), D=r(d), z=r(b, d, l),
                delta_bias=r(d) * 0.3)
    return {k: v.to(dtype) for k, v in args.items()}


@pytest.mark.parametrize("B_kind,C_kind", list(itertools.product(["dn", "bnl", "bgnl"], repeat=2)))
@pytest.mark.parametrize("softplus", [False, True])
def test_matches_closed_form_float64(B_kind, C_kind, softplus):
    a = make(B_kind=B_kind, C_kind=C_kind, d=6, g=3)
    if not softplus:
        a["delta_bias"] = a["delta_bias"].abs()  # keep Δ ≥ 0 without softplus
    out, last = selective_scan_sequential(**a, delta_softplus=softplus, return_last_state=True)
    y, h_last = closed_form(**a, delta_softplus=softplus)
    assert out.dtype == f64 and last.dtype == f64
    assert out.shape == (2, 6, 7) and last.shape == (2, 6, 3)
    assert_close(out, y)
    assert_close(last, h_last)


@pytest.mark.parametrize("l", [1, 2, 5, 16])
def test_optional_arguments_and_initial_state(l):
    a = make(l=l, seed=l)
    del a["D"], a["z"], a["delta_bias"]
    h0 = torch.randn(2, 4, 3, dtype=f64)
    out, last = selective_scan_sequential(**a, initial_state=h0, return_last_state=True)
    y, h_last = closed_form(**a, initial_state=h0)
    assert_close(out, y)
    assert_close(last, h_last)
    assert isinstance(selective_scan_sequential(**a), torch.Tensor)


def test_group_i_uses_group_i_over_d_per_g():
    a = make(d=4, g=2, B_kind="bgnl", C_kind="bgnl")
    out = selective_scan_sequential(**a)
    # channels 0, 1 read group 0; channels 2, 3 read group 1
    for i in range(4):
        one = {k: a[k][:, i:i + 1] for k in ("u", "delta", "z")}
        one.update(A=a["A"][i:i + 1], D=a["D"][i:i + 1], delta_bias=a["delta_bias"][i:i + 1],
                   B=a["B"][:, i // 2], C=a["C"][:, i // 2])
        assert_close(out[:, i:i + 1], selective_scan_sequential(**one))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_inputs_computed_in_float32(dtype):
    a = make(dtype=dtype)
    out, last = selective_scan_sequential(**a, delta_softplus=True, return_last_state=True)
    assert out.dtype == dtype and last.dtype == torch.float32
    y, h_last = closed_form(**{k: v.to(f64) for k, v in a.items()}, delta_softplus=True)
    assert_close(out, y)  # tolerance of the input dtype: only the final cast rounds
    assert_close(last, h_last, dtype=torch.float32)


def test_mask_keeps_state_and_zeroes_output():
    a = make(b=2, l=9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, [0, 3, 4, 8]] = False  # padding at the start, in the middle and at the end
    mask[1, 5:] = False  # right padding
    h0 = torch.randn(2, 4, 3, dtype=f64)
    out, last = selective_scan_sequential(**a, delta_softplus=True, mask=mask, initial_state=h0,
                                          return_last_state=True)
    for i in range(2):  # same as scanning only the real steps
        keep = mask[i]
        one = {k: (v[i:i + 1, ..., keep] if k in ("u", "delta", "z", "B", "C") else v)
               for k, v in a.items()}
        o, s = selective_scan_sequential(**one, delta_softplus=True, initial_state=h0[i:i + 1],
                                         return_last_state=True)
        assert_close(out[i:i + 1, :, keep], o)
        assert_close(last[i:i + 1], s)
        assert (out[i, :, ~keep] == 0).all()


def test_all_masked_keeps_initial_state():
    a = make(l=3)
    h0 = torch.randn(2, 4, 3, dtype=f64)
    out, last = selective_scan_sequential(**a, mask=torch.zeros(2, 3, dtype=torch.bool),
                                          initial_state=h0, return_last_state=True)
    assert (out == 0).all() and torch.equal(last, h0)


def test_non_contiguous_inputs():
    a = make()
    u_t = a["u"].transpose(1, 2).contiguous().transpose(1, 2)
    assert not u_t.is_contiguous()
    assert_close(selective_scan_sequential(**{**a, "u": u_t}), selective_scan_sequential(**a))


@pytest.mark.parametrize("change,error,words", [
    (dict(A=torch.randn(4, 3, dtype=torch.complex64)), TypeError, "complex A"),
    (dict(A=torch.randn(4, 3, 1, dtype=f64)), ValueError, "A must have shape"),
    (dict(A=torch.randn(5, 3, dtype=f64)), ValueError, "A must have shape"),
    (dict(u=torch.randn(2, 4, dtype=f64)), ValueError, "u must have 3"),
    (dict(delta=torch.rand(2, 4, 6, dtype=f64)), ValueError, "delta must have shape"),
    (dict(B=torch.randn(2, 4, 7, dtype=f64)), ValueError, "B must have shape"),
    (dict(C=torch.randn(2, 3, 3, 7, dtype=f64)), ValueError, "must divide d"),
    (dict(C=torch.randn(2, 3, 7, 1, 1, dtype=f64)), ValueError, "C must have"),
    (dict(D=torch.randn(3, dtype=f64)), ValueError, "D must have shape"),
    (dict(delta_bias=torch.randn(4, 1, dtype=f64)), ValueError, "delta_bias must have shape"),
    (dict(z=torch.randn(2, 4, 6, dtype=f64)), ValueError, "z must have shape"),
    (dict(u=torch.randint(0, 3, (2, 4, 7))), TypeError, "u must be a real floating"),
    (dict(mask=torch.ones(2, 7)), TypeError, "mask must be a bool"),
    (dict(mask=torch.ones(2, 6, dtype=torch.bool)), ValueError, "mask must have shape"),
    (dict(initial_state=torch.zeros(2, 4, 2, dtype=f64)), ValueError, "initial_state must"),
    (dict(u=torch.randn(2, 4, 0, dtype=f64), delta=torch.rand(2, 4, 0, dtype=f64)), ValueError,
     "l = 0"),
])
def test_clear_errors(change, error, words):
    a = make()
    with pytest.raises(error, match=words):
        selective_scan_sequential(**{**a, **change})
