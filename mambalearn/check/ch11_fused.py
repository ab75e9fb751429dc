"""Checks for chapter 11: the ordering of the fused SSD kernel, run through a scheduler.

    work_of_ticket(ticket, n_chains, n_chunks) -> (chain, chunk)    chunk-major: c is the slow index
    pass_state_ops(chunk) -> [("acquire", c), ("load", c), ("store", c + 1), ("release", c + 1)]

A chain is one (batch, head): chunk c of it needs H_c, which chunk c − 1 produces (H_0 is the
initial state, published at launch). ``flag[k]`` says H_k is published. Programs get tickets in the
order they start; the ticket decides their work; step 3 of a program is its list of operations.

The scheduler here is the GPU's worst behaviour, drawn at random: a few slots (resident programs),
programs started in any order as slots free up, every tick an arbitrary subset of the resident
programs advancing one operation, random lengths of the compute steps before and after. A
program spinning on ``acquire`` holds its slot. Each schedule must finish (no deadlock), never load
a state before it is stored, and end with every H_c equal to the sequential recurrence
H_{c+1} = a_c H_c + S_c. Edge cases: one chain, one chunk, one slot, more slots than programs.
"""

import random

import torch

from mambalearn.check import _core, _probes

__all__ = ["work_of_ticket", "pass_state_ops"]
# The library's ticket order lives inside a Triton kernel (``mamba2.fused``): nothing to
# switch off. A Python twin of it added to the library later must be listed here.
REBUILDS = {"work_of_ticket": [], "pass_state_ops": []}

HINTS = {
    "work_of_ticket": [
        "the producer of chunk c − 1 must hold a smaller ticket than chunk c: then it has "
        "started, and every wait ends",
        "chunk-major: ticket = chunk · n_chains + chain, so chain = ticket % n_chains and chunk = "
        "ticket // n_chains",
    ],
    "pass_state_ops": [
        "chunk c reads H_c and writes H_{c+1}: wait for flag c before loading, set flag c + 1 "
        "after storing",
        "the order is acquire c, load c, store c + 1, release c + 1: releasing before storing "
        "lets the next chunk read a state not yet written",
    ],
}

KINDS = ("acquire", "load", "store", "release")
SHAPES = [(1, 1), (1, 5), (3, 1), (2, 4), (3, 3), (4, 6)]  # (chains, chunks)


def _right_ops(c):
    return [("acquire", c), ("load", c), ("store", c + 1), ("release", c + 1)]


class _Box:
    """The shared memory of one launch: states H (None = never stored), flags, the trace."""

    def __init__(self, n_chains, n_chunks, g):
        self.H = [[None] * (n_chunks + 1) for _ in range(n_chains)]
        self.flag = [[False] * (n_chunks + 1) for _ in range(n_chains)]
        self.a = torch.rand(n_chains, n_chunks, generator=g, dtype=torch.float64) + 0.5
        self.S = torch.randn(n_chains, n_chunks, generator=g, dtype=torch.float64)
        for i in range(n_chains):  # H_0: the initial state, published at launch
            self.H[i][0] = float(torch.randn(1, generator=g, dtype=torch.float64))
            self.flag[i][0] = True


def _step(prog, box):
    """Advance one program by one operation; returns False while it spins, raises on a bug."""
    chain, c = prog["work"]
    kind, k = prog["ops"][prog["pc"]]
    if kind == "acquire":
        if not box.flag[chain][k]:
            return False
    elif kind == "load":
        if box.H[chain][k] is None:
            why = ("its flag was released before the store" if box.flag[chain][k]
                   else "nothing waited for it")
            raise AssertionError(f"chunk {c} of chain {chain} loaded H_{k} before it was stored: "
                                 f"{why} (acquire flag {k} first; release a flag only after "
                                 f"storing its state)")
        prog["loaded"] = box.H[chain][k]
    elif kind == "store":
        if "loaded" not in prog:
            raise AssertionError(f"chunk {c} of chain {chain} stored H_{k} before loading the "
                                 f"state it passes on: load H_{c} first")
        box.H[chain][k] = float(box.a[chain, c]) * prog["loaded"] + float(box.S[chain, c])
    else:
        box.flag[chain][k] = True
    prog["pc"] += 1
    return True


def simulate(table, ops, n_chains, n_chunks, slots, rnd, g):
    """Run one random schedule. ``table[t]`` is ticket t's work, ``ops[c]`` chunk c's step 3.

    Returns the final box; raises AssertionError on a deadlock, an early load or a wrong state.
    """
    box = _Box(n_chains, n_chunks, g)
    pending, resident, ticket = n_chains * n_chunks, [], 0
    for _ in range(100 * n_chains * n_chunks + 100):  # ticks
        while len(resident) < slots and ticket < pending:  # a free slot starts the next program
            resident.append(dict(work=table[ticket], ops=ops[table[ticket][1]], pc=0,
                                 before=rnd.randint(0, 2), after=rnd.randint(0, 2)))
            ticket += 1
        if not resident:
            return box
        moved = False
        for prog in rnd.sample(resident, rnd.randint(1, len(resident))):  # some advance, some stall
            if prog["before"]:
                prog["before"] -= 1
                moved = True
            elif prog["pc"] < len(prog["ops"]):
                moved |= _step(prog, box)
            elif prog["after"]:
                prog["after"] -= 1
                moved = True
            else:
                resident.remove(prog)
                moved = True
        if not moved and all(p["before"] == 0 and p["pc"] < len(p["ops"]) and p["ops"][p["pc"]][0]
                             == "acquire" and not box.flag[p["work"][0]][p["ops"][p["pc"]][1]]
                             for p in resident):
            waits = ", ".join(f"chunk {p['work'][1]} of chain {p['work'][0]} waits for flag "
                              f"{p['ops'][p['pc']][1]}" for p in resident)
            raise AssertionError(f"DEADLOCK with {slots} slot(s), {n_chains} chain(s) × {n_chunks} "
                                 f"chunk(s), after {ticket} of {pending} programs started: every "
                                 f"resident program spins ({waits}) and no slot frees up")
    raise AssertionError("the schedule did not finish")  # a spin that can never succeed


def _truth(box_a, box_S, H0):
    H = [H0]
    for c in range(len(box_a)):
        H.append(float(box_a[c]) * H[-1] + float(box_S[c]))
    return H


def _check_final(box, n_chains, n_chunks, desc):
    for chain in range(n_chains):
        want = _truth(box.a[chain], box.S[chain], box.H[chain][0])
        for k in range(1, n_chunks + 1):
            got = box.H[chain][k]
            if got is None:
                raise AssertionError(f"H_{k} of chain {chain} was never stored on {desc}: chunk "
                                     f"{k - 1} must store H_{k}")
            _core.compare(torch.tensor(got), torch.tensor(want[k]), what=f"H_{k} of chain {chain}",
                          case=desc)


def _table(fn, n_chains, n_chunks, desc):
    table = _core.probe(_probes.table, fn, n_chains, n_chunks, n=n_chains * n_chunks, case=desc)
    total = n_chains * n_chunks
    seen = {}
    for t, work in enumerate(table):
        if not (isinstance(work, (tuple, list)) and len(work) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) for v in work)):
            raise AssertionError(f"work_of_ticket({t}, {n_chains}, {n_chunks}) must return a pair "
                                 f"of ints (chain, chunk); got {work!r}")
        chain, c = work
        if not (0 <= chain < n_chains and 0 <= c < n_chunks):
            raise AssertionError(f"work_of_ticket({t}, {n_chains}, {n_chunks}) = {tuple(work)} is "
                                 f"outside {n_chains} chains × {n_chunks} chunks")
        if tuple(work) in seen:
            raise AssertionError(f"tickets {seen[tuple(work)]} and {t} both get {tuple(work)} "
                                 f"({n_chains} chains × {n_chunks} chunks): every (chain, chunk) "
                                 f"needs exactly one of the {total} tickets")
        seen[tuple(work)] = t
    return [tuple(w) for w in table], seen


def _order_hint(seen, n_chains, n_chunks):
    """Deadlock-free orders that are not chunk-major get told why the kernel prefers it."""
    for (chain, c), t in seen.items():
        if c > 0 and t - seen[(chain, c - 1)] != n_chains:
            return (f"chunk {c} of chain {chain} has ticket {t} and its producer, chunk {c - 1}, "
                    f"ticket {seen[(chain, c - 1)]}: in chunk-major order the producer starts "
                    f"exactly n_chains = {n_chains} tickets earlier (ticket = c · n_chains + "
                    f"chain), "
                    f"so it has usually published by the time chunk {c} asks")
    return None


def work_of_ticket(fn):
    """Check ``fn(ticket, n_chains, n_chunks) -> (chain, chunk)``: a bijection, deadlock-free
    under every schedule drawn, and chunk-major (the order the fused kernel uses)."""
    g = _core.generator()
    rnd = random.Random(g.initial_seed())
    n_checks = 0
    for n_chains, n_chunks in SHAPES:
        desc = f"{n_chains} chain(s) × {n_chunks} chunk(s)"
        table, seen = _table(fn, n_chains, n_chunks, desc)
        ops = [_right_ops(c) for c in range(n_chunks)]
        for slots in sorted({1, 2, 3, n_chains * n_chunks + 1}):
            for _ in range(6):
                box = simulate(table, ops, n_chains, n_chunks, slots, rnd, g)
                _check_final(box, n_chains, n_chunks, f"{desc}, {slots} slot(s)")
                n_checks += 1
        why = _order_hint(seen, n_chains, n_chunks)
        if why:
            raise AssertionError(f"work_of_ticket never deadlocks on {desc}, but it is not the "
                                 f"chunk-major order: {why}")
    _core.passed("work_of_ticket", n_checks)


def pass_state_ops(fn):
    """Check ``fn(chunk) -> [(kind, k), ...]``, step 3 of one program, under random schedules."""
    g = _core.generator()
    rnd = random.Random(g.initial_seed())
    n_checks = 0
    for n_chains, n_chunks in SHAPES:
        desc = f"{n_chains} chain(s) × {n_chunks} chunk(s)"
        ops = _core.probe(_probes.table, fn, n=n_chunks, case=desc)
        for c, step in enumerate(ops):
            if not (isinstance(step, (list, tuple)) and all(
                    isinstance(o, (list, tuple)) and len(o) == 2 and o[0] in KINDS
                    and isinstance(o[1], int) and 0 <= o[1] <= n_chunks for o in step)):
                raise AssertionError(f"pass_state_ops({c}) must be a list of (kind, k) with kind "
                                     f"one of {KINDS} and 0 ≤ k ≤ n_chunks; got {step!r}")
        ops = [[tuple(o) for o in step] for step in ops]
        table = [(t % n_chains, t // n_chains) for t in range(n_chains * n_chunks)]
        for slots in sorted({1, 2, 3, n_chains * n_chunks + 1}):
            for _ in range(6):
                box = simulate(table, ops, n_chains, n_chunks, slots, rnd, g)
                _check_final(box, n_chains, n_chunks, f"{desc}, {slots} slot(s)")
                n_checks += 1
    _core.passed("pass_state_ops", n_checks)
