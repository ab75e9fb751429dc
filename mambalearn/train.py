"""Chapter 13 — the task only selection solves, and training the model on it.

The selective-copying task (``selective_copying``) scatters m data tokens at random positions in
a sequence of blanks; after a separator the model must emit them in order. Where the tokens are
differs in every example, so no fixed (LTI) convolution kernel can pick them out: the model must
decide from the token itself whether to remember it (``mambalearn.model``'s ``selective=False``
builds that LTI model).

``train`` runs AdamW on fresh batches of the task, ``evaluate`` measures one held-out batch;
both take any model with ``mambalearn.model.MambaLM``'s interface (logits from token ids, an
``embedding`` to find its device, a ``cfg.backend`` to name the run).
"""

import time

import torch
import torch.nn.functional as F

BLANK, SEP, FIRST_DATA = 0, 1, 2


def selective_copying(batch, n_data=4, n_blank=12, n_symbols=8, generator=None, device="cpu"):
    """Selective copying: m = n_data symbols at random places among blanks, SEP, the symbols.

        context (n_data + n_blank tokens)       SEP   s₁ … s_{m−1}     ← inputs
                       …                        s₁    s₂ … s_m         ← targets (−100 elsewhere)

    Symbols are tokens 2 … n_symbols + 1 (0 = blank, 1 = SEP), so vocab_size ≥ n_symbols + 2.
    Returns (inputs (b, L), targets (b, L)) with L = n_data + n_blank + n_data.
    """
    ctx = n_data + n_blank
    data = torch.randint(FIRST_DATA, FIRST_DATA + n_symbols, (batch, n_data), generator=generator)
    where = torch.rand(batch, ctx, generator=generator).argsort(-1)[:, :n_data].sort(-1).values
    context = torch.full((batch, ctx), BLANK, dtype=torch.long)
    context.scatter_(1, where, data)  # the symbols, in order, at random places
    inputs = torch.cat([context, torch.full((batch, 1), SEP), data[:, :-1]], dim=1)  # (b, L)
    targets = torch.full_like(inputs, -100)
    targets[:, ctx:] = data  # predict s_k at the SEP and at s_{k−1}
    return inputs.to(device), targets.to(device)


def loss_and_accuracy(model, inputs, targets):
    """Cross-entropy over the answer positions and the share of answer tokens predicted right."""
    logits = model(inputs)  # (b, L, vocab)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    answer = targets != -100
    acc = (logits.argmax(-1) == targets)[answer].float().mean()
    return loss, acc


def train(model, steps=300, batch=32, lr=3e-3, task=None, seed=0, log_every=10, progress=True):
    """AdamW on fresh selective-copying batches; returns {"step", "loss", "acc", "seconds"}.

    ``task`` is passed to :func:`selective_copying`. Fixed ``seed`` → the same data every run."""
    from mambalearn.utils import progress as bar

    task = dict(task or {})
    g = torch.Generator().manual_seed(seed)
    dev = model.embedding.weight.device
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    hist = {"step": [], "loss": [], "acc": [], "seconds": 0.0}
    t0 = time.perf_counter()
    pbar = bar(range(steps), desc=f"train ({model.cfg.backend})",
               disable=None if progress else True)
    for step in pbar:
        inputs, targets = selective_copying(batch, generator=g, device=dev, **task)
        loss, acc = loss_and_accuracy(model, inputs, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            hist["step"].append(step)
            hist["loss"].append(loss.item())
            hist["acc"].append(acc.item())
            pbar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{acc.item():.2f}")
    hist["seconds"] = time.perf_counter() - t0
    return hist


@torch.no_grad()
def evaluate(model, batch=256, seed=1234, task=None):
    """(loss, accuracy) on one fresh batch drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    inputs, targets = selective_copying(batch, generator=g, device=model.embedding.weight.device,
                                        **(task or {}))
    loss, acc = loss_and_accuracy(model, inputs, targets)
    return loss.item(), acc.item()
