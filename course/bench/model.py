"""Bench topic ``model`` (chapter 13): every scan backend inside the same small Mamba LM.

A 2-layer model (GPU: d_model 256, b8 l512; CPU: d_model 16, b1 l8), forward + backward of a
logsumexp loss over the logits, for each Mamba-1 and Mamba-2 backend that imports. Rows: time
(GPU: the median of repeats; CPU: one call), peak memory beyond what was allocated before (GPU),
and the logits' relative error against the ``sequential`` backend on the same weights and tokens
(the backends must agree, not only run).

    python -m mambalearn bench model
"""

import torch

from course import bench
from mambalearn import model as M
from mambalearn.testing import rel_error

BLOCKS = {"mamba1": dict(d_state=16), "mamba2": dict(d_state=64, headdim=64, chunk_size=64)}
TINY = {"mamba1": dict(d_state=4), "mamba2": dict(d_state=4, headdim=8, chunk_size=8)}  # CPU


def _lm(block, gpu, device):
    kw = BLOCKS[block] if gpu else TINY[block]  # tiny: the interpreter runs the Triton backends
    torch.manual_seed(0)
    cfg = M.MambaConfig(vocab_size=256, d_model=256 if gpu else 16, n_layers=2, block=block, **kw)
    return M.MambaLM(cfg).to(device)


def run(gpu, blocks=tuple(BLOCKS)):
    device = "cuda" if gpu else "cpu"
    b, l = (8, 512) if gpu else (1, 8)
    rows = bench.Rows()
    for block in blocks:
        lm = _lm(block, gpu, device)
        tok = torch.randint(0, 256, (b, l), device=device,
                            generator=torch.Generator(device=device).manual_seed(0))
        step = lambda lm=lm, tok=tok: lm(tok).float().logsumexp(-1).mean().backward()
        shape = f"{block} d_model {lm.cfg.d_model} n{lm.cfg.d_state} b{b} l{l}"
        with torch.no_grad():
            want = lm.set_backend("sequential")(tok).float()
        for name in M.available_backends(block):
            lm.set_backend(name)
            with torch.no_grad():
                got = lm(tok).float()
            err = rel_error(got, want)
            ms = bench.time_ms(step, warmup=2, rep=5, cpu_calls=1)
            rows.append(dict(topic="model", backend=name, shape=shape, ms=ms,
                             peak_gb=bench.peak_gb(step), logits_rel_err=err))
            lm.zero_grad(set_to_none=True)
            if gpu:
                torch.cuda.empty_cache()
    return rows


if __name__ == "__main__":
    print(bench.table(run(torch.cuda.is_available())))
