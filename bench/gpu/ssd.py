"""Device script for chapters 10–12: the SSD and decode-step bench topics, the fused-vs-unfused
precision table, in one process.

Run on the GPU machine from the repo root, with ``.mamba_ref`` carried (or ``MAMBA_SSM_PATH`` set to
a ``mamba_ssm`` package directory) and, for the FLA rows, fla-core on the path:

    PYTHONUNBUFFERED=1 python3 -m bench.gpu.ssd [--fused-chunks 128,64] [--limit S]

Prints rows as they are measured and the table last; writes everything to ``$OUT/ssd.json``. The
same timings: ``python3 -m mambalearn bench ssd step``.
"""

import argparse
import json
import os
import time

import torch

from course.bench import ssd, step, table

OUT = os.environ.get("OUT", "/tmp")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fused-chunks", default="", help="extra fused rows at these chunks")
    ap.add_argument("--limit", type=float, default=600, help="seconds; later sections skipped")
    ap.add_argument("--no-backward", action="store_true")
    a = ap.parse_args()
    t0, gpu = time.time(), torch.cuda.is_available()
    res = {}
    save = lambda: json.dump(res, open(f"{OUT}/ssd.json", "w"), indent=1, default=str)
    fc = tuple(int(c) for c in a.fused_chunks.split(",") if c)
    res["rows"] = ssd.run(gpu, fused_chunks=fc or None, forward=True,
                          backward=not a.no_backward)
    save()
    if time.time() - t0 < a.limit - 30:
        res["step"] = step.run(gpu)
        save()
    if time.time() - t0 < a.limit - 20:
        res["precision"] = ssd.precision(gpu)
        print("share of fused outputs equal to the unfused kernel's:",
              json.dumps(res["precision"], indent=1), flush=True)
        save()
    print(table(res["rows"] + res.get("step", [])))


if __name__ == "__main__":
    main()
