"""The SSD backward's two walks over chunks cut in segments (``config.Backward.passing_split``,
``config.Backward.states.split``): the cut against the one walk and against float64 oracles.

The cut is exact up to float32 summation order, so a small forced cut (3 segments over 7 chunks:
3 + 3 + 1, the last chunk short) must give the one walk's numbers to float32 rounding, and both
the oracle's to the kernels' tolerance — with and without seq_idx (a boundary inside a chunk and
one on a chunk edge, so that a segment starts mid-sequence and the carries must be cut),
initial_states and dfinal. In Triton's interpreter at tiny float32 sizes.
"""

from functools import partial

import pytest
import torch

from mambalearn import testing
from mambalearn.mamba2 import api as combined
from mambalearn.mamba2 import backward as SB
from mambalearn.mamba2 import chunk as T
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba2 import reference_grad
from mambalearn.mamba2.config import GPU, default_config, defaults, gpu_config, split_walk
from mambalearn.mamba2.fused import states
from mambalearn.testing import rel_error

assert_close = partial(testing.assert_close, dtype="dot")
dev = "cuda" if torch.cuda.is_available() else "cpu"
Q, CHUNKS, SPLIT = 16, 7, 3  # 7 chunks cut in 3 segments: 3 + 3 + 1
L = Q * CHUNKS - 5  # the last chunk 11 steps long


def _seq(b, l):
    """Packed sequences: a boundary inside chunk 1, one on the edge of chunks 3 and 4 (the first
    chunk of the second segment), and one more in batch row 1 inside chunk 5."""
    seq = torch.zeros(b, l, dtype=torch.int32, device=dev)
    seq[:, 21:], seq[:, 48:] = 1, 2
    seq[-1, 90:] = 3
    return seq


def _cut(split):
    """The default config with both backward walks cut in ``split`` segments."""
    return defaults(dev).backward.replace(passing_split=split, states=dict(split=split))


# ---------------------------------------------------------------------------------------------
# step 3 alone: the reverse state passing against float64 autograd of its loss
@pytest.mark.parametrize("seq", [False, True])
@pytest.mark.parametrize("extras", [False, True])
def test_state_passing_backward_cut(seq, extras):
    """dS, dlast and dinitial_states of L = Σ_c ⟨H_c, dH_c⟩ + ⟨final, dfinal⟩ with H_{c+1} =
    α_c H_c + S_c (α_c = 0 where chunk c ends in a new sequence), cut and not."""
    b, h, p, n = 2, 3, 4, 16
    S = torch.randn(b, CHUNKS, h, p, n, device=dev)
    a_last = -torch.rand(b, h, CHUNKS, device=dev) * 2  # dA_cs's last entry of each chunk
    dA_cs = torch.zeros(b, h, CHUNKS, Q, device=dev)
    dA_cs[..., -1] = a_last
    seq_idx = _seq(b, L) if seq else None
    h0 = torch.randn(b, h, p, n, device=dev) if extras else None
    dfinal = torch.randn(b, h, p, n, device=dev) if extras else None
    dH = torch.randn(b, CHUNKS, h, p, n, device=dev)
    # float64 oracle
    S64, a64 = S.double().requires_grad_(), a_last.double().requires_grad_()
    h064 = h0.double().requires_grad_() if extras else None
    Hc = h064 if extras else torch.zeros(b, h, p, n, dtype=torch.float64, device=dev)
    H, loss = [], 0
    for c in range(CHUNKS):
        H.append(Hc)
        loss = loss + (Hc * dH[:, c].double()).sum()
        alpha = torch.exp(a64[:, :, c])
        if seq:  # chunk c's end against the previous chunk's end (chunk 0: sequence 0)
            end = seq_idx[:, min((c + 1) * Q, L) - 1]
            before = seq_idx[:, c * Q - 1] if c else torch.zeros_like(end)
            alpha = alpha * (end == before).double()[:, None]
        Hc = alpha[..., None, None] * Hc + S64[:, c]
    if extras:
        loss = loss + (Hc * dfinal.double()).sum()
    loss.backward()
    Hs = torch.stack(H, 1).float().detach()
    got = {}
    for split in (1, SPLIT):
        dS = dH.clone()
        dlast, dinit = SB.state_passing_backward(dS, Hs, None, dA_cs, dfinal, seq_idx, L,
                                                 has_init=extras, cfg=_cut(split))
        got[split] = (dS, dlast, dinit)
        assert_close(dS, S64.grad, grad=True)
        assert_close(dlast, a64.grad, grad=True)
        if extras:
            assert_close(dinit, h064.grad, grad=True)
        else:
            assert dinit is None
    for one, cut in zip(got[1], got[SPLIT], strict=True):  # float32 summation order apart
        if one is not None:
            torch.testing.assert_close(cut, one, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# step 0: the recompute's walk (pointer loads) cut, against chapter 10's two stages
@pytest.mark.parametrize("seq", [False, True])
def test_recompute_states_cut(seq):
    b, h, p, g, n = 2, 4, 8, 2, 16
    x = torch.randn(b, L, h, p, device=dev)
    B = torch.randn(b, L, g, n, device=dev)
    dt, A = torch.randn(b, L, h, device=dev) - 1, -torch.rand(h, device=dev) - 0.5
    h0 = torch.randn(b, h, p, n, device=dev)
    seq_idx = _seq(b, L) if seq else None
    st = defaults(dev).stages  # chapter 10's launch settings on this device
    dt_c, dA_cs = T.chunk_cumsum(dt, A, Q, None, dt_softplus=True, heads=st.cumsum_heads)
    S = T.chunk_state(x, B, dt_c, dA_cs, seq_idx, st)
    H_want, final_want = T.state_passing(S, dA_cs, h0, seq_idx, L, out_dtype=x.dtype, cfg=st)
    base = defaults(dev).backward.states
    assert not base.tma  # the backward's recompute: the pointer-load kernel
    got = {}
    for split in (1, SPLIT, CHUNKS + 2):  # + more segments asked than chunks: one a chunk
        got[split] = states.chunk_states(x, B, dt_c, dA_cs, h0, seq_idx,
                                         config=base.replace(split=split))
        assert_close(got[split][0], H_want)
        assert_close(got[split][1], final_want)
    for split in (SPLIT, CHUNKS + 2):
        for one, cut in zip(got[1], got[split], strict=True):
            torch.testing.assert_close(cut, one, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# the whole backward, both walks cut
def _grads(x, dt, A, B, C, cfg, dout, dfinal=None, q=Q, **kw):
    """Gradients of ⟨out, dout⟩ (+ ⟨final, dfinal⟩) through ``mamba_chunk_scan_combined``'s
    Triton backward with ``cfg``, at chunk ``q``."""
    names = ["x", "dt", "A", "B", "C"] + [k for k, v in kw.items()
                                          if torch.is_tensor(v) and v.is_floating_point()]
    leaves = {k: v.detach().clone().requires_grad_() for k, v in
              zip(names, [x, dt, A, B, C] + [kw[k] for k in names[5:]], strict=True)}
    out, final = combined.mamba_chunk_scan_combined(
        *(leaves[k] for k in names[:5]), q, return_final_states=True, config=cfg,
        **{**kw, **{k: leaves[k] for k in names[5:]}})
    outs, gouts = [out], [dout]
    if dfinal is not None:
        outs.append(final), gouts.append(dfinal)
    torch.autograd.backward(outs, gouts)
    return {k: v.grad for k, v in leaves.items()}


def _configs(shape, split, tma=False):
    """Both walks cut in ``split``; ``tma``: the recompute by the forward's descriptor kernel
    (what the GPU's rules choose where they cut)."""
    base = default_config((*shape, Q), dev)
    return base.replace(backward=dict(passing_split=split, states=dict(split=split, tma=tma)))


def test_cut_backward_against_reference_grad():
    """No seq_idx: dt is Δ itself (no softplus, bias, D, z), so the hand-derived float64
    backward of ``reference_grad`` is the oracle; with initial_states and dfinal."""
    b, h, p, g, n = 1, 2, 8, 1, 16
    x = torch.randn(b, L, h, p, device=dev)
    dt, A = torch.rand(b, L, h, device=dev) / 3, -torch.rand(h, device=dev) * 2 - 0.2
    B, C = torch.randn(b, L, g, n, device=dev), torch.randn(b, L, g, n, device=dev)
    h0, dfinal = torch.randn(b, h, p, n, device=dev), torch.randn(b, h, p, n, device=dev)
    dout = torch.randn(b, L, h, p, device=dev)
    want = reference_grad.backward(dout.double(), x.double(), dt.double(), A.double(), B.double(),
                                   C.double(), Q, h0.double(), dfinal.double())
    want = dict(zip(["x", "dt", "A", "B", "C", "initial_states"], want, strict=True))
    cases = {1: (1, False), SPLIT: (SPLIT, False), "tma": (SPLIT, True)}
    got = {name: _grads(x, dt, A, B, C, _configs((b, L, h, p, g, n), *case), dout, dfinal,
                        initial_states=h0) for name, case in cases.items()}
    for k in want:
        for name in cases:
            assert_close(got[name][k], want[k], grad=True, msg=f"{k} split {name}")
        for name in (SPLIT, "tma"):
            torch.testing.assert_close(got[name][k], got[1][k], rtol=1e-4, atol=1e-4)


def test_cut_backward_seq_idx_against_float64_autograd():
    """seq_idx, softplus, dt_bias, D, z, initial_states, dfinal: float64 autograd through the
    chunked PyTorch oracle (``reference.mamba_chunk_scan_ref``) is the oracle."""
    b, h, p, g, n = 1, 2, 8, 2, 16
    x = torch.randn(b, L, h, p, device=dev)
    dt, A = torch.randn(b, L, h, device=dev) - 1, -torch.rand(h, device=dev) * 2 - 0.2
    B, C = torch.randn(b, L, g, n, device=dev), torch.randn(b, L, g, n, device=dev)
    kw = dict(D=torch.randn(h, device=dev), z=torch.randn(b, L, h, p, device=dev),
              dt_bias=torch.randn(h, device=dev),
              initial_states=torch.randn(b, h, p, n, device=dev),
              seq_idx=_seq(b, L), dt_softplus=True)
    dfinal = torch.randn(b, h, p, n, device=dev)
    dout = torch.randn(b, L, h, p, device=dev)
    names = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"]
    leaves = {k: v.detach().double().requires_grad_() for k, v in
              zip(names, [x, dt, A, B, C] + [kw[k] for k in names[5:]], strict=True)}
    out, final = ssd.mamba_chunk_scan_ref(
        *(leaves[k] for k in names[:5]), Q, leaves["D"], leaves["z"], leaves["dt_bias"],
        leaves["initial_states"], kw["seq_idx"], True, return_final_states=True)
    torch.autograd.backward([out, final], [dout.double(), dfinal.double()])
    got = {split: _grads(x, dt, A, B, C, _configs((b, L, h, p, g, n), split), dout, dfinal, **kw)
           for split in (1, SPLIT)}
    for k in names:
        for split in (1, SPLIT):
            assert_close(got[split][k], leaves[k].grad, grad=True, msg=f"{k} split {split}")
        torch.testing.assert_close(got[SPLIT][k], got[1][k], rtol=1e-4, atol=1e-4)


def test_shape_rules():
    """At b1 h80 l16384 the recompute walk runs the forward's states kernel cut as the forward's,
    and the reverse state passing is not cut (2 560 one-warp programs already hold enough bytes
    in flight); at b1 h8 both are cut; at b4 l4096 neither (the pointer-load recompute as
    before); a config refuses a cut below 1."""
    shape = (1, 16384, 80, 64, 1, 128, 256)
    cfg = gpu_config(shape, 132)
    assert cfg.states.split == split_walk(160, 64, 132) == 4
    assert cfg.backward.states == cfg.states  # the descriptor kernel, its cut
    assert cfg.backward.passing_split == 1
    small = gpu_config((1, 16384, 8, 64, 1, 128, 256), 132)
    assert small.backward.passing_split > 1 and small.backward.states.split > 1
    b4 = gpu_config((4, 4096, 80, 64, 1, 128, 256), 132)
    assert b4.backward.passing_split == b4.backward.states.split == 1
    assert b4.backward.states == GPU.backward.states and not b4.backward.states.tma
    with pytest.raises(ValueError, match="backward.passing_split"):
        cfg.replace(backward=dict(passing_split=0))
    with pytest.raises(ValueError, match="backward.states.split"):
        cfg.replace(backward=dict(states=dict(split=0)))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("seq", [False, True])
def test_gpu_cut_walks_at_real_sizes(seq):
    """Real head sizes (p 64, n 128, chunk 256, bf16, 12 chunks, the last short), slow decay so
    that states carry over many chunks: both walks cut in 3 (the recompute by either states
    kernel) give the one walk's gradients up to bf16 roundings of the recomputed states."""
    b, l, h, p, g, n, q = 1, 12 * 256 - 37, 8, 64, 1, 128, 256
    x = torch.randn(b, l, h, p, device=dev, dtype=torch.bfloat16)
    dt, A = torch.randn(b, l, h, device=dev) - 2, -torch.rand(h, device=dev) * 0.02 - 0.002
    B, C = (torch.randn(b, l, g, n, device=dev, dtype=torch.bfloat16) for _ in range(2))
    kw = dict(D=torch.randn(h, device=dev), dt_bias=torch.rand(h, device=dev) - 2,
              initial_states=torch.randn(b, h, p, n, device=dev), dt_softplus=True)
    if seq:
        kw["seq_idx"] = torch.zeros(b, l, dtype=torch.int32, device=dev)
        kw["seq_idx"][:, 700:], kw["seq_idx"][:, 1536:] = 1, 2  # mid-chunk; a chunk edge
    dout = torch.randn(b, l, h, p, device=dev, dtype=torch.bfloat16)
    dfinal = torch.randn(b, h, p, n, device=dev)
    base = default_config((b, l, h, p, g, n, q), dev)
    one = base.replace(backward=dict(passing_split=1, states=dict(split=1, tma=False)))
    want = _grads(x, dt, A, B, C, one, dout, dfinal, q, **kw)
    for tma in (False, True):
        cut = base.replace(backward=dict(passing_split=3, states=dict(split=3, tma=tma)))
        got = _grads(x, dt, A, B, C, cut, dout, dfinal, q, **kw)
        for k in want:
            assert rel_error(got[k], want[k]) < 1e-2, (k, tma, rel_error(got[k], want[k]))
