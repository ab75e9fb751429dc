"""``return_varlen_states``: the state after each packed sequence's last token, against the
sequential scan run on each sequence alone (float64), and its refusals."""

import pytest
import torch

from mambalearn.mamba2 import mamba_chunk_scan_combined
from mambalearn.mamba2.reference import effective_dt, ssd_sequential
from tests.test_ssd_triton import dev


def packed(lengths, h=4, g=2, p=3, n=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    l = sum(lengths)
    r = lambda *s: torch.randn(*s, generator=gen)
    kw = dict(x=r(1, l, h, p), dt=r(1, l, h) - 1, A=-torch.rand(h, generator=gen) - 0.1,
              B=r(1, l, g, n), C=r(1, l, g, n), dt_bias=r(h) * 0.1)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    seq_idx = torch.cat([torch.full((s,), i, dtype=torch.int32) for i, s in enumerate(lengths)])
    return {k: v.to(dev) for k, v in kw.items()}, cu.to(dev), seq_idx[None].to(dev)


def alone(kw, cu, i, h0=None):
    """Sequence i run by itself through the float64 sequential scan: its final state."""
    s, e = int(cu[i]), int(cu[i + 1])
    delta = effective_dt(kw["dt"][:, s:e].double(), kw["dt_bias"].double(), True)
    _, last = ssd_sequential(kw["x"][:, s:e].double(), delta, kw["A"].double(),
                             kw["B"][:, s:e].double(), kw["C"][:, s:e].double(),
                             initial_states=h0)
    return last[0]


@pytest.mark.parametrize("lengths", [[5, 1, 9, 3], [16, 7], [1, 1, 1]])
def test_each_sequence_state_is_the_scan_on_it_alone(lengths):
    kw, cu, seq_idx = packed(lengths, seed=len(lengths))
    out, states = mamba_chunk_scan_combined(**kw, chunk_size=16, seq_idx=seq_idx, cu_seqlens=cu,
                                            dt_softplus=True, return_varlen_states=True)
    assert states.shape == (len(lengths), 4, 3, 5) and states.dtype == torch.float32
    for i in range(len(lengths)):
        torch.testing.assert_close(states[i].double(), alone(kw, cu, i), rtol=1e-4, atol=1e-4)
    # the last sequence's state is the final state the kernels return
    _, final, again = mamba_chunk_scan_combined(**kw, chunk_size=16, seq_idx=seq_idx,
                                                cu_seqlens=cu, dt_softplus=True,
                                                return_final_states=True,
                                                return_varlen_states=True)
    torch.testing.assert_close(again, states)
    torch.testing.assert_close(final[0], states[-1], rtol=1e-4, atol=1e-4)


def test_initial_state_enters_the_first_sequence_and_gradients_flow():
    kw, cu, seq_idx = packed([6, 4], seed=3)
    h0 = torch.randn(1, 4, 3, 5, device=dev)
    leaves = {k: v.clone().requires_grad_() for k, v in kw.items()}
    _, states = mamba_chunk_scan_combined(**leaves, chunk_size=16, seq_idx=seq_idx,
                                          cu_seqlens=cu, initial_states=h0, dt_softplus=True,
                                          return_varlen_states=True)
    torch.testing.assert_close(states[0].double(), alone(kw, cu, 0, h0.double()),
                               rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(states[1].double(), alone(kw, cu, 1), rtol=1e-4, atol=1e-4)
    w = torch.randn_like(states)
    (states * w).sum().backward()
    ref = {k: v.double().requires_grad_() for k, v in kw.items()}
    got = torch.stack([alone(ref, cu, 0, h0.double()), alone(ref, cu, 1)])
    (got * w.double()).sum().backward()
    for k in ("x", "dt", "A", "B", "dt_bias"):
        torch.testing.assert_close(leaves[k].grad.double(), ref[k].grad, rtol=1e-3, atol=1e-4)


def test_without_seq_idx_the_states_are_the_running_scan():
    """No restarts: the state after each offset is the whole row's scan up to there."""
    kw, cu, _ = packed([3, 5, 2], seed=7)
    _, states = mamba_chunk_scan_combined(**kw, chunk_size=16, cu_seqlens=cu, dt_softplus=True,
                                          return_varlen_states=True)
    for i in range(3):
        part = {k: (v[:, :int(cu[i + 1])] if k in ("x", "dt", "B", "C") else v)
                for k, v in kw.items()}
        whole = alone(part, torch.tensor([0, int(cu[i + 1])]), 0)
        torch.testing.assert_close(states[i].double(), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cu, batch, match", [
    (None, 1, "needs cu_seqlens"),
    (torch.tensor([0, 4, 3, 10]), 1, "never decrease"),
    (torch.tensor([0, 4, 9]), 1, "end at the length 10"),
    (torch.tensor([0.0, 10.0]), 1, "integer"),
    (torch.tensor([0, 10]), 2, "batch 1"),
])
def test_bad_cu_seqlens_are_refused_by_name(cu, batch, match):
    kw, _, _ = packed([10], seed=1)
    kw = {k: (v.expand(batch, *v.shape[1:]) if v.ndim > 1 else v) for k, v in kw.items()}
    with pytest.raises(ValueError, match=match):
        mamba_chunk_scan_combined(**kw, chunk_size=16, cu_seqlens=cu, return_varlen_states=True)
