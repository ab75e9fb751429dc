"""The chapter 15 checks pass right answers and reject the wrong versions students write."""

import pytest
import torch

from mambalearn import check
from mambalearn.check import ch15_mamba3


def scan(V, K, Q, ADT, DT, lam, variant=None):
    """The trapezoid loop; ``variant`` names a mistake to make."""
    b, l, h, p = V.shape
    n = K.shape[-1]
    alpha = torch.exp(ADT) if variant != "euler decay" else 1 + ADT
    beta, gamma = (1 - lam) * DT * alpha, lam * DT
    if variant == "beta without alpha":
        beta = (1 - lam) * DT
    if variant == "swapped lambda":
        beta, gamma = lam * DT * alpha, (1 - lam) * DT
    if variant == "exponential euler":
        beta, gamma = torch.zeros_like(DT), DT
    hs = V.new_zeros(b, h, p, n)
    k_prev, v_prev = V.new_zeros(b, h, n), V.new_zeros(b, h, p)
    ys = []
    for t in range(l):
        a, bt, c = (w[..., t, None, None] for w in (alpha, beta, gamma))
        old = hs
        k_old = K[:, t] if variant == "current k in the previous term" else k_prev
        hs = a * hs + bt * v_prev[..., None] * k_old[..., None, :] \
            + c * V[:, t, ..., None] * K[:, t, :, None, :]
        read = old if variant == "reads the old state" else hs
        ys.append(torch.einsum("bhpn,bhn->bhp", read, Q[:, t]))
        k_prev, v_prev = K[:, t], V[:, t]
    return torch.stack(ys, 1)


def rotate(X, theta, variant=None):
    na = theta.shape[-1]
    if variant == "halves":  # NeoX-style: x_j pairs with x_{j+n/2}, not x_{2j+1}
        half = X.shape[-1] // 2
        x0, x1 = X[..., :na], X[..., half:half + na]
        c, s = torch.cos(theta), torch.sin(theta)
        out = X.clone()
        out[..., :na], out[..., half:half + na] = x0 * c - x1 * s, x0 * s + x1 * c
        return out
    if variant == "backwards":
        theta = -theta
    pairs = X.unflatten(-1, (-1, 2))
    x0, x1 = pairs[..., :na, 0], pairs[..., :na, 1]
    c, s = torch.cos(theta), torch.sin(theta)
    if variant == "cos and sin swapped":
        c, s = s, c
    turned = torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], -1)
    return torch.cat([turned, pairs[..., na:, :]], -2).flatten(-2)


def test_module_exports_the_exercises_and_what_they_rebuild():
    assert set(ch15_mamba3.__all__) == {"trapezoid_scan", "rotate_pairs"}
    assert set(ch15_mamba3.REBUILDS) == set(ch15_mamba3.__all__)
    assert "mambalearn.mamba3.reference.rotate_pairs" in ch15_mamba3.REBUILDS["rotate_pairs"]


def test_right_answers_pass(capsys):
    check.trapezoid_scan(scan)
    check.rotate_pairs(rotate)
    out = capsys.readouterr().out
    assert "trapezoid_scan: all" in out and "rotate_pairs: all" in out


def test_stubs_raise_not_implemented():
    def stub(*args):
        raise NotImplementedError
    for name in ("trapezoid_scan", "rotate_pairs"):
        with pytest.raises(NotImplementedError):
            getattr(check, name)(stub)


@pytest.mark.parametrize("variant", ["exponential euler", "beta without alpha", "swapped lambda",
                                     "reads the old state", "current k in the previous term",
                                     "euler decay"])
def test_wrong_trapezoids_are_rejected(variant):
    with pytest.raises(AssertionError):
        check.trapezoid_scan(lambda *a: scan(*a, variant=variant))


@pytest.mark.parametrize("variant", ["halves", "backwards", "cos and sin swapped"])
def test_wrong_rotations_are_rejected(variant):
    with pytest.raises(AssertionError):
        check.rotate_pairs(lambda X, theta: rotate(X, theta, variant=variant))


def test_a_rotation_of_every_pair_is_rejected():
    """Rotating pairs beyond na (θ broadcast to all of them) is wrong when na < n/2."""
    def all_pairs(X, theta):
        full = theta[..., :1].expand(*theta.shape[:-1], X.shape[-1] // 2)
        return rotate(X, full)
    with pytest.raises(AssertionError):
        check.rotate_pairs(all_pairs)
