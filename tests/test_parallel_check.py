"""The chapter 14 checks pass the library's functions and reject the wrong versions."""

import pytest
import torch

from mambalearn import check, ops
from mambalearn.check import _groups, ch14_parallel
from mambalearn.parallel import summary


def test_library_functions_pass(capsys):
    check.rank_scan(summary.rank_scan)
    check.fix_up(summary.fix_up)
    out = capsys.readouterr().out
    assert "✓ rank_scan" in out and "✓ fix_up" in out


def test_rebuilds_names_real_functions():
    import importlib

    assert set(ch14_parallel.REBUILDS) == set(ch14_parallel.__all__)
    for targets in _groups.rebuilds(ch14_parallel.REBUILDS).values():
        for target in targets:
            module, name = target.rsplit(".", 1)
            assert callable(getattr(importlib.import_module(module), name)), target


# --- wrong rank_scan -----------------------------------------------------------------------


def _scan(P, h, initial_state, step, inclusive=False, skip_h0=False, drop_last=False):
    acc = ops.identity(P[0], h[0])
    h0 = torch.zeros_like(h[0]) if initial_state is None or skip_h0 else initial_state
    H = []
    for r in range(h.shape[0]):
        if not inclusive:
            H.append(ops.apply(acc, h0))
        acc = step(acc, (P[r], h[r]))
        if inclusive:
            H.append(ops.apply(acc, h0))
    final = ops.apply(acc, h0) if not drop_last else H[-1]
    return torch.stack(H), final


def inclusive(P, h, initial_state=None):
    return _scan(P, h, initial_state, ops.combine, inclusive=True)


def swapped(P, h, initial_state=None):  # later ⊗ earlier: wrong for matrices
    return _scan(P, h, initial_state, lambda acc, s: ops.combine(s, acc))


def ignores_initial_state(P, h, initial_state=None):
    return _scan(P, h, initial_state, ops.combine, skip_h0=True)


def final_is_last_entering(P, h, initial_state=None):
    return _scan(P, h, initial_state, ops.combine, drop_last=True)


def elementwise_only(P, h, initial_state=None):  # P * H: right for diagonal P only
    H = torch.zeros_like(h[0]) if initial_state is None else initial_state
    out = []
    for r in range(h.shape[0]):
        out.append(H)
        H = P[r] * H + h[r] if P.ndim == h.ndim else P[r] * H[..., None, :] + h[r]
    return torch.stack(out), H if H.shape == h[0].shape else H.sum(-1)


@pytest.mark.parametrize("wrong", [inclusive, swapped, ignores_initial_state,
                                   final_is_last_entering, elementwise_only])
def test_rank_scan_rejects(wrong):
    with pytest.raises(AssertionError):
        check.rank_scan(wrong)


def test_rank_scan_not_implemented_passes_through():
    def stub(P, h, initial_state=None):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        check.rank_scan(stub)


# --- wrong fix_up --------------------------------------------------------------------------


def _fix(y, last, delta, A, C, H, cum=torch.cumsum, shift=False, keep_last=False,
         repeat=torch.repeat_interleave):
    b, d, l = delta.shape
    c = cum(delta, dim=-1)
    if shift:  # exclusive: the decay of the steps before t only
        c = c - delta
    decay = torch.exp(c[..., None] * A[:, None, :])  # (b, d, l, n)
    Cd = C[:, None] if C.ndim == 3 else repeat(C, d // C.shape[1], dim=1)  # (b, d|1, n, l)
    extra = (decay * H[:, :, None, :] * Cd.transpose(-1, -2)).sum(-1)
    new_last = last if keep_last else last + decay[:, :, -1] * H
    return y + extra, new_last


def decay_not_cumulative(y, last, delta, A, C, H):
    return _fix(y, last, delta, A, C, H, cum=lambda x, dim: x)


def decay_one_step_short(y, last, delta, A, C, H):
    return _fix(y, last, delta, A, C, H, shift=True)


def last_not_updated(y, last, delta, A, C, H):
    return _fix(y, last, delta, A, C, H, keep_last=True)


def groups_tiled_not_repeated(y, last, delta, A, C, H):
    return _fix(y, last, delta, A, C, H, repeat=lambda X, k, dim: X.repeat(1, k, 1, 1))


def test_the_correct_fix_up_helper_passes():
    check.fix_up(lambda *a: _fix(*a))


@pytest.mark.parametrize("wrong", [decay_not_cumulative, decay_one_step_short, last_not_updated,
                                   groups_tiled_not_repeated])
def test_fix_up_rejects(wrong):
    with pytest.raises(AssertionError):
        check.fix_up(wrong)
