"""Execute notebooks and keep their outputs (the device runs: figures and printed tables to read).

    python3 bench/gpu/run_notebook.py OUTDIR NB.ipynb...

Each notebook runs top to bottom in its own kernel (cwd = its folder), all at once in separate
processes, like nbval's lax mode:
a cell error stops that notebook. The executed copy, outputs included, goes to OUTDIR even when a
cell fails; the exit status is the number of notebooks that failed.
"""

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import nbclient
import nbformat


def execute(path, outdir, timeout=600):
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": os.path.dirname(path)}})
    t0, error = time.time(), None
    try:
        client.execute()
    except Exception as e:  # noqa: BLE001 - report and keep the partial notebook
        error = f"{type(e).__name__}: {str(e)[-600:]}"
    finally:
        nbformat.write(nb, os.path.join(outdir, os.path.basename(path)))
    print(f"{os.path.basename(path)}: {'FAILED' if error else 'ok'} in {time.time() - t0:.0f}s",
          flush=True)
    if error:
        print(error, flush=True)
    return error is None


if __name__ == "__main__":
    outdir, paths = sys.argv[1], sys.argv[2:]
    os.makedirs(outdir, exist_ok=True)
    with ProcessPoolExecutor(len(paths)) as pool:
        ok = list(pool.map(execute, paths, [outdir] * len(paths)))
    sys.exit(sum(not k for k in ok))
