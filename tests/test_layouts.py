"""Every public kernel on any layout of its arguments, and bad arguments a clear error.

One table of ops (``OPS``, in the spirit of PyTorch's OpInfo): each op draws fresh random inputs
of tiny odd sizes, and runs on views of them with the same values but other memory layouts —
strided (every other element of a larger buffer), transposed (column-major), expanded (stride 0
along a dimension; the values are then constant along it) and a random mix per argument —
against the same call on ``.contiguous()`` copies, forward and (for the differentiable ops)
backward: the gradients with respect to the views must be the contiguous call's. Empty inputs
(b = 0, l = 0) must give empty outputs and the states they were given.

``BAD`` is a table of bad arguments: each must raise a TypeError/ValueError whose message names
the argument. On a CPU everything runs in Triton's interpreter at sizes of a few hundred
elements.
"""

from dataclasses import dataclass, field

import pytest
import torch

from mambalearn import inference
from mambalearn import model as M
from mambalearn.mamba1 import selective_scan_fn, selective_scan_teaching
from mambalearn.mamba2 import mamba_chunk_scan_combined, ssd_fused_forward
from mambalearn.mamba2.step import selective_state_update
from mambalearn.mamba3 import mamba3_mimo_step, mamba3_siso_combined, mamba3_siso_step
from mambalearn.mamba3.mixer import Mamba3Config
from mambalearn.testing import assert_close, tolerance
from mambalearn.triton import scan as tscan

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# PyTorch's own ops (the decode step's oracle) sum over n in an order its CUDA kernels pick by
# layout: the same bits as the contiguous call on the CPU, within float32's tolerance on a GPU
TORCH_EXACT = DEV == "cpu"
LAYOUTS = ("strided", "transposed", "expanded", "mixed")


# ---------------------------------------------------------------------------------------------
# the inputs of every op


def _draw(g):
    """Random float32 / int tensors on the test device, from generator ``g``."""
    r = lambda *s, scale=1.0: (torch.randn(*s, generator=g) * scale).to(DEV)
    u = lambda *s, lo=0.0, hi=1.0: (lo + (hi - lo) * torch.rand(*s, generator=g)).to(DEV)
    return r, u


def mamba1(g, b=2, d=4, l=7, n=3, groups=2):
    r, u = _draw(g)
    seq = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 2, 2, 2, 2, 5]], device=DEV)[:b, :l]
    return dict(u=r(b, d, l), delta=r(b, d, l, scale=0.5), A=-u(d, n, lo=0.5, hi=1.5),
                B=r(b, groups, n, l), C=r(b, groups, n, l), D=r(d), z=r(b, d, l),
                delta_bias=r(d, scale=0.3), delta_softplus=True, return_last_state=True,
                seq_idx=seq, initial_state=r(b, d, n))


def ssd_inputs(g, b=2, l=7, h=4, p=3, g_=2, n=4, seq=True):
    r, u = _draw(g)
    kw = dict(x=r(b, l, h, p), dt=r(b, l, h, scale=0.5) - 1, A=-u(h, lo=0.2, hi=2.0),
              B=r(b, l, g_, n), C=r(b, l, g_, n), chunk_size=4, D=r(h), z=r(b, l, h, p),
              dt_bias=r(h, scale=0.3), initial_states=r(b, h, p, n), dt_softplus=True)
    if seq:
        kw["seq_idx"] = (torch.arange(l, device=DEV)[None] >= torch.tensor([[3], [6]],
                                                                            device=DEV)).long()
    return kw


def step_mamba1(g, b=3, d=5, n=4, slots=5):
    r, u = _draw(g)
    idx = torch.tensor([3, -1, 0, 9, 4, 9], device=DEV)[::2]  # a strided (b,) index: 3, 0, 4
    return dict(state=r(slots, d, n), x=r(b, d), dt=r(b, d), A=-u(d, n, lo=0.5, hi=1.5),
                B=r(b, n), C=r(b, n), D=r(d), z=r(b, d), dt_bias=r(d, scale=0.3),
                dt_softplus=True, state_batch_indices=idx)


def step_mamba2(g, b=2, h=3, p=5, n=4, groups=1):
    r, u = _draw(g)
    return dict(state=r(b, h, p, n), x=r(b, h, p), dt=r(b, h), A=-u(h, lo=0.5, hi=1.5),
                B=r(b, groups, n), C=r(b, groups, n), D=r(h), z=r(b, h, p),
                dt_bias=r(h, scale=0.3), dt_softplus=True)


def mamba3(g, b=1, l=9, h=2, g_=1, n=8, p=3, na=2, states=True):
    r, u = _draw(g)
    DT = u(b, h, l, lo=0.02, hi=0.8)
    kw = dict(Q=r(b, l, g_, n), K=r(b, l, g_, n), V=r(b, l, h, p), ADT=-u(b, h, l) * DT, DT=DT,
              Trap=r(b, h, l), Q_bias=r(h, n), K_bias=r(h, n), Angles=r(b, l, h, na), D=r(h),
              Z=r(b, l, h, p), chunk_size=16, return_final_states=True)
    if states:
        kw["Input_States"] = (u(b, h, na, hi=6.0), r(b, h, p, n), r(b, h, n), r(b, h, p))
    return kw


def mamba3_one(g, b=2, h=2, g_=1, n=8, p=5, na=3):
    kw = mamba3(g, b=b, l=1, h=h, g_=g_, n=n, p=p, na=na)
    kw.pop("chunk_size"), kw.pop("return_final_states")
    return {k: (v[:, 0] if k in ("Q", "K", "V", "Angles", "Z") else
                v[..., 0] if k in ("ADT", "DT", "Trap") else v) for k, v in kw.items()}


def mimo(g, b=2, r_=3, h=2, p=5, n=4, gated=True):
    r, u = _draw(g)
    return dict(state=r(b, h, p, n), Bstate=r(b, r_, h, n), Xstate=r(b, h, p), A=-u(b, h),
                B=r(b, r_, h, n), C=r(b, r_, h, n), D=r(h), x=r(b, h, p), dt=u(b, h),
                trap=u(b, h), xproj=r(r_, h, p), outproj=r(r_, h, p) if gated else None,
                z=r(b, h, p) if gated else None, zproj=r(r_, h, p) if gated else None)


@dataclass
class Op:
    """One public function, its inputs, and what of them autograd and the layouts may touch.

    ``grad``: the arguments to differentiate (none: the op runs under no_grad); ``inplace``: the
    arguments it updates (compared after the call too; never expanded); ``fixed``: arguments
    never expanded (index tensors whose values would become invalid)."""

    name: str
    make: object
    call: object
    grad: tuple = ()
    inplace: tuple = ()
    fixed: tuple = ()
    exact: bool = True  # views give the contiguous call's bits (else: its dtype's tolerance)
    empty: tuple = field(default_factory=tuple)  # ways to empty the input (see _empty)
    grad_layouts: tuple = ("mixed",)  # the layouts whose gradients are compared (time)
    layouts: tuple = LAYOUTS  # a variant of an op already in the table runs fewer (time)
    params: tuple = ("A", "D", "delta_bias", "dt_bias", "Q_bias", "K_bias")  # no batch axis


M1_GRAD = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
SSD_GRAD = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
M3_GRAD = ("Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "Angles", "D", "Z")
OPS = [
    Op("selective_scan_fn", mamba1, selective_scan_fn, M1_GRAD, empty=("b", "l"),
       grad_layouts=("expanded", "mixed")),
    Op("selective_scan_fn (shared B, C)",
       lambda g: dict(mamba1(g), B=mamba1(g)["B"][:, 0], C=mamba1(g)["C"][:, 0]),
       selective_scan_fn),
    Op("selective_scan_fn (fixed B, C)",
       lambda g: dict(mamba1(g), B=_draw(g)[0](4, 3), C=_draw(g)[0](4, 3)), selective_scan_fn,
       layouts=("expanded", "mixed")),
    Op("selective_scan_teaching", mamba1, selective_scan_teaching, M1_GRAD),
    Op("mamba_chunk_scan_combined", lambda g: dict(ssd_inputs(g), return_final_states=True),
       mamba_chunk_scan_combined, SSD_GRAD, empty=("b", "l")),
    Op("mamba_chunk_scan_combined (five stages)",
       lambda g: dict(ssd_inputs(g), return_final_states=True, fused=False),
       mamba_chunk_scan_combined, layouts=("strided", "expanded", "mixed")),
    Op("mamba_chunk_scan_combined (D per channel, no z)",
       lambda g: dict(ssd_inputs(g), D=_draw(g)[0](4, 3), z=None), mamba_chunk_scan_combined,
       layouts=("expanded", "mixed")),
    Op("ssd_fused_forward", ssd_inputs, ssd_fused_forward, empty=("b", "l")),
    Op("ssd_fused_forward (one launch)",
       lambda g: dict(ssd_inputs(g, seq=False), launches=1), ssd_fused_forward),
    Op("selective_state_update (Mamba-1, slots)", step_mamba1, selective_state_update,
       inplace=("state",), fixed=("state_batch_indices",)),
    Op("selective_state_update (Mamba-2)", step_mamba2, selective_state_update,
       inplace=("state",), empty=("b",)),
    Op("decode_step (Mamba-1, slots)", step_mamba1,
       lambda dt, dt_bias, dt_softplus, **kw: inference.decode_step(
           delta=dt, delta_bias=dt_bias, delta_softplus=dt_softplus, **kw), inplace=("state",),
       fixed=("state_batch_indices",), exact=TORCH_EXACT),
    Op("selective_state_update (Mamba-2, untied A and dt)",
       lambda g: dict(step_mamba2(g), A=-_draw(g)[1](3, 5, 4, lo=0.5, hi=1.5),
                      dt=_draw(g)[0](2, 3, 5)), selective_state_update, inplace=("state",)),
    Op("decode_step (Mamba-2)", step_mamba2,
       lambda dt, dt_bias, dt_softplus, **kw: inference.decode_step(
           delta=dt, delta_bias=dt_bias, delta_softplus=dt_softplus, **kw), inplace=("state",),
       exact=TORCH_EXACT),
    Op("mamba3_siso_combined", mamba3, mamba3_siso_combined, M3_GRAD, exact=False,
       empty=("b", "l")),
    Op("mamba3_siso_step", mamba3_one, mamba3_siso_step, empty=("b",)),
    Op("mamba3_mimo_step", mimo, mamba3_mimo_step, inplace=("state",), empty=("b",),
       params=("D", "xproj", "outproj", "zproj")),
    Op("triton.scan.scan", lambda g: dict(a=_draw(g)[1](3, 2, 13), b=_draw(g)[0](3, 2, 13)),
       tscan.scan),
]


# ---------------------------------------------------------------------------------------------
# layouts: the same values in other memory


def relayout(t, how, dim):
    """``t``'s values in another layout (a differentiable function of ``t``): ``how`` is
    "strided" (every other element of a buffer twice as long in the last dim), "transposed"
    (column-major memory) or "expanded" (t's slice 0 along ``dim``, broadcast along it: other
    values, constant along ``dim``)."""
    if how == "strided":
        return torch.stack([t, torch.zeros_like(t)], dim=-1).flatten(-2)[..., ::2]
    if how == "transposed":
        perm = tuple(reversed(range(t.ndim)))
        return t.permute(perm).contiguous().permute(perm)
    return t.narrow(dim, 0, 1).expand(t.shape)


def views(kw, how, op, g):
    """Every tensor argument of ``kw`` in layout ``how``; "mixed": argument i in layout
    (i + a random offset) mod 4 of (contiguous, strided, transposed, expanded), so that every
    layout meets other ones in one call and each argument gets each layout over runs."""
    offset = int(torch.randint(4, (1,), generator=g))
    order = iter(range(offset, offset + 10**6))

    def one(name, t):
        if not isinstance(t, torch.Tensor) or t.ndim == 0:
            return t
        pick = how
        if how == "mixed":
            pick = ("contiguous", *LAYOUTS[:3])[next(order) % 4]
        long_dims = [i for i, s in enumerate(t.shape) if s > 1]
        if pick == "expanded" and (name in op.inplace + op.fixed or not long_dims):
            pick = "strided"  # an in-place or index argument keeps its values
        if pick == "contiguous":
            return t
        dim = long_dims[int(torch.randint(len(long_dims), (1,), generator=g))] if long_dims \
            else 0
        return relayout(t, pick, dim)

    return {k: (tuple(one(f"{k}{i}", s) for i, s in enumerate(v)) if isinstance(v, tuple)
                else one(k, v)) for k, v in kw.items()}


def contiguous(kw):
    c = lambda t: t.detach().contiguous() if isinstance(t, torch.Tensor) else t
    return {k: (tuple(c(s) for s in v) if isinstance(v, tuple) else c(v)) for k, v in kw.items()}


def outputs(res):
    """The op's tensors, flattened: out, then any states (lists and tuples unpacked)."""
    if isinstance(res, torch.Tensor):
        return [res]
    return [t for r in res for t in outputs(r)]


def run(op, kw, grads_of):
    """``op`` on ``kw``; returns (outputs, in-place arguments after, gradients w.r.t. the
    arguments named ``grads_of`` of a fixed random projection of the outputs)."""
    kw = {k: (v.clone() if k in op.inplace else v) for k, v in kw.items()}
    with torch.set_grad_enabled(bool(grads_of)):
        outs = outputs(op.call(**kw))
        grads = []
        if grads_of:
            g = torch.Generator().manual_seed(0)
            loss = sum((o.float() * torch.randn(o.shape, generator=g).to(o.device)).sum()
                       for o in outs if o.is_floating_point())
            grads = torch.autograd.grad(loss, [kw[k] for k in grads_of], allow_unused=True)
    return outs, [kw[k] for k in op.inplace], grads


def same(got, want, exact, what):
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    rtol, atol = (0.0, 0.0) if exact else tolerance(want.dtype)
    assert_close(got, want, rtol=rtol, atol=atol, msg=what)


CASES = [(op, how) for op in OPS for how in op.layouts]


@pytest.mark.parametrize("op, how", CASES, ids=[f"{o.name}-{h}" for o, h in CASES])
def test_any_layout_gives_the_contiguous_answer(op, how):
    seed = torch.seed() % 2**31
    g = torch.Generator().manual_seed(seed)
    base = op.make(g)
    grads_of = [k for k in op.grad if base.get(k) is not None] if how in op.grad_layouts else []
    if grads_of:  # the views are functions of leaves, so gradients flow back to them
        base = {k: (v.detach().requires_grad_() if k in grads_of else v) for k, v in base.items()}
    kw = views(base, how, op, g)
    if how == "expanded" or how == "mixed":  # the reference: the same values, contiguous
        want_kw = contiguous(kw)
    else:
        want_kw = contiguous(base)
    if grads_of:
        want_kw = {k: (v.requires_grad_() if k in grads_of else v) for k, v in want_kw.items()}
    got, got_inplace, got_grads = run(op, kw, grads_of)
    want, want_inplace, want_grads = run(op, want_kw, grads_of)
    where = f"{op.name}, {how} (seed {seed})"
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        same(a, b, op.exact, f"{where}: output {i}")
    for name, a, b in zip(op.inplace, got_inplace, want_inplace, strict=True):
        same(a, b, op.exact, f"{where}: {name} after the call")
    for name, a, b in zip(grads_of, got_grads, want_grads, strict=True):
        if b is None:
            assert a is None, f"{where}: d{name}"
            continue
        rtol, atol = (0.0, 0.0) if op.exact else tolerance(b.dtype, grad=True)
        assert_close(a, b, rtol=rtol, atol=atol, msg=f"{where}: d{name}")


def _empty(op, kw, dim):
    """``kw`` with the batch (``dim`` = "b") or the time axis ("l") cut to 0."""
    time = {"u": -1, "delta": -1, "z": -1, "B": -1, "C": -1, "seq_idx": -1,
            "x": 1, "dt": 1, "Q": 1, "K": 1, "V": 1, "Angles": 1, "Z": 1, "ADT": -1, "DT": -1,
            "Trap": -1}
    if op.name.startswith(("mamba_chunk", "ssd_fused")):
        time.update(z=1, B=1, C=1)
    if op.name.startswith("mamba3_siso_combined"):
        time.update(Z=1)
    out = {}
    for k, v in kw.items():
        if isinstance(v, tuple):  # the Mamba-3 states: batch first
            out[k] = tuple(s[:0] for s in v) if dim == "b" else v
        elif not isinstance(v, torch.Tensor) or v.ndim == 0:
            out[k] = v
        elif dim == "l":
            out[k] = v.narrow(time[k], 0, 0) if k in time else v
        else:  # every per-token tensor has the batch first; the parameters do not
            out[k] = v if k in op.params else v[:0]
    return out


EMPTY = [(op, dim) for op in OPS for dim in op.empty]


@pytest.mark.parametrize("op, dim", EMPTY, ids=[f"{o.name}, {d} = 0" for o, d in EMPTY])
def test_empty_input_gives_an_empty_output(op, dim):
    kw = _empty(op, op.make(torch.Generator().manual_seed(1)), dim)
    with torch.no_grad():
        res = op.call(**{k: (v.clone() if k in op.inplace else v) for k, v in kw.items()})
    outs = outputs(res)
    assert outs[0].numel() == 0, op.name
    given = kw.get("initial_state", kw.get("initial_states", kw.get("Input_States")))
    if dim == "l" and given is not None:  # the states come out as they went in
        given = given if isinstance(given, tuple) else (given,)
        for a, b in zip(outs[1:1 + len(given)], given, strict=True):
            assert_close(a, b.to(a.dtype), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# values the kernels once mishandled, each against an equivalent call


def test_seq_idx_past_int32_is_not_wrapped():
    """seq_idx values ≥ 2³² name other sequences: a plain int32 cast would merge 0 and 2³²."""
    kw = mamba1(torch.Generator().manual_seed(2))
    big = torch.tensor([[0, 0, 2**32, 2**32, 2**32, 2**33, 2**33],
                        [5, 5, 5, 5, 2**40, 2**40, 7]], device=DEV)
    small = torch.tensor([[0, 0, 1, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1, 2]], device=DEV,
                         dtype=torch.int32)
    got = selective_scan_fn(**dict(kw, seq_idx=big))
    want = selective_scan_fn(**dict(kw, seq_idx=small))
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, rtol=0, atol=0)
    kw = ssd_inputs(torch.Generator().manual_seed(2))  # SSD compares the ids as int64 as given
    got = mamba_chunk_scan_combined(**dict(kw, seq_idx=kw["seq_idx"] << 33))
    assert_close(got, mamba_chunk_scan_combined(**kw), rtol=0, atol=0)


def test_bf16_under_the_interpreter_matches_float32():
    """bf16 inputs in the SSD kernels' matmuls (Triton's CPU interpreter multiplies bf16 bit
    patterns unless patched): the result must be the float32 call's, to bf16 accuracy."""
    kw = ssd_inputs(torch.Generator().manual_seed(3), seq=False)
    half = {k: (v.bfloat16() if k in ("x", "B", "C", "z") else v) for k, v in kw.items()}
    rounded = {k: (v.float() if k in ("x", "B", "C", "z") else v) for k, v in half.items()}
    got = mamba_chunk_scan_combined(**half)
    want = mamba_chunk_scan_combined(**rounded)
    assert_close(got, want.bfloat16(), norm=True, rtol=2e-2)


def test_mamba3_step_without_channels_still_turns_the_angles():
    """p = 0: no state to update, but the angle and the rotated k of the cache are defined."""
    from mambalearn.mamba3.step_reference import mamba3_siso_step_ref

    kw = mamba3_one(torch.Generator().manual_seed(5))
    ang, ssm, k, v = kw["Input_States"]
    kw = dict(kw, V=kw["V"][..., :0], Z=kw["Z"][..., :0],
              Input_States=(ang, ssm[:, :, :0], k, v[..., :0]))
    got, want = outputs(mamba3_siso_step(**kw)), outputs(mamba3_siso_step_ref(**kw))
    for a, b in zip(got, want, strict=True):
        assert_close(a, b.to(a.dtype))


def test_generate_zero_new_tokens_is_empty():
    m = M.MambaLM(M.MambaConfig(vocab_size=8, d_model=8, n_layers=1, d_state=2)).eval()
    out = m.generate(torch.zeros(2, 3, dtype=torch.long), 0)
    assert out.shape == (2, 0) and out.dtype == torch.long


# ---------------------------------------------------------------------------------------------
# bad input: a TypeError / ValueError naming the argument


def _g():
    return torch.Generator().manual_seed(4)


def _meta(kw, name):
    return dict(kw, **{name: kw[name].to("meta")})


def ssd_default():
    """The SSD kernels' default config at a tiny shape on this device."""
    from mambalearn.mamba2.config import default_config
    return default_config((1, 64, 2, 4, 1, 8, 16), torch.device(DEV))


def _grad(kw, name):
    return dict(kw, **{name: kw[name].clone().requires_grad_()})


def _lifted_adt():
    kw = mamba3_one(_g())
    return mamba3_siso_step(**dict(kw, ADT=kw["ADT"][..., None]))


def _expanded_state():
    kw = step_mamba2(_g())
    return selective_state_update(**dict(kw, state=kw["state"][:1].expand_as(kw["state"])))


BAD = [
    # the Mamba-1 scan
    ("meta u", lambda: selective_scan_fn(**_meta(mamba1(_g()), "u")), ValueError, "meta"),
    ("float seq_idx", lambda: selective_scan_fn(**dict(mamba1(_g()), seq_idx=torch.zeros(
        2, 7, device=DEV))), TypeError, "seq_idx must be an integer"),
    ("n = 0", lambda: selective_scan_fn(**dict(mamba1(_g()), A=torch.zeros(4, 0, device=DEV),
                                            B=torch.zeros(2, 2, 0, 7, device=DEV),
                                            C=torch.zeros(2, 2, 0, 7, device=DEV),
                                            initial_state=None)), ValueError, "n = 0"),
    # SSD
    ("dt_limit of three", lambda: mamba_chunk_scan_combined(
        **dict(ssd_inputs(_g()), dt_limit=(0, 1, 2))), ValueError, "dt_limit"),
    ("dt_limit reversed", lambda: mamba_chunk_scan_combined(
        **dict(ssd_inputs(_g()), dt_limit=(1.0, 0.5))), ValueError, "dt_limit"),
    ("chunk 2^20", lambda: mamba_chunk_scan_combined(
        **dict(ssd_inputs(_g()), chunk_size=2**20, fused=False)), ValueError, "chunk_size"),
    ("chunk 24", lambda: mamba_chunk_scan_combined(**dict(ssd_inputs(_g()), chunk_size=24)),
     ValueError, "chunk_size"),
    ("chunk 4.0", lambda: mamba_chunk_scan_combined(**dict(ssd_inputs(_g()), chunk_size=4.0)),
     TypeError, "chunk_size"),
    ("float64 x", lambda: ssd_fused_forward(**{k: (v.double() if k in "xBC" else v) for k, v in
                                               ssd_inputs(_g()).items()}), TypeError, "float64"),
    ("config as a dict", lambda: ssd_fused_forward(**ssd_inputs(_g()), config={"bogus": 1}),
     TypeError, "config must be"),
    ("unknown config field", lambda: ssd_default().replace(bogus=1), ValueError, "bogus"),
    ("unknown nested config field", lambda: ssd_default().replace(states=dict(bogus=1)),
     ValueError, "states has no field bogus"),
    ("fused forward with grad", lambda: ssd_fused_forward(**_grad(ssd_inputs(_g()), "x")),
     ValueError, "x requires grad"),
    ("meta dt", lambda: mamba_chunk_scan_combined(**_meta(ssd_inputs(_g()), "dt")), ValueError,
     "meta"),
    ("float seq_idx (SSD)", lambda: mamba_chunk_scan_combined(**dict(
        ssd_inputs(_g()), seq_idx=torch.zeros(2, 7, device=DEV))), TypeError, "seq_idx"),
    # the decode step
    ("float state_batch_indices", lambda: inference.decode_step(**{
        **{k: v for k, v in step_mamba1(_g()).items() if k not in ("dt", "dt_bias",
                                                                   "dt_softplus")},
        "delta": step_mamba1(_g())["dt"], "state_batch_indices": torch.zeros(3, device=DEV)}),
     TypeError, "state_batch_indices must be an integer"),
    ("duplicate slots", lambda: selective_state_update(**dict(
        step_mamba1(_g()), state_batch_indices=torch.tensor([1, 1, 0], device=DEV))),
     ValueError, "state_batch_indices has a slot used by two rows"),
    ("step with grad", lambda: selective_state_update(**_grad(step_mamba2(_g()), "state")),
     ValueError, "state requires grad"),
    ("expanded state", _expanded_state, ValueError, "state is updated in place"),
    ("Mamba-1 step x (b, d+1)", lambda: selective_state_update(**dict(
        step_mamba2(_g()), x=torch.zeros(2, 3, 6, device=DEV))), ValueError,
     r"x must have shape \(2, 3, 5\)"),
    # Mamba-3
    ("lifted shapes", _lifted_adt, ValueError, r"ADT must have shape \(2, 2\), got \(2, 2, 1\)"),
    ("siso step with grad", lambda: mamba3_siso_step(**_grad(mamba3_one(_g()), "V")),
     ValueError, "V requires grad"),
    ("mimo int x", lambda: mamba3_mimo_step(**dict(mimo(_g()), x=torch.zeros(
        2, 2, 5, dtype=torch.long, device=DEV))), TypeError, "x must be a real floating"),
    ("mimo xproj shape", lambda: mamba3_mimo_step(**dict(mimo(_g()), xproj=torch.zeros(
        2, 2, 5, device=DEV))), ValueError, "xproj must have shape"),
    ("mimo Xstate shape", lambda: mamba3_mimo_step(**dict(mimo(_g()), Xstate=torch.zeros(
        2, 2, 4, device=DEV))), ValueError, "Xstate must have shape"),
    ("mimo A shape", lambda: mamba3_mimo_step(**dict(mimo(_g()), A=torch.zeros(
        2, 3, device=DEV))), ValueError, "A must have shape"),
    ("mimo dt shape", lambda: mamba3_mimo_step(**dict(mimo(_g()), dt=torch.zeros(
        3, 2, device=DEV))), ValueError, "dt must have shape"),
    ("mimo state dtype", lambda: mamba3_mimo_step(**dict(mimo(_g()), state=torch.zeros(
        2, 2, 5, 4, device=DEV, dtype=torch.bfloat16))), TypeError, "state must be float32"),
    ("mimo z without zproj", lambda: mamba3_mimo_step(**dict(mimo(_g()), zproj=None)),
     ValueError, "zproj"),
    ("mamba3 chunk 24", lambda: mamba3_siso_combined(**dict(mamba3(_g()), chunk_size=24)),
     ValueError, "chunk_size"),
    ("mamba3 float64 V", lambda: mamba3_siso_combined(**dict(mamba3(_g()), V=mamba3(
        _g())["V"].double())), TypeError, "V is torch.float64"),
    # the model
    *[(f"MambaConfig({k}={v})", lambda k=k, v=v: M.MambaConfig(**{k: v}), ValueError, k)
      for k, v in (("n_layers", -1), ("d_state", 0), ("d_model", 0), ("expand", 0),
                   ("d_conv", 0), ("vocab_size", 0), ("headdim", 0), ("ngroups", 0),
                   ("dt_rank", -1), ("chunk_size", 0), ("step_backend", "nope"),
                   ("backend", "nope"))],
    ("MambaConfig(d_state=2.5)", lambda: M.MambaConfig(d_state=2.5), TypeError, "d_state"),
    ("Mamba-2 heads", lambda: M.MambaConfig(block="mamba2", headdim=24), ValueError,
     "headdim"),
    ("Mamba3Config(rope_fraction=-1)", lambda: Mamba3Config(rope_fraction=-1), ValueError,
     "rope_fraction"),
    ("Mamba3Config(d_state=7)", lambda: Mamba3Config(d_state=7), ValueError, "d_state"),
    ("generate(temperature=-1)", lambda: _lm().generate(torch.zeros(1, 3, dtype=torch.long), 2,
                                                        temperature=-1), ValueError,
     "temperature"),
    ("generate(n_new=-1)", lambda: _lm().generate(torch.zeros(1, 3, dtype=torch.long), -1),
     ValueError, "n_new"),
    ("generate(float prompt)", lambda: _lm().generate(torch.zeros(1, 3), 2), TypeError,
     "prompt"),
    ("soft float mask", lambda: _lm()(torch.zeros(1, 3, dtype=torch.long),
                                      mask=torch.full((1, 3), 0.5)), TypeError, "mask"),
]


def _lm():
    return M.MambaLM(M.MambaConfig(vocab_size=8, d_model=8, n_layers=1, d_state=2)).eval()


@pytest.mark.parametrize("call, error, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_is_a_clear_error(call, error, words):
    with pytest.raises(error, match=words):
        call()


def test_the_tables_cover_every_kind():
    """Every layout, and an empty case for every family; bad input for each family."""
    names = " ".join(o.name for o in OPS)
    for kernel in ("selective_scan_fn", "selective_scan_teaching", "mamba_chunk_scan_combined",
                   "ssd_fused_forward", "selective_state_update", "decode_step",
                   "mamba3_siso_combined", "mamba3_siso_step", "mamba3_mimo_step"):
        assert kernel in names, kernel
    assert {d for _, d in EMPTY} == {"b", "l"}
