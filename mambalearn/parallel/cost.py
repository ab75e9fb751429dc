"""The α–β cost model of the four algorithms: time per step on R GPUs, per rank.

A message of m bytes between two GPUs costs α + m/β (latency α, bandwidth β). The collectives,
per rank (m = what one rank contributes), as NCCL runs them:

    point to point        α + m/β
    all-gather            (R−1)·α + (R−1)·m/β     a ring: every rank must receive the other R−1
                                                  pieces, one hop at a time
    all-gather, PAT       ⌈log₂R⌉·α + (R−1)·m/β   NCCL's binomial-tree schedule (≥ 2.23), for one
                                                  GPU per node (``Network(allgather="pat")``)
    all-to-all            (R−1)·α + (R−1)/R·m/β   one exchange with each peer
    reduce-scatter        (R−1)·α + (R−1)·m/β     (B/C gradients: m = one rank's piece)

NCCL's tree algorithms serve all-reduce (a reduce and a broadcast) and do not apply to
all-gather, which runs as a ring; its logarithmic PAT schedule came in NCCL 2.23 for one GPU per
node (github.com/NVIDIA/nccl/issues/1473), and from 2.31 runs between nodes with NVLink SHARP
(NVLS) inside them — NVLS stays off on the machines this course was measured on
(``launch.NCCL_ENV``). So the all-gather's latency grows linearly in R here, like the ring's.

With T_f, T_b one forward and one backward of a shard (kernel times measured on one GPU), S the
state and |P| the decay of one rank (in float32), per step:

    ring       fwd 2T_f + (R−1)(α + 4S/β)                         bwd 2T_b + the same chain back
    allgather  fwd 2T_f + allgather(4(|P| + S)) + T_s(R)          bwd 2T_b + allgather(4S) + T_s(R)
    logscan    fwd 2T_f + ⌈log₂R⌉(α + 4(|P| + S)/β + T_⊗)         bwd 2T_b + the same rounds back
    alltoall   fwd T_f + all-to-all(inputs) + all-gather(B, C) + all-to-all(output)
               bwd T_b + all-to-all(∂output) + all-to-all(∂inputs) + reduce-scatter(∂B, ∂C)
    serial     fwd R·T_f + (R−1)(α + 4S/β): each rank scans only once its predecessor's final
               state arrived (no summaries) — the chain a summary pass removes.

T_s(R) is the local ⊗-scan of the R gathered summaries (chapter 04's Blelloch scan), measured on
one H200 at R = 8, 64, 1024; the backward's reverse scan is *assumed* to cost the same. T_⊗, one
⊗ of two summaries in a round of the log-depth scan, is *estimated* as one elementwise pass over
them (read two, write one) at the measured copy bandwidth; launch latency is not counted.

Ring, all-gather and log-depth scan run the kernel twice (the summary, then the fix-up) but send
only states; all-to-all scans once but sends every token. Which wins depends on S versus the
tokens, on α versus S/β (the ring sends only H, the others (P, h)), on R, and on memory: the
all-gather holds R summaries, the log-depth scan three. The network figures below are
*assumptions* (vendor link rates), not measurements; the kernel times are each rank's work
measured on one H200 at the shard's own shape (the results store: the newest run of the kernels at
that shape, see ``_rank_rows``). Fits to
measurements on several GPUs are to replace the network figures and T_⊗.
"""

import math
from dataclasses import dataclass, field

from mambalearn import results, roofline

ALGORITHMS = ("ring", "allgather", "logscan", "alltoall", "serial")


@dataclass(frozen=True)
class Network:
    """α (s per message), β (bytes/s per GPU, one direction), and NCCL's all-gather schedule:
    "ring" ((R−1) latencies) or "pat" (⌈log₂R⌉: one GPU per node)."""

    alpha: float
    beta: float
    name: str = ""
    allgather: str = "ring"


# Assumed: NVLink 4 moves 450 GB/s per direction per H200 (NVIDIA's HGX H200 figure), NCCL
# reaching ~400; between nodes one 400 Gb/s InfiniBand NIC per GPU (50 GB/s). α: a few µs per
# message inside a node, ~3× that across nodes. To be fitted to measurements on several GPUs.
NVLINK = Network(alpha=5e-6, beta=400e9, name="NVLink (assumed)")
INFINIBAND = Network(alpha=15e-6, beta=50e9, name="InfiniBand (assumed)")


def network_for(R, intra=NVLINK, inter=INFINIBAND, gpus_per_node=8):
    """The slowest link a collective over R GPUs crosses: NVLink within one node, else IB."""
    return intra if R <= gpus_per_node else inter


@dataclass(frozen=True)
class Workload:
    """One rank's scan: sizes (numbers, bytes) and kernel times (s) of its shard."""

    name: str
    state: int  # S: numbers in one state
    decay: int  # |P|: numbers in one decay
    inputs_bytes: int  # the token tensors all-to-all sends forward (u, Δ, z or x, dt, z)
    output_bytes: int  # the output, sent back
    shared_bytes: int  # B and C of the shard (all-gathered over time)
    t_fwd: float
    t_bwd: float
    source: str = field(default="", compare=False)
    summary_scan: dict | None = field(default=None, compare=False)  # {R: s}, measured; None: 0


# Measured per-rank work, read from the results store: {tokens per shard: (fwd, fix-up = the scan
# from a given state, fwd+bwd)} in ms, at the shard shapes below (bf16, fp32 states). Topic
# "parallel" (`bench/gpu/parallel.py`) times all three at 8k … 64k tokens; a newer run of the
# kernels at the same shard shape (topics "batch_one" and "ssd_batch_one": the default kernels,
# z, D, softplus) replaces it, since the kernels changed in between: then its fwd and fwd+bwd are
# the table, and the fix-up keeps the older run's ratio to the forward (the newer runs do not time
# a scan from a given state). Between measured lengths the times are interpolated, beyond them
# scaled in proportion to the tokens.
NEWER = {"mamba1": ("batch_one", dict(backend="ours", n=16), "b2 d2048 n16 l{l}"),
         "ssd": ("ssd_batch_one", dict(backend="ours, chunk 256"), "b1 l{l} h80 p64 n128 g1")}


def _rank_rows(model):
    """[((tokens, fwd, fix-up, fwd+bwd) in ms, the Found rows they come from)]."""
    old = [f for f in results.current("parallel")
           if f.row.get("model") == model and "tokens" in f.row]
    topic, match, shape = NEWER[model]
    new = []
    for f in old:
        try:
            fwd, fb = (results.find(topic, "ms", op=op, shape=shape.format(l=f.row["tokens"]),
                                    **match) for op in ("fwd", "fwd+bwd"))
        except LookupError:
            continue
        if min(fwd.meta["date"], fb.meta["date"]) > f.meta["date"]:
            r = f.row
            new.append(((r["tokens"], fwd.row["ms"], r["fwd_h0"] / r["fwd"] * fwd.row["ms"],
                         fb.row["ms"]), (fwd, fb)))
    if new:
        return new
    return [((f.row["tokens"], f.row["fwd"], f.row["fwd_h0"], f.row["fwd_bwd"]), (f,)) for f in old]


def _rank_table(model):
    return {t[0]: t[1:] for t, _ in _rank_rows(model)}


# The all-gather's local scan of R summaries (`summary.rank_scan`, same shapes, same store):
# {R: ms}. Interpolated in log R, proportional to R beyond the largest R, the smallest R's time
# below.
def _summary_table(model):
    return {r["R"]: r["ms"] for r in results.rows("parallel", model=model, what="rank_scan")}


MAMBA1_RANK, SSD_RANK = _rank_table("mamba1"), _rank_table("ssd")  # b2 d2048 n16; b1 h80 p64 n128
MAMBA1_SUMMARY, SSD_SUMMARY = _summary_table("mamba1"), _summary_table("ssd")
SOURCE = "per-rank times: " + "; ".join(sorted(
    {f.source for m in NEWER for _, found in _rank_rows(m) for f in found}
    | {f.source for f in results.current("parallel") if "what" in f.row}))


def measured(table, tokens):
    """(t_fwd, t_fixup, t_fwd_bwd) in seconds for ``tokens`` per shard, from a measured table."""
    xs = sorted(table)
    if tokens <= xs[0] or tokens >= xs[-1]:
        x = xs[0] if tokens <= xs[0] else xs[-1]
        return tuple(v * 1e-3 * tokens / x for v in table[x])
    hi = next(x for x in xs if x >= tokens)
    lo = xs[xs.index(hi) - 1]
    w = (tokens - lo) / (hi - lo)
    return tuple(1e-3 * ((1 - w) * a + w * b) for a, b in zip(table[lo], table[hi], strict=True))


def summary_time(w, R):
    """T_s(R) in seconds: the local scan of R summaries from ``w.summary_scan`` (0 without one)."""
    table = w.summary_scan
    if not table or R <= 1:
        return 0.0
    xs = sorted(table)
    if R <= xs[0] or R >= xs[-1]:
        return 1e-3 * (table[xs[0]] if R <= xs[0] else table[xs[-1]] * R / xs[-1])
    hi = next(x for x in xs if x >= R)
    lo = xs[xs.index(hi) - 1]
    u = math.log(R / lo) / math.log(hi / lo)
    return 1e-3 * ((1 - u) * table[lo] + u * table[hi])


def mamba1(l_shard, b=2, d=2048, n=16, bytes_per=2, t_fwd=None, t_bwd=None):
    """The Mamba-1 workload of a shard of ``l_shard`` tokens (times from MAMBA1_RANK, b2 d2048)."""
    t_f, t_fix, t_fb = measured(MAMBA1_RANK, l_shard * b / 2)
    t_f, t_b = (t_f if t_fwd is None else t_fwd), (t_fb - t_f if t_bwd is None else t_bwd)
    tok = b * d * l_shard * bytes_per  # one (b, d, l) tensor
    return Workload(f"Mamba-1 b{b} d{d} n{n}, {l_shard} tokens/GPU", b * d * n, b * d * n,
                    3 * tok, tok, 2 * b * n * l_shard * bytes_per, t_f, t_b, SOURCE,
                    _scaled(MAMBA1_SUMMARY, b * d * n / (2 * 2048 * 16)))


def ssd(l_shard, b=1, h=80, p=64, n=128, g=1, bytes_per=2, t_fwd=None, t_bwd=None):
    """The SSD workload of a shard of ``l_shard`` tokens (times from SSD_RANK, b1 h80)."""
    t_f, t_fix, t_fb = measured(SSD_RANK, l_shard * b)
    t_f, t_b = (t_f if t_fwd is None else t_fwd), (t_fb - t_f if t_bwd is None else t_bwd)
    tok = b * l_shard * h * p * bytes_per  # one (b, l, h, p) tensor
    return Workload(f"SSD b{b} h{h} p{p} n{n}, {l_shard} tokens/GPU", b * h * p * n, b * h,
                    2 * tok + b * l_shard * h * bytes_per, tok,
                    2 * b * l_shard * g * n * bytes_per, t_f, t_b, SOURCE,
                    _scaled(SSD_SUMMARY, b * h * p * n / (80 * 64 * 128)))


def _scaled(table, k):
    """A summary-scan table for a state ``k`` times the measured one (the scan moves states)."""
    return {R: ms * k for R, ms in table.items()}


def rounds(R):
    """⌈log₂R⌉: the rounds of a binomial tree (or a Hillis–Steele scan) over R ranks."""
    return math.ceil(math.log2(R)) if R > 1 else 0


def p2p(net, m):
    return net.alpha + m / net.beta


def all_gather(net, R, m):
    if net.allgather not in ("ring", "pat"):
        raise ValueError(f"Network.allgather must be 'ring' or 'pat', got {net.allgather!r}")
    hops = R - 1 if net.allgather == "ring" else rounds(R)
    return hops * net.alpha + (R - 1) * m / net.beta


def combine_time(w, bandwidth=None):
    """T_⊗ in seconds, *estimated*: one ⊗ of two summaries (|P| + S float32 numbers each) as an
    elementwise pass that reads two and writes one at ``bandwidth`` (the H200's measured copy
    bandwidth by default); no launch latency."""
    return 3 * 4 * (w.state + w.decay) / (bandwidth or roofline.H200.bandwidth)


def all_to_all(net, R, m):
    return (R - 1) * net.alpha + (R - 1) / R * m / net.beta


def reduce_scatter(net, R, m):
    return (R - 1) * net.alpha + (R - 1) * m / net.beta


def step_time(w, R, algorithm, net=None):
    """{"fwd", "fwd_bwd", "comm_fwd", "comm_bwd"} in seconds for ``algorithm`` on R GPUs, and
    "memory": the bytes a rank holds for the exchange (ring: one state; all-gather: every rank's
    summary; log-depth scan: three summaries; all-to-all: the re-sharded inputs, output and the
    whole sequence's B, C)."""
    net = net or network_for(R)
    S, P = 4 * w.state, 4 * w.decay  # bytes, float32 states
    if algorithm == "ring":
        comm_f = comm_b = (R - 1) * p2p(net, S)
        fwd, bwd = 2 * w.t_fwd + comm_f, 2 * w.t_bwd + comm_b
    elif algorithm == "allgather":
        comm_f, comm_b = all_gather(net, R, S + P), all_gather(net, R, S)
        fwd = 2 * w.t_fwd + comm_f + summary_time(w, R)
        bwd = 2 * w.t_bwd + comm_b + summary_time(w, R)
    elif algorithm == "logscan":  # each round: one summary out, one in, one ⊗
        comm_f = comm_b = rounds(R) * (p2p(net, S + P) + combine_time(w))
        fwd, bwd = 2 * w.t_fwd + comm_f, 2 * w.t_bwd + comm_b
    elif algorithm == "alltoall":
        comm_f = (all_to_all(net, R, w.inputs_bytes) + all_gather(net, R, w.shared_bytes)
                  + all_to_all(net, R, w.output_bytes))
        comm_b = (all_to_all(net, R, w.output_bytes) + all_to_all(net, R, w.inputs_bytes)
                  + reduce_scatter(net, R, w.shared_bytes))
        fwd, bwd = w.t_fwd + comm_f, w.t_bwd + comm_b
    elif algorithm == "serial":
        comm_f = comm_b = (R - 1) * p2p(net, S)
        fwd, bwd = R * w.t_fwd + comm_f, R * w.t_bwd + comm_b
    else:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    memory = {"ring": S, "serial": S, "allgather": R * (S + P), "logscan": 3 * (S + P),
              "alltoall": w.inputs_bytes + w.output_bytes + R * w.shared_bytes}[algorithm]
    return dict(fwd=fwd, fwd_bwd=fwd + bwd, comm_fwd=comm_f, comm_bwd=comm_b, memory=memory)


def winners(w, Rs, key="fwd_bwd", algorithms=ALGORITHMS[:-1], net=None):
    """For each R, the fastest algorithm (by ``key``): a list of (R, name, seconds)."""
    out = []
    for R in Rs:
        times = {a: step_time(w, R, a, net)[key] for a in algorithms}
        best = min(times, key=times.get)
        out.append((R, best, times[best]))
    return out
