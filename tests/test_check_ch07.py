"""Chapter 07 checks pass the library and reject an unshifted gate and a Function that saves h."""

import pytest
import torch

from mambalearn import autograd, check
from mambalearn.scan.chunked import chunked_scan, scan_reference


def gate_not_shifted(a, h, grad_h, initial_state=None):
    """dh_t = g_t + a_t dh_{t+1}: the gate of the same step instead of the next one."""
    dh = torch.empty_like(grad_h)
    acc = grad_h[..., -1, :]
    dh[..., -1, :] = acc
    for t in range(a.shape[-2] - 2, -1, -1):
        acc = a[..., t, :] * acc + grad_h[..., t, :]
        dh[..., t, :] = acc
    h0 = torch.zeros_like(h[..., :1, :]) if initial_state is None else initial_state[..., None, :]
    return dh * torch.cat([h0, h[..., :-1, :]], dim=-2), dh


def grad_a_uses_h_t(a, h, grad_h, initial_state=None):
    """∂a_t = dh_t h_t instead of dh_t h_{t−1}."""
    _, grad_b = autograd.scan_backward(a, h, grad_h, initial_state)
    return grad_b * h, grad_b


class SavesEveryState(torch.autograd.Function):
    """Correct gradients, but keeps all l states h for the backward (store-everything)."""

    @staticmethod
    def forward(ctx, a, b, chunk_size, initial_state=None):
        h = chunked_scan(a, b, chunk_size, initial_state)
        ctx.save_for_backward(a, h, initial_state)
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, h, h0 = ctx.saved_tensors
        grad_a, grad_b = autograd.scan_backward(a, h, grad_h, h0)
        return grad_a, grad_b, None, None if h0 is None else a[..., 0, :] * grad_b[..., 0, :]


class SavesStatesOnCtx(SavesEveryState):
    """The same, hiding h from saved_tensors_hooks as a ctx attribute."""

    @staticmethod
    def forward(ctx, a, b, chunk_size, initial_state=None):
        ctx.h = chunked_scan(a, b, chunk_size, initial_state)
        ctx.save_for_backward(a, initial_state)
        return ctx.h.clone()

    @staticmethod
    def backward(ctx, grad_h):
        a, h0 = ctx.saved_tensors
        grad_a, grad_b = autograd.scan_backward(a, ctx.h, grad_h, h0)
        return grad_a, grad_b, None, None if h0 is None else a[..., 0, :] * grad_b[..., 0, :]


class SavesBoundaryViews(torch.autograd.Function):
    """Saves the boundary states as a strided *view* of h: the whole of h stays alive."""

    @staticmethod
    def forward(ctx, a, b, chunk_size, initial_state=None):
        h = chunked_scan(a, b, chunk_size, initial_state)
        ctx.save_for_backward(a, b, h[..., chunk_size - 1::chunk_size, :], initial_state)
        ctx.q = chunk_size
        return h

    @staticmethod
    def backward(ctx, grad_h):
        a, b, _, h0 = ctx.saved_tensors
        h = scan_reference(a, b, h0)  # recompute everything: correct, but the view was kept
        grad_a, grad_b = autograd.scan_backward(a, h, grad_h, h0)
        return grad_a, grad_b, None, None if h0 is None else a[..., 0, :] * grad_b[..., 0, :]


class NoInitialStateGrad(autograd.ChunkedScanFn):
    @staticmethod
    def backward(ctx, grad_h):
        grads = autograd.ChunkedScanFn.backward(ctx, grad_h)
        return grads[0], grads[1], None, None if grads[3] is None else torch.zeros_like(grads[3])


def test_library_passes(capsys):
    check.scan_backward(autograd.scan_backward)
    check.ChunkedScanFn(autograd.ChunkedScanFn)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("✓") for line in out)


@pytest.mark.parametrize("wrong", [gate_not_shifted, grad_a_uses_h_t])
def test_scan_backward_rejects(wrong):
    with pytest.raises(AssertionError, match="scan_backward"):
        check.scan_backward(wrong)


@pytest.mark.parametrize("wrong", [SavesEveryState, SavesStatesOnCtx, SavesBoundaryViews])
def test_chunked_scan_fn_rejects_store_everything(wrong):
    with pytest.raises(AssertionError, match="beyond its inputs"):
        check.ChunkedScanFn(wrong)


def test_chunked_scan_fn_rejects_wrong_initial_state_grad():
    with pytest.raises(AssertionError, match="initial_state"):
        check.ChunkedScanFn(NoInitialStateGrad)


def test_stubs_raise_not_implemented():
    class Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, chunk_size, initial_state=None):
            raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check.ChunkedScanFn(Stub)
    with pytest.raises(NotImplementedError):
        check.scan_backward(lambda a, h, grad_h, initial_state=None: (_ for _ in ()).throw(
            NotImplementedError()))
