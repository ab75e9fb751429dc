"""Hybrid models: the attention layer against a float64 oracle, its cache, padding, generation."""

import math

import pytest
import torch
import torch.nn.functional as F

from mambalearn import model as M
from mambalearn.testing import assert_close


def attention_oracle(mixer, x):
    """Causal softmax attention written out, from the mixer's weights, in float64."""
    b, l, dm = x.shape
    H, p = mixer.heads, mixer.p
    q, k, v = F.linear(x, mixer.qkv.weight.double()).view(b, l, 3, H, p).unbind(2)
    s = torch.einsum("bqhp,bkhp->bhqk", q, k) / math.sqrt(p)
    s = s.masked_fill(torch.ones(l, l, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.einsum("bhqk,bkhp->bqhp", s.softmax(-1), v).reshape(b, l, dm)
    return F.linear(y, mixer.out_proj.weight.double())


def test_attention_mixer_against_the_oracle():
    torch.manual_seed(0)
    cfg = M.MambaConfig(d_model=12)
    mixer = M.AttentionMixer(cfg, n_heads=3)
    x = torch.randn(2, 7, 12)
    assert_close(mixer(x).double(), attention_oracle(mixer, x.double()), dtype=torch.float32)


def test_hybrid_cache_prefill_and_steps_equal_one_pass():
    torch.manual_seed(1)
    m = M.hybrid(M.MambaConfig(vocab_size=10, d_model=8, n_layers=3, d_state=3), [1]).eval()
    assert isinstance(m.layers[1].mixer, M.AttentionMixer)
    assert isinstance(m.layers[0].mixer, M.Mamba1Mixer)
    tok = torch.randint(0, 10, (2, 9))
    with torch.no_grad():
        full = m(tok)
        cache = m.empty_cache(2)
        parts = [m(tok[:, :4], cache), m(tok[:, 4:6], cache)]
        parts += [m.step(tok[:, t], cache)[:, None] for t in range(6, 9)]
        assert_close(torch.cat(parts, 1), full)
        assert cache.layers[1].k.shape[2] == 9  # the KV cache grew by one entry a token
        out = m.generate(tok[:, :5], 3)
        seq = tok[:, :5]
        for _ in range(3):
            seq = torch.cat([seq, m(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq[:, 5:])


def test_left_padding_is_invisible():
    torch.manual_seed(2)
    m = M.hybrid(M.MambaConfig(vocab_size=10, d_model=8, n_layers=2, d_state=3), [0, 1]).eval()
    tok = torch.randint(0, 10, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        padded = m(tok, mask=mask)
        assert torch.isfinite(padded).all()
        assert_close(padded[:1, 3:], m(tok[:1, 3:]))


def test_hybrid_errors():
    cfg = M.MambaConfig(d_model=8, n_layers=2)
    with pytest.raises(ValueError, match="not layers"):
        M.hybrid(cfg, [2])
    with pytest.raises(ValueError, match="multiple of n_heads"):
        M.AttentionMixer(cfg, n_heads=3)
    with pytest.raises(ValueError, match="seq_idx"):
        M.AttentionMixer(cfg)(torch.randn(1, 3, 8), seq_idx=torch.zeros(1, 3, dtype=torch.long))
