"""SSD oracles (chapter 10): quadratic = sequential = chunked, packing, the hand backward."""

import pytest
import torch

from mambalearn import ssd
from mambalearn.testing import assert_close

f64 = torch.float64


def inputs(b, l, h, p, g, n, seed=None):
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=f64)
    x, B, C = r(b, l, h, p), r(b, l, g, n), r(b, l, g, n)
    dt = torch.rand(b, l, h, generator=gen, dtype=f64) * 0.5 + 0.01
    A = -torch.rand(h, generator=gen, dtype=f64) * 2 - 0.1
    return x, dt, A, B, C


def test_segsum_matches_definition_and_is_stable():
    x = torch.randn(3, 9, dtype=f64)
    S = ssd.segsum(x)
    for t in range(9):
        for s in range(9):
            minus_inf = torch.full((3,), float("-inf"), dtype=f64)
            want = x[:, s + 1: t + 1].sum(-1) if t >= s else minus_inf
            assert_close(S[:, t, s], want)
    # long sequence of strongly negative steps: exp(cumsum) underflows, segsum does not lose L
    x = torch.full((4000,), -1.0, dtype=torch.float32)
    L = torch.exp(ssd.segsum(x))
    assert torch.isfinite(L).all()
    assert L[3999, 3998] == pytest.approx(torch.exp(torch.tensor(-1.0)).item())


@pytest.mark.parametrize("shape", [(2, 37, 4, 3, 2, 5), (1, 1, 3, 2, 1, 4), (2, 16, 2, 4, 1, 3)])
@pytest.mark.parametrize("q", [1, 5, 8, 64])
def test_three_forms_agree(shape, q):
    x, dt, A, B, C = inputs(*shape)
    h0 = torch.randn(shape[0], shape[2], shape[3], shape[5], dtype=f64)
    y_seq, f_seq = ssd.ssd_sequential(x, dt, A, B, C, h0)
    y_chk, f_chk = ssd.ssd_chunked(x, dt, A, B, C, q, h0)
    assert_close(y_chk, y_seq)
    assert_close(f_chk, f_seq)
    assert_close(ssd.ssd_quadratic(x, dt, A, B, C), ssd.ssd_sequential(x, dt, A, B, C)[0])


def test_seq_idx_packing_equals_separate_sequences():
    b, l, h, p, g, n = 2, 41, 4, 3, 2, 5
    x, dt, A, B, C = inputs(b, l, h, p, g, n)
    h0 = torch.randn(b, h, p, n, dtype=f64)
    cuts = [0, 7, 8, 30, l]  # a one-step sequence and boundaries inside and on chunk edges
    seq = torch.zeros(b, l, dtype=torch.int32)
    for i, (a, e) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        seq[:, a:e] = i
    y, final = ssd.ssd_chunked(x, dt, A, B, C, 8, h0, seq)
    for i, (a, e) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        y1, f1 = ssd.ssd_sequential(x[:, a:e], dt[:, a:e], A, B[:, a:e], C[:, a:e],
                                    h0 if i == 0 else None)
        assert_close(y[:, a:e], y1, msg=f"sequence {i}")
    assert_close(final, f1)


def test_ref_full_signature_matches_manual():
    b, l, h, p, g, n = 2, 19, 4, 3, 1, 5
    x, dt, A, B, C = inputs(b, l, h, p, g, n)
    D, z = torch.randn(h, p, dtype=f64), torch.randn(b, l, h, p, dtype=f64)
    bias = torch.randn(h, dtype=f64)
    out = ssd.mamba_chunk_scan_ref(x, dt, A, B, C, 4, D=D, z=z, dt_bias=bias, dt_softplus=True)
    delta = torch.nn.functional.softplus(dt + bias)
    y = ssd.ssd_quadratic(x, delta, A, B, C)
    assert_close(out, (y + D * x) * torch.nn.functional.silu(z))


def test_bad_inputs_raise():
    x, dt, A, B, C = inputs(1, 8, 4, 2, 3, 5)
    with pytest.raises(ValueError, match="groups"):
        ssd.ssd_chunked(x, dt, A, B, C, 4)
    x, dt, A, B, C = inputs(1, 8, 4, 2, 2, 5)
    with pytest.raises(ValueError, match="dt"):
        ssd.ssd_chunked(x, dt[:, :3], A, B, C, 4)
    with pytest.raises(ValueError, match="chunk_size"):
        ssd.ssd_chunked(x, dt, A, B, C, 0)


# ---- the backward, derived by hand (mambalearn.ssd_grad) --------------------------------------

from mambalearn import ssd_grad  # noqa: E402


@pytest.mark.parametrize("shape, q", [((2, 37, 4, 3, 2, 5), 8), ((1, 16, 2, 4, 1, 3), 4),
                                      ((1, 1, 3, 2, 3, 4), 5), ((2, 23, 6, 2, 3, 2), 23)])
def test_hand_backward_equals_autograd_of_the_oracle(shape, q):
    x, dt, A, B, C = inputs(*shape)
    b, l, h, p, g, n = shape
    h0 = torch.randn(b, h, p, n, dtype=f64)
    leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, h0)]
    y, H = ssd.ssd_chunked(*leaves[:5], q, initial_states=leaves[5])
    dy, dH = torch.randn_like(y), torch.randn_like(H)
    want = torch.autograd.grad((y * dy).sum() + (H * dH).sum(), leaves)
    y2, H2 = ssd_grad.forward(x, dt, A, B, C, q, h0)
    assert_close(y2, y.detach())
    assert_close(H2, H.detach())
    got = ssd_grad.backward(dy, x, dt, A, B, C, q, h0, dH)
    for name, a, e in zip(("x", "dt", "A", "B", "C", "h0"), got, want, strict=True):
        assert_close(a, e, msg=f"d{name}")


def _step_inputs(b=2, c=3, q=5, h=2, p=3, n=4):
    r = lambda *s: torch.randn(*s, dtype=f64)
    cs = torch.cumsum(-torch.rand(b, h, c, q, dtype=f64), -1)
    return r(b, c, q, h, n), r(b, c, q, h, n), cs, r(b, c, q, h, p), r(b, c, h, p, n)


def _autograd(fn, args, dout):
    leaves = [a.clone().requires_grad_() for a in args]
    out = fn(*leaves)
    outs, douts = (out, dout) if isinstance(out, tuple) else ((out,), (dout,))
    loss = sum((o * d).sum() for o, d in zip(outs, douts, strict=True))
    return torch.autograd.grad(loss, leaves)


def test_each_step_backward_equals_autograd_of_its_step():
    C, B, cs, xdt, H = _step_inputs()
    dy = torch.randn_like(xdt)
    dC, dB, dcs, dxdt = ssd_grad.diagonal_backward(dy, C, B, cs, xdt)
    wants = _autograd(ssd_grad.diagonal, (C, B, cs, xdt), dy)
    for got, want in zip((dC, dB, dcs, dxdt), wants, strict=True):
        assert_close(got, want)
    dS = torch.randn_like(H)
    got = ssd_grad.chunk_states_backward(dS, B, cs, xdt)
    want = _autograd(ssd_grad.chunk_states, (B, cs, xdt), dS)
    for a, e in zip(got, want, strict=True):
        assert_close(a, e)
    dC, dcs, dH = ssd_grad.off_diagonal_backward(dy, C, cs, H)
    for a, e in zip((dC, dcs, dH), _autograd(ssd_grad.off_diagonal, (C, cs, H), dy), strict=True):
        assert_close(a, e)
    S, H0 = torch.randn_like(H), torch.randn_like(H[:, 0])
    dH_in, dH_fin = torch.randn_like(H), torch.randn_like(H0)
    dS, dcs, dH0 = ssd_grad.state_passing_backward(dH_in, dH_fin, cs, ssd_grad.state_passing(
        S, cs, H0)[0])
    want = _autograd(ssd_grad.state_passing, (S, cs, H0), (dH_in, dH_fin))
    for a, e in zip((dS, dcs, dH0), want, strict=True):
        assert_close(a, e)
