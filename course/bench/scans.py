"""PyTorch scans (chapter 04): sequential, Hillis–Steele, Blelloch, and the whole selective scan.

    python -m mambalearn bench scans          # or: make bench

Two tables:
1. the bare scan h_t = a_t h_{t−1} + b_t on (l, 32768) fp32 steps at a few lengths;
2. the whole selective scan (discretize → scan → C contraction, fp32) at b8 d2048 n16 l2048
   (the course's benchmark shape), forward and forward+backward, with peak memory and memory
   passes (bytes read and written over the size of one (b, d, l, n) fp32 tensor, counted op by
   op: :func:`count_passes`), next to a peer: an in-place up-/down-sweep scan with a
   hand-written backward in the manner of
   mamba.py's ``pscan`` (our own code, written from the idea, see :class:`PeerPScan`), and
   mamba.py's own ``pscan`` (``from mambapy.pscan import pscan``) when ``mambapy`` is installed.
   Before any timing every backend's output and gradients are checked against the sequential
   oracle in float64 at a small size, and its output in fp32 at the timed size.
On a CPU every shape is tiny and the numbers only show that the code runs.
"""

import math

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from course.bench import Rows, peak_gb, time_ms
from mambalearn.scan.blelloch import blelloch_scan
from mambalearn.scan.hillis_steele import hillis_steele_scan
from mambalearn.scan.selective import selective_scan_parallel
from mambalearn.scan.sequential import linear_scan_sequential, selective_scan_sequential
from mambalearn.testing import assert_close


def _inplace_scan(A, X):
    """h_t = A_t h_{t−1} + X_t in place over dim 2 of (b, d, L, n), L a power of two; X becomes h.

    Up-sweep: every odd element absorbs its even neighbour, on ever sparser strided views.
    Down-sweep: the elements that are not yet full prefixes take the prefix k steps before them.
    ``A`` is overwritten with block products.
    """
    L = X.shape[2]
    Aa, Xa = A, X
    for _ in range(int(math.log2(L))):
        Aa, Xa = Aa.unflatten(2, (-1, 2)), Xa.unflatten(2, (-1, 2))  # (b, d, L/2k, 2, n)
        Xa[:, :, :, 1].add_(Aa[:, :, :, 1] * Xa[:, :, :, 0])
        Aa[:, :, :, 1].mul_(Aa[:, :, :, 0])
        Aa, Xa = Aa[:, :, :, 1], Xa[:, :, :, 1]
    k = L // 4
    while k >= 1:  # positions 3k−1, 5k−1, …: the block ending there absorbs the prefix before it
        Ak, Xk = A[:, :, k - 1 :: k], X[:, :, k - 1 :: k]  # (b, d, L/k, n)
        Xk[:, :, 2::2].add_(Ak[:, :, 2::2] * Xk[:, :, 1:-1:2])
        k //= 2
    return X


class PeerPScan(torch.autograd.Function):
    """The peer: mamba.py's ``pscan`` *idea* (in-place Blelloch on (b, d, l, n), custom backward).

    Our own implementation from the published description, not its code: the forward scans in
    place on copies; the backward is the reverse scan g_t = ∂h_t + A_{t+1} g_{t+1}, giving
    ∂X = g and ∂A_t = g_t h_{t−1}. Inputs and output are (b, l, d, n) like mamba.py's.
    """

    @staticmethod
    def forward(ctx, A, X):
        A_in = A.transpose(1, 2)  # (b, d, l, n)
        H = _inplace_scan(A_in.clone(), X.transpose(1, 2).clone())
        ctx.save_for_backward(A_in, H)
        return H.transpose(1, 2)

    @staticmethod
    def backward(ctx, dH):
        A, H = ctx.saved_tensors  # (b, d, l, n)
        A_next = F.pad(A[:, :, 1:], (0, 0, 0, 1))  # A_{t+1}, 0 past the end
        G = _inplace_scan(A_next.flip(2), dH.transpose(1, 2).flip(2)).flip(2)
        dA = G * F.pad(H[:, :, :-1], (0, 0, 1, 0))  # g_t h_{t−1}
        return dA.transpose(1, 2), G.transpose(1, 2)


def peer_selective_scan(u, delta, A, B, C, D=None, pscan=PeerPScan.apply):
    """mamba.py's selective scan layout: (b, l, d, n) steps, pscan, then (h @ C), fp32."""
    delta, x = delta.transpose(1, 2), u.transpose(1, 2)  # (b, l, d)
    A_bar = torch.exp(delta[..., None] * A)  # (b, l, d, n)
    Bx = delta[..., None] * B.transpose(1, 2)[:, :, None] * x[..., None]  # (b, l, d, n)
    h = pscan(A_bar, Bx)  # (b, l, d, n)
    y = (h @ C.transpose(1, 2)[..., None])[..., 0]  # (b, l, d)
    y = y if D is None else y + D * x
    return y.transpose(1, 2)  # (b, d, l)


def _mambapy_pscan():
    try:
        from mambapy.pscan import pscan
    except ImportError:
        return None
    return pscan


def _bare_backends(a, b):
    """The four ways to scan (l, width) steps over time."""
    return {"sequential loop": lambda: linear_scan_sequential(a, b, dim=0),
            "hillis-steele": lambda: hillis_steele_scan(a, b, dim=0),
            "blelloch": lambda: blelloch_scan(a, b, dim=0),
            "peer in-place pscan": lambda: _inplace_scan(a.T[:, None, :, None].clone(),
                                                         b.T[:, None, :, None].clone())}


def _bare_scans(gpu, dev):
    rows = Rows()
    width = 8 * 256 * 16 if gpu else 64
    for l in ([256, 1024, 4096] if gpu else [16, 64]):
        a = torch.rand(l, width, device=dev) * 0.5 + 0.5  # (l, width)
        b = torch.randn(l, width, device=dev)
        for name, fn in _bare_backends(a, b).items():
            rows.append(dict(topic="scans", backend=name, shape=f"l{l} x {width}", ms=time_ms(fn),
                             peak_gb=peak_gb(fn)))
    return rows


def _selective_inputs(gpu, dev, size=None, dtype=torch.float32):
    b, d, n, l = size or ((8, 2048, 16, 2048) if gpu else (1, 8, 4, 64))
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: torch.randn(*s, device=dev, generator=g, dtype=dtype)
    args = dict(u=r(b, d, l), delta=F.softplus(r(b, d, l) - 3), A=-torch.rand(
        d, n, device=dev, generator=g, dtype=dtype) * 4, B=r(b, n, l), C=r(b, n, l), D=r(d))
    return f"b{b} d{d} n{n} l{l} {str(dtype)[6:].replace('float', 'fp')}", args


def _fwd_bwd(fn, args):
    leaves = {k: v.detach().requires_grad_() for k, v in args.items()}

    def run():
        out = fn(**leaves)
        out.backward(torch.ones_like(out))
        grads = {k: v.grad for k, v in leaves.items()}
        for v in leaves.values():
            v.grad = None
        return out, grads

    return run


def _selective_backends():
    backends = {"blelloch (selective_scan_parallel)": selective_scan_parallel,
                "hillis-steele": lambda **k: selective_scan_parallel(**k, scan=hillis_steele_scan),
                "peer: in-place pscan (mamba.py idea)": peer_selective_scan}
    mambapy = _mambapy_pscan()
    if mambapy is not None:  # mamba.py's selective_scan body (the same ops) with its own pscan
        backends["mamba.py pscan (mambapy package)"] = lambda **k: peer_selective_scan(
            **k, pscan=mambapy)
    return backends


def check_selective_backends(dev, size=(2, 64, 16, 256)):
    """Every backend's output and gradients against the sequential oracle, float64, on ``dev``.

    Raises AssertionError naming the backend and the tensor that disagrees.
    """
    _, args = _selective_inputs(False, dev, size, torch.float64)
    want, want_grads = _fwd_bwd(selective_scan_sequential, args)()
    for name, fn in _selective_backends().items():
        out, grads = _fwd_bwd(fn, args)()
        assert_close(out, want, msg=f"{name}: output disagrees with selective_scan_sequential")
        for k, g in grads.items():
            assert_close(g, want_grads[k], grad=True, msg=f"{name}: gradient of {k} disagrees "
                         f"with selective_scan_sequential's")


def _selective(gpu, dev):
    check_selective_backends(dev)  # float64 outputs and gradients at a small size, then:
    shape, args = _selective_inputs(gpu, dev)
    backends = _selective_backends()
    unit = math.prod(args["u"].shape) * args["A"].shape[1] * 4  # one (b, d, l, n) fp32 tensor
    # the same answer at the timed size (fp32 tolerance against the oracle), then the clock
    want = selective_scan_sequential(**args)
    for name, fn in backends.items():
        assert_close(fn(**args), want, msg=f"{name} disagrees with selective_scan_sequential")
    rows = Rows()
    seq = lambda: selective_scan_sequential(**args)
    rows.append(dict(topic="selective fwd", backend="sequential loop", shape=shape,
                     ms=time_ms(seq, warmup=2, rep=5), peak_gb=peak_gb(seq)))
    for name, fn in backends.items():
        fwd = lambda fn=fn: fn(**args)
        rows.append(dict(topic="selective fwd", backend=name, shape=shape, ms=time_ms(fwd),
                         peak_gb=peak_gb(fwd), passes=round(count_passes(fwd, unit), 1)))
        if name.startswith("hillis") and gpu:
            continue  # l·log l work and memory: forward only at this size
        both = _fwd_bwd(fn, args)
        rows.append(dict(topic="selective fwd+bwd", backend=name, shape=shape, ms=time_ms(both),
                         peak_gb=peak_gb(both), passes=round(count_passes(both, unit), 1)))
    _ratios(rows, "mamba.py pscan (mambapy package)")
    return rows


def _ratios(rows, peer):
    """ratio = ms / the peer's ms in the same topic (this run), where the peer was measured."""
    peer_ms = {r["topic"]: r["ms"] for r in rows if r["backend"] == peer}
    for r in rows:
        if r["topic"] in peer_ms:
            r["ratio"] = r["ms"] / peer_ms[r["topic"]]


class PassCounter(TorchDispatchMode):
    """Counts the bytes every ATen op reads and writes (views: none), forward and backward.

    A tensor's bytes count its distinct elements once (a broadcast dim of stride 0 counts once);
    ``out=`` arguments and the target of ``copy_``/``fill_``/``zero_`` are written, not read.
    """

    def __init__(self):
        super().__init__()
        self.bytes, self.ops = 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if any(r.alias_info is not None and not r.alias_info.is_write for r in returns) or \
                "empty" in func.__name__ or func.__name__.startswith("_unsafe_view"):
            return out  # a view, or memory that is allocated but not touched
        written_only = func.__name__.startswith(("copy_", "fill_", "zero_"))
        read = [a for i, a in enumerate(args) if not (i == 0 and written_only)]
        read += [v for k, v in kwargs.items() if k != "out"]
        moved = sum(_distinct_bytes(t) for t in _tensors(read) + _tensors([out]))
        self.bytes += moved
        self.ops[func.__name__] = self.ops.get(func.__name__, 0) + moved
        return out


def _tensors(xs):
    flat = [y for x in xs for y in (x if isinstance(x, (list, tuple)) else [x])]
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _distinct_bytes(t):
    distinct = (s for s, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    return math.prod(distinct) * t.element_size()


def count_passes(fn, unit_bytes):
    """Bytes that ``fn()`` reads and writes (``PassCounter``), in units of ``unit_bytes``: the
    number of passes over a tensor of that size; device independent."""
    with PassCounter() as c:
        fn()
    return c.bytes / unit_bytes


def run(gpu):
    dev = torch.device("cuda" if gpu else "cpu")
    with torch.no_grad():
        rows = _bare_scans(gpu, dev)
    return rows + _selective(gpu, dev)
