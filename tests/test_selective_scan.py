"""The chapter-09 Triton selective scan (tuned and teaching kernels) against the sequential oracle.

CPU: Triton's interpreter at tiny sizes, forward and every gradient vs autograd through the
float64 oracle, for every argument combination. GPU (marker ``gpu``): real sizes in bf16/fp32.
"""

import dataclasses

import pytest
import torch

from mambalearn import testing
from mambalearn.mamba1 import config as cfgs
from mambalearn.mamba1 import default_config, selective_scan_fn
from mambalearn.mamba1.args import MAX_DSTATE
from mambalearn.mamba1.kernel import selective_scan_teaching
from mambalearn.scan.sequential import selective_scan_sequential

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
NAMES = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias"]


def small(n, **changes):
    """The default config for n states on this device; on the CPU a chunk of 16 steps (2
    sub-blocks of the 8-step CPU tile), so tiny sequences still cross chunk and sub-block
    boundaries in the tuned backward. ``changes``: `Config.replace` arguments."""
    cfg = default_config(n, DEV)
    return cfg.replace(**({} if GPU else dict(chunk=16)), **changes)


def tuned(**kw):
    """selective_scan_fn with `small`'s config (n from A)."""
    return selective_scan_fn(**kw, config=small(kw["A"].shape[-1]))


IMPLS = {"tuned": tuned, "teaching": selective_scan_teaching}


def make(b, d, l, n, bc="shared", g=2, dtype=torch.float32, device=DEV, seed=None, D=True,
         z=True, bias=True):
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    r = lambda *s: torch.randn(*s, generator=gen)
    shapes = {"shared": (b, n, l), "grouped": (b, g, n, l), "fixed": (d, n)}
    bc = bc if isinstance(bc, tuple) else (bc, bc)
    x = dict(u=r(b, d, l), delta=0.5 * r(b, d, l), A=-(0.5 + torch.rand(d, n, generator=gen)),
             B=r(*shapes[bc[0]]), C=r(*shapes[bc[1]]), D=r(d) if D else None,
             z=r(b, d, l) if z else None, delta_bias=0.3 * r(d) if bias else None)
    io = {"u", "delta", "z"} | {k for k, s in zip("BC", bc, strict=False) if s != "fixed"}
    return {k: None if v is None else v.to(device, dtype if k in io else torch.float32)
            for k, v in x.items()}


def leaves(x):
    return {k: v.detach().clone().requires_grad_() if v is not None else None for k, v in x.items()}


def check_against_oracle(fn, x, softplus=True, grad=True, **kw):
    """Forward and all gradients of ``fn`` vs autograd through the float64 oracle."""
    xs = leaves(x)
    out = fn(**xs, delta_softplus=softplus, **kw)
    ref_in = leaves({k: None if v is None else v.double() for k, v in x.items()})
    ref = selective_scan_sequential(**ref_in, delta_softplus=softplus)
    dtype = x["u"].dtype
    testing.assert_close(out, ref, dtype=dtype, msg="forward")
    if not grad:
        return
    dout = torch.randn_like(out)
    out.backward(dout)
    ref.backward(dout.double())
    for k in NAMES:
        if xs[k] is not None:
            testing.assert_close(xs[k].grad, ref_in[k].grad, dtype=dtype, grad=True, msg=f"d{k}")


# ---------------------------------------------------------------------------------------------
# CPU (interpreter) and GPU: argument combinations
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bc", ["shared", "grouped", "fixed", ("fixed", "shared")])
def test_bc_layouts(impl, bc):
    check_against_oracle(IMPLS[impl], make(2, 4, 19, 3, bc=bc))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("D,z,bias,softplus", [(False, False, False, False),
                                               (True, False, True, False),
                                               (False, True, False, True)])
def test_optional_arguments(impl, D, z, bias, softplus):
    check_against_oracle(IMPLS[impl], make(1, 3, 21, 2, D=D, z=z, bias=bias), softplus=softplus)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("l", [1, 8, 17, 33])  # one step, one tile, odd, past two chunks
def test_lengths(impl, l):
    check_against_oracle(IMPLS[impl], make(1, 3, l, 2))


@pytest.mark.parametrize("impl", IMPLS)
def test_dstate_not_power_of_two_and_d_not_multiple_of_tile(impl):
    check_against_oracle(IMPLS[impl], make(1, 5, 12, 5, bc="grouped", g=5))


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl):
    x = make(2, 4, 13, 3, bc="grouped")
    nc = dict(x)
    for k in ("u", "delta", "z"):  # (b, d, l) views with a stride-2 time axis
        nc[k] = torch.stack([x[k], torch.zeros_like(x[k])], -1)[..., 0]
    nc["B"] = x["B"].transpose(-1, -2).contiguous().transpose(-1, -2)  # l not innermost
    nc["A"] = x["A"].t().contiguous().t()
    assert not nc["u"].is_contiguous() and not nc["B"].is_contiguous()
    check_against_oracle(IMPLS[impl], nc)


@pytest.mark.parametrize("impl", IMPLS)
def test_return_last_state(impl):
    x = make(2, 3, 19, 2)
    out, last = IMPLS[impl](**x, delta_softplus=True, return_last_state=True)
    ref, ref_last = selective_scan_sequential(**{k: None if v is None else v.double()
                                                 for k, v in x.items()},
                                              delta_softplus=True, return_last_state=True)
    testing.assert_close(out, ref, msg="out")
    testing.assert_close(last, ref_last, dtype=torch.float32, msg="last_state")
    assert last.dtype == torch.float32 and last.shape == (2, 3, 2)


# ---------------------------------------------------------------------------------------------
# Variable-length packing: one row of several sequences equals separate runs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", ["seq_idx", "cu_seqlens"])
def test_varlen_equals_separate_runs(impl, how):
    lengths = [7, 13, 1, 9]  # a sequence crossing chunk boundaries, one of length 1
    x = make(1, 3, sum(lengths), 2)
    cu = torch.tensor([0, 7, 20, 21, 30], device=DEV)
    kw = dict(cu_seqlens=cu) if how == "cu_seqlens" else dict(
        seq_idx=torch.repeat_interleave(torch.arange(4, device=DEV), torch.tensor(lengths,
                                        device=DEV))[None].int())
    xs = leaves(x)
    out, last = IMPLS[impl](**xs, delta_softplus=True, return_last_state=True, **kw)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref_in = leaves({k: None if v is None else v.double() for k, v in x.items()})
    outs = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=False):
        part = {k: (v[..., s:e] if k in ("u", "delta", "z", "B", "C") else v)
                for k, v in ref_in.items()}
        o, ref_last = selective_scan_sequential(**part, delta_softplus=True,
                                                return_last_state=True)
        outs.append(o)
    ref = torch.cat(outs, -1)
    testing.assert_close(out, ref, msg="packed forward")
    testing.assert_close(last, ref_last, dtype=torch.float32, msg="last state = last sequence's")
    ref.backward(dout.double())
    for k in NAMES:
        testing.assert_close(xs[k].grad, ref_in[k].grad, grad=True, msg=f"packed d{k}")


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input():
    x = make(1, 4, 8, 2, seed=0)
    f = lambda **kw: selective_scan_fn(**{**x, **kw})
    with pytest.raises(ValueError, match="delta"):
        f(delta=x["delta"][..., :7])
    with pytest.raises(ValueError, match="B"):
        f(B=x["B"][:, :1])
    with pytest.raises(TypeError, match="complex"):
        f(A=torch.complex(x["A"], x["A"]))
    with pytest.raises(TypeError, match="A must be float32"):
        f(A=x["A"].double())
    with pytest.raises(TypeError, match="delta must have u's dtype"):
        f(delta=x["delta"].half())
    with pytest.raises(TypeError, match="u must be"):
        f(u=x["u"].double(), delta=x["delta"].double(), z=x["z"].double())
    big = make(1, 2, 4, MAX_DSTATE + 1, seed=0)
    with pytest.raises(ValueError, match="dstate"):
        selective_scan_fn(**big)
    with pytest.raises(ValueError, match="seq_idx"):
        f(seq_idx=torch.zeros(1, 7, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match="cu_seqlens"):
        f(cu_seqlens=torch.tensor([0, 3, 5], device=DEV))
    if GPU:
        with pytest.raises(ValueError, match="device"):
            f(D=x["D"].cpu())


# ---------------------------------------------------------------------------------------------
# GPU: real sizes
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bc", ["shared", "grouped", "fixed"])
def test_gpu_real_sizes(impl, dtype, bc):
    x = make(2, 256, 1000, 16, bc=bc, g=4, dtype=dtype)
    check_against_oracle(IMPLS[impl], x)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", IMPLS)
def test_gpu_last_state_and_varlen(impl):
    test_return_last_state(impl)
    test_varlen_equals_separate_runs(impl, "cu_seqlens")


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_initial_state_real_sizes(impl, dtype):
    x = make(2, 256, 1000, 16, bc="grouped", g=4, dtype=dtype)
    check_states(IMPLS[impl], x, torch.randn(2, 256, 16, device=DEV))


@pytest.mark.parametrize("bc", ["grouped", "fixed"])
def test_tuned_run_time_state_loop(bc):
    # the other loop over states in each kernel: forward not unrolled (carries in memory),
    # backward unrolled (carries in registers)
    other = dict(forward=dict(layout="scan", unroll=False), backward=dict(unroll=True))
    fn = lambda **k: selective_scan_fn(**k, config=small(3, **other))
    check_against_oracle(fn, make(2, 4, 19, 3, bc=bc))
    x = make(1, 3, 30, 3)
    seq = torch.tensor([[0] * 11 + [1] * 19], dtype=torch.int32, device=DEV)
    out = fn(**x, delta_softplus=True, seq_idx=seq)
    ref = torch.cat([selective_scan_sequential(**{k: (v[..., s:e] if k in ("u", "delta", "z", "B",
                     "C") else v).double() for k, v in x.items()}, delta_softplus=True)
                     for s, e in ((0, 11), (11, 30))], -1)
    testing.assert_close(out, ref, msg="packed, run-time state loop")


@pytest.mark.parametrize("state_unroll", [1, 2])
def test_run_time_state_loop_prefetch(state_unroll):
    # the large-n forward issues state n + 1's loads during state n; state_unroll=2 takes two
    # states a turn (n = 5: an odd count, the last turn has one); every output and gradient
    cfg = small(5, forward=dict(layout="scan", unroll=False, state_unroll=state_unroll))
    check_against_oracle(lambda **k: selective_scan_fn(**k, config=cfg),
                         make(2, 6, 21, 5, bc="grouped"))


# ---------------------------------------------------------------------------------------------
# Initial state and the gradient of the last state (context parallelism needs both)
# ---------------------------------------------------------------------------------------------
def check_states(fn, x, h0, seq_idx=None, bounds=None, dlast=True):
    """out, the last state and every gradient (initial state included; the last state's
    gradient seeding the reverse scan if ``dlast``) vs autograd through the float64 oracle.
    ``bounds``: the packed sequences of ``seq_idx``; h0 is the first sequence's initial state."""
    xs, h = leaves(x), h0.detach().clone().requires_grad_()
    out, last = fn(**xs, delta_softplus=True, return_last_state=True, initial_state=h,
                   seq_idx=seq_idx)
    ref_in = leaves({k: None if v is None else v.double() for k, v in x.items()})
    h_ref = h0.detach().double().requires_grad_()
    bounds = bounds or [0, x["u"].shape[-1]]
    timed = ("u", "delta", "z", "B", "C")
    outs, state = [], h_ref
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):  # later sequences start from zero
        part = {k: v[..., s:e] if k in timed and v is not None and v.ndim > 2 else v
                for k, v in ref_in.items()}
        o, ref_last = selective_scan_sequential(**part, delta_softplus=True,
                                                return_last_state=True, initial_state=state)
        outs.append(o)
        state = None
    ref = torch.cat(outs, -1)
    testing.assert_close(out, ref, msg="forward")
    testing.assert_close(last, ref_last, dtype=torch.float32, msg="last state")
    dout = torch.randn_like(out)
    dl = torch.randn_like(last) if dlast else None
    torch.autograd.backward([out, last] if dlast else [out], [dout, dl] if dlast else [dout])
    torch.autograd.backward([ref, ref_last] if dlast else [ref],
                            [dout.double(), dl.double()] if dlast else [dout.double()])
    for k in NAMES:
        if xs[k] is not None:
            testing.assert_close(xs[k].grad, ref_in[k].grad, grad=True, msg=f"d{k}")
    testing.assert_close(h.grad, h_ref.grad, grad=True, msg="d initial_state")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("b,d,l,n,bc", [(2, 4, 19, 3, "shared"), (1, 5, 33, 2, "fixed"),
                                        (2, 4, 8, 3, "grouped")])
def test_initial_state_and_last_state_gradient(impl, b, d, l, n, bc):
    x = make(b, d, l, n, bc=bc)
    check_states(IMPLS[impl], x, torch.randn(b, d, n, device=DEV))


@pytest.mark.parametrize("impl", IMPLS)
def test_initial_state_without_last_state_gradient(impl):
    # the last state returned but unused: its gradient is None, the rest as usual
    check_states(IMPLS[impl], make(1, 3, 17, 2), torch.randn(1, 3, 2, device=DEV), dlast=False)


@pytest.mark.parametrize("loop", ["recurrent", "scan unrolled", "scan run-time"])
def test_initial_state_every_tuned_loop(loop):
    # every forward and backward state loop starts from h0 / the last state's gradient
    other = {"recurrent": dict(forward=dict(layout="recurrent")),
             "scan unrolled": dict(forward=dict(layout="scan", unroll=True)),
             "scan run-time": dict(forward=dict(layout="scan", unroll=False),
                                   backward=dict(unroll=True))}[loop]
    fn = lambda **k: selective_scan_fn(**k, config=small(3, **other))
    check_states(fn, make(2, 4, 21, 3, bc="grouped"), torch.randn(2, 4, 3, device=DEV))


@pytest.mark.parametrize("impl", IMPLS)
def test_initial_state_with_packed_sequences(impl):
    # defined: initial_state is the first packed sequence's h_{−1}; the others start at zero;
    # the last state (and its gradient) belongs to the last sequence
    bounds = [0, 7, 20, 21, 30]
    lengths = torch.tensor([e - s for s, e in zip(bounds[:-1], bounds[1:], strict=True)])
    seq = torch.repeat_interleave(torch.arange(4), lengths)[None].int().to(DEV)
    check_states(IMPLS[impl], make(1, 3, 30, 2), torch.randn(1, 3, 2, device=DEV),
                 seq_idx=seq, bounds=bounds)


def test_initial_state_bad_input():
    x = make(1, 4, 8, 2, seed=0)
    with pytest.raises(ValueError, match="initial_state"):
        selective_scan_fn(**x, initial_state=torch.zeros(1, 4, 3, device=DEV))
    with pytest.raises(TypeError, match="initial_state must be float32"):
        selective_scan_fn(**x, initial_state=torch.zeros(1, 4, 2, device=DEV).double())
    with pytest.raises(TypeError, match="initial_state"):
        selective_scan_fn(**x, initial_state=torch.zeros(1, 4, 2, device=DEV).int())


# ---------------------------------------------------------------------------------------------
# Forward variants (FORWARD_VARIANTS: while / pipelined `for`, masks / even, warps, maxnreg)
# ---------------------------------------------------------------------------------------------
def tiny(launch):
    """A variant with the interpreter's small tile (on the CPU), every other field kept."""
    return launch if GPU else dataclasses.replace(launch, block_d=4, block_l=8, num_warps=1)


@pytest.mark.parametrize("name", list(cfgs.FORWARD_VARIANTS))
@pytest.mark.parametrize("d,l", [(8, 16), (5, 19)])  # tiles divide (no masks) / do not
def test_forward_variants(name, d, l):
    cfg = small(3, forward=tiny(cfgs.FORWARD_VARIANTS[name]))
    fn = lambda **k: selective_scan_fn(**k, config=cfg)
    check_against_oracle(fn, make(2, d, l, 3, bc="grouped" if d == 8 else "fixed", g=2))


@pytest.mark.parametrize("name", list(cfgs.FORWARD_VARIANTS_LARGE_N))
def test_forward_variants_large_n(name):
    # n = 17 (padded to 32): the recurrent tiles' state masks, the scan's run-time loop
    cfg = small(17, forward=tiny(cfgs.FORWARD_VARIANTS_LARGE_N[name]))
    fn = lambda **k: selective_scan_fn(**k, config=cfg)
    check_against_oracle(fn, make(1, 3, 11, 17, bc=("shared", "fixed")))


@pytest.mark.parametrize("unroll", [True, False])
def test_pipelined_forward_varlen_and_last_state(unroll):
    cfg = small(3, forward=dataclasses.replace(tiny(cfgs.FORWARD_VARIANTS["pipelined 64x32w4"]),
                                               unroll=unroll))
    x = make(1, 4, 32, 3)
    seq = torch.tensor([[0] * 11 + [1] * 21], dtype=torch.int32, device=DEV)
    out, last = selective_scan_fn(**x, delta_softplus=True, seq_idx=seq, return_last_state=True,
                                  config=cfg)
    parts = [selective_scan_sequential(**{k: (v[..., s:e] if k in ("u", "delta", "z", "B", "C")
                                              else v).double() for k, v in x.items()},
                                       delta_softplus=True, return_last_state=True)
             for s, e in ((0, 11), (11, 32))]
    testing.assert_close(out, torch.cat([p[0] for p in parts], -1), msg="packed, pipelined")
    testing.assert_close(last, parts[1][1], dtype=torch.float32, msg="last state, pipelined")


# ---------------------------------------------------------------------------------------------
# Backward variants (BACKWARD_VARIANTS: masks / even, plain / pipelined state loop, state-outer)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(cfgs.BACKWARD_VARIANTS))
@pytest.mark.parametrize("d,l,bc", [(8, 16, ("fixed", "grouped")),  # tiles divide (no masks)
                                    (5, 19, ("shared", "fixed"))])  # tiles do not
def test_backward_variants(name, d, l, bc):
    cfg = small(3, backward=tiny(cfgs.BACKWARD_VARIANTS[name]))
    fn = lambda **k: selective_scan_fn(**k, config=cfg)
    check_against_oracle(fn, make(2, d, l, 3, bc=bc, g=2))


@pytest.mark.parametrize("name", list(cfgs.BACKWARD_VARIANTS))
def test_backward_variants_varlen(name):
    # packed sequences (seq_idx) through every backward variant, tiles dividing l and d
    lengths = [7, 13, 1, 11]
    cfg = small(2, backward=tiny(cfgs.BACKWARD_VARIANTS[name]))
    x = make(1, 4, sum(lengths), 2)
    seq = torch.repeat_interleave(torch.arange(4, device=DEV),
                                  torch.tensor(lengths, device=DEV))[None].int()
    xs = leaves(x)
    out = selective_scan_fn(**xs, delta_softplus=True, seq_idx=seq, config=cfg)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref_in = leaves({k: None if v is None else v.double() for k, v in x.items()})
    bounds = [0, 7, 20, 21, 32]
    ref = torch.cat([selective_scan_sequential(**{k: (v[..., s:e] if k in ("u", "delta", "z",
                     "B", "C") else v) for k, v in ref_in.items()}, delta_softplus=True)
                     for s, e in zip(bounds[:-1], bounds[1:], strict=False)], -1)
    testing.assert_close(out, ref, msg="packed forward")
    ref.backward(dout.double())
    for k in NAMES:
        testing.assert_close(xs[k].grad, ref_in[k].grad, grad=True, msg=f"packed d{k}, {name}")


# ---------------------------------------------------------------------------------------------
# Configuration: data passed in, checked
# ---------------------------------------------------------------------------------------------
def test_even_flags():
    # masks are dropped only where the launch allows it and the tile divides the tensor
    assert cfgs.even_flags(True, 64, 32, 32, 16) == (True, True)
    assert cfgs.even_flags(True, 65, 32, 32, 16) == (False, True)
    assert cfgs.even_flags(True, 64, 24, 32, 16) == (True, False)
    assert cfgs.even_flags(False, 64, 32, 32, 16) == (False, False)


def test_default_config_by_device_and_n():
    cpu = default_config(16, "cpu")
    assert cpu.forward == cfgs.CPU_FORWARD and cpu.backward == cfgs.CPU_BACKWARD
    assert cpu.backward.even is False  # the interpreter's backward keeps every mask
    assert default_config(17, "cpu").forward.unroll is False
    gpu = default_config(16, "cuda")
    assert (gpu.chunk, gpu.forward, gpu.backward) == (64, cfgs.FORWARD, cfgs.BACKWARD)
    assert default_config(64, "cuda").forward == cfgs.FORWARD_RECURRENT  # measured faster there
    assert default_config(64, "cuda", l=2048).forward == cfgs.FORWARD_RECURRENT
    assert default_config(64, "cuda", l=1000).forward == cfgs.FORWARD_LARGE_N  # not 16-aligned
    assert default_config(32, "cuda").forward == default_config(65, "cuda").forward \
        == cfgs.FORWARD_LARGE_N


def test_bad_config():
    x = make(1, 4, 8, 2, seed=0)
    with pytest.raises(TypeError, match="config"):
        selective_scan_fn(**x, config={"forward": {}})
    with pytest.raises(TypeError, match="config"):
        selective_scan_fn(**x, config="fast")
    with pytest.raises(ValueError, match="layout"):
        default_config(2, DEV).replace(backward=dict(layout="diagonal"))
    with pytest.raises(ValueError, match="multiple of forward.block_l"):
        default_config(2, DEV).replace(chunk=12)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_large_n(dtype):
    # n = 64: the large-n forward and the one-channel state-outer backward, with initial state
    x = make(2, 256, 1000, 64, bc="shared", dtype=dtype)
    check_against_oracle(tuned, x)
    check_states(tuned, x, torch.randn(2, 256, 64, device=DEV))
