"""pytest settings for every run from the repository root (tests/, notebooks/, solutions/).

nbval waits a fixed 5 s for a cell's messages after the kernel has replied (``output_timeout``,
not configurable: computationalmodelling/nbval#136). On a machine busy with other test workers a
cell that ran for minutes can miss that window and fail with "Timeout of 5 seconds exceeded
waiting for output" although it passed; the cell's own limit stays ``--nbval-cell-timeout``.
60 s was not enough once on the H200: chapter 13's training cell (212 s, beside 6 notebook and
10 test workers on 16 cores) missed it while its solution's copy passed.
"""

NBVAL_OUTPUT_TIMEOUT = 300  # seconds


def pytest_collection_modifyitems(items):
    for item in items:
        if hasattr(item, "output_timeout"):  # an nbval cell
            item.output_timeout = NBVAL_OUTPUT_TIMEOUT
