"""The Mamba-3 SISO forward with its chunk states and state passing in one walk
(``Config.forward_launches`` = 2, ``state_passing._state_walk_kernel``), against the float64
oracle and the three-launch forward, in Triton's interpreter at tiny sizes (fresh random inputs,
odd lengths, masked tiles, turning and non-turning column blocks)."""

import pytest
import torch

from mambalearn import mamba3
from mambalearn.mamba3 import mamba3_siso_combined
from mambalearn.mamba3.config import DEFAULT
from mambalearn.testing import rel_error
from tests.test_mamba3 import NAMES, make
from tests.test_mamba3_triton import close, grads, on, oracle

WALK = [
    # n 40 in column blocks of 16: the second block turns two of its pairs, the last two none;
    # row tiles of 16 over p = 20 (two, the second masked); loads one chunk ahead
    (dict(b=1, l=45, h=6, g=2, n=40, p=20, na=10, states=True),
     dict(walk_rows=16, walk_col_block=16, walk_stages=1)),
    # one tile a state, odd l, GQA, no Input_States
    (dict(b=2, l=37, h=4, g=2, n=8, p=3, na=3), dict(walk_rows=64, walk_col_block=32)),
]


@pytest.mark.parametrize("size,cfg", WALK)
def test_walk_forward_matches_the_oracle_and_three_launches(size, cfg):
    cfg = DEFAULT.replace(forward_launches=2, **cfg)
    kw = on(make(**size))
    got = mamba3_siso_combined(**kw, chunk_size=16, return_final_states=True, config=cfg)
    three = mamba3_siso_combined(**kw, chunk_size=16, return_final_states=True)
    for x, y, z in zip(got, oracle(kw, return_final_states=True), three, strict=True):
        close(x, y)
        close(x, z)


@pytest.mark.parametrize("launches", [(2, 2), (3, 1), (2, 1)])
def test_walk_backward_matches_autograd_of_the_oracle(launches):
    """The backward reads what the walk stored (H^L, φ, the turns, c, w, γ); the reverse walk
    forms dS^L inside (n 20 in blocks of 16: a turning and a non-turning block, final-state
    gradients, Input_States)."""
    fwd, back = launches
    cfg = DEFAULT.replace(forward_launches=fwd, state_grad_launches=back, walk_rows=16,
                          walk_col_block=16, output_unroll=1 if fwd == 3 else 2,
                          bwd_v_unroll=1 if back == 2 else 2, bwd_v_col_block=16)
    kw = make(b=1, l=37, h=2, g=1, n=20, p=4, na=3, states=True)
    want = grads(mamba3.mamba3_siso_chunked, kw, seed=1, chunk_size=5)  # float64 autograd
    got = grads(mamba3_siso_combined, on(kw), seed=1, chunk_size=16, config=cfg)
    for name, a, b in zip(NAMES + ("angle0", "ssm0", "k0", "v0"), got, want, strict=True):
        close(a, b, grad=True, msg=f"d{name}")


def test_reverse_walk_without_D_Z_or_final_states():
    """No gate (dy is dout itself), no final-state gradients, GQA, two row tiles (p 20 > 16);
    one head a dq/dk program, register caps (a compile option, nothing the interpreter runs)."""
    cfg = DEFAULT.replace(state_grad_launches=1, walk_rows=16, walk_col_block=32,
                          heads_per_program=1, min_programs=1, bwd_qk_maxnreg=168,
                          bwd_v_maxnreg=168)
    kw = make(b=2, l=30, h=4, g=2, n=8, p=20, na=2)
    kw.update(D=None, Z=None)
    got = grads(mamba3_siso_combined, on(kw), seed=3, final=False, chunk_size=16, config=cfg)
    want = grads(mamba3.mamba3_siso_chunked, kw, seed=3, final=False, chunk_size=7)
    for name, a, b in zip(NAMES, got, want, strict=True):
        if b is None:
            assert a is None, name
        else:
            close(a, b, grad=True, msg=f"d{name}")


def test_walk_bfloat16_and_bad_setting():
    kw = on(make(b=1, l=20, h=2, g=1, n=8, p=4, na=2), torch.bfloat16)
    out = mamba3_siso_combined(**kw, chunk_size=16, config=DEFAULT.replace(forward_launches=2))
    assert out.dtype == torch.bfloat16
    assert rel_error(out, oracle(kw)) < 2e-2
    with pytest.raises(ValueError, match="forward_launches must be 1, 2 or 3"):
        DEFAULT.replace(forward_launches=4)
    with pytest.raises(ValueError, match="state_grad_launches must be 1 or 2"):
        DEFAULT.replace(state_grad_launches=3)
    with pytest.raises(ValueError, match="walk_rows must be a power of two"):
        DEFAULT.replace(walk_rows=24)


@pytest.mark.parametrize("unroll", [1, 2])
def test_output_kernel_settings_change_no_result(unroll):
    """Its own column block (16 over n = 40: a block with two turning pairs, two with none), a
    register cap, the blocks unrolled or looped over: the three-launch forward's outputs, to
    float32 rounding."""
    cfg = DEFAULT.replace(output_col_block=16, output_maxnreg=168, output_unroll=unroll)
    kw = on(make(b=1, l=23, h=2, g=1, n=40, p=6, na=10))
    got = mamba3_siso_combined(**kw, chunk_size=16, config=cfg)
    close(got, oracle(kw))
    close(got, mamba3_siso_combined(**kw, chunk_size=16))
    with pytest.raises(ValueError, match="output_col_block must be a power of two"):
        DEFAULT.replace(output_col_block=24)
    with pytest.raises(ValueError, match="output_unroll must be 1 or 2"):
        DEFAULT.replace(output_unroll=3)


def test_device_script_variants_and_table():
    """Every variant ``bench.gpu.m3_siso`` times is a valid config; its table has a line per
    variant, a column per case, and the failures after."""
    from bench.gpu import m3_siso

    for changes in m3_siso.VARIANTS.values():
        DEFAULT.replace(**changes)
    assert set(m3_siso.BACKWARD_ONLY + m3_siso.FORWARD_ONLY) <= set(m3_siso.VARIANTS)
    rows = [dict(op="m3_siso fwd", shape="b8 l2048 h32 p64 n128 bf16", variant=v, ms=ms,
                 ratio=r) for v, ms, r in (("mamba_ssm", 0.5, 1.0), ("default", 0.45, 0.9))]
    rows.append(dict(op="m3_siso fwd", shape="b8 l2048 h32 p64 n128 bf16", variant="walk n64",
                     check="FAILED: out vs default"))
    lines = m3_siso.table(rows).splitlines()
    assert "b8 l2048 fwd" in lines[0] and "0.450 (0.90)" in lines[2]
    assert len(lines) == 4 and "FAILED" in lines[3]
