"""Triton kernels of the course. Importing this package first calls `mambalearn.device`, which sets
``TRITON_INTERPRET=1`` on machines without a GPU *before* any kernel is decorated.

    scan            scan.scan (chapter 08: tl.associative_scan with ⊗, blocked, reverse)
    deterministic   the deterministic tree sum the families' backward kernels share
    interpreter     the CPU interpreter's bf16 matmul made right (applied here, on import)

The families' kernels live with their oracles: `mambalearn.mamba1` (chapter 09),
`mambalearn.mamba2` (10–12), `mambalearn.mamba3` (15). ``selective_scan``, ``ssd``, ``step`` and
``mamba3`` here are the old import paths, faces that re-export their public names.
"""


from mambalearn import device  # noqa: F401  (sets TRITON_INTERPRET before kernels exist)
from mambalearn.triton import interpreter
from mambalearn.utils import lazy_attributes

interpreter.setup()

_WHERE = {
    "selective_scan_fn": "selective_scan",  # the faces of mamba1, mamba2, mamba2.step
    "mamba_chunk_scan_combined": "ssd",
    "selective_state_update": "step",
}


__getattr__ = lazy_attributes(__name__, _WHERE)  # the kernels load when asked for
