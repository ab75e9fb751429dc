"""Parity: a state-tracking task Mamba's real diagonal state cannot solve and a rotating one can.

The input is a string of bits x_1 … x_l; the target at every position is the running parity
y_t = (x_1 + … + x_t) mod 2. Mamba's real diagonal state multiplies itself by α_t = e^{Δ_t A_t}
∈ (0, 1) each step: it only ever decays, never flips, so no readout of it can alternate with
every 1 (Mamba-3 §3.2). A negative real eigenvalue could (α = −1 flips the state: Grazzi et al.,
ICLR 2025); Mamba-3 takes the complex one instead. e^{iπ} = −1 is a half turn: with the angle
θ_t = π per 1 and 0 per 0 the state points one way after an even number of 1s and the other way
after an odd number. In Mamba-3 that angle is data-dependent (Δ_t π tanh(Angles_t)), so one layer
can learn it.

    parity_batch     random bit strings and their running parity
    parity_model     a one-layer Mamba-3 LM over {0, 1}, rotating or real
    train_parity     a one-layer Mamba-3 LM (``mambalearn.model``) with or without rotations
"""

import time

import torch
import torch.nn.functional as F

from mambalearn import model as M
from mambalearn.mamba3.mixer import Mamba3Config


def parity_batch(batch, length, generator=None, device="cpu"):
    """(bits (b, l) long, running parity (b, l) long): y_t = (Σ_{s≤t} x_s) mod 2."""
    bits = torch.randint(0, 2, (batch, length), generator=generator)
    return bits.to(device), (bits.cumsum(-1) % 2).to(device)


def parity_model(rotate=True, seed=0, dt=1.0, **cfg):
    """A one-layer Mamba-3 LM over the tokens {0, 1}: small enough to train in seconds on a CPU.

    Δ starts at ``dt`` (Mamba's default, 0.001–0.1, would make every turn tiny at first).
    """
    torch.manual_seed(seed)
    base = dict(vocab_size=2, d_model=16, n_layers=1, d_state=4, headdim=8, expand=2,
                backend="chunked", chunk_size=16, rope_fraction=1.0)
    lm = M.MambaLM(Mamba3Config(**{**base, **cfg}, rotate=rotate))
    for layer in lm.layers:
        with torch.no_grad():  # softplus⁻¹(dt)
            layer.mixer.dt_bias.fill_(dt + torch.log(-torch.expm1(torch.tensor(-dt))).item())
    return lm


def accuracy(model, bits, parity):
    """Share of positions whose parity the model predicts right."""
    with torch.no_grad():
        return (model(bits).argmax(-1) == parity).float().mean().item()


def train_parity(model, steps=150, batch=64, length=16, lr=1e-2, seed=0, progress=False):
    """AdamW on fresh parity batches; returns {"step", "loss", "acc", "seconds"} (every 10 steps).

    The logits of the tied head over {0, 1} are read as the parity prediction.
    """
    from mambalearn.utils import progress as bar

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    hist = {"step": [], "loss": [], "acc": [], "seconds": 0.0}
    t0 = time.perf_counter()
    for step in bar(range(steps), desc="parity", disable=None if progress else True):
        bits, parity = parity_batch(batch, length, g)
        logits = model(bits)  # (b, l, 2)
        loss = F.cross_entropy(logits.flatten(0, 1), parity.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == steps - 1:
            hist["step"].append(step)
            hist["loss"].append(loss.item())
            hist["acc"].append((logits.argmax(-1) == parity).float().mean().item())
    hist["seconds"] = time.perf_counter() - t0
    return hist
