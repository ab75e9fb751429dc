"""Chapter 04's Blelloch scan as an autograd.Function (backward = a reverse Blelloch scan) and the
selective scan's hand-written discretization backward, against autograd through the loop oracles.

Inputs are fresh random numbers on every run; the seed is in every failure message.
"""

import os

import pytest
import torch

from course.bench.scans import count_passes
from mambalearn.autograd import saved_tensor_bytes
from mambalearn.scan.blelloch import BlellochScan, blelloch_scan
from mambalearn.scan.layout import ScanCounter
from mambalearn.scan.selective import selective_scan_parallel
from mambalearn.scan.sequential import linear_scan_sequential, selective_scan_sequential
from mambalearn.testing import assert_close

f64 = torch.float64
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 16, 31, 33, 64, 100, 127, 128, 255, 256, 257, 300]


def fresh():
    seed = int.from_bytes(os.urandom(6), "little")
    return torch.Generator().manual_seed(seed), seed


def grads(fn, inputs, grad_out):
    """∂⟨fn(*inputs), grad_out⟩ / ∂inputs."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    return torch.autograd.grad(fn(*leaves), leaves, grad_out)


def assert_grads_match(fn, oracle, inputs, grad_out, dtype, what):
    """fn's gradients in ``dtype`` against the oracle's through autograd in float64."""
    want = grads(oracle, [x.to(f64) for x in inputs], grad_out.to(f64))
    got = grads(fn, [x.to(dtype) for x in inputs], grad_out.to(dtype))
    for i, (x, y) in enumerate(zip(got, want, strict=True)):
        assert x.dtype == dtype and x.shape == inputs[i].shape
        assert_close(x, y, grad=True, msg=f"gradient of input {i}, {what}")


@pytest.mark.parametrize("dtype", [torch.float32, f64])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("l", LENGTHS)
def test_diagonal_gradients_equal_the_loop(l, reverse, dtype):
    g, seed = fresh()
    a = torch.rand(2, l, 3, generator=g, dtype=f64) * 0.5 + 0.5  # decays in [0.5, 1)
    b = torch.randn(2, l, 3, generator=g, dtype=f64)
    w = torch.randn(2, l, 3, generator=g, dtype=f64)  # ∂ℒ/∂h
    assert_grads_match(lambda a, b: blelloch_scan(a, b, dim=1, reverse=reverse),
                       lambda a, b: linear_scan_sequential(a, b, dim=1, reverse=reverse),
                       [a, b], w, dtype, f"l={l}, reverse={reverse}, seed {seed}")


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("l", [1, 2, 3, 8, 13, 64, 100])
def test_matrix_gradients_equal_the_loop(l, reverse, batch):
    """Full n×n A (h_t = A_t h_{t−1} + b_t): the backward's gate is A_{t+1}ᵀ, ∂A_t = dh_t h_{t−1}ᵀ.
    Without a batch the tree's matrix products write over one of their inputs."""
    g, seed = fresh()
    A = torch.randn(*batch, l, 3, 3, generator=g, dtype=f64) / 3
    b, w = torch.randn(*batch, l, 3, generator=g, dtype=f64), torch.randn(*batch, l, 3,
                                                                            generator=g, dtype=f64)
    dim = len(batch)
    assert_grads_match(lambda A, b: blelloch_scan(A, b, dim=dim, reverse=reverse),
                       lambda A, b: linear_scan_sequential(A, b, dim=dim, reverse=reverse),
                       [A, b], w, f64, f"matrix, l={l}, reverse={reverse}, seed {seed}")


@pytest.mark.parametrize("l", [1, 5, 16, 37])
def test_broadcast_and_non_contiguous_inputs(l):
    g, seed = fresh()
    a = torch.rand(1, l, 1, generator=g, dtype=f64) * 0.5 + 0.5  # broadcast over batch and lanes
    b = torch.randn(4, 3, l, generator=g, dtype=f64).transpose(1, 2)  # (4, l, 3), non-contiguous
    w = torch.randn(4, l, 3, generator=g, dtype=f64)
    assert_grads_match(lambda a, b: blelloch_scan(a, b, dim=1),
                       lambda a, b: linear_scan_sequential(a.expand_as(b), b, dim=1),
                       [a, b], w, torch.float32, f"broadcast a, l={l}, seed {seed}")
    # an upstream gradient with stride 0 everywhere (out.sum()) is read, never written
    a_, b_ = a.requires_grad_(), b.requires_grad_()
    blelloch_scan(a_, b_, dim=1).sum().backward()
    want = grads(lambda a, b: linear_scan_sequential(a.expand_as(b), b, dim=1), [a, b],
                 torch.ones(4, l, 3, dtype=f64))
    assert_close(a_.grad, want[0], grad=True)
    assert_close(b_.grad, want[1], grad=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("l", [1, 2, 5, 8, 13])
def test_gradcheck(l, reverse):
    g, _ = fresh()
    a = (torch.rand(2, l, 3, generator=g, dtype=f64) * 0.5 + 0.5).requires_grad_()
    b = torch.randn(2, l, 3, generator=g, dtype=f64, requires_grad=True)
    A = (torch.randn(l, 2, 2, generator=g, dtype=f64) / 2).requires_grad_()
    u = torch.randn(l, 2, generator=g, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: blelloch_scan(a, b, dim=1, reverse=reverse),
                                    (a, b))
    assert torch.autograd.gradcheck(lambda A, u: blelloch_scan(A, u, dim=0, reverse=reverse),
                                    (A, u))


@pytest.mark.parametrize("l", [1, 6, 64])
def test_saves_only_a_and_the_states(l):
    """What stays for the backward: a (the input itself) and the P + 1 states, no tree levels."""
    a = torch.rand(l, 4, 3, dtype=f64, requires_grad=True)
    b = torch.randn(l, 4, 3, dtype=f64, requires_grad=True)
    P = 1 << (l - 1).bit_length()
    with saved_tensor_bytes(exclude=[a, b]) as saved:
        h = blelloch_scan(a, b, dim=0)
    assert saved["tensors"] == 1 and saved["bytes"] == (P + 1) * 4 * 3 * 8
    assert_close(h, linear_scan_sequential(a, b, dim=0))


def test_counter_and_no_grad_unchanged():
    """The counter sees the same tree with or without autograd (chapter 04 draws it)."""
    a, b = torch.rand(13, requires_grad=True), torch.rand(13)
    c1, c2 = ScanCounter(), ScanCounter()
    h1 = blelloch_scan(a, b, counter=c1)
    with torch.no_grad():
        h2 = blelloch_scan(a, b, counter=c2)
    assert c1.rounds == c2.rounds and (c1.work, c1.depth) == (2 * 15, 8)
    assert torch.equal(h1.detach(), h2)


def test_function_direct():
    g, _ = fresh()
    A = torch.rand(9, 5, generator=g, dtype=f64, requires_grad=True)
    U = torch.randn(9, 5, generator=g, dtype=f64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda A, U: BlellochScan.apply(A, U, False, None), (A, U))
    assert torch.autograd.gradcheck(lambda A, U: BlellochScan.apply(A, U, True, None), (A, U))


def test_memory_passes():
    """Bytes moved, in passes over one (l, …) tensor: the bare scan 11 forward (up-sweep 7,
    down-sweep 4) and 16 more backward; the selective scan 16 forward, 25 backward (+ the small
    (l, b, d) tensors, ≈ 1/n of a pass each). Guards the counts written in the docstrings."""
    a, b, w = torch.rand(256, 4096), torch.randn(256, 4096), torch.randn(256, 4096)
    unit = b.numel() * 4  # 2(P − 1)/P of a pass per "2 passes" of the tree: 10.96, not 11
    with torch.no_grad():
        assert 10.9 < count_passes(lambda: blelloch_scan(a, b, dim=0), unit) < 11.1
    a.requires_grad_(), b.requires_grad_()
    both = lambda: blelloch_scan(a, b, dim=0).backward(w)
    assert 26.8 < count_passes(both, unit) < 27.1
    bb, d, n, l = 1, 64, 16, 256
    args = dict(u=torch.randn(bb, d, l), delta=torch.rand(bb, d, l), A=-torch.rand(d, n),
                B=torch.randn(bb, n, l), C=torch.randn(bb, n, l), D=torch.randn(d))
    unit = bb * d * n * l * 4
    with torch.no_grad():
        assert count_passes(lambda: selective_scan_parallel(**args), unit) < 17.5
    leaves = {k: v.requires_grad_() for k, v in args.items()}
    both = lambda: selective_scan_parallel(**leaves).backward(torch.ones(bb, d, l))
    assert count_passes(both, unit) < 44.5


# ---------------------------------------------------------------------------------------------
# the whole selective scan: every gradient against the loop oracle

SHAPES = {"dn": lambda b, d, n, l, g: (d, n), "bnl": lambda b, d, n, l, g: (b, n, l),
          "bgnl": lambda b, d, n, l, g: (b, g, n, l)}


def selective_inputs(gen, b, d, n, l, g, B_kind, C_kind):
    r = lambda *s: torch.randn(*s, generator=gen, dtype=f64)
    return dict(u=r(b, d, l), delta=r(b, d, l) * 0.5, A=-torch.rand(d, n, generator=gen,
                dtype=f64) * 4, B=r(*SHAPES[B_kind](b, d, n, l, g)),
                C=r(*SHAPES[C_kind](b, d, n, l, g)), D=r(d), z=r(b, d, l), delta_bias=r(d) * 0.5,
                initial_state=r(b, d, n))


@pytest.mark.parametrize("B_kind", list(SHAPES))
@pytest.mark.parametrize("C_kind", list(SHAPES))
@pytest.mark.parametrize("l", [1, 19, 64])
def test_selective_gradients_equal_the_oracle(B_kind, C_kind, l):
    gen, seed = fresh()
    b, d, n, g = 2, 6, 4, 3
    args = selective_inputs(gen, b, d, n, l, g, B_kind, C_kind)
    mask = torch.rand(b, l, generator=gen) > 0.2
    names = list(args)
    w = torch.randn(b, d, l, generator=gen, dtype=f64)
    kw = dict(delta_softplus=True, mask=mask)
    named = lambda x: dict(zip(names, x, strict=True))
    assert_grads_match(lambda *x: selective_scan_parallel(**named(x), **kw),
                       lambda *x: selective_scan_sequential(**named(x), **kw),
                       list(args.values()), w, torch.float32,
                       f"B {B_kind}, C {C_kind}, l={l}, order {names}, seed {seed}")


def test_selective_gradients_without_optional_inputs():
    gen, seed = fresh()
    b, d, n, l = 2, 4, 3, 33
    args = selective_inputs(gen, b, d, n, l, 1, "bnl", "bnl")
    args = {k: args[k] for k in "u delta A B C".split()}
    w = torch.randn(b, d, l, generator=gen, dtype=f64)
    assert_grads_match(lambda *x: selective_scan_parallel(*x), selective_scan_sequential,
                       list(args.values()), w, torch.float32, f"seed {seed}")


def test_selective_gradcheck():
    gen, _ = fresh()
    args = selective_inputs(gen, 1, 4, 2, 5, 2, "bgnl", "dn")
    args = {k: v.requires_grad_() for k, v in args.items()}
    mask = torch.tensor([[True, False, True, True, True]])
    fn = lambda *x: selective_scan_parallel(**dict(zip(args, x, strict=True)), mask=mask,
                                            delta_softplus=True)
    assert torch.autograd.gradcheck(fn, tuple(args.values()))


def test_last_state_is_a_small_copy():
    args = dict(u=torch.randn(1, 4, 64), delta=torch.rand(1, 4, 64), A=-torch.rand(4, 2),
                B=torch.randn(1, 2, 64), C=torch.randn(1, 2, 64))
    out, last = selective_scan_parallel(**args, return_last_state=True)
    _, want = selective_scan_sequential(**args, return_last_state=True)
    assert_close(last, want)
    assert last.untyped_storage().nbytes() == last.numel() * 4  # does not keep all states alive
