"""Device script, chapters 12–13: the decode-step kernel at the real shape, the model per token.

    PYTHONUNBUFFERED=1 python3 bench/gpu/step.py [all|tune]

(on the H200; writes $OUT/step.json)

``all`` (default) runs sections 1–5 below; ``tune`` runs 1, a CUDA-graph-timed sweep that also
tries a persistent, pipelined grid (2b), the bench rows with the sweep's best tile, and section 5
for the backends that section 5 did not reach.

1. correctness at b64 h80 p64 n128 (fp32 and bf16 state) and a Mamba-1 layout, vs the float64 oracle
2. a sweep of the kernel's tile (BLOCK_P × num_warps) at the target shape, fp32 state
3. the bench topic: ours vs mamba_ssm, eager and CUDA graph, % of the byte floor
4. a full small model (Mamba-1 and Mamba-2 130M shapes, bf16 weights, fp32 state): per-token
   latency at b1, eager vs CUDA graph
5. the scan backends inside a small model: fwd+bwd time and peak memory
A short table is printed last.
"""

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import torch  # noqa: E402

from course.bench import step as bstep  # noqa: E402
from course.bench import table, time_ms  # noqa: E402
from mambalearn import inference  # noqa: E402
from mambalearn import model as M  # noqa: E402
from mambalearn.mamba2.step import StepConfig, selective_state_update  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
T0 = time.time()
RES = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
SUMMARY = []


def save():
    json.dump(RES, open(os.path.join(OUT, "step.json"), "w"), indent=1, default=str)


def section(fn):
    print(f"\n== {fn.__name__} (t = {time.time() - T0:.0f} s)", flush=True)
    try:
        fn()
    except Exception:  # noqa: BLE001 - keep going: later sections still report
        traceback.print_exc()
        RES[fn.__name__ + "_error"] = traceback.format_exc()
    save()


def rel_err(got, want):
    got, want = got.double(), want.double()
    return ((got - want).norm() / want.norm()).item()


def correctness():
    theirs = bstep.load_mamba_ssm_step()
    for sd in (torch.float32, torch.bfloat16):
        inp = bstep.mamba2_step_inputs(64, 80, 64, 128, sd)
        s_ref = inp["state"].double()
        a = {k: v for k, v in inp.items() if k != "state"}
        want = inference.decode_step(s_ref, a["x"].double(), a["dt"].double(), a["A"].double(),
                                     a["B"].double(), a["C"].double(), a["D"].double(), None,
                                     a["dt_bias"].double(), True)
        for name, fn in (("mambalearn", selective_state_update), ("mamba_ssm", theirs)):
            if fn is None:
                continue
            s = inp["state"].clone()
            out = fn(s, **a)
            e = dict(out=rel_err(out, want), state=rel_err(s, s_ref), nan=bool(out.isnan().any()))
            RES[f"correct {name} {str(sd)[6:]}"] = e
            print(name, sd, e)
    # Mamba-1 layout: b64 d4096 n16 (Mamba 1.4B's inner width), everything bf16 but A, D, state
    g = torch.Generator(device="cuda").manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")
    b, d, n = 64, 4096, 16
    st, x, dt, z = r(b, d, n), r(b, d).bfloat16(), r(b, d).bfloat16(), r(b, d).bfloat16()
    A, B, C, D, bias = -torch.exp(r(d, n)), r(b, n).bfloat16(), r(b, n).bfloat16(), r(d), r(d)
    s_ref = st.double()
    want = inference.decode_step(s_ref, x.double(), dt.double(), A.double(), B.double(), C.double(),
                                 D.double(), z.double(), bias.double(), True)
    out = selective_state_update(st, x, dt, A, B, C, D, z, bias, True)
    e = dict(out=rel_err(out, want), state=rel_err(st, s_ref))
    RES["correct mambalearn mamba1 b64 d4096 n16"] = e
    print("mamba1 layout", e)
    step = lambda: selective_state_update(st, x, dt, A, B, C, D, z, bias, True)
    RES["mamba1 b64 d4096 n16 ms"] = time_ms(step)


def sweep():
    inp = bstep.mamba2_step_inputs(64, 80, 64, 128, torch.float32)
    rows = []
    for bp in (4, 8, 16, 32, 64):
        for nw in (2, 4, 8):
            try:
                ms = time_ms(lambda bp=bp, nw=nw: selective_state_update(
                    **inp, config=StepConfig(block_p=bp, num_warps=nw)))
            except Exception as e:  # noqa: BLE001 - e.g. too many registers
                ms = float("nan")
                print(bp, nw, type(e).__name__, str(e)[:200])
            rows.append((bp, nw, ms))
            print(f"BLOCK_P {bp:3d} warps {nw}: {ms:.4f} ms", flush=True)
    RES["sweep fp32 b64 h80 p64 n128"] = rows
    best = min((r for r in rows if r[2] == r[2]), key=lambda r: r[2])
    RES["sweep best"] = best
    SUMMARY.append(dict(topic="step-sweep", backend=f"best BLOCK_P={best[0]} warps={best[1]}",
                        shape="b64 h80 p64 n128 fp32", ms=best[2],
                        floor_pct=100 * bstep.floor_ms(64, 80, 64, 128, torch.float32) / best[2]))


def sweep_graph():
    """Graph-timed (no CPU launch cost in the numbers): one-tile-per-program vs persistent grids."""
    inp = bstep.mamba2_step_inputs(64, 80, 64, 128, torch.float32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    theirs = bstep.load_mamba_ssm_step()
    rows = []
    if theirs is not None:
        rows.append(("mamba_ssm", bstep.graph_ms(lambda: theirs(**inp), rep=50)))
    configs = [dict(block_p=bp, num_warps=nw) for bp in (8, 16, 32) for nw in (2, 4, 8)]
    configs += [dict(block_p=bp, num_warps=nw, num_stages=st, programs=sms * k)
                for bp in (16, 32) for nw in (4, 8) for st in (1, 2, 3) for k in (2, 4, 8)]
    for cfg in configs:
        try:
            ms = bstep.graph_ms(lambda cfg=cfg: selective_state_update(
                **inp, config=StepConfig(**cfg)), rep=50)
        except Exception as e:  # noqa: BLE001
            ms = float("nan")
            print(cfg, type(e).__name__, str(e)[:200])
        rows.append((cfg, ms))
        print(f"{cfg}: {ms:.4f} ms", flush=True)
    RES["sweep graph fp32 b64 h80 p64 n128"] = rows
    ours = [r for r in rows if isinstance(r[0], dict) and r[1] == r[1]]
    best = min(ours, key=lambda r: r[1])
    RES["sweep graph best"] = best
    print("best", best)
    # correctness of the winning configuration at the real size
    s = inp["state"].clone()
    s_ref = inp["state"].double()
    a = {k: v for k, v in inp.items() if k != "state"}
    out = selective_state_update(s, **a, config=StepConfig(**best[0]))
    want = inference.decode_step(s_ref, *(a[k].double() for k in ("x", "dt", "A", "B", "C", "D")),
                                 None, a["dt_bias"].double(), True)
    RES["correct best"] = dict(out=rel_err(out, want), state=rel_err(s, s_ref))
    print("best config vs oracle", RES["correct best"])
    rows = bstep.run(True, tune=best[0], label="mambalearn best")
    RES["bench best"] = rows
    SUMMARY.extend(rows)
    print(table(rows))


def bench_rows():
    rows = bstep.run(True)
    RES["bench"] = rows
    SUMMARY.extend(rows)
    print(table(rows))


def _per_token_ms(step, cache, token, n=64):
    for _ in range(5):
        step(token, cache)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        step(token, cache)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def model_latency():
    configs = {
        "mamba1-130m": M.MambaConfig(vocab_size=50280, d_model=768, n_layers=24, d_state=16,
                                     block="mamba1"),
        "mamba2-130m": M.MambaConfig(vocab_size=50280, d_model=768, n_layers=24, d_state=128,
                                     headdim=64, block="mamba2", chunk_size=256),
    }
    for name, cfg in configs.items():
        torch.manual_seed(0)
        m = M.MambaLM(cfg).cuda().to_inference_dtype(torch.bfloat16).eval()
        for b in (1, 64):
            cache = m.empty_cache(b)
            token = torch.randint(0, cfg.vocab_size, (b,), device="cuda")
            with torch.no_grad():
                eager = _per_token_ms(m.step, cache, token)
                graphed = inference.capture_step(m.step, cache, token)
                graph = _per_token_ms(graphed, cache, token)
                # the graph computes what eager does: same logits from the same cache
                c1, c2 = m.empty_cache(b), m.empty_cache(b)
                g2 = inference.capture_step(m.step, c2, token)
                for _ in range(3):
                    want, got = m.step(token, c1), g2(token, c2)
                err = rel_err(got, want)
            key = f"{name} b{b}"
            RES[f"latency {key}"] = dict(eager_ms=eager, graph_ms=graph, graph_vs_eager_err=err)
            print(key, f"eager {eager:.3f} ms/token, graph {graph:.3f} ms/token, err {err:.2e}")
            SUMMARY.append(dict(topic="model-step", backend="eager", shape=key, ms=eager))
            SUMMARY.append(dict(topic="model-step", backend="cuda graph", shape=key, ms=graph,
                                ratio=graph / eager))
        del m


def _fwd_bwd(m, tokens):
    m.zero_grad(set_to_none=True)
    m(tokens).float().logsumexp(-1).mean().backward()


def _timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
    return sorted(ts)[len(ts) // 2]


def model_backends(blocks=("mamba1", "mamba2"), skip=(), limit=140):
    for block, kw in (("mamba2", dict(d_state=64, headdim=64, chunk_size=64)),
                      ("mamba1", dict(d_state=16))):
        if block not in blocks:
            continue
        torch.manual_seed(0)
        cfg = M.MambaConfig(vocab_size=256, d_model=256, n_layers=2, block=block, **kw)
        m = M.MambaLM(cfg).cuda()
        b, l = 8, 512
        tokens = torch.randint(0, 256, (b, l), device="cuda")
        with torch.no_grad():
            want = m.set_backend("sequential")(tokens)
        for name in M.available_backends(block):
            if (block, name) in skip:
                continue
            if time.time() - T0 > limit:
                print("skipping", block, name, "(time)")
                continue
            try:
                m.set_backend(name)
                with torch.no_grad():
                    err = rel_err(m(tokens), want)
                ms = _timed(lambda m=m, tokens=tokens: _fwd_bwd(m, tokens))
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                before = torch.cuda.memory_allocated()
                _fwd_bwd(m, tokens)
                torch.cuda.synchronize()
                gb = (torch.cuda.max_memory_allocated() - before) / 1e9
            except Exception as e:  # noqa: BLE001
                print(block, name, "failed:", type(e).__name__, str(e)[:300])
                RES[f"backend {block} {name}"] = f"failed: {e}"
                continue
            RES[f"backend {block} {name}"] = dict(fwd_bwd_ms=ms, peak_gb=gb, logits_rel_err=err)
            print(block, name, f"fwd+bwd {ms:.2f} ms, peak {gb:.3f} GB, logits rel err {err:.1e}")
            SUMMARY.append(dict(topic=f"model-{block}", backend=name, shape=f"b{b} l{l} d256 x2",
                                ms=ms, peak_gb=gb))


if __name__ == "__main__":
    print(RES, flush=True)
    part = sys.argv[1] if len(sys.argv) > 1 else "all"
    if part == "all":
        sections = (correctness, sweep, bench_rows, model_latency, model_backends)
    else:  # the first run reached mamba1 sequential/chunked/recompute in section 5
        done = {("mamba1", "sequential"), ("mamba1", "chunked"), ("mamba1", "recompute")}
        rest = lambda: model_backends(skip=done, limit=70)
        rest.__name__ = "model_backends_rest"
        sections = (sweep_graph, rest)
    for fn in sections:
        section(fn)
    RES["summary"] = SUMMARY
    save()
    print(f"\ntotal {time.time() - T0:.0f} s")
    print(table(SUMMARY))
