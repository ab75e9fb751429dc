"""A sum over programs whose bits do not depend on which program finishes first (chapter 09's
deterministic mode; Mamba-3's MIMO backward uses it too).

Floating-point addition is not associative: ``(a + b) + c`` and ``a + (b + c)`` can differ in the
last bit. An atomic add over T programs adds their partials in the order they happen to arrive,
so the same inputs can give different bits from one run to the next. The fix here keeps the
adds in a fixed order and still lets every program run at once:

1. each of the T programs (``tiles``) that contribute to one group of outputs (``grp``: e.g. a
   batch row's chunk of dB) stores its partial, ``size`` floats, in its own *slot*;
2. it then bumps a counter of its parent in a tree of fan-in FAN (an acquire-release atomic, after
   a barrier: its stores are visible before the count is); the program that brings a parent's
   count to its number of children is the last to arrive, so all of them are there: it adds the
   children's slots *in child order* (0, 1, …, never arrival order) into the parent's slot and
   climbs a level; the others stop. (The FAN loads of a node are unrolled, so they wait on
   memory together, not one after another.)
3. the root's slot (`TreeSum.root`) holds the sum, the same bits whoever did which add.

Two layouts of the slots: by row (rows, groups, size), `slot_of` / `tree_sum`, where a node's FAN
children lie ``groups · size`` floats apart; and grouped (groups, rows, size), `slot_of_grouped` /
`tree_sum_grouped`, where they lie side by side, and the programs that work on one group at the
same time (the tiles of one chunk) write next to each other: fewer pages and DRAM rows in flight
for the same bytes, which matters when the slots span gigabytes (the address translation's cache
holds far fewer pages than thousands of programs touching one page each).

Cost: the slots take ``rows · groups · size · 4`` bytes, rows = T + ⌈T/FAN⌉ + … + 1 ≈ T·FAN/(FAN−1)
(the atomics they replace wrote the same T·groups·size floats, into L2). Every slot is written once
and read once, by a program that runs at about the same time as its writer (siblings are
neighbours in the grid), so the reads are mostly L2 hits; the extra HBM traffic is the slots'
write-back, under a compute-bound kernel. Counters: one int32 per parent and group, one atomic per
program, group and level. The tree's shape depends only on T and FAN, and a group's slots only on
its index: a group's result does not depend on the other groups (nor on the batch around it).

A third way, ``after`` (grouped, no tree): the programs only store their partials, and a second
kernel (`TreeSum.add_after`, ``_ordered_sum_kernel``) adds each group's T slots in tile order
(0, 1, …, T − 1, one running sum) once they all exist. No counter, fence or barrier-and-sum in the
producing kernel, and no program that, being the last of its siblings, adds 16 slots and so comes
last again the next time (in a loop that joins a tree every chunk, that program's delay adds up
along the loop). Its price: the slots are written back to HBM and read once from there
(T·groups·size·4 bytes each way), where the tree's sums mostly hit L2.

Shapes: slots (rows, groups, size) fp32, counts (parents, groups) int32 (zeroed).
"""

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

AFTER_BLOCK = 512  # `add_after`: floats a program adds (4 a thread at 4 warps)


def levels(tiles, fan):
    """The number of slots at each level of the tree: [T, ⌈T/FAN⌉, …, 1]."""
    if tiles < 1 or fan < 2:
        raise ValueError(f"a tree needs tiles ≥ 1 and fan ≥ 2, got {tiles}, {fan}")
    sizes = [tiles]
    while sizes[-1] > 1:
        sizes.append(-(-sizes[-1] // fan))
    return sizes


@dataclass
class TreeSum:
    """The slots and counters of a fixed-order sum of ``tiles`` partials in each of ``groups``
    groups of ``size`` floats (module docstring)."""

    slots: torch.Tensor  # (rows, groups, size) fp32, grouped: (groups, rows, size); rows
    # 0 … T − 1: the programs' partials
    counts: torch.Tensor  # (parents, groups) int32, zeroed
    tiles: int
    fan: int
    grouped: bool = False  # each group's slots together (``slot_of_grouped``, ``tree_sum_grouped``)
    after: bool = False  # no tree: the T slots of a group added by `add_after` (module docstring)
    result: torch.Tensor | None = None  # after: (groups, size), filled by `add_after`

    @classmethod
    def allocate(cls, tiles, groups, size, fan, device, zero=False, grouped=False, after=False):
        """Empty slots (``zero``: zeros, for a kernel that leaves some of a slot unwritten).
        ``grouped``: the layout (groups, rows, size): the FAN children of a node side by side, and
        the programs working on one group at the same time write next to each other. ``after``
        (grouped only): T slots a group and no tree above them; `add_after` adds them."""
        if after and not grouped:
            raise ValueError("TreeSum.allocate: after=True needs the grouped layout")
        sizes = [tiles] if after else levels(tiles, fan)
        new = torch.zeros if zero else torch.empty
        shape = (groups, sum(sizes), size) if grouped else (sum(sizes), groups, size)
        slots = new(shape, device=device, dtype=torch.float32)
        counts = torch.zeros((max(1, sum(sizes[1:])), groups), device=device, dtype=torch.int32)
        return cls(slots, counts, tiles, fan, grouped, after)

    @property
    def rows(self):
        """Slots a group: T + ⌈T/FAN⌉ + … + 1."""
        return self.slots.shape[1 if self.grouped else 0]

    @property
    def groups(self):
        return self.slots.shape[0 if self.grouped else 1]

    def root(self):
        """(groups, size) fp32: the sums (valid after the kernel that filled the slots; grouped: a
        view with a row stride of ``rows · size``; ``after``: once `add_after` ran)."""
        if self.after:
            if self.result is None:
                raise RuntimeError("TreeSum(after=True): call add_after() before root()")
            return self.result
        return self.slots[:, -1] if self.grouped else self.slots[-1]

    def add_after(self, block=AFTER_BLOCK, num_warps=4):
        """``after``: each group's T slots added in tile order into ``result`` (groups, size)
        by ``_ordered_sum_kernel`` (one program a group and ``block`` floats). Returns it."""
        if not self.after:
            raise RuntimeError("add_after is for a TreeSum allocated with after=True")
        groups, tiles, size = self.slots.shape
        self.result = torch.empty((groups, size), device=self.slots.device, dtype=torch.float32)
        _ordered_sum_kernel[(groups, triton.cdiv(size, block))](
            self.slots, self.result, size, TILES=tiles, BLOCK=block, num_warps=num_warps)
        return self.result

    def extra_bytes(self):
        """Bytes of the slots and counters: what the deterministic mode allocates."""
        return self.slots.numel() * 4 + self.counts.numel() * 4


@triton.jit
def _slot_row(src, t, size, m, o, TILES: tl.constexpr):
    """Slot t of a group's TILES (``src``: slot 0 at these floats), 0 past the last."""
    has = (o * 0 + t) < TILES  # (a vector mask: the interpreter wants one)
    return tl.load(src + t * size, mask=m & has, other=0.0)


@triton.jit
def _ordered_sum_kernel(slots_ptr, out_ptr, size, TILES: tl.constexpr, BLOCK: tl.constexpr):
    """out[grp, o] = ((slot 0 + slot 1) + slot 2) + … + slot TILES − 1 of group grp (grouped
    layout, T = TILES slots a group), BLOCK floats o a program. Eight slots are loaded at a time
    (in flight together), then added in tile order; a slot past T reads 0 (x + 0 = x)."""
    grp = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = o < size
    src = slots_ptr + grp * TILES * size + o
    acc = tl.load(src, mask=m, other=0.0)
    if TILES > 1:  # (a constexpr guard: Triton 3.6's sm_90 build fails on a constant-false loop)
        t = 1
        while t < TILES:  # (`while`, not `for`: triton-lang/triton#9171)
            v0 = _slot_row(src, t, size, m, o, TILES)
            v1 = _slot_row(src, t + 1, size, m, o, TILES)
            v2 = _slot_row(src, t + 2, size, m, o, TILES)
            v3 = _slot_row(src, t + 3, size, m, o, TILES)
            v4 = _slot_row(src, t + 4, size, m, o, TILES)
            v5 = _slot_row(src, t + 5, size, m, o, TILES)
            v6 = _slot_row(src, t + 6, size, m, o, TILES)
            v7 = _slot_row(src, t + 7, size, m, o, TILES)
            acc = (((((((acc + v0) + v1) + v2) + v3) + v4) + v5) + v6) + v7  # in tile order
            t += 8
    tl.store(out_ptr + grp * size + o, acc, mask=m)


@triton.jit
def slot_of(slots_ptr, idx, grp, groups, size):
    """The pointer to slot (level 0, idx, grp): where program ``idx`` stores its partial."""
    return slots_ptr + (idx.to(tl.int64) * groups + grp) * size


@triton.jit
def slot_of_grouped(slots_ptr, idx, grp, rows, size):
    """`slot_of` in the grouped layout (`TreeSum.grouped`: a group's ``rows`` slots together)."""
    return slots_ptr + (grp.to(tl.int64) * rows + idx) * size


@triton.jit
def tree_sum(slots_ptr, counts_ptr, idx, tiles, grp, groups, size,
             FAN: tl.constexpr, BLOCK: tl.constexpr):
    """Called by program ``idx`` (of ``tiles``) once its partial for group ``grp`` is in its slot
    (``slot_of``): climbs the tree while it is the last of its siblings, adding their slots in
    child order into the parent's. Returns nothing; the root slot ends up holding the sum."""
    _climb(slots_ptr, counts_ptr, idx, tiles, grp, groups, size,
           (0 * idx + groups).to(tl.int64) * size, (0 * idx + grp).to(tl.int64) * size, FAN, BLOCK)


@triton.jit
def tree_sum_grouped(slots_ptr, counts_ptr, idx, tiles, grp, groups, rows, size,
                     FAN: tl.constexpr, BLOCK: tl.constexpr):
    """`tree_sum` in the grouped layout (partials stored with ``slot_of_grouped``; ``rows``: the
    tree's slots a group, `TreeSum.slots`' second dimension)."""
    _climb(slots_ptr, counts_ptr, idx, tiles, grp, groups, size,
           (0 * idx + size).to(tl.int64), (0 * idx + grp).to(tl.int64) * rows * size, FAN, BLOCK)


@triton.jit
def _climb(slots_ptr, counts_ptr, idx, tiles, grp, groups, size, row, base,
           FAN: tl.constexpr, BLOCK: tl.constexpr):
    """The tree walk of both layouts: slot r of group ``grp`` at ``base + r · row`` (int64)."""
    tl.debug_barrier()  # every thread's stores of the partial happen before the release below
    zero = 0 * idx  # (integer scalars of idx's type)
    row0 = zero  # slot rows before this level
    cnt0 = zero  # counters before this level's parents
    count = zero + tiles  # slots at this level
    # One tile is its own sum. Triton passes an int argument equal to 1 as a constant, and MLIR
    # folds 0 · idx, so the loop below would be a constant-false loop, which Triton 3.6's sm_90
    # pipeline fails to build (TritonGPUCoalesce): with a constant 1 this `if` drops it.
    if tiles > 1:
        go = count > 1
        while go:  # (`while`, not `for`: triton-lang/triton#9171, see ``mamba1.fused.forward``)
            parent = idx // FAN
            first = parent * FAN
            kids = tl.minimum(count - first, FAN)
            old = tl.atomic_add(counts_ptr + (cnt0 + parent).to(tl.int64) * groups + grp, 1,
                                sem="acq_rel")
            go = old == kids - 1  # the last sibling to arrive adds them all
            if go:
                tl.debug_barrier()  # its acquire happens before any thread's loads below
                src = slots_ptr + base + (row0 + first).to(tl.int64) * row
                dst = slots_ptr + base + (row0 + count + parent).to(tl.int64) * row
                off = zero
                while off < size:
                    o = off + tl.arange(0, BLOCK)
                    m = o < size
                    acc = tl.load(src + o, mask=m, other=0.0, volatile=True)  # child 0
                    for k in tl.static_range(1, FAN):  # then 1, 2, …: never the arrival order
                        # (unrolled: the FAN − 1 loads are in flight together; a missing child
                        # reads 0, and x + 0 = x)
                        has = (o * 0 + k) < kids  # (a vector mask: the interpreter wants one)
                        acc += tl.load(src + k * row + o, mask=m & has, other=0.0,
                                       volatile=True)
                    tl.store(dst + o, acc, mask=m)
                    off += BLOCK
                tl.debug_barrier()  # the parent's slot is stored before the next level's release
            row0 += count
            cnt0 += tl.cdiv(count, FAN)
            count = tl.cdiv(count, FAN)
            idx = parent
            go = go & (count > 1)
