"""tests/test_silent_bugs.py's non-finite inputs on a GPU, at the launch settings a GPU uses.

The CPU tests run the kernels in Triton's interpreter, whose exp, min and max are numpy's; on a
GPU, exp2 is the SFU's (``ex2.approx.ftz``) and min/max need not propagate NaN. So A = −∞ (ADT = −∞
for Mamba-3) is checked here again — forward against the float64 recurrence, gradients finite and
equal to their limit (A → −1e6) — with the default tiles (fused SSD forwards, chunk 64–256), and so
is where a NaN in one token goes. Every helper takes its sizes, so the same code runs tiny in the
interpreter; the tests are marked ``gpu`` and skipped without one.
"""

import pytest
import torch

from mambalearn import mamba3
from mambalearn.mamba2 import reference as ssd
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close, dot_dtype

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
INF = float("inf")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not GPU, reason="needs a CUDA GPU (run on the GPU machine)")]


def close(got, want, grad=False, msg=""):
    """float32 products are tf32 on a GPU: its tolerance, on the whole tensor's norm."""
    assert_close(got, want.to(got.device), dtype=dot_dtype(got), norm=got.is_cuda, grad=grad,
                 msg=msg)


def limit(t):
    """−∞ replaced by −1e6: exp(Δ A) and A exp(Δ A) are 0 in float64 for every Δ used here."""
    return torch.where(t == -INF, -1e6, t)


def grads_of(fn, kw, seed=3):
    """out and the gradients of ⟨w, out⟩ (w seeded, float64) w.r.t. every tensor in kw."""
    x = {k: v.detach().clone().requires_grad_() for k, v in kw.items() if v is not None}
    out = fn(**{k: x.get(k) for k in kw})
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    (out.double() * w.to(out.device)).sum().backward()
    return out.detach(), {k: v.grad for k, v in x.items()}


def check_grads(got, want, what):
    for k, g in got.items():
        assert torch.isfinite(g).all(), f"{what}: d{k} not finite"
        close(g, want[k], grad=True, msg=f"{what}: d{k}")


# --- SSD -----------------------------------------------------------------------------------------

def ssd_case(b, l, h, p, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    A = -(torch.rand(h, generator=g) + 0.5)
    A[1::3] = -INF  # every third head forgets at every step
    kw = dict(x=r(b, l, h, p), dt=torch.rand(b, l, h, generator=g) * 0.5 + 0.01, A=A,
              B=r(b, l, 1, n), C=r(b, l, 1, n), D=r(h))
    return {k: v.to(DEV) for k, v in kw.items()}


def ssd_minus_inf(b, l, h, p, n, q, fused):
    from mambalearn.mamba2 import mamba_chunk_scan_combined

    kw = ssd_case(b, l, h, p, n)
    run = lambda **k: mamba_chunk_scan_combined(**k, chunk_size=q, fused=fused)  # noqa: E731
    out, grads = grads_of(run, kw)
    assert torch.isfinite(out).all(), "SSD, A = −∞: out not finite"
    want = ssd.ssd_sequential(*(kw[k].double() for k in ("x", "dt", "A", "B", "C")))[0]
    close(out, want + kw["D"].double()[:, None] * kw["x"].double(), msg="SSD, A = −∞: out")
    ref = lambda **k: ssd.mamba_chunk_scan_ref(**k, chunk_size=q)  # noqa: E731
    _, want_g = grads_of(ref, {k: v.double() for k, v in dict(kw, A=limit(kw["A"])).items()})
    check_grads(grads, want_g, "SSD, A = −∞")


@pytest.mark.parametrize("fused", [True, False])
def test_gpu_ssd_with_A_minus_inf(fused):
    ssd_minus_inf(2, 1000, 8, 64, 64, 128, fused)


@pytest.mark.parametrize("launches", [1, 2])
def test_gpu_ssd_fused_forward_with_A_minus_inf(launches):
    from mambalearn.mamba2.fused.forward import ssd_fused_forward

    kw = ssd_case(2, 2049, 8, 64, 128)
    with torch.no_grad():
        out, _ = ssd_fused_forward(**{k: v.bfloat16() if k in "xBC" else v for k, v in kw.items()},
                                   chunk_size=256, launches=launches)
    want = ssd.ssd_sequential(*(kw[k].bfloat16().double() if k in "xBC" else kw[k].double()
                                for k in ("x", "dt", "A", "B", "C")))[0]
    want = want + kw["D"].double()[:, None] * kw["x"].bfloat16().double()
    assert torch.isfinite(out).all()
    assert ((out.double() - want).norm() / want.norm()).item() < 2e-2


def ssd_nan_steps(b, l, h, p, n, q, name, t0):
    """The steps of sequence 0, head 0 whose output is NaN after a NaN at t0 in ``name``; and
    whether sequence 1 stayed finite."""
    from mambalearn.mamba2 import mamba_chunk_scan_combined

    kw = ssd_case(b, l, h, p, n, seed=1)
    kw[name][(0, t0) + (0,) * (kw[name].ndim - 2)] = float("nan")
    with torch.no_grad():
        out = mamba_chunk_scan_combined(**kw, chunk_size=q)
    nan = out[0, :, 0].isnan().flatten(1).any(1).nonzero().flatten().tolist()
    return nan, bool(torch.isfinite(out[1]).all())


@pytest.mark.parametrize("name", ["dt", "B", "C", "x"])
def test_gpu_ssd_nan_in_one_token(name):
    """dt, B, C: from t0 on. x: back to t0's tile of the diagonal block at most (docstring)."""
    q, t0 = 128, 128 + 77
    nan, other_finite = ssd_nan_steps(2, 1000, 8, 64, 64, q, name, t0)
    assert other_finite, f"a NaN in {name} of sequence 0 reached sequence 1"
    assert nan and (min(nan) == t0 if name != "x" else q <= min(nan) <= t0), (name, min(nan))


# --- Mamba-1 -------------------------------------------------------------------------------------

def m1_minus_inf(b, d, l, n, deterministic=False):
    from mambalearn.mamba1 import selective_scan_fn

    g = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=g)
    A = -(torch.rand(d, n, generator=g) + 0.5)
    A[::5, ::3] = -INF
    kw = {k: v.to(DEV) for k, v in dict(u=r(b, d, l), delta=torch.rand(b, d, l, generator=g) * 0.5
                                         + 0.01, A=A, B=r(b, n, l), C=r(b, n, l), D=r(d),
                                         z=r(b, d, l)).items()}
    run = lambda **k: selective_scan_fn(**k, deterministic=deterministic)  # noqa: E731
    out, grads = grads_of(run, kw)
    close(out, selective_scan_sequential(**{k: v.double() for k, v in kw.items()}),
          msg="Mamba-1, A = −∞: out")
    _, want = grads_of(selective_scan_sequential,
                       {k: v.double() for k, v in dict(kw, A=limit(kw["A"])).items()})
    check_grads(grads, want, "Mamba-1, A = −∞")


@pytest.mark.parametrize("n, deterministic", [(16, False), (16, True), (64, False)])
def test_gpu_mamba1_with_A_minus_inf(n, deterministic):
    m1_minus_inf(2, 64, 1000, n, deterministic)


# --- Mamba-3 -------------------------------------------------------------------------------------

def m3_siso_minus_inf(l, h, n, p, na, q):
    from mambalearn.mamba3 import mamba3_siso_combined
    from tests.test_mamba3 import make

    kw = make(b=2, l=l, h=h, g=1, n=n, p=p, na=na, seed=5)
    kw["ADT"][:, 1] = -INF  # a head
    kw["ADT"][:, 2, [l // 3, q - 1]] = -INF  # a step mid-chunk, a chunk's last step
    kw = {k: v.to(DEV) for k, v in kw.items()}
    run = lambda **k: mamba3_siso_combined(**k, chunk_size=q)  # noqa: E731
    out, grads = grads_of(run, {k: v.float() for k, v in kw.items()})
    assert torch.isfinite(out).all(), "Mamba-3, ADT = −∞: out not finite"
    close(out, mamba3.mamba3_siso_sequential(**kw), msg="Mamba-3, ADT = −∞: out")
    _, want = grads_of(mamba3.mamba3_siso_sequential, dict(kw, ADT=limit(kw["ADT"])))
    check_grads(grads, want, "Mamba-3, ADT = −∞")


def test_gpu_mamba3_siso_with_ADT_minus_inf():
    m3_siso_minus_inf(1000, 4, 64, 64, 16, 64)


def m3_mimo_minus_inf(l, r, h, p, n, q):
    from mambalearn.mamba3 import mamba3_mimo_combined
    from mambalearn.mamba3 import mimo_reference as mimo
    from tests.test_mamba3_mimo import inputs

    x, _ = inputs(seed=4, r=r, l=l, h=h, g=1, p=p, n=n, states=False, dtype=torch.float64)
    x["ADT"][:, 0] = -INF
    x["ADT"][:, 1, l // 2] = -INF
    x = {k: None if v is None else v.to(DEV) for k, v in x.items()}
    run = lambda **k: mamba3_mimo_combined(**k, chunk_size=q)  # noqa: E731
    out, grads = grads_of(run, {k: None if v is None else v.float() for k, v in x.items()})
    assert torch.isfinite(out).all(), "MIMO, ADT = −∞: out not finite"
    close(out, mimo.mamba3_mimo_sequential(**x), msg="MIMO, ADT = −∞: out")
    _, want = grads_of(mimo.mamba3_mimo_sequential, dict(x, ADT=limit(x["ADT"])))
    check_grads(grads, want, "MIMO, ADT = −∞")


def test_gpu_mamba3_mimo_with_ADT_minus_inf():
    m3_mimo_minus_inf(301, 4, 2, 64, 64, 16)


def m3_nan_steps(l, h, n, p, na, q, name, t0):
    from mambalearn.mamba3 import mamba3_siso_combined
    from tests.test_mamba3 import make

    kw = {k: v.float().to(DEV) for k, v in make(b=2, l=l, h=h, g=1, n=n, p=p, na=na,
                                                  seed=6).items()}
    where = {"V": (0, t0, 0, 1), "ADT": (0, 0, t0), "DT": (0, 0, t0)}.get(name, (0, t0, 0, 2))
    kw[name][where] = float("nan")
    with torch.no_grad():
        out = mamba3_siso_combined(**kw, chunk_size=q)
    nan = out[0, :, 0].isnan().flatten(1).any(1).nonzero().flatten().tolist()
    return nan, bool(torch.isfinite(out[1]).all())


@pytest.mark.parametrize("name", ["Q", "K", "DT", "ADT", "V"])
def test_gpu_mamba3_nan_in_one_token(name):
    q, t0 = 64, 64 + 37
    nan, other_finite = m3_nan_steps(500, 4, 64, 64, 16, q, name, t0)
    assert other_finite, f"a NaN in {name} of sequence 0 reached sequence 1"
    assert nan and min(nan) == ((t0 // q) * q if name == "V" else t0), (name, min(nan))
