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


def test_walk_backward_matches_autograd_of_the_oracle():
    """The backward reads what the walk stored (H^L, φ, the turns, c, w, γ)."""
    cfg = DEFAULT.replace(forward_launches=2, walk_rows=16, walk_col_block=16)
    kw = make(b=1, l=21, h=2, g=1, n=20, p=4, na=3, states=True)
    want = grads(mamba3.mamba3_siso_chunked, kw, seed=1, chunk_size=5)  # float64 autograd
    got = grads(mamba3_siso_combined, on(kw), seed=1, chunk_size=16, config=cfg)
    for name, a, b in zip(NAMES + ("angle0", "ssm0", "k0", "v0"), got, want, strict=True):
        close(a, b, grad=True, msg=f"d{name}")


def test_walk_bfloat16_and_bad_setting():
    kw = on(make(b=1, l=20, h=2, g=1, n=8, p=4, na=2), torch.bfloat16)
    out = mamba3_siso_combined(**kw, chunk_size=16, config=DEFAULT.replace(forward_launches=2))
    assert out.dtype == torch.bfloat16
    assert rel_error(out, oracle(kw)) < 2e-2
    with pytest.raises(ValueError, match="forward_launches must be 2 or 3"):
        DEFAULT.replace(forward_launches=1)
    with pytest.raises(ValueError, match="walk_rows must be a power of two"):
        DEFAULT.replace(walk_rows=24)


def test_output_kernel_settings_change_no_result():
    """Its own column block (16 over n = 40: a block with two turning pairs, two with none) and a
    register cap: the three-launch forward's outputs, to float32 rounding."""
    cfg = DEFAULT.replace(output_col_block=16, output_maxnreg=168)
    kw = on(make(b=1, l=23, h=2, g=1, n=40, p=6, na=10))
    got = mamba3_siso_combined(**kw, chunk_size=16, config=cfg)
    close(got, oracle(kw))
    close(got, mamba3_siso_combined(**kw, chunk_size=16))
    with pytest.raises(ValueError, match="output_col_block must be a power of two"):
        DEFAULT.replace(output_col_block=24)
