"""Chapter 15 in PyTorch: the trapezoid, the rotating state, the chunked form, the decode step."""

import math

import pytest
import torch

from mambalearn import discretize, mamba3
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba3 import step_reference as S
from mambalearn.testing import assert_close

NAMES = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles", "D", "Z")


def make(b=2, l=9, h=4, g=2, n=8, p=3, na=3, dtype=torch.float64, seed=None, states=False):
    """Random inputs in mamba_ssm's layouts (fresh unless ``seed``); Δ > 0, ADT < 0."""
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)
    DT = torch.rand(b, h, l, generator=gen, dtype=dtype) * 0.8 + 0.02
    kw = dict(Q=r(b, l, g, n), K=r(b, l, g, n), V=r(b, l, h, p),
              ADT=-torch.rand(b, h, l, generator=gen, dtype=dtype) * 2 * DT, DT=DT,
              Trap=r(b, h, l), Q_bias=r(h, n), K_bias=r(h, n), Angles=r(b, l, h, na), D=r(h),
              Z=r(b, l, h, p))
    if states:
        kw["Input_States"] = (torch.rand(b, h, na, generator=gen, dtype=dtype) * 6,
                              r(b, h, p, n), r(b, h, n), r(b, h, p))
    return kw


def cut(kw, lo, hi):
    """The steps lo..hi−1 of the inputs ``kw`` (time is dim 1 or the last dim)."""
    out = {}
    for k, v in kw.items():
        if k in ("Q", "K", "V", "Angles", "Z"):
            out[k] = v[:, lo:hi]
        elif k in ("ADT", "DT", "Trap"):
            out[k] = v[..., lo:hi]
        else:
            out[k] = v
    return out


# --- the exponential-trapezoidal rule (chapter 01's module) ---------------------------------


def test_exp_trapezoidal_with_lambda_one_is_exponential_euler():
    A, B = -torch.rand(5, dtype=torch.float64) * 3, torch.randn(5, dtype=torch.float64)
    delta = torch.rand(7, dtype=torch.float64) + 0.01
    for got, want in zip(discretize.exp_trapezoidal(A, B, delta, lam=1.0),
                         discretize.zoh_simplified(A, B, delta), strict=True):
        assert_close(got, want)


def test_exp_trapezoidal_is_second_order_and_full_A_matches_diagonal():
    A, B = -torch.linspace(0.5, 3, 6, dtype=torch.float64), torch.ones(6, dtype=torch.float64)
    err = lambda m, d: sum((x - y).abs().max() for x, y in zip(m(A, B, d), discretize.zoh(A, B, d),
                                                                strict=True))
    for m, order in ((discretize.exp_trapezoidal, 3), (discretize.zoh_simplified, 2)):
        ratio = err(m, torch.tensor(0.02, dtype=torch.float64)) / err(m, torch.tensor(
            0.01, dtype=torch.float64))
        assert abs(math.log2(ratio) - order) < 0.1, (m.__name__, ratio)
    lam = torch.rand(4, dtype=torch.float64)
    delta = torch.rand(4, dtype=torch.float64) + 0.1
    diag = discretize.exp_trapezoidal(A, B, delta, lam, taps=True)
    full = discretize.exp_trapezoidal(torch.diag(A), B, delta, lam, taps=True)
    assert_close(torch.diagonal(full[0], dim1=-2, dim2=-1), diag[0])
    for x, y in zip(full[1:], diag[1:], strict=True):
        assert_close(x, y)
    with pytest.raises(ValueError, match="lam"):
        discretize.exp_trapezoidal(A, B, 0.1, lam=1.5)


# --- the oracle, the complex state, the chunked form ----------------------------------------


def test_complex_state_equals_rotated_B_and_C():
    for size in (dict(), dict(n=10, na=5, g=4, l=13), dict(b=1, l=1, h=1, g=1, n=2, p=1, na=1)):
        kw = make(**size)
        kw.pop("Z")
        assert_close(mamba3.mamba3_complex_sequential(**kw), mamba3.mamba3_siso_sequential(**kw))


def test_no_rotation_and_lambda_one_is_mamba2():
    """λ = 1, θ = 0, no biases: Mamba-3 SISO is chapter 10's SSD recurrence (A·Δ = ADT)."""
    kw = make(l=11, g=2, h=4, na=2)
    A = -torch.rand(4, dtype=torch.float64) - 0.1
    kw["ADT"] = A[None, :, None] * kw["DT"]
    kw.update(Trap=torch.full_like(kw["Trap"], 50.0), Angles=torch.zeros_like(kw["Angles"]),
              Q_bias=torch.zeros_like(kw["Q_bias"]), K_bias=torch.zeros_like(kw["K_bias"]),
              D=None, Z=None)
    y, _ = ssd.ssd_sequential(kw["V"], kw["DT"].transpose(1, 2), A, kw["K"], kw["Q"])
    assert_close(mamba3.mamba3_siso_sequential(**kw), y)


@pytest.mark.parametrize("chunk", [1, 4, 5, 16])
def test_chunked_equals_sequential(chunk):
    kw = make(l=13, states=chunk == 4)
    want = mamba3.mamba3_siso_sequential(**kw, return_final_states=True)
    got = mamba3.mamba3_siso_chunked(**kw, chunk_size=chunk, return_final_states=True)
    for x, y in zip(got, want, strict=True):
        assert_close(x, y)


def test_two_calls_with_states_equal_one_call():
    kw = make(l=12)
    full = mamba3.mamba3_siso_sequential(**kw, return_final_states=True)
    first = mamba3.mamba3_siso_chunked(**cut(kw, 0, 5), chunk_size=4, return_final_states=True)
    second = mamba3.mamba3_siso_sequential(**cut(kw, 5, 12), Input_States=first[1:],
                                           return_final_states=True)
    assert_close(torch.cat([first[0], second[0]], dim=1), full[0])
    for x, y in zip(second[1:], full[1:], strict=True):
        assert_close(x, y)


def test_chunk_state_is_the_pre_state():
    """The state passed between chunks is h_t + (1 − λ_{t+1})Δ_{t+1} v_t k_tᵀ (see chunked)."""
    kw = make(l=8)
    _, _, h4, k4, v4 = mamba3.mamba3_siso_sequential(**cut(kw, 0, 4), return_final_states=True)
    lam = torch.sigmoid(kw["Trap"][..., 4])
    pre = h4 + ((1 - lam) * kw["DT"][..., 4])[..., None, None] * v4[..., None] * k4[..., None, :]
    # chunk 2 of a q = 4 run reads only its entering state and its own steps
    y = mamba3.mamba3_siso_chunked(**kw, chunk_size=4)
    theta4 = mamba3.angle_cumsum(kw["Angles"], kw["DT"])[:, 3]
    zero = torch.zeros_like(kw["V"][:, 0])
    alone = mamba3.mamba3_siso_sequential(**cut(kw, 4, 8), Input_States=(
        theta4, pre, torch.zeros_like(k4), zero))  # the half is already in `pre`
    assert_close(y[:, 4:], alone)


def test_autograd_of_chunked_matches_sequential():
    kw = make(b=1, l=7, h=2, g=1, n=4, p=2, na=2, states=True)
    grads = {}
    for name, fn in (("seq", mamba3.mamba3_siso_sequential), ("chunk", mamba3.mamba3_siso_chunked)):
        x = {k: v.clone().requires_grad_() for k, v in kw.items() if k != "Input_States"}
        st = tuple(s.clone().requires_grad_() for s in kw["Input_States"])
        extra = {"chunk_size": 3} if name == "chunk" else {}
        outs = fn(**x, Input_States=st, return_final_states=True, **extra)
        sum((o * torch.cos(torch.arange(o.numel(), dtype=o.dtype)).view_as(o)).sum()
            for o in outs).backward()
        grads[name] = [x[k].grad for k in NAMES] + [s.grad for s in st]
    for a, b in zip(grads["chunk"], grads["seq"], strict=True):
        assert_close(a, b)


def test_bad_inputs_name_the_argument():
    kw = make()
    with pytest.raises(ValueError, match="Angles"):
        mamba3.mamba3_siso_sequential(**{**kw, "Angles": torch.zeros(2, 9, 4, 5,
                                                                      dtype=torch.float64)})
    with pytest.raises(ValueError, match="heads"):
        mamba3.mamba3_siso_sequential(**{**kw, "Q": kw["Q"][:, :, :1].expand(-1, -1, 3, -1),
                                         "K": kw["K"][:, :, :1].expand(-1, -1, 3, -1)})
    with pytest.raises(ValueError, match="Trap"):
        mamba3.mamba3_siso_chunked(**{**kw, "Trap": kw["Trap"][..., :-1]})
    with pytest.raises(ValueError, match="even"):
        mamba3.mamba3_siso_sequential(**{**kw, "Q": kw["Q"][..., :7], "K": kw["K"][..., :7],
                                         "Q_bias": kw["Q_bias"][:, :7],
                                         "K_bias": kw["K_bias"][:, :7]})
    with pytest.raises(TypeError, match="V"):
        mamba3.mamba3_siso_sequential(**{**kw, "V": kw["V"].long()})


# --- the decode step --------------------------------------------------------------------------


def test_l_decode_steps_equal_the_scan():
    kw = make(l=6)
    want = mamba3.mamba3_siso_sequential(**kw, return_final_states=True)
    b, _, h, p = kw["V"].shape
    n, na = kw["Q"].shape[-1], kw["Angles"].shape[-1]
    z = lambda *s: torch.zeros(*s, dtype=torch.float64)
    states = [z(b, h, na), z(b, h, p, n), z(b, h, n), z(b, h, p)]
    ys = []
    for t in range(6):
        x = cut(kw, t, t + 1)
        one = {k: (v[:, 0] if k in ("Q", "K", "V", "Angles", "Z") else
                   v[..., 0] if k in ("ADT", "DT", "Trap") else v) for k, v in x.items()}
        y, states = S.mamba3_siso_step_ref(**one, Input_States=states)
        ys.append(y)
    assert_close(torch.stack(ys, 1), want[0])
    for x, y in zip(states, want[1:], strict=True):
        assert_close(x, y)


def test_mimo_rank_one_with_unit_projections_is_siso():
    b, h, p, n = 2, 3, 4, 6
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    state, Bs, Xs, B, C, x = r(b, h, p, n), r(b, 1, h, n), r(b, h, p), r(b, 1, h, n), \
        r(b, 1, h, n), r(b, h, p)
    u = lambda: torch.rand(b, h, generator=g, dtype=torch.float64)
    A, dt, trap, D = -u(), u(), u(), r(h)
    ones = torch.ones(1, h, p, dtype=torch.float64)
    s1 = state.clone()
    y = S.mamba3_mimo_step_ref(s1, Bs, Xs, A, B, C, D, x, dt, trap, ones, ones)
    alpha = torch.exp(A * dt)
    want_state = alpha[..., None, None] * state \
        + ((1 - trap) * dt * alpha)[..., None, None] * Xs[..., None] * Bs[:, 0, :, None] \
        + (trap * dt)[..., None, None] * x[..., None] * B[:, 0, :, None]
    assert_close(s1, want_state)
    assert_close(y, torch.einsum("bhpn,bhn->bhp", want_state, C[:, 0]) + D[:, None] * x)


def test_decode_cost_intensity_grows_with_rank():
    siso, mimo = S.decode_cost(64, 80, 64, 128), S.decode_cost(64, 80, 64, 128, rank=4)
    assert mimo.bytes < 1.05 * siso.bytes  # the same state, a little more input
    assert mimo.intensity > 3 * siso.intensity


def test_parity_needs_the_rotation():
    """One Mamba-3 layer learns running parity with rotations, and cannot without (seed 0)."""
    from mambalearn.mamba3 import tasks

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads only fight over two cores
    test = tasks.parity_batch(256, 16, torch.Generator().manual_seed(99))
    acc = {}
    try:
        for rotate in (True, False):
            m = tasks.parity_model(rotate, seed=0)
            tasks.train_parity(m, steps=200, seed=0)
            acc[rotate] = tasks.accuracy(m, *test)
    finally:
        torch.set_num_threads(threads)
    assert acc[True] > 0.95 and acc[False] < 0.75, acc
