"""Bench topic ``step``: the decode-step state update, ours vs ``mamba_ssm``'s, eager and graphed.

Shapes: Mamba-2 2.7B's decode step, b64 h80 p64 n128, and one sequence (b1), state
float32 (and bfloat16),
x/dt/B/C bfloat16, A/D/dt_bias float32 broadcast per head with stride 0 exactly as ``mamba_ssm``'s
``Mamba2.step`` passes them. The byte floor is the state read once and written once,
2·b·h·p·n·sizeof(state) over the reference H200's measured copy bandwidth (``roofline.H200``).

``mamba_ssm``'s kernel is pure Triton; it is imported from the unpacked source tree in
``.mamba_ref`` through stub packages (no CUDA extension needed) when that tree is present.
"""


import torch

from course.bench import _reference, time_ms
from mambalearn import roofline


def load_mamba_ssm_step():
    """``mamba_ssm``'s ``selective_state_update`` from the source tree, or None if it is absent."""
    return _reference.load("ops.triton.selective_state_update", "selective_state_update")


def mamba2_step_inputs(b, h, p, n, state_dtype=torch.float32, dtype=torch.bfloat16, device="cuda",
                       seed=0):
    """Random inputs laid out as mamba_ssm's Mamba2.step passes them (per-head scalars, stride 0).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    r = lambda *s, dt=dtype: torch.randn(*s, generator=g, device=device, dtype=torch.float32).to(dt)
    A = -torch.exp(r(h, dt=torch.float32))
    return dict(
        state=r(b, h, p, n, dt=state_dtype), x=r(b, h, p), dt=r(b, h)[..., None].expand(b, h, p),
        A=A[:, None, None].expand(h, p, n), B=r(b, 1, n), C=r(b, 1, n),
        D=r(h, dt=torch.float32)[:, None].expand(h, p),
        dt_bias=r(h, dt=torch.float32)[:, None].expand(h, p), z=None, dt_softplus=True,
    )


def floor_ms(b, h, p, n, state_dtype):
    nbytes = 2 * b * h * p * n * torch.finfo(state_dtype).bits // 8
    return nbytes / roofline.H200.bandwidth * 1e3


def graph_ms(fn, n_calls=20, rep=100):
    """Milliseconds per call when ``n_calls`` calls are replayed as one CUDA graph."""
    import triton.testing

    fn()  # compile outside the capture
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(lambda: [fn() for _ in range(n_calls)], rep=rep,
                                             return_mode="median") / n_calls


def run(gpu, tune=None, label="mambalearn"):
    """Rows for ours (with the launcher's defaults, or the ``tune`` fields of a ``StepConfig``)
    and mamba_ssm's."""
    from mambalearn.mamba2.step import StepConfig, selective_state_update

    config = StepConfig(**(tune or {}))

    shapes = [(64, 80, 64, 128), (1, 80, 64, 128)] if gpu else [(2, 2, 4, 8)]
    dev = "cuda" if gpu else "cpu"
    theirs = load_mamba_ssm_step() if gpu else None
    rows = []
    for state_dtype in (torch.float32, torch.bfloat16):
        for b, h, p, n in shapes:
            inp = mamba2_step_inputs(b, h, p, n, state_dtype, device=dev)
            shape = f"b{b} h{h} p{p} n{n} state {str(state_dtype)[6:]}"
            fl = floor_ms(b, h, p, n, state_dtype)
            fns = {label: lambda inp=inp: selective_state_update(**inp, config=config)}
            if theirs is not None:
                fns["mamba_ssm"] = lambda inp=inp: theirs(**inp)
            timed = {}
            for name, fn in fns.items():
                timed[name] = time_ms(fn)
                if gpu:
                    timed[name + " (graph)"] = graph_ms(fn)
            for name, ms in timed.items():
                ref = timed.get("mamba_ssm (graph)" if name.endswith("(graph)") else "mamba_ssm")
                rows.append(dict(topic="step", backend=name, shape=shape, ms=ms,
                                 ratio=None if ref is None else ms / ref,
                                 floor_pct=100 * fl / ms if gpu else None))
    return rows
