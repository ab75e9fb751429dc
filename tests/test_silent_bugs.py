"""The course's own kernels held to chapter 17's lessons, at tiny sizes in Triton's CPU interpreter.

* int32 edges: the interpreter does int32 arithmetic as the GPU does (it wraps), so a CPU test can
  catch a narrow offset — but only by computing offsets past 2³¹, which the public launchers do not
  expose without a tensor that large. The launches past 2³¹ elements need a GPU:
  tests/test_past_2_31.py (SSD and Mamba-3, fwd+bwd) and tests/test_huge.py (Mamba-1, the decode
  step), marked ``gpu``.
* masks at every tile edge: lengths block − 1, block, block + 1 of the CPU configuration's tile
  (Mamba-1's time block, SSD's chunk, the decode step's head-dim block), forward and gradients
  against the float64 oracles.
* non-finite inputs: A very negative (exp(ΔA) underflows to 0) and A = −∞ (forget at once) give
  finite outputs and gradients, the oracle's (at −∞ its limit); a NaN in one token of one sequence
  stays in that sequence, from that token on — except SSD's, which reaches the earlier steps of
  its chunk (0 · NaN in the chunk's tl.dot): a strict xfail, with the reason, and the chunked
  kernels' docstrings say so.
* determinism: the same inputs twice give bitwise equal outputs and gradients; a sequence's output
  and its own gradients do not depend on its position in the batch (parameter gradients, summed
  over the batch, may).
"""

import pytest
import torch

from mambalearn import silent
from mambalearn.mamba1 import selective_scan_fn
from mambalearn.mamba1.config import default_config
from mambalearn.mamba2 import mamba_chunk_scan_combined
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba2.step import StepConfig, selective_state_update
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.testing import assert_close

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter sizes"),
    # −∞ − (−∞) in the interpreter's numpy: the NaN these tests look for, not a fault of the test
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]
BLOCK_L = default_config(2, "cpu").forward.block_l  # Mamba-1's time tile in the interpreter
CHUNK = 4  # SSD's chunk here (a tile edge every 4 steps)


def m1_inputs(b, d, l, n, seed, A_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    u, delta, z = r(b, d, l), torch.rand(b, d, l, generator=g) * 0.5, r(b, d, l)
    A = -A_scale * (torch.rand(d, n, generator=g) + 0.5)
    return dict(u=u, delta=delta, A=A, B=r(b, n, l), C=r(b, n, l), D=r(d), z=z)


def ssd_inputs(b, l, h, p, n, seed, A_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    A = -A_scale * (torch.rand(h, generator=g) + 0.5)
    return dict(x=r(b, l, h, p), dt=torch.rand(b, l, h, generator=g) * 0.5, A=A, B=r(b, l, 1, n),
                C=r(b, l, 1, n), D=r(h))


def _run(fn, kw, grad, w):
    """out = fn(**kw) and the gradients of ⟨w, out⟩ (w: seeded, unless given) w.r.t. every input."""
    kw = {k: v.detach().clone().requires_grad_(grad) for k, v in kw.items()}
    out = fn(**kw)
    if not grad:
        return out.detach(), {}
    if w is None:
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    grads = torch.autograd.grad(out, list(kw.values()), w.to(out.dtype))
    return out.detach(), dict(zip(kw, grads, strict=True))


def run_m1(kw, grad=True, w=None):
    return _run(selective_scan_fn, kw, grad, w)


def oracle_m1(kw):
    kw64 = {k: v.detach().double().requires_grad_() for k, v in kw.items()}
    out = selective_scan_sequential(**kw64)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).double()  # _run's w
    grads = torch.autograd.grad(out, list(kw64.values()), w)
    return out.detach(), dict(zip(kw64, grads, strict=True))


def run_ssd(kw, grad=True, w=None):
    return _run(lambda **k: mamba_chunk_scan_combined(**k, chunk_size=CHUNK), kw, grad, w)


def oracle_ssd(kw):
    kw64 = {k: v.detach().double().requires_grad_() for k, v in kw.items()}
    out = ssd.mamba_chunk_scan_ref(**kw64, chunk_size=CHUNK)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).double()  # _run's w
    grads = torch.autograd.grad(out, list(kw64.values()), w)
    return out.detach(), dict(zip(kw64, grads, strict=True))


def same_as_oracle(got, want, what):
    out, grads = got
    ref, ref_grads = want
    assert_close(out, ref, msg=f"{what}: out")
    for k, gr in grads.items():
        assert torch.isfinite(gr).all(), f"{what}: d{k} not finite"
        assert_close(gr, ref_grads[k], grad=True, msg=f"{what}: d{k}")


# --- int32 edges ----------------------------------------------------------------------------------

def test_the_interpreter_wraps_int32_as_the_gpu_does():
    """The check of the check: a CPU test of offsets past 2³¹ sees the wrap (then the fix)."""
    rows, stride = 9, 2**28
    exact = torch.arange(rows)[:, None] * stride + torch.arange(3)  # (rows, 3) int64
    assert torch.equal(silent.tile_offsets(rows, stride, 3, wide=False), silent.wraps_int32(exact))
    assert torch.equal(silent.tile_offsets(rows, stride, 3, wide=True), exact)


# --- masks at every tile edge ---------------------------------------------------------------------

@pytest.mark.parametrize("l", [BLOCK_L - 1, BLOCK_L, BLOCK_L + 1])
def test_mamba1_at_the_tile_edges(l):
    kw = m1_inputs(1, 3, l, 2, seed=l)
    same_as_oracle(run_m1(kw), oracle_m1(kw), f"Mamba-1, l = {l} (block {BLOCK_L})")


@pytest.mark.parametrize("l", [CHUNK - 1, CHUNK, CHUNK + 1])
def test_ssd_at_the_chunk_edges(l):
    kw = ssd_inputs(1, l, 2, 3, 4, seed=l)
    same_as_oracle(run_ssd(kw), oracle_ssd(kw), f"SSD, l = {l} (chunk {CHUNK})")


@pytest.mark.parametrize("p", [3, 4, 5])
def test_decode_step_at_the_head_dim_block_edges(p):
    """The decode step with its head-dim block at 4: p = 3, 4, 5 (a tile past p writes outside
    the state's row, e.g. into the next head's)."""
    g = torch.Generator().manual_seed(p)
    b, h, n = 2, 2, 4
    state = torch.randn(b, h, p, n, generator=g)
    x, dt = torch.randn(b, h, p, generator=g), torch.rand(b, h, generator=g)
    A, B, C = -torch.rand(h, generator=g) - 0.5, torch.randn(b, 1, n, generator=g), \
        torch.randn(b, 1, n, generator=g)
    D = torch.randn(h, generator=g)
    want_state = torch.exp(dt * A)[..., None, None] * state + \
        (dt[..., None, None] * B[:, :, None, :] * x[..., None])  # (b, h, p, n)
    want = (want_state * C[:, :, None, :]).sum(-1) + D[:, None] * x  # (b, h, p)
    poisoned = torch.full((b, h + 1, p, n), float("nan"))[:, :h]  # NaN after the last head
    poisoned.copy_(state)
    out = selective_state_update(poisoned, x, dt, A, B, C, D, config=StepConfig(block_p=4))
    assert_close(out, want)
    assert_close(poisoned, want_state)


# --- non-finite inputs ----------------------------------------------------------------------------

def test_mamba1_with_a_very_negative_A():
    kw = m1_inputs(1, 3, 2 * BLOCK_L + 3, 2, seed=1, A_scale=1e4)  # exp(ΔA) underflows to 0
    same_as_oracle(run_m1(kw), oracle_m1(kw), "Mamba-1, A ≈ −1e4")


def test_ssd_with_a_very_negative_A():
    kw = ssd_inputs(1, 2 * CHUNK + 3, 2, 3, 4, seed=1, A_scale=1e4)
    same_as_oracle(run_ssd(kw), oracle_ssd(kw), "SSD, A ≈ −1e4")


def _minus_inf_A(family):
    if family == "mamba1":
        kw = m1_inputs(1, 3, 2 * BLOCK_L + 1, 2, seed=1)
        kw["A"][1, 0] = -float("inf")  # one (channel, state) forgets everything at once
        return kw, run_m1, lambda k: selective_scan_sequential(**k)
    kw = ssd_inputs(1, 2 * CHUNK + 1, 2, 3, 4, seed=1)
    kw["A"][1] = -float("inf")  # one head
    return kw, run_ssd, lambda k: ssd.mamba_chunk_scan_ref(**k, chunk_size=CHUNK)


def test_mamba1_forward_with_A_minus_inf():
    kw, run, ref = _minus_inf_A("mamba1")
    out, _ = run(kw, grad=False)
    assert_close(out, ref({k: v.double() for k, v in kw.items()}))


def _finite_limit(kw, family):
    """The same inputs with A = −∞ replaced by −1e6: exp(Δ A) and A exp(Δ A) are 0 to float64
    for every Δ here, the limit the kernels must give at A = −∞ (the float64 oracles' autograd
    takes −∞ · 0 = NaN there)."""
    kw = {k: v.clone() for k, v in kw.items()}
    kw["A"] = torch.where(kw["A"] == -float("inf"), -1e6, kw["A"])
    return oracle_m1(kw) if family == "mamba1" else oracle_ssd(kw)


M1_BACKWARDS = ["default", "runtime-loop 32x16w2", "state-outer 2x64w1 flip3", "deterministic",
                "teaching", "a GPU's settings, cut"]


@pytest.mark.parametrize("backward", M1_BACKWARDS)
def test_mamba1_gradients_with_A_minus_inf(backward):
    """dΔ holds A Ā_t h_{t−1} = −∞ · 0 at A = −∞, Δ = 0 past l makes exp(0 · (−∞)) a NaN that
    the reverse scan carries back, and dB, shared by every channel, would carry either to all of
    them: every backward (the sub-block and both state-outer kernels, the deterministic sum, the
    teaching kernel) takes the limit, 0. So does a sequence cut into segments with a GPU's tiles
    (chapter 09's cut; its summaries met Δ = 0 past l with A = −∞ in exp(Δ A))."""
    from mambalearn.mamba1 import selective_scan_teaching
    from mambalearn.mamba1.config import BACKWARD_VARIANTS

    kw, _, _ = _minus_inf_A("mamba1")
    if backward == "teaching":
        fn = selective_scan_teaching
    elif backward.endswith("cut"):  # 3 segments of the GPU's chunks, the last one partly past l
        kw = m1_inputs(1, 2, 70, 4, seed=1)
        kw["A"][::2, ::3] = -float("inf")
        cfg = default_config(4, "cuda", 70).replace(segments=3)
        fn = lambda **k: selective_scan_fn(**k, config=cfg)  # noqa: E731
    else:
        cfg = default_config(2, "cpu")
        if backward == "deterministic":
            cfg = cfg.replace(deterministic=True)
        elif backward != "default":
            cfg = cfg.replace(backward=BACKWARD_VARIANTS[backward])
        fn = lambda **k: selective_scan_fn(**k, config=cfg)  # noqa: E731
    same_as_oracle(_run(fn, kw, True, None), _finite_limit(kw, "mamba1"),
                   f"Mamba-1, A = −∞, {backward}")


def test_ssd_with_A_minus_inf():
    """SSD's chunks take exp(a_t − a_s) of the in-chunk cumsum a of Δ A, and −∞ − (−∞) = NaN:
    the kernels floor Δ A at −1e30, so the forward is the sequential recurrence's and the
    gradients its limit."""
    kw, run, _ = _minus_inf_A("ssd")
    got = run(kw)
    want = ssd.ssd_sequential(**{k: kw[k].double() for k in ("x", "dt", "A", "B", "C")})[0]
    want = want + kw["D"].double()[:, None] * kw["x"].double()
    assert_close(got[0], want, msg="SSD, A = −∞: out vs the sequential recurrence")
    same_as_oracle(got, _finite_limit(kw, "ssd"), "SSD, A = −∞")


@pytest.mark.parametrize("launches", [1, 2])
def test_ssd_fused_forward_with_A_minus_inf(launches):
    """The fused forwards (one launch: its own cumsum) at the smallest chunk they run, l odd."""
    from mambalearn.mamba2.common import FUSED_MIN_CHUNK
    from mambalearn.mamba2.fused.forward import ssd_fused_forward

    q = FUSED_MIN_CHUNK
    kw = ssd_inputs(1, q + 3, 2, 4, 4, seed=3)  # p, n = 4: 16-byte rows, the fused path
    kw["A"][0] = -float("inf")
    out, _ = ssd_fused_forward(**kw, chunk_size=q, launches=launches)
    want = ssd.ssd_sequential(**{k: kw[k].double() for k in ("x", "dt", "A", "B", "C")})[0]
    assert_close(out, want + kw["D"].double()[:, None] * kw["x"].double())


def test_ssd_reference_with_A_minus_inf():
    """The chunked oracle itself: finite, the recurrence's forward and finite gradients."""
    kw, _, _ = _minus_inf_A("ssd")
    kw64 = {k: v.double().requires_grad_() for k, v in kw.items()}
    out = ssd.mamba_chunk_scan_ref(**kw64, chunk_size=CHUNK)
    want = ssd.ssd_sequential(**{k: kw[k].double() for k in ("x", "dt", "A", "B", "C")})[0]
    assert_close(out, want + kw["D"].double()[:, None] * kw["x"].double())
    grads = torch.autograd.grad(out.sum(), list(kw64.values()))
    assert all(torch.isfinite(g).all() for g in grads)


def _nan_steps(out, time_dim):
    """The steps of one sequence's output (time along ``time_dim``) that hold a NaN."""
    return out.isnan().movedim(time_dim, 0).flatten(1).any(1).nonzero().flatten().tolist()


def test_mamba1_keeps_a_nan_in_its_channel_from_its_step_on():
    l, t0 = 2 * BLOCK_L + 1, BLOCK_L + 1
    kw = m1_inputs(2, 3, l, 2, seed=2)
    kw["u"][0, 1, t0] = float("nan")
    out, _ = run_m1(kw, grad=False)  # (b, d, l)
    assert torch.isfinite(out[1]).all(), "a NaN in sequence 0 reached sequence 1"
    assert torch.isfinite(out[0, [0, 2]]).all(), "a NaN in channel 1 reached other channels"
    assert _nan_steps(out[0], 1) == list(range(t0, l)), "the NaN reached steps before its own"


def _ssd_with_a_nan(t0):
    kw = ssd_inputs(2, 3 * CHUNK, 2, 3, 4, seed=2)
    kw["x"][0, t0, 0, 1] = float("nan")
    return run_ssd(kw, grad=False)[0]  # (b, l, h, p)


def test_ssd_keeps_a_nan_in_its_sequence_and_out_of_earlier_chunks():
    """What mamba_chunk_scan_combined's docstring says a NaN in x does: in the interpreter it
    reaches its chunk from the chunk's first step on, in its head and channel only."""
    t0 = CHUNK + 1  # the second step of chunk 1
    out = _ssd_with_a_nan(t0)  # the NaN at (0, t0, head 0, channel 1)
    assert torch.isfinite(out[1]).all(), "a NaN in sequence 0 reached sequence 1"
    assert _nan_steps(out[0], 0) == list(range(CHUNK, 3 * CHUNK)), "not from its chunk's start on"
    assert torch.isfinite(out[0, :, 1]).all() and torch.isfinite(out[0, :, 0, [0, 2]]).all(), \
        "a NaN in x reached another head or channel"


@pytest.mark.parametrize("name", ["dt", "B", "C"])
def test_ssd_keeps_a_nan_in_dt_B_C_from_its_step_on(name):
    """A NaN in dt, B or C at t0 reaches no step before t0: the causal masks are wheres."""
    t0 = CHUNK + 1
    kw = ssd_inputs(2, 3 * CHUNK, 2, 3, 4, seed=2)
    kw[name][(0, t0) + (0,) * (kw[name].ndim - 2)] = float("nan")
    out = run_ssd(kw, grad=False)[0]
    assert torch.isfinite(out[1]).all(), f"a NaN in {name} of sequence 0 reached sequence 1"
    assert min(_nan_steps(out[0], 0)) == t0, f"a NaN in {name} reached a step before its own"


@pytest.mark.xfail(strict=True, reason="SSD's intra-chunk product (L ∘ C Bᵀ) X multiplies the NaN "
                   "of step t0 by L_ts = 0 for the chunk's earlier steps t inside one tl.dot, and "
                   "0 · NaN = NaN: a NaN reaches the steps of its chunk before it (documented in "
                   "the kernels; ssd.mamba_chunk_scan_ref and mamba_ssm's chunk scan, a tl.dot "
                   "of the masked cb and x, do the same)")
def test_ssd_keeps_a_nan_out_of_earlier_steps_of_its_chunk():
    t0 = CHUNK + 1
    assert min(_nan_steps(_ssd_with_a_nan(t0)[0], 0)) == t0


# --- determinism ----------------------------------------------------------------------------------

def _bitwise(a, b, what):
    out_a, grads_a = a
    out_b, grads_b = b
    assert torch.equal(out_a, out_b), f"{what}: out differs"
    for k in grads_a:
        assert torch.equal(grads_a[k], grads_b[k]), f"{what}: d{k} differs"


PER_SEQUENCE = {"mamba1": ("u", "delta", "B", "C", "z"), "ssd": ("x", "dt", "B", "C")}


@pytest.mark.parametrize("family", ["mamba1", "ssd"])
def test_bitwise_twice_and_independent_of_the_batch_position(family):
    """The same inputs twice: bitwise equal outputs and gradients. Rows 0 and 1 swapped (and the
    output weights with them): each sequence's output and its own gradients are bitwise those of
    the unswapped batch."""
    if family == "mamba1":
        run, kw = run_m1, m1_inputs(2, 3, 2 * BLOCK_L + 1, 2, seed=4)
        w = torch.randn(kw["u"].shape, generator=torch.Generator().manual_seed(5))  # (b, d, l)
    else:
        run, kw = run_ssd, ssd_inputs(2, 2 * CHUNK + 1, 2, 3, 4, seed=4)
        w = torch.randn(kw["x"].shape, generator=torch.Generator().manual_seed(5))  # (b, l, h, p)
    first = run(kw, w=w)
    _bitwise(first, run(kw, w=w), f"{family}, two runs")
    out, grads = first
    swapped = {k: v.flip(0) if k in PER_SEQUENCE[family] else v for k, v in kw.items()}
    out_s, grads_s = run(swapped, w=w.flip(0))
    assert torch.equal(out, out_s.flip(0)), f"{family}: a sequence's output depends on its row"
    for k in PER_SEQUENCE[family]:
        assert torch.equal(grads[k], grads_s[k].flip(0)), f"{family}: d{k} depends on the row"


# --- Mamba-3: ADT = −∞ (its log-decay comes per step) -----------------------------------------

def _m3_grads(fn, kw, names, states=None, **extra):
    """out and the gradients of a seeded projection of out w.r.t. every input in ``names``."""
    x = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in kw.items()}
    out = fn(**x, Input_States=states, **extra)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (out.double() * w).sum().backward()
    return out.detach(), {k: x[k].grad for k in names if x[k] is not None}


@pytest.mark.parametrize("where", ["head", "steps"])
def test_mamba3_siso_with_ADT_minus_inf(where):
    """One head forgetting at every step, or two steps of every head (one mid-chunk, one at a
    chunk's end): the forward is the recurrence's, the gradients its limit (ADT → −1e6)."""
    from mambalearn import mamba3
    from mambalearn.mamba3 import mamba3_siso_combined
    from tests.test_mamba3 import NAMES, make

    kw = make(b=1, l=37, h=2, g=1, n=8, p=4, na=3, seed=5)
    if where == "head":
        kw["ADT"][:, 1] = -float("inf")
    else:
        kw["ADT"][:, :, [6, 15]] = -float("inf")
    f32 = {k: v.float() for k, v in kw.items()}
    out, grads = _m3_grads(mamba3_siso_combined, f32, NAMES, chunk_size=16)
    assert torch.isfinite(out).all(), f"ADT = −∞ ({where}): out not finite"
    assert_close(out, mamba3.mamba3_siso_sequential(**kw), msg=f"ADT = −∞ ({where}): out")
    limit = dict(kw, ADT=torch.where(kw["ADT"] == -float("inf"), -1e6, kw["ADT"]))
    _, want = _m3_grads(mamba3.mamba3_siso_sequential, limit, NAMES)
    for k, g in grads.items():
        assert torch.isfinite(g).all(), f"ADT = −∞ ({where}): d{k} not finite"
        assert_close(g, want[k], grad=True, msg=f"ADT = −∞ ({where}): d{k}")


def test_mamba3_mimo_with_ADT_minus_inf():
    from mambalearn.mamba3 import mamba3_mimo_combined
    from mambalearn.mamba3 import mimo_reference as mimo
    from tests.test_mamba3_mimo import inputs

    x, _ = inputs(seed=4, r=2, l=19, h=2, g=1, p=5, n=12, states=False, dtype=torch.float64)
    x["ADT"][:, 0] = -float("inf")  # one head
    x["ADT"][:, 1, 9] = -float("inf")  # one step of the other, mid-chunk
    names = [k for k, v in x.items() if v is not None]
    f32 = {k: None if v is None else v.float() for k, v in x.items()}
    out, grads = _m3_grads(mamba3_mimo_combined, f32, names, chunk_size=8)
    assert torch.isfinite(out).all(), "MIMO, ADT = −∞: out not finite"
    assert_close(out, mimo.mamba3_mimo_sequential(**x), msg="MIMO, ADT = −∞: out")
    limit = dict(x, ADT=torch.where(x["ADT"] == -float("inf"), -1e6, x["ADT"]))
    _, want = _m3_grads(mimo.mamba3_mimo_sequential, limit, names)
    for k, g in grads.items():
        assert torch.isfinite(g).all(), f"MIMO, ADT = −∞: d{k} not finite"
        assert_close(g, want[k], grad=True, msg=f"MIMO, ADT = −∞: d{k}")


# --- where a NaN goes in Mamba-3 (the docstrings of mamba3_siso_combined, mamba3_mimo_combined) ---

M3_CHUNK = 16


def _m3_nan_run(family, name, t0):
    """Batch row 0 gets a NaN at step t0 in ``name`` (head 0, one element); the output."""
    if family == "siso":
        from mambalearn.mamba3 import mamba3_siso_combined as fn
        from tests.test_mamba3 import make

        kw = {k: v.float() for k, v in make(b=2, l=2 * M3_CHUNK + 7, h=2, g=1, n=8, p=4, na=3,
                                            seed=t0).items()}
        extra = dict(chunk_size=M3_CHUNK)
    else:
        from mambalearn.mamba3 import mamba3_mimo_combined as fn
        from tests.test_mamba3_mimo import inputs

        kw, _ = inputs(seed=t0, r=2, l=2 * 8 + 5, h=2, g=1, p=4, n=8, states=False,
                       dtype=torch.float32)
        extra = dict(chunk_size=8)
    where = {"V": (0, t0, 0, 1), "ADT": (0, 0, t0), "DT": (0, 0, t0)}.get(name)
    if where is None:  # Q, K: (b, l, [r,] g, n)
        where = (0, t0) + (0,) * (kw[name].ndim - 3) + (2,)
    kw[name][where] = float("nan")
    with torch.no_grad():
        return fn(**kw, **extra), extra["chunk_size"]


@pytest.mark.parametrize("family", ["siso", "mimo"])
@pytest.mark.parametrize("name", ["Q", "K", "DT", "ADT", "V"])
def test_mamba3_keeps_a_nan_from_its_step_on(family, name):
    """A NaN at step t0 (mid-chunk) of sequence 0: sequence 1 stays finite, and the NaN reaches
    no step before t0 — except from V, which reaches back to its chunk's first step (0 · NaN in
    the chunk's tl.dot, as the docstrings say) and only V's channel."""
    t0 = 19 if family == "siso" else 11  # inside the second chunk
    out, q = _m3_nan_run(family, name, t0)  # (b, l, h, p)
    assert torch.isfinite(out[1]).all(), f"{family}: a NaN in {name} of sequence 0 reached 1"
    steps = _nan_steps(out[0], 0)
    assert steps, f"{family}: a NaN in {name} vanished"
    first = (t0 // q) * q if name == "V" else t0
    assert min(steps) == first, f"{family}: a NaN in {name} at {t0} reached step {min(steps)}"
    if name == "V":
        assert torch.isfinite(out[0][..., [0, 2, 3]]).all(), f"{family}: V's NaN left its channel"
