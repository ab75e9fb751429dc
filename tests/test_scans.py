"""Hillis–Steele and Blelloch against the sequential oracle over lengths, dtypes and layouts."""

import math

import pytest
import torch

from mambalearn import ops
from mambalearn.scan.blelloch import blelloch_scan
from mambalearn.scan.hillis_steele import hillis_steele_scan
from mambalearn.scan.layout import ScanCounter
from mambalearn.scan.selective import selective_scan_parallel
from mambalearn.scan.sequential import linear_scan_sequential, selective_scan_sequential
from mambalearn.testing import assert_close

SCANS = [hillis_steele_scan, blelloch_scan]
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 16, 31, 33, 64, 100, 127, 128, 255, 256, 1000, 1024, 2047, 2048,
           4095, 4096]


def diagonal_steps(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g, dtype=torch.float64) * 0.5 + 0.5  # decays in [0.5, 1)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    return a.to(dtype), b.to(dtype)


def matrix_steps(batch, l, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(*batch, l, n, n, generator=g, dtype=torch.float64) / (2 * math.sqrt(n))
    b = torch.randn(*batch, l, n, generator=g, dtype=torch.float64)
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("l", LENGTHS)
def test_diagonal_equals_oracle(scan, dtype, l):
    a, b = diagonal_steps((2, l, 3), dtype, seed=l)
    want = linear_scan_sequential(a.double(), b.double(), dim=1)
    for reverse in (False, True):
        got = scan(a, b, dim=1, reverse=reverse)
        assert got.shape == b.shape and got.dtype == dtype
        assert_close(got, linear_scan_sequential(a.double(), b.double(), dim=1, reverse=reverse))
    assert_close(scan(a, b, dim=1), want)


@pytest.mark.parametrize("scan", SCANS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("l", [1, 2, 3, 6, 8, 17, 64, 255, 1024])
def test_matrix_equals_oracle(scan, dtype, l):
    a, b = matrix_steps((2,), l, 3, dtype, seed=l)
    for reverse in (False, True):
        got = scan(a, b, dim=1, reverse=reverse)
        assert got.shape == b.shape
        assert_close(got, linear_scan_sequential(a.double(), b.double(), dim=1, reverse=reverse))


@pytest.mark.parametrize("scan", SCANS)
def test_any_time_dim_and_broadcast_a(scan):
    a, b = diagonal_steps((3, 4, 11, 2), torch.float64, seed=1)
    for dim in (0, 1, 2, 3, -1, -2):
        assert_close(scan(a, b, dim=dim), linear_scan_sequential(a, b, dim=dim))
    a1 = a[:1, :, :, :1]  # broadcast over batch and state: a (1, 4, 11, 1)
    assert_close(scan(a1, b, dim=2), linear_scan_sequential(a1.expand_as(b), b, dim=2))
    A, u = matrix_steps((4,), 9, 2, torch.float64, seed=2)
    A, u = A.movedim(1, 0), u.movedim(1, 0)  # time first: A (9, 4, 2, 2), u (9, 4, 2)
    assert_close(scan(A, u, dim=0), linear_scan_sequential(A, u, dim=0))
    assert_close(scan(A[:, :1], u, dim=0), linear_scan_sequential(A[:, :1], u, dim=0))


@pytest.mark.parametrize("scan", SCANS)
def test_reverse_is_flip_scan_flip(scan):
    a, b = diagonal_steps((5, 37), torch.float64, seed=3)
    flip = lambda x: x.flip(-1)
    assert_close(scan(a, b, reverse=True), flip(scan(flip(a), flip(b))))


@pytest.mark.parametrize("scan", SCANS)
def test_non_contiguous_and_autograd(scan):
    a, b = diagonal_steps((13, 3), torch.float64, seed=4)
    a, b = a.t().requires_grad_(), b.t().requires_grad_()  # (3, 13), non-contiguous
    assert torch.autograd.gradcheck(lambda a, b: scan(a, b), (a, b))


def test_blelloch_pad_false_refuses_non_power_of_two():
    a, b = diagonal_steps((2, 12), torch.float32, seed=5)
    with pytest.raises(ValueError, match="power-of-two"):
        blelloch_scan(a, b, pad=False)
    a, b = diagonal_steps((2, 16), torch.float32, seed=5)
    assert_close(blelloch_scan(a, b, pad=False), linear_scan_sequential(a, b))


@pytest.mark.parametrize("l", [1, 2, 5, 8, 100, 1024])
def test_counted_work_and_depth(l):
    c_hs, c_bl = ScanCounter(), ScanCounter()
    a, b = diagonal_steps((l,), torch.float64, seed=l)
    hillis_steele_scan(a, b, counter=c_hs)
    blelloch_scan(a, b, counter=c_bl)
    P, log_l = 1 << (l - 1).bit_length(), (l - 1).bit_length()
    assert c_hs.depth == log_l and c_hs.work == sum(l - 2**k for k in range(log_l))
    assert c_bl.depth == 2 * log_l and c_bl.work == 2 * (P - 1)
    for r in c_bl.rounds + c_hs.rounds:  # every recorded pair is an earlier step and a later one
        assert len(r["src"]) == len(r["dst"]) == r["n"]
        assert all(s < t for s, t in zip(r["src"], r["dst"], strict=True))


def test_counter_pairs_replay_the_scan():
    """Replaying the recorded (src, dst) pairs with ⊗ in pure Python gives every prefix."""
    l = 11
    steps = [(torch.rand(2, 2, dtype=torch.float64), torch.randn(2, dtype=torch.float64))
             for _ in range(l)]
    c = ScanCounter()
    hillis_steele_scan(torch.stack([s[0] for s in steps]), torch.stack([s[1] for s in steps]),
                       dim=0, counter=c)
    x = list(steps)
    for r in c.rounds:
        x = _apply_round(x, r)
    for t in range(l):
        assert_close(x[t][1], ops.fold(steps[: t + 1])[1])


def _apply_round(x, r):
    new = list(x)
    for s, t in zip(r["src"], r["dst"], strict=True):
        new[t] = ops.combine(x[s], x[t])
    return new


@pytest.mark.parametrize("bad,words", [
    (dict(a=torch.rand(3, 5), b=torch.rand(3, 6)), "must broadcast"),
    (dict(a=torch.rand(3, 5, 2, 2, 2), b=torch.rand(3, 5, 2)), "must broadcast|matrix"),
    (dict(a=torch.rand(3, 5, 2, 3), b=torch.rand(3, 5, 2)), "matrix a must have shape"),
    (dict(a=torch.rand(3, 5, 2, 2), b=torch.rand(3, 5, 2), dim=-1), "state axis"),
    (dict(a=torch.rand(3, 0), b=torch.rand(3, 0)), "length 0"),
    (dict(a=torch.rand(3, 5), b=torch.rand(3, 5), dim=2), "out of range"),
])
@pytest.mark.parametrize("scan", SCANS)
def test_clear_errors(scan, bad, words):
    with pytest.raises(ValueError, match=words):
        scan(**bad)


def test_wrong_dtypes_are_type_errors():
    with pytest.raises(TypeError, match="real floating"):
        blelloch_scan(torch.rand(4, dtype=torch.complex64), torch.rand(4))
    with pytest.raises(TypeError, match="real floating"):
        hillis_steele_scan(torch.rand(4), torch.arange(4))


@pytest.mark.parametrize("scan", SCANS + [linear_scan_sequential])
@pytest.mark.parametrize("B_kind", ["dn", "bnl", "bgnl"])
def test_selective_scan_parallel_equals_oracle(scan, B_kind):
    b, d, n, l, g = 2, 6, 4, 19, 3
    shapes = {"dn": (d, n), "bnl": (b, n, l), "bgnl": (b, g, n, l)}
    torch.manual_seed(0)
    args = dict(u=torch.randn(b, d, l), delta=torch.randn(b, d, l), A=-torch.rand(d, n) * 4,
                B=torch.randn(*shapes[B_kind]), C=torch.randn(*shapes["bgnl"]), D=torch.randn(d),
                z=torch.randn(b, d, l), delta_bias=torch.randn(d), delta_softplus=True,
                return_last_state=True, mask=torch.rand(b, l) > 0.2,
                initial_state=torch.randn(b, d, n))
    out, last = selective_scan_parallel(**args, scan=scan)
    want, want_last = selective_scan_sequential(**{k: v.double() if torch.is_tensor(v) and
                                                   v.is_floating_point() else v
                                                   for k, v in args.items()})
    assert out.dtype == torch.float32
    assert_close(out, want)
    assert_close(last, want_last)


def test_selective_scan_parallel_bf16_in_bf16_out():
    b, d, n, l = 1, 4, 2, 33
    args = dict(u=torch.randn(b, d, l), delta=torch.rand(b, d, l), A=-torch.rand(d, n),
                B=torch.randn(b, n, l), C=torch.randn(b, n, l))
    low = {k: v.bfloat16() for k, v in args.items()}
    out = selective_scan_parallel(**low)
    assert out.dtype == torch.bfloat16
    assert_close(out, selective_scan_sequential(**low))


def test_bench_peer_pscan_is_right():
    """The benchmark's peer (an in-place up-/down-sweep with a hand-written backward) is correct."""
    from course.bench.scans import PeerPScan, peer_selective_scan

    torch.manual_seed(0)
    A = torch.rand(2, 16, 3, 2, dtype=torch.float64, requires_grad=True)  # (b, l, d, n)
    X = torch.randn(2, 16, 3, 2, dtype=torch.float64, requires_grad=True)
    assert_close(PeerPScan.apply(A, X), linear_scan_sequential(A, X, dim=1))
    assert torch.autograd.gradcheck(PeerPScan.apply, (A, X))
    b, d, n, l = 2, 4, 3, 32
    args = dict(u=torch.randn(b, d, l), delta=torch.rand(b, d, l), A=-torch.rand(d, n),
                B=torch.randn(b, n, l), C=torch.randn(b, n, l), D=torch.randn(d))
    assert_close(peer_selective_scan(**args), selective_scan_sequential(**args))


def test_bench_topic_runs_on_cpu():
    from course.bench import scans

    rows = scans.run(gpu=False)
    assert {r["topic"] for r in rows} == {"scans", "selective fwd", "selective fwd+bwd"}
    assert all(r["ms"] > 0 for r in rows)


def test_selective_scan_parallel_gradients():
    b, d, n, l = 1, 2, 2, 5
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
    u, delta, B, C, h0 = r(b, d, l), r(b, d, l), r(b, n, l), r(b, n, l), r(b, d, n)
    A = (-torch.rand(d, n, generator=g, dtype=torch.float64)).requires_grad_()
    fn = lambda u, delta, A, B, C, h0: selective_scan_parallel(
        u, delta, A, B, C, delta_softplus=True, initial_state=h0)
    assert torch.autograd.gradcheck(fn, (u, delta, A, B, C, h0))
