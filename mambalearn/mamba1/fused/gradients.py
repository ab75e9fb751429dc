"""What both backward kernels of the tuned Mamba-1 scan share (chapter 09): the gradient buffers
and the per-step end of the chain rule.

    g_t = C_t dy_t + Ā_{t+1} g_{t+1}        (the adjoint of h, scanned backwards)
    dB_t = Σ_d g Δ x   dC_t = Σ_d dy h   dx = Σ_n g Δ B + D dy   dA = Σ_t g (h − B̄x) Δ
    dΔ   = Σ_n g ((h − B̄x) A + B x)      dz = dout · y · silu′(z)   dD = Σ dy x

Shapes: `GradBuffers` holds du, ddelta, dz (b, d, l) in the inputs' dtypes; dB, dC fp32 in the
kernel layout (b, g, n, l) if they vary with time (atomic adds over channel tiles); per-batch-row
sums dA, fixed dB/dC (S·b, d, n) and dD, dbias (S·b, d) fp32 (each program owns its rows of its
segment: no atomics, added over segments and b in `finish`); gbuf (S, b, d, n) fp32, the adjoint
carried between chunks, one slot per segment: the last segment's starts as the last state's
gradient (zeros if none), the others are folded from the adjoint summaries by the kernel, and
slot 0 ends as g_0, the adjoint at step 0.

Deterministic mode (``Config.deterministic``): the time-varying dB/dC are not added atomically
but through a `TreeSum` (``deterministic``, its grouped layout): each channel tile stores its
chunk's rows — [dB rows, dC rows], each (n, chunk) — in its own slot (b·g·chunks groups of
(VAR_B + VAR_C)·n·chunk floats) and the last tile of a batch row's chunk to finish adds the
slots in tile order; `finish` reads dB/dC from the tree's root. The other sums are per program
already (no atomics): deterministic in both modes.

What it must move. The partials are T·2n·l floats a batch row, T = d / block_d tiles: they are
what the atomics added into L2, and each is now stored, written back to HBM and read once. At
b8 d2048 n16 l2048 with the atomic default's tile (2 channels, one warp: T = 1024), 2.3 GB
with the tree's upper levels — ≈ 0.5 ms at 4.8 TB/s, a fifth of a ≈ 2.4 ms backward that moves
≈ 0.5 GB otherwise (b1 l32768: 4.6 GB, ≈ 1 ms). The floor falls with T only: a program of W
warps over 2W channels makes T = d / 2W (W = 4: 0.57 GB, ≈ 0.12 ms; W = 8: 0.06 ms).

Why not simply a wider tile: its Σ over channels per state and step crosses warps, through
shared memory and two barriers each (sm_90 SASS of the state loop, a warp's instructions per
state: 4 warps, 8 channels, 372 with 12 BAR and 13 STS; the atomic default 309 with 4 BAR).
``Backward.tree_rows`` (R) stages instead: each run of block_d / R channels (two a warp at
R = W) is summed inside its warp, and the R rows go to a staging of the program's own
(R, slot) floats, rewritten every chunk (so it stays in L2: 64 MB at b8 for W = 4, ≈ 2 % of it
written back); once a chunk, after one barrier, the program adds its R rows in row order into its
slot. The state loop then costs about the default's (326 instructions, 2 BAR a state at W = 4);
per chunk the rows add R loads and one store of the slot a thread-block pass (≈ 20 memory
instructions a thread against ≈ 16 × 326 in the loop) and one counter atomic with its fence.
What the wider program costs: occupancy (96 registers: 21 one-warp programs an SM, 5 × 4 warps
= 20, 2 × 8 warps = 16, a loss of a quarter), and a few more spills around the chunk loop.
Expected at W = 4: a few per cent over the atomic default, the tree's bytes a quarter of T = 1024's.
What the H200 measured of it (``docs/results/*_det_sweep_*.json``) stays above that, most at b1
l32768, where each program walks 256 chunks (the sequence cut in 2 segments) and a per-chunk cost
adds up: the tree's counter, fence and last-arriver's sums every chunk, and the adjoint carry's
shared-memory round trip every state. Two switches take them out of the loop:
``Backward.tree_after`` (the slots added in tile order by a second kernel, ``TreeSum.add_after``:
the slots' read from HBM once, 268 MB at b8 for T = 128, ≈ 0.06 ms) and ``Backward.reg_carry``
(the carry in registers, ``state_outer``); ``bench.gpu.det_sweep`` times them against the tile
without them.
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from mambalearn.mamba1.args import Strides, bc_strides, finish_grads
from mambalearn.mamba1.fused.tile import st
from mambalearn.triton.deterministic import TreeSum


@dataclass
class GradBuffers:
    """The backward kernels' outputs (see the module docstring for shapes)."""

    du: torch.Tensor
    ddelta: torch.Tensor
    dz: torch.Tensor | None
    dB: torch.Tensor  # (b, g, n, l) fp32 if B varies with time, else a stand-in
    dC: torch.Tensor
    dA_rows: torch.Tensor
    dBf_rows: torch.Tensor  # (b, d, n) fp32 if B is fixed, else a stand-in
    dCf_rows: torch.Tensor
    dD_rows: torch.Tensor
    dbias_rows: torch.Tensor
    gbuf: torch.Tensor
    tree: TreeSum | None = None  # deterministic mode, B or C varying with time
    chunk: int = 0  # the tree's columns a chunk

    @classmethod
    def allocate(cls, u, delta, z, Bk, Ck, dlast, n, S=1, tree=None):
        """Zeroed sums, one set per segment of S; gbuf (S, b, d, n): the last state's gradient
        ``dlast`` (or zeros) in slot S − 1, zeros elsewhere (the kernel folds those). ``tree``:
        None (atomics), or (tiles, chunk, fan, zero[, after]): the deterministic mode's `TreeSum`
        of ``tiles`` channel tiles, if B or C varies with time (``zero``: zeroed slots, for a
        kernel that leaves the columns past l of the last chunk unwritten; ``after``: no tree in
        the kernel, the slots added by `TreeSum.add_after` in `finish`)."""
        b, d = u.shape[0], u.shape[1]
        f32 = dict(device=u.device, dtype=torch.float32)
        nvar = (Bk.ndim == 4) + (Ck.ndim == 4)
        if tree is not None and nvar:
            tiles, chunk, fan, zero, *after = tree
            g, l = (Bk if Bk.ndim == 4 else Ck).shape[1], u.shape[2]
            tree = (TreeSum.allocate(tiles, b * g * triton.cdiv(l, chunk), nvar * n * chunk,
                                     fan, u.device, zero, grouped=True,
                                     after=bool(after and after[0])), chunk)
            Bk, Ck = (X.new_empty(()) if X.ndim == 4 else X for X in (Bk, Ck))  # no atomic sums
        else:
            tree = (None, 0)
        zeros_if = lambda var, shape: torch.zeros(shape if var else (1,), **f32)
        gbuf = torch.zeros((S, b, d, n), **f32)
        if dlast is not None:
            gbuf[S - 1] = dlast
        return cls(du=torch.empty_like(u), ddelta=torch.empty_like(delta),
                   dz=torch.empty_like(z) if z is not None else None,
                   dB=zeros_if(Bk.ndim == 4, Bk.shape), dC=zeros_if(Ck.ndim == 4, Ck.shape),
                   dA_rows=torch.zeros((S * b, d, n), **f32),
                   dBf_rows=zeros_if(Bk.ndim == 2, (S * b, d, n)),
                   dCf_rows=zeros_if(Ck.ndim == 2, (S * b, d, n)),
                   dD_rows=torch.zeros((S * b, d), **f32),
                   dbias_rows=torch.zeros((S * b, d), **f32), gbuf=gbuf, tree=tree[0],
                   chunk=tree[1])

    def strides(self, X, var):
        """Strides of a time-varying dB/dC buffer (b, g, n, l); zeros for a stand-in."""
        return bc_strides(X) if var and X.ndim == 4 else Strides(0, 0, 0)

    def tree_constexprs(self, num_warps, block=0):
        """The kernels' switches of the deterministic mode: DET, SLOT, FAN, TREE_BLOCK, AFTER
        (TREE_BLOCK: ``block`` floats a pass, 0: 128 a warp; at most the slot's)."""
        if self.tree is None:
            return dict(DET=False, SLOT=1, FAN=2, TREE_BLOCK=32, AFTER=False)
        slot = self.tree.slots.shape[2]  # (floats a slot, in either layout)
        return dict(DET=True, SLOT=slot, FAN=self.tree.fan,
                    TREE_BLOCK=min(block or 128 * num_warps, triton.next_power_of_2(slot)),
                    AFTER=self.tree.after)

    def _from_tree(self, which, shape):
        """Time-varying dB (which 0) or dC (1 if B varies too, else 0) (b, g, n, l) from the root
        of the tree: (b·g·c, [dB, dC], n, chunk) → (b, g, n, c·chunk)[..., :l]."""
        b, g, n, l = shape
        q = self.chunk
        c = triton.cdiv(l, q)
        root = self.tree.root().reshape(b, g, c, -1, n, q)[:, :, :, which]  # (b, g, c, n, q)
        return root.permute(0, 1, 3, 2, 4).reshape(b, g, n, c * q)[..., :l]

    def finish(self, B, C, D, delta_bias):
        """The eight gradients in the arguments' shapes, and g_0 (b, d, n) (segment 0's slot)."""
        dB = self.dBf_rows.sum(0) if B.ndim == 2 else self.dB
        dC = self.dCf_rows.sum(0) if C.ndim == 2 else self.dC
        if self.tree is not None:  # (B, C (b, n, l) or (b, g, n, l): the kernel's 4-D layout)
            if self.tree.after:  # the tiles' slots added in tile order by a second kernel
                self.tree.add_after()
            var = [X for X in (B, C) if X.ndim != 2]
            shape = lambda X: (X.shape[0], 1 if X.ndim == 3 else X.shape[1], *X.shape[-2:])
            if B.ndim != 2:
                dB = self._from_tree(0, shape(B))
            if C.ndim != 2:
                dC = self._from_tree(len(var) - 1, shape(C))
        return (*finish_grads(self.du, self.ddelta, self.dA_rows.sum(0), dB, dC,
                              self.dD_rows.sum(0), self.dz, self.dbias_rows.sum(0), B, C, D,
                              delta_bias), self.gbuf[0])


@triton.jit
def bwd_outputs(y, dx, ddt, x, dy, dout, zz, dt_raw, Dv, dD_acc, dbias_acc, offs, mask, du_ptr,
                ddelta_ptr, dz_ptr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
                SOFTPLUS: tl.constexpr, EVEN: tl.constexpr):
    """The per-step parts of both backward kernels, after the sums over states y = Σ C h,
    dx = Σ gΔB, ddt = Σ ∂/∂Δ: the D skip, the gate (dz), softplus′; stores du, dΔ, dz.
    Returns the updated row sums (dD_acc, dbias_acc)."""
    if HAS_D:
        y += x * Dv[:, None]
        dx += dy * Dv[:, None]
        dD_acc += tl.sum(dy * x, axis=1)
    if HAS_Z:
        sig = tl.sigmoid(zz)
        dz = dout * y * sig * (1.0 + zz * (1.0 - sig))  # silu′(z) = σ(z)(1 + z(1 − σ(z)))
        st(dz_ptr + offs, dz.to(dz_ptr.dtype.element_ty), mask, EVEN)
    if SOFTPLUS:
        ddt *= tl.sigmoid(dt_raw)  # softplus′ = σ
    if not EVEN:
        ddt = tl.where(mask, ddt, 0.0)
    dbias_acc += tl.sum(ddt, axis=1)
    st(du_ptr + offs, dx.to(du_ptr.dtype.element_ty), mask, EVEN)
    st(ddelta_ptr + offs, ddt.to(ddelta_ptr.dtype.element_ty), mask, EVEN)
    return dD_acc, dbias_acc
