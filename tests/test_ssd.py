"""SSD oracles agree with each other (chapter 10): quadratic = sequential = chunked, seq_idx packing."""

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
            want = x[:, s + 1: t + 1].sum(-1) if t >= s else torch.full((3,), float("-inf"), dtype=f64)
            assert_close(S[:, t, s], want)
    # long sequence of strongly negative steps: exp(cumsum) underflows, segsum does not lose L
    x = torch.full((4000,), -1.0, dtype=torch.float32)
    L = torch.exp(ssd.segsum(x))
    assert torch.isfinite(L).all() and L[3999, 3998] == pytest.approx(torch.exp(torch.tensor(-1.0)).item())


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
    for i, (a, e) in enumerate(zip(cuts[:-1], cuts[1:])):
        seq[:, a:e] = i
    y, final = ssd.ssd_chunked(x, dt, A, B, C, 8, h0, seq)
    for i, (a, e) in enumerate(zip(cuts[:-1], cuts[1:])):
        y1, f1 = ssd.ssd_sequential(x[:, a:e], dt[:, a:e], A, B[:, a:e], C[:, a:e], h0 if i == 0 else None)
        assert_close(y[:, a:e], y1, msg=f"sequence {i}")
    assert_close(final, f1)


def test_ref_full_signature_matches_manual():
    b, l, h, p, g, n = 2, 19, 4, 3, 1, 5
    x, dt, A, B, C = inputs(b, l, h, p, g, n)
    D, z, bias = torch.randn(h, p, dtype=f64), torch.randn(b, l, h, p, dtype=f64), torch.randn(h, dtype=f64)
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
