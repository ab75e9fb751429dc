"""The sequence cut into segments (chapter 09's last step) against the float64 oracle.

CPU: Triton's interpreter, the configs ask for segments (on a GPU `segment_plan` decides). Each
case crosses segment boundaries with a ragged last segment, and runs the forward (both layouts),
the summaries, the carry scans and the state-outer backward with every gradient, the initial
state's and the last state's included; packed sequences start inside a segment, on a segment
boundary and in the last segment.
"""

import pytest
import torch

from mambalearn import testing
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1 import default_config, selective_scan_fn
from mambalearn.mamba1.fused import tile
from mambalearn.scan.sequential import selective_scan_sequential

DEV = "cuda" if torch.cuda.is_available() else "cpu"
STATE_OUTER = cfgs.Backward("state-outer", block_d=2, num_warps=1)
RECURRENT = cfgs.Forward(block_d=4, block_l=8, num_warps=1, layout="recurrent", prefetch=True)


def make(b, d, l, n, bc, z=True, bias=True):
    """Fresh random inputs: B/C (b, n, l) shared, (b, 1, n, l) grouped or (d, n) fixed."""
    r = lambda *s: torch.randn(*s, device=DEV)
    shapes = {"shared": (b, n, l), "grouped": (b, 1, n, l), "fixed": (d, n)}
    return dict(u=r(b, d, l), delta=0.5 * r(b, d, l), A=-(0.5 + torch.rand(d, n, device=DEV)),
                B=r(*shapes[bc[0]]), C=r(*shapes[bc[1]]), D=r(d), z=r(b, d, l) if z else None,
                delta_bias=0.3 * r(d) if bias else None)


def leaves(x):
    return {k: v.detach().clone().requires_grad_() if v is not None else None
            for k, v in x.items()}


def oracle(x, h0, seq_idx):
    """The float64 sequential scan, each packed sequence on its own (h0 enters the first)."""
    ref = leaves({k: v.double() if v is not None else None for k, v in x.items()})
    h0r = h0.double().requires_grad_() if h0 is not None else None
    l = x["u"].shape[-1]
    bounds = [0, l] if seq_idx is None else [0] + [
        t for t in range(1, l) if seq_idx[0, t] != seq_idx[0, t - 1]] + [l]
    outs, last = [], None
    for i, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        cut = {k: v[..., s:e] if v is not None and (k in ("u", "delta", "z") or (
            k in "BC" and v.ndim > 2)) else v for k, v in ref.items()}
        o, last = selective_scan_sequential(**cut, delta_softplus=True, return_last_state=True,
                                            initial_state=h0r if i == 0 else None)
        outs.append(o)
    return ref, h0r, torch.cat(outs, -1), last


def check(cfg, x, h0=None, seq_idx=None):
    xs, h0l = leaves(x), h0.clone().requires_grad_() if h0 is not None else None
    out, last = selective_scan_fn(**xs, delta_softplus=True, return_last_state=True,
                                  initial_state=h0l, seq_idx=seq_idx, config=cfg)
    ref, h0r, ref_out, ref_last = oracle(x, h0, seq_idx)
    testing.assert_close(out, ref_out, msg="out")
    testing.assert_close(last, ref_last, msg="last state")
    dout, dlast = torch.randn_like(out), torch.randn_like(last)
    torch.autograd.backward([out, last], [dout, dlast])
    torch.autograd.backward([ref_out, ref_last], [dout.double(), dlast.double()])
    for k, v in xs.items():
        if v is not None:
            testing.assert_close(v.grad, ref[k].grad, grad=True, msg=f"d{k}")
    if h0 is not None:
        testing.assert_close(h0l.grad, h0r.grad, grad=True, msg="d initial_state")


def seg_config(n, segments, forward=None, chunk=16):
    """The default config with ``segments`` and the state-outer backward, at a small chunk (the
    forward's tile no longer than it)."""
    cfg = default_config(n, DEV)
    fwd = forward or dict(block_l=min(chunk, cfg.forward.block_l))
    return cfg.replace(chunk=chunk, segments=segments, backward=STATE_OUTER, forward=fwd)


@pytest.mark.parametrize("forward", [None, RECURRENT], ids=["scan", "recurrent"])
@pytest.mark.parametrize("bc,h0", [(("grouped", "fixed"), True), (("fixed", "shared"), False)])
def test_segments_match_the_oracle(forward, bc, h0):
    # 75 steps, chunk 16, 3 segments of 32 (the last 11 steps): every boundary crossed; with
    # h0 the summaries cut each segment in two pieces
    x = make(1, 3, 75, 2, bc)
    cfg = seg_config(2, 3, forward).replace(summary=dict(split=2 if h0 else 1))
    check(cfg, x, torch.randn(1, 3, 2, device=DEV) if h0 else None)


def test_segments_with_packed_sequences():
    # sequences start inside segment 0, exactly on segment 1's first step, and in the last;
    # the summaries cut each segment in two pieces (the second of the last one past l: empty)
    l = 72
    seq_idx = torch.zeros(1, l, dtype=torch.int32, device=DEV)
    for t in (5, 32, 70):
        seq_idx[0, t:] += 1
    x = make(1, 2, l, 3, ("shared", "shared"), z=False)
    cfg = seg_config(3, 3).replace(summary=dict(split=2))
    check(cfg, x, torch.randn(1, 2, 3, device=DEV), seq_idx)


def test_segments_large_n_runtime_state_loop():
    # n > 16: the scan forward's run-time state loop keeps its carries in the segment's slot
    x = make(2, 2, 70, 17, ("shared", "grouped"), bias=False)
    check(seg_config(17, 3, chunk=32).replace(backward=cfgs.Backward(
        "state-outer", block_d=1, num_warps=1)), x)



def test_segment_plan():
    # ⌊slots / programs⌋ segments of whole units, at least MIN_SEGMENT steps: a launch that
    # fills half of H200's 132 SMs × 2 slots or more is not cut
    assert cfgs.segment_plan(None, 256, 2, 4096, 64, 132) == (1, 4096)
    assert cfgs.segment_plan(None, 32, 2, 32768, 64, 132) == (8, 4096)  # b1 d2048
    assert cfgs.segment_plan(None, 32, 2, 1024, 64, 132) == (2, 512)  # MIN_SEGMENT
    assert cfgs.segment_plan(None, 32, 2, 32768, 64, 0) == (1, 32768)  # no SMs: never cut
    assert cfgs.segment_plan(4, 32, 2, 1000, 64, 0) == (4, 256)  # asked for
    assert cfgs.segment_plan(40, 32, 2, 130, 64, 0) == (3, 64)  # at most one per unit
    # summaries: enough one-warp programs to fill the slots, pieces of whole tiles
    assert cfgs.summary_split(8, 4096, 64, cfgs.SUMMARY, 132) == 4  # 7·4·64 of 132·16 slots
    assert cfgs.summary_split(1, 4096, 64, cfgs.SUMMARY, 132) == 1
    with pytest.raises(ValueError, match="segments"):
        default_config(16, "cpu").replace(segments=0)


@pytest.mark.parametrize("layout", ["scan", "recurrent"])
@pytest.mark.parametrize("extras", [True, False], ids=["z-D-bias-softplus", "plain"])
def test_l1_prefetch_and_fast_softplus_match_the_oracle(layout, extras):
    # the L1 hints (`l1_prefetch`) and the MUFU softplus (`fast_softplus`) of the summaries and
    # of the finishing kernels at odd d, n, l, cut in 3 segments of 2 pieces: the float64
    # oracle's output (the interpreter runs the hints' address arithmetic, not the hint, and the
    # softplus' formula with a precise log2)
    x = make(1, 3, 75, 5, ("shared", "shared"), z=extras, bias=extras)
    if not extras:
        x["D"] = None
    else:
        x["delta"] = 4 * x["delta"]  # Δ's softplus on both sides of its series' threshold
    fwd = RECURRENT if layout == "recurrent" else dict(block_l=16)
    fast = dict(l1_prefetch=True, fast_softplus=True)
    cfg = seg_config(5, 3, fwd).replace(forward=fast, summary=dict(split=2, **fast))
    with torch.no_grad():
        out, last = selective_scan_fn(**x, delta_softplus=extras, return_last_state=True,
                                      config=cfg)
        ref = {k: v.double() if v is not None else None for k, v in x.items()}
        want, want_last = selective_scan_sequential(**ref, delta_softplus=extras,
                                                    return_last_state=True)
    testing.assert_close(out, want, msg="out")
    testing.assert_close(last, want_last, msg="last state")


tl = tile.tl  # (Triton as the library imported it: in the interpreter where there is no GPU)
softplus_fast = tile.softplus_fast


@tile.triton.jit
def _softplus_fast_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(y_ptr + i, softplus_fast(tl.load(x_ptr + i, mask=i < n)), mask=i < n)


def test_softplus_fast_against_float64():
    # log(1 + eˣ) across the series threshold (|x| = 4.16), the x > 20 cut and large |x|
    x = torch.cat([torch.linspace(-40, 40, 301), torch.tensor([-4.2, -4.1, 4.1, 4.2, 20.0, 20.5])])
    x = x.to(DEV)
    y = torch.empty_like(x)
    _softplus_fast_kernel[(1,)](x, y, x.numel(), BLOCK=512)
    want = torch.nn.functional.softplus(x.double())
    assert ((y.double() - want).abs() / want).max() < 1e-5


@pytest.mark.parametrize("state_split", [2, 3])
def test_summaries_with_the_states_cut_over_programs(state_split):
    # `Summary.state_split`: a channel tile's n = 6 states summarised by 2 or 3 programs (3 or 2
    # states each, padded to a power of two): the float64 oracle's output and last state
    x = make(2, 3, 75, 6, ("grouped", "fixed"))
    cfg = seg_config(6, 3).replace(summary=dict(split=2, state_split=state_split))
    with torch.no_grad():
        out, last = selective_scan_fn(**x, delta_softplus=True, return_last_state=True,
                                      config=cfg)
        ref = {k: v.double() if v is not None else None for k, v in x.items()}
        want, want_last = selective_scan_sequential(**ref, delta_softplus=True,
                                                    return_last_state=True)
    testing.assert_close(out, want, msg="out")
    testing.assert_close(last, want_last, msg="last state")
    with pytest.raises(ValueError, match="state_split"):
        selective_scan_fn(**x, delta_softplus=True,
                          config=cfg.replace(summary=dict(state_split=4)))
