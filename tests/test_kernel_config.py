"""The launch settings of the SSD and Mamba-3 kernels as data: the shape rules, the errors.
(No kernel runs here; every kernel test runs under these configs.)"""

import pytest
import torch

from mambalearn.mamba2 import config as C
from mambalearn.mamba3 import config as m3
from mambalearn.utils import check_chunk_size


def test_the_walk_is_split_only_where_the_gpu_would_idle():
    # one Mamba-2 2.7B sequence (h80, 2 state tiles): 160 programs on 132 SMs, 5 slots each
    assert C.split_walk(160, 256, 132) == 4
    assert C.split_walk(320, 128, 132) == 1  # two segments would walk as long as one
    assert C.split_walk(160, 16, 132) == 1  # too few chunks for ≥ 3 segments of ≥ 8
    assert C.split_walk(640, 32, 132) == 1  # b4: the GPU is full already


def test_shape_rules_of_the_gpu_default():
    b1 = C.gpu_config((1, 32768, 80, 64, 1, 128, 128), sms=132)
    b8 = C.gpu_config((8, 4096, 80, 64, 1, 128, 128), sms=132)
    assert (b1.states.split, b8.states.split) == (4, 1)
    assert b1.outputs.loop and b1.outputs.block_k == 32  # chunk 128: the pipelined loop
    q256 = C.gpu_config((1, 32768, 80, 64, 1, 128, 256), sms=132)
    assert not q256.outputs.loop  # chunk 256: the one-tile diagonal
    assert C.head_splits(80, 40, 132) == 8 and C.head_splits(80, 20480, 132) == 1
    assert C.default_config((1, 64, 2, 8, 1, 8, 16), "cpu") is C.CPU


def test_configs_are_data_and_say_what_is_wrong():
    cfg = C.CPU.replace(states=dict(split=2), backward=dict(dx=dict(num_warps=2)))
    assert (cfg.states.split, cfg.backward.dx.num_warps, C.CPU.states.split) == (2, 2, 1)
    with pytest.raises(ValueError, match="config.states has no field splits"):
        C.CPU.replace(states=dict(splits=2))
    with pytest.raises(ValueError, match="backward.nsplit"):
        C.CPU.replace(backward=dict(nsplit=0))
    with pytest.raises(TypeError, match="config must be"):
        C.resolve(dict(chunk=128), (1, 64, 2, 8, 1, 8, 16), "cpu")
    with pytest.raises(ValueError, match="state_stages"):
        m3.DEFAULT.replace(state_stages=0)
    with pytest.raises(TypeError, match="config must be"):
        m3.resolve({}, None, torch.device("cpu"))


@pytest.mark.parametrize("bad,error", [(12, ValueError), (0, ValueError), (-8, ValueError),
                                       (2.0, TypeError), ("64", TypeError), (True, TypeError),
                                       (None, TypeError)])
def test_chunk_size_has_one_rule(bad, error):
    # the kernels' rule (a power of two); a non-int is a TypeError, a bad int a ValueError
    with pytest.raises(error, match="chunk_size"):
        check_chunk_size(bad, power_of_two=True)
    assert check_chunk_size(64, power_of_two=True) == 64
    assert check_chunk_size(16, power_of_two=True, minimum=16) == 16
    assert check_chunk_size(12) == 12  # the PyTorch scans take any length ≥ 1
    with pytest.raises(ValueError, match="≥ 16"):
        check_chunk_size(8, power_of_two=True, minimum=16)
