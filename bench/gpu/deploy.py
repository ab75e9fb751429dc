"""Device script, chapter 16: the decode step compiled, and speculative decoding's two rollbacks.

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.deploy [--cpu-smoke] [--out DIR]

(on the H200; writes DIR/<device>_deploy_<date>.json through bench.gpu.record; DIR defaults to
$OUT or /tmp/out). ``--cpu-smoke`` runs the same code at tiny shapes without torch.compile's
inductor (minutes on a CPU) and writes a ``cpu_`` file, never committed.

1. the Mamba-1 decode step of one 130M-sized layer (b1 and b64, d 1536, n 16, fp32 state),
   checked against the float64 oracle, then timed interleaved (``mambalearn.timing.compare``):
   ``inference.decode_step`` eager, ``serving.step_functional`` eager, the same compiled by
   ``torch.compile`` (its default mode), and the Triton step kernel (``mamba2.step``)
2. greedy speculative decoding of a 130M-shaped model (random bf16 weights, fp32 state), a draft
   right 90 % and 50 % of the time, k = 4: checkpoint against re-run, ms per generated token,
   the output checked equal to ``MambaLM.generate``
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench.gpu.record import record  # noqa: E402
from mambalearn import inference, serving  # noqa: E402
from mambalearn import model as M  # noqa: E402
from mambalearn.testing import assert_close  # noqa: E402
from mambalearn.timing import compare  # noqa: E402


def step_inputs(b, d, n, dev, g):
    r = lambda *s: torch.randn(*s, generator=g).to(dev)
    A = -torch.rand(d, n, generator=g).to(dev) - 0.5
    return (r(b, d), torch.rand(b, d, generator=g).to(dev), A, r(b, n), r(b, n), r(d))


def time_step(b, d, n, dev, g, smoke):
    """Rows for one batch size: each way of running the step, checked, then timed interleaved."""
    from mambalearn.mamba2.step import selective_state_update

    args = step_inputs(b, d, n, dev, g)
    state = torch.randn(b, d, n, generator=g).to(dev)
    want = inference.decode_step(state.double().clone(), *(a.double() for a in args)).float()
    assert_close(serving.step_functional(state, *args)[0], want)
    fns = {"decode_step eager": lambda: inference.decode_step(state, *args),
           "step_functional eager": lambda: serving.step_functional(state, *args),
           "triton step kernel": lambda: selective_state_update(state, *args)}
    if not smoke:
        compiled = torch.compile(serving.step_functional)
        assert_close(compiled(state, *args)[0], want)
        fns["step_functional compiled"] = lambda: compiled(state, *args)
    c = compare(fns, warm_s=0.2 if smoke else 1.0, rounds=3 if smoke else 5)
    rows = []
    for name in fns:
        ratio, spread = c.ratio(name, "decode_step eager")
        rows.append(dict(op="decode step", backend=name, shape=f"b{b} d{d} n{n} fp32 state",
                         ms=c.ms(name), ratio_to_eager=ratio, spread=spread))
        print(f"  step b{b} {name:26s} {c.ms(name) * 1e3:8.1f} µs  ×{ratio:.2f}", flush=True)
    return rows


def decode_rows(dev, smoke):
    g = torch.Generator().manual_seed(0)
    d, n = (16, 4) if smoke else (1536, 16)
    return [r for b in ((1, 2) if smoke else (1, 64)) for r in time_step(b, d, n, dev, g, smoke)]


def drafter(greedy, vocab, agree, seed=2):
    """A stand-in draft: the greedy token with probability ``agree``, else a random one."""
    g = torch.Generator().manual_seed(seed)

    def draft(pos, k):
        right = greedy[pos:pos + k].cpu()
        wrong = torch.randint(0, vocab, right.shape, generator=g)
        return torch.where(torch.rand(right.shape, generator=g) < agree, right, wrong)
    return draft


def timed_generate(target, prompt, n_new, draft, k, rollback, dev):
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    out, st = serving.speculative_generate(target, prompt, n_new, draft, k, rollback)
    sync()
    return out, st, (time.perf_counter() - t0) * 1e3


def speculative_rows(dev, smoke):
    torch.manual_seed(0)
    cfg = (M.MambaConfig(vocab_size=16, d_model=16, n_layers=2, d_state=4) if smoke else
           M.MambaConfig(vocab_size=50304, d_model=768, n_layers=24, d_state=16))
    target = M.MambaLM(cfg).to(dev).eval()
    if not smoke:
        target.to_inference_dtype(torch.bfloat16)
    n_new, k = (12, 4) if smoke else (64, 4)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg.vocab_size, (1, 16), generator=gen).to(dev)
    greedy = target.generate(prompt, n_new)[0]
    rows = []
    for agree in (0.9, 0.5):
        for rollback in ("checkpoint", "rerun"):
            timed_generate(target, prompt, n_new, drafter(greedy, cfg.vocab_size, agree), k,
                           rollback, dev)  # warm-up
            out, st, ms = timed_generate(target, prompt, n_new,
                                         drafter(greedy, cfg.vocab_size, agree), k, rollback, dev)
            assert torch.equal(out.cpu(), greedy.cpu()), "speculative decoding changed the output"
            rows.append(dict(op="speculative decoding", backend=rollback, agree=int(agree * 100),
                             k=k, shape="tiny" if smoke else "130M shape, b1",
                             steps=st["steps"], replayed=st["replayed"],
                             copies=st["peak_copies"], ms_per_token=ms / n_new))
            print(f"  draft {agree:.0%} {rollback:10s} {ms / n_new:7.2f} ms/token, "
                  f"{st['steps']} steps", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shapes, no inductor")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    a = p.parse_args()
    smoke = a.cpu_smoke or not torch.cuda.is_available()
    dev = torch.device("cuda" if torch.cuda.is_available() and not a.cpu_smoke else "cpu")
    print("== decode step", flush=True)
    rows = decode_rows(dev, smoke)
    print("== speculative decoding", flush=True)
    rows += speculative_rows(dev, smoke)
    command = "python3 -m bench.gpu.deploy" + (" --cpu-smoke" if smoke else "")
    record("deploy", rows, command=command, peers={}, out_dir=a.out,
           method="timing.compare: each callable warmed, interleaved rounds, median of per-round "
                  "ratios; speculative decoding: one timed run after a warm-up, wall clock with "
                  "CUDA synchronisation, ms per generated token")


if __name__ == "__main__":
    main()
