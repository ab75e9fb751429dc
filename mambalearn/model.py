"""Chapter 13 — the whole model: Mamba blocks and a tiny language model.

A Mamba-1 block (Gu & Dao 2023, fig. 3), on hidden states x of shape (b, l, d_model):

    [x_in, z] = in_proj(RMSNorm(x))                     (b, l, 2·d)      d = expand · d_model
    x_in = SiLU(causal_depthwise_conv1d(x_in))          (b, l, d)        kernel k = d_conv
    [Δ_raw, B, C] = x_proj(x_in)                        Δ_raw (b, l, r), B, C (b, l, n)
    Δ = softplus(dt_proj(Δ_raw))                        (b, l, d)        selection: Δ, B, C from x
    y = selective_scan(x_in, Δ, A = −exp(A_log), B, C, D) · SiLU(z)
    x ← x + out_proj(y)                                 (residual)

A Mamba-2 block projects [z, x, B, C, Δ] at once, convolves x, B, C together, makes A one scalar
per head and runs the SSD scan (chapter 10); the gate goes through a gated RMSNorm.

The scan backend is chosen *by name* (``BACKENDS``) and resolved lazily, so the model works with
whichever chapters' modules exist: the sequential oracle (chapter 02), Blelloch (04), chunked
(06), chunked recomputation (07), the fused Triton kernel (09); for Mamba-2 the SSD oracles and
kernel (10). Decoding uses ``mambalearn.inference`` (the cache) and a decode step chosen by
name the same way (``STEP_BACKENDS``: the oracle, or the state-update kernel of chapter 12).

Later chapters plug their blocks in without this module knowing them: ``register_block(name,
mixer, backends, step_backends)`` (chapter 15's Mamba-3 block registers itself from
``mambalearn.mamba3.mixer``). So the model imports no kernel module: it receives its kernels
through these two registries, resolved when a layer first runs. ``hybrid(cfg,
attention_layers)`` puts causal attention layers (``AttentionMixer``, a growing ``KVCache``)
among the Mamba layers, as Jamba and Granite-4.0 do (chapter 16 measures one).

The task the model learns, and its training loop, are in ``mambalearn.train``
(``selective=False`` builds the LTI model that task tells apart from the selective one).
"""

import importlib
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from mambalearn import inference
from mambalearn.inference import InferenceCache, LayerCache
from mambalearn.utils import check_chunk_size

# ---------------------------------------------------------------------------------------------
# 1. scan backends, by name


# name -> (module, function). Mamba-1 functions have selective_scan_sequential's signature;
# Mamba-2 functions mamba_chunk_scan_combined's.
BACKENDS = {
    "mamba1": {
        "sequential": ("mambalearn.scan.sequential", "selective_scan_sequential"),
        "blelloch": ("mambalearn.scan.selective", "selective_scan_parallel"),
        "chunked": ("mambalearn.scan.chunked", "selective_scan_chunked"),
        "recompute": ("mambalearn.autograd", "selective_scan_recompute"),
        "triton": ("mambalearn.mamba1", "selective_scan_fn"),
    },
    "mamba2": {
        "sequential": ("mambalearn.mamba2.reference", "ssd_sequential"),
        "chunked": ("mambalearn.mamba2.reference", "mamba_chunk_scan_ref"),
        "triton": ("mambalearn.mamba2", "mamba_chunk_scan_combined"),
    },
}


# name -> (module, function): the decode steps. Mamba-1/-2 ones have selective_state_update's
# signature; "auto" in a config picks "triton" on a GPU, "oracle" elsewhere.
_STEP_SSM = {"oracle": ("mambalearn.inference", "decode_step"),
             "triton": ("mambalearn.mamba2.step", "selective_state_update")}
STEP_BACKENDS = {"mamba1": _STEP_SSM, "mamba2": _STEP_SSM}
STEP_CHOICES = ("oracle", "triton", "auto")


def resolve(name, block="mamba1", table=None):
    """The function registered under ``name`` for ``block`` in ``table`` (default ``BACKENDS``,
    the scans; ``STEP_BACKENDS`` for the decode steps); ``LookupError`` if its module is not
    there."""
    table = (BACKENDS if table is None else table)[block]
    if name not in table:
        raise ValueError(f"unknown {block} backend {name!r}; choose one of {sorted(table)}")
    module, attr = table[name]
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise LookupError(f"backend {name!r} needs {module}.{attr}, not available: {e}") from e
    return fn


def available_backends(block="mamba1"):
    """Names of the backends whose modules import, in the order of ``BACKENDS``."""
    out = []
    for name in BACKENDS[block]:
        try:
            resolve(name, block)
            out.append(name)
        except LookupError:
            pass
    return out


def scan_mamba1(fn, u, delta, A, B, C, D, z, delta_bias, delta_softplus, h0):
    """Run a Mamba-1 backend from state ``h0`` (None = zeros) → (out (b, d, l), last (b, d, n)).

    A backend without ``initial_state`` (mamba_ssm's signature has none) scans from zero and the
    decayed h₀ is added afterwards (``inference.initial_state_contribution``: linearity).
    """
    if h0 is None or "initial_state" in inspect.signature(fn).parameters:
        kw = {} if h0 is None else {"initial_state": h0}
        return fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state=True, **kw)
    delta = delta if delta_bias is None else delta + delta_bias[:, None]
    delta = F.softplus(delta.float()) if delta_softplus else delta.float()  # (b, d, l)
    y, last = fn(u, delta, A, B, C, None, None, None, False, return_last_state=True)
    y_extra, h_extra = inference.initial_state_contribution(delta, A, C, h0)
    y = y.float() + y_extra  # (b, d, l)
    if D is not None:
        y = y + D[:, None] * u.float()
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(u.dtype), last + h_extra


def scan_mamba2(name, fn, x, dt, A, B, C, chunk_size, D, dt_bias, dt_softplus, h0, seq_idx):
    """Run a Mamba-2 backend; returns (y (b, l, h, p), final state (b, h, p, n)).

    Δ = softplus(dt + dt_bias) if ``dt_softplus`` else dt + dt_bias, one per (b, l, h).
    """
    if name == "sequential":  # the raw recurrence: Δ, D are ours to apply; no seq_idx
        if seq_idx is not None:
            raise ValueError("the Mamba-2 'sequential' backend has no seq_idx; "
                             "use 'chunked' or 'triton'")
        delta = dt.float() if dt_bias is None else dt.float() + dt_bias.float()
        delta = F.softplus(delta) if dt_softplus else delta  # (b, l, h)
        y, last = fn(x, delta, A, B, C, initial_states=h0)
        return (y + D.float()[:, None] * x.float()).to(x.dtype), last
    return fn(x, dt, A, B, C, chunk_size, D=D, dt_bias=dt_bias, initial_states=h0, seq_idx=seq_idx,
              dt_softplus=dt_softplus, return_final_states=True)


# ---------------------------------------------------------------------------------------------
# 2. the blocks


@dataclass
class MambaConfig:
    vocab_size: int = 16
    d_model: int = 32
    n_layers: int = 2
    d_state: int = 8  # n
    d_conv: int = 4  # k
    expand: int = 2  # d = expand · d_model
    dt_rank: int = 0  # r; 0 = ⌈d_model / 16⌉ as in Mamba
    block: str = "mamba1"  # or "mamba2", or a name a later chapter registers (register_block)
    headdim: int = 16  # p (Mamba-2)
    ngroups: int = 1  # g (Mamba-2)
    chunk_size: int = 16  # q (Mamba-2 chunked/triton backends)
    selective: bool = True  # False: Δ, B, C do not depend on the input (an LTI SSM)
    backend: str = "sequential"
    step_backend: str = "auto"  # "oracle" | "triton" | "auto" (triton on a GPU)

    def __post_init__(self):
        """Every field checked here, by name, so that a bad size fails now and not deep in a
        layer (or, for a backend name, silently in another one)."""
        for name in ("vocab_size", "d_model", "n_layers", "d_state", "d_conv", "expand",
                     "headdim", "ngroups"):
            _check_int(name, getattr(self, name), 1)
        _check_int("dt_rank", self.dt_rank, 0)
        check_chunk_size(self.chunk_size)
        if not isinstance(self.selective, bool):
            raise TypeError(f"selective must be True or False, got {self.selective!r}")
        for name in ("block", "backend", "step_backend"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"{name} must be a name (str), got {getattr(self, name)!r}")
        if self.step_backend not in STEP_CHOICES:
            raise ValueError(f"step_backend must be one of {STEP_CHOICES}, got "
                             f"{self.step_backend!r}")
        if self.block in BACKENDS and self.backend not in BACKENDS[self.block]:
            raise ValueError(f"unknown {self.block} backend {self.backend!r}; choose one of "
                             f"{sorted(BACKENDS[self.block])}")
        if self.block != "mamba1":  # heads of headdim channels, in ngroups groups of B/C
            d = self.expand * self.d_model
            if d % self.headdim or (d // self.headdim) % self.ngroups:
                raise ValueError(f"expand·d_model = {d} must be a multiple of headdim = "
                                 f"{self.headdim}, in a number of heads that ngroups = "
                                 f"{self.ngroups} divides")


def _check_int(name, v, minimum):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if v < minimum:
        raise ValueError(f"{name} must be ≥ {minimum}, got {v}")


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + ε) · w; with ``z``: the gated form of Mamba-2, RMSNorm(x · silu(z))."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x, z=None):
        if z is not None:
            x = x * F.silu(z)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def dt_bias_init(d, dt_min=1e-3, dt_max=1e-1):
    """softplus⁻¹ of Δ drawn log-uniformly in [dt_min, dt_max] (Mamba's initialisation)."""
    dt = torch.exp(torch.rand(d) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    return dt + torch.log(-torch.expm1(-dt))  # softplus(this) = dt


def step_fn(cfg, device):
    """The decode step ``cfg.step_backend`` names for this block (``STEP_BACKENDS``); "auto" is
    the Triton kernel on a GPU and the oracle elsewhere."""
    name = cfg.step_backend
    if name == "auto":
        name = "triton" if device.type == "cuda" else "oracle"
    return resolve(name, cfg.block, STEP_BACKENDS)


def _check_tokens(name, tokens, ndim):
    """Token ids: an integer tensor of ``ndim`` dimensions (the embedding looks them up)."""
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or tokens.is_complex() \
            or tokens.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of token ids, got "
                        f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tokens.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions ({'(b, l)' if ndim == 2 else '(b,)'}"
                         f"), got shape {tuple(tokens.shape)}")


def check_mask(mask, b, l):
    """A padding mask must be a bool (b, l) tensor (True = a real token): a soft float mask
    would scale Δ and the inputs instead of keeping the state."""
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor (True = real token), got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}; use mask.bool()")
    if tuple(mask.shape) != (b, l):
        raise ValueError(f"mask must have shape (b, l) = {(b, l)}, got {tuple(mask.shape)}")


class Mamba1Mixer(nn.Module):
    """in_proj → causal conv → SiLU → selective scan (Δ, B, C from x) → · SiLU(z) → out_proj."""

    def __init__(self, cfg):
        super().__init__()
        d, n, self.cfg = cfg.expand * cfg.d_model, cfg.d_state, cfg
        self.r = cfg.dt_rank or math.ceil(cfg.d_model / 16)
        self.in_proj = nn.Linear(cfg.d_model, 2 * d, bias=False)
        self.conv_weight = nn.Parameter(torch.randn(d, cfg.d_conv) / math.sqrt(cfg.d_conv))
        self.conv_bias = nn.Parameter(torch.zeros(d))
        self.x_proj = nn.Linear(d, self.r + 2 * n, bias=False)
        self.dt_proj = nn.Linear(self.r, d, bias=True)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt_bias_init(d))
        # S4D-real initialisation: A = −(1, 2, …, n) in every channel; kept as log so A < 0 always
        self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1).float()).repeat(d, 1))  # (d, n)
        self.D = nn.Parameter(torch.ones(d))
        self.out_proj = nn.Linear(d, cfg.d_model, bias=False)
        if not cfg.selective:  # LTI: fixed B, C (Δ comes from the bias alone)
            self.B_lti, self.C_lti = (nn.Parameter(torch.randn(n) / math.sqrt(n)) for _ in range(2))

    def dbc(self, x):
        """Δ_raw (…, d) without bias, B, C (…, n) from x (…, d); constants for the LTI model."""
        r, n = self.r, self.cfg.d_state
        dt, B, C = self.x_proj(x).split([r, n, n], dim=-1)
        dt = F.linear(dt, self.dt_proj.weight)  # (…, d): the bias enters as delta_bias
        if not self.cfg.selective:
            dt, B, C = torch.zeros_like(dt), self.B_lti.expand_as(B), self.C_lti.expand_as(C)
        return dt, B, C

    def forward(self, hidden, cache=None, mask=None, seq_idx=None):
        """hidden (b, l, d_model) → (b, l, d_model); with ``cache``: continue from it, update it."""
        if seq_idx is not None:
            raise ValueError("seq_idx (packed sequences) needs block='mamba2'; for Mamba-1 use "
                             "mask (padding) or inference.scan_by_steps")
        check_mask(mask, *hidden.shape[:2])
        x, z = self.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)  # (b, d, l) each
        if mask is not None:  # padding enters the conv as zeros, as at a sequence start
            x = x * mask[:, None, :]
        x, conv_state = inference.causal_conv1d(x, self.conv_weight, self.conv_bias,
                                                None if cache is None else cache.conv_state)
        x = F.silu(x)  # (b, d, l)
        dt, B, C = self.dbc(x.transpose(1, 2))  # (b, l, d), (b, l, n), (b, l, n)
        delta, bias, softplus = dt.transpose(1, 2), self.dt_proj.bias, True  # (b, d, l)
        if mask is not None:  # Δ = 0 at padding: the state is kept exactly
            delta = F.softplus(delta + bias[:, None]) * mask[:, None, :]  # (b, d, l)
            bias, softplus = None, False
        fn = resolve(self.cfg.backend, "mamba1")
        h0 = None if cache is None else cache.ssm_state
        y, last = scan_mamba1(fn, x, delta.contiguous(), -torch.exp(self.A_log), B.transpose(1, 2),
                              C.transpose(1, 2), self.D, z, bias, softplus, h0)  # (b, d, l)
        if cache is not None:
            cache.conv_state.copy_(conv_state)
            cache.ssm_state.copy_(last)
        return self.out_proj(y.transpose(1, 2))  # (b, l, d_model)

    def step(self, hidden, cache):
        """One token: hidden (b, d_model) → (b, d_model); the cache is updated in place."""
        x, z = self.in_proj(hidden).chunk(2, dim=-1)  # (b, d) each
        x = inference.causal_conv1d_step(x, cache.conv_state, self.conv_weight, self.conv_bias)
        x = F.silu(x)  # (b, d)
        dt, B, C = self.dbc(x)  # (b, d), (b, n), (b, n)
        y = step_fn(self.cfg, hidden.device)(cache.ssm_state, x, dt, -torch.exp(self.A_log), B, C,
                                             self.D, z, self.dt_proj.bias, True)  # (b, d)
        return self.out_proj(y)

    def empty_cache(self, batch, device, state_dtype=torch.float32):
        d = self.cfg.expand * self.cfg.d_model
        return LayerCache(torch.zeros(batch, d, self.cfg.d_conv, device=device,
                                      dtype=self.conv_weight.dtype),
                          torch.zeros(batch, d, self.cfg.d_state, device=device, dtype=state_dtype))


class Mamba2Mixer(nn.Module):
    """in_proj → [z, xBC, Δ]; SiLU(conv(xBC)) → SSD, one A per head → RMSNorm(y·silu(z)) → out."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, n, g = cfg.expand * cfg.d_model, cfg.d_state, cfg.ngroups
        if d % cfg.headdim:
            raise ValueError(f"expand·d_model = {d} must be a multiple of headdim = {cfg.headdim}")
        self.h = d // cfg.headdim
        self.conv_dim = d + 2 * g * n
        self.in_proj = nn.Linear(cfg.d_model, d + self.conv_dim + self.h, bias=False)
        w = torch.randn(self.conv_dim, cfg.d_conv) / math.sqrt(cfg.d_conv)
        self.conv_weight = nn.Parameter(w)
        self.conv_bias = nn.Parameter(torch.zeros(self.conv_dim))
        self.dt_bias = nn.Parameter(dt_bias_init(self.h))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.h).uniform_(1, 16)))  # (h,)
        self.D = nn.Parameter(torch.ones(self.h))
        self.norm = RMSNorm(d)
        self.out_proj = nn.Linear(d, cfg.d_model, bias=False)

    def split_proj(self, zxbcdt):
        """in_proj's output (…, total) → z (…, d), xBC (…, conv_dim), Δ_raw (…, h)."""
        d = self.cfg.expand * self.cfg.d_model
        return zxbcdt.split([d, self.conv_dim, self.h], dim=-1)

    def split_xbc(self, xBC):
        """The conv's output (…, conv_dim) → x (…, h, p), B, C (…, g, n)."""
        d, gn = self.cfg.expand * self.cfg.d_model, self.cfg.ngroups * self.cfg.d_state
        x, B, C = xBC.split([d, gn, gn], dim=-1)
        sh = xBC.shape[:-1]
        return (x.reshape(*sh, self.h, self.cfg.headdim), B.reshape(*sh, self.cfg.ngroups, -1),
                C.reshape(*sh, self.cfg.ngroups, -1))

    def forward(self, hidden, cache=None, mask=None, seq_idx=None):
        b, l, _ = hidden.shape
        check_mask(mask, b, l)
        z, xBC, dt = self.split_proj(self.in_proj(hidden))  # (b, l, d), (b, l, conv_dim), (b, l, h)
        xBC = xBC.transpose(1, 2)  # (b, conv_dim, l)
        if mask is not None:
            xBC = xBC * mask[:, None, :]
        if seq_idx is not None and cache is None:  # no tap may reach into the previous sequence
            xBC = _conv_segments(xBC, self.conv_weight, self.conv_bias, seq_idx)
            conv_state = None
        else:
            xBC, conv_state = inference.causal_conv1d(xBC, self.conv_weight, self.conv_bias,
                                                      None if cache is None else cache.conv_state)
        x, B, C = self.split_xbc(F.silu(xBC).transpose(1, 2))  # (b, l, h, p), (b, l, g, n) ×2
        dt_bias, softplus = self.dt_bias, True
        if mask is not None:  # Δ = 0 at padding: the state is kept exactly
            dt, dt_bias, softplus = F.softplus(dt + dt_bias) * mask[..., None], None, False
        name = self.cfg.backend
        h0 = None if cache is None else cache.ssm_state
        y, last = scan_mamba2(name, resolve(name, "mamba2"), x, dt, -torch.exp(self.A_log), B, C,
                              self.cfg.chunk_size, self.D, dt_bias, softplus, h0, seq_idx)
        if cache is not None:
            cache.conv_state.copy_(conv_state)
            cache.ssm_state.copy_(last)
        return self.out_proj(self.norm(y.reshape(b, l, -1), z))  # (b, l, d_model)

    def step(self, hidden, cache):
        z, xBC, dt = self.split_proj(self.in_proj(hidden))  # (b, d), (b, conv_dim), (b, h)
        xBC = F.silu(inference.causal_conv1d_step(xBC, cache.conv_state, self.conv_weight,
                                                  self.conv_bias))
        x, B, C = self.split_xbc(xBC)  # (b, h, p), (b, g, n), (b, g, n)
        y = step_fn(self.cfg, hidden.device)(cache.ssm_state, x, dt, -torch.exp(self.A_log), B, C,
                                             self.D, None, self.dt_bias, True)  # (b, h, p)
        return self.out_proj(self.norm(y.flatten(1), z))

    def empty_cache(self, batch, device, state_dtype=torch.float32):
        return LayerCache(
            torch.zeros(batch, self.conv_dim, self.cfg.d_conv, device=device,
                        dtype=self.conv_weight.dtype),
            torch.zeros(batch, self.h, self.cfg.headdim, self.cfg.d_state, device=device,
                        dtype=state_dtype))


def _conv_segments(x, weight, bias, seq_idx):
    """Causal depthwise conv whose taps stop at sequence boundaries (packed sequences)."""
    k = weight.shape[1]
    xp = F.pad(x, (k - 1, 0))  # (b, d, l + k − 1)
    sp = F.pad(seq_idx, (k - 1, 0), value=-1)  # (b, l + k − 1)
    win = xp.unfold(-1, k, 1)  # (b, d, l, k): win[..., t, j] = x_{t−k+1+j}
    same = sp.unfold(-1, k, 1) == seq_idx[..., None]  # (b, l, k): tap j is in t's sequence
    return (win * same[:, None] * weight[:, None, :]).sum(-1) + bias[:, None]  # (b, d, l)


MIXERS = {"mamba1": Mamba1Mixer, "mamba2": Mamba2Mixer}  # block name -> mixer class


def register_block(name, mixer, backends, step_backends=None):
    """Make ``MambaConfig(block=name)`` build ``mixer(cfg)``, its scan chosen from ``backends``
    ({backend name: (module, function)}, as in ``BACKENDS``) and its decode step from
    ``step_backends`` ({"oracle" | "triton": (module, function)}). How a later chapter adds a
    block."""
    MIXERS[name], BACKENDS[name] = mixer, dict(backends)
    STEP_BACKENDS[name] = dict(step_backends or {})


class Block(nn.Module):
    """x ← x + mixer(RMSNorm(x)) (pre-norm residual, as in Mamba)."""

    def __init__(self, cfg):
        super().__init__()
        self.norm = RMSNorm(cfg.d_model)
        if cfg.block not in MIXERS:
            raise ValueError(f"unknown block {cfg.block!r}; registered: {sorted(MIXERS)} (a later "
                             "chapter's block registers itself on import, e.g. mambalearn.mamba3)")
        self.mixer = MIXERS[cfg.block](cfg)

    def forward(self, x, cache=None, **kw):
        return x + self.mixer(self.norm(x), cache, **kw)  # (b, l, d_model)

    def step(self, x, cache):
        return x + self.mixer.step(self.norm(x), cache)


# ---------------------------------------------------------------------------------------------
# 3. the language model


class MambaLM(nn.Module):
    """Embedding → n_layers × Block → RMSNorm → tied output head; logits (b, l, vocab)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)  # as mamba_ssm: tied logits start near 0
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model)

    def to_inference_dtype(self, dtype=torch.bfloat16):
        """Cast weights to ``dtype`` but keep A_log, D and dt_bias float32 (as mamba_ssm does):
        the decay exp(ΔA) is applied thousands of times and must not be rounded (chapter 12)."""
        for name, prm in self.named_parameters():
            if name.rsplit(".", 1)[-1] not in ("A_log", "D", "dt_bias"):
                prm.data = prm.data.to(dtype)
        return self

    def set_backend(self, name):
        """Switch every layer's scan (by name); checks it can be imported."""
        resolve(name, self.cfg.block)
        self.cfg.backend = name
        return self

    def forward(self, tokens, cache=None, mask=None, seq_idx=None):
        """tokens (b, l) int → logits (b, l, vocab). With ``cache`` the sequence continues the
        cached one (chunked prefill) and the cache is updated. ``mask`` (b, l) bool marks real
        tokens (left padding); ``seq_idx`` (b, l) packs sequences in a row (Mamba-2 only)."""
        _check_tokens("tokens", tokens, 2)
        x = self.embedding(tokens)  # (b, l, d_model)
        kw = {} if seq_idx is None else {"seq_idx": seq_idx}
        if mask is not None:
            kw["mask"] = mask
        for i, layer in enumerate(self.layers):
            x = layer(x, None if cache is None else cache.layers[i], **kw)
        if cache is not None:
            cache.seqlen_offset += tokens.shape[1]
        return F.linear(self.norm_f(x), self.embedding.weight)  # (b, l, vocab), tied weights

    def step(self, token, cache):
        """token (b,) int → logits (b, vocab), one O(1) step; updates ``cache`` in place.

        Does not touch ``cache.seqlen_offset`` (a CUDA graph replays this function as captured)."""
        _check_tokens("token", token, 1)
        x = self.embedding(token)  # (b, d_model)
        for layer, c in zip(self.layers, cache.layers, strict=True):
            x = layer.step(x, c)
        return F.linear(self.norm_f(x), self.embedding.weight)  # (b, vocab)

    def empty_cache(self, batch, state_dtype=torch.float32):
        dev = self.embedding.weight.device
        return InferenceCache([layer.mixer.empty_cache(batch, dev, state_dtype)
                               for layer in self.layers])

    @torch.no_grad()
    def generate(self, prompt, n_new, mask=None, chunk=None, graph=False, temperature=0.0,
                 generator=None):
        """Prefill ``prompt`` (b, l) (in chunks of ``chunk`` tokens if given), then ``n_new`` decode
        steps with the cache; greedy if temperature is 0. ``graph=True`` replays the step as a CUDA
        graph. Returns (b, n_new) tokens."""
        _check_tokens("prompt", prompt, 2)
        if prompt.shape[1] == 0:
            raise ValueError("prompt has no tokens (l = 0): generation continues a prompt of ≥ 1")
        _check_int("n_new", n_new, 0)
        if chunk is not None:
            _check_int("chunk", chunk, 1)
        if not isinstance(temperature, (int, float)) or not 0 <= temperature < math.inf:
            raise ValueError(f"temperature must be a finite number ≥ 0 (0: greedy), got "
                             f"{temperature!r}")
        check_mask(mask, *prompt.shape)
        if n_new == 0:
            return prompt.new_empty((prompt.shape[0], 0))
        cache = self.empty_cache(prompt.shape[0])
        chunk = chunk or prompt.shape[1]
        for lo in range(0, prompt.shape[1], chunk):
            m = None if mask is None else mask[:, lo:lo + chunk]
            logits = self(prompt[:, lo:lo + chunk], cache, mask=m)[:, -1]  # (b, vocab)
        step = self.step
        if graph:
            step = inference.capture_step(self.step, cache, prompt[:, -1])
        out = []
        for _ in range(n_new):
            if temperature == 0:
                token = logits.argmax(-1)  # (b,)
            else:
                probs = F.softmax(logits / temperature, dim=-1)
                token = torch.multinomial(probs, 1, generator=generator)[:, 0]
            out.append(token)
            logits = step(token, cache)
            cache.seqlen_offset += 1
        return torch.stack(out, dim=1)  # (b, n_new)


# ---------------------------------------------------------------------------------------------
# 4. hybrids: a few attention layers among the Mamba layers (chapter 16)


@dataclass
class KVCache:
    """What one attention layer remembers: every key and value so far (it grows with l).

    Shapes: k, v (b, heads, l, head_dim); valid (b, l) bool, False at left padding.
    """

    k: torch.Tensor
    v: torch.Tensor
    valid: torch.Tensor


class AttentionMixer(nn.Module):
    """Causal multi-head softmax attention with the mixer interface of this module.

        [q, k, v] = W_qkv x,   y_t = Σ_{s ≤ t} softmax_s(q_t·k_s / √p) v_s,   out = W_o y

    No positional encoding: in a hybrid the Mamba layers give the order (Jamba has none either).
    Left padding (``mask``) hides padded keys; a padded query sees itself only. Decoding appends
    to a :class:`KVCache`, which grows: a CUDA graph cannot replay it as captured.
    """

    def __init__(self, cfg, n_heads=2):
        super().__init__()
        if cfg.d_model % n_heads:
            raise ValueError(f"d_model = {cfg.d_model} must be a multiple of n_heads = {n_heads}")
        self.cfg, self.heads, self.p = cfg, n_heads, cfg.d_model // n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def _heads(self, x):
        b, l, _ = x.shape
        q, k, v = self.qkv(x).view(b, l, 3, self.heads, self.p).permute(2, 0, 3, 1, 4)
        return q, k, v  # (b, heads, l, p) each

    def _attend(self, q, k, v, valid):
        """q (b, H, l, p) for the last l of L positions; k, v (b, H, L, p); valid (b, L)."""
        l, L = q.shape[2], k.shape[2]
        if l == L and bool(valid.all()):  # a whole unpadded sequence: the fused causal kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, H, l, p)
            return self.out_proj(y.transpose(1, 2).flatten(2))
        pos_q = torch.arange(L - l, L, device=q.device)
        causal = pos_q[:, None] >= torch.arange(L, device=q.device)[None, :]  # (l, L)
        allowed = causal & valid[:, None, :]  # (b, l, L)
        allowed = allowed | (pos_q[:, None] == torch.arange(L, device=q.device))  # self: no NaN
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])  # (b, H, l, p)
        return self.out_proj(y.transpose(1, 2).flatten(2))  # (b, l, d_model)

    def forward(self, hidden, cache=None, mask=None, seq_idx=None):
        """hidden (b, l, d_model) → (b, l, d_model); with ``cache``: attend to it, append."""
        if seq_idx is not None:
            raise ValueError("seq_idx (packed sequences) is not supported by the attention layer; "
                             "use mask (left padding)")
        b, l, _ = hidden.shape
        q, k, v = self._heads(hidden)
        valid = torch.ones(b, l, dtype=torch.bool, device=hidden.device) if mask is None \
            else mask.bool()
        if cache is not None:
            k, v = torch.cat([cache.k, k], 2), torch.cat([cache.v, v], 2)  # (b, H, L, p)
            valid = torch.cat([cache.valid, valid], 1)  # (b, L)
            cache.k, cache.v, cache.valid = k, v, valid
        return self._attend(q, k, v, valid)

    def step(self, hidden, cache):
        """One token: hidden (b, d_model) → (b, d_model); appends its key and value."""
        return self.forward(hidden[:, None], cache)[:, 0]

    def empty_cache(self, batch, device, state_dtype=torch.float32):
        shape = (batch, self.heads, 0, self.p)
        dtype = self.qkv.weight.dtype
        return KVCache(torch.zeros(shape, device=device, dtype=dtype),
                       torch.zeros(shape, device=device, dtype=dtype),
                       torch.zeros(batch, 0, dtype=torch.bool, device=device))


def hybrid(cfg, attention_layers, n_heads=2):
    """A :class:`MambaLM` whose layers ``attention_layers`` (indices) are :class:`AttentionMixer`
    and the others ``cfg.block``: Jamba puts one attention layer in every 8, Granite-4.0 one
    Transformer block per 9 Mamba-2 blocks."""
    bad = [i for i in attention_layers if not 0 <= i < cfg.n_layers]
    if bad:
        raise ValueError(f"attention_layers {bad} are not layers of a {cfg.n_layers}-layer model")
    model = MambaLM(cfg)
    for i in attention_layers:
        model.layers[i].mixer = AttentionMixer(cfg, n_heads)
    return model
