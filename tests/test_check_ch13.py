"""Chapter 13 checks: the Mamba block from its parts, against model.Block, outputs and gradients."""

import re

import pytest
import torch
import torch.nn.functional as F

from mambalearn import check, model
from mambalearn.check import _core, ch13_block
from mambalearn.inference import causal_conv1d
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close


def rms_norm(x, weight, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def block(detach=None, wrong=None):
    def mamba_block(hidden, w):
        n, r = w["mixer.A_log"].shape[1], w["mixer.dt_proj.weight"].shape[1]
        d = w["mixer.conv_weight"].shape[0]
        cfg = model.MambaConfig(d_model=hidden.shape[-1], d_state=n, dt_rank=r,
                                d_conv=w["mixer.conv_weight"].shape[1],
                                expand=d // hidden.shape[-1])
        if wrong:
            return ch13_block._reference(hidden, w, cfg, wrong)
        x, z = F.linear(rms_norm(hidden, w["norm.weight"]), w["mixer.in_proj.weight"]).chunk(2, -1)
        x, _ = causal_conv1d(x.transpose(1, 2), w["mixer.conv_weight"], w["mixer.conv_bias"])
        x = F.silu(x)
        dt, B, C = F.linear(x.transpose(1, 2), w["mixer.x_proj.weight"]).split([r, n, n], dim=-1)
        if detach == "B":
            B = B.detach()
        delta = F.linear(dt, w["mixer.dt_proj.weight"]).transpose(1, 2)
        A = -torch.exp(w["mixer.A_log"].detach() if detach == "A_log" else w["mixer.A_log"])
        y = selective_scan_sequential(x, delta, A, B.transpose(1, 2), C.transpose(1, 2),
                                      w["mixer.D"], z.transpose(1, 2), w["mixer.dt_proj.bias"],
                                      delta_softplus=True)
        return hidden + F.linear(y.transpose(1, 2), w["mixer.out_proj.weight"])
    return mamba_block


def test_passes_the_assembled_block(capsys):
    check.rms_norm(rms_norm)
    check.mamba_block(block())
    assert capsys.readouterr().out.count("✓") == 2


def test_the_reference_is_the_library_block():
    g = _core.generator(0)
    cfg = ch13_block._config(g)
    blk = ch13_block._weights(cfg, g)
    x = torch.randn(2, 6, cfg.d_model, dtype=torch.float64)
    assert_close(ch13_block._reference(x, blk.state_dict(), cfg), blk(x).detach())


@pytest.mark.parametrize("wrong", sorted(ch13_block.WRONG))
def test_names_each_wrong_assembly(wrong):
    with pytest.raises(AssertionError, match="hint: your output is the block's when "
                       + re.escape(ch13_block.WRONG[wrong])):
        check.mamba_block(block(wrong=wrong))


@pytest.mark.parametrize("part", ["A_log", "B"])
def test_rejects_a_detached_weight(part):
    """Right output, but a gradient that never reaches a weight (or reaches it wrong)."""
    with pytest.raises(AssertionError, match="gradient"):
        check.mamba_block(block(detach=part))


def test_rejects_a_layer_norm_for_rms_norm():
    with pytest.raises(AssertionError, match="rms_norm"):
        check.rms_norm(lambda x, weight, eps=1e-5: F.layer_norm(x, x.shape[-1:], weight, eps=eps))
