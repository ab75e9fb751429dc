"""The ⊗ math across ranks without any communication: rank_scan, its backward, the fix-up."""

import pytest
import torch

from mambalearn import ops
from mambalearn.mamba2.reference import ssd_sequential
from mambalearn.parallel.summary import (
    fix_up,
    rank_scan,
    rank_scan_backward,
    shard_decay,
    ssd_decay,
)
from mambalearn.scan.sequential import effective_delta, selective_scan_sequential
from mambalearn.testing import assert_close

f64 = torch.float64


def _summaries(R, shape, g, matrix=False):
    if matrix:  # 2×2 matrices: their products do not commute, so an order mistake shows
        return (torch.randn(R, *shape, 2, 2, generator=g, dtype=f64),
                torch.randn(R, *shape, 2, generator=g, dtype=f64))
    return (torch.rand(R, *shape, generator=g, dtype=f64) * 0.8 + 0.2,
            torch.randn(R, *shape, generator=g, dtype=f64))


@pytest.mark.parametrize("R", [1, 2, 5])
@pytest.mark.parametrize("matrix", [False, True])
def test_rank_scan_is_the_exclusive_fold(R, matrix):
    g = torch.Generator().manual_seed(R)
    P, h = _summaries(R, (2, 3), g, matrix)
    h0 = torch.randn(h.shape[1:], generator=g, dtype=f64)
    H, final = rank_scan(P, h, h0)
    start = (ops.identity(P[0], h[0])[0] * 0, h0)  # the step "(0, h₀)": ignores what came before
    for r in range(R + 1):
        want = ops.fold([start] + [(P[k], h[k]) for k in range(r)])[1]
        assert_close(H[r] if r < R else final, want)


def test_rank_scan_mamba2_layout_broadcasts_one_decay_per_head():
    g = torch.Generator().manual_seed(0)
    P = torch.rand(3, 2, 4, 1, 1, generator=g, dtype=f64)  # (R, b, h, 1, 1)
    h = torch.randn(3, 2, 4, 5, 6, generator=g, dtype=f64)  # (R, b, h, p, n)
    H, final = rank_scan(P, h)
    assert_close(H[2], P[1] * h[0] + h[1])
    assert_close(final, P[2] * (P[1] * h[0] + h[1]) + h[2])


@pytest.mark.parametrize("P_shape", [(2, 3, 4), (2, 3, 1)])
def test_rank_scan_backward_equals_autograd(P_shape):
    g = torch.Generator().manual_seed(1)
    R = 4
    P = (torch.rand(R, *P_shape, generator=g, dtype=f64) + 0.2).requires_grad_()
    h = torch.randn(R, 2, 3, 4, generator=g, dtype=f64, requires_grad=True)
    h0 = torch.randn(2, 3, 4, generator=g, dtype=f64, requires_grad=True)
    H, final = rank_scan(P, h, h0)
    gH, gf = torch.randn_like(H), torch.randn_like(final)
    want = torch.autograd.grad((H * gH).sum() + (final * gf).sum(), [P, h, h0])
    got = rank_scan_backward(P.detach(), H.detach(), gH, gf)
    for name, a, e in zip(("P", "h", "initial state"), got, want, strict=True):
        assert_close(a, e, grad=True, msg=name)


def test_shard_decays_are_the_products_of_the_step_decays():
    g = torch.Generator().manual_seed(2)
    delta, A, bias = torch.randn(2, 3, 7, generator=g), -torch.rand(3, 4, generator=g), \
        torch.randn(3, generator=g)
    dt = effective_delta(delta, bias, True, f64)  # (b, d, l)
    want = torch.exp(dt[..., None] * A.to(f64)[:, None]).prod(-2)  # Π_t exp(Δ_t A)
    assert_close(shard_decay(delta, A, bias, True), want)
    dt2, A2 = torch.randn(2, 7, 3, generator=g), -torch.rand(3, generator=g)
    want2 = torch.exp(torch.nn.functional.softplus(dt2.to(f64)) * A2.to(f64)).prod(1)
    assert_close(ssd_decay(dt2, A2, dt_softplus=True)[..., 0, 0], want2)


@pytest.mark.parametrize("layout", ["shared", "grouped"])
def test_fix_up_equals_scanning_from_the_state(layout):
    g = torch.Generator().manual_seed(3)
    b, d, l, n = 2, 4, 9, 3
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
    BC = (b, n, l) if layout == "shared" else (b, 2, n, l)
    u, delta, A, B, C, D = r(b, d, l), r(b, d, l), -torch.exp(r(d, n)), r(*BC), r(*BC), r(d)
    H = r(b, d, n)
    y0, last0 = selective_scan_sequential(u, delta, A, B, C, D, delta_softplus=True,
                                          return_last_state=True)
    want, want_last = selective_scan_sequential(u, delta, A, B, C, D, delta_softplus=True,
                                                return_last_state=True, initial_state=H)
    dt = effective_delta(delta, None, True, f64)
    y, last = fix_up(y0, last0, dt, A, C, H)
    assert_close(y, want)
    assert_close(last, want_last)


def test_ssd_states_compose_across_a_split():
    """The SSD recurrence split in two: H = final state of the first part, scan the second from
    it — the fix-up the SSD kernels do with ``initial_states``."""
    g = torch.Generator().manual_seed(4)
    b, L, h, p, n = 1, 10, 2, 3, 4
    r = lambda *s: torch.randn(*s, generator=g, dtype=f64)
    x, dt, A, B, C = r(b, L, h, p), torch.rand(b, L, h, generator=g, dtype=f64), \
        -torch.rand(h, generator=g, dtype=f64), r(b, L, 1, n), r(b, L, 1, n)
    y, final = ssd_sequential(x, dt, A, B, C)
    _, h1 = ssd_sequential(x[:, :4], dt[:, :4], A, B[:, :4], C[:, :4])
    P = ssd_decay(dt[:, 4:], A)  # (b, h, 1, 1)
    _, h2 = ssd_sequential(x[:, 4:], dt[:, 4:], A, B[:, 4:], C[:, 4:])
    H, fin = rank_scan(torch.stack([ssd_decay(dt[:, :4], A), P]), torch.stack([h1, h2]))
    assert_close(fin, final)
    y2, _ = ssd_sequential(x[:, 4:], dt[:, 4:], A, B[:, 4:], C[:, 4:], initial_states=H[1])
    assert_close(y2, y[:, 4:])
