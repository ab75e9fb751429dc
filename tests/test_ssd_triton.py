"""The five Triton SSD stages and mamba_chunk_scan_combined against the PyTorch oracle (chapter 10).

On a CPU these run in Triton's interpreter at tiny shapes; the `gpu` tests run real sizes.
"""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from mambalearn import testing
from mambalearn.mamba2 import api as combined
from mambalearn.mamba2 import chunk as T
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba2.config import defaults

# The SSD kernels multiply on the tensor cores: tf32 on a GPU (testing.assert_close, "dot")
assert_close = partial(testing.assert_close, dtype="dot")

dev = "cuda" if torch.cuda.is_available() else "cpu"
ST = defaults(dev).stages  # the five stages' launch settings on this device


def make(b, l, h, p, g, n, dtype=torch.float32, softplus=True):
    x = torch.randn(b, l, h, p, device=dev, dtype=dtype)
    dt = (
        (torch.randn(b, l, h, device=dev) - 1)
        if softplus
        else torch.rand(b, l, h, device=dev) * 0.3
    )
    A = -torch.rand(h, device=dev) * 2 - 0.2
    B, C = (torch.randn(b, l, g, n, device=dev, dtype=dtype) for _ in range(2))
    return x, dt, A, B, C


def ref(*args, **kw):
    up = lambda t: t.double() if torch.is_tensor(t) and t.is_floating_point() else t
    return ssd.mamba_chunk_scan_ref(*map(up, args), **{k: up(v) for k, v in kw.items()})


def test_stages_against_oracle():
    b, l, h, p, g, n, q = 1, 21, 2, 4, 1, 8, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    bias = torch.randn(h, device=dev)
    dt_c, dA_cs = T.chunk_cumsum(dt, A, q, bias, dt_softplus=True,
                                 heads=ST.cumsum_heads)  # (b, h, c, q)
    delta = F.pad(F.softplus(dt + bias), (0, 0, 0, 24 - l)).reshape(b, 3, q, h).permute(0, 3, 1, 2)
    assert_close(dt_c, delta)
    assert_close(dA_cs, torch.cumsum(delta * A[:, None, None], -1))
    CB = T.bmm_chunk(C, B, q, ST)  # (b, c, g, q, q)
    Cp, Bp = F.pad(C, (0, 0, 0, 0, 0, 3)), F.pad(B, (0, 0, 0, 0, 0, 3))
    want = torch.einsum("bctgn,bcsgn->bcgts", Cp.reshape(b, 3, q, g, n), Bp.reshape(b, 3, q, g, n))
    causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
    assert_close(CB.masked_fill(~causal, 0), want.masked_fill(~causal, 0))
    S = T.chunk_state(x, B, dt_c, dA_cs, None, ST)  # (b, c, h, p, n)
    for c in range(3):  # each chunk alone, started from zero, leaves S_c
        sl = slice(c * q, min(l, (c + 1) * q))
        _, f = ssd.ssd_sequential(
            x[:, sl], dt_c[:, :, c, : sl.stop - sl.start].transpose(1, 2), A, B[:, sl], C[:, sl]
        )
        assert_close(S[:, c], f)
    h0 = torch.randn(b, h, p, n, device=dev)
    Hin, final = T.state_passing(S, dA_cs, h0, l=l, cfg=ST)
    H = h0
    for c in range(3):
        assert_close(Hin[:, c], H)
        H = torch.exp(dA_cs[:, :, c, -1])[..., None, None] * H + S[:, c]
    assert_close(final, H)
    out = T.chunk_scan(x, C, CB, dt_c, dA_cs, Hin, None, None, None, ST)
    assert_close(out, ref(x, dt, A, B, C, q, dt_bias=bias, initial_states=h0, dt_softplus=True))


@pytest.mark.parametrize("l,q,g", [(37, 16, 2), (16, 16, 1), (5, 8, 1), (50, 32, 4)])
def test_combined_forward(l, q, g):
    b, h, p, n = 2, 4, 4, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    kw = dict(
        D=torch.randn(h, device=dev),
        z=torch.randn(b, l, h, p, device=dev),
        dt_bias=torch.randn(h, device=dev),
        initial_states=torch.randn(b, h, p, n, device=dev),
        dt_softplus=True,
    )
    out, final = combined.mamba_chunk_scan_combined(
        x, dt, A, B, C, q, return_final_states=True, **kw
    )
    want, want_f = ref(x, dt, A, B, C, q, return_final_states=True, **kw)
    assert_close(out, want)
    assert_close(final, want_f)


def test_seq_idx_and_noncontiguous():
    b, l, h, p, g, n, q = 2, 40, 2, 4, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n, softplus=False)
    x = torch.randn(b, l, p, h, device=dev).transpose(2, 3)  # non-contiguous
    D = torch.randn(h, p, device=dev)
    seq = torch.zeros(b, l, dtype=torch.int32, device=dev)
    seq[:, 9:], seq[:, 16:], seq[1, 33:] = 1, 2, 3
    h0 = torch.randn(b, h, p, n, device=dev)
    out, final = combined.mamba_chunk_scan_combined(
        x, dt, A, B, C, q, D=D, seq_idx=seq, initial_states=h0, return_final_states=True
    )
    want, want_f = ref(
        x, dt, A, B, C, q, D=D, seq_idx=seq, initial_states=h0, return_final_states=True
    )
    assert_close(out, want)
    assert_close(final, want_f)


def test_backward_matches_autograd_of_oracle():
    b, l, h, p, g, n, q = 1, 13, 2, 4, 1, 8, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    D, bias, h0 = (
        torch.randn(h, device=dev),
        torch.randn(h, device=dev),
        torch.randn(b, h, p, n, device=dev),
    )
    z = torch.randn(b, l, h, p, device=dev)
    leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, z, bias, h0)]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    dout = torch.randn(b, l, h, p, device=dev)
    x_, dt_, A_, B_, C_, D_, z_, b_, h_ = leaves
    combined.mamba_chunk_scan_combined(
        x_, dt_, A_, B_, C_, q, D=D_, z=z_, dt_bias=b_, initial_states=h_, dt_softplus=True
    ).backward(dout)
    x_, dt_, A_, B_, C_, D_, z_, b_, h_ = leaves64
    ssd.mamba_chunk_scan_ref(
        x_, dt_, A_, B_, C_, q, D=D_, z=z_, dt_bias=b_, initial_states=h_, dt_softplus=True
    ).backward(dout.double())
    for name, a, e in zip("x dt A B C D z dt_bias h0".split(), leaves, leaves64, strict=True):
        assert_close(a.grad, e.grad, grad=True, msg=name)


def test_bad_arguments():
    x, dt, A, B, C = make(1, 8, 2, 4, 1, 8)
    with pytest.raises(ValueError, match="chunk_size"):
        combined.mamba_chunk_scan_combined(x, dt, A, B, C, 12)
    with pytest.raises(TypeError, match="B and C"):
        combined.mamba_chunk_scan_combined(x, dt, A, B.double(), C, 8)
    with pytest.raises(ValueError, match="initial_states"):
        combined.mamba_chunk_scan_combined(
            x, dt, A, B, C, 8, initial_states=torch.zeros(1, 2, 4, 7)
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fused", [False, True])
def test_gpu_real_sizes(dtype, fused):
    b, l, h, p, g, n, q = 2, 1000, 8, 64, 2, 128, 256
    x, dt, A, B, C = make(b, l, h, p, g, n, dtype=dtype)
    kw = dict(
        D=torch.randn(h, device=dev),
        z=torch.randn(b, l, h, p, device=dev, dtype=dtype),
        dt_bias=torch.randn(h, device=dev),
        initial_states=torch.randn(b, h, p, n, device=dev),
        dt_softplus=True,
    )
    out, final = combined.mamba_chunk_scan_combined(
        x, dt, A, B, C, q, return_final_states=True, fused=fused, **kw
    )
    want, want_f = ref(x, dt, A, B, C, q, return_final_states=True, **kw)
    rel = (out.double() - want).norm() / want.norm()
    assert rel < (2e-2 if dtype == torch.bfloat16 else 2e-3), rel
    assert (final.double() - want_f).norm() / want_f.norm() < 2e-2


def test_backward_by_head_slices():
    """The reference backward recomputes a few heads at a time (12 heads, one group: two slices of
    6), final-state gradient too."""
    b, l, h, p, g, n, q = 1, 11, 12, 3, 1, 8, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    D, bias, h0 = (
        torch.randn(h, p, device=dev),
        torch.randn(h, device=dev),
        torch.randn(b, h, p, n, device=dev),
    )
    z = torch.randn(b, l, h, p, device=dev)
    leaves = [t.clone().requires_grad_() for t in (x, dt, A, B, C, D, z, bias, h0)]
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    dout, dfin = torch.randn(b, l, h, p, device=dev), torch.randn(b, h, p, n, device=dev)
    ours = lambda *a, **k: combined.mamba_chunk_scan_combined(*a, backward="reference", **k)
    for ls, f in ((leaves, ours), (leaves64, ssd.mamba_chunk_scan_ref)):
        x_, dt_, A_, B_, C_, D_, z_, b_, h_ = ls
        out, fin = f(
            x_,
            dt_,
            A_,
            B_,
            C_,
            q,
            D=D_,
            z=z_,
            dt_bias=b_,
            initial_states=h_,
            dt_softplus=True,
            return_final_states=True,
        )
        ((out * dout.to(out.dtype)).sum() + (fin * dfin.to(fin.dtype)).sum()).backward()
    for name, a, e in zip("x dt A B C D z dt_bias h0".split(), leaves, leaves64, strict=True):
        assert_close(a.grad, e.grad, grad=True, msg=name)


def test_reference_head_slices_stay_inside_groups():
    assert combined._head_step(12, 8) == 6 and combined._head_step(6, 8) == 6
    assert combined._head_step(6, 4) == 3 and combined._head_step(7, 4) == 1
    assert combined._head_step(1, 8) == 1
