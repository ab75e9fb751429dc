"""Chapter 13: Mamba blocks, a tiny LM: prefill + decode = full pass, backends agree."""

import pytest
import torch

from mambalearn import model as M
from mambalearn.testing import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where the Triton backends run
TINY = dict(vocab_size=12, d_model=16, n_layers=2, d_state=4, headdim=8, chunk_size=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def tiny(block, seed=0, **kw):
    torch.manual_seed(seed)
    if block == "mamba3":  # chapter 15's block, registered with the model on import
        from mambalearn.mamba3.mixer import Mamba3Config as config
    else:
        config = M.MambaConfig
    return M.MambaLM(config(block=block, **{**TINY, **kw})).eval()


@pytest.mark.parametrize("block", ["mamba1", "mamba2"])
def test_chunked_prefill_then_decode_equals_full_pass(block):
    m = tiny(block)
    tokens = torch.randint(0, 12, (3, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(tokens)  # (b, l, vocab)
        cache = m.empty_cache(3)
        parts = [m(tokens[:, :2], cache), m(tokens[:, 2:7], cache)]  # first chunk shorter than k
        parts += [m.step(tokens[:, t], cache)[:, None] for t in range(7, 13)]
    assert cache.seqlen_offset == 7
    assert_close(torch.cat(parts, 1), full)


@pytest.mark.parametrize("block", ["mamba1", "mamba2"])
def test_all_available_backends_give_the_same_logits(block):
    names = M.available_backends(block)
    assert "sequential" in names
    m = tiny(block, seed=2).to(DEV)
    tokens = torch.randint(0, 12, (2, 9), generator=torch.Generator().manual_seed(3)).to(DEV)
    with torch.no_grad():
        want = m.set_backend("sequential")(tokens)
        for name in names:
            assert_close(m.set_backend(name)(tokens), want, dtype="dot", msg=f"backend {name}")
            # continuing from a cache, too (backends without initial_state use linearity)
            cache = m.empty_cache(2)
            m(tokens[:, :4], cache)
            assert_close(m(tokens[:, 4:], cache), want[:, 4:], dtype="dot",
                         msg=f"backend {name} from a cache")


@pytest.mark.parametrize("block", ["mamba1", "mamba2"])
def test_left_padded_batch_matches_unpadded_runs(block):
    """Padding enters the conv as zeros and keeps the state (Δ = 0): results are unchanged."""
    m = tiny(block, seed=4)
    g = torch.Generator().manual_seed(5)
    short = torch.randint(2, 12, (1, 5), generator=g)
    long = torch.randint(2, 12, (1, 9), generator=g)
    batch = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long])  # (2, 9)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :4] = False
    with torch.no_grad():
        got = m(batch, mask=mask)
        assert_close(got[0, 4:], m(short)[0])
        assert_close(got[1], m(long)[0])
        # generation from the padded batch continues each sequence as if alone
        new = m.generate(batch, 4, mask=mask)
        assert torch.equal(new[0], m.generate(short, 4)[0])
        assert torch.equal(new[1], m.generate(long, 4)[0])


def test_seq_idx_packs_sequences_in_one_row_mamba2():
    m = tiny("mamba2", seed=6)
    g = torch.Generator().manual_seed(7)
    a, b = torch.randint(0, 12, (1, 6), generator=g), torch.randint(0, 12, (1, 7), generator=g)
    seq_idx = torch.tensor([[0] * 6 + [1] * 7])
    with torch.no_grad():
        m.set_backend("chunked")
        got = m(torch.cat([a, b], 1), seq_idx=seq_idx)
        assert_close(got[:, :6], m(a))
        assert_close(got[:, 6:], m(b))
    with pytest.raises(ValueError, match="mamba2"):
        tiny("mamba1")(a, seq_idx=torch.zeros(1, 6, dtype=torch.long))


def test_generate_with_cache_equals_recomputing_the_prefix():
    m = tiny("mamba1", seed=8)
    prompt = torch.randint(0, 12, (2, 5), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        new = m.generate(prompt, 5, chunk=2)
        seq = prompt
        for _ in range(5):  # the slow way: rerun the whole sequence for every token
            seq = torch.cat([seq, m(seq)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(new, seq[:, 5:])


def test_bad_backend_names_are_explained():
    with pytest.raises(ValueError, match="choose one of"):
        M.resolve("nope")
    with pytest.raises(ValueError, match="mamba2 backend 'blelloch'"):
        M.resolve("blelloch", "mamba2")


# --- the Mamba-3 block (chapter 15), registered with the model ----------------------------------


def test_an_unregistered_block_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown block 'mamba9'"):
        M.MambaLM(M.MambaConfig(block="mamba9"))


def test_mamba3_prefill_then_decode_equals_full_pass():
    m = tiny("mamba3", seed=8, d_state=8)
    tokens = torch.randint(0, 12, (3, 11), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        full = m(tokens)  # (b, l, vocab)
        cache = m.empty_cache(3)
        parts = [m(tokens[:, :3], cache), m(tokens[:, 3:6], cache)]
        parts += [m.step(tokens[:, t], cache)[:, None] for t in range(6, 11)]
    assert_close(torch.cat(parts, 1), full)


def test_mamba3_backends_agree_and_the_rotation_matters():
    m = tiny("mamba3", seed=10, d_state=8, chunk_size=16).to(DEV)
    names = M.available_backends("mamba3")
    assert {"sequential", "chunked"} <= set(names)
    tokens = torch.randint(0, 12, (2, 19), generator=torch.Generator().manual_seed(11)).to(DEV)
    with torch.no_grad():
        want = m.set_backend("sequential")(tokens)
        for name in names:
            assert_close(m.set_backend(name)(tokens), want, dtype="dot",
                         msg=f"mamba3 backend {name}")
        m.cfg.rotate = False  # the same weights with a real state give other logits
        assert (m.set_backend("chunked")(tokens) - want).abs().max() > 1e-3


def test_mamba3_left_padding_matches_unpadded_run():
    m = tiny("mamba3", seed=12, d_state=8)
    g = torch.Generator().manual_seed(13)
    short = torch.randint(2, 12, (1, 5), generator=g)
    long = torch.randint(2, 12, (1, 8), generator=g)
    batch = torch.cat([torch.cat([torch.zeros(1, 3, dtype=torch.long), short], 1), long])  # (2, 8)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    with torch.no_grad():
        got = m(batch, mask=mask)
        assert_close(got[0, 3:], m(short)[0])
        assert_close(got[1], m(long)[0])
