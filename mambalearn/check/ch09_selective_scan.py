"""Checks for chapter 09: the forward of the fused Mamba-1 selective scan kernel.

    Δ_t = softplus(delta_t + delta_bias)     h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_t
    y_t = C_t h_t + D x_t                    out_t = y_t · silu(z_t)

The exercise completes pieces of a kernel skeleton (discretize, fold the carried state into the
block's first step, scan along time with ⊗, carry the last step to the next block, y += C·h, then
the D skip and the gate); the launcher around it is given. The notebook's check cell is
``check.selective_scan_kernel(selective_scan_kernel, combine_fn)``.

``fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, block_l=...)`` is
called like ``mamba_ssm.selective_scan_fn`` with a time block ``block_l``, on fresh random inputs:
one step, odd lengths, lengths that are not a multiple of the time block, with and without z, D,
delta_bias and softplus, B/C shared (b, n, l), grouped (b, g, n, l) and fixed (d, n), a strided
input, extreme Δ. Output and last state are compared with the float64 sequential oracle.
"""

import re

import torch
import torch.nn.functional as F

from mambalearn import device
from mambalearn.check import _core, _probes
from mambalearn.check.ch08_triton import triton_evidence
from mambalearn.check.treeorder import tree_order
from mambalearn.scan.sequential import selective_scan_sequential

__all__ = ["selective_scan_kernel"]
REBUILDS = {  # the Triton kernels and launchers, and the PyTorch scans with the same signature
    "selective_scan_kernel": ["@mamba1 kernels", "@mamba1 scans",
                              "@elementwise combines"],
}

HINTS = {
    "selective_scan_kernel": [
        "combine_fn as in chapter 08: (a_r * a_l, a_r * u_l + u_r), the earlier step on the left",
        "per state n: a = exp(dt · A_n[:, None]), bx = dt · B_n · x; fold the carried state into "
        "step 0 (tl.where(cols[None, :] == 0, a · h_in[:, None] + bx, bx)); scan along axis 1",
        "carry column BLOCK_L − 1 of h into column n of H, y += C_n · h; after the states: y += "
        "x · D if HAS_D, then y *= z · sigmoid(z) if HAS_Z",
    ],
}

# b, d, n, l, time block, layouts of (B, C), which of D / z / delta_bias / softplus, extras
CASES = [
    dict(b=1, d=3, n=2, l=1, block_l=8, bc=("shared", "shared"), opts="Dzbs"),  # one step
    dict(b=2, d=4, n=3, l=13, block_l=4, bc=("shared", "shared"), opts="D"),  # odd l, 4 blocks
    dict(b=1, d=6, n=4, l=21, block_l=8, bc=("grouped", "grouped"), opts="Dzbs"),  # 3 groups
    dict(b=2, d=5, n=2, l=16, block_l=8, bc=("fixed", "fixed"), opts="zs"),  # two full blocks
    dict(b=1, d=4, n=3, l=11, block_l=4, bc=("fixed", "shared"), opts="Dbs", strided=True),
    dict(b=1, d=4, n=2, l=9, block_l=4, bc=("grouped", "fixed"), opts="Dzs", extreme=True),
]
OPTIONS = (("D", "D"), ("z", "z"), ("b", "delta_bias"), ("s", "softplus"))


def _inputs(c, g):
    """Fresh float64 inputs for case ``c`` (CPU); the student's kernel gets fp32 copies."""
    b, d, n, l = c["b"], c["d"], c["n"], c["l"]
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    groups = 3 if d % 3 == 0 else 2 if d % 2 == 0 else 1  # g divides d
    shape = {"shared": (b, n, l), "grouped": (b, groups, n, l), "fixed": (d, n)}
    softplus = "s" in c["opts"]
    # without softplus Δ is used as given, so it must be positive
    delta = 0.5 * r(b, d, l) if softplus else 0.05 + torch.rand(b, d, l, generator=g,
                                                                 dtype=torch.float64)
    if c.get("extreme"):  # softplus's linear branch (> 20) and Δ ≈ 0: Ā ≈ 0 and Ā ≈ 1
        delta[..., 1::3], delta[..., 2::3] = 25.0, -25.0
    A = -(0.5 + torch.rand(d, n, generator=g, dtype=torch.float64))  # decays in (e^-1.5Δ, e^-0.5Δ)
    x = dict(u=r(b, d, l), delta=delta, A=A,
             B=r(*shape[c["bc"][0]]), C=r(*shape[c["bc"][1]]),
             D=r(d) if "D" in c["opts"] else None, z=r(b, d, l) if "z" in c["opts"] else None,
             delta_bias=0.3 * r(d) if "b" in c["opts"] else None)
    return x, softplus


def _to_kernel(x, strided):
    """fp32 copies on the course device; ``strided``: u and delta stored (b, l, d), transposed."""
    dev = device.get()
    out = {k: None if v is None else v.float().to(dev) for k, v in x.items()}
    if strided:
        for k in ("u", "delta"):
            out[k] = out[k].transpose(1, 2).contiguous().transpose(1, 2)  # (b, d, l), strided
    return out


def _describe(c, x):
    shapes = {"shared": "(b, n, l)", "grouped": "(b, g, n, l)", "fixed": "(d, n)"}
    parts = [f"b={c['b']}, d={c['d']}, n={c['n']}, l={c['l']}, block_l={c['block_l']}",
             f"B {shapes[c['bc'][0]]}" + (f" g={x['B'].shape[1]}" if x["B"].ndim == 4 else ""),
             f"C {shapes[c['bc'][1]]}" + (f" g={x['C'].shape[1]}" if x["C"].ndim == 4 else ""),
             "with " + (", ".join(name for key, name in OPTIONS if key in c["opts"])
                        or "none of D, z, delta_bias, softplus")]
    if c.get("strided"):
        parts.append("u, delta strided")
    if c.get("extreme"):
        parts.append("extreme Δ (±25)")
    return ", ".join(parts)


def _variants(x, softplus):
    """(what differs, output) for the wrong versions a check can tell apart from the right one."""
    core = lambda **kw: selective_scan_sequential(**{**x, "D": None, "z": None, **kw})
    y = core(delta_softplus=softplus)  # Σ_n C_n h_n alone (b, d, l)
    D, z, u = x["D"], x["z"], x["u"]
    skip = 0 if D is None else D[:, None] * u
    gate = 1 if z is None else F.silu(z)
    out = []
    if z is not None:
        for name, act in (("sigmoid(z) instead of silu(z) = z·sigmoid(z)", torch.sigmoid),
                          ("z itself, without the silu", lambda v: v),
                          ("nothing: the gate by silu(z) is missing", lambda v: 1),
                          ("relu(z) instead of silu(z)", F.relu)):
            out.append((f"the gate multiplies by {name}", (y + skip) * act(z)))
        if D is not None:
            out.append(("the D skip is added after the gate: it must be (y + D·x)·silu(z)",
                        y * gate + skip))
    if D is not None:
        out.append(("the D skip (y += D·x) is missing", y * gate))
    if softplus:
        out.append(("Δ is used without the softplus", (core(delta_softplus=False) + skip) * gate))
    if x["delta_bias"] is not None:
        out.append(("Δ misses delta_bias (added to delta before the softplus)",
                    (core(delta_bias=None, delta_softplus=softplus) + skip) * gate))
    return out


def _hint(err, c, x, got, softplus):
    """Name the likely bug: a missing carry (first wrong step opens a block), or the one part of
    the output (the gate, the D skip, Δ) whose wrong version the output equals."""
    m = re.search(r"first wrong index \((\d+), (\d+), (\d+)\)", str(err))
    if m and int(m.group(3)) > 0 and int(m.group(3)) % c["block_l"] == 0:
        t = int(m.group(3))
        return (f"\nhint: step {t} is the first step of time block {t // c['block_l']} and every "
                "earlier step is right: is the state carried in from the previous block "
                "(folded into step 0: Ā₀·h_in + B̄₀x₀) and the carry updated from the block's "
                "last step?")
    for what, wrong in _variants(x, softplus):
        if _core.matches(got.cpu().double(), wrong, dtype=torch.float32):
            return f"\nhint: your output is what you get when {what}."
    return ""


def selective_scan_kernel(fn, combine_fn=None):
    """Check ``fn`` (a fused selective-scan forward, mamba_ssm's signature plus ``block_l``).

    1. ``combine_fn(a_l, u_l, a_r, u_r)``, if given, against ⊗ in every bracketing (`tree_order`).
    2. ``fn(..., return_last_state=True, block_l=...)`` on the cases of ``CASES``: out (b, d, l)
       and the last state (b, d, n) against the float64 sequential oracle.
    """
    g = _core.generator()
    n_checks = 0
    if combine_fn is not None:
        n_checks += tree_order(combine_fn, name="combine_fn", g=g)
    for c in CASES:
        x, softplus = _inputs(c, g)
        case = _describe(c, x)
        res, seen = _core.probe(_probes.call_watching_triton, fn,
                                **_to_kernel(x, c.get("strided", False)),
                                delta_softplus=softplus, return_last_state=True,
                                block_l=c["block_l"], case=case)
        triton_evidence("selective_scan_kernel", seen, case, "selective_scan_fwd_kernel")
        if not isinstance(res, tuple) or len(res) != 2:
            raise AssertionError(f"selective_scan_kernel on {case}: with return_last_state=True "
                                 f"expected (out, last_state), got {_core.kind(res)}")
        out, last = res
        want, want_last = selective_scan_sequential(**x, delta_softplus=softplus,
                                                    return_last_state=True)
        try:
            _core.compare(out, want, what="selective_scan_kernel: out", case=case, g=g,
                          dtype=torch.float32)
        except AssertionError as e:
            raise AssertionError(str(e) + _hint(e, c, x, out, softplus)) from None
        _core.compare(last, want_last, what="selective_scan_kernel: the last state h_{l−1}",
                      case=case, g=g, dtype=torch.float32)
        n_checks += 2
    _core.passed("selective_scan_kernel", n_checks)
