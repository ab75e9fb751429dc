"""The deterministic mode (``deterministic=True``): the fixed-order tree sum that replaces the
atomics, its answers against the float64 oracles, bitwise independence of a sequence's results
from its position in the batch, refusal of bad values, and (GPU) ten runs with the same bits.

On the CPU Triton's interpreter runs programs one after another, so atomics there arrive in a
fixed order anyway: what can differ between runs is tested through the tree sum itself, fed its
tiles in permuted arrival orders (`test_the_tree_sum_ignores_arrival_order`); the GPU test is the
real check of run-to-run bits.
"""

import inspect

import pytest
import torch

from mambalearn import compiled, machine, testing  # first: the interpreter on a CPU

# isort: split
import triton
import triton.language as tl

from mambalearn.mamba1 import default_config, selective_scan_fn
from mambalearn.mamba1.fused import state_outer
from mambalearn.mamba3 import mamba3_mimo_combined
from mambalearn.mamba3.mimo_api import CONFIG as MIMO_CONFIG
from mambalearn.mamba3.mimo_reference import mamba3_mimo_chunked
from mambalearn.scan.sequential import selective_scan_sequential
from mambalearn.triton.deterministic import (
    TreeSum,
    levels,
    slot_of,
    slot_of_grouped,
    tree_sum,
    tree_sum_grouped,
)

GPU = torch.cuda.is_available()
DEV = "cuda" if GPU else "cpu"
M1 = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"]
MIMO = ["Q", "K", "V", "ADT", "DT", "Trap", "Q_bias", "K_bias", "MIMO_V", "MIMO_Z", "MIMO_Out",
        "Angles", "D", "Z"]
PER_SEQUENCE_M1 = ["u", "delta", "z", "B", "C", "initial_state"]  # gradients of one row only
PER_SEQUENCE_MIMO = ["Q", "K", "V", "ADT", "DT", "Trap", "Angles", "Z"]


# ---------------------------------------------------------------------------------------------
# the tree sum on its own
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tree_probe(x_ptr, perm_ptr, slots_ptr, counts_ptr, tiles, groups, rows, size,
                FAN: tl.constexpr, SIZE: tl.constexpr, BLOCK: tl.constexpr,
                GROUPED: tl.constexpr):
    """Program i (the i-th to run in the interpreter) plays tile perm[i] of group program_id(1):
    stores x[tile, group] (size ≤ SIZE floats) in its slot, then joins the tree (BLOCK at a
    time); GROUPED: the grouped layout (``rows`` slots a group)."""
    idx = tl.load(perm_ptr + tl.program_id(0))
    grp = tl.program_id(1)
    o = tl.arange(0, SIZE)
    v = tl.load(x_ptr + (idx * groups + grp) * size + o, mask=o < size)
    if GROUPED:
        tl.store(slot_of_grouped(slots_ptr, idx, grp, rows, size) + o, v, mask=o < size)
        tree_sum_grouped(slots_ptr, counts_ptr, idx, tiles, grp, groups, rows, size, FAN, BLOCK)
    else:
        tl.store(slot_of(slots_ptr, idx, grp, groups, size) + o, v, mask=o < size)
        tree_sum(slots_ptr, counts_ptr, idx, tiles, grp, groups, size, FAN, BLOCK)


def tree_reference(x, fan):
    """The tree's sum in float32, children added in child order: (tiles, groups, size) → (groups,
    size)."""
    while x.shape[0] > 1:
        parents = []
        for first in range(0, x.shape[0], fan):
            acc = x[first].clone()
            for k in range(first + 1, min(first + fan, x.shape[0])):
                acc = acc + x[k]
            parents.append(acc)
        x = torch.stack(parents)
    return x[0]


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("tiles, fan", [(7, 2), (5, 16), (1, 4)])
def test_the_tree_sum_ignores_arrival_order(tiles, fan, grouped):
    gen = torch.Generator().manual_seed(tiles)
    groups, size = 3, 40  # size not a multiple of the block: two blocks, the second masked
    scale = 10.0 ** torch.randint(-6, 7, (tiles, groups, size), generator=gen)
    x = (torch.randn(tiles, groups, size, generator=gen) * scale).to(DEV)
    want = tree_reference(x, fan)
    orders = [torch.arange(tiles), torch.arange(tiles).flip(0),
              torch.randperm(tiles, generator=gen)]
    for perm in orders:
        tree = TreeSum.allocate(tiles, groups, size, fan, DEV, grouped=grouped)
        assert tree.rows == sum(levels(tiles, fan)) and tree.groups == groups
        _tree_probe[(tiles, groups)](x, perm.to(DEV, torch.int32), tree.slots, tree.counts, tiles,
                                     groups, tree.rows, size, FAN=fan, SIZE=64, BLOCK=32,
                                     GROUPED=grouped)
        assert torch.equal(tree.root(), want), f"arrival order {perm.tolist()}"
    if tiles > 2:  # the test can tell orders apart: a right-to-left sum has other bits
        seq = x[-1].clone()
        for k in range(tiles - 2, -1, -1):
            seq = seq + x[k]
        assert not torch.equal(seq, want)
        testing.assert_close(seq, want, rtol=1e-5, atol=1e-5 * x.abs().max().item())


@pytest.mark.parametrize("tiles", [1, 8, 9, 19])
def test_add_after_sums_the_tiles_in_tile_order(tiles):
    """``TreeSum(after=True)``: the second kernel's sum is the left-to-right sum in tile order,
    bit for bit (1 tile: a copy; 8: one full round of loads; 9, 19: a partial last round), over
    sizes that leave its last block partial; magnitudes spread so another order has other bits."""
    gen = torch.Generator().manual_seed(tiles)
    groups, size = 3, 700  # two blocks of 512, the second masked
    tree = TreeSum.allocate(tiles, groups, size, 16, DEV, grouped=True, after=True)
    assert tree.rows == tiles and tree.slots.shape == (groups, tiles, size)
    scale = 10.0 ** torch.randint(-6, 7, (groups, tiles, size), generator=gen)
    tree.slots.copy_(torch.randn(groups, tiles, size, generator=gen) * scale)
    with pytest.raises(RuntimeError, match="add_after"):
        tree.root()
    tree.add_after()
    want = tree.slots[:, 0].clone()
    for k in range(1, tiles):
        want = want + tree.slots[:, k]
    assert torch.equal(tree.root(), want)
    if tiles > 2:
        back = tree.slots[:, -1].clone()
        for k in range(tiles - 2, -1, -1):
            back = back + tree.slots[:, k]
        assert not torch.equal(back, want)
    with pytest.raises(ValueError, match="grouped"):
        TreeSum.allocate(tiles, groups, size, 16, DEV, after=True)


def test_tree_levels():
    assert levels(1, 16) == [1] and levels(1024, 16) == [1024, 64, 4, 1]
    assert levels(7, 2) == [7, 4, 2, 1]
    with pytest.raises(ValueError, match="fan ≥ 2"):
        levels(3, 1)


# ---------------------------------------------------------------------------------------------
# Mamba-1: the answers, and a sequence's bits at two positions of its batch
# ---------------------------------------------------------------------------------------------
def m1_inputs(b, d, l, n, gC, seed):
    """B, C (b, n, l) (gC = 1) or grouped (b, gC, n, l), every optional argument, an initial
    state."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)
    bc = (b, n, l) if gC == 1 else (b, gC, n, l)
    x = dict(u=r(b, d, l), delta=0.5 * r(b, d, l), A=-(0.5 + torch.rand(d, n, generator=gen)),
             B=r(*bc), C=r(*bc), D=r(d), z=r(b, d, l), delta_bias=0.3 * r(d),
             initial_state=r(b, d, n))
    return {k: v.to(DEV) for k, v in x.items()}


def m1_run(x, dout, dlast, config, **kw):
    """out, last state and every gradient of one fwd+bwd."""
    xs = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    out, last = selective_scan_fn(**xs, delta_softplus=True, return_last_state=True,
                                  config=config, **kw)
    torch.autograd.backward([out, last], [dout, dlast])
    return dict(out=out.detach(), last=last.detach(), **{f"d{k}": xs[k].grad for k in x})


def m1_config(**changes):
    """The CPU's or GPU's default, a chunk of 16 steps on the CPU (tiny sequences cross chunks),
    the state-outer backward (the GPU default) with the given changes."""
    cfg = default_config(2, DEV)
    if not GPU:
        cfg = cfg.replace(chunk=16, backward=dict(layout="state-outer", block_d=1))
    return cfg.replace(**changes)


STAGED = [  # state-outer, deterministic, staged partials: (channels a tile, warps, staged rows)
    (4, 2, 2),  # two channels a row (the GPU's two a warp), d 7: the last tile partial
    (4, 1, 4),  # one channel a row
    (8, 2, 1),  # every channel in one row (the sum over the tile before staging)
]
# the changes of the deterministic default: the adjoint carry in registers, the tiles' partials
# added by a second kernel (and the staging's sums 16 floats a pass: several passes a slot)
CARRY_AFTER = dict(reg_carry=True, tree_after=True, tree_block=16)


@pytest.mark.parametrize("layout, d, extra", [(lay, d, {}) for lay in ("state-outer", "sub-block")
                                              for d in (3, 1)]
                         + [(f"staged {s}", 3, {}) for s in STAGED]
                         + [pytest.param(f"staged {STAGED[0]}", 3, CARRY_AFTER,
                                         id="staged-carry-after"),
                            pytest.param("sub-block", 3, dict(tree_after=True),
                                         id="sub-block-after")])
def test_mamba1_deterministic_and_default_match_the_oracle(layout, d, extra):
    """d 3: 3 tiles of one channel, a tree of 3 levels; d 1: one tile, its own sum (Triton then
    passes the tile count as a constant 1). "staged (block_d, warps, rows)": the state-outer
    backward with ``tree_rows``, 3 tiles, the last one partial, the sequence cut in 2
    segments. ``extra``: `Backward.reg_carry` (both modes: the carry does not depend on them),
    `Backward.tree_after`."""
    bw, cut = dict(layout=layout, block_d=1, tree_fan=2, **extra), {}
    if layout.startswith("staged"):
        block_d, warps, rows = STAGED[[f"staged {s}" for s in STAGED].index(layout)]
        bw = dict(layout="state-outer", block_d=block_d, num_warps=warps, tree_rows=rows,
                  tree_fan=2, **extra)
        d = 3 * block_d - 1  # 11 at block_d 4, 23 at 8
        cut = dict(segments=2)  # (16 + 1 steps: each program's staging, segment by segment)
    elif extra.get("reg_carry"):
        cut = dict(segments=2)  # (the carry entering segment 0 folded from segment 1's)
    x = m1_inputs(2, d, 17, 2, gC=1, seed=0)
    gen = torch.Generator().manual_seed(1)
    dout = torch.randn(2, d, 17, generator=gen).to(DEV)
    dlast = torch.randn(2, d, 2, generator=gen).to(DEV)
    ref_in = {k: v.double().requires_grad_() for k, v in x.items()}
    out, last = selective_scan_sequential(**ref_in, delta_softplus=True, return_last_state=True)
    torch.autograd.backward([out, last], [dout.double(), dlast.double()])
    want = dict(out=out, last=last, **{f"d{k}": ref_in[k].grad for k in x})
    # (the sub-block default: the other files' tests)
    modes = [True, False] if layout == "state-outer" or extra.get("reg_carry") else [True]
    for det in modes:
        got = m1_run(x, dout, dlast, m1_config(backward=bw, deterministic=det, **cut))
        for k, v in want.items():
            testing.assert_close(got[k], v, dtype=torch.float32, grad=k.startswith("d"),
                                 msg=f"{k}, deterministic={det}")


@pytest.mark.parametrize("staged", [False, True, "carry after"])
def test_mamba1_a_sequence_has_the_same_bits_anywhere_in_its_batch(staged):
    """Kernels only: no initial state, whose gradient's exp runs in PyTorch — on the CPU its
    vectorised loop rounds a tensor's last elements in a scalar tail (see the MIMO test).
    ``staged``: 2 channels a tile in 2 staged rows (``Backward.tree_rows``); "carry after": so,
    with the carry in registers and the partials added by a second kernel."""
    b, d, l, n = 3, 4 + 4 * bool(staged), 9, 2  # l = 9, chunk 8 (on a CPU): two segments, 2 tiles a
    # group
    s, other = m1_inputs(1, d, l, n, gC=2, seed=2), m1_inputs(b, d, l, n, gC=2, seed=3)
    gen = torch.Generator().manual_seed(4)
    ds, do = torch.randn(1, d, l, generator=gen), torch.randn(b, d, l, generator=gen)
    dls, dlo = torch.randn(1, d, n, generator=gen), torch.randn(b, d, n, generator=gen)
    batch = lambda at, X, Y: torch.cat([Y[:at], X, Y[at + 1:]]) if X.shape[0] == 1 and \
        Y.shape[0] == b else X  # A, D, delta_bias are shared
    bw = dict(tree_fan=2, **(dict(block_d=2, num_warps=1, tree_rows=2) if staged else {}),
              **(CARRY_AFTER if staged == "carry after" else {}))
    cfg = m1_config(segments=2, deterministic=True, backward=bw,
                    **({} if GPU else dict(chunk=8)))
    runs = []
    for at in (0, 2):
        x = {k: batch(at, s[k], other[k]) for k in s if k != "initial_state"}
        r = m1_run(x, batch(at, ds, do).to(DEV), batch(at, dls, dlo).to(DEV), cfg)
        runs.append({k: v[at] for k, v in r.items()
                     if k in ("out", "last") or k[1:] in PER_SEQUENCE_M1})
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k]), f"{k} of the sequence at index 0 vs 2"


def test_mamba1_bad_deterministic_values_are_refused():
    x = m1_inputs(1, 2, 3, 2, gC=1, seed=5)
    with pytest.raises(TypeError, match="deterministic must be True, False or None"):
        selective_scan_fn(**x, deterministic="yes")
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        default_config(2, "cpu").replace(deterministic=1)
    with pytest.raises(ValueError, match="deterministic=True contradicts config.deterministic"):
        selective_scan_fn(**x, deterministic=True, config=default_config(2, DEV))
    with pytest.raises(ValueError, match="tree_fan"):
        default_config(2, "cpu").replace(backward=dict(tree_fan=1))
    so = dict(layout="state-outer", block_d=4)
    for rows in (3, 8, -1, 2.0):  # not a power of two, not dividing block_d, negative, a float
        with pytest.raises(ValueError, match="tree_rows must be 0 or a power of two"):
            default_config(2, "cpu").replace(backward=dict(so, tree_rows=rows))
    with pytest.raises(ValueError, match="only the 'state-outer' backward stages"):
        default_config(2, "cpu").replace(backward=dict(layout="sub-block", tree_rows=2))
    for name in ("tree_after", "reg_carry"):
        with pytest.raises(TypeError, match=f"backward.{name} must be True or False"):
            default_config(2, "cpu").replace(backward=dict(so, **{name: 1}))
    for tb in (3, -16, 16.0):
        with pytest.raises(ValueError, match="tree_block must be 0 or a power of two"):
            default_config(2, "cpu").replace(backward=dict(so, tree_block=tb))
    with pytest.raises(ValueError, match="only the 'state-outer' backward carries"):
        default_config(2, "cpu").replace(backward=dict(layout="sub-block", reg_carry=True))
    assert default_config(2, "cpu").replace(backward=dict(so, tree_rows=4)).backward.tree_rows == 4


# ---------------------------------------------------------------------------------------------
# Mamba-3 MIMO
# ---------------------------------------------------------------------------------------------
def mimo_inputs(b, l, h, g, p, n, na, r, seed):
    gen = torch.Generator().manual_seed(seed)
    rr = lambda *s: torch.randn(*s, generator=gen)
    DT = torch.nn.functional.softplus(rr(b, h, l) - 2.0)
    x = dict(Q=rr(b, l, r, g, n) / n ** 0.5, K=rr(b, l, r, g, n) / n ** 0.5, V=rr(b, l, h, p),
             ADT=-torch.nn.functional.softplus(rr(b, h, l)) * DT, DT=DT, Trap=rr(b, h, l),
             Q_bias=1 + 0.1 * rr(h, r, n), K_bias=1 + 0.1 * rr(h, r, n), MIMO_V=rr(h, r, p) / r,
             MIMO_Z=rr(h, r, p), MIMO_Out=rr(h, r, p) / r, Angles=rr(b, l, h, na), D=rr(h),
             Z=rr(b, l, h, p))
    return {k: v.to(DEV) for k, v in x.items()}


# 4 heads a group (a tree of 3 levels at fan 2), 2 chunks of 8 steps; every per-sequence tensor
# a multiple of 64 floats: see `test_mimo_a_sequence_has_the_same_bits_anywhere_in_its_batch`
MIMO_DIMS = dict(l=16, h=4, g=1, p=8, n=8, na=2, r=2)
MIMO_CFG = MIMO_CONFIG.replace(tree_fan=2)


def mimo_run(x, dout, deterministic, chunk_size=8, cfg=MIMO_CFG):
    """out and every gradient of one fwd+bwd (deterministic None: the float64 oracle)."""
    xs = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    if deterministic is None:
        out = mamba3_mimo_chunked(**xs, chunk_size=chunk_size)
    else:
        out = mamba3_mimo_combined(**xs, chunk_size=chunk_size, config=cfg,
                                   deterministic=deterministic)
    out.backward(dout)
    return dict(out=out.detach(), **{f"d{k}": xs[k].grad for k in x})


@pytest.mark.parametrize("heads", [4, 1])
def test_mimo_deterministic_and_default_match_the_oracle(heads):
    """4 heads a group (a tree of 3 levels), or 1 (one tile, its own sum: a constant 1)."""
    dims = dict(MIMO_DIMS, g=MIMO_DIMS["h"] // heads)
    x = mimo_inputs(1, **dims, seed=6)
    dout = torch.randn(1, 16, 4, 8, generator=torch.Generator().manual_seed(7)).to(DEV)
    want = mimo_run({k: v.double() for k, v in x.items()}, dout.double(), None)
    for det in (True, False):
        got = mimo_run(x, dout, det)
        for k, v in want.items():
            testing.assert_close(got[k], v, dtype="dot", grad=k != "out",
                                 msg=f"{k}, deterministic={det}")


def test_mimo_a_sequence_has_the_same_bits_anywhere_in_its_batch():
    """(The PyTorch preparations (angle sums, trapezoid weights) run on the CPU here, whose
    vectorised loops take the last few elements of a tensor through a scalar tail with other
    rounding: sizes whose rows are whole multiples of 64 floats keep every row off that tail.
    On a GPU every element runs the same code.)"""
    s, other = mimo_inputs(1, **MIMO_DIMS, seed=8), mimo_inputs(3, **MIMO_DIMS, seed=9)
    gen = torch.Generator().manual_seed(10)
    ds, do = torch.randn(1, 16, 4, 8, generator=gen), torch.randn(3, 16, 4, 8, generator=gen)
    batched = {k for k in s if s[k].shape[0] == 1 and other[k].shape[0] == 3}
    runs = []
    cat = lambda at, X, Y: torch.cat([Y[:at], X, Y[at + 1:]])
    for at in (0, 2):
        x = {k: cat(at, s[k], other[k]) if k in batched else s[k] for k in s}
        r = mimo_run(x, cat(at, ds, do).to(DEV), True)
        runs.append({k: v[at] for k, v in r.items() if k == "out" or k[1:] in PER_SEQUENCE_MIMO})
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k]), f"{k} of the sequence at index 0 vs 2"


def test_mimo_bad_deterministic_values_are_refused():
    x = mimo_inputs(1, **MIMO_DIMS, seed=11)
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        mamba3_mimo_combined(**x, chunk_size=8, deterministic="yes")


# ---------------------------------------------------------------------------------------------
# sm_90 builds (no GPU needed) and the GPU's ten runs
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("block_d, warps, rows, after", [(2, 1, 0, False), (8, 4, 4, False),
                                                         (16, 8, 8, True)])
def test_the_deterministic_state_outer_backward_builds_for_sm90_without_spills(block_d, warps,
                                                                               rows, after):
    """The n16 tiles (2 channels × 64 steps in one warp, straight into the tree; 8 channels in 4
    warps, staged; the deterministic default's 16 channels in 8 warps, staged, the carry in
    registers and the partials added after), bf16, every option, B and C varying, no register
    cap: no spill (the atomic build has none either), no more shared memory than a program of
    the atomic build uses (256 bytes a warp), one integer atomic (the counter; ``after``: none,
    and no fence) and no float atomics."""
    BF16 = {"u_ptr", "delta_ptr", "z_ptr", "dout_ptr", "du_ptr", "ddelta_ptr", "dz_ptr"}
    kernel = state_outer._bwd_so_kernel
    flags = dict(N=16, BLOCK_D=block_d, BLOCK_L=64, HAS_D=True, HAS_Z=True, HAS_BIAS=True,
                 SOFTPLUS=True, VAR_B=True, VAR_C=True, HAS_SEQ=False, EVEN_L=True, EVEN_D=True,
                 REV_LOADS=False, FOLD=False)
    const = dict(flags, DET=True, SLOT=2 * 16 * 64, FAN=16, TREE_BLOCK=128 * warps, ROWS=rows,
                 AFTER=after, REG_CARRY=after)
    sig = {k: "constexpr" if k in const else
           ("*i32" if k in ("seq_ptr", "counts_ptr") else "*bf16" if k in BF16 else "*fp32")
           if k.endswith("_ptr") else ("i32",) * 3 if k.endswith("_strides") else "i32"
           for k in inspect.signature(kernel.fn).parameters}  # (b, g, n) strides: a tuple
    det, = compiled.compile_all(kernel, sig, [dict(constexprs=const, num_warps=warps)])
    assert det.spill_bytes == 0 and det.registers <= 255
    assert det.shared_bytes <= 256 * warps <= machine.H200.shared_per_block
    ops = det.opcodes()
    assert "REDG" not in ops and ops.get("ATOMG", 0) == (0 if after else 1), ops  # the counter
    assert ("MEMBAR" in ops) != after, ops  # (its release fence)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_ten_runs_give_the_same_bits_on_the_gpu():
    """Shapes where many programs add into the same dB/dC (1024 channels: 512 tiles) and
    dQ/dK (16 heads, one group) elements."""
    gen = torch.Generator().manual_seed(12)
    x = m1_inputs(2, 1024, 1024, 16, gC=1, seed=13)
    x = {k: v.to(torch.bfloat16) if k in ("u", "delta", "z", "B", "C") else v
         for k, v in x.items()}
    dout = torch.randn(2, 1024, 1024, generator=gen).to(DEV, torch.bfloat16)
    dlast = torch.randn(2, 1024, 16, generator=gen).to(DEV)
    y = mimo_inputs(2, 512, 16, 1, 64, 64, 8, 4, seed=14)
    y = {k: v.to(torch.bfloat16) if k in ("Q", "K", "V", "Z") else v for k, v in y.items()}
    dy = torch.randn(2, 512, 16, 64, generator=gen).to(DEV, torch.bfloat16)
    cases = {
        "mamba1": lambda: m1_run(x, dout, dlast, None, deterministic=True),
        "mimo": lambda: mimo_run(y, dy, True, chunk_size=16, cfg=MIMO_CONFIG),
    }
    for family, run in cases.items():
        first = run()
        for i in range(9):
            again = run()
            for k in first:
                assert torch.equal(first[k], again[k]), f"{family}: {k} differs in run {i + 2}"


@pytest.mark.cpu
def test_the_device_script_runs_tiny_on_cpu(tmp_path):
    """bench/gpu/determinism.py --cpu-smoke: every step at toy sizes, its results file and table
    (the interpreter: a test of the script, not a measurement)."""
    import json
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    g = runpy.run_path(str(root / "bench/gpu/determinism.py"), run_name="dry")
    rows = g["main"](["--cpu-smoke", "--out", str(tmp_path)])
    summary = [r for r in rows if "ms" in r]
    assert [(r["family"], r["mode"]) for r in summary] == [
        (f, m) for f in ("mamba1", "mimo") for m in ("default", "deterministic")]
    for r in summary:
        assert r["runs"] == 2 and r["ms"] > 0 and r["ratio_to_default"] > 0
        if r["mode"] == "deterministic":
            assert r["bitwise_equal_runs"] == 2.0 and r["batch_position_equal"] is True, r
    (path,) = tmp_path.glob("*_determinism_*.json")
    assert json.loads(path.read_text())["rows"] == rows
    assert "deterministic" in g["table"](rows).splitlines()[2]
