"""The Mamba-3 SISO forward in one launch (``Config.forward_launches`` = 1, ``walk._walk_kernel``:
a program per channel block walks the chunks), against the float64 oracle and the three-launch
forward, in Triton's interpreter at tiny sizes: fresh random inputs, odd lengths (a partial last
chunk), GQA, n and p not powers of two, na < n/2, several channel blocks, with and without D, Z and
Input_States, float32 and bf16; and every gradient of a one-launch forward + the backward."""

import pytest
import torch

from mambalearn import mamba3
from mambalearn.mamba3 import mamba3_siso_combined
from mambalearn.mamba3.config import DEFAULT
from mambalearn.testing import rel_error
from tests.test_mamba3 import NAMES, make
from tests.test_mamba3_triton import close, grads, on, oracle

ONE = DEFAULT.replace(forward_launches=1)

SIZES = [
    # p 20 in channel blocks of 16 (two, the second masked); n 40 (N 64, masked columns) in
    # column blocks of 16: the first turns all its pairs, the second two of them, the last two
    # none (na 10 of 20 pairs); GQA; Input_States; l = 2·16 + 13
    (dict(b=1, l=45, h=4, g=2, n=40, p=20, na=10, states=True),
     dict(walk1_p_block=16, walk1_col_block=16)),
    # one channel block, one column block, odd l, tiny p and n, no Input_States, the step values
    # held through the column loop
    (dict(b=2, l=37, h=2, g=1, n=8, p=3, na=3),
     dict(walk1_p_block=32, walk1_col_block=32, walk1_reload=0)),
]


@pytest.mark.parametrize("size,cfg", SIZES)
def test_one_launch_forward_matches_the_oracle_and_three_launches(size, cfg):
    kw = on(make(**size))
    got = mamba3_siso_combined(**kw, chunk_size=16, return_final_states=True,
                               config=ONE.replace(**cfg))
    three = mamba3_siso_combined(**kw, chunk_size=16, return_final_states=True)
    for x, y, z in zip(got, oracle(kw, return_final_states=True), three, strict=True):
        close(x, y)
        close(x, z)


def test_one_launch_forward_without_D_Z_or_states():
    kw = on(make(b=1, l=23, h=2, g=2, n=12, p=5, na=2))
    kw.update(D=None, Z=None)
    got = mamba3_siso_combined(**kw, chunk_size=16, config=ONE)
    close(got, oracle(kw))
    close(got, mamba3_siso_combined(**kw, chunk_size=16))


def test_one_launch_saves_what_the_three_launches_save():
    """With autograd the walk writes the backward's tensors: the same per-step values, and the
    states entering each chunk and y before the gate up to the rounding of the inputs' dtype."""
    from mambalearn.mamba3.api import _NAMES, _SAVED, _STEPS, _prepare
    from mambalearn.mamba3.chunk import _initial_state, launch_forward
    from mambalearn.mamba3.walk import walk_forward

    kw = on(make(b=1, l=37, h=2, g=1, n=20, p=18, na=4, states=True))
    x = _prepare([kw[k] for k in _NAMES], kw["Input_States"])
    one = walk_forward(x, 16, True, False, ONE.replace(walk1_p_block=16, walk1_col_block=16),
                       *_initial_state(x))
    three = launch_forward(x, 16, save=True, return_final=False, cfg=DEFAULT)
    kept = {}
    for name, r in (("one", one), ("three", three)):
        d = dict(r, **r["steps"])
        kept[name] = [d[k] for k in _SAVED]
    assert set(one["steps"]) == set(_STEPS)
    for name, a, b in zip(_SAVED, kept["one"], kept["three"], strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        if name in ("C2", "W", "G", "Phi", "Turn", "Cend", "theta_final"):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)
        else:  # H^L (S^L kept in float32 in the walk) and y_pre
            close(a, b, msg=name)


def test_one_launch_forward_and_backward_match_autograd_of_the_oracle():
    """Every gradient (11 inputs, 4 initial states; all five outputs projected) of the one-launch
    forward + the default backward, against float64 autograd of the chunked form; two channel
    blocks over p 18, two column blocks over n 20 (one turning, one not)."""
    kw = make(b=1, l=37, h=2, g=1, n=20, p=18, na=3, states=True)
    want = grads(mamba3.mamba3_siso_chunked, kw, seed=2, chunk_size=5)  # float64 autograd
    got = grads(mamba3_siso_combined, on(kw), seed=2, chunk_size=16,
                config=ONE.replace(walk1_p_block=16, walk1_col_block=16))
    for name, a, b in zip(NAMES + ("angle0", "ssm0", "k0", "v0"), got, want, strict=True):
        close(a, b, grad=True, msg=f"d{name}")


def test_one_launch_bfloat16_and_bad_settings():
    kw = on(make(b=1, l=21, h=2, g=1, n=8, p=4, na=2), torch.bfloat16)
    out = mamba3_siso_combined(**kw, chunk_size=16, config=ONE)
    three = mamba3_siso_combined(**kw, chunk_size=16)
    assert out.dtype == torch.bfloat16
    assert rel_error(out, oracle(kw)) < 2e-2
    assert rel_error(out, three) < 1e-2
    with pytest.raises(ValueError, match="walk1_p_block must be a power of two ≥ 16"):
        DEFAULT.replace(walk1_p_block=8)
    with pytest.raises(ValueError, match="walk1_p_block must be a power of two"):
        DEFAULT.replace(walk1_p_block=24)
    with pytest.raises(ValueError, match="walk1_col_block must be a power of two ≥ 16"):
        DEFAULT.replace(walk1_col_block=8)
    with pytest.raises(ValueError, match="walk1_warps must be an int ≥ 1"):
        DEFAULT.replace(walk1_warps=0)
