"""Device script for chapters 10–11: the SSD bench topic plus the fused-vs-unfused precision table.

Run on the GPU machine from the repo root, with ``.mamba_ref`` carried (or ``MAMBA_SSM_PATH`` set to
a ``mamba_ssm`` package directory):

    python3 -m pytest tests/test_ssd_triton.py tests/test_ssd_fused.py -q -p no:cacheprovider
    PYTHONUNBUFFERED=1 python3 mambalearn/bench/gpu/ssd.py

Prints rows as they are measured, the precision table, and the table of rows last; writes everything
to ``$OUT/ssd.json``. The same timings: ``python3 -m mambalearn bench ssd``.
"""

import json
import os
import sys

sys.path.insert(0, os.getcwd())

import torch  # noqa: E402

from mambalearn.bench import ssd, table  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
gpu = torch.cuda.is_available()
prec = ssd.precision(gpu)
print("share of fused outputs equal to the unfused kernel's:", json.dumps(prec, indent=1), flush=True)
json.dump(dict(precision=prec), open(f"{OUT}/ssd.json", "w"), indent=1)
rows = ssd.run(gpu)
json.dump(dict(precision=prec, rows=rows), open(f"{OUT}/ssd.json", "w"), indent=1)
print(table(rows))
