"""Chapter 15 — the Mamba-3 block in chapter 13's language model.

    in_proj → [z, x, B, C, Δ, A, λ, angles]; RMSNorm(B), RMSNorm(C) + biases → Mamba-3 SISO
    (exponential-trapezoidal, rotating B and C) → y · silu(z) → out_proj. No convolution.

It drops the convolution, normalises B and C and adds biases to them, learns a data-dependent A,
a trapezoid weight λ and rotation angles per token, and runs this chapter's scan (sequential,
chunked, or the Triton kernel). Importing this module registers it with chapter 13's model
(``model.register_block``): ``MambaLM(Mamba3Config(...))`` then builds Mamba-3 blocks.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mambalearn import model as M

BACKENDS = {  # Mamba-3 scans, all with mamba3_siso_combined's signature
    "sequential": ("mambalearn.mamba3", "mamba3_siso_sequential"),
    "chunked": ("mambalearn.mamba3", "mamba3_siso_chunked"),
    "triton": ("mambalearn.triton.mamba3", "mamba3_siso_combined"),
}
STEP_BACKENDS = {  # the decode steps, with mamba3_siso_step's signature
    "oracle": ("mambalearn.mamba3.step", "mamba3_siso_step_ref"),
    "triton": ("mambalearn.triton.mamba3", "mamba3_siso_step"),
}


@dataclass
class Mamba3Config(M.MambaConfig):
    """Chapter 13's config with the Mamba-3 knobs; ``block`` defaults to "mamba3"."""

    block: str = "mamba3"
    rope_fraction: float = 0.5  # share of the n state columns that rotate
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
    [θ, k_prev, v_prev] as one (b, h, na + n + p) float32 tensor; ``ssm_state`` is (b, h, p, n).
    As ``mamba_ssm.modules.mamba3.Mamba3`` (SISO, is_outproj_norm=False).
    """

    A_FLOOR = 1e-4

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, n, g = cfg.expand * cfg.d_model, cfg.d_state, cfg.ngroups
        if d % cfg.headdim:
            raise ValueError(f"expand·d_model = {d} must be a multiple of headdim = {cfg.headdim}")
        self.h = d // cfg.headdim
        self.na = max(1, int(n * cfg.rope_fraction) // 2)  # rotating column pairs
        self.split = [d, d, g * n, g * n, self.h, self.h, self.h, self.na]
        self.in_proj = nn.Linear(cfg.d_model, sum(self.split), bias=False)
        self.dt_bias = nn.Parameter(M.dt_bias_init(self.h))
        self.B_bias, self.C_bias = (nn.Parameter(torch.ones(self.h, n)) for _ in range(2))
        self.B_norm, self.C_norm = M.RMSNorm(n), M.RMSNorm(n)
        self.D = nn.Parameter(torch.ones(self.h))
        self.out_proj = nn.Linear(d, cfg.d_model, bias=False)

    def _inputs(self, proj, mask=None):
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
        kw = self._inputs(self.in_proj(hidden), mask)
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
        """One token: the decode step of ``mambalearn.mamba3.step`` (or its Triton kernel), as
        ``cfg.step_backend`` names it (``STEP_BACKENDS``)."""
        kw = self._inputs(self.in_proj(hidden)[:, None])
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
