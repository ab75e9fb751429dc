"""Chapter 02 check passes the oracle and rejects plausible wrong selective scans."""

import pytest
import torch
import torch.nn.functional as F

from mambalearn import check
from mambalearn.scan.selective import selective_scan_parallel
from mambalearn.scan.sequential import selective_scan_sequential as oracle


def test_oracle_and_parallel_pass(capsys):
    check.selective_scan_sequential(oracle)
    check.selective_scan_sequential(selective_scan_parallel)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("✓") for line in out)


def ignores_delta_bias(u, delta, A, B, C, D=None, z=None, delta_bias=None, **kw):
    return oracle(u, delta, A, B, C, D, z, None, **kw)


def ignores_softplus(*args, delta_softplus=False, **kw):
    return oracle(*args, **kw)


def bias_after_softplus(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                        **kw):
    if delta_softplus:
        delta = F.softplus(delta)
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    return oracle(u, delta, A, B, C, D, z, **kw)


def _regroup(X, d):  # channel i reads group i % g (interleaved) instead of i // (d // g)
    if X.ndim != 4:
        return X
    return X[:, torch.arange(d) % X.shape[1]]


def wrong_group(u, delta, A, B, C, *args, **kw):
    d = u.shape[1]
    return oracle(u, delta, A, _regroup(B, d), _regroup(C, d), *args, **kw)


def mask_resets_state(u, delta, A, B, C, *args, mask=None, **kw):
    """Zero the masked *inputs* only: the state still decays through padding."""
    if mask is not None:
        u = u * mask[:, None]
    return oracle(u, delta, A, B, C, *args, **kw)


def output_in_float32(*args, **kw):
    res = oracle(*args, **kw)
    return (res[0].float(), res[1]) if isinstance(res, tuple) else res.float()


@pytest.mark.parametrize("wrong", [ignores_delta_bias, ignores_softplus, bias_after_softplus,
                                   wrong_group, mask_resets_state, output_in_float32])
def test_rejects(wrong):
    with pytest.raises(AssertionError):
        check.selective_scan_sequential(wrong)


def test_not_implemented_passes_through():
    def stub(*args, **kwargs):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.selective_scan_sequential(stub)


def test_rejects_float32_compute_when_A_is_float64():
    """"float64 if any of u, delta, A, B, C is float64": a loop that follows u's dtype alone."""
    def follows_u(u, delta, A, B, C, *args, **kwargs):
        cast = lambda t: t.to(u.dtype) if torch.is_tensor(t) and t.is_floating_point() else t
        return oracle(cast(u), cast(delta), cast(A), cast(B), cast(C), *map(cast, args),
                      **{k: cast(v) for k, v in kwargs.items()})

    with pytest.raises(AssertionError, match="compute dtype, float64"):
        check.selective_scan_sequential(follows_u)
