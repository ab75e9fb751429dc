"""Device script: where MIMO rank 1 on the SISO kernels loses dAngles on the GPU.

``mimo_speed``'s agreement (b1 l200 h32 g1 p64 n128 na32, chunk 64, bf16, float32 Angles) gave
dAngles 4.06 relative error through ``rank_one="siso"`` on an H200, while the same call in
Triton's CPU interpreter gives 0.015. This script splits the suspects, each line one check:

    1. the steps kernel alone (``backward._steps_kernel``: the reverse cumsum of dθ inside a
       chunk plus the later chunks' totals) on random dθ against PyTorch's flip-cumsum, with
       float32 and bf16 Angles, l 200 and 192;
    2. SISO alone (``mamba3_siso_combined``) on the folded inputs against the float64 SISO
       chunked oracle: float32 Angles as the fold passes them, the same values in bf16, l 200
       and 192; every gradient's relative error;
    3. the dAngles error of check 2 per chunk (which chunks carry it);
    4. inside SISO's backward (the steps kernel's arguments captured): the dq/dk kernel's dθ per
       step against the float64 oracle's, its per-chunk totals against the sums of its dθ, and
       the steps kernel's dAngles against PyTorch's reverse cumsum of that dθ; with the dq/dk
       kernel at 1 head a program (what b1 l200 h32 gets) and at 4 (``Config``).

    python3 -m bench.gpu.rank_one_dangles --out $OUT   (H200, ≤ 90 s; prints, and saves check 4's
        tensors to OUT/rank_one_dangles.pt, ~5 MB: dθ ours and the oracle's, chunk totals, dAngles,
        Angles and DT, for a look at the error's pattern on any machine)
    python3 -m bench.gpu.rank_one_dangles --cpu    (any machine, interpreter, small shape)
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from mambalearn import device as _device  # noqa: E402,F401  (interpreter switch first)


def steps_alone(l, ang_dtype, dev, h=4, na=32, q=64):
    """The steps kernel's dAngles against PyTorch on random dθ: relative error."""
    import triton

    from mambalearn.mamba3.backward import _steps_kernel
    from mambalearn.testing import rel_error

    gen = torch.Generator().manual_seed(3)
    rr = lambda *s: torch.randn(*s, generator=gen).to(dev)
    b, c = 1, triton.cdiv(l, q)
    ang = rr(b, l, h, na).to(ang_dtype)
    DT = torch.nn.functional.softplus(rr(b, h, l) - 2)
    trap = rr(b, h, l).to(torch.bfloat16)
    dth = rr(b, l, h, na)
    pad = torch.zeros(b, c * q, h, na, device=dev)
    pad[:, :l] = dth
    tot = pad.view(b, c, q, h, na).sum(2).permute(0, 2, 1, 3).contiguous()  # (b, h, c, na)
    zeros = lambda *s: torch.zeros(*s, device=dev)
    dW, dG, dcv, dcq = zeros(b, h, l), zeros(b, h, l), zeros(b, h, l), zeros(b, h, 1, l)
    dAng = torch.full_like(ang, float("nan"))
    dDT, dTrap, dADT = torch.empty_like(DT), torch.empty_like(trap), torch.empty_like(DT)
    _steps_kernel[(h * c, b)](ang, DT, trap, dth, tot, None, dW, dG, None, dcv, dcq,
                              dAng, dDT, dTrap, dADT, l, c, h, na, Q=q, NA=na, NB=1, CB=16,
                              num_warps=4)
    tail = dth.flip(1).cumsum(1).flip(1)  # Σ_{s≥t} dθ_s
    th = torch.tanh(ang.float())
    want = tail * DT.permute(0, 2, 1)[..., None] * torch.pi * (1 - th * th)
    return rel_error(dAng, want)


def siso_alone(l, ang_bf16, dims, chunk, dev, config=None, capture=None):
    """SISO on the folded rank-1 inputs of ``mimo_speed`` vs the float64 SISO chunked oracle:
    {name: relative error}, and dAngles' error per chunk. ``capture`` (a dict): the steps
    kernel's arguments and the inputs/oracle gradients go there."""
    from bench.gpu.mimo_speed import inputs
    from mambalearn.mamba3 import mamba3_siso_combined
    from mambalearn.mamba3.reference_chunked import mamba3_siso_chunked
    from mambalearn.testing import rel_error

    x = inputs(**{**dims, "l": l}, r=1, dtype=torch.bfloat16, device=dev, seed=1)
    s = dict(Q=x["Q"][:, :, 0], K=x["K"][:, :, 0],
             V=x["V"] * (x["MIMO_V"][:, 0] * x["MIMO_Out"][:, 0]).to(torch.bfloat16),
             ADT=x["ADT"], DT=x["DT"], Trap=x["Trap"], Q_bias=x["Q_bias"][:, 0],
             K_bias=x["K_bias"][:, 0], Angles=x["Angles"], D=x["D"],
             Z=x["Z"] * x["MIMO_Z"][:, 0].to(torch.bfloat16))
    if ang_bf16:  # the same values, bf16-rounded, in bf16
        s["Angles"] = s["Angles"].to(torch.bfloat16)
    s = {k: v.detach().contiguous() for k, v in s.items()}
    ours = {k: v.clone().requires_grad_() for k, v in s.items()}
    ref = {k: v.double().requires_grad_() for k, v in s.items()}
    out = mamba3_siso_combined(**ours, chunk_size=chunk, config=config)
    want = mamba3_siso_chunked(**ref, chunk_size=16)
    g = torch.randn(want.shape, generator=torch.Generator().manual_seed(2)).to(dev)
    (out.float() * g).sum().backward()
    (want * g.double()).sum().backward()
    errs = {"out": rel_error(out, want)}
    errs |= {f"d{k}": rel_error(ours[k].grad, ref[k].grad) for k in s}
    a, e = ours["Angles"].grad.double(), ref["Angles"].grad
    per = [((a - e)[:, i:i + chunk].norm() / e.norm()).item() for i in range(0, l, chunk)]
    if capture is not None:
        capture.update(x=s, ref_dAng=e)
    return errs, per


def inside(l, dims, chunk, dev, hpp, keep=None):
    """Check 4: the steps kernel's inputs and output, captured from one SISO backward (and, with
    ``keep`` a dict, the tensors, on the CPU)."""
    from mambalearn.mamba3 import backward as B
    from mambalearn.mamba3.config import DEFAULT
    from mambalearn.testing import rel_error

    real, cap = B._steps_kernel, {}

    class Shim:  # records the launch's arguments, then launches the real kernel
        def __getitem__(self, grid):
            def launch(*args, **kw):
                cap["args"] = args
                return real[grid](*args, **kw)
            return launch

    cfg = DEFAULT.replace(heads_per_program=hpp, min_programs=1)
    B._steps_kernel = Shim()
    try:
        siso_alone(l, False, dims, chunk, dev, cfg, cap)
    finally:
        B._steps_kernel = real
    ang, dt, dth, tot, dAng = (cap["args"][i] for i in (0, 1, 3, 4, 11))
    a = ang.double()
    rate = (dt.double().permute(0, 2, 1)[..., None] * torch.pi * (1 - torch.tanh(a) ** 2))
    T = cap["ref_dAng"].to(dev) / rate  # Σ_{s≥t} dθ_s of the oracle
    ref_dth = T - torch.cat([T[:, 1:], torch.zeros_like(T[:, :1])], 1)
    b, _, h, na = dth.shape
    c = tot.shape[2]
    pad = torch.zeros(b, c * chunk, h, na, device=dev, dtype=torch.float64)
    pad[:, :l] = dth.double()
    sums = pad.view(b, c, chunk, h, na).sum(2).permute(0, 2, 1, 3)
    want = dth.double().flip(1).cumsum(1).flip(1) * rate
    per = [((dth.double() - ref_dth)[:, i:i + chunk].norm() / ref_dth.norm()).item()
           for i in range(0, l, chunk)]
    per += [((dth.double() - ref_dth)[..., j:j + 16].norm() / ref_dth.norm()).item()
            for j in range(0, na, 16)]  # the column blocks' pairs (BN = 32: 16 pairs a block)
    if keep is not None:
        keep.update({k: v.detach().float().cpu() for k, v in dict(
            dth=dth, ref_dth=ref_dth, dth_tot=tot, dAng=dAng, ref_dAng=cap["ref_dAng"],
            Angles=ang, DT=dt).items()})  # the other inputs: mimo_speed.inputs, seed 1
    return (rel_error(dth, ref_dth), rel_error(tot, sums), rel_error(dAng, want),
            rel_error(dAng, cap["ref_dAng"]), per)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="small shape in the interpreter")
    p.add_argument("--out", default=None, help="folder for check 4's tensors")
    a = p.parse_args(argv)
    dev = "cpu" if a.cpu else "cuda"
    dims = dict(b=1, h=2, g=1, p=16, n=128, na=32) if a.cpu else \
        dict(b=1, h=32, g=1, p=64, n=128, na=32)
    for l in (200, 192):
        for dt in (torch.float32, torch.bfloat16):
            print(f"1. steps kernel alone, l{l}, Angles {dt}: dAngles rel err "
                  f"{steps_alone(l, dt, dev):.3g}", flush=True)
    for l in (200, 192):
        for bf in (False, True):
            errs, per = siso_alone(l, bf, dims, 64, dev)
            worst = max(errs, key=errs.get)
            print(f"2. SISO alone l{l} Angles {'bf16' if bf else 'float32'}: worst {worst} "
                  f"{errs[worst]:.3g}; " + " ".join(f"{k} {v:.2g}" for k, v in errs.items()),
                  flush=True)
            print("3.   dAngles error per chunk of 64 (share of ‖dAngles‖): "
                  + " ".join(f"{v:.2g}" for v in per), flush=True)
    saved = {}
    for hpp in (1, 4):
        keep = saved.setdefault(f"hpp{hpp}", {})
        dth, tot, steps, end, per = inside(200, dims, 64, dev, hpp, keep)
        print(f"4. l200, {hpp} head(s) a dq/dk program: dθ vs oracle {dth:.3g} (per chunk, then "
              f"per column block: " + " ".join(f"{v:.2g}" for v in per) + f"); chunk totals vs "
              f"Σ dθ {tot:.3g}; steps kernel vs reverse cumsum {steps:.3g}; dAngles vs oracle "
              f"{end:.3g}", flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        torch.save(saved, Path(a.out) / "rank_one_dangles.pt")


if __name__ == "__main__":
    main()
