"""Chapter 11's fused SSD forward (two launches, or one) against the oracle and chapter 10."""

import dataclasses
from functools import partial

import pytest
import torch

from mambalearn import testing
from mambalearn.mamba2 import api as combined
from mambalearn.mamba2 import chunk as T
from mambalearn.mamba2.config import default_config
from mambalearn.mamba2.fused import outputs, states
from mambalearn.mamba2.fused.forward import ssd_fused_forward
from tests.test_ssd_triton import ST, dev, make, ref

# The SSD kernels multiply on the tensor cores: tf32 on a GPU (testing.assert_close, "dot")
assert_close = partial(testing.assert_close, dtype="dot")


def config(shape=(1, 1, 1, 1, 1, 1, 16), **parts):
    """The default launch settings for ``shape`` (b, l, h, p, g, n, q) on the test device, with
    ``parts`` changed (``Config.replace``)."""
    return default_config(shape, dev).replace(**parts)


def extras(b, l, h, p, n, z=True):
    return dict(
        D=torch.randn(h, p, device=dev),
        z=torch.randn(b, l, h, p, device=dev) if z else None,
        dt_bias=torch.randn(h, device=dev),
        initial_states=torch.randn(b, h, p, n, device=dev),
        dt_softplus=True,
    )


@pytest.mark.parametrize("launches", [2, 1])
@pytest.mark.parametrize("l,q,g", [(37, 16, 2), (16, 16, 1), (3, 16, 1), (70, 32, 1)])
def test_fused_forward_matches_oracle(l, q, g, launches):
    b, h, p, n = 2, 2, 4, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    kw = extras(b, l, h, p, n)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, launches=launches, **kw)
    want, want_f = ref(x, dt, A, B, C, q, return_final_states=True, **kw)
    assert_close(out, want)
    assert_close(final, want_f)


@pytest.mark.parametrize(
    "q,cfg",
    [
        (16, dict(states=dict(block_p=16, block_n=8), outputs=dict(block_m=16, block_k=16))),
        # the pointer-load states kernel, 16 steps a trip
        (32, dict(states=dict(tma=False, block_p=8, block_n=16, pointer_block_k=16),
                  outputs=dict(block_m=32, block_k=16, exp2=False))),
        (32, dict(outputs=dict(block_m=16, block_k=16))),
        # the tensor-descriptor states kernel (one chunk a trip); whole chunks per outputs program
        (32, dict(states=dict(block_p=16, block_n=8), outputs=dict(block_m=16, block_k=16,
                                                                  rows=None))),
        (64, dict(outputs=dict(block_m=32, block_k=16, rows=None))),
        (64, dict(outputs=dict(block_m=16, block_k=16, rows=2))),
        # every column block in one pipelined loop (the mask on each trip)
        (32, dict(outputs=dict(block_m=16, block_k=16, loop=True))),
        (64, dict(outputs=dict(block_m=32, block_k=16, loop=True))),
        # each sequence's walk split in segments (the carries folded between two launches)
        (16, dict(states=dict(split=3, block_p=16, block_n=8),
                 outputs=dict(block_m=16, block_k=16))),
    ],
)
def test_tiles_split_the_state_and_the_chunk(q, cfg):
    """Several state tiles per head (p and n split), several row and column blocks per chunk (the
    unmasked blocks left of the diagonal), chapter 10's exp, two chunk sizes; odd l: the tail past
    the tensor's end (zero-filled by the tensor descriptors)."""
    b, l, h, p, g, n = 2, 45, 3, 32, 1, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    kw = extras(b, l, h, p, n)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, config=config(**cfg), **kw)
    want, want_f = ref(x, dt, A, B, C, q, return_final_states=True, **kw)
    assert_close(out, want)
    assert_close(final, want_f)


OLD = (16, dict(states=dict(tma=False), outputs=dict(rows=None)))  # pointer loads, whole chunks
SPLIT = (16, dict(states=dict(split=3)))  # segments start mid-sequence and on a chunk edge
LOOP = (32, dict(outputs=dict(block_m=16, block_k=16, loop=True)))  # sequences in a masked loop


@pytest.mark.parametrize("q,cfg", [(16, None), OLD, SPLIT, LOOP])
def test_seq_idx_and_dt_limit(q, cfg):
    b, l, h, p, g, n = 2, 40, 2, 4, 1, 8
    x, dt, A, B, C = make(b, l, h, p, g, n)
    seq = torch.zeros(b, l, dtype=torch.int32, device=dev)
    seq[:, 9:], seq[:, 16:], seq[1, 33:] = 1, 2, 3  # mid-chunk and on a chunk edge
    kw = dict(extras(b, l, h, p, n), seq_idx=seq, dt_limit=(0.05, 0.9))
    out, final = ssd_fused_forward(x, dt, A, B, C, q, config=cfg and config(**cfg), **kw)
    want, want_f = ref(x, dt, A, B, C, q, return_final_states=True, **kw)
    assert_close(out, want)
    assert_close(final, want_f)
    with pytest.raises(ValueError, match="seq_idx"):
        ssd_fused_forward(x, dt, A, B, C, q, launches=1, seq_idx=seq)


def test_the_two_kernels_equal_chapter_10s_stages():
    """chunk_states = chunk_state + state_passing, chunk_outputs = bmm + chunk_scan, to float32
    summation order (the same roundings)."""
    b, l, h, p, g, n, q = 2, 40, 4, 8, 2, 16, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    kw = extras(b, l, h, p, n)
    dt_c, dA_cs = T.chunk_cumsum(dt, A, q, kw["dt_bias"], True, heads=ST.cumsum_heads)
    S = T.chunk_state(x, B, dt_c, dA_cs, None, ST)
    H_want, final_want = T.state_passing(S, dA_cs, kw["initial_states"], l=l, out_dtype=x.dtype,
                                         cfg=ST)
    base = config().states
    for cfg in (dict(tma=False), {}, dict(split=2)):
        # pointer loads, 64 steps a trip; tensor descriptors, a chunk a trip; and split in two
        H, final = states.chunk_states(x, B, dt_c, dA_cs, kw["initial_states"],
                                       config=dataclasses.replace(base, **cfg))
        assert_close(H, H_want)
        assert_close(final, final_want)
    for D in (kw["D"], kw["D"][:, 0].contiguous()):  # per (head, p) and per head
        out_want = T.chunk_scan(x, C, T.bmm_chunk(C, B, q, ST), dt_c, dA_cs, H_want, D, kw["z"],
                                None, ST)
        for rows in (1, None):  # a row block a program; the whole chunk
            got = outputs.chunk_outputs(x, C, B, dt_c, dA_cs, H, D, kw["z"],
                                        config=config(outputs=dict(block_m=16, block_k=16,
                                                                   rows=rows)).outputs)
            assert_close(got, out_want)


def test_rows_tensor_descriptors_cannot_take_fall_back_to_chapter_10():
    """p = 3 float32: 12-byte rows, which a tensor descriptor cannot address; the fused function
    runs chapter 10's kernels instead (same results), chunk_outputs says why it refuses."""
    b, l, h, p, g, n, q = 1, 20, 2, 3, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, dt_softplus=True)
    want, want_f = ref(x, dt, A, B, C, q, dt_softplus=True, return_final_states=True)
    assert_close(out, want)
    assert_close(final, want_f)
    assert not outputs.tma_ok(x) and outputs.tma_ok(B)
    dt_c, dA_cs = T.chunk_cumsum(dt, A, q, heads=ST.cumsum_heads)
    with pytest.raises(ValueError, match="16-byte aligned"):
        outputs.chunk_outputs(x, C, B, dt_c, dA_cs, torch.zeros(b, 2, h, p, n, device=dev),
                              config=config().outputs)


def test_low_precision_state_is_close():
    b, l, h, p, g, n, q = 1, 40, 2, 4, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    out, _ = ssd_fused_forward(
        x, dt, A, B, C, q, dt_softplus=True, launches=1, state_dtype=torch.float16
    )
    assert_close(out, ref(x, dt, A, B, C, q, dt_softplus=True), dtype=torch.float16)


def test_bad_arguments():
    x, dt, A, B, C = make(1, 8, 2, 4, 1, 8)
    with pytest.raises(ValueError, match="launches"):
        ssd_fused_forward(x, dt, A, B, C, 8, launches=3)
    with pytest.raises(ValueError, match="state_dtype is for launches=1"):
        ssd_fused_forward(x, dt, A, B, C, 8, state_dtype=torch.float16)
    with pytest.raises(TypeError, match="state_dtype"):
        ssd_fused_forward(x, dt, A, B, C, 8, launches=1, state_dtype=torch.int32)
    with pytest.raises(ValueError, match="chunk_size"):
        ssd_fused_forward(x, dt, A, B, C, 12)
    with pytest.raises(TypeError, match="config must be"):  # dicts of settings are gone
        ssd_fused_forward(x, dt, A, B, C, 8, config=dict(chunk=8))
    with pytest.raises(ValueError, match="states.split"):
        config(states=dict(split=0))


def test_fused_flag_selects_it_and_backward_reuses_ch10():
    b, l, h, p, g, n, q = 1, 20, 2, 4, 1, 8, 16
    x, dt, A, B, C = make(b, l, h, p, g, n, softplus=False)
    x1 = x.clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    o1 = combined.mamba_chunk_scan_combined(x1, dt, A, B, C, q, fused=True)
    o2 = combined.mamba_chunk_scan_combined(x2, dt, A, B, C, q, fused=False)
    assert_close(o1, o2)
    o1.sum().backward()
    o2.sum().backward()
    assert_close(x1.grad, x2.grad, grad=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize(
    "q,cfg",
    [
        (256, {}),
        (128, {}),
        (64, dict(outputs=dict(block_k=32, maxnreg=128))),
        (128, dict(outputs=dict(exp2=True))),
        (128, dict(states=dict(tma=False))),  # the pointer-load states kernel (until 12-01)
        (64, {}),
        (128, dict(states=dict(split=4), outputs=dict(rows=None))),  # split walks, whole chunks
        (128, dict(outputs=dict(loop=True))),  # the diagonal tile inside the pipelined loop
        (128, dict(outputs=dict(loop=True, block_k=32, num_stages=3))),
    ],
)
def test_gpu_fused_equals_unfused_at_the_same_chunk(q, cfg):
    """bf16 at a real size, float32 chain: the fused forward rounds where chapter 10's does, so
    it equals it to 1e-4 (float32 summation order only) and the oracle to bf16 accuracy. EXP2
    rounds the decay a little differently, by more where |dA_cs| grows large in a chunk: 1e-3
    (bench/NOTES_ssd.md)."""
    bound = 1e-3 if cfg.get("outputs", {}).get("exp2") else 1e-4
    b, l, h, p, g, n = 2, 1024, 16, 64, 1, 128
    x, dt, A, B, C = make(b, l, h, p, g, n, dtype=torch.bfloat16)
    kw = extras(b, l, h, p, n)
    kw["z"] = kw["z"].bfloat16()
    cfg = config((b, l, h, p, g, n, q), **cfg)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, config=cfg, **kw)
    want, want_f = T.ssd_forward(x, dt, A, B, C, q, **kw)
    assert (out.float() - want.float()).norm() / want.float().norm() < bound
    assert (final - want_f).norm() / want_f.norm() < 1e-4
    ref_out = ref(x, dt, A, B, C, q, **kw)
    assert (out.double() - ref_out).norm() / ref_out.norm() < 2e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("cfg", [dict(states=dict(tma=False)), dict(states=dict(split=3))])
def test_gpu_fused_seq_idx_and_odd_length(cfg):
    b, l, h, p, g, n, q = 2, 1000, 8, 64, 2, 128, 128
    cfg = config((b, l, h, p, g, n, q), **cfg)
    x, dt, A, B, C = make(b, l, h, p, g, n, dtype=torch.bfloat16)
    seq = torch.zeros(b, l, dtype=torch.int32, device=dev)
    seq[:, 300:], seq[:, 640:], seq[1, 901:] = 1, 2, 3
    kw = dict(extras(b, l, h, p, n, z=False), seq_idx=seq)
    out, final = ssd_fused_forward(x, dt, A, B, C, q, config=cfg, **kw)
    want, want_f = T.ssd_forward(x, dt, A, B, C, q, **kw)
    assert (out.float() - want.float()).norm() / want.float().norm() < 1e-4
    assert (final - want_f).norm() / want_f.norm() < 1e-4


@pytest.mark.parametrize("cfg, name", [(dict(outputs=dict(block_k=8)), "config.outputs.block_k"),
                                       (dict(states=dict(tma=False, pointer_block_k=8)),
                                        "config.states.pointer_block_k")])
def test_tiles_a_gpu_cannot_build_are_refused_by_name(cfg, name):
    """A tile of fewer than 16 along a tl.dot's K runs in the interpreter and fails to build for
    sm_90: refused on every machine, by the config field's name."""
    b, l, h, p, g, n = 1, 20, 2, 16, 1, 16
    x, dt, A, B, C = make(b, l, h, p, g, n)
    with pytest.raises(ValueError, match=f"{name} = 8"):
        ssd_fused_forward(x, dt, A, B, C, 16, config=config(**cfg))
