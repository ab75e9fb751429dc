"""Write a device run into a results file (docs/results/README.md), its meta filled in.

    from bench.gpu.record import record
    record("parallel", rows, command="python3 -m bench.gpu.parallel $OUT", peers={},
           out_dir=os.environ["OUT"], method="CUDA events; ms per shard")

writes ``OUT_DIR/<device>_<topic>_<date>[.<k>].json`` with the device's name (from torch), today's
date, the commit (``$MAMBALEARN_COMMIT``, else ``git rev-parse --short HEAD``), the torch and
Triton versions, the command, the peers' versions and the method. ``k`` is the next run number
of the day not taken in OUT_DIR or in docs/results. Copy the file into docs/results to commit it.

    python3 -m bench.gpu.record TOPIC [TOPIC ...] [--out DIR]

runs ``mambalearn bench`` topics (``course.bench.<topic>.run``) and records each; on a
machine without a GPU it writes a ``cpu_…`` file of the interpreter's tiny shapes (a smoke run,
never committed).
"""

import argparse
import importlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mambalearn import results  # noqa: E402

NOT_RECORDED = "not recorded"


def device_name():
    """``torch.cuda.get_device_name()``, or "cpu" without a GPU."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def slug(name):
    """The device part of a file name: "NVIDIA H200" → "h200", "cpu" → "cpu"."""
    words = [w for w in name.lower().replace("-", " ").split() if w not in ("nvidia", "geforce")]
    out = "".join(c for c in (words[0] if words else "") if c.isalnum())
    if not out:
        raise ValueError(f"cannot name a results file after the device {name!r}")
    return out


def commit():
    """``$MAMBALEARN_COMMIT``, else the short hash of HEAD, else "not recorded" (no git)."""
    if os.environ.get("MAMBALEARN_COMMIT"):
        return os.environ["MAMBALEARN_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return NOT_RECORDED
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else NOT_RECORDED


def check_rows(rows):
    """Rows must be flat dicts of strings, numbers, booleans or None (finite numbers)."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise TypeError("rows must be a list of dicts")
    for i, row in enumerate(rows):
        for k, v in row.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, (str, int, float, bool))):
                raise TypeError(f"rows[{i}][{k!r}] = {v!r}: a row is flat (str, int, float, "
                                f"bool or None values)")
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"rows[{i}][{k!r}] = {v}: JSON has no NaN or infinity; leave "
                                 f"the key out or record the error as a string")
    return rows


def target(topic, device, date, out_dir, store=results.STORE):
    """The first file name of the day for ``topic`` taken neither in ``out_dir`` nor the store."""
    for k in range(1, 1000):
        name = f"{device}_{topic}_{date}{'' if k == 1 else f'.{k}'}.json"
        if not (Path(out_dir) / name).exists() and not (Path(store) / name).exists():
            return Path(out_dir) / name
    raise RuntimeError(f"{out_dir}: 999 runs of {topic} on {date}")


class Run:
    """A device script's clock, its rows and its mode: ``left()`` seconds of ``limit`` since
    ``t0`` (the script's start), ``keep(**row)`` prints a row as it comes (``k=v``, without the
    None fields) and, with ``rows_file``, appends it there as a JSON line (for a parent process);
    ``gpu``: a GPU is there and this is no smoke run."""

    def __init__(self, limit, smoke, t0, rows_file=None):
        import torch

        self.limit, self.smoke, self.t0, self.rows_file = limit, smoke, t0, rows_file
        self.gpu = torch.cuda.is_available() and not smoke
        self.rows = []

    def left(self):
        return self.limit - (time.time() - self.t0)

    def keep(self, **row):
        row = {k: v for k, v in row.items() if v is not None}
        self.rows.append(row)
        print(f"[{time.time() - self.t0:6.1f}s]", " ".join(
            f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
            flush=True)
        if self.rows_file:
            with open(self.rows_file, "a") as f:
                f.write(json.dumps(row) + "\n")
        return row


def record(topic, rows, command, peers, out_dir, method=NOT_RECORDED, **extra):
    """Write ``rows`` of ``topic`` with the meta of this machine and checkout; the path written.

    ``peers``: {name: version} of the other libraries timed in the run ({} for none);
    ``extra``: more meta (``baseline``, ``config``, ``figure``, …).
    """
    import torch

    if not results.NAME.match(f"x_{topic}_2000-01-01.json"):
        raise ValueError(f"topic {topic!r}: lower case letters, digits and underscores")
    if not isinstance(peers, dict):
        raise TypeError(f"peers must be a dict {{name: version}}, got {type(peers).__name__}")
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = NOT_RECORDED
    meta = {"device": device_name(), "date": time.strftime("%Y-%m-%d"), "command": command,
            "commit": commit(), "torch": torch.__version__, "triton": triton_version,
            "peers": peers, "method": method, **extra}
    return write(topic, rows, meta, out_dir)


def write(topic, rows, meta, out_dir):
    """Write ``rows`` of ``topic`` with a given ``meta`` (its eight keys: see the store's
    README); the path written. `record` fills the meta in from this machine."""
    missing = [k for k in ("device", "date", "command", "commit", "torch", "triton", "peers",
                           "method") if k not in meta]
    if missing:
        raise ValueError(f"meta lacks {missing}")
    os.makedirs(out_dir, exist_ok=True)
    path = target(topic, slug(meta["device"]), meta["date"], out_dir)
    text = json.dumps({"meta": meta, "rows": check_rows(rows)}, indent=1, ensure_ascii=False,
                      default=str)
    path.write_text(text + "\n")
    print(f"recorded {len(rows)} rows: {path}", flush=True)
    return path


def as_rows(topic, bench_rows):
    """``mambalearn bench`` rows in the store's form: their ``topic`` "<topic> fwd" becomes op
    "fwd" (another name, e.g. "selective fwd" of the scans topic, becomes the op whole)."""
    out = []
    for row in bench_rows:
        row = dict(row)
        name = row.pop("topic", topic)
        if name != topic:
            row.setdefault("op", name.removeprefix(topic + " "))
        out.append(row)
    return out


def peer_versions():
    """The versions of the peers a run imported: mamba_ssm (from its source tree's folder name),
    fla-core and mambapy (installed)."""
    from importlib import metadata

    found = {}
    for module, dist in (("fla", "fla-core"), ("mambapy", "mambapy")):
        if module in sys.modules:
            try:
                found[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                found[dist] = NOT_RECORDED
    if "mamba_ssm" in sys.modules:
        tree = Path(list(getattr(sys.modules["mamba_ssm"], "__path__", [""]))[0]).parent.name
        found["mamba_ssm"] = tree.removeprefix("mamba_ssm-") if "-" in tree else NOT_RECORDED
    return found


def main(argv=None):
    from course import bench

    p = argparse.ArgumentParser(description="run mambalearn bench topics and record each")
    p.add_argument("topics", nargs="+", choices=bench.TOPICS)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    args = p.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    for topic in args.topics:
        rows = importlib.import_module(f"course.bench.{topic}").run(gpu)
        record(topic, as_rows(topic, list(rows)),
               command=f"python3 -m bench.gpu.record {topic}", peers=peer_versions(),
               out_dir=args.out,
               method=f"course.bench.{topic}.run({gpu}): see its docstring")


if __name__ == "__main__":
    main()
