"""Chapter 12: the decode step's launch variants (the 3-D grid, D as one scalar a head, the fast
softplus, programmatic dependent launch, the sweep's tiles) against the float64 oracle: odd
sizes, masks at both tile edges, slots with padding."""

import pytest
import torch

from mambalearn import inference
from mambalearn.mamba2 import step
from mambalearn.mamba2.step import StepConfig, selective_state_update
from mambalearn.testing import assert_close

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TILES = [(1, 1), (2, 1), (4, 2)]  # (block_p, num_warps): p = 5 ends inside every tile but 1
ALL = dict(grid_3d=True, scalar_d=True, fast_softplus=True, pdl=True)


def inputs(b, h, p, n, slots, seed, tied=True, with_z=True, groups=1):
    """Mamba-2's layout (one Δ and A per head) or, untied, a Δ per row and an A per state value;
    bf16 x/B/C/z, fp32 state and parameters, a state pool of ``slots`` rows."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    inp = dict(state=r(slots, h, p, n).float(), x=r(b, h, p).bfloat16(),
               B=r(b, groups, n).bfloat16(), C=r(b, groups, n).bfloat16(), D=r(h).float(),
               z=r(b, h, p).bfloat16() if with_z else None, dt_bias=(0.5 * r(h)).float())
    if tied:
        inp.update(dt=r(b, h).float(), A=-torch.exp(r(h)).float())
    else:
        inp.update(dt=r(b, h, p).float(), A=-torch.exp(r(h, p, n)).float(),
                   D=r(h, p).float(), dt_bias=(0.5 * r(h, p)).float())
    return {k: (v.to(DEV) if v is not None else None) for k, v in inp.items()}


def check(inp, idx=None, **fields):
    """The kernel under ``StepConfig(**fields)`` against ``inference.decode_step`` in float64."""
    s = inp["state"].clone()
    s64 = inp["state"].double()
    a = {k: v for k, v in inp.items() if k != "state"}
    out = selective_state_update(s, **a, dt_softplus=True, state_batch_indices=idx,
                                 config=StepConfig(**fields))
    d = {k: (v.double() if v is not None else None) for k, v in a.items()}
    want = inference.decode_step(s64, d["x"], d["dt"], d["A"], d["B"], d["C"], d["D"], d["z"],
                                 d["dt_bias"], True, state_batch_indices=idx)
    assert_close(s, s64, msg=f"state {fields}")
    assert_close(out, want, dtype=torch.bfloat16, msg=f"out {fields}")
    return out, s


@pytest.mark.parametrize("tile", TILES, ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("with_z", [True, False], ids=["z", "no z"])
def test_variants_match_the_oracle_at_odd_sizes_with_slots(tile, with_z):
    """Every new field on; p = 5 over 1-, 2- and 4-row tiles (the last one part empty), n = 6 in
    an 8-wide block, three rows mapped into a pool of four slots with one padding row (out 0, no
    slot touched)."""
    inp = inputs(3, 3, 5, 6, slots=4, seed=tile[0] + 8 * with_z, with_z=with_z)
    idx = torch.tensor([3, -1, 0], device=DEV)
    out, s = check(inp, idx, block_p=tile[0], num_warps=tile[1], **ALL)
    assert bool((out[1] == 0).all())
    assert torch.equal(s[1:3], inp["state"][1:3])  # slots no row names are untouched


@pytest.mark.parametrize("field", sorted(ALL))
def test_each_field_alone(field):
    check(inputs(2, 3, 5, 6, slots=2, seed=len(field)), block_p=2, num_warps=1, **{field: True})


@pytest.mark.parametrize("stream", [False, True])
def test_variants_untied_heads_and_a_tile_wider_than_the_head(stream):
    """Mamba-1's path (Δ per row, A per state value, D per row: scalar_d does not apply) with a
    8-row tile over p = 3 and 2 warps, several batch rows and heads (each grid axis longer than
    one)."""
    check(inputs(3, 2, 3, 5, slots=3, seed=9, tied=False), block_p=8, num_warps=2,
          stream=stream, **ALL)


def test_fast_softplus_over_its_whole_range():
    """dt + bias from −30 to 30 across heads: both sides of x = 20 (softplus(x) = x) and of
    e^−|x| = 1/64 (the series branch), where the fast softplus switches formula. From h = 0 with
    x = B = 1 the new state is Δ itself, read to 2e-5 (its bound: ~1e-5), far tighter than the
    state's usual tolerance; the out and the state against the oracle as everywhere."""
    inp = inputs(4, 16, 3, 4, slots=4, seed=3)
    inp["dt"] = torch.linspace(-30, 30, 64, device=DEV).reshape(4, 16)
    inp["A"] = -torch.rand(16, device=DEV) * 0.05  # a decay that keeps large Δ in range
    inp["state"].zero_()
    inp["x"] = torch.ones_like(inp["x"])
    inp["B"] = torch.ones_like(inp["B"])
    _, s = check(inp, block_p=2, num_warps=1, fast_softplus=True)
    delta = torch.nn.functional.softplus(inp["dt"].double() + inp["dt_bias"].double())
    assert_close(s, delta[:, :, None, None].expand(s.shape), rtol=2e-5, atol=0.0,
                 msg="Δ = softplus(dt + bias)")


@pytest.mark.parametrize("groups", [2, 4])
def test_grid_3d_with_several_b_c_groups(groups):
    """One B/C group takes a launch without the head-to-group division; several keep it."""
    check(inputs(2, 4, 3, 5, slots=2, seed=groups, groups=groups), block_p=2, num_warps=1,
          grid_3d=True)


def test_grid_3d_falls_back_to_one_axis_past_the_grid_limit(monkeypatch):
    monkeypatch.setattr(step, "GRID_YZ", 2)  # 3 heads: past the (patched) limit
    check(inputs(2, 3, 4, 4, slots=2, seed=5), block_p=2, num_warps=1, grid_3d=True)


def test_variant_fields_must_be_booleans():
    for name in ALL:
        with pytest.raises(TypeError, match=f"config.{name} must be None, True or False"):
            StepConfig(**{name: 1})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a Hopper (or later) GPU")
@pytest.mark.parametrize("tile", [(4, 1), (32, 8)], ids=["4x1", "32x8"])
def test_gpu_pdl_steps_in_one_graph_follow_each_other(tile):
    """Five steps replayed from one CUDA graph, each launched with programmatic dependent
    launch: every step must wait for the one before (it reads the state that one writes) — the
    state after the replay equals five oracle steps, and each step's output its own."""
    inp = inputs(2, 4, 64, 128, slots=2, seed=21)
    s = inp["state"].clone()
    s64 = inp["state"].double()
    a = {k: v for k, v in inp.items() if k != "state"}
    d = {k: v.double() for k, v in a.items()}
    fields = dict(block_p=tile[0], num_warps=tile[1], **ALL)
    selective_state_update(s.clone(), **a, dt_softplus=True, config=StepConfig(**fields))  # build
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [selective_state_update(s, **a, dt_softplus=True, config=StepConfig(**fields))
                for _ in range(5)]
    graph.replay()
    torch.cuda.synchronize()
    for i in range(5):
        want = inference.decode_step(s64, d["x"], d["dt"], d["A"], d["B"], d["C"], d["D"],
                                     d["z"], d["dt_bias"], True)
        assert_close(outs[i], want, dtype=torch.bfloat16, msg=f"step {i}")
    assert_close(s, s64, msg="state after five steps")
