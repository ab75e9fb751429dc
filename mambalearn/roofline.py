"""Bytes, operations and the roofline: how fast can a scan possibly run on this machine?

A kernel needs at least  bytes / bandwidth  (every input read once, every output written once
through HBM) and at least  ops / rate  for each unit it keeps busy (FMA pipes, tensor cores, the
special-function units (SFU) that compute exp). The largest of these times is the *floor*:

    floor = max(bytes / BW, flops / FLOP/s, exps / exp/s),    intensity = flops / bytes.

For the selective scan with N = b·d·l·n state elements and M = b·d·l inputs per tensor:

    fused kernel   reads u, Δ, z, B, C, writes y:   ≈ (3 + 1)·M·s_in bytes,    N + 4M exps
    store states   + writes Ā, B̄x, h and reads them back:      + 6·N·s_state bytes
    naive loop     + Ā, B̄x (2N written, 2N read); per step h read, written, read for y:
                                                              + 7·N·s_state

so materializing (b, d, l, n) tensors multiplies the bytes by about 1.5·n·s_state/s_in. Both
counts grow linearly in l, so the factor does not depend on the sequence length: it grows with
the state size n and with the ratio of state to input bytes (at n = 16, bf16 inputs, fp32
states: ~50×; with fp32 inputs ~25×).

A roofline puts a measured kernel on one picture whatever unit binds it: with T_b = bytes / BW
and T_c the largest compute term (FMA, tensor cores or exps), x = T_c / T_b is its intensity in
units of that unit's ridge point and y = T_c / t the fraction of that unit's peak it reached;
the roof is y = min(1, x), and floor / t is the fraction of its floor (:func:`placement`).

    Cost, Machine, H200                 the numbers and the reference machine
    selective_scan_cost, ssd_cost, decode_cost
    floor, BENCHMARKS, benchmark_floors, percent_of_floor
    placement, KERNELS, MEASURED, measured_placements   the course's kernels on the roofline,
                                        their times read from the results store
    measure_copy_bandwidth, measure_launch_overhead, this_machine
    naive_selective_scan, measure_naive  the (b, d, l, n)-materializing scan and its bandwidth
"""

import time
from dataclasses import dataclass, replace

import torch

from mambalearn import results
from mambalearn.device import sm_count


@dataclass(frozen=True)
class Cost:
    """What one call must do: HBM bytes, FLOPs (FMA pipes), matmul FLOPs (tensor cores), SFU exps.

    ``launches`` counts kernel launches where they dominate (the naive loop), else 0.
    """

    bytes: float
    flops: float = 0.0
    exps: float = 0.0
    matmul_flops: float = 0.0
    launches: int = 0

    @property
    def intensity(self):
        """Arithmetic intensity, FLOP per byte (both kinds of FLOPs)."""
        return (self.flops + self.matmul_flops) / self.bytes


@dataclass(frozen=True)
class Machine:
    """Ceilings: bandwidth (bytes/s, read + write), FLOP/s (fp32 FMA pipes), matmul FLOP/s (bf16
    tensor cores), exp/s (SFU), kernel launch overhead (s), and where each number comes from."""

    name: str
    bandwidth: float
    flops: float
    matmul_flops: float
    exps: float
    launch_s: float | None = None
    source: str = ""


def sfu_exp_rate(multiprocessors, clock_hz=None, per_clock=16):
    """exp/s of the SFUs: SMs × 16 results per clock per SM (compute capability 8.x–9.0) × clock
    (default: the H200's SM clock, from the results store)."""
    if clock_hz is None:
        clock_hz = results.value("machine", "ghz", what="SM clock") * 1e9
    return multiprocessors * per_clock * clock_hz


# The reference H200, not measured by this module: the copy bandwidth, the bf16 matmul rate
# (cuBLAS, 8192³; the datasheet's dense figure is higher) and the SM clock are measurements of
# the results store (docs/results/h200_machine_*.json); the fp32 FMA rate is the datasheet's;
# exp rate = 132 SMs × 16 × that clock.
_COPY = results.find("machine", "tb_per_s", what="copy bandwidth")
_MATMUL = results.find("machine", "tflops", what="bf16 matmul")
_CLOCK = results.find("machine", "ghz", what="SM clock")
H200 = Machine(
    name="NVIDIA H200 (reference figures)", bandwidth=_COPY.row["tb_per_s"] * 1e12, flops=67e12,
    matmul_flops=_MATMUL.row["tflops"] * 1e12, exps=sfu_exp_rate(132), launch_s=None,
    source=f"copy BW: {_COPY.source}; bf16 matmul (cuBLAS 8192³): {_MATMUL.source}; fp32: "
           f"datasheet; exp = 132 SM × 16/clk × the SM clock of {_CLOCK.source}")


def selective_scan_cost(b, d, l, n, *, impl="fused", in_bytes=2, state_bytes=4, z=True, D=True,
                        softplus=True, backward=False):
    """Bytes, FLOPs and exps of the Mamba-1 selective scan; ``impl`` in fused, store_states, naive.

    Shapes: u, delta, z (b, d, l) and B, C (b, n, l) of ``in_bytes`` each element; A (d, n), D,
    delta_bias (d,) in fp32; states (b, d, l, n) of ``state_bytes``. ``backward=True`` (fused
    only) adds the backward of a recomputing kernel: read the inputs and dy again, write du, dΔ,
    dz, dB, dC, and one more exp per state element.
    """
    if impl not in ("fused", "store_states", "naive"):
        raise ValueError(f"impl must be 'fused', 'store_states' or 'naive', got {impl!r}")
    if backward and impl != "fused":
        raise ValueError("the backward is modelled for the fused (recomputing) kernel only")
    N, M, S = b * d * l * n, b * d * l, b * n * l
    # u, Δ, z, B, C in in_bytes; A, D, delta_bias in fp32
    inputs = in_bytes * (M * (2 + z) + 2 * S) + 4 * (d * n + d * (1 + D))
    sfu = N + M * (2 * softplus + 2 * z)  # exp(ΔA); softplus = exp + log; silu = exp + reciprocal
    # 6 FLOPs per state element: Δ·A, ·(Δx)·B, the FMA of h, the FMA of y
    cost = Cost(bytes=inputs + in_bytes * M, flops=6 * N + 8 * M, exps=sfu)
    if impl == "store_states":  # write Ā, B̄x, h once and read each back once
        cost = replace(cost, bytes=cost.bytes + 6 * N * state_bytes)
    if impl == "naive":  # Ā, B̄x written and read; per step: h_{t-1} read, h_t written, read for y
        cost = replace(cost, bytes=cost.bytes + 7 * N * state_bytes, launches=4 * l + 4)
    if backward:  # read inputs + dy, write du, dΔ, dz (in_bytes) and dB, dC (fp32)
        bwd_bytes = inputs + in_bytes * M * (1 + 2 + z) + 4 * 2 * S
        cost = Cost(bytes=cost.bytes + bwd_bytes, flops=cost.flops + 16 * N + 16 * M,
                    exps=2 * cost.exps)
    return cost


def ssd_cost(b, l, h, p, n, chunk, g=1, in_bytes=2):
    """Mamba-2 SSD forward (chunked): x, dt, B, C in, y out; matmuls on full q×q tiles.

    Shapes: x, y (b, l, h, p); dt (b, l, h); B, C (b, l, g, n). Matmul FLOPs: C Bᵀ per group
    2·b·g·l·q·n, diagonal blocks 2·b·h·l·q·p, chunk states and off-diagonal outputs 2·b·h·l·p·n
    each.
    Exps: the decay exp(segsum) of every q×q tile, b·h·l·q.
    """
    bytes_ = in_bytes * (2 * b * l * h * p + 2 * b * l * g * n + b * l * h) + 4 * h
    mm = 2 * b * g * l * chunk * n + 2 * b * h * l * chunk * p + 4 * b * h * l * p * n
    return Cost(bytes=bytes_, flops=4 * b * l * h * chunk, exps=b * h * l * chunk, matmul_flops=mm)


def decode_cost(b, h, p, n, state_bytes=4, in_bytes=2):
    """One decode step: read and write the state (b, h, p, n); x, z, y (b, h, p), B, C (b, n)."""
    state = b * h * p * n
    return Cost(bytes=2 * state * state_bytes + in_bytes * (3 * b * h * p + 2 * b * n + b * h),
                flops=5 * state, exps=b * h)


def _times(cost, machine):
    return {
        "bytes_ms": cost.bytes / machine.bandwidth * 1e3,
        "flops_ms": cost.flops / machine.flops * 1e3,
        "matmul_ms": cost.matmul_flops / machine.matmul_flops * 1e3,
        "exps_ms": cost.exps / machine.exps * 1e3,
    }


def floor(cost, machine=H200):
    """The time each ceiling allows (ms) and the binding one: dict(bytes_ms, …, floor_ms, bound).

        t_unit = count / rate · 10³ ms,   floor = max over bytes, flops, matmul, exps
    """
    terms = _times(cost, machine)
    bound = max(terms, key=terms.get)
    return {**terms, "floor_ms": terms[bound], "bound": bound[:-3]}


# The benchmark shapes of docs/BENCHMARKS.md (bf16 inputs, fp32 states, unless the name says fp32).
BENCHMARKS = {
    "mamba1 fwd b8 d2048 n16 l2048": lambda: selective_scan_cost(8, 2048, 2048, 16),
    "mamba1 fwd+bwd b8 d2048 n16 l2048": lambda: selective_scan_cost(8, 2048, 2048, 16,
                                                                     backward=True),
    "mamba1 fwd b8 d2048 n16 l8192": lambda: selective_scan_cost(8, 2048, 8192, 16),
    "mamba1 fwd+bwd b8 d2048 n16 l8192": lambda: selective_scan_cost(8, 2048, 8192, 16,
                                                                     backward=True),
    "mamba1 fp32 fwd b8 d2048 n16 l2048": lambda: selective_scan_cost(8, 2048, 2048, 16,
                                                                      in_bytes=4),
    "mamba1 fp32 fwd+bwd b8 d2048 n16 l2048": lambda: selective_scan_cost(
        8, 2048, 2048, 16, in_bytes=4, backward=True),
    "ssd fwd b4 l4096 h80 p64 n128 q256": lambda: ssd_cost(4, 4096, 80, 64, 128, 256),
    "decode b64 h80 p64 n128 fp32 state": lambda: decode_cost(64, 80, 64, 128),
}


def benchmark_floors(machine=H200):
    """One row per benchmark shape: name, GB moved, G exps, floors in ms and the binding ceiling."""
    rows = []
    for name, make in BENCHMARKS.items():
        cost = make()
        rows.append({"shape": name, "GB": cost.bytes / 1e9, "Gexp": cost.exps / 1e9,
                     "intensity": cost.intensity, **floor(cost, machine)})
    return rows


def percent_of_floor(ms, shape, machine=H200):
    """100 · floor / measured time for a shape of :data:`BENCHMARKS` (100 % = at the floor)."""
    if shape not in BENCHMARKS:
        raise ValueError(f"unknown shape {shape!r}; one of {list(BENCHMARKS)}")
    return 100.0 * floor(BENCHMARKS[shape](), machine)["floor_ms"] / ms


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_copy_bandwidth(nbytes=None, device=None, repeats=20):
    """Bytes/s of a large device-to-device copy, counting bytes read plus bytes written (median).

    Default size 2 GiB on a GPU (far beyond the 60 MB L2), 64 MiB on a CPU.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    nbytes = nbytes or (2**31 if device.type == "cuda" else 2**26)
    src = torch.rand(nbytes // 4, device=device)  # random data, never zeros
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 3):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        if i >= 3:  # the first copies warm up allocator and caches
            times.append(time.perf_counter() - t)
    return 2 * src.numel() * 4 / sorted(times)[len(times) // 2]


def measure_launch_overhead(device=None, launches=2000):
    """Seconds per launch of a tiny kernel (one element), the cost of one step of a Python loop."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    x = torch.zeros(1, device=device)
    for _ in range(50):
        x.add_(1.0)
    _sync(device)
    t = time.perf_counter()
    for _ in range(launches):
        x.add_(1.0)
    _sync(device)
    return (time.perf_counter() - t) / launches


def this_machine():
    """The GPU this runs on, with *measured* copy bandwidth and launch overhead; None on a CPU."""
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return replace(H200, name=f"{props.name} (measured)", bandwidth=measure_copy_bandwidth(),
                   launch_s=measure_launch_overhead(),
                   exps=sfu_exp_rate(sm_count(0)),
                   source="copy BW and launch overhead measured now; others: H200 reference")


def naive_selective_scan(u, delta, A, B, C):
    """selective_scan_ref's structure: Ā = exp(ΔA) and B̄x = ΔBx materialized, then a loop over l.

    Shapes: u, delta (b, d, l); A (d, n); B, C (b, n, l). Returns y (b, d, l). No D, z, bias: the
    part whose bytes :func:`selective_scan_cost` (impl="naive") counts.
    """
    A_bar = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))  # (b, d, l, n) in HBM
    Bx = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)  # (b, d, l, n) in HBM
    h = u.new_zeros(A_bar[:, :, 0].shape)  # (b, d, n)
    ys = []
    for t in range(u.shape[-1]):
        h = A_bar[:, :, t] * h + Bx[:, :, t]  # reads 3 (b, d, n) slices, writes one
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, t]))
    return torch.stack(ys, dim=-1)  # (b, d, l)


def measure_naive(b, d, l, n, machine=None, device=None):
    """Time :func:`naive_selective_scan` (fp32) and compare with its bytes and the fused floor.

    Returns dict(ms, GB moved (modelled), achieved bandwidth GB/s, fused floor ms, times the floor).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    machine = machine or H200
    u, delta = torch.randn(b, d, l, device=device), torch.rand(b, d, l, device=device) * 0.1
    A = -torch.rand(d, n, device=device) - 0.5
    B, C = torch.randn(b, n, l, device=device), torch.randn(b, n, l, device=device)
    from mambalearn.timing import time_ms

    ms = time_ms(lambda: naive_selective_scan(u, delta, A, B, C), warmup=1, rep=5)
    kw = dict(in_bytes=4, z=False, D=False, softplus=False)
    naive = selective_scan_cost(b, d, l, n, impl="naive", **kw)
    fused = floor(selective_scan_cost(b, d, l, n, impl="fused", **kw), machine)["floor_ms"]
    return {"ms": ms, "GB": naive.bytes / 1e9, "GBps": naive.bytes / ms / 1e6,
            "bandwidth_pct": 100 * naive.bytes / (ms * 1e-3) / machine.bandwidth,
            "fused_floor_ms": fused, "x_floor": ms / fused, "launches": naive.launches}


def placement(cost, ms, machine=H200):
    """Where a kernel that took ``ms`` sits on the roofline of its busiest compute unit.

        T_b = bytes / BW,  T_c = max(flops / FLOP/s, matmul / matmul FLOP/s, exps / exp/s)
        x = T_c / T_b  (intensity / ridge),  y = T_c / t  (share of the unit's peak) ≤ min(1, x)

    Returns dict(x, y, unit ("flops", "matmul" or "exps"), pct_of_floor = 100 · floor / t,
    bound ("bytes" or the unit)). x < 1: memory bound, the roof is the bandwidth line.
    """
    if not ms > 0:
        raise ValueError(f"ms must be a positive time, got {ms!r}")
    t = _times(cost, machine)
    unit = max(("flops", "matmul", "exps"), key=lambda u: t[f"{u}_ms"])
    t_c = t[f"{unit}_ms"]
    bound = "bytes" if t["bytes_ms"] >= t_c else unit
    return {"x": t_c / t["bytes_ms"], "y": t_c / ms, "unit": unit,
            "pct_of_floor": 100.0 * max(t["bytes_ms"], t_c) / ms, "bound": bound}


# The course's kernels on the roofline: (name, results topic, the row's fields, the cost model of
# the same shape). Mamba-1: b8 d2048 n16, bf16, z, D, delta_bias, softplus; SSD: b4 l4096 h80 p64
# n128, bf16; decode: b64 h80 p64 n128, fp32 state, CUDA-graph timed.
_M1, _SSD = "b8 d2048 n16 l{}", "b4 l4096 h80 p64 n128 g1 q256"
_DECODE = dict(op="step, graph", shape="b64 h80 p64 n128 fp32 state")
KERNELS = [
    ("naive scan (ch05, fp32)", "memory", dict(backend="naive scan (05)"),
     lambda: selective_scan_cost(8, 2048, 2048, 16, impl="naive", in_bytes=4, z=False, D=False,
                                 softplus=False)),
    ("Mamba-1 fwd l2048, ours (ch09)", "selective_scan",
     dict(backend="default", op="fwd", shape=_M1.format(2048)),
     lambda: selective_scan_cost(8, 2048, 2048, 16)),
    ("Mamba-1 fwd l2048, mamba_ssm", "selective_scan",
     dict(backend="mamba_ssm cuda", op="fwd", shape=_M1.format(2048)),
     lambda: selective_scan_cost(8, 2048, 2048, 16)),
    ("Mamba-1 fwd l8192, ours", "selective_scan",
     dict(backend="default", op="fwd", shape=_M1.format(8192)),
     lambda: selective_scan_cost(8, 2048, 8192, 16)),
    ("Mamba-1 fwd+bwd l2048, ours", "selective_scan",
     dict(backend="default", op="fwd+bwd", shape=_M1.format(2048)),
     lambda: selective_scan_cost(8, 2048, 2048, 16, backward=True)),
    ("Mamba-1 fwd+bwd l2048, mamba_ssm", "selective_scan",
     dict(backend="mamba_ssm cuda", op="fwd+bwd", shape=_M1.format(2048)),
     lambda: selective_scan_cost(8, 2048, 2048, 16, backward=True)),
    ("SSD fwd, ours unfused (ch10)", "ssd", dict(backend="ours unfused", op="fwd", shape=_SSD),
     lambda: ssd_cost(4, 4096, 80, 64, 128, 256)),
    ("SSD fwd, mamba_ssm", "ssd", dict(backend="mamba_ssm", op="fwd", shape=_SSD),
     lambda: ssd_cost(4, 4096, 80, 64, 128, 256)),
    ("SSD fwd, ours fused q128 (ch11)", "ssd",
     dict(backend="ours fused (default)", op="fwd", shape=_SSD),
     lambda: ssd_cost(4, 4096, 80, 64, 128, 128)),
    ("decode step b64, ours (ch12)", "step", dict(backend="ours default", **_DECODE),
     lambda: decode_cost(64, 80, 64, 128)),
    ("decode step b64, mamba_ssm", "step", dict(backend="mamba_ssm", **_DECODE),
     lambda: decode_cost(64, 80, 64, 128)),
]


def measured_kernels():
    """[dict(name, ms, cost, source)]: each kernel of :data:`KERNELS` at its current time."""
    out = []
    for name, topic, match, cost in KERNELS:
        found = results.find(topic, "ms", **match)
        out.append(dict(name=name, ms=found.row["ms"], cost=cost, source=found.source))
    return out


MEASURED = measured_kernels()


def measured_placements(machine=H200):
    """:func:`placement` of every kernel in :data:`MEASURED`: one row each, with its source."""
    return [{"name": m["name"], "ms": m["ms"], "source": m["source"],
             **placement(m["cost"](), m["ms"], machine)} for m in MEASURED]
