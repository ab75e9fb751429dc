"""Reading an Nsight Compute profile: the few metrics that say where a kernel's time goes (ch. 08).

``ncu --page raw --csv`` writes one row per kernel launch with thousands of metrics; the
project keeps the ones below in ``docs/profiles/*.csv`` (``bench/gpu/profile.py``):

    ms                 gpu__time_duration.sum — the kernel alone, no launch overhead
    registers          launch__registers_per_thread
    reg_limit          launch__occupancy_limit_registers — programs per SM the registers allow
    warps_pct          sm__warps_active — *achieved* occupancy, % of the SM's 64 warp slots
    issue_pct          smsp__issue_active — % of cycles a scheduler issued an instruction
    sm_pct, mem_pct    sm__throughput, gpu__compute_memory_throughput — "speed of light", % of peak
    pipes              sm__inst_executed_pipe_<p> — % of peak of each pipe: fma, alu, xu (MUFU:
                       exp, log, reciprocal, and conversions), lsu (loads, stores, shared memory,
                       shuffles), tensor_op_gmma (Hopper's wgmma tensor cores), ...
    stalls             smsp__average_warps_issue_stalled_<reason>_per_issue_active — cycles a warp
                       spends stalled for <reason> per instruction issued: long_scoreboard (waiting
                       on global/local memory), short_scoreboard (shared memory, MUFU), wait
                       (fixed latencies), barrier, math_pipe_throttle (a pipe is full), ...

    load(path)          the rows of one CSV as dicts with those keys
    top(row, key, k)    the k largest entries of row["pipes"] or row["stalls"]
"""

import csv

_COLUMNS = {
    "ms": "gpu__time_duration.sum",
    "block": "launch__block_size",
    "grid": "launch__grid_size",
    "registers": "launch__registers_per_thread",
    "reg_limit": "launch__occupancy_limit_registers",
    "warps_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "mem_pct": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
}
_PIPE = ("sm__inst_executed_pipe_", ".avg.pct_of_peak_sustained_active")
_STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
_TO_MS = {"ms": 1.0, "us": 1e-3, "usecond": 1e-3, "ns": 1e-6, "nsecond": 1e-6, "s": 1e3}


def _number(text):
    return float(text.replace(",", "")) if text not in ("", "n/a") else float("nan")


def _row(header, units, values):
    raw = dict(zip(header, values, strict=False))  # ncu may drop trailing empty cells
    row = {"kernel": raw["Kernel Name"].split("<")[0].replace("void ", "").strip()}
    for key, col in _COLUMNS.items():
        row[key] = _number(raw[col]) if col in raw else float("nan")
    unit = units[header.index(_COLUMNS["ms"])].strip().lower()
    if unit not in _TO_MS:
        raise ValueError(f"unknown time unit {unit!r} in the profile")
    row["ms"] *= _TO_MS[unit]
    for k in ("block", "grid", "registers", "reg_limit"):
        row[k] = int(row[k])
    row["pipes"] = {h[len(_PIPE[0]):-len(_PIPE[1])]: _number(v) for h, v in raw.items()
                    if h.startswith(_PIPE[0]) and h.endswith(_PIPE[1])}
    row["stalls"] = {h[len(_STALL[0]):-len(_STALL[1])]: _number(v) for h, v in raw.items()
                     if h.startswith(_STALL[0]) and h.endswith(_STALL[1])}
    return row


def load(path):
    """The kernels of one ``ncu --page raw --csv`` file (header row, units row, one row a launch).

    Returns a list of dicts with the keys of the module docstring; ``ms`` is converted from the
    unit ncu chose (it writes ms for long kernels and us for short ones).
    """
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 3 or "Kernel Name" not in rows[0]:
        raise ValueError(f"{path} is not an ncu raw CSV (a header, a units row and kernel rows)")
    header, units = rows[0], rows[1]
    return [_row(header, units, r) for r in rows[2:] if r]


def top(row, key="stalls", k=3):
    """The ``k`` largest entries of ``row[key]`` (``"stalls"`` or ``"pipes"``), largest first.

    Among stalls, "selected" is left out: it is the one cycle of issuing itself (always 1.0).
    """
    if key not in ("stalls", "pipes"):
        raise ValueError(f"key must be 'stalls' or 'pipes', got {key!r}")
    items = [kv for kv in row[key].items() if not (key == "stalls" and kv[0] == "selected")]
    return sorted(items, key=lambda kv: -kv[1])[:k]
