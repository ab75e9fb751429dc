"""The state-outer backward variants of the tuned selective scan (BACKWARD_VARIANTS and
BACKWARD_VARIANTS_LARGE_N with layout "state-outer") vs autograd through the float64 oracle.

CPU: Triton's interpreter, the chunk size the GPU uses for n ≤ 16 (64; 32 for n = 17), tiny
b/d/n, lengths that cross chunks and end inside one (odd l), every gradient. The existing
backward-variant tests in test_selective_scan.py also run these entries (with chunk 16).
"""

import pytest
import torch

from mambalearn import testing
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1 import default_config, selective_scan_fn
from mambalearn.scan.sequential import selective_scan_sequential

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
NAMES = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias"]
SMALL_N = [k for k, v in cfgs.BACKWARD_VARIANTS.items() if v.layout == "state-outer"]
LARGE_N = list(cfgs.BACKWARD_VARIANTS_LARGE_N)


def with_backward(backward, n, chunk=None):
    """The default config for n on this device with another backward (and chunk)."""
    cfg = default_config(n, DEV)
    return cfg.replace(backward=backward, chunk=chunk or cfg.chunk)


def make(b, d, l, n, bc, g=2):
    """Fresh random inputs (no fixed seed): (b, n, l) shared, (b, g, n, l) grouped, (d, n) fixed."""
    r = lambda *s: torch.randn(*s, device=DEV)
    shapes = {"shared": (b, n, l), "grouped": (b, g, n, l), "fixed": (d, n)}
    return dict(u=r(b, d, l), delta=0.5 * r(b, d, l), A=-(0.5 + torch.rand(d, n, device=DEV)),
                B=r(*shapes[bc[0]]), C=r(*shapes[bc[1]]), D=r(d), z=r(b, d, l),
                delta_bias=0.3 * r(d))


def leaves(x):
    return {k: v.detach().clone().requires_grad_() for k, v in x.items()}


def check(cfg, x, seq_idx=None, bounds=None):  # cfg: a Config
    """out and all eight gradients of the variant vs autograd through the float64 oracle
    (``bounds``: the packed sequences of ``seq_idx``, run separately through the oracle)."""
    xs = leaves(x)
    out = selective_scan_fn(**xs, delta_softplus=True, seq_idx=seq_idx, config=cfg)
    ref_in = leaves({k: v.double() for k, v in x.items()})
    bounds = bounds or [0, x["u"].shape[-1]]
    timed = ("u", "delta", "z", "B", "C")
    ref = torch.cat([selective_scan_sequential(
        **{k: v[..., s:e] if k in timed and v.ndim > 2 else v for k, v in ref_in.items()},
        delta_softplus=True) for s, e in zip(bounds[:-1], bounds[1:], strict=True)], -1)
    testing.assert_close(out, ref, msg="forward")
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    for k in NAMES:
        testing.assert_close(xs[k].grad, ref_in[k].grad, grad=True, msg=f"d{k}")


@pytest.mark.parametrize("name", SMALL_N)
@pytest.mark.parametrize("b,d,l,n,bc", [
    (1, 4, 77, 3, ("grouped", "fixed")),  # 2 chunks of 64, the last one 13 steps; d/g = 2
    (1, 3, 129, 2, ("fixed", "shared")),  # 3 chunks, 1 step in the last; d not a tile multiple
])
def test_state_outer_small_n(name, b, d, l, n, bc):
    check(with_backward(cfgs.BACKWARD_VARIANTS[name], n), make(b, d, l, n, bc))


@pytest.mark.parametrize("name", LARGE_N)
def test_state_outer_large_n(name):
    # n > 16, the large-n forward (run-time state loop); chunk 32 instead of 128 to keep the
    # interpreter quick (the kernel takes any chunk ≥ n): 3 chunks, the last 6 steps
    cfg = with_backward(cfgs.BACKWARD_VARIANTS_LARGE_N[name], 17, chunk=32)
    check(cfg, make(1, 3, 70, 17, ("shared", "grouped"), g=1))


def test_default_backward_by_n():
    # the GPU defaults: state-outer up to n = the chunk (n ≤ 16: two channels a program, else
    # one), the sub-block kernel past it; the boundary n = chunk runs and matches the oracle
    pick = lambda n: default_config(n, "cuda").backward
    assert pick(16) == cfgs.BACKWARD
    assert pick(17) == pick(128) == cfgs.BACKWARD_LARGE_N
    assert pick(129) == pick(256) == cfgs.BACKWARD_RUNTIME_LOOP
    check(with_backward(cfgs.BACKWARD_LARGE_N, 32, chunk=32),  # every column holds a row sum
          make(1, 2, 40, 32, ("grouped", "shared"), g=1))


def test_state_outer_packed_sequences():
    # seq_idx: Ā = 0 where a sequence starts, in the forward and the time-reversed adjoint
    cfg = with_backward(cfgs.BACKWARD_VARIANTS[SMALL_N[0]], 3)
    bounds = [0, 7, 70, 71, 90]
    lengths = torch.tensor([e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)])
    seq = torch.repeat_interleave(torch.arange(len(lengths)), lengths)[None].int().to(DEV)
    check(cfg, make(1, 4, bounds[-1], 3, ("shared", "shared")), seq_idx=seq, bounds=bounds)


def test_state_outer_needs_n_within_the_chunk():
    cfg = default_config(5, DEV)
    cfg = cfg.replace(chunk=4, forward=dict(block_l=4), backward=cfgs.BACKWARD_VARIANTS[SMALL_N[0]])
    x = make(1, 2, 8, 5, ("shared", "shared"))
    with pytest.raises(ValueError, match="n ≤ 4"):
        selective_scan_fn(**x, config=cfg)


def test_interpreter_default_is_the_sub_block_kernel():
    # the CPU default backward is the sub-block kernel (layout "sub-block"), with every mask
    assert default_config(2, "cpu").backward.layout == "sub-block"
    cfg = default_config(2, DEV)
    check(cfg if GPU else cfg.replace(chunk=16), make(1, 4, 16, 2, ("shared", "shared")))
