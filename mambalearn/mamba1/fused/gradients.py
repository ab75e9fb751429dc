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
but through a `TreeSum` (``deterministic``): each channel tile stores its chunk's rows — [dB rows,
dC rows], each (n, chunk) — in its own slot (tiles, b·g·chunks, (VAR_B + VAR_C)·n·chunk) and the
last tile of a batch row's chunk to finish adds the slots in tile order; `finish` reads dB/dC
from the tree's root. The other sums are per program already (no atomics): deterministic in
both modes.

Its cost at the n16 default, b8 d2048 n16 l2048 (state-outer, 2 channels a tile: T = 1024 tiles
a group, chunk 64, fan 16): slots of (1024 + 64 + 4 + 1) rows × 256 groups (b·chunks) × 2·16·64
fp32 = 2.3 GB (b1 l32768: 512 groups, 4.6 GB) — the 5.4e8 floats the atomics added into L2, now
each stored once and read once by the tile that adds its node. The 16 tiles of a node are 128
programs apart in launch order, so they run at the same time and the reads are mostly L2 hits;
the slots' write-back to HBM (≈ 2.3 GB, ≈ 0.5 ms at 4.8 TB/s) overlaps a backward of ≈ 2.4 ms
that moves ≈ 0.5 GB otherwise. Per program and chunk the sums add about 16 sixteen-byte loads,
one counter atomic and its fence, beside the state loop's ≈ 4700 instructions: a few per cent of
fwd+bwd expected; if the partials left L2 before their sums, reading them from HBM would add
≈ 0.5 ms.
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
        None (atomics), or (tiles, chunk, fan, zero): the deterministic mode's `TreeSum` of
        ``tiles`` channel tiles, if B or C varies with time (``zero``: zeroed slots, for a kernel
        that leaves the columns past l of the last chunk unwritten)."""
        b, d = u.shape[0], u.shape[1]
        f32 = dict(device=u.device, dtype=torch.float32)
        nvar = (Bk.ndim == 4) + (Ck.ndim == 4)
        if tree is not None and nvar:
            tiles, chunk, fan, zero = tree
            g, l = (Bk if Bk.ndim == 4 else Ck).shape[1], u.shape[2]
            tree = (TreeSum.allocate(tiles, b * g * triton.cdiv(l, chunk), nvar * n * chunk,
                                     fan, u.device, zero, grouped=True), chunk)
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

    def tree_constexprs(self, num_warps):
        """The kernels' switches of the deterministic mode: DET, SLOT, FAN, TREE_BLOCK."""
        if self.tree is None:
            return dict(DET=False, SLOT=1, FAN=2, TREE_BLOCK=32)
        slot = self.tree.slots.shape[2]  # (floats a slot, in either layout)
        return dict(DET=True, SLOT=slot, FAN=self.tree.fan,
                    TREE_BLOCK=min(128 * num_warps, triton.next_power_of_2(slot)))

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
