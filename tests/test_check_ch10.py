"""Chapter 10 checks pass the library's segsum / ssd_chunked and reject the wrong versions."""

import pytest
import torch
import torch.nn.functional as F

from mambalearn import check
from mambalearn.mamba2 import reference as ssd


# --- wrong segsums ---------------------------------------------------------------------------
def segsum_by_difference(x):
    """cumsum_t − cumsum_s: right on paper, loses digits (and gives inf − inf = nan) in floats."""
    T = x.shape[-1]
    cs = torch.cumsum(x, dim=-1)
    S = cs[..., :, None] - cs[..., None, :]  # (..., T, T)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return S.masked_fill(~causal, float("-inf"))


def segsum_by_exp_ratio(x):
    """log(exp(cumsum_t) / exp(cumsum_s)): 0 / 0 once the cumsum underflows."""
    e = torch.exp(torch.cumsum(x, dim=-1))
    T = x.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.log(e[..., :, None] / e[..., None, :]).masked_fill(~causal, float("-inf"))


def segsum_includes_x_s(x):
    """Off by one: Σ_{k=s..t} instead of Σ_{k=s+1..t} (the diagonal is x_t, not 0)."""
    return ssd.segsum(x) + x[..., None, :]


def segsum_zero_above_diagonal(x):
    """0 instead of −∞ above the diagonal: exp gives 1, so the future leaks into the past."""
    return torch.nan_to_num(ssd.segsum(x), neginf=0.0)


# --- wrong chunked SSDs ------------------------------------------------------------------------
def chunked(x, dt, A, B, C, chunk_size, initial_states=None, passing="right", seg=ssd.segsum):
    """ssd_minimal-style chunked SSD (no seq_idx), with a switchable state-passing step."""
    b, l, h, p = x.shape
    q, c = chunk_size, -(-l // chunk_size)
    pad = lambda X: F.pad(X, (0, 0) * (X.ndim - 2) + (0, c * q - l))
    rep = lambda X: X.repeat_interleave(h // X.shape[2], dim=2)
    x, B, C = (pad(X).reshape(b, c, q, h, -1) for X in (x, rep(B), rep(C)))
    dt = pad(dt).reshape(b, c, q, h)
    dA = (dt * A).permute(0, 3, 1, 2)  # (b, h, c, q)
    cs = torch.cumsum(dA, -1)
    L = torch.exp(seg(dA))  # (b, h, c, q, q)
    y = torch.einsum("bcthn,bcshn,bhcts,bcsh,bcshp->bcthp", C, B, L, dt, x)
    S = torch.einsum("bcshn,bhcs,bcsh,bcshp->bchpn", B, torch.exp(cs[..., -1:] - cs), dt, x)
    H = x.new_zeros(b, h, p, B.shape[-1]) if initial_states is None else initial_states
    Hin = []
    for k in range(c):
        a = torch.exp(cs[:, :, k, -1])[..., None, None]  # (b, h, 1, 1)
        if passing == "right":
            Hin.append(H)
            H = a * H + S[:, k]
        elif passing == "after update":  # the state *leaving* chunk k is used to enter chunk k
            H = a * H + S[:, k]
            Hin.append(H)
        elif passing == "next chunk's decay":  # H_{k+1} decayed by chunk k+1's factor
            Hin.append(H)
            a = torch.exp(cs[:, :, min(k + 1, c - 1), -1])[..., None, None]
            H = a * H + S[:, k]
        elif passing == "reversed":  # chunks handed their states from last to first
            Hin.insert(0, H)
            H = torch.exp(cs[:, :, c - 1 - k, -1])[..., None, None] * H + S[:, c - 1 - k]
    Hin = torch.stack(Hin, 1)  # (b, c, h, p, n)
    y = y + torch.einsum("bcthn,bhct,bchpn->bcthp", C, torch.exp(cs), Hin)
    return y.reshape(b, c * q, h, p)[:, :l], H


def test_reference_chunked_is_right():
    """The switchable implementation is right with passing="right" (mutants differ only there)."""
    check.ssd_chunked(chunked)


def test_library_passes(capsys):
    check.segsum(ssd.segsum)
    check.ssd_chunked(lambda *a, **k: ssd.ssd_chunked(*a, **k))
    out = capsys.readouterr().out
    assert "✓ segsum" in out and "✓ ssd_chunked" in out


@pytest.mark.parametrize("wrong", [segsum_by_difference, segsum_by_exp_ratio, segsum_includes_x_s,
                                   segsum_zero_above_diagonal])
def test_segsum_rejects(wrong):
    with pytest.raises(AssertionError, match="segsum"):
        check.segsum(wrong)


def test_unstable_segsum_passes_small_inputs_but_not_the_check():
    """The difference form is right on ordinary inputs: only the stability cases catch it."""
    x = -torch.rand(3, 9, dtype=torch.float64)
    torch.testing.assert_close(segsum_by_difference(x), ssd.segsum(x))
    with pytest.raises(AssertionError, match="huge|overflow"):
        check.segsum(segsum_by_difference)


@pytest.mark.parametrize("passing", ["after update", "next chunk's decay", "reversed"])
def test_ssd_chunked_rejects_wrong_state_passing(passing):
    wrong = lambda *a, **k: chunked(*a, **k, passing=passing)
    with pytest.raises(AssertionError, match="ssd_chunked"):
        check.ssd_chunked(wrong)


def test_ssd_chunked_rejects_exp_ratio_segsum():
    wrong = lambda *a, **k: chunked(*a, **k, seg=segsum_by_exp_ratio)
    with pytest.raises(AssertionError, match="large negative"):
        check.ssd_chunked(wrong)


def test_ssd_chunked_rejects_missing_final_state():
    with pytest.raises(AssertionError, match="final_state"):
        check.ssd_chunked(lambda *a, **k: ssd.ssd_chunked(*a, **k)[0])


def test_stubs_raise_not_implemented():
    def stub(*a, **k):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check.segsum(stub)
    with pytest.raises(NotImplementedError):
        check.ssd_chunked(stub)
