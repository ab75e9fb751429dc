"""Chapter 12: the decode step (oracle and Triton kernel), the causal conv step, scan by steps."""

import pytest
import torch

from mambalearn import inference
from mambalearn.mamba2.step import StepConfig, selective_state_update
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"


def mamba1_inputs(b, d, n, g, dtype=torch.float32, state_dtype=torch.float32):
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(DEV)
    return dict(
        state=r(b, d, n).to(state_dtype), x=r(b, d).to(dtype), dt=r(b, d).to(dtype),
        A=-torch.exp(r(d, n)), B=r(b, n).to(dtype), C=r(b, n).to(dtype), D=r(d),
        z=r(b, d).to(dtype), dt_bias=r(d) * 0.5,
    )


def mamba2_inputs(b, h, p, n, groups, g, dtype=torch.float32, state_dtype=torch.float32):
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(DEV)
    return dict(
        state=r(b, h, p, n).to(state_dtype), x=r(b, h, p).to(dtype), dt=r(b, h).to(dtype),
        A=-torch.exp(r(h)), B=r(b, groups, n).to(dtype), C=r(b, groups, n).to(dtype), D=r(h),
        z=r(b, h, p).to(dtype), dt_bias=r(h) * 0.5,
    )


def run_both(inp, **kw):
    """Kernel and oracle on copies of the same state; the oracle in float64 where possible."""
    s_kernel = inp["state"].clone()
    s_oracle = inp["state"].to(torch.float64)
    args = {k: v for k, v in inp.items() if k != "state"}
    args.update(kw)
    tune = {k: args.pop(k) for k in ("block_p", "num_warps", "stream", "loads_first")
            if k in args}
    out = selective_state_update(s_kernel, **args, config=StepConfig(**tune))
    a = {k: (v.to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else v)
         for k, v in args.items()}
    want = inference.decode_step(s_oracle, a.pop("x"), a.pop("dt"), a.pop("A"), a.pop("B"),
                                 a.pop("C"), a.pop("D"), a.pop("z"), a.pop("dt_bias"),
                                 a.pop("dt_softplus", False), **a)
    return out, want, s_kernel, s_oracle


@pytest.mark.parametrize("softplus", [False, True])
@pytest.mark.parametrize("drop", [(), ("D",), ("z",), ("dt_bias",), ("D", "z", "dt_bias")])
def test_mamba1_layout_matches_oracle(softplus, drop):
    g = torch.Generator().manual_seed(hash((softplus, drop)) % 2**31)
    inp = mamba1_inputs(3, 7, 5, g)  # odd sizes: masks on both tile axes
    for k in drop:
        inp[k] = None
    out, want, s, s_ref = run_both(inp, dt_softplus=softplus)
    assert out.shape == inp["x"].shape and out.dtype == inp["x"].dtype
    assert_close(s, s_ref, msg="state")
    assert_close(out, want, msg="out")


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_mamba2_layout_matches_oracle(groups):
    g = torch.Generator().manual_seed(groups)
    inp = mamba2_inputs(2, 4, 3, 6, groups, g)
    out, want, s, s_ref = run_both(inp, dt_softplus=True)
    assert_close(s, s_ref, msg="state")
    assert_close(out, want, msg="out")


def test_mamba2_mamba_ssm_broadcast_layout_takes_tied_path():
    """mamba_ssm's Mamba-2 passes A (h, p, n), dt (b, h, p), D/dt_bias (h, p) with stride 0."""
    g = torch.Generator().manual_seed(1)
    inp = mamba2_inputs(2, 3, 5, 4, 1, g)
    b, h, p, n = inp["state"].shape
    full = dict(inp, A=inp["A"][:, None, None].expand(h, p, n),
                dt=inp["dt"][..., None].expand(b, h, p), D=inp["D"][:, None].expand(h, p),
                dt_bias=inp["dt_bias"][:, None].expand(h, p))
    out, want, s, s_ref = run_both(full, dt_softplus=True)
    assert_close(s, s_ref)
    assert_close(out, want)
    # an untied A (a different decay per row and state) takes the general path
    untied = dict(full, A=-torch.rand(h, p, n, generator=g, dtype=torch.float64).to(DEV))
    out, want, s, s_ref = run_both(untied, dt_softplus=True)
    assert_close(s, s_ref)
    assert_close(out, want)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_bf16_inputs_and_state(state_dtype):
    g = torch.Generator().manual_seed(7)
    inp = mamba2_inputs(2, 2, 4, 8, 1, g, dtype=torch.bfloat16, state_dtype=state_dtype)
    out, want, s, s_ref = run_both(inp, dt_softplus=True)
    assert s.dtype == state_dtype and out.dtype == torch.bfloat16
    assert_close(s, s_ref, dtype=state_dtype)  # the state is only rounded once, on the store
    assert_close(out, want, dtype=torch.bfloat16)


def test_non_contiguous_state_and_inputs_update_in_place():
    g = torch.Generator().manual_seed(3)
    inp = mamba1_inputs(2, 6, 4, g)
    base = torch.randn(2, 4, 6, generator=g).to(DEV)
    state = base.transpose(1, 2)  # (b, d, n), not contiguous: the kernel must write through
    inp["state"] = state
    inp["x"] = torch.randn(6, 2, generator=g).to(DEV).t()  # (b, d) non-contiguous
    ref_state = state.clone().double()
    a = {k: v for k, v in inp.items() if k != "state"}
    out = selective_state_update(state, **a, dt_softplus=True)
    want = inference.decode_step(ref_state, a["x"], a["dt"], a["A"], a["B"], a["C"], a["D"], a["z"],
                                 a["dt_bias"], True)
    assert_close(base.transpose(1, 2), ref_state, msg="state written through the view")
    assert_close(out, want)


def test_state_batch_indices_and_padding_rows():
    g = torch.Generator().manual_seed(4)
    inp = mamba2_inputs(3, 2, 3, 4, 1, g)
    pool = torch.randn(5, 2, 3, 4, generator=g).to(DEV)  # 5 slots, 3 rows this step
    idx = torch.tensor([4, -1, 0], device=DEV)
    inp["state"] = pool
    out, want, s, s_ref = run_both(inp, dt_softplus=True, state_batch_indices=idx)
    assert_close(s, s_ref)
    assert_close(out, want)
    assert bool((out[1] == 0).all()) and torch.equal(s[1:4], pool[1:4])  # untouched slots


def test_repeated_steps_equal_the_full_scan():
    """l decode steps from h = 0 reproduce the sequential scan, outputs and last state."""
    g = torch.Generator().manual_seed(5)
    b, d, n, l = 2, 3, 4, 9
    r = lambda *s: torch.randn(*s, generator=g).to(DEV)  # the kernel runs where the GPU is
    u, delta, z = (r(b, d, l) for _ in range(3))
    A = -torch.exp(r(d, n))
    B, C = (r(b, n, l) for _ in range(2))
    D, bias = r(d), r(d)
    want, h_want = selective_scan_sequential(u, delta, A, B, C, D, z, bias, True,
                                             return_last_state=True)
    state = torch.zeros(b, d, n, device=DEV)
    outs = [selective_state_update(state, u[..., t], delta[..., t], A, B[..., t], C[..., t], D,
                                   z[..., t], bias, True) for t in range(l)]
    assert_close(torch.stack(outs, -1), want)
    assert_close(state, h_want)


def test_scan_by_steps_mask_initial_state_and_seq_idx():
    g = torch.Generator().manual_seed(6)
    b, d, n, l = 2, 3, 2, 10
    u, delta = torch.randn(b, d, l, generator=g), torch.randn(b, d, l, generator=g)
    A = -torch.exp(torch.randn(d, n, generator=g))
    B, C = torch.randn(b, n, l, generator=g), torch.randn(b, n, l, generator=g)
    D, h0 = torch.randn(d, generator=g), torch.randn(b, d, n, generator=g)
    mask = torch.rand(b, l, generator=g) > 0.3
    got, h = inference.scan_by_steps(u, delta, A, B, C, D, delta_softplus=True, initial_state=h0,
                                     mask=mask)
    want, h_want = selective_scan_sequential(u, delta, A, B, C, D, delta_softplus=True, mask=mask,
                                             initial_state=h0, return_last_state=True)
    assert_close(got, want)
    assert_close(h, h_want)
    # two sequences packed in one row = the two run separately
    seq_idx = torch.tensor([[0] * 4 + [1] * 6] * b)
    got, h = inference.scan_by_steps(u, delta, A, B, C, D, delta_softplus=True, seq_idx=seq_idx)
    first = selective_scan_sequential(u[..., :4], delta[..., :4], A, B[..., :4], C[..., :4], D,
                                      delta_softplus=True)
    second, h2 = selective_scan_sequential(u[..., 4:], delta[..., 4:], A, B[..., 4:], C[..., 4:], D,
                                           delta_softplus=True, return_last_state=True)
    assert_close(got, torch.cat([first, second], -1))
    assert_close(h, h2)


def test_initial_state_contribution_is_linearity():
    g = torch.Generator().manual_seed(8)
    b, d, n, l = 2, 4, 3, 7
    u, delta = torch.randn(b, d, l, generator=g), torch.rand(b, d, l, generator=g)
    A = -torch.exp(torch.randn(d, n, generator=g))
    B, C = torch.randn(b, 2, n, l, generator=g), torch.randn(b, 2, n, l, generator=g)
    h0 = torch.randn(b, d, n, generator=g)
    want, h_want = selective_scan_sequential(u, delta, A, B, C, initial_state=h0,
                                             return_last_state=True)
    zero, h_zero = selective_scan_sequential(u, delta, A, B, C, return_last_state=True)
    y_extra, h_extra = inference.initial_state_contribution(delta, A, C, h0)
    assert_close(zero + y_extra, want)
    assert_close(h_zero + h_extra, h_want)


def test_causal_conv_full_chunked_and_stepwise_agree():
    g = torch.Generator().manual_seed(9)
    b, d, k, l = 2, 5, 4, 11
    x, w, bias = torch.randn(b, d, l, generator=g), torch.randn(d, k, generator=g), torch.randn(d)
    conv = torch.nn.Conv1d(d, d, k, groups=d, padding=k - 1)
    with torch.no_grad():
        conv.weight.copy_(w[:, None]), conv.bias.copy_(bias)
        want = conv(x)[..., :l]
    full, state_full = inference.causal_conv1d(x, w, bias)
    assert_close(full, want)
    # chunks of 2, 3, 6 (the first shorter than k) continue from the carried state
    state, parts = None, []
    for lo, hi in ((0, 2), (2, 5), (5, l)):
        y, state = inference.causal_conv1d(x[..., lo:hi], w, bias, state)
        parts.append(y)
    assert_close(torch.cat(parts, -1), want)
    assert torch.equal(state, state_full)
    state = torch.zeros(b, d, k)
    steps = [inference.causal_conv1d_step(x[..., t], state, w, bias) for t in range(l)]
    assert_close(torch.stack(steps, -1), want)
    assert torch.equal(state, state_full)


def test_bad_inputs_raise_clear_errors():
    g = torch.Generator().manual_seed(10)
    inp = mamba1_inputs(2, 3, 4, g)
    with pytest.raises(ValueError, match="A must have shape"):
        selective_state_update(**dict(inp, A=torch.randn(3, 5, device=DEV)))
    with pytest.raises(ValueError, match="x must have shape"):
        selective_state_update(**dict(inp, x=torch.randn(2, 4, device=DEV)))
    with pytest.raises(TypeError, match="B must be a real floating"):
        selective_state_update(**dict(inp, B=torch.ones(2, 4, dtype=torch.int64, device=DEV)))
    with pytest.raises(ValueError, match="state must have"):
        selective_state_update(**dict(inp, state=torch.randn(2, 3, device=DEV)))
    inp2 = mamba2_inputs(2, 3, 2, 4, 1, g)
    with pytest.raises(ValueError, match="groups"):
        wrong = torch.randn(2, 2, 4, device=DEV)  # 2 groups for 3 heads
        selective_state_update(**dict(inp2, B=wrong, C=wrong))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_real_size_on_gpu():
    g = torch.Generator().manual_seed(11)
    inp = mamba2_inputs(64, 80, 64, 128, 1, g)
    out, want, s, s_ref = run_both(inp, dt_softplus=True)
    assert_close(s, s_ref)
    assert_close(out, want)


@pytest.mark.parametrize("block_p,num_warps,stream", [(2, 1, True), (4, 4, False)])
def test_tiles_smaller_than_the_head_dim(block_p, num_warps, stream):
    """Several tiles per head (odd p: the last one partly masked), slots in another order."""
    g = torch.Generator().manual_seed(12)
    inp = mamba2_inputs(3, 2, 5, 4, 2, g)  # 3 · 2 · ⌈5 / 2⌉ = 18 tiles of 2 rows
    idx = torch.tensor([2, -1, 0], device=DEV)
    out, want, s, s_ref = run_both(inp, dt_softplus=True, state_batch_indices=idx,
                                   block_p=block_p, num_warps=num_warps, stream=stream)
    assert_close(s, s_ref)
    assert_close(out, want)


def test_small_and_large_batches_pick_their_tiles():
    from mambalearn.mamba2 import step

    # a small state (b1, b4): 8-row tiles over one warp (the H200's sweep), kept in L2 (not
    # evicted first) between tokens; already FILL programs an SM and more, so no further cut
    assert 80 * 64 // 8 >= step.FILL * step.SMS
    assert step._tile(64, 128, 1 * 80 * 64 * 128) == (8, 1, False)
    assert step._tile(64, 128, 4 * 80 * 64 * 128) == (8, 1, False)  # b4: still small
    assert step._tile(64, 128, 64 * 80 * 64 * 128) == (32, 8, True)  # b64: streamed
    assert step._tile(3, 5, 10) == (4, 1, False)  # never wider than the head dim needs
    assert step._tile(2048, 16, 2048 * 16) == (8, 1, False)  # never below a warp's 128 values


def test_slot_past_the_state_is_a_clear_error():
    g = torch.Generator().manual_seed(13)
    inp = mamba2_inputs(2, 3, 4, 8, 1, g)
    before = inp["state"].clone()
    for bad in ([0, 2], [5, -1]):
        idx = torch.tensor(bad, device=DEV)
        with pytest.raises(ValueError, match="state_batch_indices must be < the state's batch 2"):
            selective_state_update(**inp, state_batch_indices=idx)
    assert torch.equal(inp["state"], before)  # rejected before any write


def test_slot_past_the_state_is_masked_in_the_kernel(monkeypatch):
    """What runs while a CUDA graph is captured (no host check): rows whose slot lies past the
    state touch no memory outside it and write NaN; the other rows are updated as usual."""
    monkeypatch.setattr(inference, "check_slot_values", lambda idx, slots: None)  # as under
    # capture
    g = torch.Generator().manual_seed(14)
    b, h, p, n = 3, 2, 4, 8
    inp = mamba2_inputs(b, h, p, n, 1, g)
    # the state is rows 1…2 of a buffer of 4 rows: rows 0 and 3 are guards that must not change
    buf = torch.randn(4, h, p, n, generator=g, dtype=torch.float64).to(DEV).float()
    guards = buf[[0, 3]].clone()
    state = buf[1:3]
    idx = torch.tensor([1, 2, 7], device=DEV)  # 2 and 7 are past a state of 2 rows
    args = {k: v for k, v in inp.items() if k != "state"}
    want_state = state.double().clone()
    a = {k: (v.double() if torch.is_tensor(v) else v) for k, v in args.items()}
    sub = lambda v: None if v is None else v[:1]
    want = inference.decode_step(want_state[1:2], *(sub(a[k]) for k in ("x", "dt")), a["A"],
                                 *(sub(a[k]) for k in ("B", "C")), a["D"], sub(a["z"]),
                                 a["dt_bias"], True)
    out = selective_state_update(state, **args, dt_softplus=True, state_batch_indices=idx)
    assert torch.equal(buf[[0, 3]], guards)  # nothing written outside the state
    # slot 1 updated by row 0, slot 0 untouched
    assert_close(state.double(), want_state, dtype=torch.float32)
    assert_close(out[:1].double(), want, dtype=torch.float32)
    assert out[1:].isnan().all()  # the rejected rows say so


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_gpu_graph_capture_masks_slots_past_the_state():
    """Under CUDA-graph capture the host cannot look at the slots; the kernel masks them: the
    replayed graph writes NaN for those rows and nothing outside the state."""
    g = torch.Generator().manual_seed(15)
    b, h, p, n = 3, 4, 64, 128
    inp = mamba2_inputs(b, h, p, n, 1, g)
    buf = torch.randn(4, h, p, n, device=DEV)
    guards, state = buf[[0, 3]].clone(), buf[1:3]
    args = {k: v for k, v in inp.items() if k != "state"}
    idx = torch.tensor([1, -1, 9], device=DEV)
    warm = torch.tensor([1, -1, 0], device=DEV)  # the kernel built before capture (valid slots)
    selective_state_update(state, **args, dt_softplus=True, state_batch_indices=warm)
    before = state.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = selective_state_update(state, **args, dt_softplus=True, state_batch_indices=idx)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(buf[[0, 3]], guards) and torch.equal(state[0], before[0])
    assert out[2].isnan().all() and (out[1] == 0).all() and not out[0].isnan().any()


# the three ways `_tile` can go, set up at cheap sizes: a small state cut until the grid fills
# the SMs (FILL, cut down to one warp's VALUES_PER_WARP here: a few heads never fill 132 SMs), a
# small state in TILE_SMALL tiles (FILL 0), and a large one (TILE_LARGE, streamed)
TILE_BRANCHES = {"fill": dict(), "small": dict(FILL=0), "large": dict(SMALL_STATE=0)}


@pytest.mark.parametrize("branch", list(TILE_BRANCHES))
@pytest.mark.parametrize("layout,p,n,drop", [
    ("mamba2", 3, 17, ()), ("mamba2", 33, 5, ("z",)), ("mamba2", 65, 17, ("D", "dt_bias")),
    ("mamba1", 33, 17, ("D", "z", "dt_bias")), ("mamba1", 65, 5, ())])
def test_every_tile_choice_matches_oracle(monkeypatch, branch, layout, p, n, drop):
    """Odd head dims and state sizes (masked rows and columns, a last tile cut short) with and
    without z, D and dt_bias, through each branch of the launcher's own tile choice."""
    from mambalearn.mamba2 import step

    for name, value in TILE_BRANCHES[branch].items():
        monkeypatch.setattr(step, name, value)
    g = torch.Generator().manual_seed(hash((branch, layout, p, n)) % 2**31)
    inp = mamba2_inputs(2, 2, p, n, 1, g) if layout == "mamba2" else mamba1_inputs(2, p, n, g)
    for k in drop:
        inp[k] = None
    heads = 2 if layout == "mamba2" else 1
    block_p, warps, stream = step._tile(p, n, inp["x"].shape[0] * heads * p * n)
    bn = 1 << (n - 1).bit_length()  # BLOCK_N: n rounded up to a power of two
    if branch == "fill":  # cut to one warp's values: several tiles a head, the last one short
        assert block_p * bn <= step.VALUES_PER_WARP < 2 * block_p * bn and p % block_p
    else:  # the branch's own tile: as many rows as its values allow, never wider than the head
        values = (step.TILE_LARGE if branch == "large" else step.TILE_SMALL)[0]
        assert block_p == max(1, min(1 << (p - 1).bit_length(), values // bn))
        assert stream == (branch == "large") and warps >= 1
    out, want, s, s_ref = run_both(inp, dt_softplus=True)
    assert_close(s, s_ref, msg="state")
    assert_close(out, want, msg="out")


@pytest.mark.parametrize("block_p,num_warps", [(64, 8), (4, 4)])
def test_first_versions_load_order_gives_the_same_answer(block_p, num_warps):
    """``loads_first=False`` (D and z loaded after the state's store, kept to time against) with
    an odd head dim and state size, z, D and dt_bias."""
    g = torch.Generator().manual_seed(16)
    inp = mamba2_inputs(2, 2, 33, 17, 1, g)
    out, want, s, s_ref = run_both(inp, dt_softplus=True, block_p=block_p,
                                   num_warps=num_warps, loads_first=False)
    assert_close(s, s_ref, msg="state")
    assert_close(out, want, msg="out")
