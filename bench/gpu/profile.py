"""Nsight Compute profiles of our kernels and mamba_ssm's (where chapters 09–11's time goes).

    python3 bench/gpu/profile.py run WORKLOAD   # one workload, in cudaProfilerStart/Stop
    python3 bench/gpu/profile.py ncu OUTDIR WORKLOAD...  # each under ncu, then reports
    TRITON_INTERPRET=0 python3 bench/gpu/profile.py sm90 N [FORWARD] [DUMP]  # no GPU

Workloads (one forward + backward each, after a warm-up run outside the profiled range):
    m1_16, m1_64        our Mamba-1 selective scan (default kernels), b8 d2048 n16/n64 l2048 bf16
    m1cuda_16, m1cuda_64  mamba_ssm's CUDA selective scan at the same shapes (needs its build)
    ssd, ssdref         our SSD (unfused forward + backward, then the fused forward) and
                        mamba_ssm's Triton SSD, b4 l4096 h80 p64 n128 g1 chunk 256 bf16

``sm90`` needs no GPU: it compiles, for ``GPUTarget("cuda", 90, 32)``, every kernel the Mamba-1
launchers would launch for one forward and backward at b8 d2048 n=N l2048 bf16 (the default
config, or the forward of ``config.FORWARD_VARIANTS[_LARGE_N]`` named FORWARD), with the
launch's own specialisation, and prints registers, stack, SASS instruction counts and how far
ahead of their first use the 16-byte loads are issued (median instructions); DUMP: a path prefix
for the SASS / TTGIR files. It is how the sm_90 figures in bench/NOTES_selective_scan.md are made.

`ncu` runs with ``--clock-control none`` (METHOD.md: leave the clocks alone), only kernels whose
name starts with "_" (Triton's) or contains "selective_scan" (CUDA's), and the sections that say
where a kernel's time goes: speed of light, occupancy, launch, warp states (stall reasons),
scheduler, pipes, memory, instruction mix, and the sampled stall locations. Per workload it
writes OUTDIR/WORKLOAD.txt (ncu's details page) and OUTDIR/WORKLOAD.csv (chosen raw metrics).
"""

import os
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
SECTIONS = ["SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats", "SchedulerStats",
            "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "InstructionStats",
            "SourceCounters"]
M1 = dict(b=8, d=2048, l=2048)
SSD = dict(b=4, l=4096, h=80, p=64, g=1, n=128)


def _workload(name):
    """A closure that runs the workload once (forward and backward)."""
    import torch

    from course.bench.selective_scan import fwd_bwd, inputs, load_mamba_ssm
    if name.startswith("m1"):
        n = int(name.split("_")[1])
        x = inputs(**M1, n=n, device=torch.device("cuda"))
        if name.startswith("m1cuda"):
            fn = load_mamba_ssm()
            if fn is None:
                raise SystemExit("mamba_ssm's CUDA extension is not built")
        else:
            from mambalearn.mamba1.api import selective_scan_fn as fn
        return fwd_bwd(fn, x)
    from course.bench.ssd import load_mamba_ssm_ssd, make_inputs
    (x, dt, A, B, C), kw = make_inputs(**SSD)
    leaves = [t.detach().requires_grad_() for t in (x, dt, A, B, C, kw["D"], kw["dt_bias"])]
    if name == "ssdref":
        fn = load_mamba_ssm_ssd()
    else:
        from mambalearn.mamba2 import mamba_chunk_scan_combined as fn

    def run():
        out = fn(*leaves[:5], 256, D=leaves[5], dt_bias=leaves[6], dt_softplus=True)
        torch.autograd.grad(out, leaves, torch.ones_like(out))
        if name == "ssd":
            with torch.no_grad():
                fn(*leaves[:5], 256, D=leaves[5], dt_bias=leaves[6], dt_softplus=True, fused=True)
    return run


def run(name):
    import torch
    fn = _workload(name)
    fn()  # compile, warm caches (not profiled)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


KEEP = ("Kernel Name", "gpu__time_duration.sum", "launch__registers_per_thread",
        "launch__occupancy_limit_registers", "launch__grid_size", "launch__block_size",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes.sum",
        "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "lts__t_sectors_op_red.sum",
        "smsp__average_warp_latency_per_inst_issued.ratio")


def _keep_columns(raw_csv, path):
    """The raw page has thousands of metrics: keep KEEP, the stall reasons and the pipes."""
    import csv
    import io
    rows = list(csv.reader(io.StringIO(raw_csv)))
    if not rows:
        return
    keep = [i for i, h in enumerate(rows[0]) if h in KEEP
            or (h.startswith("smsp__average_warps_issue_stalled_")
                and h.endswith("per_issue_active.ratio"))
            or (h.startswith("sm__inst_executed_pipe_")
                and h.endswith("pct_of_peak_sustained_active"))]
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([r[i] for i in keep if i < len(r)] for r in rows)


def _ncu_binary():
    import glob
    import shutil
    found = shutil.which("ncu") or sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")
                                          + glob.glob("/usr/local/cuda*/bin/ncu"))
    return found if isinstance(found, str) else (found[-1] if found else "ncu")


def ncu(outdir, names):
    os.makedirs(outdir, exist_ok=True)
    exe = _ncu_binary()
    for name in names:
        t0 = time.time()
        rep = os.path.join(outdir, name)
        cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "-f", "-o", rep,
               "-k", "regex:^_|selective_scan", "--import-source", "no"]
        cmd += [a for s in SECTIONS for a in ("--section", s)]
        cmd += [sys.executable, os.path.abspath(__file__), "run", name]
        r = subprocess.run(cmd, capture_output=True, text=True)
        with open(rep + ".txt", "w") as f:
            f.write(r.stdout[-4000:] + r.stderr[-4000:])
            if os.path.exists(rep + ".ncu-rep"):
                f.write(subprocess.run([exe, "-i", rep + ".ncu-rep", "--page", "details"],
                                       capture_output=True, text=True).stdout)
        if os.path.exists(rep + ".ncu-rep"):
            raw = subprocess.run([exe, "-i", rep + ".ncu-rep", "--page", "raw", "--csv"],
                                 capture_output=True, text=True).stdout
            _keep_columns(raw, rep + ".csv")
            os.remove(rep + ".ncu-rep")
        print(f"{name}: rc {r.returncode}, {time.time() - t0:.0f}s", flush=True)


def _sass_stats(cubin, dump=None):
    """Registers, stack, instruction counts and the median load-to-use distance of a cubin."""
    import re
    import tempfile

    import triton
    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    path = os.path.join(tempfile.mkdtemp(), "k.cubin")
    open(path, "wb").write(cubin)
    res = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", path],
                         capture_output=True, text=True).stdout
    sass = subprocess.run([os.path.join(tools, "cuobjdump"), "-sass", path],
                          capture_output=True, text=True).stdout
    if dump:
        open(dump + ".sass", "w").write(sass)
    body = re.findall(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);", sass)
    ops = [re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in body if i.strip()]
    ahead = []
    for i, ins in enumerate(body):
        m = re.search(r"LDG\.E\.128\s+R(\d+),", ins)
        if m:  # instructions until one of its 4 registers is read
            regs = {f"R{int(m.group(1)) + k}" for k in range(4)}
            use = next((j for j in range(i + 1, len(body)) if regs & set(
                re.findall(r"R\d+", body[j].split(",", 1)[1] if "," in body[j] else ""))), None)
            ahead += [use - i] if use else []
    stats = dict(regs=int(re.search(r"REG:(\d+)", res).group(1)),
                 stack=int(re.search(r"STACK:(\d+)", res).group(1)), instr=len(ops))
    stats.update({k: ops.count(k) for k in ("MUFU", "SHFL", "BAR", "LDG", "STG", "LDS", "LDL")})
    stats["ldg128_ahead_median"] = sorted(ahead)[len(ahead) // 2] if ahead else None
    return stats


def sm90(n, forward=None, dump=None):
    """Offline sm_90 builds of the kernels one forward + backward launches (see the docstring)."""
    import types

    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as tcompile
    from triton.runtime.jit import JITFunction, create_function_from_signature

    from course.bench.selective_scan import inputs
    from mambalearn.mamba1 import args as interface
    from mambalearn.mamba1 import config, selective_scan_fn
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)

    def build(self, *args, grid, warmup, **kwargs):  # instead of a launch: compile, report
        binder = create_function_from_signature(self.signature, self.params, backend)
        bound, spec, options = binder(*args, **kwargs)
        options, sig, consts, attrs = self._pack_args(backend, kwargs, bound, spec, options)
        k = tcompile(ASTSource(self, sig, consts, attrs), target=target,
                     options=options.__dict__)
        prefix = f"{dump}_{self.__name__}" if dump else None
        print(self.__name__, _sass_stats(k.asm["cubin"], prefix), flush=True)

    JITFunction.run = build
    interface.device = types.SimpleNamespace(interpreted=lambda: True)  # CPU tensors are fine
    cfg = config.default_config(n, "cuda")
    if forward:
        cfg = cfg.replace(forward={**config.FORWARD_VARIANTS,
                                   **config.FORWARD_VARIANTS_LARGE_N}[forward])
    x = {k: v.requires_grad_() for k, v in inputs(8, 2048, n, 2048, torch.device("cpu")).items()}
    out = selective_scan_fn(**x, delta_softplus=True, config=cfg)
    out.backward(torch.ones_like(out))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2])
    elif sys.argv[1] == "sm90":
        sm90(int(sys.argv[2]), *sys.argv[3:5])
    else:
        ncu(sys.argv[2], sys.argv[3:])
