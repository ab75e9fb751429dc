"""The initial-state input of the Mamba-1 oracle and PyTorch scans (chapter 14's fix-up needs it).

Every path scans h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t from a given h_{−1}; its output, its last
state and the gradients of both (to every input *and* to h_{−1}) are compared with a plain float64
loop written here, independently of the library.
"""

import pytest
import torch
import torch.nn.functional as F

from mambalearn.autograd import selective_scan_checkpointed, selective_scan_recompute
from mambalearn.scan.chunked import selective_scan_chunked
from mambalearn.scan.hillis_steele import hillis_steele_scan
from mambalearn.scan.selective import selective_scan_parallel
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close

f64 = torch.float64


def loop64(u, delta, A, B, C, D, z, delta_bias, initial_state):
    """The recurrence, one step at a time, in float64 (B, C shared (b, n, l))."""
    dt = F.softplus(delta + delta_bias[:, None])  # (b, d, l)
    h, ys = initial_state, []
    for t in range(u.shape[-1]):
        Bx = (dt[..., t] * u[..., t])[..., None] * B[:, None, :, t]  # Δ_t B_t x_t: (b, d, n)
        h = torch.exp(dt[..., t, None] * A) * h + Bx
        ys.append((h * C[:, None, :, t]).sum(-1) + D * u[..., t])  # (b, d)
    return torch.stack(ys, -1) * F.silu(z), h  # (b, d, l), (b, d, n)


PATHS = {
    "sequential": selective_scan_sequential,
    "chunked": lambda *a, **k: selective_scan_chunked(*a, **k, chunk_size=3),
    "blelloch": selective_scan_parallel,
    "hillis_steele": lambda *a, **k: selective_scan_parallel(*a, **k, scan=hillis_steele_scan),
    "recompute": lambda *a, **k: selective_scan_recompute(*a, **k, chunk_size=3),
    "checkpointed": lambda *a, **k: selective_scan_checkpointed(*a, **k, chunk_size=3),
}


def _inputs(b, d, l, n, dtype):
    g = torch.Generator().manual_seed(l * 100 + n)
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g, dtype=f64) * scale)
    x = dict(u=r(b, d, l), delta=r(b, d, l, scale=0.5), A=-torch.exp(r(d, n, scale=0.3)),
             B=r(b, n, l), C=r(b, n, l), D=r(d), z=r(b, d, l), delta_bias=r(d, scale=0.1),
             initial_state=r(b, d, n))
    return {k: v.to(dtype).requires_grad_() for k, v in x.items()}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("l", [1, 7])
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_initial_state_forward_and_gradients_match_a_float64_loop(path, l, dtype):
    x = _inputs(2, 3, l, 4, dtype)
    out, last = PATHS[path](x["u"], x["delta"], x["A"], x["B"], x["C"], x["D"], x["z"],
                            x["delta_bias"], True, return_last_state=True,
                            initial_state=x["initial_state"])
    x64 = {k: v.detach().to(f64).requires_grad_() for k, v in x.items()}
    want, want_last = loop64(**x64)
    assert_close(out, want)
    assert_close(last, want_last)
    g_out, g_last = torch.randn_like(want), torch.randn_like(want_last)  # a loss on both outputs
    got = torch.autograd.grad((out * g_out.to(dtype)).sum() + (last * g_last.to(last.dtype)).sum(),
                              list(x.values()))
    ref = torch.autograd.grad((want * g_out).sum() + (want_last * g_last).sum(), list(x64.values()))
    for name, a, e in zip(x, got, ref, strict=True):
        assert_close(a, e, grad=True, msg=f"{path}: gradient of {name}")


@pytest.mark.parametrize("path", ["chunked", "blelloch", "recompute"])
def test_initial_state_gradcheck(path):
    """torch.autograd.gradcheck in float64 with respect to h_{−1} (the others held fixed)."""
    x = _inputs(1, 2, 5, 3, f64)
    rest = {k: v.detach() for k, v in x.items() if k != "initial_state"}

    def f(h0):
        return PATHS[path](rest["u"], rest["delta"], rest["A"], rest["B"], rest["C"], rest["D"],
                           rest["z"], rest["delta_bias"], True, return_last_state=True,
                           initial_state=h0)

    assert torch.autograd.gradcheck(f, (x["initial_state"],))


def test_scan_from_a_state_continues_the_sequence():
    """Scanning steps 0..k−1, then k..l−1 from the state left: the same as one scan of 0..l−1."""
    x = {k: v.detach() for k, v in _inputs(2, 3, 11, 4, f64).items()}
    cut = lambda X, s: X[..., s] if X.ndim == 3 else X
    args = lambda s, h0: [cut(x[k], s) for k in ("u", "delta", "A", "B", "C", "D", "z",
                                                   "delta_bias")] + [True]
    whole, whole_last = selective_scan_sequential(*args(slice(None), None), return_last_state=True)
    for path, fn in PATHS.items():
        first, mid = fn(*args(slice(0, 4), None), return_last_state=True)
        second, last = fn(*args(slice(4, None), None), return_last_state=True, initial_state=mid)
        assert_close(torch.cat([first, second], -1), whole, msg=path)
        assert_close(last, whole_last, msg=path)
