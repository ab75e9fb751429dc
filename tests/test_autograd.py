"""The hand-written backward: gradcheck in float64, agreement with autograd, and saved memory."""

import pytest
import torch

from mambalearn.autograd import (
    ChunkedScanFn,
    saved_tensor_bytes,
    scan_backward,
    selective_scan_checkpointed,
    selective_scan_recompute,
)
from mambalearn.scan.chunked import scan_reference, selective_scan_chunked
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close

f64 = torch.float64


def leaf(*shape, scale=1.0, shift=0.0, dtype=f64, device="cpu"):
    return (torch.randn(*shape, dtype=dtype, device=device) * scale + shift).requires_grad_()


@pytest.mark.parametrize("l", [1, 2, 9])
@pytest.mark.parametrize("with_h0", [False, True])
def test_scan_backward_equals_autograd(l, with_h0):
    a = (torch.rand(2, 3, l, 4, dtype=f64) * 0.7 + 0.3).requires_grad_()
    b = leaf(2, 3, l, 4)
    h0 = leaf(2, 3, 4) if with_h0 else None
    g = torch.randn(2, 3, l, 4, dtype=f64)
    h = scan_reference(a, b, h0)
    want = torch.autograd.grad(h, [a, b] + ([h0] if with_h0 else []), g)
    grad_a, grad_b = scan_backward(a.detach(), h.detach(), g, None if h0 is None else h0.detach())
    assert_close(grad_a, want[0], grad=True)
    assert_close(grad_b, want[1], grad=True)
    if with_h0:  # the documented gradient of the initial state
        assert_close(a[..., 0, :].detach() * grad_b[..., 0, :], want[2], grad=True)


@pytest.mark.parametrize("l, q", [(1, 4), (12, 4), (13, 4), (7, 3), (5, 8), (6, 1)])
@pytest.mark.parametrize("with_h0", [False, True])
def test_chunked_scan_fn_gradcheck(l, q, with_h0):
    a = (torch.rand(2, 2, l, 3, dtype=f64) * 0.7 + 0.3).requires_grad_()
    b = leaf(2, 2, l, 3)
    if with_h0:
        assert torch.autograd.gradcheck(lambda a, b, h0: ChunkedScanFn.apply(a, b, q, h0),
                                        (a, b, leaf(2, 2, 3)))
    else:
        assert torch.autograd.gradcheck(lambda a, b: ChunkedScanFn.apply(a, b, q, None), (a, b))


def _selective(b, d, l, n, layout, dtype=f64, device="cpu"):
    r = lambda *s, **k: leaf(*s, dtype=dtype, device=device, **k)
    BC = {"fixed": lambda: r(d, n), "shared": lambda: r(b, n, l), "grouped": lambda: r(b, 2, n, l)}
    A = (-torch.exp(torch.randn(d, n, dtype=dtype, device=device) * 0.3)).requires_grad_()
    return dict(u=r(b, d, l), delta=r(b, d, l, scale=0.5), A=A, B=BC[layout](),
                C=BC["grouped" if layout != "grouped" else "shared"](), D=r(d), z=r(b, d, l),
                delta_bias=r(d, scale=0.1))


@pytest.mark.parametrize("layout", ["fixed", "shared", "grouped"])
@pytest.mark.parametrize("l, q", [(1, 3), (6, 3), (7, 3)])
def test_selective_scan_recompute_gradcheck(layout, l, q):
    """Every input (u, delta, A, B, C, D, z, delta_bias) and the initial state, masked steps too."""
    x = _selective(2, 4, l, 3, layout)
    h0 = leaf(2, 4, 3)
    mask = torch.rand(2, l) > 0.3
    names = list(x)

    def f(*args):
        kw = dict(zip(names, args[:-1], strict=True))
        return selective_scan_recompute(**kw, delta_softplus=True, return_last_state=True,
                                        mask=mask, initial_state=args[-1], chunk_size=q)

    out, last = f(*x.values(), h0)
    want, want_last = selective_scan_sequential(**x, delta_softplus=True, return_last_state=True,
                                                mask=mask, initial_state=h0)
    assert_close(out, want)
    assert_close(last, want_last)
    assert torch.autograd.gradcheck(f, (*x.values(), h0))


@pytest.mark.parametrize("fn", [selective_scan_recompute, selective_scan_checkpointed])
def test_minimal_arguments_match_sequential_grads(fn):
    """No D, z, bias, softplus: gradients equal autograd through the sequential loop (float32)."""
    x = _selective(2, 8, 21, 4, "shared", dtype=torch.float32)
    args = [x[k] for k in ("u", "delta", "A", "B", "C")]
    g = torch.randn(2, 8, 21)
    got = torch.autograd.grad(fn(*args, chunk_size=5), args, g)
    want = torch.autograd.grad(selective_scan_sequential(*args), args, g)
    for x_, y_ in zip(got, want, strict=True):
        assert_close(x_, y_, grad=True)


def test_checkpointed_gradcheck():
    x = _selective(1, 2, 5, 2, "shared")
    f = lambda *a: selective_scan_checkpointed(*a, delta_softplus=True, chunk_size=2)
    assert torch.autograd.gradcheck(f, tuple(x.values()))


def test_saved_bytes_below_store_everything_bound():
    """Recompute saves O(b·d·n·l/q) beyond the inputs; store-everything saves O(b·d·n·l)."""
    b, d, n, q = 1, 8, 4, 8
    saved = {}
    for l in (32, 64, 128):
        x = _selective(b, d, l, n, "shared", dtype=torch.float32)
        for name, fn in (("recompute", selective_scan_recompute),
                         ("store", selective_scan_chunked)):
            with saved_tensor_bytes(exclude=list(x.values())) as s:
                fn(**x, delta_softplus=True, chunk_size=q)
            saved[name, l] = s["bytes"]
        states = b * d * n * l * 4  # one (b, d, l, n) float32 tensor
        assert saved["recompute", l] <= b * d * n * (l // q) * 4  # exactly the chunk-entry states
        assert saved["recompute", l] < states / 4 < saved["store", l]
    assert saved["recompute", 128] == 4 * saved["recompute", 32]  # linear in l/q


def test_chunk_size_validation():
    x = _selective(1, 2, 4, 2, "shared")
    with pytest.raises(ValueError, match="chunk_size"):
        selective_scan_recompute(**x, chunk_size=0)
    with pytest.raises(ValueError, match="delta"):
        selective_scan_recompute(x["u"], x["delta"][..., :2], x["A"], x["B"], x["C"])


@pytest.mark.gpu
def test_gpu_grads_equal_sequential_float32():
    """Realistic sizes on the GPU: recompute gradients equal autograd through the loop."""
    torch.manual_seed(0)
    x = _selective(2, 256, 512, 16, "shared", dtype=torch.float32, device="cuda")
    kw = dict(delta_softplus=True)
    g = torch.randn(2, 256, 512, device="cuda")
    inputs = list(x.values())
    got = torch.autograd.grad(selective_scan_recompute(**x, **kw, chunk_size=32), inputs, g)
    want = torch.autograd.grad(selective_scan_sequential(**x, **kw), inputs, g)
    for name, a, b in zip(x, got, want, strict=True):
        assert_close(a, b, grad=True, msg=name)
