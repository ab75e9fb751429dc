"""Chapter 15 — the Mamba-3 block in chapter 13's language model.

    in_proj → [z, x, B, C, Δ, A, λ, angles]; RMSNorm(B), RMSNorm(C) + biases → Mamba-3 SISO
    (exponential-trapezoidal, rotating B and C) → y · silu(z) → out_proj. No convolution.

What it changes around chapter 13's Mamba-2 block:

    no conv        the trapezoid's β_t B_{t−1} x_{t−1} term reads the previous token, the job the
                   short causal conv did; the cache keeps one token (θ, k_prev, v_prev) instead of
                   the conv's k−1 inputs (chapter 12), and a context-parallel rank needs one
                   token of halo instead of k−1 (chapter 14; ``mambalearn.mamba3.parallel``)
    B, C           RMSNorm over the n state columns, then a learned bias per head (init 1)
    A              data-dependent: A_t = −softplus(dd_A_t) ≤ −A_floor per token and head, from
                   in_proj like Δ (Mamba-2: one learned A per head)
    angles         na = ⌊n·rope_fraction⌋/2 rotation rates per token, projected once and shared by
                   every head (θ differs per head through Δ); rope_fraction 0.5: half the pairs
    MIMO           (``mamba3.mimo_reference``) r inputs and outputs per head, contracted to one
                   output by a learned per-rank weight

Names and projections are ``mamba_ssm.modules.mamba3.Mamba3``'s (2.3.2.post1; SISO,
``is_outproj_norm=False``): the same split of in_proj, ``_A = -F.softplus(dd_A.to(float32))``
clamped to ``max=-A_floor``, ``DT = F.softplus(dd_dt + dt_bias)``, biases (h, n) of ones,
``RMSNormGated(d_state)`` on B and C. It differs in: Δ is computed in float32 (mamba_ssm in the
projection's dtype); rope_fraction may be any value in (0, 1] (mamba_ssm asserts 0.5 or 1.0);
dt_bias has no 1e-4 floor (dt_min = 1e-3 is above it anyway).

The scan (and the decode step) is chosen by name and imported when first used (``BACKENDS``,
``STEP_BACKENDS``): this module does not import the kernels. Importing it registers the block with
chapter 13's model (``model.register_block``): ``MambaLM(Mamba3Config(...))`` then builds it.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mambalearn import model as M

BACKENDS = {  # Mamba-3 scans, all with mamba3_siso_combined's signature
    "sequential": ("mambalearn.mamba3", "mamba3_siso_sequential"),
    "chunked": ("mambalearn.mamba3", "mamba3_siso_chunked"),
    "triton": ("mambalearn.mamba3", "mamba3_siso_combined"),
}
STEP_BACKENDS = {  # the decode steps, with mamba3_siso_step's signature
    "oracle": ("mambalearn.mamba3.step_reference", "mamba3_siso_step_ref"),
    "triton": ("mambalearn.mamba3", "mamba3_siso_step"),
}


@dataclass
class Mamba3Config(M.MambaConfig):
    """Chapter 13's config with the Mamba-3 knobs; ``block`` defaults to "mamba3"."""

    block: str = "mamba3"
    rope_fraction: float = 0.5  # share of the n state columns that rotate (half the pairs)
    rotate: bool = True  # data-dependent rotations (a complex state); False = a real state

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.rope_fraction, (int, float)) or not 0 < self.rope_fraction <= 1:
            raise ValueError(f"rope_fraction must be a share of the state columns, 0 < "
                             f"rope_fraction ≤ 1, got {self.rope_fraction!r}")
        if not isinstance(self.rotate, bool):
            raise TypeError(f"rotate must be True or False, got {self.rotate!r}")
        if self.d_state % 2:
            raise ValueError(f"d_state = {self.d_state} must be even: the state columns rotate "
                             f"in pairs")


class Mamba3Mixer(nn.Module):
    """The Mamba-3 mixer (the formula in the module's docstring), chapter 13's mixer interface:
    ``forward(hidden, cache=None, mask=None)``, ``step(hidden, cache)``, ``empty_cache(...)``.

    The cache's ``conv_state`` slot (Mamba-3 has no conv) holds the small per-head states
    [θ, k_prev, v_prev] as one (b, h, na + n + p) float32 tensor: one token, where the conv kept
    k−1; ``ssm_state`` is (b, h, p, n).
    """

    A_FLOOR = 1e-4

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, n, g = cfg.expand * cfg.d_model, cfg.d_state, cfg.ngroups
        if d % cfg.headdim:
            raise ValueError(f"expand·d_model = {d} must be a multiple of headdim = {cfg.headdim}")
        self.h = d // cfg.headdim
        self.na = int(n * cfg.rope_fraction) // 2  # rotating column pairs (mamba_ssm's count)
        if not 0 < cfg.rope_fraction <= 1 or self.na < 1:
            raise ValueError(f"rope_fraction = {cfg.rope_fraction} must lie in (0, 1] and turn at "
                             f"least one pair of the d_state = {n} columns")
        self.split = [d, d, g * n, g * n, self.h, self.h, self.h, self.na]
        self.in_proj = nn.Linear(cfg.d_model, sum(self.split), bias=False)
        self.dt_bias = nn.Parameter(M.dt_bias_init(self.h))
        self.B_bias, self.C_bias = (nn.Parameter(torch.ones(self.h, n)) for _ in range(2))
        self.B_norm, self.C_norm = M.RMSNorm(n), M.RMSNorm(n)
        self.D = nn.Parameter(torch.ones(self.h))
        self.out_proj = nn.Linear(d, cfg.d_model, bias=False)

    def scan_inputs(self, proj, mask=None):
        """The scan's arguments from in_proj's output (…, total) with a time axis at dim 1."""
        cfg, h, n = self.cfg, self.h, self.cfg.d_state
        z, x, B, C, dd_dt, dd_A, trap, ang = proj.split(self.split, dim=-1)
        sh = proj.shape[:-1]  # (b, l)
        x, z = x.reshape(*sh, h, cfg.headdim), z.reshape(*sh, h, cfg.headdim)  # (b, l, h, p)
        B = self.B_norm(B.reshape(*sh, cfg.ngroups, n))  # (b, l, g, n)
        C = self.C_norm(C.reshape(*sh, cfg.ngroups, n))
        A = (-F.softplus(dd_A.float())).clamp(max=-self.A_FLOOR)  # (b, l, h): A < 0 per token
        DT = F.softplus(dd_dt.float() + self.dt_bias)  # (b, l, h)
        if mask is not None:  # padding: Δ = 0 keeps the state, v = 0 leaves no trapezoid half
            DT, x = DT * mask[..., None], x * mask[..., None, None]
        angles = ang.float()[..., None, :].expand(*sh, h, self.na)  # (b, l, h, na)
        if not cfg.rotate:  # the real-state ablation: no rotation at all
            angles = torch.zeros_like(angles)
        t = lambda X: X.transpose(1, 2)  # (b, l, h) → (b, h, l)
        return dict(Q=C, K=B, V=x, ADT=t(A * DT), DT=t(DT), Trap=t(trap.float()),
                    Q_bias=self.C_bias, K_bias=self.B_bias, Angles=angles, D=self.D, Z=z)

    def _split_cache(self, cache):
        n, p = self.cfg.d_state, self.cfg.headdim
        small = cache.conv_state  # (b, h, na + n + p)
        ang, k, v = small.split([self.na, n, p], dim=-1)
        return ang, k, v

    def forward(self, hidden, cache=None, mask=None, seq_idx=None):
        if seq_idx is not None:
            raise ValueError("seq_idx (packed sequences) is not supported by the Mamba-3 block")
        M.check_mask(mask, *hidden.shape[:2])
        kw = self.scan_inputs(self.in_proj(hidden), mask)
        fn = M.resolve(self.cfg.backend, "mamba3")
        if self.cfg.backend != "sequential":
            kw["chunk_size"] = self.cfg.chunk_size
        if cache is None:
            y = fn(**kw)
        else:
            ang, k, v = self._split_cache(cache)
            y, ang, ssm, k, v = fn(**kw, Input_States=(ang, cache.ssm_state, k, v),
                                   return_final_states=True)
            cache.conv_state.copy_(torch.cat([ang, k.float(), v.float()], dim=-1))
            cache.ssm_state.copy_(ssm)
        return self.out_proj(y.flatten(2))  # (b, l, d_model)

    def step(self, hidden, cache):
        """One token: the decode step of ``mambalearn.mamba3.step_reference`` (or its Triton
        kernel), as ``cfg.step_backend`` names it (``STEP_BACKENDS``)."""
        kw = self.scan_inputs(self.in_proj(hidden)[:, None])
        one = {k: (v[:, 0] if k in ("Q", "K", "V", "Angles", "Z") else
                   v[..., 0] if k in ("ADT", "DT", "Trap") else v) for k, v in kw.items()}
        step = M.step_fn(self.cfg, hidden.device)
        ang, k, v = self._split_cache(cache)
        y, (ang, ssm, k, v) = step(**one, Input_States=(ang, cache.ssm_state, k, v))
        cache.conv_state.copy_(torch.cat([ang, k.float(), v.float()], dim=-1))
        cache.ssm_state.copy_(ssm)
        return self.out_proj(y.flatten(1).to(hidden.dtype))

    def empty_cache(self, batch, device, state_dtype=torch.float32):
        cfg = self.cfg
        small = torch.zeros(batch, self.h, self.na + cfg.d_state + cfg.headdim, device=device)
        return M.LayerCache(small, torch.zeros(batch, self.h, cfg.headdim, cfg.d_state,
                                             device=device, dtype=state_dtype))


M.register_block("mamba3", Mamba3Mixer, BACKENDS, STEP_BACKENDS)
