"""Code that runs *next to* the student's function, where a plain call does not say enough.

Each probe is ``probe(obj, *args)`` with ``obj`` the student's function or class. In a notebook it
is called directly; while grading it runs inside the student's kernel (this module is sent there as
source, so it imports nothing from ``mambalearn.check``) and only its *result* comes back, to be
compared by the check with the grader's own oracle. A probe computes no verdict itself.
"""

import torch


def tree_results(op, steps, orders, identity):
    """Evaluate ``op`` on ``steps`` in each bracketing of ``orders``; returns one result per order.

    An order is ("tree", nested tuple of step indices), ("hs",) for every Hillis–Steele prefix or
    ("blelloch",) for every Blelloch exclusive prefix. ``op`` takes pairs or 4 flat arguments.
    """
    fn = getattr(op, "fn", op)  # a @triton.jit combine: the Python function it wraps
    import inspect

    flat = len(inspect.signature(fn).parameters) == 4
    pair = (lambda l, r: tuple(fn(*l, *r))) if flat else (lambda l, r: tuple(fn(l, r)))

    def tree(t):
        return steps[t] if isinstance(t, int) else pair(tree(t[0]), tree(t[1]))

    out = []
    for order in orders:
        if order[0] == "tree":
            out.append(tree(order[1]))
        elif order[0] == "hs":
            x, k = list(steps), 1
            while k < len(x):
                x = [x[i] if i < k else pair(x[i - k], x[i]) for i in range(len(x))]
                k *= 2
            out.append(x)
        else:
            out.append(_blelloch(steps, pair, identity))
    return out


def _blelloch(steps, op, ident):
    """Exclusive prefixes by up-sweep and down-sweep over a power-of-two padded tree."""
    n = 1 << (len(steps) - 1).bit_length()
    x = list(steps) + [ident] * (n - len(steps))
    k = 1
    while k < n:  # up-sweep: x[i] holds the combine of the block ending at i
        for i in range(2 * k - 1, n, 2 * k):
            x[i] = op(x[i - k], x[i])
        k *= 2
    x[n - 1] = ident
    while k > 1:  # down-sweep: the left child gets the parent's prefix
        k //= 2
        for i in range(2 * k - 1, n, 2 * k):
            x[i - k], x[i] = x[i], op(x[i], x[i - k])
    return x[: len(steps)]


def fold_labels(fold, names):
    """``fold(names, op=label)`` with the non-associative ``label(l, r) = "(l⊗r)"``."""
    return fold(names, op=lambda l, r: f"({l}⊗{r})")


def fold_matrices(fold, steps):
    """``fold`` of (A, u) steps with a ⊗ of the probe's own (neither the library's nor yours)."""

    def op(left, right):
        (A_l, u_l), (A_r, u_r) = left, right
        if getattr(A_r, "ndim", 0) == getattr(u_r, "ndim", 0) + 1:
            return A_r @ A_l, (A_r @ u_l[..., None])[..., 0] + u_r
        return A_r * A_l, A_r * u_l + u_r

    return fold(steps, op=op)


def call_counting_launches(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` and the names of the Triton kernels it launched (``k[grid]``)."""
    from triton.runtime import interpreter, jit

    launched, classes = [], [jit.JITFunction, interpreter.InterpretedFunction]
    originals = {cls: cls.__dict__["run"] for cls in classes if "run" in cls.__dict__}

    def counting(original):
        def run(self, *a, **k):
            launched.append(getattr(getattr(self, "fn", None), "__name__", "?"))
            return original(self, *a, **k)
        return run

    for cls, original in originals.items():
        cls.run = counting(original)
    try:
        return fn(*args, **kwargs), sorted(set(launched))
    finally:
        for cls, original in originals.items():
            cls.run = original


def chunked_fn_grads(cls, a, b, chunk_size, h0, grad_h):
    """h = cls.apply(a, b, q, h0) and the gradients of ⟨grad_h, h⟩ w.r.t. a, b (and h0)."""
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    h0 = None if h0 is None else h0.detach().requires_grad_()
    h = cls.apply(a, b, chunk_size, h0)
    inputs = [a, b] + ([h0] if h0 is not None else [])
    grads = torch.autograd.grad(h, inputs, grad_h, allow_unused=True)
    return h.detach(), list(grads)


def chunked_fn_saved_bytes(cls, a, b, chunk_size, h0):
    """Bytes the Function keeps for its backward beyond its inputs (saved tensors and ctx attrs)."""
    a, b, h0 = (x.detach().requires_grad_() for x in (a, b, h0))
    inputs = {t.untyped_storage().data_ptr() for t in (a, b, h0)}
    seen, total = set(inputs), [0]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = cls.apply(a, b, chunk_size, h0)
    for v in getattr(h.grad_fn, "__dict__", {}).values():  # tensors hung on ctx (ctx.h = h)
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                total[0] += t.untyped_storage().nbytes()
    return total[0]


def block_grads(block, hidden, weights, grad_out):
    """``block(hidden, weights)`` and the gradients of ⟨grad_out, out⟩ w.r.t. hidden and weights."""
    hidden = hidden.detach().requires_grad_()
    weights = {k: v.detach().requires_grad_() for k, v in weights.items()}
    out = block(hidden, weights)
    names = list(weights)
    grads = torch.autograd.grad(out, [hidden] + [weights[k] for k in names], grad_out,
                                allow_unused=True)
    return out.detach(), grads[0], dict(zip(names, grads[1:], strict=True))


def table(fn, *shape_args, n=None):
    """``[fn(i, *shape_args) for i in range(n)]``: a pure function's whole table in one request."""
    return [fn(i, *shape_args) for i in range(n)]
