"""mambalearn — how Mamba's parallel scan is made fast.

Glossary (the letters never change meaning, in code, docstrings and notebooks).

Dimensions, lower case:

    b   batch size                     h   heads (Mamba-2)
    l   sequence length (time)         p   head dimension (Mamba-2)
    d   channels (model width)         q   chunk length
    n   state size per channel         c   number of chunks
    g   groups of B/C shared by channels (or heads)

The SSM, upper case (and the names mamba_ssm uses next to ours):

    A       state matrix: diagonal (d, n) in Mamba-1, one scalar per head (h,) in Mamba-2
    B, C    input and output projections: (b, n, l) or (b, g, n, l); Mamba-2 (b, l, g, n)
    D       skip connection: (d,); Mamba-2 (h,) or (h, p)
    delta   the step size Δ of Mamba-1, (b, d, l), positive after softplus(delta + delta_bias)
    dt      the step size Δ of Mamba-2 (mamba_ssm's name), (b, l, h): softplus(dt + dt_bias)
    u       Mamba-1's input sequence x (mamba_ssm's name), (b, d, l)
    x       Mamba-2's input (mamba_ssm's name), (b, l, h, p)
    A_bar   exp(Δ·A), the discrete decay Ā;  B_bar the discrete input matrix B̄
    h       the hidden state h_t;  y the output

The continuous system h′(t) = A h(t) + B x(t), y = C h + D x is discretized (chapter 01), becomes
the recurrence h_t = Ā_t h_{t−1} + B̄_t x_t (chapter 02), whose steps compose with the associative
operator ⊗ of `mambalearn.ops` (chapter 03) and can therefore be scanned in parallel (04–11).

`import mambalearn` needs only torch and numpy; Triton, matplotlib, ipywidgets and tqdm are
imported by the submodules that use them.
"""

import importlib

from mambalearn import device  # noqa: F401  (on a CPU: TRITON_INTERPRET=1 before Triton loads)

__version__ = "0.1.0"

_SUBMODULES = {
    "autograd", "check", "claims", "device", "discretize", "inference", "machine", "mamba1",
    "mamba2", "mamba3", "model", "ops", "parallel", "roofline", "scan", "serving", "silent",
    "testing", "timing", "train", "triton", "utils",
}


def __getattr__(name):
    # `mambalearn.check` etc. without importing every chapter at `import mambalearn`.
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'mambalearn' has no attribute {name!r}")
