"""Checks for chapter 13: the Mamba block assembled from its parts, against ``mambalearn.model``.

    rms_norm(x, weight, eps=1e-5) = x / sqrt(mean(x²) + eps) · weight
    mamba_block(hidden, w):
        [x, z] = in_proj(rms_norm(hidden))               (b, l, 2d), split on the last axis
        x = silu(causal_conv1d(x))                       depthwise, kernel k, bias
        [Δ_raw, B, C] = x_proj(x)                        (r, n, n) on the last axis
        Δ = softplus(dt_proj(Δ_raw) + dt_bias)           the bias enters before the softplus
        y = scan(x, Δ, A = −exp(A_log), B, C) + D·x      the selective scan of chapter 02
        return hidden + out_proj(y · silu(z))            the residual

``w`` holds the block's weights by the names of ``model.Block(cfg).state_dict()``. The oracle is
that ``Block`` (Mamba-1, the sequential backend) with the same weights, in float64: outputs and
the gradients with respect to the input and every weight. Random configurations (expand, state
size, conv width, Δ rank), edge cases (l = 1, l shorter than the conv, one channel of state),
weights away from their initialisation (so a swapped or dropped part cannot hide behind ones and
zeros). When the output is wrong, the check tries the usual wrong assemblies and names the one the
output equals.
"""

import math

import torch
import torch.nn.functional as F

from mambalearn import model
from mambalearn.check import _core, _probes
from mambalearn.scan.sequential import selective_scan_sequential

__all__ = ["rms_norm", "mamba_block"]
REBUILDS = {  # (torch's own RMSNorm is the answer too)
    "rms_norm": ["mambalearn.model.RMSNorm.forward", "torch.nn.functional.rms_norm",
                 "torch.rms_norm", "torch.nn.RMSNorm", "torch.nn.modules.normalization.RMSNorm"],
    "mamba_block": ["mambalearn.model.Block.forward", "mambalearn.model.Mamba1Mixer.forward",
                    "mambalearn.model.MambaLM.forward"],
}

HINTS = {
    "rms_norm": [
        "x · torch.rsqrt(x.pow(2).mean(−1, keepdim=True) + eps) · weight: the mean over the "
        "last axis only",
        "compute it with torch's elementwise ops yourself: torch's own RMSNorm is switched off "
        "while grading",
    ],
    "mamba_block": [
        "u = rms_norm(hidden, w['norm.weight']); [x, z] = F.linear(u, in_proj).chunk(2, −1); the "
        "conv runs on x.transpose(1, 2) (b, d, l), then silu",
        "F.linear(x, x_proj) splits into [Δ_raw, B, C] of sizes (r, n, n); Δ = F.linear(Δ_raw, "
        "dt_proj) (bias not yet), B and C transposed to (b, n, l)",
        "selective_scan_sequential(x, Δ, −exp(A_log), B, C, D, z, dt_proj.bias, "
        "delta_softplus=True), then hidden + F.linear(y.transpose(1, 2), out_proj)",
    ],
}
f64 = torch.float64


def rms_norm(fn):
    """Check ``fn(x, weight, eps=1e-5)`` against ``model.RMSNorm`` on fresh shapes, in float64."""
    g = _core.generator()
    n = 0
    for shape, eps in [((3, 5, 8), 1e-5), ((1, 1, 1), 1e-5), ((2, 7), 1e-2), ((4, 3, 2, 6), 1e-6)]:
        x = torch.randn(*shape, generator=g, dtype=f64) * 3
        x[..., 0] = 0.0 if shape[-1] > 1 else x[..., 0]  # a zero entry: the mean is over the row
        weight = torch.randn(shape[-1], generator=g, dtype=f64)
        norm = model.RMSNorm(shape[-1], eps=eps).double()
        with torch.no_grad():
            norm.weight.copy_(weight)
            want = norm(x)
        case = _core.describe(x=x, eps=eps)
        _core.compare(_core.call(fn, x, weight, eps=eps, case=case), want, what="rms_norm",
                      case=case, g=g)
        n += 1
    _core.passed("rms_norm", n)


def _config(g, **fixed):
    ri = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    cfg = dict(vocab_size=8, d_model=ri(3, 9), n_layers=1, d_state=ri(1, 6), d_conv=ri(2, 5),
               expand=ri(1, 3), dt_rank=ri(1, 4), backend="sequential")
    cfg.update(fixed)
    return model.MambaConfig(**cfg)


def _weights(cfg, g):
    """A float64 Block with every weight drawn fresh (not the initialisation)."""
    block = model.Block(cfg).double()
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=f64) * 0.5)
            elif name.endswith("dt_proj.bias"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=f64) - 1)
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=f64) / math.sqrt(p.shape[-1]))
    return block


def _reference(hidden, w, cfg, wrong=None):
    """The block written out, with one part made wrong on request (``wrong`` names it)."""
    d, n, r = cfg.expand * cfg.d_model, cfg.d_state, cfg.dt_rank
    rms = torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + 1e-5)  # (b, l, 1)
    u = hidden if wrong == "norm" else hidden * rms * w["norm.weight"]
    x, z = F.linear(u, w["mixer.in_proj.weight"]).chunk(2, dim=-1)  # (b, l, d) each
    if wrong == "xz":
        x, z = z, x
    k = w["mixer.conv_weight"].shape[1]
    pad = (k - 1, 0) if wrong != "conv" else ((k - 1) // 2, k - 1 - (k - 1) // 2)
    xc = F.conv1d(F.pad(x.transpose(1, 2), pad), w["mixer.conv_weight"][:, None, :],
                  w["mixer.conv_bias"], groups=d)  # (b, d, l)
    xc = xc if wrong == "conv_silu" else F.silu(xc)
    dt, B, C = F.linear(xc.transpose(1, 2), w["mixer.x_proj.weight"]).split([r, n, n], dim=-1)
    if wrong == "BC":
        B, C = C, B
    delta = F.linear(dt, w["mixer.dt_proj.weight"]).transpose(1, 2)  # (b, d, l)
    y = selective_scan_sequential(
        xc, delta, -torch.exp(w["mixer.A_log"]), B.transpose(1, 2), C.transpose(1, 2),
        None if wrong == "D" else w["mixer.D"],
        None if wrong in ("gate", "gate_sigmoid") else z.transpose(1, 2),
        w["mixer.dt_proj.bias"], delta_softplus=wrong != "softplus")  # (b, d, l)
    if wrong == "gate_sigmoid":
        y = y * torch.sigmoid(z.transpose(1, 2))
    out = F.linear(y.transpose(1, 2), w["mixer.out_proj.weight"])  # (b, l, d_model)
    return out if wrong == "residual" else hidden + out


WRONG = {
    "norm": "the input is not normalised: rms_norm(hidden) goes into in_proj",
    "xz": "x and z are swapped: in_proj's output splits as [x, z], x first",
    "conv": "the convolution is not causal: pad k − 1 steps on the left only",
    "conv_silu": "the SiLU after the convolution is missing",
    "BC": "B and C are swapped: x_proj's output splits as [Δ_raw, B, C]",
    "D": "the skip term D·x is missing",
    "gate": "the gate y·silu(z) is missing",
    "gate_sigmoid": "the gate uses sigmoid(z) instead of silu(z)",
    "softplus": "Δ skips the softplus (Δ = softplus(dt_proj(Δ_raw) + dt_bias))",
    "residual": "the residual is missing: the block returns hidden + out_proj(…)",
}


def _hint(got, hidden, w, cfg):
    for key, what in WRONG.items():
        if _core.matches(got, _reference(hidden, w, cfg, key)):
            return f"\nhint: your output is the block's when {what}."
    return ""


def mamba_block(fn):
    """Check ``fn(hidden, w) -> hidden'`` against ``model.Block`` with the same weights ``w``:
    the output and the gradients with respect to ``hidden`` and every weight, in float64."""
    g = _core.generator()
    ri = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    cases = [("a random block", _config(g), 2, ri(5, 12)),
             ("length l = 1", _config(g), 2, 1),
             ("l shorter than the conv (l = 2, k = 4)", _config(g, d_conv=4), 1, 2),
             ("one state per channel (n = 1), expand 1", _config(g, d_state=1, expand=1), 3, 7),
             ("a wider block, odd l", _config(g, d_model=8, d_state=4, dt_rank=2), 1,
              2 * ri(4, 9) + 1)]
    for desc, cfg, b, l in cases:
        block = _weights(cfg, g)
        w = {k: v.detach().clone() for k, v in block.state_dict().items()}
        hidden = torch.randn(b, l, cfg.d_model, generator=g, dtype=f64)
        grad_out = torch.randn(b, l, cfg.d_model, generator=g, dtype=f64)
        case = (f"{desc} [b={b}, l={l}, d_model={cfg.d_model}, expand={cfg.expand}, "
                f"n={cfg.d_state}, k={cfg.d_conv}, r={cfg.dt_rank}]")
        got, got_dh, got_dw = _core.probe(_probes.block_grads, fn, hidden, w, grad_out, case=case)
        h = hidden.clone().requires_grad_()
        want = block(h)
        params = dict(block.named_parameters())
        grads = torch.autograd.grad(want, [h] + list(params.values()), grad_out)
        try:
            _core.compare(got, want.detach(), what="mamba_block: the output", case=case)
        except AssertionError as e:
            raise AssertionError(str(e) + _hint(got, hidden, w, cfg)) from None
        _core.compare(got_dh, grads[0], what="mamba_block: the gradient of hidden", case=case,
                      grad=True)
        for (name, _), want_g in zip(params.items(), grads[1:], strict=True):
            if got_dw.get(name) is None:
                raise AssertionError(f"mamba_block: no gradient reaches the weight {name!r} on "
                                     f"{case}: is it used (and not detached)?")
            _core.compare(got_dw[name], want_g, what=f"mamba_block: the gradient of {name}",
                          case=case, grad=True)
    _core.passed("mamba_block", len(cases))
