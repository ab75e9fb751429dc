"""Chapter 16 — serving a recurrent model: the cache is a state, not a list of tokens.

A Transformer's KV cache holds one entry per token, so going back to token j is a truncation
and evicting a request frees memory that grows with its length. A Mamba layer's cache is one
fixed-size state h_t (and the last k conv inputs): it cannot be cut back, and it costs the same
at token 10 and token 100 000. What that changes:

* **Speculative decoding** (greedy): a draft proposes k tokens d₁…d_k; the target steps through
  them, accepts the longest prefix j it agrees with, and must continue from h_j, not h_k. Either
  keep a copy of the cache after every draft token (*checkpoint*: k + 1 copies, no extra steps)
  or keep h₀ and step the j accepted tokens again (*re-run*: one copy, j extra steps).
* **Continuous batching and preemption**: requests come and go; each holds one slot of a state
  pool and the decode step updates rows by slot (``state_batch_indices``). A preempted request
  is swapped out as one state (d·n numbers per layer, whatever its length) or re-prefilled.
* **Export** (torch.export, ONNX, TensorRT) and ``torch.compile`` want a step without in-place
  writes into an input and without data-dependent indexing: ``step_functional``.
* **Layers on several devices** (``device_map``): each layer's cache must live where the layer
  does (``cache_on_layer_devices``).

    speculative_generate(model, prompt, n_new, draft, k, rollback)   tokens and what it cost
    StatePool(slots, d, n)                                            slots, swap out / in, step
    step_functional(state, x, delta, A, B, C, D)                      (y, new state), pure
    cache_on_layer_devices(model, batch)                              an InferenceCache per device
"""

import torch

from mambalearn import inference
from mambalearn.inference import InferenceCache

# ---------------------------------------------------------------------------------------------
# 1. speculative decoding with a state that cannot be truncated


def _check_rollback(rollback):
    if rollback not in ("checkpoint", "rerun"):
        raise ValueError(f"rollback must be 'checkpoint' or 'rerun', got {rollback!r}")


def _verify(model, cache, logits, draft, rollback, stats):
    """Step ``draft`` (k,) through ``model`` from ``cache``; accept the longest prefix the target
    agrees with (argmax); leave ``cache`` at the state after it. Returns (j, logits after it)."""
    one = lambda t: model.step(t.view(1), cache)[0]  # (vocab,)
    saved = [cache.clone()]  # h₀: both ways keep it
    outs = []
    for t in draft:
        outs.append(one(t))
        stats["steps"] += 1
        if rollback == "checkpoint":
            saved.append(cache.clone())  # h_i after every draft token
    preds = torch.stack([logits] + outs[:-1]).argmax(-1)  # what the target would emit, (k,)
    agree = (preds == draft).long()
    j = int(agree.cumprod(0).sum())  # the longest prefix it agrees with
    stats["accepted"] += j
    stats["peak_copies"] = max(stats["peak_copies"], len(saved))
    if j == len(draft):
        return j, outs[-1]  # the cache already holds h_k
    if rollback == "checkpoint":
        cache.copy_(saved[j])
        return j, (outs[j - 1] if j else logits)
    cache.copy_(saved[0])  # re-run: back to h₀, then the j accepted tokens again
    out = logits
    for t in draft[:j]:
        out = one(t)
        stats["steps"] += 1
        stats["replayed"] += 1
    return j, out


@torch.no_grad()
def speculative_generate(model, prompt, n_new, draft, k=4, rollback="checkpoint"):
    """Greedy speculative decoding of one sequence with a recurrent cache.

    ``draft(position, k)`` proposes k tokens (a (k,) long tensor) for output positions
    ``position, …``; the target checks them, keeps the agreeing prefix, then emits its own next
    token. The output equals greedy decoding (``model.generate``) whatever the draft proposes.

    Shapes: prompt (1, l) → (tokens (n_new,), stats dict(steps, replayed, accepted, rounds,
    peak_copies, copy_bytes)): ``steps`` counts ``model.step`` calls (``replayed`` of them the
    re-run of accepted tokens), ``peak_copies`` the caches held at once.
    """
    _check_rollback(rollback)
    if prompt.ndim != 2 or prompt.shape[0] != 1:
        raise ValueError(f"prompt must be (1, l): one sequence (a batch accepts a different prefix "
                         f"per row), got {tuple(prompt.shape)}")
    if k < 1 or n_new < 1:
        raise ValueError(f"k and n_new must be ≥ 1, got k={k}, n_new={n_new}")
    cache = model.empty_cache(1)
    logits = model(prompt, cache)[0, -1]  # (vocab,): predicts the first new token
    stats = dict(steps=0, replayed=0, accepted=0, rounds=0, peak_copies=0)
    out = []
    while len(out) < n_new:
        proposal = draft(len(out), min(k, n_new - len(out))).to(prompt.device).long()
        j, logits = _verify(model, cache, logits, proposal, rollback, stats)
        stats["rounds"] += 1
        out += proposal[:j].tolist()
        if len(out) < n_new:  # the target's own token after the accepted prefix
            token = logits.argmax()
            out.append(int(token))
            logits = model.step(token.view(1), cache)[0]
            stats["steps"] += 1
    stats["copy_bytes"] = stats["peak_copies"] * cache.nbytes()
    return torch.tensor(out[:n_new]), stats


# ---------------------------------------------------------------------------------------------
# 2. continuous batching: a pool of state slots


class StatePool:
    """The state cache of a serving engine for one Mamba-1 layer: ``slots`` states (d, n).

    A request is admitted into a free slot, stepped with the others by slot index, released when
    it ends; preemption swaps its state out (a copy on the host, d·n numbers whatever its length)
    and back into any free slot later.
    """

    def __init__(self, slots, d, n, device="cpu", dtype=torch.float32):
        self.states = torch.zeros(slots, d, n, device=device, dtype=dtype)  # (slots, d, n)
        self.free = list(range(slots))

    def admit(self):
        if not self.free:
            raise RuntimeError(f"all {self.states.shape[0]} slots are taken: release or swap "
                               f"out a request first")
        slot = self.free.pop(0)
        self.states[slot].zero_()
        return slot

    def release(self, slot):
        if slot in self.free or not 0 <= slot < self.states.shape[0]:
            raise ValueError(f"slot {slot} is not in use")
        self.free.append(slot)

    def swap_out(self, slot):
        """Copy the slot's state to the host and free the slot; returns the copy."""
        saved = self.states[slot].to("cpu", copy=True)
        self.release(slot)
        return saved

    def swap_in(self, saved):
        slot = self.admit()
        self.states[slot].copy_(saved)
        return slot

    def step(self, slots, x, delta, A, B, C, D=None):
        """One decode step of the requests in ``slots`` (b,) (−1 = an empty row of the batch).

        Shapes: x, delta (b, d); A (d, n); B, C (b, n); D (d,) → y (b, d)."""
        idx = torch.as_tensor(slots, device=self.states.device)
        return inference.decode_step(self.states, x, delta, A, B, C, D, state_batch_indices=idx)


# ---------------------------------------------------------------------------------------------
# 3. a step that export and compilers take


def step_functional(state, x, delta, A, B, C, D=None):
    """(y, h) with  h = exp(Δ A) ⊙ state + Δ B x,  y = C·h + D x:  ``inference.decode_step``
    without the in-place write into ``state`` and without indexing by a mask, so a graph
    capture (torch.export, ONNX, TensorRT, torch.compile) sees one static graph.

    Shapes (Mamba-1): state (b, d, n); x, delta (b, d); A (d, n); B, C (b, n); D (d,)
    → y (b, d), h (b, d, n), in float32.
    """
    f = torch.float32
    h = torch.exp(delta.to(f)[..., None] * A.to(f)) * state.to(f) \
        + (delta.to(f) * x.to(f))[..., None] * B.to(f)[:, None, :]  # (b, d, n)
    y = (h * C.to(f)[:, None, :]).sum(-1)  # (b, d)
    if D is not None:
        y = y + D.to(f) * x.to(f)
    return y, h


# ---------------------------------------------------------------------------------------------
# 4. a cache per device


def cache_on_layer_devices(model, batch, state_dtype=torch.float32):
    """``model.empty_cache`` with each layer's cache on the device of that layer's weights (a
    model split over devices, as ``device_map`` does, needs each state where its layer runs)."""
    layers = []
    for layer in model.layers:
        dev = next(layer.parameters()).device
        layers.append(layer.mixer.empty_cache(batch, dev, state_dtype))
    return InferenceCache(layers)
