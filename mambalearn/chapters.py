"""The chapter map, written once: the chapter that introduces each module of the library.

``CHAPTERS`` maps a module (or package: the longest prefix wins) to its chapter; 0 is a utility
every chapter may use. ``TOOLING`` sits above the chapters, and no chapter imports it. Everything
that needs the course's order reads it here: the grader (what a student of chapter N may use,
`course.classroom.syllabus`), tests/test_layers.py (import-linter's layers in pyproject.toml, the
notebooks' imports and docs/ARCHITECTURE.md's diagram are held to it).
"""

CHAPTERS = {
    "mambalearn.device": 0,
    "mambalearn.testing": 0,
    "mambalearn.timing": 0,
    "mambalearn.utils": 0,
    "mambalearn.results": 0,
    "mambalearn.scan.layout": 0,
    "mambalearn.chapters": 0,
    "mambalearn.launches": 0,  # the record of interpreted launches (the sm_90 build check)
    "mambalearn.triton.interpreter": 0,  # the interpreter's bf16 matmul made right, on import
    "mambalearn.triton.deterministic": 0,  # the deterministic tree sum the families' kernels share
    "mambalearn.triton.common": 0,  # LOG2E, exp2_ftz, softplus, sm_count, grid limits: written once
    "mambalearn.triton.config": 0,  # LaunchConfig: the one style of launch settings
    "mambalearn.discretize": 1,
    "mambalearn.scan.sequential": 2,
    "mambalearn.ops": 3,
    "mambalearn.scan.hillis_steele": 4,
    "mambalearn.scan.blelloch": 4,
    "mambalearn.scan.selective": 4,
    "mambalearn.roofline": 5,
    "mambalearn.machine": 5,
    "mambalearn.compiled": 5,
    "mambalearn.ncu": 5,
    "mambalearn.scan.chunked": 6,
    "mambalearn.autograd": 7,
    "mambalearn.triton.scan": 8,
    "mambalearn.mamba1": 9,  # Mamba-1: reference (scan.sequential), kernel, api, backward, fused/
    "mambalearn.triton.selective_scan": 9,  # the old import path: a face of mamba1
    "mambalearn.mamba2": 10,  # Mamba-2's SSD, oracle beside the kernels (fused/ is chapter 11's)
    "mambalearn.triton.ssd": 10,  # the old import path: a face of mamba2
    "mambalearn.inference": 12,
    "mambalearn.mamba2.step": 12,  # the decode step kernel
    "mambalearn.mamba1.step": 12,  # Mamba-1's room for it: a face of mamba2.step
    "mambalearn.triton.step": 12,  # the old import path: a face of mamba2.step
    "mambalearn.model": 13,
    "mambalearn.train": 13,  # the task only selection solves, the training loop
    "mambalearn.parallel": 14,
    "mambalearn.mamba3": 15,  # Mamba-3, oracles beside the kernels
    "mambalearn.triton.mamba3": 15,  # the old import path: a face of mamba3's kernels
    "mambalearn.claims": 16,
    "mambalearn.serving": 16,
    "mambalearn.silent": 17,
}
# Above the chapters, in the package: the exercises' checks and the command line's face (the rest
# of the tooling, ``course/``, lives beside the package and imports it).
TOOLING = ("mambalearn.check", "mambalearn.__main__")
