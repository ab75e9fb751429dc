"""The Triton SSD backward (mambalearn.mamba2.backward) against autograd (chapter 10).

Each backward kernel is checked against autograd through the PyTorch piece of the chunked oracle it
differentiates (float64), and the whole ``mamba_chunk_scan_combined`` backward against the
reference backward (autograd through ``mambalearn.mamba2.reference.mamba_chunk_scan_ref``) on fresh
random inputs. On a CPU the kernels run in Triton's interpreter at tiny fp32 sizes; the `gpu` tests
run real sizes in bf16.
"""

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from mambalearn import testing
from mambalearn.mamba2 import api as combined
from mambalearn.mamba2 import backward as SB
from mambalearn.mamba2 import chunk as T
from mambalearn.mamba2 import reference as ssd
from mambalearn.mamba2.backward_config import blocks
from mambalearn.mamba2.common import INTERP
from mambalearn.mamba2.config import default_config, defaults
from mambalearn.testing import dot_dtype, rel_error

# The SSD kernels multiply on the tensor cores: tf32 on a GPU (testing.assert_close, "dot")
assert_close = partial(testing.assert_close, dtype="dot")

dev = "cuda" if torch.cuda.is_available() else "cpu"
SIZES = dict(b=2, l=40, h=4, p=8, g=2, n=16, q=16)  # c = 3 chunks, the last one half empty
BWD = defaults(dev).backward  # the launch settings every launcher is given


# ---------------------------------------------------------------------------------------------
# the PyTorch pieces of the chunked algorithm, on (b, c, q, h, ·) chunked views, in float64
def chunked(X, q, h=None):
    """(b, l, k, f) → (b, c, q, h, f), zero-padded; B and C (k = g groups) repeated per head."""
    b, l = X.shape[:2]
    c = -(-l // q)
    X = X.double() if h is None else X.double().repeat_interleave(h // X.shape[2], dim=2)
    return F.pad(X, (0, 0, 0, 0, 0, c * q - l)).reshape(b, c, q, X.shape[2], X.shape[3])


def decay_matrix(a):
    """L_ts = exp(a_t − a_s) for s ≤ t, else 0.  a (b, h, c, q) → (b, h, c, q, q)."""
    q = a.shape[-1]
    causal = torch.ones(q, q, dtype=torch.bool, device=a.device).tril()
    return torch.exp((a[..., :, None] - a[..., None, :]).masked_fill(~causal, -float("inf")))


def y_diag(CB, a, delta, xc, h):
    """(L ∘ CB)(Δ x) per chunk. CB (b, c, g, q, q), a/delta (b, h, c, q), xc (b, c, q, h, p)."""
    P = CB.repeat_interleave(h // CB.shape[2], dim=2).permute(0, 2, 1, 3, 4) * decay_matrix(a)
    return torch.einsum("bhcts,bcshp->bcthp", P, delta.permute(0, 2, 3, 1)[..., None] * xc)


def y_off(Cc, a, H):
    """exp(a_t) H_c C_t.  Cc (b, c, q, h, n), H (b, c, h, p, n) → (b, c, q, h, p)."""
    return torch.einsum("bcthn,bchpn->bcthp", Cc * torch.exp(a).permute(0, 2, 3, 1)[..., None], H)


def chunk_states(xc, Bc, a, delta):
    """S_c = Σ_s exp(a_last − a_s) Δ_s x_s B_sᵀ → (b, c, h, p, n)."""
    w = (torch.exp(a[..., -1:] - a) * delta).permute(0, 2, 3, 1)  # (b, c, q, h)
    return torch.einsum("bcshn,bcshp->bchpn", Bc, w[..., None] * xc)


def leaf(t):
    return t.detach().double().requires_grad_()


@pytest.fixture(scope="module")
def case():
    """Inputs, the forward's intermediates (from the forward kernels) and an upstream dy."""
    b, l, h, p, g, n, q = SIZES.values()
    x = torch.randn(b, l, h, p, device=dev)
    dt, A = torch.randn(b, l, h, device=dev) - 1, -torch.rand(h, device=dev) - 0.5
    B, C = torch.randn(b, l, g, n, device=dev), torch.randn(b, l, g, n, device=dev)
    bias, h0 = torch.randn(h, device=dev), torch.randn(b, h, p, n, device=dev)
    st = defaults(dev).stages
    dt_c, dA_cs = T.chunk_cumsum(dt, A, q, bias, dt_softplus=True,
                                 heads=st.cumsum_heads)  # (b, h, c, q)
    S = T.chunk_state(x, B, dt_c, dA_cs, None, st)
    H, final = T.state_passing(S, dA_cs, h0, l=l, cfg=st)  # float32 states for the tests
    CB = T.bmm_chunk(C, B, q, st)
    causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
    return dict(x=x, dt=dt, A=A, B=B, C=C, bias=bias, h0=h0, dt_c=dt_c, dA_cs=dA_cs, S=S, H=H,
                final=final, CB=CB.masked_fill(~causal, 0), dy=torch.randn(b, l, h, p, device=dev))


def unchunk(Y, l):
    """(b, c, q, h, p) → (b, l, h, p)."""
    return Y.reshape(Y.shape[0], -1, *Y.shape[3:])[:, :l]


def ddA_buffer(case):
    b, h, c, q = case["dA_cs"].shape
    nblk = -(-q // blocks(q, defaults(dev).backward))
    return torch.zeros(b, h, c, q, nblk + 1, device=dev), nblk


# ---------------------------------------------------------------------------------------------
# one test per backward kernel
def test_gate_backward():
    dout, z, u = (torch.randn(2, 9, 3, 5, device=dev) for _ in range(3))
    dy, dz = SB.gate_backward(dout, z, u, BWD)
    z64, u64 = leaf(z), leaf(u)
    (u64 * F.silu(z64)).backward(dout.double())
    assert_close(dy, dout * F.silu(z))
    assert_close(dz, z64.grad, grad=True)


def test_dstates(case):
    """dH_c = ∂⟨Y_off, dy⟩/∂H_c."""
    q, h = SIZES["q"], SIZES["h"]
    H = leaf(case["H"])
    Y = y_off(chunked(case["C"], q, h), case["dA_cs"].double(), H)
    (unchunk(Y, SIZES["l"]) * case["dy"].double()).sum().backward()
    assert_close(SB.dstates(case["dy"], case["C"], case["dA_cs"], cfg=BWD), H.grad, grad=True)


def test_state_passing_backward(case):
    """dS, dinitial_states and ∂/∂a_last of L = Σ_c ⟨H_c, dH_c⟩ + ⟨final, dfinal⟩.

    With S a leaf, ∂/∂a_last is the path through α_c H_c only, ⟨α_c H_c, 𝒢_{c+1}⟩: the kernel's
    dlast (the path through S_c is step 7's Σ_s v_s)."""
    b, c, h, p, n = case["H"].shape
    dH, dfinal = torch.randn(b, c, h, p, n, device=dev), torch.randn(b, h, p, n, device=dev)
    S, h0, a_last = leaf(case["S"]), leaf(case["h0"]), leaf(case["dA_cs"][..., -1])  # (b, h, c)
    Hc, loss = h0, 0
    for k in range(c):
        loss = loss + (Hc * dH[:, k]).sum()
        Hc = torch.exp(a_last[:, :, k])[..., None, None] * Hc + S[:, k]
    (loss + (Hc * dfinal).sum()).backward()
    dS = dH.clone()
    dlast, dinit = SB.state_passing_backward(dS, case["H"], case["final"], case["dA_cs"], dfinal,
                                             l=SIZES["l"], has_init=True, cfg=BWD)
    assert_close(dS, S.grad, grad=True)
    assert_close(dinit, h0.grad, grad=True)
    assert_close(dlast, a_last.grad, grad=True)


@pytest.mark.parametrize("nsplit", [1, 2])
def test_dcb(case, nsplit):
    """dCB = ∂⟨Y_diag, dy⟩/∂CB (summed over a group's heads); the slots of ddA (row minus column
    sums of E) add up to ∂⟨Y_diag, dy⟩/∂a."""
    q, h, l = SIZES["q"], SIZES["h"], SIZES["l"]
    CB, a = leaf(case["CB"]), leaf(case["dA_cs"])
    Y = y_diag(CB, a, case["dt_c"].double(), chunked(case["x"], q), h)
    (unchunk(Y, l) * case["dy"].double()).sum().backward()
    ddA, nblk = ddA_buffer(case)
    dCB = SB.dcb(case["dy"], case["x"], case["CB"], case["dt_c"], case["dA_cs"], ddA, nsplit=nsplit,
                 cfg=BWD)
    causal = torch.ones(q, q, dtype=torch.bool, device=dev).tril()
    assert_close(dCB.sum(3).masked_fill(~causal, 0), CB.grad.masked_fill(~causal, 0), grad=True)
    assert_close(ddA[..., :nblk].sum(-1), a.grad, grad=True)  # (b, h, c, q)


def test_dC_and_dB(case):
    """dC = ∂/∂C and dB = ∂/∂B of ⟨Y_diag + Y_off, dy⟩ + ⟨S, dS⟩ with CB = C Bᵀ (H held fixed)."""
    q, h, l = SIZES["q"], SIZES["h"], SIZES["l"]
    a, delta, xc = case["dA_cs"].double(), case["dt_c"].double(), chunked(case["x"], q)
    B, C, H = leaf(case["B"]), leaf(case["C"]), case["H"].double()
    b, c, g = B.shape[0], a.shape[2], B.shape[2]
    Bg, Cg = (F.pad(X, (0, 0, 0, 0, 0, c * q - l)).reshape(b, c, q, g, -1) for X in (B, C))
    CB = torch.einsum("bctgn,bcsgn->bcgts", Cg, Bg)  # (b, c, g, q, q)
    dS = torch.randn_like(case["S"])
    Y_off = y_off(chunked(C, q, h), a, H)
    Y = y_diag(CB, a, delta, xc, h) + Y_off
    loss = (unchunk(Y, l) * case["dy"].double()).sum()
    (loss + (chunk_states(xc, chunked(B, q, h), a, delta) * dS.double()).sum()).backward()
    ddA, nblk = ddA_buffer(case)
    dCB = SB.dcb(case["dy"], case["x"], case["CB"], case["dt_c"], case["dA_cs"], ddA, cfg=BWD)
    dC = SB.dC_backward(case["dy"], case["H"], case["C"], case["B"], dCB, case["dA_cs"], ddA, nblk,
                        cfg=BWD)
    dB = SB.dB_backward(case["x"], dS, case["C"], dCB, case["dt_c"], case["dA_cs"], cfg=BWD)
    assert_close(dC, C.grad, grad=True)
    assert_close(dB, B.grad, grad=True)
    dyY = (chunked(case["dy"], q) * Y_off.detach()).sum(-1).permute(0, 3, 1, 2)
    assert_close(ddA[..., nblk:].sum(-1), dyY, grad=True)  # dy_t · Y_off_t, step 8


@pytest.mark.parametrize("D_shape", [(SIZES["h"],), (SIZES["h"], SIZES["p"])])
def test_dx(case, D_shape):
    """dx, x·G = ∂/∂Δ at fixed a, and dD, of ⟨Y_diag + D x, dy⟩ + ⟨S, dS⟩; and
    v_s = w_s x_s · (dS_c B_s) = −∂⟨S, dS⟩/∂a_s at fixed a_last."""
    q, h, l = SIZES["q"], SIZES["h"], SIZES["l"]
    a = case["dA_cs"].double()
    x, delta, D = leaf(case["x"]), leaf(case["dt_c"]), leaf(torch.randn(D_shape, device=dev))
    xc = chunked(x, q)
    dS = torch.randn_like(case["S"])
    Dx = (D[:, None] if D.ndim == 1 else D) * x
    loss = ((unchunk(y_diag(case["CB"].double(), a, delta, xc, h), l) + Dx) * case["dy"]).sum()
    (loss + (chunk_states(xc, chunked(case["B"], q, h), a, delta) * dS).sum()).backward()
    v = torch.full_like(case["dt_c"], float("nan"))
    dx, ddt_x, dD = SB.dx_backward(case["x"], case["dy"], case["B"], case["CB"], dS, case["dt_c"],
                                   case["dA_cs"], D.detach().float(), v=v, cfg=BWD)
    w = torch.exp(a[..., -1:] - a) * case["dt_c"].double()  # (b, h, c, q)
    xdSB = torch.einsum("bcshp,bchpn,bcshn->bhcs", xc.detach(), dS.double(),
                        chunked(case["B"], q, h))
    assert_close(v, w * xdSB, grad=True)
    assert_close(dx, x.grad, grad=True)
    assert_close(ddt_x, delta.grad, grad=True)
    assert_close(dD, D.grad, grad=True)


@pytest.mark.parametrize("limit", [(0.0, float("inf")), (0.2, 0.6)])
def test_chunk_cumsum_backward(case, limit):
    """ddt, dA, ddt_bias of  ⟨a, ddA − v⟩ + Σ_c (dlast_c + Σ_s v_s) a_last + ⟨Δ, ddt_x⟩,
    a = cumsum(Δ A) per chunk, Δ = clamp(softplus(dt + bias)) (ddA, v, dlast, ddt_x: inputs)."""
    b, h, c, q = case["dA_cs"].shape
    l = SIZES["l"]
    ddA, ddt_x = torch.randn(b, h, c, q, device=dev), torch.randn(b, h, c, q, device=dev)
    dlast, v = torch.randn(b, h, c, device=dev), torch.randn(b, h, c, q, device=dev)
    dt, A, bias = leaf(case["dt"]), leaf(case["A"]), leaf(case["bias"])
    delta = ssd.effective_dt(dt, bias, True, limit)  # (b, l, h)
    delta = F.pad(delta, (0, 0, 0, c * q - l)).reshape(b, c, q, h).permute(0, 3, 1, 2)
    a = torch.cumsum(delta * A[:, None, None], -1)  # (b, h, c, q)
    loss = (a * (ddA - v)).sum() + (a[..., -1] * (dlast + v.sum(-1))).sum()
    (loss + (delta * ddt_x).sum()).backward()
    dt_c, _ = T.chunk_cumsum(case["dt"], case["A"], q, case["bias"], True, limit,
                             heads=defaults(dev).stages.cumsum_heads)
    ddt, dA, dbias = SB.chunk_cumsum_backward(ddA, ddt_x, dlast, dt_c, case["dt"], case["A"],
                                              case["bias"], True, limit, v, cfg=BWD)
    assert_close(ddt, dt.grad, grad=True)
    assert_close(dA, A.grad, grad=True)
    assert_close(dbias, bias.grad, grad=True)


# ---------------------------------------------------------------------------------------------
# the whole backward against the reference backward (autograd through the PyTorch oracle)
def grads(backward, x, dt, A, B, C, q, dfinal=None, **kw):
    """Gradients of ⟨out, dout⟩ (+ ⟨final, dfinal⟩) w.r.t. every floating tensor argument."""
    names = ["x", "dt", "A", "B", "C"] + [k for k, v in kw.items()
                                          if torch.is_tensor(v) and v.is_floating_point()]
    leaves = {k: v.detach().clone().requires_grad_() for k, v in
              zip(names, [x, dt, A, B, C] + [kw[k] for k in names[5:]], strict=True)}
    out, final = combined.mamba_chunk_scan_combined(
        *(leaves[k] for k in names[:5]), q, return_final_states=True, backward=backward,
        **{**kw, **{k: leaves[k] for k in names[5:]}})
    gen = torch.Generator(device=dev).manual_seed(1)  # the same dout in both runs
    dout = torch.randn(out.shape, generator=gen, device=dev).to(out.dtype)
    outs, gouts = [out], [dout]
    if dfinal is not None:
        outs.append(final), gouts.append(dfinal)
    torch.autograd.backward(outs, gouts)
    return {k: v.grad for k, v in leaves.items()}


def inputs(b, l, h, p, g, n, dtype=torch.float32, softplus=True, extras=True):
    x = torch.randn(b, l, h, p, device=dev, dtype=dtype)
    dt = torch.randn(b, l, h, device=dev) - 1 if softplus else torch.rand(b, l, h, device=dev) / 3
    A = -torch.rand(h, device=dev) * 2 - 0.2
    B, C = (torch.randn(b, l, g, n, device=dev, dtype=dtype) for _ in range(2))
    kw = dict(dt_softplus=softplus)
    if extras:
        kw.update(D=torch.randn(h, device=dev), z=torch.randn(b, l, h, p, device=dev, dtype=dtype),
                  dt_bias=torch.randn(h, device=dev),
                  initial_states=torch.randn(b, h, p, n, device=dev))
    return (x, dt, A, B, C), kw


def check_all(got, want, dtype="dot"):
    assert set(got) == set(want)
    for k in want:
        assert_close(got[k], want[k], dtype=dtype, grad=True, msg=k)


@pytest.mark.parametrize("l,q,g", [(40, 16, 1), (37, 16, 2), (32, 8, 2)])
def test_combined_matches_reference_backward(l, q, g):
    """All of dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dinitial_states, with dfinal, fresh inputs."""
    args, kw = inputs(2, l, 4, 8, g, 16)
    dfinal = torch.randn(2, 4, 8, 16, device=dev)
    check_all(grads("triton", *args, q, dfinal, **kw), grads("reference", *args, q, dfinal, **kw))


def test_combined_plain_and_D_per_channel():
    """No z, no bias, no softplus, no initial state, no dfinal; then D (h, p), a dt_limit and a
    non-contiguous x."""
    args, _ = inputs(1, 24, 2, 8, 1, 16, softplus=False, extras=False)
    check_all(grads("triton", *args, 16), grads("reference", *args, 16))
    args, kw = inputs(1, 24, 2, 8, 1, 16)
    args = (torch.randn(1, 24, 8, 2, device=dev).transpose(2, 3), *args[1:])  # (b, l, h, p) view
    kw.update(D=torch.randn(2, 8, device=dev), dt_limit=(0.1, 0.8))
    check_all(grads("triton", *args, 16, **kw), grads("reference", *args, 16, **kw))


def test_combined_seq_idx():
    """Packed sequences: no gradient crosses a seq_idx boundary (inside chunks and across them)."""
    args, kw = inputs(2, 40, 4, 8, 2, 16)
    seq = torch.zeros(2, 40, dtype=torch.int32, device=dev)
    seq[:, 9:], seq[:, 16:], seq[1, 33:] = 1, 2, 3  # a boundary mid-chunk, one on a chunk edge
    dfinal = torch.randn(2, 4, 8, 16, device=dev)
    check_all(grads("triton", *args, 16, dfinal, seq_idx=seq, **kw),
              grads("reference", *args, 16, dfinal, seq_idx=seq, **kw))


@pytest.mark.parametrize("recompute", ["states", "stages"])
def test_head_splits_and_recompute_paths(recompute):
    """A group's heads split over two programs in steps 4–6 (the GPU heuristic's path), with step
    0 by chapter 11's chunk-states kernel or chapter 10's stages: the reference's gradients."""
    args, kw = inputs(1, 32, 4, 8, 1, 16)
    want = grads("reference", *args, 16, **kw)
    gen = torch.Generator(device=dev).manual_seed(1)  # grads' dout
    dout = torch.randn(args[0].shape, generator=gen, device=dev)
    names = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"]
    cfg = default_config((1, 32, 4, 8, 1, 16, 16), dev).replace(
        backward=dict(nsplit=2, recompute=recompute))
    got = SB.ssd_backward(dout, None, *args, 16, D=kw["D"], z=kw["z"], dt_bias=kw["dt_bias"],
                          initial_states=kw["initial_states"], dt_softplus=True, config=cfg)
    got = dict(zip(names, (got[0], got[1], got[2], got[3], got[4], got[5], got[6], got[7],
                           got[8]), strict=True))
    check_all(got, want)


def test_backward_flag():
    args, _ = inputs(1, 8, 2, 4, 1, 16)
    with pytest.raises(ValueError, match="backward must be one of"):
        combined.mamba_chunk_scan_combined(*args, 8, backward="pytorch")
    base = default_config((1, 8, 2, 4, 1, 16, 8), dev)
    with pytest.raises(ValueError, match="recompute"):
        base.replace(backward=dict(recompute="none"))
    with pytest.raises(ValueError, match="config.backward has no field dxx"):
        base.replace(backward=dict(dxx=dict(num_warps=4)))
    with pytest.raises(TypeError, match="config"):  # an internal: the resolved config, required
        SB.ssd_backward(torch.zeros_like(args[0]), None, *args, 8)


# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("seq", [False, True])
def test_gpu_real_sizes(dtype, seq):
    """Real head sizes (p 64, n 128, chunk 256, l not a multiple of it) against the reference
    backward: each gradient within the bf16 gradient tolerance relative to its largest entry,
    and within 2 % in relative norm (operands of the products are bf16 or tf32)."""
    b, l, h, p, g, n, q = 2, 1000, 8, 64, 2, 128, 256
    args, kw = inputs(b, l, h, p, g, n, dtype=dtype)
    if seq:
        kw["seq_idx"] = (torch.arange(l, device=dev) >= 300).int().expand(b, l).contiguous()
    dfinal = torch.randn(b, h, p, n, device=dev)
    got, want = grads("triton", *args, q, dfinal, **kw), grads("reference", *args, q, dfinal, **kw)
    for k in want:
        a, e = got[k].double(), want[k].double()
        scale = e.abs().max().clamp_min(1e-12)
        assert_close(a / scale, e / scale, dtype=dot_dtype(args[0]) if dtype == torch.float32
                     else dtype, grad=True, msg=k)
        assert ((a - e).norm() / e.norm()).item() < 2e-2, k


# ---------------------------------------------------------------------------------------------
def cancellation_errors(backward, seed=1):
    """Relative norm errors of dA and ddt_bias of ``backward`` (``SB.ssd_backward``'s signature)
    against the float64 oracle, on inputs where ∂loss/∂a is a small remainder of large terms:
    slow decay (small |A|), chunks of 64 over 3 chunks, float16 operands (the interpreter's
    ``tl.dot`` takes float16 exactly, so casts to float16 inside the kernels round the operands
    as the GPU's tf32 (cut to 10 bits: < 2⁻¹⁰) or bf16 (2⁻⁸) do, only finer: 2⁻¹¹)."""
    gen = torch.Generator(device=dev).manual_seed(seed)
    b, l, h, p, g, n, q = 1, 192, 2, 16, 1, 16, 64
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device=dev)
    x, dt = rnd(b, l, h, p).half(), rnd(b, l, h) - 1
    A = -torch.rand(h, generator=gen, device=dev) * 0.05 - 0.005
    B, C, bias = rnd(b, l, g, n).half(), rnd(b, l, g, n).half(), rnd(h)
    dout = rnd(b, l, h, p).half()
    got = backward(dout, None, x, dt, A, B, C, q, dt_bias=bias, dt_softplus=True,
                   config=default_config((b, l, h, p, g, n, q), dev))
    leaves = [leaf(t) for t in (dt, A, bias)]
    out = ssd.mamba_chunk_scan_ref(x.double(), leaves[0], leaves[1], B.double(), C.double(), q,
                                   dt_bias=leaves[2], dt_softplus=True)
    (out * dout.double()).sum().backward()
    err = {k: rel_error(mine, ref.grad)
           for k, mine, ref in zip(("dt", "A", "dt_bias"), (got[1], got[2], got[7]), leaves,
                                 strict=True)}
    # d dt_bias = Σ_l ddt is itself a small remainder of a sum with both signs: measured against
    # ‖ddt‖, what errors of ddt that do not add up coherently would leave
    err["dt_bias/ddt"] = ((got[7].double() - leaves[2].grad).norm() / leaves[0].grad.norm()).item()
    return err


@pytest.mark.skipif(not INTERP, reason="float16 rounding emulated in Triton's interpreter")
def test_cancelling_terms_of_da_from_one_rounding():
    """∂loss/∂a_t = Σ_s E_ts − Σ_t' E_t't + (state terms) cancels to a small remainder in the
    reverse cumsum. Computed as dy·Y_diag (float32 products) − Δx·G (P and H cast to the operand
    dtype), as the first version did, those roundings left errors dA 3.9e-3, d dt_bias 2.2e-3
    (7.5e-4 of ‖ddt‖) here, and 6.5e-2 on an H200 in bf16. From one float32 tile and v in float32:
    2.3e-4, 9.2e-4 (3.1e-4), the float16 level of the other gradients (ddt 2.2e-4 both)."""
    err = cancellation_errors(SB.ssd_backward)
    assert err["A"] < 1e-3, err
    assert err["dt_bias"] < 1.5e-3, err
    assert err["dt_bias/ddt"] < 5e-4, err
    assert err["dt"] < 5e-4, err
