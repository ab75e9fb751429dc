"""One-off device probe: which fused SSD / MIMO shapes fail on the GPU, and how (last lines)."""
import traceback

import torch

import mambalearn  # noqa: F401
from mambalearn.testing import assert_close

dev = "cuda"
torch.manual_seed(0)


def trial(name, fn):
    try:
        fn()
        print("OK  ", name, flush=True)
    except Exception as e:  # noqa: BLE001
        tb = traceback.format_exc().strip().splitlines()
        print("FAIL", name, type(e).__name__, "|", " / ".join(tb[-4:])[:700], flush=True)


def ssd(b, l, h, p, g, n, q, dtype=torch.float32, **kw):
    from mambalearn.ssd import ssd_sequential  # noqa: F401
    from mambalearn.triton.ssd import mamba_chunk_scan_combined
    from mambalearn.triton.ssd.fused import ssd_fused_forward
    from mambalearn.triton.ssd.forward import ssd_forward
    x = torch.randn(b, l, h, p, device=dev, dtype=dtype)
    dt = torch.rand(b, l, h, device=dev)
    A = -torch.rand(h, device=dev)
    B = torch.randn(b, l, g, n, device=dev, dtype=dtype)
    C = torch.randn(b, l, g, n, device=dev, dtype=dtype)
    out, _ = ssd_fused_forward(x, dt, A, B, C, q, **kw)
    want, _ = ssd_forward(x, dt, A, B, C, q, **kw)
    assert_close(out, want, dtype=torch.bfloat16)
    y = mamba_chunk_scan_combined(x.requires_grad_(), dt, A, B, C, q)
    y.sum().backward()


for shp in [(2, 37, 2, 4, 1, 8, 16), (2, 37, 2, 4, 1, 16, 16), (2, 64, 2, 16, 1, 16, 16),
            (2, 64, 2, 64, 1, 64, 32), (1, 256, 4, 64, 1, 128, 64)]:
    for dt in (torch.float32, torch.bfloat16):
        trial(f"ssd {shp} {dt}", lambda shp=shp, dt=dt: ssd(*shp, dtype=dt))
