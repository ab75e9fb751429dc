"""Device script: record what the chapters' GPU-only cells print on a GPU, for readers without one.

    python3 -m bench.gpu.notebook_outputs OUTDIR notebooks/09_*.ipynb ...    (on the H200)
    python3 -m bench.gpu.notebook_outputs OUTDIR --from EXECUTED_DIR NB...  (run_notebook's copies)
    python3 -m bench.gpu.notebook_outputs OUTDIR --cpu-smoke                (no GPU: the plumbing)

A GPU-only cell is one whose source prints ``skipped: no GPU`` when there is no GPU. Each notebook
runs top to bottom (matplotlib's inline backend where a GPU-only cell draws, else Agg: `draws`),
one after the other (``bench/gpu/run_notebook.py``; never two at once, so
the timings they print are not measured against each other), and for each one
``OUTDIR/<device>_outputs-<chapter>_<date>.json`` is written: ``meta`` (device, date, command,
commit, torch, triton) and one row per GPU-only cell (``cell`` index, ``source_sha256``, its
``outputs`` as nbformat stores them). Copied to ``docs/results/``, the decks and the site built on a
machine without a GPU show these outputs with that device and date
(``course.classroom.pages``), and only for a cell whose source has not changed since.
``--cpu-smoke`` runs chapter 04 on the CPU into OUTDIR (its GPU cell then prints ``skipped``:
the file shows the plumbing works, it is no recording) and reads it back.
"""

import argparse
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from bench.gpu import run_notebook

REPO = Path(__file__).resolve().parents[2]
SKIPPED = "skipped: no GPU"


def device_slug(name):
    """``NVIDIA H200`` → ``h200`` (the results files' device prefix)."""
    m = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return m.group(1).lower() if m else re.sub(r"\W+", "-", name.lower()).strip("-")


def meta(command):
    import torch

    import mambalearn  # noqa: F401  (first: on a CPU it sets Triton's interpreter mode)

    gpu = torch.cuda.is_available()
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    commit = os.environ.get("MAMBALEARN_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
        check=False).stdout.strip() or "not recorded"
    return {"device": torch.cuda.get_device_name() if gpu else "CPU (smoke run, no GPU)",
            "date": datetime.date.today().isoformat(), "command": command, "commit": commit,
            "torch": torch.__version__, "triton": triton_version, "peers": {},
            "method": "the chapter executed top to bottom (bench/gpu/run_notebook.py); the "
                      "outputs of its GPU-only cells"}


def gpu_cells(source_nb, executed_nb):
    """Rows of the GPU-only cells: index, sha256 of the source, the executed copy's outputs."""
    rows = []
    for i, (src, done) in enumerate(zip(source_nb.cells, executed_nb.cells, strict=True)):
        if src.cell_type == "code" and SKIPPED in src.source:
            if done.source != src.source:
                raise ValueError(f"cell {i}: the executed copy is of another version")
            sha = hashlib.sha256(src.source.encode()).hexdigest()
            rows.append({"cell": i, "source_sha256": sha, "outputs": done.get("outputs", [])})
    return rows


def draws(notebook):
    """Whether a GPU-only cell of ``notebook`` draws with matplotlib: its chapter then runs with
    the inline backend (the figure is an output to record), every other one with Agg, as nbval
    runs it (chapter 14 under the inline backend stopped in its widget cell on the H200 and ran
    under Agg; the cause is not known)."""
    nb = nbformat.read(notebook, as_version=4)
    return any(c.cell_type == "code" and SKIPPED in c.source
               and re.search(r"\bplt\.|\bfig\b", c.source) for c in nb.cells)


def record(notebook, executed_path, out_dir, info):
    """Write the results file of one chapter; its path (None when it has no GPU-only cell)."""
    rows = gpu_cells(nbformat.read(notebook, as_version=4),
                     nbformat.read(executed_path, as_version=4))
    if not rows:
        return None
    slug = device_slug(info["device"]) if "smoke" not in info["device"] else "cpu"
    path = Path(out_dir) / f"{slug}_outputs-{Path(notebook).stem}_{info['date']}.json"
    path.write_text(json.dumps({"meta": info, "rows": rows}, indent=1, ensure_ascii=False) + "\n")
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m bench.gpu.notebook_outputs",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("out", help="folder for the results files")
    p.add_argument("notebooks", nargs="*", help="chapter notebooks")
    p.add_argument("--from", dest="executed", help="take the executed copies from this folder "
                   "(run_notebook.py's OUTDIR) instead of running the notebooks")
    p.add_argument("--cpu-smoke", action="store_true", help="no GPU: chapter 04 on the CPU")
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    p.add_argument("--keep", help="keep the executed copies in this folder (a failed chapter's "
                   "copy shows where it stopped)")
    args = p.parse_args(argv)
    notebooks = args.notebooks or ([str(REPO / "notebooks" / "04_parallel_scans.ipynb")]
                                   if args.cpu_smoke else [])
    if not notebooks:
        p.error("give the chapter notebooks to record")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.environ["MAMBALEARN_PROGRESS"] = "0"  # no progress-bar widgets in the outputs
    info = meta("python3 -m bench.gpu.notebook_outputs " + " ".join(argv or sys.argv[1:]))
    failed = 0
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")  # a kernel that crashes leaves its stack
    with tempfile.TemporaryDirectory() as tmp:
        executed_dir = args.executed or args.keep or tmp
        Path(executed_dir).mkdir(parents=True, exist_ok=True)
        for nb in notebooks:
            if draws(nb):  # the kernel draws inline: figures are outputs
                os.environ.pop("MPLBACKEND", None)
            else:
                os.environ["MPLBACKEND"] = "Agg"
            if not args.executed and not run_notebook.execute(nb, executed_dir, args.timeout):
                failed += 1
                continue  # a chapter that fails records nothing
            path = record(nb, Path(executed_dir) / Path(nb).name, args.out, info)
            print(f"{path or Path(nb).name + ': no GPU-only cell'}", flush=True)
    if args.cpu_smoke:
        from course.classroom import pages

        found = pages.recordings(Path(notebooks[0]).stem, args.out)
        print(f"smoke: {len(found)} recorded cell(s) read back from {args.out}")
        failed += not found
    return failed


if __name__ == "__main__":
    sys.exit(main())
