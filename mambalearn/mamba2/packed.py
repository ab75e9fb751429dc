"""Variable-length batches without padding: sequences packed in one row, two ways (chapter 10).

Packing puts sequences of lengths l_1, l_2, ... end to end in one row of length l = Σ l_i (no pad
tokens). No term of the SSD may cross from one sequence to the next. With chunks of q steps a
boundary can fall inside a chunk; there are two ways to handle it:

* **masking by sequence index** (``seq_idx``, what ``ssd.ssd_chunked`` and our Triton kernels
  do, as mamba_ssm's): keep the c = ⌈l/q⌉ physical chunks, compute every q×q diagonal block in
  full and zero the entries whose two steps belong to different sequences; a chunk state and the
  state passing drop what belongs to an earlier sequence.
* **pseudo-chunks** (the fused kernel of PyTorch's "Accelerating Mamba2 with kernel fusion"
  post; vLLM's ``compute_varlen_chunk_metadata`` calls them logical chunks): cut the chunks at
  every sequence boundary too, so each piece lies in one sequence and one chunk; run each piece
  as a chunk of its own and reset the state where a sequence starts. No sequence masks, but more
  pieces (and a kernel that gives each piece a q-row tile still masks the rows past a shorter
  piece's end, as vLLM's do with ``offs < chunk_size_limit``).

    logical_chunks(cu_seqlens, chunk_size)   the pieces: (start, end, sequence)
    ssd_pseudo_chunked(x, dt, A, B, C, chunk_size, cu_seqlens)  y and each sequence's final state
    packed_costs(cu_seqlens, chunk_size, h, p, n)   what each way computes
"""

import torch

from mambalearn.mamba2 import reference as ssd
from mambalearn.utils import check_chunk_size


def _bounds(cu_seqlens):
    cu = [int(v) for v in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
    if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu[:-1], cu[1:], strict=True)):
        raise ValueError(f"cu_seqlens must start at 0 and never decrease, got {cu}")
    return cu


def logical_chunks(cu_seqlens, chunk_size):
    """Pieces of the packed row that cross neither a sequence start nor a chunk boundary.

    Shapes: cu_seqlens (nseq + 1,) cumulative lengths starting at 0 → a list of
    (start, end, sequence index) in row order; empty sequences give no piece.
    """
    cu, q = _bounds(cu_seqlens), check_chunk_size(chunk_size)
    pieces = []
    for i, (start, stop) in enumerate(zip(cu[:-1], cu[1:], strict=True)):
        t = start
        while t < stop:
            end = min(stop, (t // q + 1) * q)  # the next physical chunk boundary, or the end
            pieces.append((t, end, i))
            t = end
    return pieces


def ssd_pseudo_chunked(x, dt, A, B, C, chunk_size, cu_seqlens, initial_states=None):
    """The SSD of packed sequences, one pseudo-chunk at a time: each piece of
    :func:`logical_chunks` is a chunk of its own, started from the state its sequence left.

    Shapes: x (1, l, h, p), dt (1, l, h), A (h,), B/C (1, l, g, n), cu_seqlens (nseq + 1,),
    initial_states (nseq, h, p, n) → (y (1, l, h, p), final states (nseq, h, p, n)).
    Equals ``ssd.ssd_chunked`` with the matching ``seq_idx`` (and separate runs per sequence).
    """
    b, l, h, p, g, n = ssd.check_inputs(x, dt, A, B, C)
    cu = _bounds(cu_seqlens)
    if b != 1 or cu[-1] != l:
        raise ValueError(f"packed sequences need b = 1 and cu_seqlens[-1] = l = {l}, got b = {b}, "
                         f"cu_seqlens[-1] = {cu[-1]}")
    f = torch.float64 if x.dtype == torch.float64 else torch.float32
    states = x.new_zeros(len(cu) - 1, h, p, n, dtype=f) if initial_states is None else \
        initial_states.to(f).clone()
    y = x.new_zeros(1, l, h, p, dtype=f)
    for start, end, i in logical_chunks(cu, chunk_size):
        s = slice(start, end)
        y[:, s], last = ssd.ssd_chunked(x[:, s], dt[:, s], A, B[:, s], C[:, s], end - start,
                                        initial_states=states[i:i + 1])  # one chunk
        states[i] = last[0]
    return y, states


def packed_costs(cu_seqlens, chunk_size, h, p, n):
    """What each way computes for one packed row (multiply-adds of the diagonal blocks, pieces).

    masking:        c = ⌈l/q⌉ chunks; every diagonal block in full: c · q² · h · (n + p)
    pseudo-chunks:  K pieces of lengths l_k ≤ q: Σ l_k² · h · (n + p), but K ≥ c chunk states,
                    state-passing steps and (in a kernel that gives each piece a q-tile) K tiles
    Returns dict(masking=dict(chunks, diag_macs), pseudo=dict(chunks, diag_macs, tiles)).
    """
    cu, q = _bounds(cu_seqlens), int(chunk_size)
    c = -(-cu[-1] // q)
    pieces = logical_chunks(cu, q)
    per = h * (n + p)
    return {"masking": {"chunks": c, "diag_macs": c * q * q * per},
            "pseudo": {"chunks": len(pieces), "tiles": len(pieces),
                       "diag_macs": sum((e - s) ** 2 for s, e, _ in pieces) * per}}
